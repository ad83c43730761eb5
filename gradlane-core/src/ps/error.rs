//! Typed errors, one enum per operation.

use thiserror::Error;

/// Why a server could not be constructed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    /// The parameter vector is empty.
    #[error("empty parameter vector")]
    EmptyParams,
    /// An initial parameter is NaN or infinite.
    #[error("non-finite initial parameter at {position}")]
    NonFiniteParams {
        /// Index of the first bad value.
        position: usize,
    },
    /// Learning rate must be finite and positive.
    #[error("learning rate {0} not finite and positive")]
    LearningRate(f64),
    /// Momentum must lie in `[0, 1)`.
    #[error("momentum {0} not in [0, 1)")]
    Momentum(f64),
    /// At least one worker is needed.
    #[error("worker count must be at least 1")]
    NoWorkers,
    /// The staleness sample must hold at least one value.
    #[error("sample size must be at least 1")]
    EmptySample,
    /// The rank threshold must lie in `[0, 1]`.
    #[error("rank threshold {0} not in [0, 1]")]
    Threshold(f64),
}

/// Why a pull was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PullError {
    /// Every worker slot already holds a ticket; a server built for K workers
    /// hands out at most K at once (OrMo's buckets assume it).
    #[error("all {workers} tickets already out")]
    TicketsExhausted {
        /// Configured worker count.
        workers: usize,
    },
}

/// Why a pushed gradient was rejected. A rejected push changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PushError {
    /// Gradient length differs from the parameter length.
    #[error("gradient length {got}, expected {expected}")]
    WrongLength {
        /// Parameter length.
        expected: usize,
        /// Gradient length received.
        got: usize,
    },
    /// A gradient entry is NaN or infinite.
    #[error("non-finite gradient at {position}")]
    NonFinite {
        /// Index of the first bad value.
        position: usize,
    },
    /// The index was never handed out, or its ticket was already used.
    #[error("unknown index {0}")]
    UnknownIndex(u64),
    /// The gradient belongs to a bucket the server has not reached
    /// (d = b - bucket(j) < 0). The ticket discipline makes this unreachable;
    /// it is checked rather than assumed so a logic slip cannot panic.
    #[error("index {index} in bucket {bucket} ahead of latest bucket {latest}")]
    AheadOfBucket {
        /// The pushed index.
        index: u64,
        /// Its bucket.
        bucket: u64,
        /// The server's latest bucket.
        latest: u64,
    },
}

/// Why a ticket could not be released.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReleaseError {
    /// No outstanding ticket has this index.
    #[error("unknown index {0}")]
    UnknownIndex(u64),
}
