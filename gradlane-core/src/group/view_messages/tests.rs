use super::*;

#[test]
fn a_rank_returns_a_completed_call_it_holds_and_reruns_the_rest() {
    let complete = ViewOutcome::Complete { call: 5 };
    assert_eq!(complete.for_call(5, true), CallFate::Return);
    assert_eq!(complete.for_call(5, false), CallFate::OutOfStep);
    assert_eq!(complete.for_call(6, false), CallFate::Rerun, "one call on");
    assert_eq!(complete.for_call(7, false), CallFate::OutOfStep);
    let rerun = ViewOutcome::Rerun { call: 5 };
    assert_eq!(rerun.for_call(5, true), CallFate::Rerun);
    assert_eq!(rerun.for_call(6, false), CallFate::OutOfStep);
    assert_eq!(ViewOutcome::NoQuorum.for_call(5, true), CallFate::OutOfStep);
}
use crate::group::MAX_WORLD;

/// The longest address a rank can listen at.
const LONGEST: &str = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff%4294967295]:65535";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A megabyte after a valid message: refused by length, not read.
fn megabyte_after(mut body: Vec<u8>) -> Vec<u8> {
    body.extend(std::iter::repeat_n(b'1', 1 << 20));
    body
}

#[test]
fn proposals_round_trip() {
    let shapes = [
        (4, vec![]),
        (4, vec![0, 2, 3]),
        (1, vec![]),
        (MAX_WORLD, vec![0, 7, MAX_WORLD - 1]),
        // The longest: every other rank suspected.
        (MAX_WORLD, (1..MAX_WORLD).collect()),
    ];
    for (world, suspects) in shapes {
        for (epoch, call, has_result) in [(1, 0, false), (u64::MAX, u64::MAX, true)] {
            let p = ViewProposal {
                epoch,
                call,
                has_result,
                suspects: suspects.clone(),
            };
            assert_eq!(ViewProposal::decode(&p.encode(), world), Ok(p));
        }
    }
    assert_eq!(
        ViewProposal {
            epoch: 2,
            call: 9,
            has_result: true,
            suspects: vec![1, 3],
        }
        .encode(),
        b"gradlane-view/1 propose 2 9 true 1 3"
    );
}

#[test]
fn decisions_round_trip() {
    let outcomes = [
        ViewOutcome::Complete { call: 5 },
        ViewOutcome::Rerun { call: u64::MAX },
        ViewOutcome::NoQuorum,
    ];
    for outcome in outcomes {
        let shapes = [
            (4, vec![0, 1, 3]),
            (1, vec![0]),
            (MAX_WORLD, vec![0, 9, MAX_WORLD - 1]),
            (MAX_WORLD, (0..MAX_WORLD).collect()),
        ];
        for (world, members) in shapes {
            let d = ViewDecision {
                epoch: u64::MAX,
                outcome,
                members,
            };
            assert_eq!(ViewDecision::decode(&d.encode(), world), Ok(d));
        }
    }
    // No quorum: the ranks reached, which may be none.
    let none = ViewDecision {
        epoch: 3,
        outcome: ViewOutcome::NoQuorum,
        members: vec![],
    };
    assert_eq!(none.encode(), b"gradlane-view/1 decide 3 no-quorum");
    assert_eq!(ViewDecision::decode(&none.encode(), 4), Ok(none));
    let d = ViewDecision {
        epoch: 3,
        outcome: ViewOutcome::Complete { call: 7 },
        members: vec![0, 2],
    };
    assert_eq!(d.encode(), b"gradlane-view/1 decide 3 complete 7 0 2");
}

#[test]
fn join_requests_round_trip() {
    let shapes = [
        (0, 1, "127.0.0.1:4433", None),
        (3, 4, "[::1]:9", Some(2)),
        (MAX_WORLD - 1, MAX_WORLD, LONGEST, Some(u64::MAX)),
    ];
    for (rank, world, listen, member_of) in shapes {
        let j = JoinRequest {
            rank,
            world,
            listen: addr(listen),
            member_of,
        };
        assert!(j.encode().len() <= MAX_JOIN_BYTES);
        assert_eq!(JoinRequest::decode(&j.encode()), Ok(j));
    }
}

