//! Runs the control plane's simulation (`gradlane_sim`) for as many
//! schedules as asked, in either mode: the view agreement alone, or the
//! whole group running collectives through deaths, freezes, cuts,
//! partitions and restarts. Every invariant is checked after each
//! schedule; one that breaks one is printed with the command that
//! replays it.
//!
//! ```text
//! cargo run --release -p gradlane-sim --example soak -- --mode agreement --schedules 1000000
//! cargo run --release -p gradlane-sim --example soak -- --mode group --threads 4
//! cargo run --release -p gradlane-sim --example soak -- --mode group --replay 16934472341843718990
//! ```

use clap::{Parser, ValueEnum};
use gradlane_sim::{replay_command, soak_threads, summary, trace, Mode, Settings};
use std::process::ExitCode;
use std::time::Instant;

/// Which part of the control plane to soak.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum ModeArg {
    /// The survivors' agreement on the next view, alone.
    Agreement,
    /// The whole group: collectives, agreements, meshes, admissions.
    Group,
}

/// Soak the control plane: N simulated ranks, seeded faults, every
/// invariant checked after each schedule.
#[derive(Debug, Parser)]
#[command(name = "soak")]
struct Args {
    /// Which part of the control plane runs.
    #[arg(long, value_enum, default_value_t = ModeArg::Group)]
    mode: ModeArg,
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
    /// The fewest ranks.
    #[arg(long, default_value_t = 2)]
    min_ranks: usize,
    /// The most ranks.
    #[arg(long, default_value_t = 16)]
    max_ranks: usize,
    /// The most faults in one schedule.
    #[arg(long, default_value_t = 4)]
    max_faults: usize,
    /// Replay one schedule by its own seed, every event written out.
    #[arg(long)]
    replay: Option<u64>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mode = match args.mode {
        ModeArg::Agreement => Mode::Agreement,
        ModeArg::Group => Mode::Group,
    };
    let settings = Settings {
        min_ranks: args.min_ranks,
        max_ranks: args.max_ranks,
        max_faults: args.max_faults,
        ..Settings::new(mode)
    };
    if let Some(seed) = args.replay {
        let report = trace(seed, &settings);
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
    let tally = soak_threads(args.seed, args.schedules, args.threads, &settings);
    let secs = started.elapsed().as_secs_f64();
    println!("{mode}: {}", summary(mode, &tally, secs));
    if let Some(seed) = tally.first_disagreement {
        println!("first disagreement: {}", replay_command(mode, seed));
    }
    for (seed, violation) in &tally.failures {
        println!(
            "seed {seed}: {violation}\n  replay: {}",
            replay_command(mode, *seed)
        );
    }
    match tally.failed > 0 {
        true => ExitCode::FAILURE,
        false => ExitCode::SUCCESS,
    }
}
