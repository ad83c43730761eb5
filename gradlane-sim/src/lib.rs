//! The deterministic simulator of gradlane's control plane: N ranks (2 to
//! 16) with the real machines of `gradlane-core`, over a seeded model of
//! their links, with the faults a group meets. One seed, one schedule; no
//! clock, no socket, thousands of schedules a second, each checked
//! against the invariants ([`Violation`] says each) once it ran.
//!
//! It runs in one of two [`Mode`]s, in one world (`world.rs`: events in
//! simulated time, links as queues in order each way, failures noticed a
//! while after they happen), from one kind of schedule (`plan.rs`: the
//! faults by time, how fast the network and the failure detector are):
//! - [`Mode::Agreement`]: the survivors of a view that lost a rank agree
//!   on the next with the real `Agreement`s. The failure that began it
//!   (ranks dead, links cut) is noticed by some ranks first; a rank still
//!   in its collective begins when the first proposal or loss reaches it;
//!   where each rank's collective stands is drawn as a real group can be.
//!   Faults come in the middle of it: a link cut, a partition, a rank
//!   killed or frozen. Of what was on a failed link, a prefix arrives; a
//!   send on one fails where the rank knows it failed, sometimes where it
//!   does not yet. A rank that decided may close its old links a while
//!   later. Two coordinators may each decide a view; a member of one view
//!   installing another ([`Violation::Disagreement`]) fails, and the
//!   tally counts it apart too, so that a flawed machine's count shows.
//! - [`Mode::Group`]: every rank runs C collectives (2 to 5) with the
//!   real `ViewKeeper`s, calling `admit` after each one it returns, as a
//!   training step's boundary does; a call's result is a fold over the
//!   view's members and their inputs, so equal bits mean the same members
//!   and call. A rank reads, in an exchange or its `Done`, the one message
//!   due from each member, as the shell does; a failed exchange starts an
//!   agreement; a decided view's mesh forms with the core's `MeshForming`
//!   (hellos judged by epoch and `view_digest`); a killed or removed rank
//!   may come back as a fresh process, ask a contact, wait to be named in
//!   a `Done`, be admitted and run the calls left. Faults: kills
//!   (restarted or not), freezes, cuts, partitions that heal, slow links.
//!
//! After the last fault the network is quiet and the run goes on until
//! nothing is left to happen. A failing seed replays alone: [`trace`]
//! runs it with every event written out, and [`replay_command`] says how.
//! The soak example runs either mode for as many schedules as asked.

mod agreement;
mod group;
mod plan;
mod soak;
mod violation;
mod world;

#[cfg(test)]
mod tests;

pub use soak::{soak, soak_threads, summary, Counts, Tally};
pub use violation::Violation;

use gradlane_core::rng::SplitMix64;
use plan::{Plan, Setup};
use std::fmt;

/// Which part of the control plane a schedule runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The survivors' agreement on the next view, alone.
    Agreement,
    /// The whole group: collectives, agreements, meshes, admissions.
    Group,
}

impl Mode {
    /// Its name on a command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Agreement => "agreement",
            Mode::Group => "group",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the schedules are drawn from.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Which part of the control plane runs.
    pub mode: Mode,
    /// The fewest ranks (at least 2).
    pub min_ranks: usize,
    /// The most ranks (in a group, at most the core's `MAX_WORLD`).
    pub max_ranks: usize,
    /// The most faults in one schedule (a freeze counts once, with the
    /// losses of it that come with it).
    pub max_faults: usize,
    /// A deliberate fault in every machine, to show the checks find it.
    #[cfg(test)]
    pub(crate) flaw: Option<gradlane_core::group::view_keeper::KeeperFlaw>,
}

impl Settings {
    /// The settings the soak and the tests start from, in `mode`.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            min_ranks: 2,
            max_ranks: 16,
            max_faults: 4,
            #[cfg(test)]
            flaw: None,
        }
    }
}

/// The agreement's flaw in a keeper's flaw, if it is one.
#[cfg(test)]
fn agreement_flaw(
    flaw: gradlane_core::group::view_keeper::KeeperFlaw,
) -> Option<gradlane_core::group::agreement::Flaw> {
    match flaw {
        gradlane_core::group::view_keeper::KeeperFlaw::Agreement(f) => Some(f),
        _ => None,
    }
}

/// What one schedule did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Its seed.
    pub seed: u64,
    /// Its mode.
    pub mode: Mode,
    /// The view's or the group's size.
    pub ranks: usize,
    /// Calls in each program (0 in an agreement alone).
    pub calls: u64,
    /// Events it took.
    pub steps: u64,
    /// Messages sent on links.
    pub messages: u64,
    /// What the ranks did.
    pub counts: Counts,
    /// The invariants it broke.
    pub violations: Vec<Violation>,
    /// Every event, where it was run by [`trace`].
    pub trace: Vec<String>,
}

impl Report {
    /// Whether two of its ranks installed different views.
    pub fn disagreed(&self) -> bool {
        self.violations.iter().any(Violation::is_disagreement)
    }
}

/// What a run left: its report so far (the violations in it those found
/// while it ran), and what the mode's checks read.
pub(crate) struct Ran<'p> {
    /// What it did.
    pub report: Report,
    /// Events taken after the last fault.
    pub quiet_steps: u64,
    /// What the mode's checks read.
    pub left: Left<'p>,
}

/// What a mode's run left for its checks.
pub(crate) enum Left<'p> {
    /// An agreement's outcomes.
    Agreement(agreement::Left<'p>),
    /// A group's views, results and ends.
    Group(group::Left<'p>),
}

/// Every invariant `ran` broke: what was found while it ran, then what
/// its mode's checks find in what it left.
fn check(plan: &Plan, ran: &Ran) -> Vec<Violation> {
    let mut found = ran.report.violations.clone();
    match &ran.left {
        Left::Agreement(left) => agreement::check(left, ran.quiet_steps, &mut found),
        Left::Group(left) => group::check(plan, left, &mut found),
    }
    found
}

/// Runs the schedule of `seed`.
pub fn run(seed: u64, settings: &Settings) -> Report {
    simulate(seed, settings, false)
}

/// Runs the schedule of `seed`, writing down every event.
pub fn trace(seed: u64, settings: &Settings) -> Report {
    simulate(seed, settings, true)
}

fn simulate(seed: u64, settings: &Settings, traced: bool) -> Report {
    let (plan, rng) = Plan::draw(seed, settings);
    let mut ran = match &plan.setup {
        Setup::Agreement(setup) => agreement::run(&plan, setup, rng, traced, settings),
        Setup::Group(setup) => group::run(&plan, setup, rng, traced, settings),
    };
    ran.report.violations = check(&plan, &ran);
    if let Left::Group(left) = &ran.left {
        ran.report.counts.clashes = group::clashes(left);
    }
    if traced {
        ran.report.trace.insert(0, format!("{plan:?}"));
    }
    ran.report
}

/// The seed of schedule `index` of a soak from `base`.
pub fn schedule_seed(base: u64, index: u64) -> u64 {
    SplitMix64::at(base, index)
}

/// How to run schedule `seed` of `mode` alone, every event written out.
pub fn replay_command(mode: Mode, seed: u64) -> String {
    format!("cargo run --release -p gradlane-sim --example soak -- --mode {mode} --replay {seed}")
}