#[test]
fn joiners_round_trip_and_none_is_empty() {
    assert_eq!(Joiners(vec![]).encode(), b"");
    for world in [1, 4, MAX_WORLD] {
        assert_eq!(Joiners::decode(b"", world), Ok(Joiners(vec![])));
    }
    let shapes = [
        (1, vec![(0, addr("10.0.0.1:1"))]),
        (4, vec![(1, addr("10.0.0.2:2")), (3, addr("[::1]:3"))]),
        (
            MAX_WORLD,
            vec![(0, addr("10.0.0.1:1")), (MAX_WORLD - 1, addr(LONGEST))],
        ),
        // The longest: every rank, at the longest address.
        (
            MAX_WORLD,
            (0..MAX_WORLD).map(|r| (r, addr(LONGEST))).collect(),
        ),
    ];
    for (world, joiners) in shapes {
        let j = Joiners(joiners);
        assert_eq!(Joiners::decode(&j.encode(), world), Ok(j));
    }
}

#[test]
fn oversized_bodies_are_refused_before_parsing() {
    let p = ViewProposal {
        epoch: 1,
        call: 1,
        has_result: false,
        suspects: vec![1],
    };
    assert!(matches!(
        ViewProposal::decode(&megabyte_after(p.encode()), 4),
        Err(GroupMessageError::TooLong { .. })
    ));
    // Not even text, and not even the right kind: the length is first.
    assert!(matches!(
        ViewProposal::decode(&vec![0xff; 1 << 20], MAX_WORLD),
        Err(GroupMessageError::TooLong { .. })
    ));
    // A world of one has room for no suspect after the longest head.
    let longest = ViewProposal {
        epoch: u64::MAX,
        call: u64::MAX,
        has_result: false,
        suspects: vec![0],
    };
    assert!(matches!(
        ViewProposal::decode(&longest.encode(), 1),
        Err(GroupMessageError::TooLong { .. })
    ));
    let d = ViewDecision {
        epoch: 1,
        outcome: ViewOutcome::Rerun { call: 1 },
        members: vec![0],
    };
    assert!(matches!(
        ViewDecision::decode(&megabyte_after(d.encode()), 2),
        Err(GroupMessageError::TooLong { .. })
    ));
    let j = JoinRequest {
        rank: 0,
        world: 2,
        listen: addr("127.0.0.1:1"),
        member_of: None,
    };
    assert!(matches!(
        JoinRequest::decode(&megabyte_after(j.encode())),
        Err(GroupMessageError::TooLong { .. })
    ));
    let joiners = Joiners(vec![(0, addr("127.0.0.1:1"))]);
    assert!(matches!(
        Joiners::decode(&megabyte_after(joiners.encode()), 2),
        Err(GroupMessageError::TooLong { .. })
    ));
}

#[test]
fn worlds_outside_the_bound_are_refused() {
    let world = |w| GroupMessageError::World {
        world: w,
        max: MAX_WORLD,
    };
    for w in [0, MAX_WORLD + 1] {
        assert_eq!(ViewProposal::decode(b"", w), Err(world(w)));
        assert_eq!(ViewDecision::decode(b"", w), Err(world(w)));
        assert_eq!(Joiners::decode(b"", w), Err(world(w)));
    }
    assert_eq!(
        JoinRequest::decode(b"gradlane-view/1 join 0 0 127.0.0.1:1 -"),
        Err(world(0))
    );
    assert_eq!(
        JoinRequest::decode(b"gradlane-view/1 join 0 65537 127.0.0.1:1 -"),
        Err(world(MAX_WORLD + 1))
    );
    assert_eq!(
        JoinRequest::decode(b"gradlane-view/1 join 4 4 127.0.0.1:1 -"),
        Err(GroupMessageError::Rank { rank: 4, world: 4 })
    );
}

#[test]
fn ranks_outside_the_group_are_refused() {
    assert_eq!(
        ViewProposal::decode(b"gradlane-view/1 propose 1 1 false 0 4", 4),
        Err(GroupMessageError::Rank { rank: 4, world: 4 })
    );
    for outcome in ["complete 1", "rerun 1", "no-quorum"] {
        let body = format!("gradlane-view/1 decide 1 {outcome} 0 4");
        assert_eq!(
            ViewDecision::decode(body.as_bytes(), 4),
            Err(GroupMessageError::Rank { rank: 4, world: 4 })
        );
    }
    assert_eq!(
        Joiners::decode(b"gradlane-view/1 joiners 2 127.0.0.1:1", 2),
        Err(GroupMessageError::Rank { rank: 2, world: 2 })
    );
}

