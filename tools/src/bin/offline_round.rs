//! The deterministic core end to end, without a network: encode rounds of a
//! model, drop a seeded fraction of the lossy datagrams (some of them arrive
//! late instead), reassemble, and print per class what was sent, received,
//! zero-filled and merged late.
//!
//! `cargo run --release --bin offline_round -- --model resnet50 --loss 0.05`

use gradlane_tools::cli as common;

use clap::Parser;
use gradlane::presets;
use gradlane_core::classify::ClassifyConfig;
use gradlane_core::encode::{Encoder, EncoderConfig};
use gradlane_core::reassembly::{Channel, Reassembler, ReassemblyConfig, Round};
use gradlane_core::rng::SplitMix64;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Encode, drop and reassemble model rounds with the gradlane core (no network)")]
struct Args {
    /// Model preset: resnet18, resnet50, vgg11 or tiny.
    #[arg(long, default_value = "resnet50")]
    model: String,
    /// Fraction of lossy datagrams dropped (seeded).
    #[arg(long, default_value_t = 0.05)]
    loss: f64,
    /// Fraction of the dropped datagrams that arrive late, after their round
    /// was delivered (merged into the next round).
    #[arg(long, default_value_t = 0.5)]
    late: f64,
    /// Rounds to run.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Share of each tensor's chunks sent lossy.
    #[arg(long, default_value_t = ClassifyConfig::default().loss_tolerance)]
    loss_tolerance: f64,
    /// Lossy levels (1..=7).
    #[arg(long, default_value_t = 3)]
    levels: u8,
    /// Datagram payload limit in bytes.
    #[arg(long, default_value_t = 1414)]
    datagram: usize,
    /// Seed for gradients and loss.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let layout = presets::by_name(&args.model).ok_or_else(|| {
        format!(
            "unknown model {:?}; try one of {:?}",
            args.model,
            presets::NAMES
        )
    })?;
    let config = EncoderConfig {
        classify: ClassifyConfig {
            loss_tolerance: args.loss_tolerance,
            levels: args.levels,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut enc = Encoder::new(&layout, config)?;
    let mut rx = Reassembler::new(layout.clone(), ReassemblyConfig::default())?;
    println!(
        "model {}: {} tensors, {} chunks, {:.1} MB per round; loss {:.1}%, {:.0}% of lost datagrams arrive late",
        args.model,
        layout.len(),
        enc.plan().len(),
        layout.total_bytes() as f64 / 1e6,
        args.loss * 100.0,
        args.late * 100.0
    );
    let mut rng = SplitMix64::new(args.seed);
    let mut late: Vec<bytes::Bytes> = Vec::new();
    for r in 0..args.rounds {
        let grads = common::grads(&layout, args.seed.wrapping_add(r as u64));
        let t0 = Instant::now();
        let out = enc.encode(r, &grads, args.datagram)?;
        let t_enc = t0.elapsed();
        // Late datagrams of the previous round arrive first, then this round.
        for d in late.drain(..) {
            rx.push(&d, Channel::Lossy)?;
        }
        let t1 = Instant::now();
        rx.push(&out.reliable, Channel::Reliable)?;
        let mut dropped = vec![0u64; args.levels as usize];
        for (l, datagrams) in out.lossy.iter().enumerate() {
            for d in datagrams {
                if rng.next_f64() >= args.loss {
                    rx.push(d, Channel::Lossy)?;
                    continue;
                }
                dropped[l] += 1;
                if rng.next_f64() < args.late {
                    late.push(d.clone());
                }
            }
        }
        let round = rx.deliver(r)?;
        let t_rx = t1.elapsed();
        print_round(&round, &dropped, t_enc.as_secs_f64(), t_rx.as_secs_f64());
        // Buffers go back for the next round, as a training loop would do.
        enc.recycle(out);
        let _ = rx.recycle(round.tensors);
    }
    Ok(())
}

fn print_round(round: &Round, dropped: &[u64], enc_s: f64, rx_s: f64) {
    let s = &round.stats;
    println!(
        "\nround {}  (encode {:.1} ms, reassemble {:.1} ms)",
        round.index,
        enc_s * 1e3,
        rx_s * 1e3
    );
    println!(
        "| class     | chunks sent | MB sent | packets | dropped | MB received | MB zero-filled | MB late-merged |"
    );
    println!("|-----------|------------:|--------:|--------:|--------:|------------:|---------------:|---------------:|");
    for c in 0..=s.levels as usize {
        let k = &s.classes[c];
        let name = if c == 0 {
            "important".to_string()
        } else {
            format!("level {c}")
        };
        let drop = if c == 0 { 0 } else { dropped[c - 1] };
        println!(
            "| {name:<9} | {:>11} | {:>7.2} | {:>7} | {:>7} | {:>11.2} | {:>14.3} | {:>14.3} |",
            k.sent_chunks,
            k.sent_bytes as f64 / 1e6,
            k.sent_packets,
            drop,
            k.received_bytes as f64 / 1e6,
            k.zero_filled_bytes as f64 / 1e6,
            k.late_merged_bytes as f64 / 1e6,
        );
    }
}
