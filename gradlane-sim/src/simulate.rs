//! One schedule drawn, run and checked, in either mode.

use crate::plan::Plan;
use crate::report::Report;
use crate::settings::{Mode, Settings};
use crate::violation::Violation;
use crate::world::Ran;
use crate::{agreement, group};
use gradlane_core::rng::SplitMix64;
use std::fmt::Debug;

/// Runs the schedule of `seed`.
pub fn run(seed: u64, settings: &Settings) -> Report {
    simulate(seed, settings, false)
}

/// Runs the schedule of `seed`, writing down every event.
pub fn trace(seed: u64, settings: &Settings) -> Report {
    simulate(seed, settings, true)
}

fn simulate(seed: u64, settings: &Settings, traced: bool) -> Report {
    match settings.mode {
        Mode::Agreement => {
            let part: Part<_, _> = (agreement::draw, agreement::run, agreement::check);
            schedule(seed, settings, traced, part)
        }
        Mode::Group => {
            let part: Part<_, _> = (group::draw, group::run, group::check);
            schedule(seed, settings, traced, part)
        }
    }
}

/// How a mode draws a schedule, runs it and checks what it left.
type Part<S, L> = (
    fn(u64, &mut SplitMix64, &Settings) -> Plan<S>,
    fn(&Plan<S>, SplitMix64, bool, &Settings) -> Ran<L>,
    fn(&Plan<S>, &Ran<L>, &mut Vec<Violation>),
);

/// The schedule of `seed` in the mode of `part`: drawn, run (`traced`,
/// every event written down), then held against every invariant, what
/// was found while it ran first, then what the mode's checks find in what
/// it left.
fn schedule<S: Debug, L>(
    seed: u64,
    settings: &Settings,
    traced: bool,
    (draw, run, check): Part<S, L>,
) -> Report {
    let mut rng = SplitMix64::new(seed);
    let plan = draw(seed, &mut rng, settings);
    let mut ran = run(&plan, rng, traced, settings);
    let mut found = std::mem::take(&mut ran.report.violations);
    check(&plan, &ran, &mut found);
    ran.report.violations = found;
    if traced {
        ran.report.trace.insert(0, format!("{plan:?}"));
    }
    ran.report
}
