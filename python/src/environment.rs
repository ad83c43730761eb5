//! Every `GRADLANE_*` variable the native module reads, each read and
//! checked here only; a bad value is a ValueError naming the variable.
//! The torch backend's own variables (the failure policy, addresses,
//! asynchrony) are read in `gradlane/torch/_environment.py`, which asks
//! this module for the port range, so that the range has one parser.

use crate::errors::CallError;
use pyo3::prelude::*;
use std::path::PathBuf;

/// The certificate directory when the Group is given no `cert_dir`.
pub(crate) const CERT_DIR_ENV: &str = "GRADLANE_CERT_DIR";

/// A group's sockets when the constructor is not told.
pub(crate) const SOCKETS_ENV: &str = "GRADLANE_SOCKETS";

/// The UDP ports every socket of a rank takes, for a firewall.
pub(crate) const PORT_RANGE_ENV: &str = "GRADLANE_PORT_RANGE";

/// The runtime's worker threads.
pub(crate) const THREADS_ENV: &str = "GRADLANE_THREADS";

/// What gradlane logs to stderr (tracing's `EnvFilter` syntax: `info`,
/// `gradlane=debug`, `off`).
pub(crate) const LOG_ENV: &str = "GRADLANE_LOG";

/// A group's certificate directory: `asked`, else `GRADLANE_CERT_DIR`.
pub(crate) fn cert_dir(asked: Option<PathBuf>) -> Result<PathBuf, CallError> {
    match asked {
        Some(d) => Ok(d),
        None => std::env::var_os(CERT_DIR_ENV)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .ok_or_else(|| {
                CallError::Value(format!(
                    "no cert_dir given and {CERT_DIR_ENV} is not set (gradlane.generate_certs \
                     makes the files)"
                ))
            }),
    }
}

/// A group's port range: `asked`, else `GRADLANE_PORT_RANGE`, else none
/// (any free port).
pub(crate) fn group_port_range(
    asked: Option<&str>,
) -> Result<Option<gradlane::PortRange>, CallError> {
    let (text, from) = match asked {
        Some(text) => (text.to_string(), "port_range"),
        None => match std::env::var(PORT_RANGE_ENV) {
            Ok(text) if !text.trim().is_empty() => (text, PORT_RANGE_ENV),
            _ => return Ok(None),
        },
    };
    text.parse()
        .map(Some)
        .map_err(|e: gradlane::PortRangeError| CallError::Value(format!("{from}: {e}")))
}

/// A group's sockets: `asked`, else `GRADLANE_SOCKETS`, else the
/// library's default ([`gradlane::default_sockets`]).
pub(crate) fn group_sockets(asked: Option<i64>) -> Result<usize, CallError> {
    let valid = |n: i64, from: &str| match usize::try_from(n) {
        Ok(n) if (1..=gradlane::MAX_SOCKETS).contains(&n) => Ok(n),
        _ => Err(CallError::Value(format!(
            "{from} {n} is not a socket count in 1..={}",
            gradlane::MAX_SOCKETS
        ))),
    };
    if let Some(n) = asked {
        return valid(n, "sockets");
    }
    if let Ok(text) = std::env::var(SOCKETS_ENV) {
        let n = text.trim().parse::<i64>().map_err(|_| {
            CallError::Value(format!("{SOCKETS_ENV}={text:?} is not a socket count"))
        })?;
        return valid(n, SOCKETS_ENV);
    }
    Ok(gradlane::default_sockets())
}

/// The runtime's worker threads: `GRADLANE_THREADS`, else, for a rank
/// with at least 4 cores to itself ([`gradlane::core_share`]: torchrun's
/// `LOCAL_WORLD_SIZE` ranks share the host), twice its share, at most 8
/// (its tasks wait on the network more than they compute); else 2.
/// quinn's drivers, the links' tasks and the sealing and opening of
/// packets run there, the collective itself on the calling thread.
pub(crate) fn worker_threads() -> Result<usize, CallError> {
    if let Ok(text) = std::env::var(THREADS_ENV) {
        return match text.trim().parse::<usize>() {
            Ok(n) if (1..=256).contains(&n) => Ok(n),
            _ => Err(CallError::Value(format!(
                "{THREADS_ENV}={text:?} is not a thread count in 1..=256"
            ))),
        };
    }
    Ok(match gradlane::core_share() {
        share if share >= 4 => (2 * share).min(8),
        _ => 2,
    })
}

/// What to log to stderr: `GRADLANE_LOG`, else warnings and errors. A
/// filter tracing cannot parse is reported once on stderr, not ignored.
pub(crate) fn log_filter() -> tracing_subscriber::EnvFilter {
    match std::env::var(LOG_ENV) {
        Ok(text) if !text.trim().is_empty() => tracing_subscriber::EnvFilter::try_new(&text)
            .unwrap_or_else(|e| {
                eprintln!(
                    "gradlane: {LOG_ENV}={text:?} is not a log filter ({e}); logging warnings"
                );
                tracing_subscriber::EnvFilter::new("warn")
            }),
        _ => tracing_subscriber::EnvFilter::new("warn"),
    }
}

/// `GRADLANE_PORT_RANGE` as `(lo, hi)`, or None where unset; a ValueError
/// naming it where it is not a range. The torch backend asks here, so the
/// range is parsed once, as the Group parses it.
#[pyfunction]
pub(crate) fn port_range_from_env(py: Python<'_>) -> PyResult<Option<(u16, u16)>> {
    let range = group_port_range(None).map_err(|e| e.into_py(py))?;
    Ok(range.map(|r| (r.lo(), r.hi())))
}
