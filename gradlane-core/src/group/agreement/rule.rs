//! The coordinator's rule: from the proposals of every rank it has not
//! lost, who is in the next view and what becomes of the collective in
//! flight. Pure: the same inputs give the same decision on any rank.

use super::Seat;
use crate::group::{ViewDecision, ViewOutcome, ViewProposal};
use std::collections::{BTreeMap, BTreeSet};

/// A coordinator's decision, with the places it leaves out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The decision to send.
    pub decision: ViewDecision,
    /// The places of the last view that are not in it: the ranks the
    /// coordinator or any proposal lost, and those that lost the
    /// coordinator. They hear the decision too, where they still can.
    pub left_out: BTreeSet<usize>,
}

/// Whether the places `alive` (increasing) are a quorum of a view of
/// `size`: more than half of it, or exactly half with its place 0. Two
/// quorums of one view always share a rank, so two sides of a partition
/// never both go on.
pub fn is_quorum(alive: &[usize], size: usize) -> bool {
    2 * alive.len() > size || (2 * alive.len() == size && alive.first() == Some(&0))
}

/// What becomes of the collective in flight, from where each member
/// stands (the collective it is in, and whether it holds its result):
/// the coordinator's `own` and the `others`.
///
/// The first call any member is in counts as done (`Complete`) only if
/// every member holds its result or is past it: a member one collective
/// on returned the first, which it could do only once every rank held
/// its result. Otherwise it runs again among the members (`Rerun`).
pub fn outcome(own: (u64, bool), others: impl IntoIterator<Item = (u64, bool)>) -> ViewOutcome {
    let at: Vec<(u64, bool)> = std::iter::once(own).chain(others).collect();
    let first = at.iter().map(|a| a.0).min().unwrap_or(own.0);
    match at.iter().all(|&(call, held)| call > first || held) {
        true => ViewOutcome::Complete { call: first },
        false => ViewOutcome::Rerun { call: first },
    }
}

/// The coordinator's decision on view `seat.epoch()` from the places it
/// has lost (`suspects`) and the latest proposal of each other rank: a
/// rank any survivor lost is left out (the new mesh needs every pair),
/// as is a rank that lost the coordinator; without a quorum of the last
/// view the decision is [`ViewOutcome::NoQuorum`], naming the ranks that
/// were left.
pub fn decide(
    seat: &Seat,
    suspects: &BTreeSet<usize>,
    proposals: &BTreeMap<usize, ViewProposal>,
) -> Decided {
    decide_with(seat, suspects, proposals, true)
}

/// [`decide`], with the quorum rule or (for the simulation's test of
/// itself) without it.
pub(super) fn decide_with(
    seat: &Seat,
    suspects: &BTreeSet<usize>,
    proposals: &BTreeMap<usize, ViewProposal>,
    need_quorum: bool,
) -> Decided {
    let (me, n) = (seat.place(), seat.size());
    let mut left_out = suspects.clone();
    // Only the proposals of ranks this one has not lost itself count:
    // what a rank it cannot reach says may be stale.
    for (&p, prop) in proposals.iter().filter(|(p, _)| !suspects.contains(p)) {
        for &s in &prop.suspects {
            match seat.place_of(s) {
                Some(s) if s == me => left_out.insert(p),
                Some(s) => left_out.insert(s),
                None => false,
            };
        }
    }
    let alive: Vec<usize> = (0..n).filter(|p| !left_out.contains(p)).collect();
    let members: Vec<usize> = alive.iter().map(|&p| seat.members()[p]).collect();
    let epoch = seat.epoch();
    if need_quorum && !is_quorum(&alive, n) {
        let decision = ViewDecision {
            epoch,
            outcome: ViewOutcome::NoQuorum,
            members,
        };
        return Decided { decision, left_out };
    }
    let others = alive
        .iter()
        .filter_map(|p| proposals.get(p))
        .map(|prop| (prop.call, prop.has_result));
    let decision = ViewDecision {
        epoch,
        outcome: outcome((seat.call(), seat.has_result()), others),
        members,
    };
    Decided { decision, left_out }
}
