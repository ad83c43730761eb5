//! The keeper's steps one by one, with the driver's events written out:
//! what a call and an admission ask for, through a loss, a rerun, a mesh
//! with a hole, a removal and a driver that fails.

use super::{Action, Event, Failure, KeeperError, ViewKeeper};
use crate::group::agreement::Outcome;
use crate::group::{OnRankFailure, ViewDecision, ViewOutcome};
use std::net::SocketAddr;

fn decision(epoch: u64, outcome: ViewOutcome, members: &[usize]) -> ViewDecision {
    ViewDecision {
        epoch,
        outcome,
        members: members.to_vec(),
    }
}

fn member(d: ViewDecision) -> Outcome {
    Outcome::Member {
        decision: d,
        from: 0,
    }
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], port))
}

/// Polls the one action the keeper has, with its shape checked by `f`.
fn next(k: &mut ViewKeeper) -> Action {
    let action = k.poll().expect("the keeper has an action");
    assert!(k.poll().is_none() || matches!(action, Action::Admit { .. }));
    action
}

/// A keeper at `place` of `world` ranks that began its first call and
/// was asked for the exchange.
fn in_a_call(place: usize, world: usize) -> ViewKeeper {
    let mut k = ViewKeeper::new(place, world);
    k.begin_call().unwrap();
    next(&mut k);
    k
}

/// View `epoch` agreed with the first call complete and `members` left,
/// its mesh formed whole: the call returns.
fn agree_and_return(k: &mut ViewKeeper, epoch: u64, members: &[usize]) {
    k.handle(Event::Agreed(member(decision(
        epoch,
        ViewOutcome::Complete { call: 1 },
        members,
    ))));
    next(k);
    k.handle(Event::MeshFormed { unlinked: vec![] });
    assert!(matches!(next(k), Action::Return));
}

#[test]
fn a_call_without_failure_is_an_exchange_then_done_then_return() {
    let mut k = ViewKeeper::new(1, 3);
    k.begin_call().unwrap();
    assert!(matches!(next(&mut k), Action::Exchange { rerun: false }));
    k.handle(Event::Exchanged);
    assert!(matches!(next(&mut k), Action::Done));
    k.handle(Event::DoneExchanged(vec![
        (2, addr(2)),
        (0, addr(1)),
        (2, addr(2)),
    ]));
    assert!(matches!(next(&mut k), Action::Return));
    assert_eq!(k.calls(), 1);
    assert_eq!(k.contributors(), 3);
    assert_eq!(
        k.announced(),
        &[(0, addr(1)), (2, addr(2))],
        "sorted, once each"
    );
}

#[test]
fn a_rank_lost_in_the_exchange_starts_an_agreement_and_the_call_runs_again() {
    let mut k = in_a_call(0, 3);
    k.note_lost(1);
    k.handle(Event::ExchangeFailed(Failure::Lost(2)));
    let Action::Agree(mut agreement) = next(&mut k) else {
        panic!("an agreement")
    };
    assert_eq!(agreement.seat().epoch(), 1);
    assert!(!agreement.seat().has_result());
    assert_eq!(
        agreement.suspects().iter().copied().collect::<Vec<_>>(),
        [1, 2]
    );
    // Alone of three, rank 0 has no quorum: the agreement says so.
    while agreement.poll_transmit().is_some() {}
    assert!(matches!(
        agreement.outcome(),
        Some(Outcome::NoQuorum { .. })
    ));
    k.handle(Event::Agreed(agreement.outcome().unwrap().clone()));
    let Action::Fail(KeeperError::NoQuorum { reached, .. }) = next(&mut k) else {
        panic!("no quorum")
    };
    assert_eq!(reached, [0]);
    assert!(matches!(k.begin_call(), Err(KeeperError::Removed { .. })));

    let mut k = in_a_call(0, 3);
    k.handle(Event::ExchangeFailed(Failure::Lost(2)));
    assert!(matches!(next(&mut k), Action::Agree(_)));
    k.handle(Event::Agreed(member(decision(
        1,
        ViewOutcome::Rerun { call: 1 },
        &[0, 1],
    ))));
    let Action::FormMesh(d) = next(&mut k) else {
        panic!("a mesh")
    };
    assert_eq!(d.members, [0, 1]);
    k.handle(Event::MeshFormed { unlinked: vec![] });
    assert!(matches!(next(&mut k), Action::Exchange { rerun: true }));
    assert_eq!((k.epoch(), k.members()), (1, &[0, 1][..]));
    k.handle(Event::Exchanged);
    next(&mut k);
    k.handle(Event::DoneExchanged(vec![]));
    assert!(matches!(next(&mut k), Action::Return));
    assert_eq!((k.calls(), k.contributors()), (1, 2));
}

