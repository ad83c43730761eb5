//! Pieces the command-line programs share: start-up, error printing,
//! address resolution, the congestion flag, and synthetic gradients.

use clap::ValueEnum;
use gradlane::{Config, Congestion, DscpMarks, Endpoint, Layout, Packets};
use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

/// The examples' error type: anything, with its message.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Congestion controller choice on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Cc {
    /// quinn's Cubic.
    Cubic,
    /// quinn's BBR: holds up under random loss, but its window is
    /// unbounded and fills every queue on the way.
    Bbr,
    /// BBR with its window capped at a gain times the measured
    /// bandwidth-delay product (the default).
    CappedBbr,
    /// quinn's NewReno.
    Newreno,
    /// Cubic that reacts to loss only when a queue shows.
    QueueGatedCubic,
}

impl From<Cc> for Congestion {
    fn from(c: Cc) -> Self {
        match c {
            Cc::Cubic => Congestion::Cubic,
            Cc::Bbr => Congestion::Bbr,
            Cc::CappedBbr => Congestion::CappedBbr,
            Cc::Newreno => Congestion::NewReno,
            Cc::QueueGatedCubic => Congestion::QueueGatedCubic,
        }
    }
}

/// `config` with a program's transport flags: `--congestion`, and with
/// `--jumbo` 8952-byte packets from the first ([`Packets::Jumbo`]).
pub fn transport(config: Config, congestion: Cc, jumbo: bool) -> Config {
    Config {
        congestion: congestion.into(),
        packets: if jumbo {
            Packets::Jumbo
        } else {
            Packets::Ethernet
        },
        ..config
    }
}

/// The marks of the `--dscp` flag: the authors' (TOS 224 important, TOS
/// `(levels - c) * 32` for lossy level `c`).
pub fn dscp(on: bool, levels: u8) -> Option<DscpMarks> {
    on.then(|| DscpMarks::authors(levels))
}

/// Prints how many packets the endpoint sent under each DSCP, if it marks
/// them.
pub fn print_marked(endpoint: &Endpoint) {
    let Some(counts) = endpoint.marked_counts() else {
        return;
    };
    let by_mark: Vec<String> = (0..64)
        .filter(|&d| counts.packets[d] > 0)
        .map(|d| {
            format!(
                "DSCP {d} (TOS {}): {} packets, {:.2} MB",
                d << 2,
                counts.packets[d],
                counts.bytes[d] as f64 / 1e6
            )
        })
        .collect();
    println!(
        "marked (this end): {}; {} send errors",
        by_mark.join("; "),
        counts.send_errors
    );
}

/// Sets up tracing (`RUST_LOG`, default `warn`, to stderr), parses the
/// arguments, runs `run` on a multi-threaded runtime, and turns an error
/// into a one-line message and a failing exit code.
pub fn main<A, F>(name: &str, run: impl FnOnce(A) -> F) -> ExitCode
where
    A: clap::Parser,
    F: Future<Output = Result<(), BoxError>>,
{
    init_tracing();
    main_with(name, A::parse(), run)
}

/// Tracing to stderr, filtered by `RUST_LOG` (default `warn`).
fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

/// [`main`] for arguments already parsed (subcommands).
pub fn main_with<A, F>(name: &str, args: A, run: impl FnOnce(A) -> F) -> ExitCode
where
    F: Future<Output = Result<(), BoxError>>,
{
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {}", chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// An error and its sources on one line.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// Resolves `host:port` to the first address it names.
pub async fn resolve(addr: &str) -> Result<SocketAddr, BoxError> {
    let mut found = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("bad address {addr:?}: {e}"))?;
    found
        .next()
        .ok_or_else(|| format!("address {addr:?} resolves to nothing").into())
}

/// Seeded synthetic gradients shaped like real ones
/// ([`gradlane::presets::gradients`]).
pub fn grads(layout: &Layout, seed: u64) -> Vec<Vec<f32>> {
    gradlane::presets::gradients(layout, seed)
}

/// Bytes as megabytes.
pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// A duration in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
