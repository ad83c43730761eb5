//! Send seeded synthetic gradient rounds over one gradlane link.
//!
//! ```text
//! cargo run --release --bin sender -- --connect 127.0.0.1:4433 --model resnet50 --rounds 5
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

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use common::{chain, mb, BoxError, ClientFlags, PathFlags};
use common::{grads, ms};
use gradlane::{Config, LossyCarrier, LossyRelease, RoundTiming};

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
    #[command(flatten)]
    client: ClientFlags,
    /// Model preset whose layout the gradients have.
    #[arg(long, value_parser = common::model_names(), default_value = "resnet50")]
    model: String,
    /// Rounds to send.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
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
    #[command(flatten)]
    path: PathFlags,
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
    let layout = common::preset(&args.model)?;
    let config = Config {
        loss_tolerance: args.loss_tolerance,
        levels: args.levels,
        lanes: args.lanes,
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
        ..Config::default()
    };
    // Every setting is checked here, before anything is sent.
    let endpoint = args.client.endpoint(args.path.apply(config, args.seed))?;
    let mut link = args.client.connect(&endpoint, &layout).await?;
    let addr = link.connection().remote_address();
    let path = &args.path;
    println!(
        "sender: {} ({} tensors, {:.1} MB) to {addr}, loss tolerance {}, {} levels, {:?}, loss {}, delay {} ms, jitter {} ms",
        args.model,
        layout.len(),
        mb(layout.total_bytes()),
        args.loss_tolerance,
        args.levels,
        path.congestion,
        path.loss,
        path.delay_ms,
        path.jitter_ms
    );
    println!();
    let mut h =
        String::from("| round | encode ms | important ms | total ms | important MB | lossy on |");
    let mut sep = String::from("|---:|---:|---:|---:|---:|---|");
    for l in 1..=args.levels {
        h.push_str(&format!(" L{l} MB sent (packets/dropped) |"));
        sep.push_str("---:|");
    }
    h.push_str(" dropped by quinn |");
    sep.push_str("---:|");
    println!("{h}\n{sep}");
    let (started, mut important, mut lossy, mut dropped) = (Instant::now(), 0u64, 0u64, 0u64);
    for r in 0..args.rounds {
        let g = grads(&layout, args.seed.wrapping_mul(1000).wrapping_add(r as u64));
        // Handed over shared: the important part's long runs go to quinn
        // without a copy.
        let g: Vec<Arc<Vec<f32>>> = g.into_iter().map(Arc::new).collect();
        let report = link
            .sender()
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
        for l in 0..report.lossy_packets.len() {
            row.push_str(&format!(
                " {:.2} ({}/{}) |",
                mb(report.lossy_bytes[l]),
                report.lossy_packets[l],
                report.lossy_dropped[l]
            ));
        }
        row.push_str(&format!(" {} |", report.lossy_dropped_by_quinn));
        println!("{row}");
        important += report.important_bytes;
        lossy += report.lossy_bytes.iter().sum::<u64>();
        dropped += report.lossy_dropped.iter().sum::<u64>() + report.lossy_dropped_by_quinn;
    }
    let elapsed = started.elapsed();
    println!();
    println!(
        "important ms: until the receiver confirmed every important chunk; total ms: until the \
         lossy part was handed to the network too. Lossy levels: MB handed to the network \
         (packets: datagrams, or 64 KiB pieces on streams; dropped: by this sender, past a \
         deadline). dropped by quinn: datagrams quinn discarded after the path MTU fell. \
         Loss on the way shows at the receiver, as zero-filled MB."
    );
    println!(
        "summary: {} rounds in {:.0} ms ({:.2} Gbit/s of model data), {:.1} MB important \
         (confirmed), {:.1} MB lossy sent, {dropped} lossy packets dropped before sending",
        args.rounds,
        ms(elapsed),
        (important + lossy) as f64 * 8.0 / elapsed.as_secs_f64().max(1e-9) / 1e9,
        mb(important),
        mb(lossy)
    );
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
            "faults (this end): {} transmits, {} UDP packets sent, {} dropped out, \
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
