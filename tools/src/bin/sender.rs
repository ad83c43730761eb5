//! Send seeded synthetic gradient rounds over one gradlane link.
//!
//! ```text
//! cargo run --release --example sender -- --connect 127.0.0.1:4433 --model resnet50 --rounds 5
//! ```
//!
//! Connects to a receiver, sends `--rounds` rounds of synthetic gradients
//! (seeded, heavy-tailed, a different scale per tensor) of a preset model,
//! and prints one markdown table row per round: encode, important and total
//! milliseconds, what carried the lossy levels (streams while the path
//! loses nothing, else datagrams; `--lossy-carrier`), and per lossy level
//! the packets queued and dropped by the sender. At the end it prints what
//! the fault injector on this end did.
//! `--loss`, `--delay-ms` and `--jitter-ms` inject faults on this end's
//! socket (both directions).

use gradlane_tools::cli as common;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use common::{chain, mb, resolve, BoxError, Cc};
use common::{grads, ms};
use gradlane::{presets, Config, Endpoint, Faults, LossyCarrier, LossyRelease, RoundTiming};

/// `--lossy-release` on the command line (`LossyRelease`).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Release {
    /// Once quinn has sent the important stream.
    Sent,
    /// Once the receiver confirmed every important chunk.
    Confirmed,
}

/// `--lossy-carrier` on the command line (`LossyCarrier`).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Carrier {
    /// Streams while the path loses nothing, datagrams once it does.
    Adaptive,
    /// Always datagrams.
    Datagrams,
}

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
    /// Share of each tensor's chunks (the least important) sent lossy, in
    /// [0, 1].
    #[arg(long, default_value_t = Config::default().loss_tolerance)]
    loss_tolerance: f64,
    /// Lossy levels, 1..=7.
    #[arg(long, default_value_t = Config::default().levels)]
    levels: u8,
    /// Congestion controller of this end.
    #[arg(long, value_enum, default_value_t = Cc::CappedBbr)]
    congestion: Cc,
    /// Every packet 8952 bytes from the first (`Tuning::jumbo`): only on a
    /// network that carries 9000-byte frames end to end (and loopback).
    /// Set it on both ends: with one end only, packets stay within the
    /// other's 1452 bytes. On a path with a smaller MTU the handshake
    /// fails.
    #[arg(long)]
    jumbo: bool,
    /// Mark every packet with the DSCP of its class, as the authors did:
    /// TOS 224 for the important class, acknowledgements and control, TOS
    /// `(levels - c) * 32` for lossy level `c`. For networks that queue by
    /// DSCP; the lossy part then goes as datagrams once the receiver
    /// confirmed the important part. Linux only.
    #[arg(long)]
    dscp: bool,
    /// Streams each round's important part is spread over.
    #[arg(long, default_value_t = Config::default().lanes)]
    lanes: u8,
    /// When each round's lossy datagrams start: once the important stream
    /// is sent (the default), or once the receiver confirmed it.
    #[arg(long, value_enum, default_value_t = Release::Sent)]
    lossy_release: Release,
    /// What carries the lossy levels.
    #[arg(long, value_enum, default_value_t = Carrier::Adaptive)]
    lossy_carrier: Carrier,
}

fn main() -> ExitCode {
    common::main("sender", run)
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
        loss_tolerance: args.loss_tolerance,
        levels: args.levels,
        lanes: args.lanes,
        dscp: common::dscp(args.dscp, args.levels),
        timing: RoundTiming {
            release: match args.lossy_release {
                Release::Sent => LossyRelease::Sent,
                Release::Confirmed => LossyRelease::Acknowledged,
            },
            lossy_carrier: match args.lossy_carrier {
                Carrier::Adaptive => LossyCarrier::Adaptive,
                Carrier::Datagrams => LossyCarrier::Datagrams,
            },
            ..RoundTiming::default()
        },
        faults,
        ..common::transport(Config::default(), args.congestion, args.jumbo)
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
        "sender: {} ({} tensors, {:.1} MB) to {addr}, loss tolerance {}, {} levels, {:?}, loss {}, delay {} ms, jitter {} ms",
        args.model,
        layout.len(),
        mb(layout.total_bytes()),
        args.loss_tolerance,
        args.levels,
        args.congestion,
        args.loss,
        args.delay_ms,
        args.jitter_ms
    );
    println!();
    let mut h =
        String::from("| round | encode ms | important ms | total ms | important MB | lossy on |");
    let mut sep = String::from("|---:|---:|---:|---:|---:|---|");
    for l in 1..=args.levels {
        h.push_str(&format!(" L{l} sent/dropped |"));
        sep.push_str("---:|");
    }
    // Queued datagrams quinn discarded when the path MTU fell.
    h.push_str(" dropped by quinn |");
    sep.push_str("---:|");
    println!("{h}\n{sep}");
    for r in 0..args.rounds {
        let g = grads(&layout, args.seed.wrapping_mul(1000).wrapping_add(r as u64));
        // Handed over shared: the important part's long runs go to quinn
        // without a copy.
        let g: Vec<Arc<Vec<f32>>> = g.into_iter().map(Arc::new).collect();
        let report = link
            .send_round_shared(r, &g)
            .await
            .map_err(|e| format!("round {r}: {}", chain(&e)))?;
        let mut row = format!(
            "| {r} | {:.1} | {:.1} | {:.1} | {:.2} | {} |",
            ms(report.encode),
            ms(report.important),
            ms(report.total),
            mb(report.important_bytes),
            if report.lossy_on_stream {
                "streams"
            } else {
                "datagrams"
            }
        );
        for (p, d) in report.lossy_packets.iter().zip(&report.lossy_dropped) {
            row.push_str(&format!(" {p}/{d} |"));
        }
        row.push_str(&format!(" {} |", report.lossy_dropped_by_quinn));
        println!("{row}");
    }
    // The datagrams of the last round may still be queued: wait until the
    // receiver has everything and closes the link. It delivers the round at
    // most `max_grace` after confirming it; its close can be lost, and
    // quinn resends a close only when more packets come, so after a margin
    // this end closes (the last round was confirmed: nothing is lost).
    let conn = link.connection().clone();
    let wait = RoundTiming::default().max_grace + Duration::from_secs(3);
    let closed = tokio::time::timeout(wait, conn.closed()).await;
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
    common::print_marked(&endpoint);
    if closed.is_err() {
        eprintln!(
            "sender: no close from the receiver within {wait:?} of the last round \
             (lost?); closing from this end"
        );
        link.close_now();
    }
    endpoint.wait_idle().await;
    Ok(())
}
