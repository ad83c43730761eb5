//! The environment variables that gradlane's programs share, the Python
//! module's and the command-line tools': each is read and checked here
//! only. The library's own code reads none of them; its callers pass
//! what these return ([`core_share`](crate::core_share) takes the host's
//! ranks, a [`GroupConfig`](crate::GroupConfig) its sockets).

use thiserror::Error;

/// The runtime's worker threads.
pub const THREADS: &str = "GRADLANE_THREADS";

/// torchrun's count of the ranks on this host.
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";

/// The most runtime threads [`THREADS`] may ask for.
pub const MAX_THREADS: usize = 256;

/// A variable set to what it cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{name}={value:?} is not {what}")]
pub struct EnvironmentError {
    /// The variable.
    pub name: &'static str,
    /// What it was set to.
    pub value: String,
    /// What it takes.
    pub what: String,
}

/// [`THREADS`]: `None` where unset, else a thread count in
/// `1..=`[`MAX_THREADS`].
pub fn threads() -> Result<Option<usize>, EnvironmentError> {
    let Ok(value) = std::env::var(THREADS) else {
        return Ok(None);
    };
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(Some(n)),
        _ => Err(EnvironmentError {
            name: THREADS,
            value,
            what: format!("a thread count in 1..={MAX_THREADS}"),
        }),
    }
}

/// How many ranks share this host: [`LOCAL_WORLD_SIZE`] where it is a
/// positive count (torchrun sets it), else 1.
pub fn local_world_size() -> usize {
    std::env::var(LOCAL_WORLD_SIZE)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_thread_count_names_the_variable_and_its_range() {
        let e = EnvironmentError {
            name: THREADS,
            value: "many".into(),
            what: format!("a thread count in 1..={MAX_THREADS}"),
        };
        assert_eq!(
            e.to_string(),
            "GRADLANE_THREADS=\"many\" is not a thread count in 1..=256"
        );
    }
}
