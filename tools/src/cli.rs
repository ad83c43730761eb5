//! Pieces the command-line programs share: start-up, error printing,
//! address resolution, synthetic gradients, and the flags several programs
//! take (the congestion controller, model presets, a benchmark's rounds and
//! loss rates, the straggler filter's policy, a path's faults, a server's or
//! client's end).

use clap::ValueEnum;
use gradlane::ps::SamplePolicy;
use gradlane::{
    presets, Config, Congestion, DscpMarks, Endpoint, Faults, Layout, Link, LinkError, Packets,
    SetupError, DEFAULT_CONNECT_TIMEOUT,
};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
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
/// `--jumbo` 8952-byte packets from the first ([`Packets::Jumbo`]); without
/// it, MTU discovery up to what the route to each peer carries
/// ([`Packets::Route`]).
pub fn transport(config: Config, congestion: Cc, jumbo: bool) -> Config {
    Config {
        congestion: congestion.into(),
        packets: if jumbo {
            Packets::Jumbo
        } else {
            Packets::Route
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

/// The programs' runtime threads: `GRADLANE_THREADS`, else every core
/// (at least 2: a program runs both ends of its links in one process).
pub fn worker_threads() -> Result<usize, String> {
    match gradlane::environment::threads().map_err(|e| e.to_string())? {
        Some(n) => Ok(n),
        None => Ok(std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .max(2)),
    }
}

/// [`main`] for arguments already parsed (subcommands).
pub fn main_with<A, F>(name: &str, args: A, run: impl FnOnce(A) -> F) -> ExitCode
where
    F: Future<Output = Result<(), BoxError>>,
{
    init_tracing();
    let threads = match worker_threads() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
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

/// A probability on the command line: a number in [0, 1].
pub fn probability(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{p} is not in [0, 1]"))
    }
}

/// The values `--model` takes where a program checks them as it parses:
/// the names of the model presets.
pub fn model_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(presets::NAMES)
}

/// The layout of the model preset `name`, or an error that lists the
/// presets.
pub fn preset(name: &str) -> Result<Layout, BoxError> {
    presets::by_name(name).ok_or_else(|| {
        format!(
            "unknown model {name:?} (one of {})",
            presets::NAMES.join(", ")
        )
        .into()
    })
}

/// Whether `--only` leaves out the variant `name`: some texts are given
/// and `name` contains none of them.
pub fn left_out(only: &[String], name: &str) -> bool {
    !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str()))
}

/// A benchmark's timed rounds and the loss rates and delay it runs them
/// under.
#[derive(Debug, Clone, clap::Args)]
pub struct Sweep {
    /// Timed rounds per variant (after one warm-up round).
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
    /// Injected loss probabilities, comma separated: every QUIC packet,
    /// either direction, meets the loss once.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.0, 0.01, 0.05])]
    pub losses: Vec<f64>,
    /// One-way delay each QUIC end adds to what it sends, in milliseconds.
    #[arg(long, default_value_t = 1)]
    pub delay_ms: u64,
}

impl Sweep {
    /// Refuses no timed rounds and a loss rate outside [0, 1].
    pub fn check(&self) -> Result<(), BoxError> {
        if self.rounds == 0 {
            return Err("--rounds must be at least 1".into());
        }
        if let Some(l) = self.losses.iter().find(|l| !(0.0..=1.0).contains(*l)) {
            return Err(format!("loss {l} is not in [0, 1]").into());
        }
        Ok(())
    }
}

/// How the workers' speeds spread: evenly from 1x to `--slowest`, with
/// one `--straggler` beyond if asked for.
#[derive(Debug, Clone, clap::Args)]
pub struct Spread {
    /// Slowdown of the slowest worker against the fastest: the workers
    /// spread evenly from 1x to this (all but the straggler, with
    /// `--straggler`).
    #[arg(long, default_value_t = 4.0)]
    pub slowest: f64,
    /// Make the last worker a straggler this many times slower than the
    /// fastest; the others spread from 1x to `--slowest`.
    #[arg(long)]
    pub straggler: Option<f64>,
}

impl Spread {
    /// The slowdowns of `k` workers ([`crate::sim::speeds`]).
    pub fn speeds(&self, k: usize) -> Vec<f64> {
        crate::sim::speeds(k, self.slowest, self.straggler)
    }
}

/// Which value leaves the straggler filter's full sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Policy {
    /// Evict the oldest value: the sample is the last pushes' staleness.
    SlidingWindow,
    /// Evict the largest value (the seed's claim 1b as written): drops
    /// nearly every push with another update in between.
    EvictLargest,
}

