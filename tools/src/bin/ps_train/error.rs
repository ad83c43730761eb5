//! Why a run of ps_train fails ([`TrainError`]), in words a user can act
//! on; every role returns it.

use gradlane::ps::ConfigError;
use std::process::ExitStatus;
use thiserror::Error;

/// Why a run of ps_train failed, in words a user can act on.
#[derive(Debug, Error)]
pub(crate) enum TrainError {
    /// A flag's value cannot work; found before anything was started.
    #[error("{0}")]
    Invalid(String),
    /// A training setting the server would refuse.
    #[error("{what}: {source}")]
    Config {
        /// Which setting.
        what: String,
        /// The server's objection.
        source: ConfigError,
    },
    /// The server's welcome is not what this program sends.
    #[error("the server's welcome {0:?} is not ps_train's (another program, or another version?)")]
    BadWelcome(String),
    /// The worker was told to expect another dataset.
    #[error(
        "this worker's --seed {mine} differs from the server's dataset seed {server}; \
         drop --seed to train on the server's data"
    )]
    SeedMismatch {
        /// `--seed`.
        mine: u64,
        /// The server's.
        server: u64,
    },
    /// The worker was told to expect another number of workers.
    #[error(
        "this worker's --workers {mine} differs from the server's --workers {server}; \
         drop --workers to take the server's"
    )]
    WorkersMismatch {
        /// `--workers`.
        mine: usize,
        /// The server's.
        server: usize,
    },
    /// Time ran out before the server answered any push.
    #[error(
        "--seconds {seconds} ran out before the server answered a push (it held one for \
         {waited:.1} s: a synchronous round short of workers?)"
    )]
    NothingAnswered {
        /// `--seconds`.
        seconds: u64,
        /// How long the last request waited.
        waited: f64,
    },
    /// A synchronous round did not fill in time.
    #[error("{0}")]
    RoundStuck(String),
    /// A worker process ended with an error.
    #[error("{run}: worker {index} failed ({status}) after {after:.1} s; its message is above")]
    WorkerFailed {
        /// Which run.
        run: String,
        /// Worker number.
        index: usize,
        /// How it ended.
        status: ExitStatus,
        /// Seconds since the workers were started.
        after: f64,
    },
    /// The server process ended with an error.
    #[error("{run}: the server failed ({status}); its message is above")]
    ServerFailed {
        /// Which run.
        run: String,
        /// How it ended.
        status: ExitStatus,
    },
}
