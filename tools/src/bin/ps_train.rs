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
//! 4x by default). The model is a small MLP ([`gradlane_tools::mlp`]) on a
//! synthetic classification problem that a linear model cannot solve. The
//! server evaluates the parameters on a held-out set every `--eval-ms` and
//! prints them; this process collects those lines into a loss/accuracy
//! table over time and a summary (updates applied and dropped, staleness,
//! time to target).
//!
//! Across hosts: run `ps_train server --listen 0.0.0.0:4433 --algo ormo`
//! on one machine and `ps_train worker --connect HOST:4433 --id i` on
//! others, with certificates from `cargo run --bin certs`.

use gradlane_tools::cli as common;

use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};
use common::BoxError;
use gradlane::generate_certs;
use gradlane::ps::baselines::{Asgd, SyncMomentum};
use gradlane::ps::{
    Disposition, OrderedMomentum, OrderedMomentumConfig, ParameterServer, StragglerConfig,
    StragglerFilter,
};
use gradlane::ps_net::{self, Compression, ServerHandle, Worker};
use gradlane::{Config, Faults};
use gradlane_core::rng::SplitMix64;
use gradlane_tools::mlp::{Dataset, Mlp};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Train an MLP through the gradlane parameter server.
#[derive(Debug, Parser)]
#[command(name = "ps_train")]
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

/// Options both roles must agree on.
#[derive(Debug, Clone, ClapArgs)]
struct Training {
    /// Workers K.
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
    /// Injected loss on each worker's link, each direction.
    #[arg(long, default_value_t = 0.05)]
    loss: f64,
    /// One-way delay added by each worker, milliseconds.
    #[arg(long, default_value_t = 1)]
    delay_ms: u64,
    /// Slowdown of each worker (comma separated); default spreads 1x..4x.
    #[arg(long, value_delimiter = ',')]
    skew: Vec<f64>,
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
    /// Target test loss for the time-to-target column.
    #[arg(long, default_value_t = 0.3)]
    target_loss: f64,
    /// Send gradients as codec frames (top 10%) instead of gradlane rounds.
    #[arg(long)]
    codec: bool,
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
    /// Straggler filter: rank threshold.
    #[arg(long, default_value_t = 0.8)]
    threshold: f64,
    /// How long the server waits for a gradient round's lossy datagrams
    /// after its important chunks are in, milliseconds (loopback needs
    /// little; a WAN path wants a few RTTs).
    #[arg(long, default_value_t = 5)]
    grace_ms: u64,
    /// Give up this many seconds after start even if workers remain.
    #[arg(long, default_value_t = 600)]
    max_seconds: u64,
}

