//! Receive gradient rounds over one gradlane link and print what arrived.
//!
//! ```text
//! cargo run --release --bin receiver -- --listen 127.0.0.1:4433 --rounds 5
//! ```
//!
//! Accepts one link (the sender's layout travels in the handshake), receives
//! `--rounds` rounds and prints one markdown table row per round: the time
//! since the previous delivery (since the link came up, for the first), the
//! important megabytes, per lossy level the received/sent megabytes, and the
//! zero-filled and late-merged megabytes. `--loss`, `--delay-ms` and
//! `--jitter-ms` inject faults on this end's socket (both directions).
//! The sender's options decide chunking and classification.

use gradlane_tools::cli as common;

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use common::{chain, mb, BoxError, PathFlags, ServerFlags};
use gradlane::{Config, RoundStats};

/// Receive gradlane rounds and print a table of what arrived.
#[derive(Debug, Parser)]
#[command(name = "receiver")]
struct Args {
    #[command(flatten)]
    server: ServerFlags,
    /// Accept only a sender whose model has this preset's layout (the
    /// layout comes in the handshake either way).
    #[arg(long, value_parser = common::model_names())]
    model: Option<String>,
    /// Rounds to receive before closing the link.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Seed of the injected loss and jitter.
    #[arg(long, default_value_t = 2)]
    seed: u64,
    #[command(flatten)]
    path: PathFlags,
}

fn main() -> ExitCode {
    common::main("receiver", run)
}

async fn run(args: Args) -> Result<(), BoxError> {
    let expect_layout = match &args.model {
        Some(name) => Some(common::preset(name)?),
        None => None,
    };
    let config = Config {
        expect_layout,
        ..Config::default()
    };
    let endpoint = args
        .server
        .endpoint(args.path.apply(config, args.seed))
        .await?;
    eprintln!("receiver: listening on {}", endpoint.local_addr()?);
    let mut link = match endpoint.accept().await {
        Some(link) => link.map_err(|e| format!("accepting the link: {}", chain(&e)))?,
        None => return Err("the endpoint closed before a link came".into()),
    };
    let remote = link.connection().remote_address();
    let tensors = link.layout().len();
    let model_mb = mb(link.layout().total_bytes());
    println!("receiver: link from {remote}: {tensors} tensors, {model_mb:.1} MB per round");
    println!();

    let mut last = Instant::now();
    let first = last;
    let mut totals = RoundStats::default();
    let mut header = false;
    let mut received = 0u32;
    for _ in 0..args.rounds {
        let round = link
            .receiver()
            .recv_round()
            .await
            .map_err(|e| format!("after {received} rounds: {}", chain(&e)))?;
        let now = Instant::now();
        let ms = now.duration_since(last).as_secs_f64() * 1e3;
        last = now;
        let s = &round.stats;
        let levels = s.levels as usize;
        if !header {
            let mut h = String::from("| round | ms since previous | important MB |");
            let mut sep = String::from("|---:|---:|---:|");
            for l in 1..=levels {
                h.push_str(&format!(" L{l} recv/sent MB |"));
                sep.push_str("---:|");
            }
            h.push_str(" zero-filled MB | late-merged MB |");
            sep.push_str("---:|---:|");
            println!("{h}\n{sep}");
            header = true;
        }
        let mut row = format!(
            "| {} | {ms:.1} | {:.2} |",
            round.index,
            mb(s.classes[0].received_bytes)
        );
        for c in &s.classes[1..=levels.min(s.classes.len() - 1)] {
            row.push_str(&format!(
                " {:.2}/{:.2} |",
                mb(c.received_bytes),
                mb(c.sent_bytes)
            ));
        }
        let lossy = s.lossy();
        row.push_str(&format!(
            " {:.3} | {:.3} |",
            mb(lossy.zero_filled_bytes),
            mb(lossy.late_merged_bytes)
        ));
        println!("{row}");
        for (t, c) in totals.classes.iter_mut().zip(&s.classes) {
            t.sent_bytes += c.sent_bytes;
            t.received_bytes += c.received_bytes;
            t.zero_filled_bytes += c.zero_filled_bytes;
            t.late_merged_bytes += c.late_merged_bytes;
        }
        totals.counters = s.counters;
        received += 1;
        link.receiver().recycle(round.tensors);
    }
    println!();
    println!(
        "Lossy levels: MB received of MB sent. zero-filled: lossy bytes that never came and \
         were filled with zeros; late-merged: bytes of an earlier round that came after it was \
         delivered, added into this one."
    );
    let secs = last.duration_since(first).as_secs_f64();
    let lossy = totals.lossy();
    let sent = totals.classes[0].sent_bytes + lossy.sent_bytes;
    let got = totals.classes[0].received_bytes + lossy.received_bytes;
    println!();
    println!(
        "summary: {received} rounds in {:.0} ms ({:.2} Gbit/s of model data), \
         {:.1} of {:.1} MB received ({:.3}%), zero-filled {:.3} MB, late-merged {:.3} MB, \
         duplicates {}, malformed {}, late buffered/dropped/too old {}/{}/{}",
        secs * 1e3,
        if secs > 0.0 {
            (received as f64 * model_mb * 8e6) / secs / 1e9
        } else {
            0.0
        },
        mb(got),
        mb(sent),
        if sent > 0 {
            got as f64 * 100.0 / sent as f64
        } else {
            100.0
        },
        mb(lossy.zero_filled_bytes),
        mb(lossy.late_merged_bytes),
        totals.counters.duplicates,
        totals.counters.malformed,
        totals.counters.late_buffered,
        totals.counters.late_dropped_full,
        totals.counters.too_old,
    );
    if let Some(f) = endpoint.fault_stats() {
        println!(
            "faults (this end): dropped {} of {} outgoing, {} of {} incoming UDP packets",
            f.segments_dropped_out,
            f.segments_sent + f.segments_dropped_out,
            f.datagrams_dropped_in,
            f.datagrams_received + f.datagrams_dropped_in
        );
    }
    common::print_marked(&endpoint);
    // Not before the sender holds the confirmation of the last round.
    if let Err(e) = link.close().await {
        eprintln!("receiver: {e}");
    }
    endpoint.wait_idle().await;
    Ok(())
}
