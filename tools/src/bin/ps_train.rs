//! Asynchronous training through the parameter server over gradlane links:
//! OrMo against ASGD, synchronous SGD with momentum, and ASGD behind the
//! straggler filter, side by side in one run.
//!
//! ```text
//! cargo run --release --bin ps_train                 # everything on loopback
//! cargo run --release --bin ps_train -- server --help
//! cargo run --release --bin ps_train -- worker --help
//! ```
//!
//! Without a subcommand the example starts, for each algorithm in turn, one
//! server process and K worker processes (itself, with `server` and
//! `worker`) on loopback, with seeded injected loss on every worker's link
//! and per-worker speed skew (worker i computes `skew_i` times slower, 1x to
//! 4x by default, or one `--straggler` among workers spread up to
//! `--slowest`). The model is a small MLP ([`gradlane_tools::mlp`]) on a
//! synthetic classification problem that a linear model cannot solve. The
//! server evaluates the parameters on a held-out set every `--eval-ms` and
//! prints them; this process collects those lines into a loss/accuracy
//! table over time and a summary (updates applied and dropped, each
//! worker's share dropped, staleness, steps and time to target). The
//! straggler filter runs once per `--policies` x `--thresholds`. A worker
//! or server that fails ends the run at once, naming it.
//!
//! Across hosts: run `ps_train server --listen 0.0.0.0:4433 --algo ormo`
//! on one machine and `ps_train worker --connect HOST:4433 --id i` (i from
//! 0 to K-1) on others, with certificates from `cargo run --bin certs`.
//! The server hands every worker the dataset seed and batch size when it
//! joins. Under SSGD a round that does not fill within `--round-timeout`
//! seconds ends the run with a message naming the workers that never
//! joined; a worker stops at `--seconds` whatever it is waiting for.

use gradlane_tools::cli as common;

use clap::{Args as ClapArgs, CommandFactory, Parser, Subcommand, ValueEnum};
use common::BoxError;
use gradlane::generate_certs;
use gradlane::ps::baselines::{Asgd, SyncMomentum};
use gradlane::ps::{
    ConfigError, Disposition, OrderedMomentum, OrderedMomentumConfig, ParameterServer,
    SamplePolicy, StragglerConfig, StragglerFilter,
};
use gradlane::ps_net::{self, Compression, ServerHandle, Worker, WorkerInfo};
use gradlane::{Config, Faults};
use gradlane_core::rng::SplitMix64;
use gradlane_tools::mlp::{Dataset, Mlp};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Train an MLP through the gradlane parameter server.
///
/// Options before a subcommand belong to the loopback comparison alone: with
/// a subcommand they are refused (not silently dropped), and an option given
/// to the wrong role is refused with a tip naming the role that takes it.
#[derive(Debug, Parser)]
#[command(name = "ps_train", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    #[command(flatten)]
    all: AllArgs,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Serve one algorithm to K workers; prints evaluation lines.
    Server(ServerArgs),
    /// One worker: pull, compute, push until the time is up.
    Worker(WorkerArgs),
}

/// The algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Algo {
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
    fn name(self) -> &'static str {
        match self {
            Algo::Ormo => "ormo",
            Algo::Asgd => "asgd",
            Algo::Ssgd => "ssgd",
            Algo::Filter => "filter",
        }
    }
}

/// Which value leaves the straggler filter's full sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Policy {
    /// Evict the oldest value: the sample is the last pushes' staleness.
    SlidingWindow,
    /// Evict the largest value (the seed's claim 1b as written): drops
    /// nearly every push with another update in between.
    EvictLargest,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::SlidingWindow => "sliding-window",
            Policy::EvictLargest => "evict-largest",
        }
    }
}

impl From<Policy> for SamplePolicy {
    fn from(p: Policy) -> Self {
        match p {
            Policy::SlidingWindow => SamplePolicy::SlidingWindow,
            Policy::EvictLargest => SamplePolicy::EvictLargest,
        }
    }
}

/// What the server trains; the workers get the seed and the batch size
/// from it when they join.
#[derive(Debug, Clone, ClapArgs)]
struct Training {
    /// Workers K (named 0 to K-1 by their `--id`).
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Seed of the dataset and the initial parameters.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Learning rate of the momentum-free methods (ASGD, filter). OrMo and
    /// SSGD use `lr * K * (1 - momentum)`: the same step per gradient once
    /// momentum has built up (they average K gradients per step).
    #[arg(long, default_value_t = 0.1)]
    lr: f64,
    /// Momentum of OrMo and SSGD.
    #[arg(long, default_value_t = 0.9)]
    momentum: f64,
    /// Minibatch size.
    #[arg(long, default_value_t = 32)]
    batch: usize,
}