#[derive(Debug, Clone, ClapArgs)]
struct WorkerArgs {
    #[command(flatten)]
    training: Training,
    #[command(flatten)]
    client: common::ClientFlags,
    /// Worker number (seeds its minibatches and its injected loss).
    #[arg(long, default_value_t = 0)]
    id: u64,
    /// This worker's slowdown.
    #[arg(long, default_value_t = 1.0)]
    skew: f64,
    /// Compute time of one step at skew 1, milliseconds.
    #[arg(long, default_value_t = 10)]
    compute_ms: u64,
    /// Seconds to train.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Injected loss, each direction.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// One-way injected delay, milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Send gradients as codec frames (top 10%).
    #[arg(long)]
    codec: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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

/// The model and data, the same in every process.
fn problem(t: &Training) -> Result<(Mlp, Dataset, Dataset), BoxError> {
    let (train, test) = Dataset::demo(t.seed)?;
    Ok((Mlp::demo(), train, test))
}

fn momentum_lr(t: &Training) -> f64 {
    t.lr * t.workers as f64 * (1.0 - t.momentum)
}

// ---------------------------------------------------------------- server

async fn serve(a: ServerArgs) -> Result<(), BoxError> {
    let (model, _, test) = problem(&a.training)?;
    let w0 = model.init(a.training.seed);
    let t = &a.training;
    match a.algo {
        Algo::Ormo => {
            let cfg = OrderedMomentumConfig {
                workers: t.workers,
                momentum: t.momentum,
                learning_rate: momentum_lr(t),
            };
            serve_with(&a, &model, &test, OrderedMomentum::new(cfg, w0)?, |_| None).await
        }
        Algo::Asgd => serve_with(&a, &model, &test, Asgd::new(t.lr, w0)?, |_| None).await,
        Algo::Ssgd => {
            let s = SyncMomentum::new(t.workers, momentum_lr(t), t.momentum, w0)?;
            serve_with(&a, &model, &test, s, |_| None).await
        }
        Algo::Filter => {
            let cfg = StragglerConfig {
                learning_rate: t.lr,
                sample_size: a.sample,
                rank_threshold: a.threshold,
                sample_policy: gradlane::ps::SamplePolicy::EvictLargest,
            };
            serve_with(&a, &model, &test, StragglerFilter::new(cfg, w0)?, |s| {
                Some(s.stats().mean_applied_staleness())
            })
            .await
        }
    }
}

/// Serves until every worker that joined has left; prints `listening`,
/// `eval` and `done` lines for the orchestrator.
async fn serve_with<S: ParameterServer + Send + 'static>(
    a: &ServerArgs,
    model: &Mlp,
    test: &Dataset,
    server: S,
    filter_staleness: impl Fn(&S) -> Option<f64>,
) -> Result<(), BoxError> {
    let mut config = Config::default();
    config.timing.grace = Duration::from_millis(a.grace_ms);
    let endpoint = a.server.endpoint(config).await?;
    println!("listening {}", endpoint.local_addr()?);
    std::io::stdout().flush()?;
    let handle = ServerHandle::new(server);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = handle.clone();
    let serving = tokio::spawn(async move { ps_net::run(&endpoint, h, stopped).await });

    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(a.eval_ms.max(10)));
    let mut clock_started = None;
    loop {
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
        }
        let all_left = stats.workers_joined >= a.training.workers as u64
            && stats.workers_left >= stats.workers_joined;
        if all_left || start.elapsed() > Duration::from_secs(a.max_seconds) {
            break;
        }
    }
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
    Ok(())
}

// ---------------------------------------------------------------- worker

async fn work(a: WorkerArgs) -> Result<(), BoxError> {
    let (model, train, _) = problem(&a.training)?;
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
    let mut worker = Worker::join(
        &endpoint,
        addr,
        &a.client.server_name,
        model.layout(),
        compression,
    )
    .await?;
    let mut params = worker.pull().await?;
    let mut rng = SplitMix64::new(a.training.seed ^ (a.id + 1).wrapping_mul(0x9E37));
    let mut grad = vec![0f32; model.param_count()];
    let step = Duration::from_secs_f64(a.compute_ms as f64 * a.skew / 1e3);
    let start = Instant::now();
    let (mut pushes, mut dropped) = (0u64, 0u64);
    while start.elapsed() < Duration::from_secs(a.seconds) {
        let t = Instant::now();
        let batch: Vec<usize> = (0..a.training.batch)
            .map(|_| rng.below(train.len()))
            .collect();
        model.gradient(&params.values, &train, &batch, &mut grad)?;
        // A slower device: wait out the rest of this worker's step time.
        if let Some(rest) = step.checked_sub(t.elapsed()) {
            tokio::time::sleep(rest).await;
        }
        let reply = worker.push_flat(params.index, &grad).await?;
        pushes += 1;
        if matches!(reply.disposition, Disposition::Dropped { .. }) {
            dropped += 1;
        }
        worker.recycle(std::mem::replace(&mut params, reply.params).values);
    }
    worker.leave().await;
    println!("worker {} pushes={pushes} dropped={dropped}", a.id);
    Ok(())
}

// ----------------------------------------------------------- orchestrator

/// What one algorithm's server reported.
#[derive(Debug, Default)]
struct Outcome {
    evals: Vec<(f64, u64, f64, f64)>,
    done: String,
    worker_pushes: Vec<String>,
}