#[test]
fn a_result_held_through_done_is_returned_where_the_view_completes_the_call() {
    let mut k = in_a_call(1, 3);
    k.handle(Event::Exchanged);
    next(&mut k);
    k.handle(Event::ExchangeFailed(Failure::Lost(2)));
    let Action::Agree(agreement) = next(&mut k) else {
        panic!("an agreement")
    };
    assert!(agreement.seat().has_result());
    agree_and_return(&mut k, 1, &[0, 1]);
    assert_eq!(k.contributors(), 3, "the result is the whole view's");
}

#[test]
fn a_member_that_does_not_link_up_is_left_out_by_the_next_agreement() {
    let mut k = in_a_call(0, 4);
    k.handle(Event::Exchanged);
    next(&mut k);
    k.handle(Event::ExchangeFailed(Failure::Alarm(
        3,
        b"proposal".to_vec(),
    )));
    next(&mut k);
    k.handle(Event::Agreed(member(decision(
        1,
        ViewOutcome::Complete { call: 1 },
        &[0, 1, 2],
    ))));
    next(&mut k);
    k.handle(Event::MeshFormed { unlinked: vec![2] });
    let Action::Agree(agreement) = next(&mut k) else {
        panic!("another agreement")
    };
    assert_eq!(agreement.seat().epoch(), 2);
    assert_eq!(agreement.seat().members(), [0, 1, 2]);
    assert!(agreement.seat().has_result(), "view 1 completed the call");
    assert_eq!(
        agreement.suspects().iter().copied().collect::<Vec<_>>(),
        [2]
    );
    agree_and_return(&mut k, 2, &[0, 1]);
    assert_eq!((k.epoch(), k.members()), (2, &[0, 1][..]));
}

#[test]
fn a_removal_fails_this_call_and_every_later_one() {
    let mut k = in_a_call(2, 3);
    k.handle(Event::ExchangeFailed(Failure::Removed(
        "rank 0 closed its link".into(),
    )));
    let Action::Fail(KeeperError::Removed { rank, epoch, why }) = next(&mut k) else {
        panic!("removed")
    };
    assert_eq!((rank, epoch), (2, 0));
    assert!(why.contains("rank 0"));
    let again = k.begin_call().unwrap_err();
    assert!(
        again.to_string().contains("rank 0 closed its link"),
        "{again}"
    );
    assert_eq!(k.removed().map(|r| r.0), Some(0));
}

#[test]
fn a_fatal_failure_leaves_the_view_as_it_was() {
    let mut k = in_a_call(0, 2);
    k.note_lost(1);
    k.handle(Event::ExchangeFailed(Failure::Fatal));
    assert!(matches!(next(&mut k), Action::Fail(KeeperError::Fatal)));
    assert!(k.removed().is_none());
    k.begin_call().unwrap();
    next(&mut k);
    k.handle(Event::ExchangeFailed(Failure::Lost(1)));
    let Action::Agree(agreement) = next(&mut k) else {
        panic!("an agreement")
    };
    assert_eq!(
        agreement.seat().call(),
        2,
        "the second call's own agreement"
    );
}

#[test]
fn a_driver_that_cannot_carry_out_an_action_stops_the_rank() {
    let mut k = in_a_call(0, 3);
    k.handle(Event::ExchangeFailed(Failure::Lost(1)));
    next(&mut k);
    k.handle(Event::Stopped("no link left to hear view 1 from".into()));
    assert!(matches!(
        next(&mut k),
        Action::Fail(KeeperError::Removed { .. })
    ));
    assert!(k.begin_call().is_err());

    // An event the stage does not expect is the driver's bug: the rank
    // stops rather than guess.
    let mut k = in_a_call(0, 2);
    k.handle(Event::MeshFormed { unlinked: vec![] });
    assert!(matches!(
        next(&mut k),
        Action::Fail(KeeperError::Removed { .. })
    ));
}

