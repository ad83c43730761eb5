//! The invariants a schedule may break, in either mode, and what
//! breaking each means.

use gradlane_core::group::agreement::Outcome;
use gradlane_core::group::ViewDecision;
use std::fmt;

/// An invariant a schedule broke. In an agreement, ranks are places in
/// the view (from 0); in a group, ranks as they joined.
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
    SplitDecisions {
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
    Undecided {
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
    /// A rank sent or changed its decision after it took one.
    AfterOutcome {
        /// The place.
        place: usize,
    },
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
    /// More messages on one link one way than the protocol sends (a
    /// view's calls and one agreement; in an agreement alone, one
    /// proposal per rank lost and the decision).
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
            Violation::SplitDecisions { first, second } => {
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
            Violation::Undecided { place, quiet_steps } => write!(
                f,
                "place {place} took no decision ({quiet_steps} events after the last fault)"
            ),
            Violation::Slow { quiet_steps, bound } => write!(
                f,
                "{quiet_steps} events after the last fault, over the bound of {bound}"
            ),
            Violation::AfterOutcome { place } => {
                write!(f, "place {place} sent or changed its mind after deciding")
            }
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
                write!(f, "{from} sent {to} more than {bound} messages on one link")
            }
            Violation::Flooded { bound } => {
                write!(f, "more than {bound} messages on their way at once")
            }
        }
    }
}