/// The default: every algorithm on loopback, one after the other.
#[derive(Debug, Clone, ClapArgs)]
struct AllArgs {
    #[command(flatten)]
    training: Training,
    /// Algorithms to compare.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ormo,asgd,ssgd,filter"
    )]
    algos: Vec<Algo>,
    /// Straggler filter: sample policies to run (comma separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "sliding-window"
    )]
    policies: Vec<Policy>,
    /// Straggler filter: rank thresholds to run, each in [0, 1] (comma
    /// separated).
    #[arg(long, value_delimiter = ',', default_value = "0.9")]
    thresholds: Vec<f64>,
    /// Straggler filter: sample size.
    #[arg(long, default_value_t = 16)]
    sample: usize,
    /// Injected loss on each worker's link, each direction, in [0, 1].
    #[arg(long, default_value_t = 0.05, value_parser = common::probability)]
    loss: f64,
    /// One-way delay added by each worker, milliseconds.
    #[arg(long, default_value_t = 1)]
    delay_ms: u64,
    /// Slowdown of each worker (comma separated, one per worker); without
    /// it the workers spread from 1x to `--slowest`.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["slowest", "straggler"])]
    skew: Vec<f64>,
    /// Slowdown of the slowest worker when they spread evenly from 1x.
    #[arg(long, default_value_t = 4.0)]
    slowest: f64,
    /// Make the last worker a straggler this many times slower than the
    /// fastest; the others spread from 1x to `--slowest`.
    #[arg(long)]
    straggler: Option<f64>,
    /// Compute time of one step on the fastest worker, milliseconds.
    #[arg(long, default_value_t = 10)]
    compute_ms: u64,
    /// Seconds of training per algorithm.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Evaluation interval, milliseconds.
    #[arg(long, default_value_t = 250)]
    eval_ms: u64,
    /// Target test accuracy for the time-to-target column.
    #[arg(long, default_value_t = 0.9)]
    target_accuracy: f64,
    /// Target test loss for the steps- and time-to-target columns.
    #[arg(long, default_value_t = 0.3)]
    target_loss: f64,
    /// Send gradients as codec frames (top 10%) instead of gradlane rounds.
    #[arg(long)]
    codec: bool,
    /// SSGD: seconds a round may go without filling before the run ends.
    #[arg(long, default_value_t = 30)]
    round_timeout: u64,
}

#[derive(Debug, Clone, ClapArgs)]
struct ServerArgs {
    #[command(flatten)]
    training: Training,
    /// Algorithm to serve.
    #[arg(long, value_enum)]
    algo: Algo,
    #[command(flatten)]
    server: common::ServerFlags,
    /// Evaluation interval, milliseconds.
    #[arg(long, default_value_t = 500)]
    eval_ms: u64,
    /// Straggler filter: sample size.
    #[arg(long, default_value_t = 16)]
    sample: usize,
    /// Straggler filter: drop a push whose staleness ranks above this
    /// fraction of the sample, in [0, 1].
    #[arg(long, default_value_t = 0.9)]
    threshold: f64,
    /// Straggler filter: which value leaves the full sample.
    #[arg(long, value_enum, default_value_t = Policy::SlidingWindow)]
    policy: Policy,
    /// How long the server waits for a gradient round's lossy datagrams
    /// after its important chunks are in, milliseconds (loopback needs
    /// little; a WAN path wants a few RTTs).
    #[arg(long, default_value_t = 5)]
    grace_ms: u64,
    /// Give up this many seconds after start even if workers remain.
    #[arg(long, default_value_t = 600)]
    max_seconds: u64,
    /// SSGD: end the run when a round has not filled for this many
    /// seconds since the first worker joined or the last step, naming the
    /// workers that never joined, and tell every worker why.
    #[arg(long, default_value_t = 30)]
    round_timeout: u64,
}

#[derive(Debug, Clone, ClapArgs)]
struct WorkerArgs {
    #[command(flatten)]
    client: common::ClientFlags,
    /// Worker number, 0 to K-1 (its name at the server; seeds its
    /// minibatches and its injected loss).
    #[arg(long, default_value_t = 0)]
    id: u64,
    /// The dataset seed this worker expects. The server hands its seed to
    /// every worker; with this flag a different one is an error instead of
    /// being taken.
    #[arg(long)]
    seed: Option<u64>,
    /// The number of workers K this worker expects the server to serve
    /// (the server's `--workers`). The server tells every worker its K;
    /// with this flag a different one is an error instead of being taken.
    #[arg(long)]
    workers: Option<usize>,
    /// This worker's slowdown.
    #[arg(long, default_value_t = 1.0)]
    skew: f64,
    /// Compute time of one step at skew 1, milliseconds.
    #[arg(long, default_value_t = 10)]
    compute_ms: u64,
    /// Seconds to train. The worker stops then even if the server holds a
    /// push (a synchronous round short of workers).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Stop after this many answered pushes (if `--seconds` does not come
    /// first).
    #[arg(long)]
    steps: Option<u64>,
    /// Injected loss, each direction, in [0, 1].
    #[arg(long, default_value_t = 0.0, value_parser = common::probability)]
    loss: f64,
    /// One-way injected delay, milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Send gradients as codec frames (top 10%).
    #[arg(long)]
    codec: bool,
}

/// Why a run of ps_train failed, in words a user can act on.
#[derive(Debug, Error)]
enum TrainError {
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

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let cli = Cli::try_parse_from(&args).unwrap_or_else(|e| with_placement_tip(e, &args).exit());
    match cli.role {
        Some(Role::Server(a)) => common::main_with("ps_train server", a, serve),
        Some(Role::Worker(a)) => common::main_with("ps_train worker", a, work),
        None => match orchestrate(cli.all) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ps_train: {}", common::chain(e.as_ref()));
                ExitCode::FAILURE
            }
        },
    }
}

/// The roles' flag names, for [`with_placement_tip`]: `None` is the
/// loopback comparison (no subcommand).
fn roles_and_flags() -> Vec<(Option<String>, Vec<String>)> {
    let cli = Cli::command();
    let longs = |c: &clap::Command| -> Vec<String> {
        c.get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect()
    };
    let mut roles = vec![(None, longs(&cli))];
    for sub in cli.get_subcommands() {
        roles.push((Some(sub.get_name().to_string()), longs(sub)));
    }
    roles
}

