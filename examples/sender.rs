//! Send seeded synthetic gradient rounds over one gradlane link.
//!
//! ```text
//! cargo run --release --example sender -- --connect 127.0.0.1:4433 --model resnet50 --rounds 5
//! ```
//!
//! Connects to a receiver, sends `--rounds` rounds of synthetic gradients
//! (seeded, heavy-tailed, a different scale per tensor) of a preset model,
//! and prints one markdown table row per round: encode, important and total
//! milliseconds, and per lossy level the datagrams queued and dropped by the
//! sender. At the end it prints what the fault injector on this end did.
//! `--loss`, `--delay-ms` and `--jitter-ms` inject faults on this end's
//! socket (both directions).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use gradlane::classify::{splitmix64, ClassifyConfig};
use gradlane::encode::EncoderConfig;
use gradlane::layout::Layout;
use gradlane::presets;
use gradlane::transport::tuning::{Congestion, Tuning};
use gradlane::transport::{Config, Endpoint, Faults};

/// Send gradlane rounds of synthetic gradients and print a table.
#[derive(Debug, Parser)]
#[command(name = "sender")]
struct Args {
    /// Receiver address (host:port).
    #[arg(long, default_value = "127.0.0.1:4433")]
    connect: String,
    /// Name the receiver's certificate must be valid for.
    #[arg(long, default_value = "localhost")]
    server_name: String,
    /// CA certificate that signed the receiver's certificate (PEM).
    #[arg(long, default_value = "certs/ca.pem")]
    ca: PathBuf,
    /// Model preset whose layout the gradients have.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(presets::NAMES), default_value = "resnet50")]
    model: String,
    /// Rounds to send.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Injected loss probability on this end's socket, in both directions.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Injected delay of outgoing packets, in milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Injected extra random delay of outgoing packets, up to this many ms.
    #[arg(long, default_value_t = 0)]
    jitter_ms: u64,
    /// Seed of the injected loss and jitter, and of the gradients.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Fraction of chunks sent reliably, in [0, 1].
    #[arg(long, default_value_t = ClassifyConfig::default().ratio)]
    ratio: f64,
    /// Lossy levels, 1..=7.
    #[arg(long, default_value_t = ClassifyConfig::default().levels)]
    levels: u8,
    /// Congestion controller of this end.
    #[arg(long, value_enum, default_value_t = Cc::Bbr)]
    congestion: Cc,
}

/// Congestion controller choice on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Cc {
    Cubic,
    Bbr,
    Newreno,
}

