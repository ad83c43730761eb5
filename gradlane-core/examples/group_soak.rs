//! Runs the view keeper's simulation for as many schedules as asked
//! (`gradlane_core::group::view_keeper::sim`): N simulated ranks run
//! their collectives through deaths, freezes, cuts, partitions and
//! restarts, and every invariant is checked after each schedule; a
//! schedule that breaks one is printed with the command that replays it.
//!
//! ```text
//! cargo run --release -p gradlane-core --example group_soak -- --schedules 100000 --seed 1
//! cargo run --release -p gradlane-core --example group_soak -- --replay 16934472341843718990
//! ```

use clap::Parser;
use gradlane_core::group::view_keeper::sim::{self, Settings, Tally};
use std::process::ExitCode;
use std::time::Instant;

/// Soak the view keeper: N simulated ranks running collectives, seeded
/// faults, every invariant checked after each schedule.
#[derive(Debug, Parser)]
#[command(name = "group_soak")]
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
    /// The fewest ranks in the group.
    #[arg(long, default_value_t = 2)]
    min_ranks: usize,
    /// The most ranks in the group.
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
    let per = |x: u64| x as f64 / tally.schedules.max(1) as f64;
    println!(
        "{} schedules in {secs:.1} s: {:.0} schedules/s, {:.1} events and {:.1} messages each",
        tally.schedules,
        tally.schedules as f64 / secs,
        per(tally.steps),
        per(tally.messages),
    );
    let c = &tally.counts;
    println!(
        "views installed: {}, calls returned: {}, reruns: {}, agreements: {}",
        c.views, c.returned, c.reruns, c.agreements
    );
    println!(
        "admissions: {} begun, {} ranks joined, {} failed to link up; restarts: {}, gave up: {}",
        c.admissions, c.joined, c.failed_admissions, c.restarts, c.gave_up
    );
    println!(
        "ranks killed: {}, removed: {}, out of step: {}, calls failed out of order: {}",
        c.killed, c.removed, c.out_of_step, c.fatal
    );
    println!(
        "epochs formed with different members by an admission and an agreement: {}, \
         hellos refused for them: {}",
        c.clashes, c.refused_hellos
    );
    println!("schedules that broke an invariant: {}", tally.failed);
    for (seed, violation) in &tally.failures {
        println!(
            "seed {seed}: {violation}\n  replay: {}",
            sim::replay_command(*seed)
        );
    }
    match tally.failed > 0 {
        true => ExitCode::FAILURE,
        false => ExitCode::SUCCESS,
    }
}