impl Policy {
    /// The value as the command line writes it.
    pub fn name(self) -> &'static str {
        match self {
            Policy::SlidingWindow => "sliding-window",
            Policy::EvictLargest => "evict-largest",
        }
    }

    /// The policy in words, for a table.
    pub fn words(self) -> &'static str {
        match self {
            Policy::SlidingWindow => "sliding window",
            Policy::EvictLargest => "evict largest",
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

/// How a program's end meets the path: injected faults and the transport.
#[derive(Debug, Clone, clap::Args)]
pub struct PathFlags {
    /// Injected loss probability on this end's socket, in both directions,
    /// in [0, 1].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = probability)]
    pub loss: f64,
    /// Injected delay of outgoing packets, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
    /// Injected extra random delay of outgoing packets, up to this many ms.
    #[arg(long, default_value_t = 0)]
    pub jitter_ms: u64,
    /// Congestion controller of this end.
    #[arg(long, value_enum, default_value_t = Cc::CappedBbr)]
    pub congestion: Cc,
    /// Every packet 8952 bytes from the first: only on a network that
    /// carries 9000-byte frames end to end (and loopback). Set it on both
    /// ends: with one end only, packets stay within the other's 1452
    /// bytes. On a path with a smaller MTU the handshake fails.
    #[arg(long)]
    pub jumbo: bool,
    /// Mark every packet with the DSCP of its class, as the authors did:
    /// TOS 224 for the important class, acknowledgements and control, TOS
    /// `(levels - c) * 32` for lossy level `c`. For networks that queue by
    /// DSCP; the lossy part then goes as datagrams once the peer confirmed
    /// the important part. Linux only.
    #[arg(long)]
    pub dscp: bool,
}

impl PathFlags {
    /// The injected faults, seeded with `seed`, if any are asked for.
    pub fn faults(&self, seed: u64) -> Option<Faults> {
        (self.loss > 0.0 || self.delay_ms > 0 || self.jitter_ms > 0).then(|| Faults {
            loss_out: self.loss,
            loss_in: self.loss,
            delay: Duration::from_millis(self.delay_ms),
            jitter: Duration::from_millis(self.jitter_ms),
            seed,
        })
    }

    /// `config` with these flags' transport and faults.
    pub fn apply(&self, config: Config, seed: u64) -> Config {
        Config {
            dscp: dscp(self.dscp, config.levels),
            faults: self.faults(seed),
            ..transport(config, self.congestion, self.jumbo)
        }
    }
}

/// Where a server end listens and what it proves itself with.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerFlags {
    /// Address to listen on (host:port).
    #[arg(long, default_value = "127.0.0.1:4433")]
    pub listen: String,
    /// Server certificate chain (PEM; `certs` makes one).
    #[arg(long, default_value = "certs/server.pem")]
    pub cert: PathBuf,
    /// Server private key (PEM).
    #[arg(long, default_value = "certs/server.key")]
    pub key: PathBuf,
}

impl ServerFlags {
    /// A server endpoint with `config`, listening where the flags say.
    pub async fn endpoint(&self, config: Config) -> Result<Endpoint, BoxError> {
        let addr = resolve(&self.listen).await?;
        Endpoint::server(addr, &self.cert, &self.key, config).map_err(|e| match e {
            SetupError::Config(e) => format!("invalid setting: {e}").into(),
            e => format!(
                "cannot listen on {addr} with {} and {}: {}",
                self.cert.display(),
                self.key.display(),
                chain(&e)
            )
            .into(),
        })
    }
}

/// Whom a client end connects to and how it checks the server.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientFlags {
    /// Server address (host:port).
    #[arg(long, default_value = "127.0.0.1:4433")]
    pub connect: String,
    /// Name the server's certificate must be valid for.
    #[arg(long, default_value = "localhost")]
    pub server_name: String,
    /// CA certificate that signed the server's certificate (PEM).
    #[arg(long, default_value = "certs/ca.pem")]
    pub ca: PathBuf,
    /// Give up connecting after this many seconds. Until then a connect
    /// that has not got through starts another QUIC handshake beside the
    /// earlier ones (after 2 s, 4 s, 8 s, then every 16 s): under heavy
    /// loss one handshake's retransmissions can back off past any wait.
    #[arg(long, default_value_t = DEFAULT_CONNECT_TIMEOUT.as_secs())]
    pub connect_timeout_secs: u64,
}

impl ClientFlags {
    /// A client endpoint with `config`, trusting the flags' CA, whose
    /// connects give up after the flags' connect timeout.
    pub fn endpoint(&self, config: Config) -> Result<Endpoint, BoxError> {
        let config = Config {
            connect_timeout: Duration::from_secs(self.connect_timeout_secs),
            ..config
        };
        Endpoint::client(&self.ca, config).map_err(|e| match e {
            SetupError::Config(e) => format!("invalid setting: {e}").into(),
            e => format!("cannot set up with CA {}: {}", self.ca.display(), chain(&e)).into(),
        })
    }

    /// Connects `endpoint` (made by [`endpoint`](Self::endpoint), whose
    /// connect timeout is the flags') to the flags' server with `layout`,
    /// saying so first.
    pub async fn connect(&self, endpoint: &Endpoint, layout: &Layout) -> Result<Link, BoxError> {
        let addr = resolve(&self.connect).await?;
        eprintln!("connecting to {addr} as {:?}...", self.server_name);
        match endpoint.connect(addr, &self.server_name, layout).await {
            Ok(link) => Ok(link),
            Err(LinkError::ConnectTimeout {
                waited, attempts, ..
            }) => Err(format!(
                "no answer from {addr} within {waited:?}, {attempts} handshakes tried \
                 (is the server running and reachable? --connect-timeout-secs waits longer)"
            )
            .into()),
            Err(e) => Err(format!(
                "cannot connect to {addr} as {:?}: {}",
                self.server_name,
                chain(&e)
            )
            .into()),
        }
    }
}
