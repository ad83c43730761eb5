//! The rule and one rank's machine, case by case: what it sends, when it
//! decides, what it makes of bad bytes.

use super::*;
use crate::group::{ViewDecision, ViewOutcome, ViewProposal};
use std::collections::{BTreeMap, BTreeSet};

/// Place `place` of a view of the ranks `members` (joined from a group of
/// 8), agreeing on view 3 in call 10.
fn seat(place: usize, members: &[usize], has_result: bool) -> Seat {
    Seat::new(place, members.to_vec(), 8, 3, 10, has_result).unwrap()
}

fn proposal(call: u64, has_result: bool, suspects: &[usize]) -> ViewProposal {
    ViewProposal {
        epoch: 3,
        call,
        has_result,
        suspects: suspects.to_vec(),
    }
}

/// Everything the machine has to send now, every send succeeding.
fn drain(a: &mut Agreement) -> Vec<Transmit> {
    std::iter::from_fn(|| a.poll_transmit()).collect()
}

fn decoded(t: &Transmit) -> ViewDecision {
    assert_eq!(t.kind, MessageKind::Decision);
    ViewDecision::decode(&t.body, 8).unwrap()
}

#[test]
fn seats_outside_any_view_are_refused() {
    assert!(matches!(
        Seat::new(0, vec![], 4, 1, 1, false),
        Err(AgreementError::Members { .. })
    ));
    assert!(matches!(
        Seat::new(0, vec![2, 1], 4, 1, 1, false),
        Err(AgreementError::Members { .. })
    ));
    assert!(matches!(
        Seat::new(0, vec![1, 4], 4, 1, 1, false),
        Err(AgreementError::Members { .. })
    ));
    assert!(matches!(
        Seat::new(2, vec![0, 1], 4, 1, 1, false),
        Err(AgreementError::Place { place: 2, size: 2 })
    ));
    assert!(matches!(
        Seat::new(0, vec![0], 0, 1, 1, false),
        Err(AgreementError::World { .. })
    ));
}

#[test]
fn a_quorum_is_a_majority_or_half_with_the_first_place() {
    assert!(is_quorum(&[0, 1, 2], 4));
    assert!(is_quorum(&[1, 2, 3], 4));
    assert!(is_quorum(&[0, 3], 4));
    assert!(!is_quorum(&[1, 3], 4));
    assert!(!is_quorum(&[0], 3));
    assert!(is_quorum(&[0], 2));
    assert!(!is_quorum(&[1], 2));
    assert!(!is_quorum(&[], 1));
    assert!(is_quorum(&[0], 1));
}

#[test]
fn a_call_completes_only_where_every_member_holds_it_or_is_past_it() {
    let complete = |call| ViewOutcome::Complete { call };
    let rerun = |call| ViewOutcome::Rerun { call };
    assert_eq!(outcome((4, true), [(4, true), (4, true)]), complete(4));
    assert_eq!(outcome((4, true), [(4, false)]), rerun(4));
    // One on: it returned 4, so every rank held 4.
    assert_eq!(outcome((4, true), [(5, false)]), complete(4));
    assert_eq!(outcome((5, false), [(4, true)]), complete(4));
    assert_eq!(outcome((5, false), [(5, false)]), rerun(5));
    assert_eq!(outcome((5, true), []), complete(5));
}