#[test]
fn an_admission_takes_the_announced_ranks_in_and_says_who_joined() {
    let mut k = ViewKeeper::new(0, 4);
    assert!(!k.admit(OnRankFailure::Continue).unwrap(), "nobody waits");
    k.begin_call().unwrap();
    next(&mut k);
    k.handle(Event::ExchangeFailed(Failure::Lost(3)));
    next(&mut k);
    k.handle(Event::Agreed(member(decision(
        1,
        ViewOutcome::Rerun { call: 1 },
        &[0, 1, 2],
    ))));
    next(&mut k);
    k.handle(Event::MeshFormed { unlinked: vec![] });
    next(&mut k);
    k.handle(Event::Exchanged);
    next(&mut k);
    k.handle(Event::DoneExchanged(vec![(3, addr(3)), (1, addr(1))]));
    next(&mut k);
    assert!(!k.admit(OnRankFailure::Fail).unwrap(), "Fail admits nobody");
    // The announcements stay for a policy that admits.
    assert!(k.admit(OnRankFailure::Continue).unwrap());
    let Action::Admit {
        decision: d,
        joiners,
    } = k.poll().unwrap()
    else {
        panic!("admit")
    };
    assert_eq!(joiners, [(3, addr(3))], "rank 1 is a member already");
    assert_eq!(d.epoch, 2);
    assert_eq!(d.members, [0, 1, 2, 3]);
    assert_eq!(d.outcome, ViewOutcome::Complete { call: 1 });
    assert!(matches!(k.poll(), Some(Action::FormMesh(_))));
    k.handle(Event::MeshFormed { unlinked: vec![] });
    let Action::Admitted(joined) = next(&mut k) else {
        panic!("admitted")
    };
    assert_eq!(joined, [3]);
    assert_eq!(k.joined(), [3]);

    // The rank admitted starts where the members are.
    let j = ViewKeeper::admitted(3, 4, &d, vec![3]);
    assert_eq!(
        (j.epoch(), j.calls(), j.members()),
        (2, 1, &[0, 1, 2, 3][..])
    );
    assert_eq!(j.place(), Some(3));
}

#[test]
fn a_joiner_that_does_not_link_up_is_left_out_and_not_said_to_have_joined() {
    let mut k = in_a_call(1, 3);
    k.handle(Event::ExchangeFailed(Failure::Lost(0)));
    next(&mut k);
    k.handle(Event::Agreed(member(decision(
        1,
        ViewOutcome::Rerun { call: 1 },
        &[1, 2],
    ))));
    next(&mut k);
    k.handle(Event::MeshFormed { unlinked: vec![] });
    next(&mut k);
    k.handle(Event::Exchanged);
    next(&mut k);
    k.handle(Event::DoneExchanged(vec![(0, addr(9))]));
    next(&mut k);
    assert!(k.admit(OnRankFailure::Continue).unwrap());
    k.poll();
    k.poll();
    k.handle(Event::MeshFormed { unlinked: vec![0] });
    let Action::Agree(agreement) = next(&mut k) else {
        panic!("an agreement without the joiner")
    };
    assert_eq!(agreement.seat().epoch(), 3);
    assert_eq!(agreement.seat().members(), [0, 1, 2]);
    assert_eq!(agreement.seat().call(), 1);
    assert!(agreement.seat().has_result(), "view 2 completed call 1");
    assert_eq!(
        agreement.suspects().iter().copied().collect::<Vec<_>>(),
        [0]
    );
    let outcome = member(decision(3, ViewOutcome::Complete { call: 1 }, &[1, 2]));
    k.handle(Event::Agreed(outcome));
    next(&mut k);
    k.handle(Event::MeshFormed { unlinked: vec![] });
    let Action::Admitted(joined) = next(&mut k) else {
        panic!("admitted")
    };
    assert!(joined.is_empty(), "rank 0 never linked up");
    assert_eq!(k.members(), [1, 2]);
}
