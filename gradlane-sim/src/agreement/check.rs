//! The invariants every schedule is checked against once it ran, and
//! what breaking each means.
//!
//! Where each rank stands is the plan's truth, not what it proposed, and
//! the quorum is counted here again, so that a fault in the machine or
//! in its rule shows as a broken invariant, not as an agreed mistake.

use super::plan::Setup;
use super::world::Left;
use crate::plan::Plan;
use crate::violation::Violation;
use crate::world::Ran;
use gradlane_core::group::agreement::Outcome;
use gradlane_core::group::{ViewDecision, ViewOutcome};

/// Every invariant the agreement of `plan` broke, in what it left.
pub(crate) fn check(plan: &Plan<Setup>, ran: &Ran<Left>, found: &mut Vec<Violation>) {
    let (plan, quiet_steps, ran) = (&plan.setup, ran.quiet_steps, &ran.left);
    progress(ran, quiet_steps, found);
    let mut views: Vec<&ViewDecision> = Vec::new();
    for (place, outcome) in ran.outcomes.iter().enumerate() {
        let Some(outcome) = outcome else { continue };
        if let Outcome::Abandoned { decision, .. } = outcome {
            // It stopped: it installed nothing, but what it accepted
            // must still be a member's view.
            if !decision.members.contains(&plan.members[place]) {
                found.push(Violation::Verdict {
                    place,
                    outcome: outcome.clone(),
                });
            }
            continue;
        }
        let decision = outcome.decision();
        if let Some(why) = malformed(plan, decision) {
            found.push(Violation::Malformed {
                place,
                decision: decision.clone(),
                why,
            });
        }
        if !verdict_holds(plan, place, outcome) {
            found.push(Violation::Verdict {
                place,
                outcome: outcome.clone(),
            });
        }
        if decision.outcome != ViewOutcome::NoQuorum && !views.contains(&decision) {
            views.push(decision);
        }
    }
    for view in &views {
        actionable(plan, view, found);
    }
    agreement(plan, ran, &views, found);
}

/// Progress: once the faults stopped and everything on its way arrived,
/// every rank still alive took a decision, within a bounded number of
/// events (each pair carries at most `n` messages, so a run that takes
/// more is going round in circles).
fn progress(ran: &Left, quiet_steps: u64, found: &mut Vec<Violation>) {
    let n = ran.dead.len() as u64;
    let bound = 2 * n * n * n + 64;
    for (place, dead) in ran.dead.iter().enumerate() {
        if !dead && ran.outcomes[place].is_none() {
            found.push(Violation::Undecided { place, quiet_steps });
        }
    }
    if quiet_steps > bound {
        found.push(Violation::Slow { quiet_steps, bound });
    }
}

/// Whether the ranks that joined as `members` are a quorum of the plan's
/// view: more than half, or exactly half with its first member.
fn quorum(plan: &Setup, members: &[usize]) -> bool {
    let (taken, n) = (members.len(), plan.members.len());
    2 * taken > n || (2 * taken == n && members.first() == plan.members.first())
}

/// Why a decision could never be right whoever took it, if so: another
/// view, ranks outside this one, a view without a quorum, or "no quorum"
/// for ranks that are one.
fn malformed(plan: &Setup, decision: &ViewDecision) -> Option<&'static str> {
    if decision.epoch != plan.epoch {
        return Some("another view's number");
    }
    if !decision.members.iter().all(|m| plan.members.contains(m)) {
        return Some("ranks outside the view");
    }
    match (decision.outcome, quorum(plan, &decision.members)) {
        (ViewOutcome::NoQuorum, true) => Some("no quorum for a quorum"),
        (ViewOutcome::NoQuorum, false) => None,
        (_, false) => Some("a view without a quorum"),
        (_, true) => None,
    }
}

/// A rank that decided it is a member holds a view with it in; a rank
/// removed holds a view without it; "no quorum" is that.
fn verdict_holds(plan: &Setup, place: usize, outcome: &Outcome) -> bool {
    let joined = plan.members[place];
    let decision = outcome.decision();
    let formed = decision.outcome != ViewOutcome::NoQuorum;
    let inside = decision.members.contains(&joined);
    match outcome {
        Outcome::Member { .. } => formed && inside,
        Outcome::Removed { .. } => formed && !inside,
        Outcome::NoQuorum { .. } => !formed,
        Outcome::Abandoned { .. } => formed && inside,
    }
}

/// Every member can act on the view's outcome as the shell does, and it
/// is the right one: `Complete { call }` only where every member holds
/// that call's result (it returns it) or is one call on (it returned it,
/// so every rank held it; it runs its own call again); `Rerun { call }`
/// only where every member is in that call (none returned it, so running
/// it again among them repeats no step).
fn actionable(plan: &Setup, view: &ViewDecision, found: &mut Vec<Violation>) {
    for &m in &view.members {
        let Some(place) = plan.members.iter().position(|&r| r == m) else {
            continue;
        };
        let (call, held) = plan.at[place];
        let ok = match view.outcome {
            ViewOutcome::Complete { call: c } => (call == c && held) || call == c + 1,
            ViewOutcome::Rerun { call: c } => call == c,
            ViewOutcome::NoQuorum => true,
        };
        if !ok {
            found.push(Violation::Unactionable {
                place,
                at: (call, held),
                decision: view.clone(),
            });
        }
    }
}

/// Agreement: every member of a view that took a decision took that
/// view (else the view cannot form, and whichever it took cannot either
/// if it is another view); and, what follows from quorums meeting, never
/// two views each taken by all their members, which could both form.
fn agreement(plan: &Setup, ran: &Left, views: &[&ViewDecision], found: &mut Vec<Violation>) {
    // What each rank installed (or took: removed, no quorum); a rank that
    // abandoned its view installed none.
    let took = |place: usize| {
        ran.outcomes[place]
            .as_ref()
            .filter(|o| !matches!(o, Outcome::Abandoned { .. }))
            .map(Outcome::decision)
    };
    let place_of = |m: &usize| plan.members.iter().position(|r| r == m);
    // Only a view some member installed can disagree with another: a
    // decision only the removed heard stopped them, and stopping
    // conflicts with nothing.
    let installed = |view: &ViewDecision| {
        ran.outcomes
            .iter()
            .flatten()
            .any(|o| matches!(o, Outcome::Member { decision, .. } if decision == view))
    };
    'views: for view in views.iter().filter(|v| installed(v)) {
        for place in view.members.iter().filter_map(place_of) {
            if let Some(other) = took(place).filter(|&d| d != *view) {
                found.push(Violation::Disagreement {
                    place,
                    took: other.clone(),
                    view: (*view).clone(),
                });
                break 'views;
            }
        }
    }
    let whole = |view: &ViewDecision| {
        view.members
            .iter()
            .filter_map(place_of)
            .all(|p| took(p) == Some(view))
    };
    let formed: Vec<&&ViewDecision> = views.iter().filter(|v| whole(v)).collect();
    if let [first, second, ..] = formed[..] {
        found.push(Violation::SplitDecisions {
            first: (*first).clone(),
            second: (*second).clone(),
        });
    }
}
