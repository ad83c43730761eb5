//! Runs the agreement's simulation for as many schedules as asked
//! (`gradlane_core::group::agreement::sim`): every invariant is checked
//! after each; a schedule that breaks one is printed with the command
//! that replays it.
//!
//! ```text
//! cargo run --release -p gradlane-core --example agreement_soak -- --schedules 1000000 --seed 1
//! cargo run --release -p gradlane-core --example agreement_soak -- --replay 16934472341843718990
//! ```

use clap::Parser;
use gradlane_core::group::agreement::sim::{self, Settings, Tally};
use std::process::ExitCode;
use std::time::Instant;

/// Soak the view agreement: N simulated ranks, seeded faults, every
/// invariant checked after each schedule.
#[derive(Debug, Parser)]
#[command(name = "agreement_soak")]
struct Args {
    /// How many schedules to run.
    #[arg(long, default_value_t = 100_000)]
    schedules: u64,
    /// The seed schedule `i`'s own seed comes from.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Threads to run them on (each takes its own share of the
    /// schedules; the counts do not depend on it).
    #[arg(long, default_value_t = 1)]
    threads: u64,
    /// The fewest ranks in a view.
    #[arg(long, default_value_t = 2)]
    min_ranks: usize,
    /// The most ranks in a view.
    #[arg(long, default_value_t = 16)]
    max_ranks: usize,
    /// The most faults during one agreement.
    #[arg(long, default_value_t = 4)]
    max_faults: usize,
    /// Kept for old command lines: a disagreement (two views installed for one epoch) always fails.
    #[arg(long)]
    strict: bool,
    /// Replay one schedule by its own seed, every event written out.
    #[arg(long)]
    replay: Option<u64>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let settings = Settings {
        min_ranks: args.min_ranks,
        max_ranks: args.max_ranks,
        max_faults: args.max_faults,
    };
    if let Some(seed) = args.replay {
        let report = sim::trace(seed, &settings);
        for line in &report.trace {
            println!("{line}");
        }
        for v in &report.violations {
            println!("violation: {v}");
        }
        return match report.violations.is_empty() {
            true => ExitCode::SUCCESS,
            false => ExitCode::FAILURE,
        };
    }
    let started = Instant::now();
    let threads = args.threads.max(1);
    let share = args.schedules.div_ceil(threads);
    let tally = std::thread::scope(|s| {
        let runs: Vec<_> = (0..threads)
            .map(|t| {
                let from = t * share;
                let count = share.min(args.schedules.saturating_sub(from));
                let settings = &settings;
                s.spawn(move || sim::soak(args.seed, from, count, settings))
            })
            .collect();
        let mut tally = Tally::default();
        for run in runs {
            tally.merge(run.join().expect("a soak thread panicked"));
        }
        tally
    });
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{} schedules in {secs:.1} s: {:.0} schedules/s, {:.1} events and {:.1} messages each",
        tally.schedules,
        tally.schedules as f64 / secs,
        tally.steps as f64 / tally.schedules.max(1) as f64,
        tally.messages as f64 / tally.schedules.max(1) as f64,
    );
    println!(
        "ranks deciding: {} members of the next view, {} removed, {} no quorum, {} abandoned",
        tally.members, tally.removed, tally.no_quorum, tally.abandoned
    );
    println!(
        "disagreements, two views installed for one epoch: {} schedules{}",
        tally.disagreements,
        tally
            .first_disagreement
            .map(|s| format!(" (first: seed {s}; {})", sim::replay_command(s)))
            .unwrap_or_default()
    );
    println!("schedules that broke an invariant: {}", tally.failed);
    for (seed, violation) in &tally.failures {
        println!(
            "seed {seed}: {violation}\n  replay: {}",
            sim::replay_command(*seed)
        );
    }
    let failed = tally.failed > 0 || (args.strict && tally.disagreements > 0);
    match failed {
        true => ExitCode::FAILURE,
        false => ExitCode::SUCCESS,
    }
}
