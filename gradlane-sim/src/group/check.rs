//! The invariants every schedule is checked against once it ran, and
//! what breaking each means.
//!
//! Results are checked against the plan's truth (every rank's inputs),
//! not against what the ranks said, so a keeper that returns the wrong
//! thing shows as a broken invariant, not as an agreed mistake.
//!
//! Progress is the subtle one. An agreement may rightly leave every rank
//! without a view (no quorum across a partition; members that abandon a
//! view one of them could not install; ranks removed because a peer lost
//! them), so "the survivors go on" is no invariant: no count of live,
//! connected ranks at the quiet time implies that any of them finishes.
//! What must hold instead, and is checked:
//! - no hang: when nothing is left to happen, every live rank has ended
//!   its program (done, or failed with the keeper's error, or given up
//!   rejoining after its bounded tries); none waits in an exchange, a
//!   `Done`, an agreement or a mesh for something that never comes;
//! - where nothing failed (no fault, or only slow links and freezes
//!   with no loss noticed), every rank completes its program in view 0;
//! - a bounded run: the events and the messages each link carries stay
//!   under caps that a loop would break ([`Violation::Runaway`],
//!   [`Violation::Unbounded`], [`Violation::Flooded`], found as it runs).

use super::plan::Setup;
use super::world::Left;
use crate::plan::Plan;
use crate::violation::Violation;
use crate::world::Ran;
use std::collections::BTreeMap;

/// Every invariant the group of `plan` broke, in what it left.
pub(crate) fn check(plan: &Plan<Setup>, ran: &Ran<Left>, found: &mut Vec<Violation>) {
    let ran = &ran.left;
    views(ran, found);
    results(&plan.setup, ran, found);
    if !ran.runaway {
        ends(plan, ran, found);
    }
}

/// No two ranks install different views of one epoch.
fn views(ran: &Left, found: &mut Vec<Violation>) {
    let mut seen: BTreeMap<u64, (usize, &Vec<usize>)> = BTreeMap::new();
    for install in &ran.installs {
        match seen.get(&install.epoch) {
            Some(&(rank, members)) if *members != install.members => {
                found.push(Violation::SplitViews {
                    epoch: install.epoch,
                    first: (rank, members.clone()),
                    second: (install.rank, install.members.clone()),
                });
                return;
            }
            Some(_) => {}
            None => {
                seen.insert(install.epoch, (install.rank, &install.members));
            }
        }
    }
}

/// Every result returned is the fold over a view the rank was a member
/// of, the same bits at every rank for one call, and returned only by a
/// member not removed.
fn results(setup: &Setup, ran: &Left, found: &mut Vec<Violation>) {
    let mut first: BTreeMap<u64, (usize, u64, u64)> = BTreeMap::new();
    let mut differ = false;
    for ret in &ran.returns {
        if ret.bits != setup.fold(&ret.members, ret.call) || !ret.members.contains(&ret.rank) {
            found.push(Violation::WrongResult {
                rank: ret.rank,
                call: ret.call,
                epoch: ret.epoch,
            });
        }
        if !ret.members_now.contains(&ret.rank) {
            found.push(Violation::ReturnOutsideView {
                rank: ret.rank,
                call: ret.call,
                members: ret.members_now.clone(),
            });
        }
        if ret.after_removal {
            found.push(Violation::ReturnAfterRemoval {
                rank: ret.rank,
                call: ret.call,
            });
        }
        let this = (ret.rank, ret.bits, ret.epoch);
        match first.get(&ret.call) {
            Some(&f) if f.1 != ret.bits && !differ => {
                differ = true;
                found.push(Violation::ResultsDiffer {
                    call: ret.call,
                    first: f,
                    second: this,
                });
            }
            Some(_) => {}
            None => {
                first.insert(ret.call, this);
            }
        }
    }
}

/// No hang, and a schedule where nothing failed completes every program.
fn ends(plan: &Plan<Setup>, ran: &Left, found: &mut Vec<Violation>) {
    for (rank, end) in ran.ends.iter().enumerate() {
        let ended = matches!(end.stage, "finished" | "failed" | "gave up");
        if end.alive && !ended {
            found.push(Violation::Hang {
                rank,
                stage: end.stage,
            });
        }
        if plan.benign()
            && (end.stage != "finished" || end.calls != plan.setup.calls || end.restarted)
        {
            found.push(Violation::NoProgress {
                rank,
                calls: end.calls,
                stage: end.stage,
            });
        }
    }
}