/// How a role is named in a tip.
fn role_name(role: Option<&str>) -> String {
    match role {
        Some(r) => format!("`ps_train {r}`"),
        None => "`ps_train` without a subcommand (the loopback comparison)".to_string(),
    }
}

/// clap's error for a flag in `args` given where ps_train does not take it,
/// with a tip naming where it goes. The roles share many flag names but not
/// all (`--algo` is the server's, `--id` a worker's), and clap alone only
/// says that the flag is unexpected there.
fn with_placement_tip(mut e: clap::Error, args: &[OsString]) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let first_string = |v: Option<&ContextValue>| match v {
        Some(ContextValue::String(s)) => Some(s.clone()),
        Some(ContextValue::Strings(s)) => s.first().cloned(),
        _ => None,
    };
    let roles = roles_and_flags();
    let takes = |role: Option<&str>, flag: &str| {
        roles
            .iter()
            .any(|(r, flags)| r.as_deref() == role && flags.iter().any(|f| f == flag))
    };
    let tip = match e.kind() {
        // A flag after a subcommand that does not take it, or a role's flag
        // with no subcommand.
        ErrorKind::UnknownArgument => {
            let Some(given) = first_string(e.get(ContextKind::InvalidArg)) else {
                return e;
            };
            let flag = given.split('=').next().unwrap_or(&given).to_string();
            let subcommands: Vec<&str> = roles.iter().filter_map(|(r, _)| r.as_deref()).collect();
            let role = args
                .iter()
                .skip(1)
                .map(|a| a.to_string_lossy())
                .find(|a| subcommands.contains(&a.as_ref()))
                .map(|a| a.into_owned());
            let owners: Vec<String> = roles
                .iter()
                .filter(|(r, flags)| *r != role && flags.contains(&flag))
                .map(|(r, _)| role_name(r.as_deref()))
                .collect();
            if owners.is_empty() {
                return e;
            }
            format!(
                "{flag} is an option of {}, not of {}",
                owners.join(" and of "),
                role_name(role.as_deref())
            )
        }
        // A flag of the loopback comparison before a subcommand.
        ErrorKind::ArgumentConflict => {
            let (Some(role), Some(given)) = (
                first_string(e.get(ContextKind::InvalidSubcommand)),
                first_string(e.get(ContextKind::PriorArg)),
            ) else {
                return e;
            };
            let flag = given.split(' ').next().unwrap_or(&given).to_string();
            if takes(Some(&role), &flag) {
                format!(
                    "put {flag} after `{role}`: options before a subcommand are those of {}",
                    role_name(None)
                )
            } else {
                format!(
                    "{flag} is an option of {} only; {} does not take it",
                    role_name(None),
                    role_name(Some(&role))
                )
            }
        }
        _ => return e,
    };
    let mut tips = match e.get(ContextKind::Suggested) {
        Some(ContextValue::StyledStrs(s)) => s.clone(),
        _ => Vec::new(),
    };
    tips.push(tip.into());
    e.insert(ContextKind::Suggested, ContextValue::StyledStrs(tips));
    e
}

fn momentum_lr(t: &Training) -> f64 {
    t.lr * t.workers as f64 * (1.0 - t.momentum)
}

/// What a worker learns from the server when it joins: what it must agree
/// on with the server to compute gradients that belong to this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Welcome {
    seed: u64,
    batch: usize,
    workers: usize,
}

const WELCOME_TAG: &str = "ps_train/1";

impl Welcome {
    fn encode(&self) -> Vec<u8> {
        format!(
            "{WELCOME_TAG} seed={} batch={} workers={}",
            self.seed, self.batch, self.workers
        )
        .into_bytes()
    }

