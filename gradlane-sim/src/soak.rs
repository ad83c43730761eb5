//! Many schedules: what their ranks did counted, what they broke kept,
//! over threads, and said in one line.

use crate::report::{Counts, Report};
use crate::settings::{Mode, Settings};
use crate::simulate::run;
use crate::violation::Violation;
use gradlane_core::rng::SplitMix64;

/// What many schedules did.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Schedules run.
    pub schedules: u64,
    /// Events they took.
    pub steps: u64,
    /// Messages sent on links.
    pub messages: u64,
    /// What the ranks did.
    pub counts: Counts,
    /// Schedules where two ranks installed different views (also failed).
    pub disagreements: u64,
    /// The seed of the first such schedule.
    pub first_disagreement: Option<u64>,
    /// Schedules that broke an invariant.
    pub failed: u64,
    /// The first few of them: their seed and what they broke.
    pub failures: Vec<(u64, Violation)>,
}

/// How many failures a tally keeps.
const KEPT: usize = 10;

impl Tally {
    /// Adds one schedule's report.
    pub fn add(&mut self, report: &Report) {
        self.schedules += 1;
        self.steps += report.steps;
        self.messages += report.messages;
        self.counts.add(&report.counts);
        if report.disagreed() {
            self.disagreements += 1;
            self.first_disagreement.get_or_insert(report.seed);
        }
        if !report.violations.is_empty() {
            self.failed += 1;
            let room = KEPT.saturating_sub(self.failures.len());
            let seed = report.seed;
            let found = report.violations.iter().take(room);
            self.failures.extend(found.map(|v| (seed, v.clone())));
        }
    }

    /// Adds another tally (a thread's, of later schedules).
    pub fn merge(&mut self, other: Tally) {
        self.schedules += other.schedules;
        self.steps += other.steps;
        self.messages += other.messages;
        self.counts.add(&other.counts);
        self.disagreements += other.disagreements;
        self.first_disagreement = self.first_disagreement.or(other.first_disagreement);
        self.failed += other.failed;
        let room = KEPT.saturating_sub(self.failures.len());
        self.failures.extend(other.failures.into_iter().take(room));
    }
}

/// Runs `count` schedules from `base` (schedule `i` has seed
/// [`schedule_seed`]`(base, i)`), `from` on.
pub fn soak(base: u64, from: u64, count: u64, settings: &Settings) -> Tally {
    let mut tally = Tally::default();
    for i in from..from + count {
        tally.add(&run(schedule_seed(base, i), settings));
    }
    tally
}

/// Runs schedules 0 to `count` from `base` on `threads` threads, each
/// its own share in order: the tally does not depend on how many.
pub fn soak_threads(base: u64, count: u64, threads: u64, settings: &Settings) -> Tally {
    let threads = threads.max(1);
    let share = count.div_ceil(threads);
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..threads)
            .map(|t| {
                let from = t * share;
                let count = share.min(count.saturating_sub(from));
                s.spawn(move || soak(base, from, count, settings))
            })
            .collect();
        let mut tally = Tally::default();
        for run in runs {
            // A thread that panicked ran a machine that panicked: the
            // same panic here, where its schedules are counted.
            match run.join() {
                Ok(t) => tally.merge(t),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        tally
    })
}

/// What `tally` of `mode` did in `secs` seconds, in one line: how many
/// schedules, how fast, and what their ranks did.
pub fn summary(mode: Mode, tally: &Tally, secs: f64) -> String {
    let c = &tally.counts;
    let per = |x: u64| x as f64 / tally.schedules.max(1) as f64;
    let head = format!(
        "{} schedules in {secs:.1} s ({:.0} schedules/s, {:.1} events and {:.1} messages each)",
        tally.schedules,
        tally.schedules as f64 / secs.max(1e-9),
        per(tally.steps),
        per(tally.messages),
    );
    let what = match mode {
        Mode::Agreement => format!(
            "{} members, {} removed, {} no quorum; {} abandoned; {} schedules with two views \
             installed for one epoch (first: seed {:?})",
            c.members,
            c.left_out,
            c.no_quorum,
            c.abandoned,
            tally.disagreements,
            tally.first_disagreement,
        ),
        Mode::Group => format!(
            "{} views installed, {} calls returned, {} reruns, {} agreements, {} admissions \
             ({} ranks joined, {} failed to link up), {} removed, {} out of step, {} killed, \
             {} restarts, {} gave up; {} epochs formed with different members, {} hellos refused",
            c.views,
            c.returned,
            c.reruns,
            c.agreements,
            c.admissions,
            c.joined,
            c.failed_admissions,
            c.removed,
            c.out_of_step,
            c.killed,
            c.restarts,
            c.gave_up,
            c.clashes,
            c.refused_hellos,
        ),
    };
    format!(
        "{head}: {what}; {} schedules broke an invariant",
        tally.failed
    )
}

/// The seed of schedule `index` of a soak from `base`.
pub fn schedule_seed(base: u64, index: u64) -> u64 {
    SplitMix64::at(base, index)
}

/// How to run schedule `seed` of `mode` alone, every event written out.
pub fn replay_command(mode: Mode, seed: u64) -> String {
    format!("cargo run --release -p gradlane-sim --example soak -- --mode {mode} --replay {seed}")
}