#[test]
fn the_rule_leaves_out_whom_anyone_lost_and_who_lost_the_coordinator() {
    // Ranks 1, 3, 4, 6 joined; the coordinator is place 0 (rank 1).
    let members = [1, 3, 4, 6];
    let s = seat(0, &members, true);
    let mut proposals = BTreeMap::new();
    proposals.insert(1, proposal(10, true, &[6]));
    proposals.insert(2, proposal(10, true, &[]));
    let suspects = BTreeSet::from([3]);
    let d = decide(&s, &suspects, &proposals);
    assert_eq!(d.decision.members, vec![1, 3, 4]);
    assert_eq!(d.decision.outcome, ViewOutcome::Complete { call: 10 });
    assert_eq!(d.left_out, BTreeSet::from([3]));

    // Place 2 lost the coordinator: it is out, and then so is the quorum.
    proposals.insert(2, proposal(10, false, &[1]));
    proposals.insert(1, proposal(10, true, &[4, 6]));
    let d = decide(&s, &BTreeSet::new(), &proposals);
    assert_eq!(d.decision.members, vec![1, 3]);
    assert_eq!(d.decision.outcome, ViewOutcome::Complete { call: 10 });
    // Place 1 says it lost 4 and 6; place 2 (rank 4) lost the coordinator.
    assert_eq!(d.left_out, BTreeSet::from([2, 3]));

    let d = decide(
        &seat(1, &members, true),
        &BTreeSet::from([0, 2]),
        &proposals,
    );
    assert_eq!(d.decision.outcome, ViewOutcome::NoQuorum);
}

#[test]
fn the_coordinator_waits_for_every_proposal_and_tells_the_left_out_too() {
    let members = [0, 1, 2, 3];
    let alarm = proposal(10, false, &[3]);
    let mut a = Agreement::new(seat(0, &members, true), [3], [(1, alarm.encode())]);
    let first = drain(&mut a);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].to, vec![1, 2]);
    assert_eq!(first[0].kind, MessageKind::Proposal);
    assert_eq!(
        ViewProposal::decode(&first[0].body, 8).unwrap(),
        proposal(10, true, &[3])
    );
    assert!(a.outcome().is_none(), "place 2 has not proposed");

    a.handle(Event::Proposal {
        from: 2,
        body: &proposal(10, true, &[]).encode(),
    });
    let sent = drain(&mut a);
    assert_eq!(sent.len(), 2);
    assert_eq!((sent[0].to.clone(), sent[0].left_out), (vec![1, 2], false));
    assert_eq!((sent[1].to.clone(), sent[1].left_out), (vec![3], true));
    let decision = decoded(&sent[0]);
    assert_eq!(decision.members, vec![0, 1, 2]);
    // Place 1 lacks the result.
    assert_eq!(decision.outcome, ViewOutcome::Rerun { call: 10 });
    // It accepted its decision; it installs it once every member did.
    assert!(a.outcome().is_none());
    for from in [1, 2] {
        a.handle(Event::Decision {
            from,
            body: &sent[0].body,
        });
    }
    assert_eq!(
        a.outcome(),
        Some(&Outcome::Member {
            decision: decision.clone(),
            from: 0
        })
    );
    // Done: nothing changes it, nothing more goes out.
    a.handle(Event::Lost { from: 1 });
    a.send_failed(2);
    assert!(a.poll_transmit().is_none());
    assert_eq!(a.outcome().map(Outcome::decision), Some(&decision));
}

#[test]
fn a_rank_that_loses_one_more_proposes_again_to_the_rest() {
    let members = [0, 1, 2, 3];
    let mut a = Agreement::new(seat(2, &members, false), [3], None::<(usize, Vec<u8>)>);
    assert_eq!(drain(&mut a)[0].to, vec![0, 1]);
    // A send that failed counts the rank as lost; the proposal goes again
    // to the rest before anything else.
    let mut a = Agreement::new(seat(2, &members, false), [3], None::<(usize, Vec<u8>)>);
    let t = a.poll_transmit().unwrap();
    assert_eq!(t.to, vec![0, 1]);
    a.send_failed(0);
    let again = drain(&mut a);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].to, vec![1]);
    assert_eq!(
        ViewProposal::decode(&again[0].body, 8).unwrap().suspects,
        vec![0, 3]
    );
    assert_eq!(a.coordinator(), 1);
    // Its coordinator's link fails too: it is its own, has heard all (no
    // one is left to propose to) and tells the ranks it left out.
    a.handle(Event::Lost { from: 1 });
    let sent = drain(&mut a);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].to.clone(), sent[0].left_out),
        (vec![0, 1, 3], true)
    );
    let outcome = a.outcome().unwrap();
    assert!(matches!(outcome, Outcome::NoQuorum { from: 2, .. }));
    assert_eq!(outcome.decision().members, vec![2]);
}