#[test]
fn repeated_or_unordered_ranks_are_refused() {
    let unordered = |message, field, rank| GroupMessageError::Unordered {
        message,
        field,
        rank,
    };
    for (list, rank) in [("1 1", 1), ("2 1", 1), ("0 3 2", 2)] {
        let body = format!("gradlane-view/1 propose 1 1 true {list}");
        assert_eq!(
            ViewProposal::decode(body.as_bytes(), 4),
            Err(unordered("view proposal", "suspects", rank))
        );
        for outcome in ["complete 1", "rerun 1", "no-quorum"] {
            let body = format!("gradlane-view/1 decide 1 {outcome} {list}");
            assert_eq!(
                ViewDecision::decode(body.as_bytes(), 4),
                Err(unordered("view decision", "members", rank))
            );
        }
    }
    for body in [
        &b"gradlane-view/1 joiners 1 127.0.0.1:1 1 127.0.0.1:2"[..],
        b"gradlane-view/1 joiners 2 127.0.0.1:1 1 127.0.0.1:2",
    ] {
        assert_eq!(
            Joiners::decode(body, 4),
            Err(unordered("joiners", "ranks", 1))
        );
    }
}

#[test]
fn too_many_suspects_are_refused() {
    // Every rank suspected: the proposer suspects itself.
    assert_eq!(
        ViewProposal::decode(b"gradlane-view/1 propose 1 1 false 0 1 2 3", 4),
        Err(GroupMessageError::TooMany {
            message: "view proposal",
            field: "suspects",
            got: 4,
            max: 3
        })
    );
}

#[test]
fn outcomes_are_checked_each() {
    // Complete and Rerun need members and a call; NoQuorum neither.
    for outcome in ["complete 1", "rerun 1"] {
        let body = format!("gradlane-view/1 decide 1 {outcome}");
        assert_eq!(
            ViewDecision::decode(body.as_bytes(), 4),
            Err(GroupMessageError::BadField {
                message: "view decision",
                field: "members"
            })
        );
    }
    for outcome in ["complete", "rerun", "complete x 0", "rerun -1 0"] {
        let body = format!("gradlane-view/1 decide 1 {outcome}");
        assert_eq!(
            ViewDecision::decode(body.as_bytes(), 4),
            Err(GroupMessageError::BadField {
                message: "view decision",
                field: "call"
            }),
            "{outcome}"
        );
    }
    // No quorum has no call: a number after it is a member.
    assert_eq!(
        ViewDecision::decode(b"gradlane-view/1 decide 1 no-quorum 7", 4),
        Err(GroupMessageError::Rank { rank: 7, world: 4 })
    );
    for outcome in ["", "quorum 0", "Complete 1 0", "no_quorum"] {
        let body = format!("gradlane-view/1 decide 1 {outcome}");
        assert_eq!(
            ViewDecision::decode(body.trim_end().as_bytes(), 4),
            Err(GroupMessageError::BadField {
                message: "view decision",
                field: "outcome"
            }),
            "{outcome}"
        );
    }
}

#[test]
fn wrong_kinds_are_refused() {
    let wrong = |e: Result<_, _>, expected: &str| match e {
        Err(GroupMessageError::WrongKind { expected: e, .. }) => assert_eq!(e, expected),
        other => panic!("{other:?}"),
    };
    wrong(
        ViewProposal::decode(b"gradlane-view/2 propose 1 1 false", 4).map(drop),
        "gradlane-view/1",
    );
    wrong(
        ViewProposal::decode(b"gradlane-view/1 decide 1 1 false", 4).map(drop),
        "gradlane-view/1 propose",
    );
    wrong(
        ViewDecision::decode(b"gradlane-view/1 propose 1 no-quorum", 4).map(drop),
        "gradlane-view/1 decide",
    );
    wrong(
        JoinRequest::decode(b"gradlane-group/1 0 1 127.0.0.1:1 -").map(drop),
        "gradlane-view/1",
    );
    wrong(
        JoinRequest::decode(b"gradlane-view/1 joiners 0 1 127.0.0.1:1 -").map(drop),
        "gradlane-view/1 join",
    );
    wrong(
        Joiners::decode(b"gradlane-view/1 join 0 127.0.0.1:1", 4).map(drop),
        "gradlane-view/1 joiners",
    );
    // A lone kind word is no message at all.
    wrong(
        Joiners::decode(b"gradlane-view/1", 4).map(drop),
        "gradlane-view/1 joiners",
    );
}

