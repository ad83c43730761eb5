//! The command line of each role: the loopback comparison's options, the
//! server's and a worker's, and the training settings they share.

use clap::{Args as ClapArgs, ValueEnum};
use gradlane_tools::cli as common;

use common::Policy;

/// The algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Algo {
    /// Ordered momentum.
    Ormo,
    /// Plain asynchronous SGD.
    Asgd,
    /// Synchronous SGD with momentum over K workers.
    Ssgd,
    /// Asynchronous SGD behind the sampling straggler filter.
    Filter,
}

impl Algo {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Algo::Ormo => "ormo",
            Algo::Asgd => "asgd",
            Algo::Ssgd => "ssgd",
            Algo::Filter => "filter",
        }
    }
}

/// What the server trains; the workers get the seed and the batch size
/// from it when they join.
#[derive(Debug, Clone, ClapArgs)]
pub(crate) struct Training {
    /// Workers K (named 0 to K-1 by their `--id`).
    #[arg(long, default_value_t = 3)]
    pub(crate) workers: usize,
    /// Seed of the dataset and the initial parameters.
    #[arg(long, default_value_t = 7)]
    pub(crate) seed: u64,
    /// Learning rate of the momentum-free methods (ASGD, filter). OrMo and
    /// SSGD use `lr * K * (1 - momentum)`: the same step per gradient once
    /// momentum has built up (they average K gradients per step).
    #[arg(long, default_value_t = 0.1)]
    pub(crate) lr: f64,
    /// Momentum of OrMo and SSGD.
    #[arg(long, default_value_t = 0.9)]
    pub(crate) momentum: f64,
    /// Minibatch size.
    #[arg(long, default_value_t = 32)]
    pub(crate) batch: usize,
}

/// The default: every algorithm on loopback, one after the other.
#[derive(Debug, Clone, ClapArgs)]
pub(crate) struct AllArgs {
    #[command(flatten)]
    pub(crate) training: Training,
    /// Algorithms to compare.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ormo,asgd,ssgd,filter"
    )]
    pub(crate) algos: Vec<Algo>,
    /// Straggler filter: sample policies to run (comma separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "sliding-window"
    )]
    pub(crate) policies: Vec<Policy>,
    /// Straggler filter: rank thresholds to run, each in [0, 1] (comma
    /// separated).
    #[arg(long, value_delimiter = ',', default_value = "0.9")]
    pub(crate) thresholds: Vec<f64>,
    /// Straggler filter: sample size.
    #[arg(long, default_value_t = 16)]
    pub(crate) sample: usize,
    /// Injected loss on each worker's link, each direction, in [0, 1].
    #[arg(long, default_value_t = 0.05, value_parser = common::probability)]
    pub(crate) loss: f64,
    /// One-way delay added by each worker, milliseconds.
    #[arg(long, default_value_t = 1)]
    pub(crate) delay_ms: u64,
    /// Slowdown of each worker (comma separated, one per worker); without
    /// it the workers spread from 1x to `--slowest`.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["slowest", "straggler"])]
    pub(crate) skew: Vec<f64>,
    #[command(flatten)]
    pub(crate) spread: common::Spread,
    /// Compute time of one step on the fastest worker, milliseconds.
    #[arg(long, default_value_t = 10)]
    pub(crate) compute_ms: u64,
    /// Seconds of training per algorithm.
    #[arg(long, default_value_t = 10)]
    pub(crate) seconds: u64,
    /// Evaluation interval, milliseconds.
    #[arg(long, default_value_t = 250)]
    pub(crate) eval_ms: u64,
    /// Target test accuracy for the time-to-target column.
    #[arg(long, default_value_t = 0.9)]
    pub(crate) target_accuracy: f64,
    /// Target test loss for the steps- and time-to-target columns.
    #[arg(long, default_value_t = 0.3)]
    pub(crate) target_loss: f64,
    /// Send gradients as codec frames (top 10%) instead of gradlane rounds.
    #[arg(long)]
    pub(crate) codec: bool,
    /// SSGD: seconds a round may go without filling before the run ends.
    #[arg(long, default_value_t = 30)]
    pub(crate) round_timeout: u64,
}

#[derive(Debug, Clone, ClapArgs)]
pub(crate) struct ServerArgs {
    #[command(flatten)]
    pub(crate) training: Training,
    /// Algorithm to serve.
    #[arg(long, value_enum)]
    pub(crate) algo: Algo,
    #[command(flatten)]
    pub(crate) server: common::ServerFlags,
    /// Evaluation interval, milliseconds.
    #[arg(long, default_value_t = 500)]
    pub(crate) eval_ms: u64,
    /// Straggler filter: sample size.
    #[arg(long, default_value_t = 16)]
    pub(crate) sample: usize,
    /// Straggler filter: drop a push whose staleness ranks above this
    /// fraction of the sample, in [0, 1].
    #[arg(long, default_value_t = 0.9)]
    pub(crate) threshold: f64,
    /// Straggler filter: which value leaves the full sample.
    #[arg(long, value_enum, default_value_t = Policy::SlidingWindow)]
    pub(crate) policy: Policy,
    /// How long the server waits for a gradient round's lossy datagrams
    /// after its important chunks are in, milliseconds (loopback needs
    /// little; a WAN path wants a few RTTs).
    #[arg(long, default_value_t = 5)]
    pub(crate) grace_ms: u64,
    /// Give up this many seconds after start even if workers remain.
    #[arg(long, default_value_t = 600)]
    pub(crate) max_seconds: u64,
    /// SSGD: end the run when a round has not filled for this many
    /// seconds since the first worker joined or the last step, naming the
    /// workers that never joined, and tell every worker why.
    #[arg(long, default_value_t = 30)]
    pub(crate) round_timeout: u64,
}

#[derive(Debug, Clone, ClapArgs)]
pub(crate) struct WorkerArgs {
    #[command(flatten)]
    pub(crate) client: common::ClientFlags,
    /// Worker number, 0 to K-1 (its name at the server; seeds its
    /// minibatches and its injected loss).
    #[arg(long, default_value_t = 0)]
    pub(crate) id: u64,
    /// The dataset seed this worker expects. The server hands its seed to
    /// every worker; with this flag a different one is an error instead of
    /// being taken.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// The number of workers K this worker expects the server to serve
    /// (the server's `--workers`). The server tells every worker its K;
    /// with this flag a different one is an error instead of being taken.
    #[arg(long)]
    pub(crate) workers: Option<usize>,
    /// This worker's slowdown.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) skew: f64,
    /// Compute time of one step at skew 1, milliseconds.
    #[arg(long, default_value_t = 10)]
    pub(crate) compute_ms: u64,
    /// Seconds to train. The worker stops then even if the server holds a
    /// push (a synchronous round short of workers).
    #[arg(long, default_value_t = 10)]
    pub(crate) seconds: u64,
    /// Stop after this many answered pushes (if `--seconds` does not come
    /// first).
    #[arg(long)]
    pub(crate) steps: Option<u64>,
    /// Injected loss, each direction, in [0, 1].
    #[arg(long, default_value_t = 0.0, value_parser = common::probability)]
    pub(crate) loss: f64,
    /// One-way injected delay, milliseconds.
    #[arg(long, default_value_t = 0)]
    pub(crate) delay_ms: u64,
    /// Send gradients as codec frames (top 10%).
    #[arg(long)]
    pub(crate) codec: bool,
}