#[test]
fn a_decision_is_passed_on_to_every_rank_reached_its_sender_included() {
    let members = [2, 5, 7];
    let mut a = Agreement::new(
        seat(2, &members, true),
        [],
        [(1, proposal(10, true, &[2]).encode())],
    );
    drain(&mut a);
    let decision = ViewDecision {
        epoch: 3,
        outcome: ViewOutcome::Complete { call: 10 },
        members: vec![5, 7],
    };
    a.handle(Event::Decision {
        from: 1,
        body: &decision.encode(),
    });
    let sent = drain(&mut a);
    assert_eq!(sent.len(), 1);
    // The sender hears it too: that is this rank's acceptance.
    assert_eq!(sent[0].to, vec![0, 1]);
    assert_eq!(decoded(&sent[0]), decision);
    // Both members accepted (the sender by sending it): installed.
    assert_eq!(
        a.outcome(),
        Some(&Outcome::Member {
            decision: decision.clone(),
            from: 5
        })
    );

    // Without this rank: removed.
    let mut b = Agreement::new(seat(0, &members, true), [1], None::<(usize, Vec<u8>)>);
    drain(&mut b);
    b.handle(Event::Decision {
        from: 2,
        body: &decision.encode(),
    });
    assert!(matches!(
        b.outcome(),
        Some(Outcome::Removed { from: 7, .. })
    ));
}

#[test]
fn bad_bytes_count_their_rank_as_lost() {
    let members = [0, 1, 2, 3];
    // A malformed alarm, and a stale one, which is dropped.
    let stale = ViewProposal {
        epoch: 2,
        ..proposal(10, true, &[])
    };
    let alarms = [
        (1, b"gradlane-view/1 propose x".to_vec()),
        (2, stale.encode()),
    ];
    let mut a = Agreement::new(seat(3, &members, true), [], alarms);
    assert_eq!(a.suspects(), &BTreeSet::from([1]));
    assert_eq!(drain(&mut a)[0].to, vec![0, 2]);
    // A proposal for another view, and a decision that is not one.
    a.handle(Event::Proposal {
        from: 2,
        body: &stale.encode(),
    });
    a.handle(Event::Decision {
        from: 0,
        body: b"\xff",
    });
    assert_eq!(a.suspects(), &BTreeSet::from([0, 1, 2]));
    // Alone, it decides: one of four is no quorum.
    drain(&mut a);
    assert!(matches!(a.outcome(), Some(Outcome::NoQuorum { .. })));
    // Places outside the view change nothing.
    let mut b = Agreement::new(seat(0, &members, true), [9], [(9, b"".to_vec())]);
    b.handle(Event::Lost { from: 17 });
    b.send_failed(17);
    assert!(b.suspects().is_empty());
}