#[test]
fn trailing_words_are_refused() {
    // Lists run to the end, so a trailing word is a malformed entry.
    assert_eq!(
        ViewProposal::decode(b"gradlane-view/1 propose 1 1 false 1 x", 4),
        Err(GroupMessageError::BadField {
            message: "view proposal",
            field: "suspects"
        })
    );
    assert_eq!(
        ViewProposal::decode(b"gradlane-view/1 propose 1 1 false 1 ", 4),
        Err(GroupMessageError::BadField {
            message: "view proposal",
            field: "suspects"
        })
    );
    assert_eq!(
        ViewDecision::decode(b"gradlane-view/1 decide 1 rerun 1 0 x", 4),
        Err(GroupMessageError::BadField {
            message: "view decision",
            field: "members"
        })
    );
    assert_eq!(
        JoinRequest::decode(b"gradlane-view/1 join 0 2 127.0.0.1:1 3 x"),
        Err(GroupMessageError::Trailing {
            message: "join request"
        })
    );
    assert_eq!(
        Joiners::decode(b"gradlane-view/1 joiners 0 127.0.0.1:1 x", 4),
        Err(GroupMessageError::BadField {
            message: "joiners",
            field: "rank"
        })
    );
    assert_eq!(
        Joiners::decode(b"gradlane-view/1 joiners 0 127.0.0.1:1 ", 4),
        Err(GroupMessageError::BadField {
            message: "joiners",
            field: "rank"
        })
    );
}

#[test]
fn truncated_messages_are_refused() {
    let bad_field = |message, field| GroupMessageError::BadField { message, field };
    let p = b"gradlane-view/1 propose 1 2 true";
    assert_eq!(
        ViewProposal::decode(&p[..p.len() - 5], 4),
        Err(bad_field("view proposal", "has result"))
    );
    assert_eq!(
        ViewProposal::decode(&p[..p.len() - 2], 4),
        Err(bad_field("view proposal", "has result"))
    );
    assert_eq!(
        ViewProposal::decode(b"gradlane-view/1 propose 1", 4),
        Err(bad_field("view proposal", "call"))
    );
    assert_eq!(
        ViewDecision::decode(b"gradlane-view/1 decide", 4),
        Err(bad_field("view decision", "epoch"))
    );
    assert_eq!(
        JoinRequest::decode(b"gradlane-view/1 join 0 2 127.0.0.1:1"),
        Err(bad_field("join request", "member of"))
    );
    assert_eq!(
        JoinRequest::decode(b"gradlane-view/1 join 0 2 127.0.0."),
        Err(bad_field("join request", "listening address"))
    );
    assert_eq!(
        Joiners::decode(b"gradlane-view/1 joiners 0", 4),
        Err(bad_field("joiners", "address"))
    );
    // The kind alone: an announcement of none is the empty body.
    assert_eq!(
        Joiners::decode(b"gradlane-view/1 joiners", 4),
        Err(bad_field("joiners", "rank"))
    );
    let wrong_kind = ViewProposal::decode(b"gradlane-view/1 prop", 4);
    assert!(matches!(
        wrong_kind,
        Err(GroupMessageError::WrongKind { .. })
    ));
}

#[test]
fn non_text_is_refused() {
    let not_text = |message| GroupMessageError::NotText { message };
    let body = b"\xff\xfe";
    assert_eq!(
        ViewProposal::decode(body, 4).unwrap_err(),
        not_text("view proposal")
    );
    assert_eq!(
        ViewDecision::decode(body, 4).unwrap_err(),
        not_text("view decision")
    );
    assert_eq!(
        JoinRequest::decode(body).unwrap_err(),
        not_text("join request")
    );
    assert_eq!(Joiners::decode(body, 4).unwrap_err(), not_text("joiners"));
}
