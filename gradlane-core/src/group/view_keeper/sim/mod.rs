//! A deterministic simulation of N ranks (2 to 16) running a program of
//! collectives with the real [`ViewKeeper`](super::ViewKeeper)s (and the
//! [`Agreement`](crate::group::agreement::Agreement)s they start), over a
//! seeded model of their links, with deaths, freezes, cuts, partitions
//! and restarts. One seed, one schedule; no clock, no socket.
//!
//! The model (`plan.rs` draws it, `world/` runs it: links, faults and
//! restarts, each rank's program and keeper, meshes):
//! - every rank runs C collectives (2 to 5), calling `admit` after each
//!   one it returns, as a training step's boundary does; rank `r`'s input
//!   to call `c` is a mixed hash, and a call's result in a view is a fold
//!   over the view's members and their inputs, so equal bits mean the
//!   same members and call;
//! - each view's mesh has one link per pair of its members, a queue in
//!   order each way (a QUIC stream) with a random delay per message, so
//!   pairs reorder against each other. A rank reads, in an exchange or
//!   its `Done`, the one message due from each member it waits for, as
//!   the shell does: a proposal there is an alarm
//!   ([`Failure::Alarm`](super::Failure::Alarm)), another message is out
//!   of step ([`Failure::Fatal`](super::Failure::Fatal)), a failed link
//!   with nothing left on it is [`Failure::Lost`](super::Failure::Lost)
//!   or, closed saying so, [`Failure::Removed`](super::Failure::Removed);
//!   the other failures it saw are noted (`note_lost`, `note_alarm`). In
//!   an agreement it reads everything and keeps only that view's
//!   proposals and decisions;
//! - a mesh forms with the core's
//!   [`MeshForming`](crate::group::MeshForming), as the shell's does: a
//!   member dials the lower members it says (again while the path is
//!   blocked or the peer does not form a mesh yet, within the wait), and
//!   the dialled rank's machine judges the hello (its view's epoch and
//!   [`view_digest`](crate::group::view_digest)): taken, the pair is
//!   linked; another epoch's, dropped; the same epoch with other members
//!   (an admission and an agreement that overlapped), refused, and the
//!   refusing rank stops. Each rank waits a bound for the rest, then
//!   reports those it did not link to, and closes its old links (saying
//!   "removed" to the ranks the view leaves out);
//! - a killed rank may come back as a fresh process (so may one its
//!   keeper removed, or whose admission failed): it asks a contact, which
//!   keeps it waiting ([`screen`](crate::group::admission::screen)) and
//!   names it in its `Done`; after that call the members admit it, the
//!   contact tells it the view, and it forms the mesh, which must be whole
//!   for it (else it fails, and may start again), then runs the calls
//!   left of its program;
//! - until a time, faults come at random points (during agreements, mesh
//!   forming and admissions too): a rank killed, frozen (its peers may
//!   lose it meanwhile), a link cut (a prefix of what was on it arrives),
//!   a partition (healed later, or at the quiet time), a slow link. Each
//!   live end notices a failed link a while after. After the last fault
//!   the network is healthy and the run goes on until nothing is left.
//!
//! Then `check.rs` holds the run against the invariants ([`Violation`]
//! says each). A failing seed replays alone: [`trace`] writes out every
//! event, and [`replay_command`] says how.

mod check;
mod plan;
mod world;

#[cfg(test)]
mod tests;

use crate::rng::SplitMix64;
use std::fmt;

/// What the schedules are drawn from.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The fewest ranks in the group (at least 2).
    pub min_ranks: usize,
    /// The most ranks in the group (at most 16 are drawn).
    pub max_ranks: usize,
    /// The most faults in one schedule (a freeze counts once, with the
    /// losses of it that come with it).
    pub max_faults: usize,
    /// A deliberate fault in every keeper, to show the checks find it.
    #[cfg(test)]
    pub(crate) flaw: Option<super::KeeperFlaw>,
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