    fn decode(bytes: &[u8]) -> Result<Self, TrainError> {
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

/// The straggler filter's settings for one server.
#[derive(Debug, Clone, Copy)]
struct FilterChoice {
    sample: usize,
    threshold: f64,
    policy: Policy,
}

impl FilterChoice {
    fn config(&self, learning_rate: f64) -> StragglerConfig {
        StragglerConfig {
            learning_rate,
            sample_size: self.sample,
            rank_threshold: self.threshold,
            sample_policy: self.policy.into(),
        }
    }
}

/// Builds `algo`'s server the way `serve` does, on one parameter, to find
/// settings it would refuse before any process starts.
fn check_settings(algo: Algo, t: &Training, filter: FilterChoice) -> Result<(), TrainError> {
    let what = |s: &str| format!("{} {s}", algo.name());
    let w0 = vec![0.0f32];
    let checked = match algo {
        Algo::Ormo => OrderedMomentum::new(
            OrderedMomentumConfig {
                workers: t.workers,
                momentum: t.momentum,
                learning_rate: momentum_lr(t),
            },
            w0,
        )
        .map(drop),
        Algo::Asgd => Asgd::new(t.lr, w0).map(drop),
        Algo::Ssgd => SyncMomentum::new(t.workers, momentum_lr(t), t.momentum, w0).map(drop),
        Algo::Filter => StragglerFilter::new(filter.config(t.lr), w0).map(drop),
    };
    checked.map_err(|source| TrainError::Config {
        what: what("settings (--lr, --momentum, --workers, --sample, --thresholds)"),
        source,
    })?;
    if t.batch == 0 {
        return Err(TrainError::Invalid("--batch must be at least 1".into()));
    }
    Ok(())
}

// ---------------------------------------------------------------- server

async fn serve(a: ServerArgs) -> Result<(), BoxError> {
    let t = &a.training;
    let filter = FilterChoice {
        sample: a.sample,
        threshold: a.threshold,
        policy: a.policy,
    };
    check_settings(a.algo, t, filter)?;
    let model = Mlp::demo();
    let (_, test) = Dataset::demo(t.seed)?;
    let w0 = model.init(t.seed);
    let welcome = Welcome {
        seed: t.seed,
        batch: t.batch,
        workers: t.workers,
    }
    .encode();
    match a.algo {
        Algo::Ormo => {
            let cfg = OrderedMomentumConfig {
                workers: t.workers,
                momentum: t.momentum,
                learning_rate: momentum_lr(t),
            };
            let h = ServerHandle::with_welcome(OrderedMomentum::new(cfg, w0)?, welcome)?;
            serve_with(&a, &model, &test, h, |_| None).await
        }
        Algo::Asgd => {
            let h = ServerHandle::with_welcome(Asgd::new(t.lr, w0)?, welcome)?;
            serve_with(&a, &model, &test, h, |_| None).await
        }
        Algo::Ssgd => {
            let s = SyncMomentum::new(t.workers, momentum_lr(t), t.momentum, w0)?;
            serve_with(
                &a,
                &model,
                &test,
                ServerHandle::with_welcome(s, welcome)?,
                |_| None,
            )
            .await
        }
        Algo::Filter => {
            let s = StragglerFilter::new(filter.config(t.lr), w0)?;
            serve_with(
                &a,
                &model,
                &test,
                ServerHandle::with_welcome(s, welcome)?,
                |s: &StragglerFilter| Some(s.stats().mean_applied_staleness()),
            )
            .await
        }
    }
}

/// Serves until every worker that joined has left; prints `listening`,
/// `eval` and `done` lines for the orchestrator. Under SSGD, gives up on a
/// round that has not filled for `--round-timeout` seconds.
async fn serve_with<S: ParameterServer + Send + 'static>(
    a: &ServerArgs,
    model: &Mlp,
    test: &Dataset,
    handle: ServerHandle<S>,
    filter_staleness: impl Fn(&S) -> Option<f64>,
) -> Result<(), BoxError> {
    let mut config = Config::default();
    config.timing.grace = Duration::from_millis(a.grace_ms);
    let endpoint = a.server.endpoint(config).await?;
    println!("listening {}", endpoint.local_addr()?);
    std::io::stdout().flush()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = handle.clone();
    let serving = tokio::spawn(async move { ps_net::run(&endpoint, h, stopped).await });

    let start = Instant::now();
    let round_timeout = Duration::from_secs(a.round_timeout);
    let mut tick = tokio::time::interval(Duration::from_millis(a.eval_ms.max(10)));
    let mut clock_started = None;
    // The last time the parameters moved (or the first worker came).
    let mut progress: Option<(Instant, u64)> = None;
    let outcome = loop {
        tick.tick().await;
        let stats = handle.stats();
        // Time runs from the first worker's arrival, so process start-up
        // does not count against any algorithm.
        if stats.workers_joined > 0 && clock_started.is_none() {
            clock_started = Some(Instant::now());
        }
        if let Some(t0) = clock_started {
            let (params, steps) = handle.snapshot();
            let e = model.evaluate(&params, test)?;
            println!(
                "eval {:.3} {steps} {:.5} {:.4}",
                t0.elapsed().as_secs_f64(),
                e.loss,
                e.accuracy
            );
            std::io::stdout().flush()?;
            if progress.is_none_or(|(_, s)| s != steps) {
                progress = Some((Instant::now(), steps));
            }
        }
        let all_left = stats.workers_joined >= a.training.workers as u64
            && stats.workers_left >= stats.workers_joined;
        if all_left || start.elapsed() > Duration::from_secs(a.max_seconds) {
            break Ok(());
        }
        // Only a synchronous round waits for particular workers; the
        // asynchronous servers go on with whoever is there.
        if let (Algo::Ssgd, Some((since, round))) = (a.algo, progress) {
            if since.elapsed() > round_timeout && stats.workers_left < stats.workers_joined {
                let why = stuck_round(
                    round,
                    a.round_timeout,
                    a.training.workers,
                    &handle.workers(),
                );
                handle.close_workers(&why);
                break Err(TrainError::RoundStuck(why));
            }
        }
    };
    let _ = stop.send(());
    let stats = serving.await??;
    let filter = handle.with(|s| filter_staleness(s));
    println!(
        "done applied={} dropped={} buffered={} refused={} staleness={:.3} filter_staleness={} zero_filled={} late={} joined={} left={}",
        stats.applied,
        stats.dropped,
        stats.buffered,
        stats.refused,
        stats.mean_applied_staleness(),
        filter.map_or("-".into(), |f| format!("{f:.3}")),
        stats.zero_filled_bytes,
        stats.late_merged_bytes,
        stats.workers_joined,
        stats.workers_left
    );
    Ok(outcome?)
}

/// Why a synchronous round cannot fill: the workers of `0..workers` that
/// never said hello, or, if every one did, that one of them holds the
/// round up.
fn stuck_round(round: u64, seconds: u64, workers: usize, seen: &[WorkerInfo]) -> String {
    let names: Vec<&str> = seen.iter().filter_map(|w| w.name.as_deref()).collect();
    let missing: Vec<String> = (0..workers)
        .map(|i| i.to_string())
        .filter(|i| !names.contains(&i.as_str()))
        .collect();
    let joined = if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    };
    if missing.is_empty() {
        format!(
            "synchronous round {round} has not filled in {seconds} s although all {workers} \
             workers joined (joined: {joined}); one of them holds it up"
        )
    } else {
        format!(
            "synchronous round {round} has not filled in {seconds} s: it waits for {} {} of \
             --workers {workers}, never joined (joined: {joined})",
            if missing.len() == 1 {
                "worker"
            } else {
                "workers"
            },
            missing.join(", ")
        )
    }
}

