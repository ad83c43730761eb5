//! A deterministic simulation of N ranks (2 to 16) agreeing on the next
//! view with the real [`Agreement`](super::Agreement) machines, over a
//! seeded model of their links. One seed, one schedule; no clock, no
//! socket, thousands of schedules a second.
//!
//! The model (`plan.rs` draws it, `world.rs` runs it):
//! - each ordered pair of ranks is a queue in order, as a QUIC stream is;
//!   each message takes a random delay, so pairs reorder against each
//!   other;
//! - the agreement begins on a failure: ranks dead and links cut before
//!   it, each rank having noticed some of it (its initial suspects) and
//!   noticing the rest later; a rank still in its collective begins when
//!   the first proposal (an alarm) or loss reaches it;
//! - until a time, faults come at random points, in the middle of the
//!   agreement too: a link cut, a partition into two sides, a rank killed
//!   (it stops), a rank frozen (what comes for it waits; its peers may
//!   lose it meanwhile). Of what was on a failed link each way, a prefix
//!   arrives; each live end notices the failure a while after it. A send
//!   on a failed link fails where the rank knows it failed, sometimes
//!   where it does not yet; otherwise its bytes are lost;
//! - a rank that decided stops reading, and may close its old links a
//!   while later (as it does once its new mesh forms);
//! - where each rank's collective stands is drawn as a real group can
//!   be: calls differ by at most one, and a rank one call on implies that
//!   every rank held the call before's result.
//!
//! After the last fault the network is quiet and the run goes on until
//! nothing is left to happen; then `check.rs` holds it against the
//! invariants ([`Violation`] says each). Two coordinators may still
//! each decide a view (a coordinator decides on what its failure
//! detector says); [`Violation::Disagreement`], a member of one view
//! installing another, is a failure like the others: a member installs
//! only a view every member accepted, and each rank accepts one. The
//! tally counts disagreements apart too, so that a flawed machine's
//! count shows.
//!
//! A failing seed replays alone: [`trace`] runs it with every event
//! written out, and [`replay_command`] says how.

mod check;
mod plan;
mod world;

#[cfg(test)]
mod tests;

use super::Outcome;
use crate::group::ViewDecision;
use crate::rng::SplitMix64;
use std::fmt;

/// What the schedules are drawn from.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The fewest ranks in a view (at least 2).
    pub min_ranks: usize,
    /// The most ranks in a view.
    pub max_ranks: usize,
    /// The most faults during one agreement (a freeze counts once, with
    /// the losses of it that come with it).
    pub max_faults: usize,
    /// A deliberate fault in every machine, to show the checks find it.
    #[cfg(test)]
    pub(crate) flaw: Option<super::Flaw>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            min_ranks: 2,
            max_ranks: 16,
            max_faults: 4,
            #[cfg(test)]
            flaw: None,
        }
    }
}

/// An invariant a schedule broke (places are the view's, from 0).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// A member of a view some rank took took another decision: that
    /// view cannot form. Known not to hold (the module's docs).
    Disagreement {
        /// The member.
        place: usize,
        /// What it took.
        took: ViewDecision,
        /// The view it is a member of.
        view: ViewDecision,
    },
    /// Two different views, each taken by every one of its members: both
    /// could form, a split brain.
    SplitViews {
        /// One view.
        first: ViewDecision,
        /// The other.
        second: ViewDecision,
    },
    /// A decision that cannot be right: another view's number, ranks
    /// outside the view, a view without a quorum, no quorum for one.
    Malformed {
        /// The place that took it.
        place: usize,
        /// The decision.
        decision: ViewDecision,
        /// What is wrong.
        why: &'static str,
    },
    /// A rank's verdict does not match the decision it took (a member
    /// not in the view, a removed rank in it).
    Verdict {
        /// The place.
        place: usize,
        /// Its outcome.
        outcome: Outcome,
    },
    /// A member cannot act on the view's outcome: `Complete` of a call
    /// whose result it lacks, `Rerun` of a call it is not in.
    Unactionable {
        /// The member's place.
        place: usize,
        /// Its call and whether it held that call's result.
        at: (u64, bool),
        /// The view.
        decision: ViewDecision,
    },
    /// A rank alive at the end took no decision though the faults had
    /// stopped and everything on its way had arrived.
    NoProgress {
        /// The place.
        place: usize,
        /// Events after the last fault.
        quiet_steps: u64,
    },
    /// More events after the last fault than the protocol can cause.
    Slow {
        /// Events after the last fault.
        quiet_steps: u64,
        /// The most it may take.
        bound: u64,
    },
    /// More messages on one ordered pair than the protocol sends (one
    /// proposal per rank lost, and the decision).
    Unbounded {
        /// The sender's place.
        from: usize,
        /// The receiver's place.
        to: usize,
        /// The most it may send.
        bound: usize,
    },
    /// A rank sent or changed its decision after it took one.
    AfterOutcome {
        /// The place.
        place: usize,
    },
}