/// An invariant a schedule broke (ranks as they joined).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// Two ranks installed different views of one epoch (a mesh whole,
    /// or an admission).
    SplitViews {
        /// The view's number.
        epoch: u64,
        /// One rank and the members it installed.
        first: (usize, Vec<usize>),
        /// Another, and its members.
        second: (usize, Vec<usize>),
    },
    /// Two ranks returned different results of one call.
    ResultsDiffer {
        /// The call.
        call: u64,
        /// One rank, its bits, and the view they were computed in.
        first: (usize, u64, u64),
        /// Another.
        second: (usize, u64, u64),
    },
    /// A rank returned bits that are not the fold over the members of a
    /// view it was a member of.
    WrongResult {
        /// The rank.
        rank: usize,
        /// The call.
        call: u64,
        /// The view the exchange ran in.
        epoch: u64,
    },
    /// A rank returned a call after its keeper removed it.
    ReturnAfterRemoval {
        /// The rank.
        rank: usize,
        /// The call.
        call: u64,
    },
    /// A rank returned a call in a view it is not a member of.
    ReturnOutsideView {
        /// The rank.
        rank: usize,
        /// The call.
        call: u64,
        /// The view's members.
        members: Vec<usize>,
    },
    /// A keeper said return where the rank held no result of that call.
    NoResult {
        /// The rank.
        rank: usize,
        /// The call.
        call: u64,
    },
    /// A live rank waits at the end with nothing left to happen: neither
    /// done with its program, nor failed, nor given up rejoining.
    Hang {
        /// The rank.
        rank: usize,
        /// Where it waits.
        stage: &'static str,
    },
    /// A schedule where nothing failed (no fault, or only slow links and
    /// short freezes) left a rank short of its program.
    NoProgress {
        /// The rank.
        rank: usize,
        /// Calls its keeper began.
        calls: u64,
        /// Where it ended.
        stage: &'static str,
    },
    /// More events than the protocol can cause: a loop.
    Runaway {
        /// Events taken.
        steps: u64,
        /// The most it may take.
        bound: u64,
    },
    /// More messages on one link one way than a view's calls and one
    /// agreement send.
    Unbounded {
        /// The sender.
        from: usize,
        /// The receiver.
        to: usize,
        /// The most it may send.
        bound: usize,
    },
    /// More messages on their way at once than the bound.
    Flooded {
        /// The bound.
        bound: usize,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::SplitViews {
                epoch,
                first,
                second,
            } => write!(
                f,
                "split views: rank {} installed view {epoch} as {:?}, rank {} as {:?}",
                first.0, first.1, second.0, second.1
            ),
            Violation::ResultsDiffer {
                call,
                first,
                second,
            } => write!(
                f,
                "call {call}: rank {} returned {:#x} (view {}), rank {} returned {:#x} (view {})",
                first.0, first.1, first.2, second.0, second.1, second.2
            ),
            Violation::WrongResult { rank, call, epoch } => write!(
                f,
                "rank {rank} returned call {call} with bits not of view {epoch}'s members"
            ),
            Violation::ReturnAfterRemoval { rank, call } => {
                write!(f, "rank {rank} returned call {call} after it was removed")
            }
            Violation::ReturnOutsideView {
                rank,
                call,
                members,
            } => write!(
                f,
                "rank {rank} returned call {call} in a view of {members:?} without it"
            ),
            Violation::NoResult { rank, call } => {
                write!(
                    f,
                    "rank {rank} was told to return call {call} without its result"
                )
            }
            Violation::Hang { rank, stage } => {
                write!(
                    f,
                    "rank {rank} hangs in its {stage} with nothing left to happen"
                )
            }
            Violation::NoProgress { rank, calls, stage } => write!(
                f,
                "nothing failed, yet rank {rank} ended {stage} after {calls} calls"
            ),
            Violation::Runaway { steps, bound } => {
                write!(f, "{steps} events, over the bound of {bound}")
            }
            Violation::Unbounded { from, to, bound } => {
                write!(
                    f,
                    "rank {from} sent rank {to} more than {bound} messages on one link"
                )
            }
            Violation::Flooded { bound } => {
                write!(f, "more than {bound} messages on their way at once")
            }
        }
    }
}

/// What the ranks of a schedule (or many) did, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Views installed (a mesh whole at a rank, its admission included),
    /// after view 0.
    pub views: u64,
    /// Calls returned.
    pub returned: u64,
    /// Exchanges run again among a new view.
    pub reruns: u64,
    /// Agreements begun.
    pub agreements: u64,
    /// Admissions begun by members.
    pub admissions: u64,
    /// Ranks admitted: a rejoining rank whose new mesh was whole.
    pub joined: u64,
    /// Rejoining ranks whose mesh was not whole.
    pub failed_admissions: u64,
    /// Keepers that failed removed (or without a quorum).
    pub removed: u64,
    /// Keepers that failed out of step.
    pub out_of_step: u64,
    /// Calls failed on a message out of its order.
    pub fatal: u64,
    /// Ranks killed.
    pub killed: u64,
    /// Fresh processes started to rejoin.
    pub restarts: u64,
    /// Rejoining ranks that gave up.
    pub gave_up: u64,
    /// Epochs for which ranks formed meshes of different members (an
    /// admission and an agreement that overlapped; neither mesh whole).
    pub clashes: u64,
    /// Hellos a rank forming a mesh refused (the same epoch with other
    /// members): it stopped, as the shell's does.
    pub refused_hellos: u64,
}

impl Counts {
    /// Adds `other`.
    pub fn add(&mut self, other: &Counts) {
        self.views += other.views;
        self.returned += other.returned;
        self.reruns += other.reruns;
        self.agreements += other.agreements;
        self.admissions += other.admissions;
        self.joined += other.joined;
        self.failed_admissions += other.failed_admissions;
        self.removed += other.removed;
        self.out_of_step += other.out_of_step;
        self.fatal += other.fatal;
        self.killed += other.killed;
        self.restarts += other.restarts;
        self.gave_up += other.gave_up;
        self.clashes += other.clashes;
        self.refused_hellos += other.refused_hellos;
    }
}

/// What one schedule did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Its seed.
    pub seed: u64,
    /// The group's size.
    pub ranks: usize,
    /// Calls in each program.
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
    ran.counts.clashes = check::clashes(&ran);
    Report {
        seed,
        ranks: plan.n,
        calls: plan.calls,
        steps: ran.steps,
        messages: ran.messages,
        counts: ran.counts,
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
    format!("cargo run --release -p gradlane-core --example group_soak -- --replay {seed}")
}

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
        self.counts.add(&report.counts);
        if !report.violations.is_empty() {
            self.failed += 1;
            for v in &report.violations {
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
        self.counts.add(&other.counts);
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