// ---------------------------------------------------------------- worker

async fn work(a: WorkerArgs) -> Result<(), BoxError> {
    let model = Mlp::demo();
    let addr = common::resolve(&a.client.connect).await?;
    let faults = (a.loss > 0.0 || a.delay_ms > 0).then(|| Faults {
        delay: Duration::from_millis(a.delay_ms),
        ..Faults::symmetric_loss(a.loss, 1000 + a.id)
    });
    let endpoint = a.client.endpoint(Config {
        faults,
        ..Config::default()
    })?;
    let compression = if a.codec {
        Compression::Codec {
            selection: gradlane::codec::Selection::TopK(model.param_count() / 10),
            base: gradlane::codec::DEFAULT_BASE,
        }
    } else {
        Compression::Rounds
    };
    let name = a.id.to_string();
    let join = Worker::join_as(
        &endpoint,
        addr,
        &a.client.server_name,
        model.layout(),
        compression,
        &name,
    );
    let wait = Duration::from_secs(a.client.connect_timeout_secs);
    let mut worker = tokio::time::timeout(wait, join)
        .await
        .map_err(|_| format!("no answer from {addr} within {wait:?}"))??;
    let welcome = Welcome::decode(worker.welcome())?;
    if let Some(mine) = a.seed.filter(|&s| s != welcome.seed) {
        return Err(TrainError::SeedMismatch {
            mine,
            server: welcome.seed,
        }
        .into());
    }
    if let Some(mine) = a.workers.filter(|&k| k != welcome.workers) {
        return Err(TrainError::WorkersMismatch {
            mine,
            server: welcome.workers,
        }
        .into());
    }
    println!(
        "worker {} joined: dataset seed {}, batch {}, from the server",
        a.id, welcome.seed, welcome.batch
    );
    let (train, _) = Dataset::demo(welcome.seed)?;
    let mut rng = SplitMix64::new(welcome.seed ^ (a.id + 1).wrapping_mul(0x9E37));
    let mut grad = vec![0f32; model.param_count()];
    let step = Duration::from_secs_f64(a.compute_ms as f64 * a.skew / 1e3);
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_secs(a.seconds);
    let budget = a.steps.unwrap_or(u64::MAX);
    let (mut pushes, mut dropped) = (0u64, 0u64);
    // A request still unanswered at the deadline, and since when.
    let mut unanswered = None;
    let asked = tokio::time::Instant::now();
    let mut params = match tokio::time::timeout_at(deadline, worker.pull()).await {
        Ok(params) => Some(params?),
        Err(_) => {
            unanswered = Some(asked);
            None
        }
    };
    while let Some(p) = params.as_mut() {
        if pushes >= budget || tokio::time::Instant::now() >= deadline {
            break;
        }
        let t = tokio::time::Instant::now();
        let batch: Vec<usize> = (0..welcome.batch).map(|_| rng.below(train.len())).collect();
        model.gradient(&p.values, &train, &batch, &mut grad)?;
        // A slower device: wait out the rest of this worker's step time.
        tokio::time::sleep_until((t + step).min(deadline)).await;
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        let asked = tokio::time::Instant::now();
        match tokio::time::timeout_at(deadline, worker.push_flat(p.index, &grad)).await {
            Ok(reply) => {
                let reply = reply?;
                pushes += 1;
                if matches!(reply.disposition, Disposition::Dropped { .. }) {
                    dropped += 1;
                }
                worker.recycle(std::mem::replace(p, reply.params).values);
            }
            Err(_) => {
                unanswered = Some(asked);
                break;
            }
        }
    }
    worker.leave().await;
    println!("worker {} pushes={pushes} dropped={dropped}", a.id);
    if let Some(asked) = unanswered {
        let waited = asked.elapsed().as_secs_f64();
        if pushes == 0 {
            return Err(TrainError::NothingAnswered {
                seconds: a.seconds,
                waited,
            }
            .into());
        }
        // A reply a few milliseconds late is the deadline cutting a normal
        // push; a long wait is the server holding it, worth a word.
        if waited > 1.0 {
            eprintln!(
                "ps_train worker {}: --seconds ran out with a push unanswered for {waited:.1} s",
                a.id
            );
        }
    }
    Ok(())
}

// ----------------------------------------------------------- orchestrator

/// One server run of the comparison: an algorithm, and for the filter its
/// policy and threshold.
#[derive(Debug, Clone, Copy)]
struct Run {
    algo: Algo,
    filter: FilterChoice,
}

impl Run {
    fn label(&self) -> String {
        match self.algo {
            Algo::Filter => format!(
                "filter {} {}",
                self.filter.policy.name(),
                self.filter.threshold
            ),
            a => a.name().to_string(),
        }
    }
}

