//! What a worker learns from the server when it joins ([`Welcome`]), and
//! its encoding on the wire: the server writes it, every worker reads it.

use crate::error::TrainError;

/// What a worker learns from the server when it joins: what it must agree
/// on with the server to compute gradients that belong to this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Welcome {
    pub(crate) seed: u64,
    pub(crate) batch: usize,
    pub(crate) workers: usize,
}

pub(crate) const WELCOME_TAG: &str = "ps_train/1";

impl Welcome {
    pub(crate) fn encode(&self) -> Vec<u8> {
        format!(
            "{WELCOME_TAG} seed={} batch={} workers={}",
            self.seed, self.batch, self.workers
        )
        .into_bytes()
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, TrainError> {
        let text = String::from_utf8_lossy(bytes);
        let bad = || TrainError::BadWelcome(text.to_string());
        let mut words = text.split(' ');
        if words.next() != Some(WELCOME_TAG) {
            return Err(bad());
        }
        let mut field = |key: &str| -> Result<u64, TrainError> {
            words
                .next()
                .and_then(|w| w.strip_prefix(key))
                .and_then(|w| w.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .ok_or_else(bad)
        };
        let seed = field("seed")?;
        let batch = field("batch")?;
        let workers = field("workers")?;
        Ok(Self {
            seed,
            batch: usize::try_from(batch).map_err(|_| bad())?,
            workers: usize::try_from(workers).map_err(|_| bad())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welcome_round_trips_and_rejects_strangers() {
        let w = Welcome {
            seed: 11,
            batch: 32,
            workers: 3,
        };
        assert_eq!(Welcome::decode(&w.encode()).unwrap(), w);
        for bad in [
            &b""[..],
            b"ps_train/2 seed=1 batch=1 workers=1",
            b"ps_train/1 seed=x",
            b"\xff",
        ] {
            assert!(matches!(
                Welcome::decode(bad),
                Err(TrainError::BadWelcome(_))
            ));
        }
    }
}