impl Violation {
    /// Whether this is a disagreement: a member of one view installed
    /// another (counted apart in the tally, and failed).
    pub fn is_disagreement(&self) -> bool {
        matches!(self, Violation::Disagreement { .. })
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Disagreement { place, took, view } => write!(
                f,
                "disagreement: place {place} is a member of {view:?} but took {took:?}"
            ),
            Violation::SplitViews { first, second } => {
                write!(f, "split views: {first:?} and {second:?} both taken whole")
            }
            Violation::Malformed {
                place,
                decision,
                why,
            } => write!(f, "place {place} took {decision:?}: {why}"),
            Violation::Verdict { place, outcome } => {
                write!(f, "place {place}: {outcome:?} does not match its decision")
            }
            Violation::Unactionable {
                place,
                at,
                decision,
            } => write!(
                f,
                "place {place} at call {} (result held: {}) cannot act on {decision:?}",
                at.0, at.1
            ),
            Violation::NoProgress { place, quiet_steps } => write!(
                f,
                "place {place} took no decision ({quiet_steps} events after the last fault)"
            ),
            Violation::Slow { quiet_steps, bound } => write!(
                f,
                "{quiet_steps} events after the last fault, over the bound of {bound}"
            ),
            Violation::Unbounded { from, to, bound } => {
                write!(f, "place {from} sent place {to} more than {bound} messages")
            }
            Violation::AfterOutcome { place } => {
                write!(f, "place {place} sent or changed its mind after deciding")
            }
        }
    }
}

/// What one schedule did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Its seed.
    pub seed: u64,
    /// The view's size.
    pub ranks: usize,
    /// Events it took.
    pub steps: u64,
    /// Messages the ranks sent.
    pub messages: u64,
    /// Each place's outcome, where it took one.
    pub outcomes: Vec<Option<Outcome>>,
    /// The invariants it broke.
    pub violations: Vec<Violation>,
    /// Every event, where it was run by [`trace`].
    pub trace: Vec<String>,
}

impl Report {
    /// The invariants it broke.
    pub fn failures(&self) -> impl Iterator<Item = &Violation> {
        self.violations.iter()
    }

    /// Whether two of its ranks installed different views.
    pub fn disagreed(&self) -> bool {
        self.violations.iter().any(Violation::is_disagreement)
    }
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
    let mut rng = SplitMix64::new(seed);
    let plan = plan::Plan::draw(&mut rng, settings);
    let world = world::World::new(&plan, rng, traced);
    #[cfg(test)]
    let world = world.with_flaw(settings.flaw);
    let mut ran = world.run();
    if traced {
        ran.trace.insert(0, format!("{plan:?}"));
    }
    let violations = check::check(&plan, &ran);
    Report {
        seed,
        ranks: plan.n,
        steps: ran.steps,
        messages: ran.messages,
        outcomes: ran.outcomes,
        violations,
        trace: ran.trace,
    }
}

/// The seed of schedule `index` of a soak from `base`.
pub fn schedule_seed(base: u64, index: u64) -> u64 {
    SplitMix64::at(base, index)
}

/// How to run schedule `seed` alone, every event written out.
pub fn replay_command(seed: u64) -> String {
    format!("cargo run --release -p gradlane-core --example agreement_soak -- --replay {seed}")
}

/// What many schedules did.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Schedules run.
    pub schedules: u64,
    /// Events they took.
    pub steps: u64,
    /// Messages the ranks sent.
    pub messages: u64,
    /// Ranks that took a view they are members of.
    pub members: u64,
    /// Ranks that took a view without them.
    pub removed: u64,
    /// Ranks that took "no quorum".
    pub no_quorum: u64,
    /// Members that stopped because the view they accepted could not be
    /// installed by all its members.
    pub abandoned: u64,
    /// Schedules where two ranks installed different views (also failed).
    pub disagreements: u64,
    /// The seed of the first such schedule.
    pub first_disagreement: Option<u64>,
    /// Schedules that broke an invariant.
    pub failed: u64,
    /// The first few of them: their seed and what they broke.
    pub failures: Vec<(u64, Violation)>,
}

impl Tally {
    /// Adds one schedule's report.
    pub fn add(&mut self, report: &Report) {
        self.schedules += 1;
        self.steps += report.steps;
        self.messages += report.messages;
        for outcome in report.outcomes.iter().flatten() {
            match outcome {
                Outcome::Member { .. } => self.members += 1,
                Outcome::Removed { .. } => self.removed += 1,
                Outcome::NoQuorum { .. } => self.no_quorum += 1,
                Outcome::Abandoned { .. } => self.abandoned += 1,
            }
        }
        if report.disagreed() {
            self.disagreements += 1;
            self.first_disagreement.get_or_insert(report.seed);
        }
        let mut failures = report.failures().peekable();
        if failures.peek().is_some() {
            self.failed += 1;
            for v in failures {
                if self.failures.len() < 10 {
                    self.failures.push((report.seed, v.clone()));
                }
            }
        }
    }

    /// Adds another tally (a thread's).
    pub fn merge(&mut self, other: Tally) {
        self.schedules += other.schedules;
        self.steps += other.steps;
        self.messages += other.messages;
        self.members += other.members;
        self.removed += other.removed;
        self.no_quorum += other.no_quorum;
        self.abandoned += other.abandoned;
        self.disagreements += other.disagreements;
        self.first_disagreement = match (self.first_disagreement, other.first_disagreement) {
            (Some(a), _) => Some(a),
            (None, b) => b,
        };
        self.failed += other.failed;
        for f in other.failures {
            if self.failures.len() < 10 {
                self.failures.push(f);
            }
        }
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