/// What one run's server and workers reported.
#[derive(Debug, Default)]
struct Outcome {
    evals: Vec<(f64, u64, f64, f64)>,
    done: String,
    /// Per worker: (pushes answered, of them dropped).
    worker_pushes: Vec<Option<(u64, u64)>>,
}

/// Every check of the flags that needs no process: done before anything
/// starts, so a bad value fails at once with the flag's name.
fn validate(a: &AllArgs, runs: &[Run]) -> Result<Vec<f64>, TrainError> {
    let k = a.training.workers;
    if k == 0 {
        return Err(TrainError::Invalid("--workers must be at least 1".into()));
    }
    if a.seconds == 0 {
        return Err(TrainError::Invalid("--seconds must be at least 1".into()));
    }
    if let Some(t) = a.thresholds.iter().find(|t| !(0.0..=1.0).contains(*t)) {
        return Err(TrainError::Invalid(format!(
            "--thresholds: {t} is not in [0, 1]"
        )));
    }
    let factor = |f: f64| f.is_finite() && f > 0.0;
    if !factor(a.slowest) || a.slowest < 1.0 {
        return Err(TrainError::Invalid(format!(
            "--slowest {} must be at least 1",
            a.slowest
        )));
    }
    if let Some(s) = a.straggler.filter(|&s| !factor(s)) {
        return Err(TrainError::Invalid(format!(
            "--straggler {s} must be a positive number"
        )));
    }
    if let Some(s) = a.skew.iter().find(|&&s| !factor(s)) {
        return Err(TrainError::Invalid(format!(
            "--skew {s} must be a positive number"
        )));
    }
    for run in runs {
        check_settings(run.algo, &a.training, run.filter)?;
    }
    if a.skew.is_empty() {
        Ok(gradlane_tools::sim::speeds(k, a.slowest, a.straggler))
    } else if a.skew.len() == k {
        Ok(a.skew.clone())
    } else {
        Err(TrainError::Invalid(format!(
            "--skew has {} values for {k} workers",
            a.skew.len()
        )))
    }
}

fn orchestrate(a: AllArgs) -> Result<(), BoxError> {
    let mut runs = Vec::new();
    for &algo in &a.algos {
        let mut filter = FilterChoice {
            sample: a.sample,
            threshold: 1.0,
            policy: Policy::SlidingWindow,
        };
        if algo != Algo::Filter {
            runs.push(Run { algo, filter });
            continue;
        }
        for &policy in &a.policies {
            for &threshold in &a.thresholds {
                filter.policy = policy;
                filter.threshold = threshold;
                runs.push(Run { algo, filter });
            }
        }
    }
    let skew = validate(&a, &runs)?;
    let k = a.training.workers;
    let dir = std::env::temp_dir().join(format!("gradlane-ps-train-{}", std::process::id()));
    let certs = generate_certs(&dir, &["localhost"])?;
    let exe = std::env::current_exe()?;
    let t = &a.training;
    println!(
        "ps_train: MLP {} params, K = {k}, skew {:?}, {:.0}% loss + {} ms delay per worker link, {} s per algorithm, lr {} (momentum methods {:.4}, beta {}), gradients as {}",
        Mlp::demo().param_count(),
        skew,
        a.loss * 100.0,
        a.delay_ms,
        a.seconds,
        t.lr,
        momentum_lr(t),
        t.momentum,
        if a.codec { "codec frames" } else { "gradlane rounds" }
    );
    let mut outcomes = Vec::new();
    for run in &runs {
        println!("  {} ...", run.label());
        let mut server = Command::new(&exe);
        server
            .arg("server")
            .arg("--algo")
            .arg(run.algo.name())
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--cert")
            .arg(&certs.server_cert)
            .arg("--key")
            .arg(&certs.server_key)
            .arg("--eval-ms")
            .arg(a.eval_ms.to_string())
            .arg("--max-seconds")
            .arg((a.seconds * 3 + 60).to_string())
            .arg("--round-timeout")
            .arg(a.round_timeout.to_string())
            .arg("--sample")
            .arg(run.filter.sample.to_string())
            .arg("--threshold")
            .arg(run.filter.threshold.to_string())
            .arg("--policy")
            .arg(run.filter.policy.name())
            .arg("--workers")
            .arg(k.to_string())
            .arg("--seed")
            .arg(t.seed.to_string())
            .arg("--lr")
            .arg(t.lr.to_string())
            .arg("--momentum")
            .arg(t.momentum.to_string())
            .arg("--batch")
            .arg(t.batch.to_string());
        let mut server = Guard::spawn(server.stdout(Stdio::piped()))?;
        let mut lines = BufReader::new(server.0.stdout.take().ok_or("no server stdout")?).lines();
        let addr = match lines.next() {
            Some(Ok(l)) if l.starts_with("listening ") => l["listening ".len()..].to_string(),
            other => {
                return Err(format!("the {} server did not start: {other:?}", run.label()).into())
            }
        };
        let lines = forward_lines(lines);
        let mut workers = Vec::new();
        for (i, s) in skew.iter().enumerate() {
            let mut w = Command::new(&exe);
            w.arg("worker")
                .arg("--connect")
                .arg(&addr)
                .arg("--ca")
                .arg(&certs.ca_cert)
                .arg("--id")
                .arg(i.to_string())
                .arg("--skew")
                .arg(s.to_string())
                .arg("--compute-ms")
                .arg(a.compute_ms.to_string())
                .arg("--seconds")
                .arg(a.seconds.to_string())
                .arg("--loss")
                .arg(a.loss.to_string())
                .arg("--delay-ms")
                .arg(a.delay_ms.to_string());
            if a.codec {
                w.arg("--codec");
            }
            workers.push(Guard::spawn(w.stdout(Stdio::piped()))?);
        }
        let outputs: Vec<_> = workers
            .iter_mut()
            .map(|w| collect_output(w.0.stdout.take()))
            .collect();
        let mut outcome = Outcome::default();
        supervise(&run.label(), &mut server, lines, &mut workers, |line| {
            if let Some(rest) = line.strip_prefix("eval ") {
                let f: Vec<&str> = rest.split(' ').collect();
                if let [t, steps, loss, acc] = f[..] {
                    if let (Ok(t), Ok(steps), Ok(loss), Ok(acc)) =
                        (t.parse(), steps.parse(), loss.parse(), acc.parse())
                    {
                        outcome.evals.push((t, steps, loss, acc));
                    }
                }
            } else if let Some(rest) = line.strip_prefix("done ") {
                outcome.done = rest.to_string();
            }
        })?;
        for (i, out) in outputs.into_iter().enumerate() {
            let out = out.join().unwrap_or_default();
            outcome.worker_pushes.push(worker_counts(&out, i));
        }
        outcomes.push((*run, outcome));
    }
    report(&a, &skew, &outcomes);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The server's stdout lines, read on a thread so the orchestrator can
/// watch the workers while it waits for them; the channel closes when the
/// server closes its stdout.
fn forward_lines(
    lines: impl Iterator<Item = std::io::Result<String>> + Send + 'static,
) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// A worker's whole stdout, read on a thread so its pipe never fills.
fn collect_output(out: Option<std::process::ChildStdout>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut o) = out {
            let _ = o.read_to_string(&mut s);
        }
        s
    })
}