impl From<Cc> for Congestion {
    fn from(c: Cc) -> Self {
        match c {
            Cc::Cubic => Congestion::Cubic,
            Cc::Bbr => Congestion::Bbr,
            Cc::Newreno => Congestion::NewReno,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sender: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sender: {}", chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// An error and its sources on one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
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

async fn resolve(addr: &str) -> Result<SocketAddr, BoxError> {
    let mut found = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("bad address {addr:?}: {e}"))?;
    found
        .next()
        .ok_or_else(|| format!("address {addr:?} resolves to nothing").into())
}

/// Seeded synthetic gradients: per tensor a log-uniform scale in
/// [1e-4, 1e-1], per block of 256 values a factor in [1, 8], per value a
/// heavy-tailed magnitude (|x| ~ u^-1/2 - 1, a Pareto-like tail) and a sign.
fn grads(layout: &Layout, seed: u64) -> Vec<Vec<f32>> {
    (0..layout.len())
        .map(|t| {
            let mut s = splitmix64(seed ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let scale = 10f32.powf(-4.0 + 3.0 * unit(s));
            let mut block = 1.0;
            (0..layout.tensor_len(t))
                .map(|i| {
                    s = splitmix64(s);
                    if i % 256 == 0 {
                        block = 1.0 + 7.0 * unit(splitmix64(s ^ 0xb10c));
                    }
                    let u = unit(s).max(1e-6);
                    let sign = if s & 1 == 0 { 1.0 } else { -1.0 };
                    sign * scale * block * (u.sqrt().recip() - 1.0 + 1e-3)
                })
                .collect()
        })
        .collect()
}

/// A uniform value in (0, 1] from the top 24 bits.
fn unit(s: u64) -> f32 {
    ((s >> 40) as f32 + 1.0) / (1u64 << 24) as f32
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn run(args: Args) -> Result<(), BoxError> {
    if !(0.0..=1.0).contains(&args.loss) {
        return Err(format!("--loss {} is not in [0, 1]", args.loss).into());
    }
    let layout =
        presets::by_name(&args.model).ok_or_else(|| format!("unknown model {:?}", args.model))?;
    let addr = resolve(&args.connect).await?;
    let faults = (args.loss > 0.0 || args.delay_ms > 0 || args.jitter_ms > 0).then(|| Faults {
        loss_out: args.loss,
        loss_in: args.loss,
        delay: Duration::from_millis(args.delay_ms),
        jitter: Duration::from_millis(args.jitter_ms),
        seed: args.seed,
    });
    let config = Config {
        encoder: EncoderConfig {
            classify: ClassifyConfig {
                ratio: args.ratio,
                levels: args.levels,
                ..ClassifyConfig::default()
            },
            ..EncoderConfig::default()
        },
        tuning: Tuning {
            congestion: args.congestion.into(),
            ..Tuning::default()
        },
        faults,
        ..Config::default()
    };
    let endpoint = Endpoint::client(&args.ca, config)
        .map_err(|e| format!("cannot set up with CA {}: {}", args.ca.display(), chain(&e)))?;
    let mut link = endpoint
        .connect(addr, &args.server_name, &layout)
        .await
        .map_err(|e| {
            format!(
                "cannot connect to {addr} as {:?}: {}",
                args.server_name,
                chain(&e)
            )
        })?;
    println!(
        "sender: {} ({} tensors, {:.1} MB) to {addr}, ratio {}, {} levels, {:?}, loss {}, delay {} ms, jitter {} ms",
        args.model,
        layout.len(),
        mb(layout.total_bytes()),
        args.ratio,
        args.levels,
        args.congestion,
        args.loss,
        args.delay_ms,
        args.jitter_ms
    );
    println!();
    let mut h = String::from("| round | encode ms | important ms | total ms | important MB |");
    let mut sep = String::from("|---:|---:|---:|---:|---:|");
    for l in 1..=args.levels {
        h.push_str(&format!(" L{l} sent/dropped |"));
        sep.push_str("---:|");
    }
    println!("{h}\n{sep}");
    for r in 0..args.rounds {
        let g = grads(&layout, args.seed.wrapping_mul(1000).wrapping_add(r as u64));
        let report = link
            .send_round(r, &g)
            .await
            .map_err(|e| format!("round {r}: {}", chain(&e)))?;
        let mut row = format!(
            "| {r} | {:.1} | {:.1} | {:.1} | {:.2} |",
            ms(report.encode),
            ms(report.important),
            ms(report.total),
            mb(report.important_bytes)
        );
        for (p, d) in report.lossy_packets.iter().zip(&report.lossy_dropped) {
            row.push_str(&format!(" {p}/{d} |"));
        }
        println!("{row}");
    }
    // The datagrams of the last round may still be queued: wait until the
    // receiver has everything and closes the link.
    let conn = link.connection().clone();
    let closed = tokio::time::timeout(Duration::from_secs(30), conn.closed()).await;
    let stats = conn.stats();
    println!();
    println!(
        "connection: rtt {:.2} ms, {} packets sent, {} lost, {} congestion events, cwnd {} bytes",
        ms(conn.rtt()),
        stats.path.sent_packets,
        stats.path.lost_packets,
        stats.path.congestion_events,
        stats.path.cwnd
    );
    match endpoint.fault_stats() {
        Some(f) => println!(
            "faults (this end): {} transmits, {} datagrams sent, {} dropped out, \
             {} received, {} dropped in, {} delayed",
            f.transmits_sent,
            f.segments_sent,
            f.segments_dropped_out,
            f.datagrams_received,
            f.datagrams_dropped_in,
            f.segments_delayed
        ),
        None => println!("faults (this end): none injected"),
    }
    if closed.is_err() {
        link.close();
        return Err("the receiver did not close the link within 30 s of the last round".into());
    }
    endpoint.wait_idle().await;
    Ok(())
}