fn orchestrate(a: AllArgs) -> Result<(), BoxError> {
    let k = a.training.workers;
    if k == 0 {
        return Err("--workers must be at least 1".into());
    }
    let skew: Vec<f64> = if a.skew.is_empty() {
        (0..k)
            .map(|i| 1.0 + 3.0 * i as f64 / (k.max(2) - 1) as f64)
            .collect()
    } else if a.skew.len() == k {
        a.skew.clone()
    } else {
        return Err(format!("--skew has {} values for {k} workers", a.skew.len()).into());
    };
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
    let common_args = |c: &mut Command| {
        c.arg("--workers")
            .arg(k.to_string())
            .arg("--seed")
            .arg(t.seed.to_string())
            .arg("--lr")
            .arg(t.lr.to_string())
            .arg("--momentum")
            .arg(t.momentum.to_string())
            .arg("--batch")
            .arg(t.batch.to_string());
    };
    let mut outcomes = Vec::new();
    for &algo in &a.algos {
        println!("  {} ...", algo.name());
        let mut server = Command::new(&exe);
        server
            .arg("server")
            .arg("--algo")
            .arg(algo.name())
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--cert")
            .arg(&certs.server_cert)
            .arg("--key")
            .arg(&certs.server_key)
            .arg("--eval-ms")
            .arg(a.eval_ms.to_string())
            .arg("--max-seconds")
            .arg((a.seconds * 3 + 60).to_string());
        common_args(&mut server);
        let mut server = Guard(server.stdout(Stdio::piped()).spawn()?);
        let mut lines = BufReader::new(server.0.stdout.take().ok_or("no server stdout")?).lines();
        let addr = match lines.next() {
            Some(Ok(l)) if l.starts_with("listening ") => l["listening ".len()..].to_string(),
            other => return Err(format!("server did not start: {other:?}").into()),
        };
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
            common_args(&mut w);
            workers.push(Guard(w.stdout(Stdio::piped()).spawn()?));
        }
        let mut outcome = Outcome::default();
        for line in lines {
            let line = line?;
            if let Some(rest) = line.strip_prefix("eval ") {
                let f: Vec<&str> = rest.split(' ').collect();
                if let [t, steps, loss, acc] = f[..] {
                    outcome
                        .evals
                        .push((t.parse()?, steps.parse()?, loss.parse()?, acc.parse()?));
                }
            } else if let Some(rest) = line.strip_prefix("done ") {
                outcome.done = rest.to_string();
            }
        }
        for w in &mut workers {
            let mut out = String::new();
            if let Some(o) = w.0.stdout.as_mut() {
                std::io::Read::read_to_string(o, &mut out)?;
            }
            let status = w.0.wait()?;
            if !status.success() {
                return Err(format!("a {} worker failed ({status})", algo.name()).into());
            }
            outcome.worker_pushes.push(out.trim().to_string());
        }
        let status = server.0.wait()?;
        if !status.success() {
            return Err(format!("the {} server failed ({status})", algo.name()).into());
        }
        outcomes.push((algo, outcome));
    }
    report(&a, &outcomes);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Kills a child process that is still running when dropped (an error
/// path), so no server outlives the example.
struct Guard(Child);

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

fn report(a: &AllArgs, outcomes: &[(Algo, Outcome)]) {
    // Loss and accuracy over time, one column per algorithm, sampled at
    // whole seconds (the last evaluation at or before each mark).
    println!();
    print!("| t (s) |");
    for (algo, _) in outcomes {
        print!(" {} acc / loss |", algo.name());
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
    println!();
    println!(
        "| algorithm | server steps | applied | dropped | mean staleness | zero-filled KB | final acc | final loss | s to acc {} | s to loss {} |",
        a.target_accuracy, a.target_loss
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (algo, o) in outcomes {
        let last = o.evals.last().copied().unwrap_or_default();
        let to_acc = o.evals.iter().find(|e| e.3 >= a.target_accuracy);
        let to_loss = o.evals.iter().find(|e| e.2 <= a.target_loss);
        let secs =
            |e: Option<&(f64, u64, f64, f64)>| e.map_or("-".into(), |e| format!("{:.1}", e.0));
        let zero: f64 = field(&o.done, "zero_filled").parse().unwrap_or(0.0);
        println!(
            "| {} | {} | {} | {} | {} | {:.1} | {:.3} | {:.3} | {} | {} |",
            algo.name(),
            last.1,
            field(&o.done, "applied"),
            field(&o.done, "dropped"),
            field(&o.done, "staleness"),
            zero / 1e3,
            last.3,
            last.2,
            secs(to_acc),
            secs(to_loss),
        );
    }
    for (algo, o) in outcomes {
        println!("{}: {}", algo.name(), o.worker_pushes.join("; "));
    }
}