/// Two coordinators (docs/DESIGN.md §4.1): the link between the two
/// lowest ranks fails, each is its own coordinator, and both decide at
/// once, each with the other left out; ranks 2 and 3 are members of both
/// views. Each accepts the first that comes, so at most one view is
/// installed, and a coordinator whose view a member refused stops.
#[test]
fn two_ranks_that_lost_each_other_both_coordinate() {
    let members = [0, 1, 2, 3];
    let mut zero = Agreement::new(seat(0, &members, true), [1], None::<(usize, Vec<u8>)>);
    let mut one = Agreement::new(seat(1, &members, true), [0], None::<(usize, Vec<u8>)>);
    drain(&mut zero);
    drain(&mut one);
    let mut decided = Vec::new();
    for a in [&mut zero, &mut one] {
        for from in [2, 3] {
            a.handle(Event::Proposal {
                from,
                body: &proposal(10, true, &[]).encode(),
            });
        }
        let sent = drain(a);
        assert!(a.outcome().is_none(), "accepted, not installed");
        decided.push(sent[0].body.clone());
    }
    let views = decided
        .iter()
        .map(|b| ViewDecision::decode(b, 8).unwrap().members);
    assert_eq!(views.collect::<Vec<_>>(), [vec![0, 2, 3], vec![1, 2, 3]]);
    // Ranks 2 and 3 hear zero's first, accept it and pass it on.
    let mut two = Agreement::new(seat(2, &members, true), [], None::<(usize, Vec<u8>)>);
    drain(&mut two);
    two.handle(Event::Decision {
        from: 0,
        body: &decided[0],
    });
    let passed = drain(&mut two);
    assert_eq!(passed[0].to, vec![0, 1, 3]);
    // One's decision comes later: rank 2 keeps what it accepted.
    two.handle(Event::Decision {
        from: 1,
        body: &decided[1],
    });
    assert!(two.outcome().is_none());
    two.handle(Event::Decision {
        from: 3,
        body: &decided[0],
    });
    assert!(matches!(
        two.outcome(),
        Some(Outcome::Member { from: 0, .. })
    ));
    // Rank 1 hears that a member of its view accepted the other: its view
    // is never installed, and it stops.
    one.handle(Event::Decision {
        from: 2,
        body: &decided[0],
    });
    assert!(matches!(
        one.outcome(),
        Some(Outcome::Abandoned { from: 2, .. })
    ));
    for from in [2, 3] {
        zero.handle(Event::Decision {
            from,
            body: &decided[0],
        });
    }
    assert_eq!(
        zero.outcome().map(Outcome::decision),
        two.outcome().map(Outcome::decision)
    );
}

/// A member that loses its link to a member of its view that had not
/// accepted it cannot know whether every member did, and stops.
#[test]
fn a_member_lost_before_it_accepted_abandons_the_view() {
    let members = [0, 1, 2];
    let mut a = Agreement::new(seat(2, &members, true), [], None::<(usize, Vec<u8>)>);
    drain(&mut a);
    let decision = ViewDecision {
        epoch: 3,
        outcome: ViewOutcome::Complete { call: 10 },
        members: vec![0, 1, 2],
    };
    a.handle(Event::Decision {
        from: 0,
        body: &decision.encode(),
    });
    drain(&mut a);
    assert!(a.outcome().is_none());
    a.handle(Event::Lost { from: 1 });
    assert!(matches!(
        a.outcome(),
        Some(Outcome::Abandoned { from: 1, .. })
    ));
}

/// The simulation's tests break the rule on purpose: each knob breaks
/// the rule it names, and nothing else.
#[test]
fn the_test_knobs_break_the_rule_they_name() {
    let members = [0, 1, 2];
    let none = None::<(usize, Vec<u8>)>;
    let mut a = Agreement::new(seat(0, &members, true), [], none.clone());
    drain(&mut a);
    assert!(a.outcome().is_none());
    let mut a = a.with_flaw(Some(Flaw::Impatient));
    let sent = drain(&mut a);
    let decision = sent
        .iter()
        .find(|t| t.kind == MessageKind::Decision)
        .unwrap();
    assert_eq!(decoded(decision).members, vec![0, 1, 2]);
    assert!(
        a.outcome().is_none(),
        "it still waits for the members to accept"
    );
    // Hasty: the first decision heard is installed at once.
    let mut h =
        Agreement::new(seat(1, &members, true), [], none.clone()).with_flaw(Some(Flaw::Hasty));
    drain(&mut h);
    h.handle(Event::Decision {
        from: 0,
        body: &decision.body,
    });
    assert!(matches!(h.outcome(), Some(Outcome::Member { .. })));

    let mut b = Agreement::new(seat(0, &members, true), [1, 2], none.clone());
    drain(&mut b);
    assert!(matches!(b.outcome(), Some(Outcome::NoQuorum { .. })));
    let mut b =
        Agreement::new(seat(0, &members, true), [1, 2], none).with_flaw(Some(Flaw::NoQuorum));
    drain(&mut b);
    assert!(matches!(b.outcome(), Some(Outcome::Member { .. })));
}