/// Worker `i`'s `pushes=` and `dropped=` from its output.
fn worker_counts(out: &str, i: usize) -> Option<(u64, u64)> {
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("worker {i} pushes=")))?;
    let pushes = field(line, "pushes").parse().ok()?;
    let dropped = field(line, "dropped").parse().ok()?;
    Some((pushes, dropped))
}

/// Hands the server's lines to `on_line` until the server closes its
/// stdout, and meanwhile watches the workers: one that exits with an error
/// ends the run at once, naming it (the caller's guards then stop the
/// rest). Then waits for the server and reports its failure, if any.
fn supervise(
    run: &str,
    server: &mut Guard,
    lines: mpsc::Receiver<String>,
    workers: &mut [Guard],
    mut on_line: impl FnMut(&str),
) -> Result<(), TrainError> {
    let started = Instant::now();
    let worker_failed = |workers: &mut [Guard]| -> Option<TrainError> {
        workers
            .iter_mut()
            .enumerate()
            .find_map(|(index, w)| match w.0.try_wait() {
                Ok(Some(status)) if !status.success() => Some(TrainError::WorkerFailed {
                    run: run.to_string(),
                    index,
                    status,
                    after: started.elapsed().as_secs_f64(),
                }),
                _ => None,
            })
    };
    loop {
        match lines.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => on_line(&line),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if let Some(e) = worker_failed(workers) {
            return Err(e);
        }
    }
    let status = server
        .0
        .wait()
        .map_err(|e| TrainError::Invalid(format!("{run}: cannot wait for the server: {e}")))?;
    // A server that failed took its workers' links with it: it is the
    // cause, whatever they report.
    if !status.success() {
        return Err(TrainError::ServerFailed {
            run: run.to_string(),
            status,
        });
    }
    for w in workers.iter_mut() {
        let _ = w.0.wait();
    }
    match worker_failed(workers) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Kills a child process that is still running when dropped (an error
/// path), so no server outlives the example.
struct Guard(Child);

impl Guard {
    fn spawn(command: &mut Command) -> std::io::Result<Self> {
        command.spawn().map(Guard)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn field<'a>(done: &'a str, key: &str) -> &'a str {
    done.split(' ')
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or("-")
}

fn report(a: &AllArgs, skew: &[f64], outcomes: &[(Run, Outcome)]) {
    // Loss and accuracy over time, one column per run, sampled at whole
    // seconds (the last evaluation at or before each mark).
    println!();
    print!("| t (s) |");
    for (run, _) in outcomes {
        print!(" {} acc / loss |", run.label());
    }
    println!();
    print!("|---:|");
    for _ in outcomes {
        print!("---:|");
    }
    println!();
    for s in 1..=a.seconds {
        print!("| {s} |");
        for (_, o) in outcomes {
            match o.evals.iter().rev().find(|e| e.0 <= s as f64 + 1e-9) {
                Some(e) => print!(" {:.3} / {:.3} |", e.3, e.2),
                None => print!(" - |"),
            }
        }
        println!();
    }
    // The slowest worker against the others: with --straggler, the
    // straggler.
    let slowest = skew
        .iter()
        .enumerate()
        .max_by(|x, y| x.1.total_cmp(y.1))
        .map_or(0, |(i, _)| i);
    println!();
    println!(
        "| run | server steps | applied | dropped | mean staleness | worker {slowest} ({}x) dropped | others dropped | zero-filled KB | final acc | final loss | steps to loss {tl} | s to loss {tl} | s to acc {} |",
        skew.get(slowest).copied().unwrap_or(1.0),
        a.target_accuracy,
        tl = a.target_loss,
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (run, o) in outcomes {
        let last = o.evals.last().copied().unwrap_or_default();
        let to_acc = o.evals.iter().find(|e| e.3 >= a.target_accuracy);
        let to_loss = o.evals.iter().find(|e| e.2 <= a.target_loss);
        let secs =
            |e: Option<&(f64, u64, f64, f64)>| e.map_or("-".into(), |e| format!("{:.1}", e.0));
        let zero: f64 = field(&o.done, "zero_filled").parse().unwrap_or(0.0);
        let share = |pick: &dyn Fn(usize) -> bool| {
            let (mut pushes, mut dropped) = (0, 0);
            for (i, c) in o.worker_pushes.iter().enumerate() {
                if let Some((p, d)) = c.filter(|_| pick(i)) {
                    pushes += p;
                    dropped += d;
                }
            }
            if pushes == 0 {
                "-".to_string()
            } else {
                format!(
                    "{:.1}% ({dropped} of {pushes})",
                    100.0 * dropped as f64 / pushes as f64
                )
            }
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.3} | {:.3} | {} | {} | {} |",
            run.label(),
            last.1,
            field(&o.done, "applied"),
            field(&o.done, "dropped"),
            field(&o.done, "staleness"),
            share(&|i| i == slowest),
            share(&|i| i != slowest),
            zero / 1e3,
            last.3,
            last.2,
            to_loss.map_or("-".into(), |e| e.1.to_string()),
            secs(to_loss),
            secs(to_acc),
        );
    }
    // Each worker's pushes show how much slower the slow ones really were
    // (network and server time dilute the compute skew).
    println!();
    for (run, o) in outcomes {
        let per: Vec<String> = o
            .worker_pushes
            .iter()
            .map(|c| c.map_or("-".into(), |(p, d)| format!("{p}/{d}")))
            .collect();
        println!(
            "{}: pushes/dropped per worker {}",
            run.label(),
            per.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, stdout: Stdio) -> Guard {
        Guard::spawn(Command::new("sh").arg("-c").arg(script).stdout(stdout)).unwrap()
    }

    /// A worker that dies is reported while the server still runs: the
    /// server here would print nothing and close its stdout only when
    /// killed, so `supervise` returning at all means it did not wait for it.
    #[test]
    fn a_dead_worker_ends_the_run_at_once() {
        let mut server = sh("exec sleep 600", Stdio::piped());
        let lines = BufReader::new(server.0.stdout.take().unwrap()).lines();
        let mut workers = vec![
            sh("exec sleep 600", Stdio::null()),
            sh("exit 3", Stdio::null()),
        ];
        let mut seen = Vec::new();
        let e = supervise(
            "asgd",
            &mut server,
            forward_lines(lines),
            &mut workers,
            |l| seen.push(l.to_string()),
        )
        .unwrap_err();
        match &e {
            TrainError::WorkerFailed {
                run, index, status, ..
            } => {
                assert_eq!((run.as_str(), *index), ("asgd", 1));
                assert_eq!(status.code(), Some(3));
            }
            other => panic!("expected a failed worker, got {other:?}"),
        }
        assert!(e.to_string().starts_with("asgd: worker 1 failed"), "{e}");
        assert!(seen.is_empty());
        // The guards stop the server and the other worker.
        drop(workers);
        drop(server);
    }

    /// The server's lines reach the caller; a server that fails is named
    /// once its output ends, even if its workers fail with it.
    #[test]
    fn server_lines_are_passed_on_and_its_failure_named() {
        let mut server = sh(
            "echo eval 0.1 2 0.5 0.8; echo done applied=2; exit 4",
            Stdio::piped(),
        );
        let lines = BufReader::new(server.0.stdout.take().unwrap()).lines();
        let mut workers = vec![sh("exit 0", Stdio::null())];
        let mut seen = Vec::new();
        let e = supervise(
            "ssgd",
            &mut server,
            forward_lines(lines),
            &mut workers,
            |l| seen.push(l.to_string()),
        )
        .unwrap_err();
        assert!(matches!(e, TrainError::ServerFailed { .. }), "{e:?}");
        assert_eq!(seen, ["eval 0.1 2 0.5 0.8", "done applied=2"]);

        let mut server = sh("echo done applied=0", Stdio::piped());
        let lines = BufReader::new(server.0.stdout.take().unwrap()).lines();
        let mut workers = vec![sh("exit 0", Stdio::null())];
        supervise(
            "asgd",
            &mut server,
            forward_lines(lines),
            &mut workers,
            |_| {},
        )
        .unwrap();
    }

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

    #[test]
    fn a_stuck_round_names_the_workers_that_never_joined() {
        let seen = |names: &[&str]| -> Vec<WorkerInfo> {
            names
                .iter()
                .map(|n| WorkerInfo {
                    name: Some(n.to_string()),
                    connected: true,
                })
                .collect()
        };
        let why = stuck_round(0, 30, 3, &seen(&["1", "0"]));
        assert!(why.contains("waits for worker 2 of --workers 3"), "{why}");
        assert!(why.contains("joined: 1, 0"), "{why}");
        let why = stuck_round(4, 30, 4, &seen(&["0"]));
        assert!(why.contains("workers 1, 2, 3"), "{why}");
        let why = stuck_round(4, 30, 2, &seen(&["0", "1"]));
        assert!(why.contains("all 2 workers joined"), "{why}");
        let why = stuck_round(0, 30, 1, &[]);
        assert!(why.contains("joined: none"), "{why}");
    }
}
