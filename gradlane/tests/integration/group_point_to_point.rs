//! Point-to-point messages between two ranks of a group, beside the
//! collectives: order per peer and tag, a receive from any rank, a
//! receive posted before collectives that both ranks run and sent after
//! them, large messages both ways at once, a receive from any rank that
//! outlives a sender that closed, and the errors (a peer gone, a timeout,
//! bad ranks).

use crate::common::{allreduce_all, group_configured, group_with};
use bytes::Bytes;
use futures_util::future::join_all;
use gradlane::{Group, GroupConfig, GroupError, ReduceOp};
use std::time::{Duration, Instant};

fn body(from: usize, tag: u64, i: usize, len: usize) -> Bytes {
    (0..len)
        .map(|k| (from * 31 + tag as usize * 7 + i * 3 + k) as u8)
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_keep_their_order_per_tag_and_any_source_names_the_sender() {
    let groups = group_with("p2p-order", 3, |_, c| c).await;
    let p2p: Vec<_> = groups.iter().map(Group::point_to_point).collect();
    // Rank 1 sends tags 5 and 9 interleaved; rank 0 receives 9 first.
    for i in 0..4 {
        for tag in [5, 9] {
            p2p[1].send(0, tag, body(1, tag, i, 100 + i)).await.unwrap();
        }
    }
    for tag in [9, 5] {
        for i in 0..4 {
            let (from, got) = p2p[0].recv(Some(1), tag).await.unwrap();
            assert_eq!(
                (from, got.into_bytes()),
                (1, body(1, tag, i, 100 + i)),
                "tag {tag} message {i}"
            );
        }
    }
    // From any rank: the rank that sent it.
    p2p[2].send(0, 3, body(2, 3, 0, 10)).await.unwrap();
    let (from, got) = p2p[0].recv(None, 3).await.unwrap();
    assert_eq!((from, got.into_bytes()), (2, body(2, 3, 0, 10)));
    p2p[1].send(0, 3, body(1, 3, 0, 10)).await.unwrap();
    let (from, got) = p2p[0].recv(None, 3).await.unwrap();
    assert_eq!((from, got.into_bytes()), (1, body(1, 3, 0, 10)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_posted_before_collectives_gets_a_message_sent_after_them() {
    let mut groups = group_with("p2p-beside", 2, |_, c| c).await;
    let p2p: Vec<_> = groups.iter().map(Group::point_to_point).collect();
    let posted = {
        let p2p = p2p[1].clone();
        tokio::spawn(async move { p2p.recv(Some(0), 7).await })
    };
    // Both ranks run collectives while rank 1's receive waits.
    for step in 0..3 {
        let mut bufs: Vec<Vec<f32>> = (0..2).map(|r| vec![(r + step) as f32; 1000]).collect();
        allreduce_all(&mut groups, &mut bufs, ReduceOp::Sum).await;
        assert_eq!(bufs[0][0], (1 + 2 * step) as f32);
    }
    assert!(!posted.is_finished());
    p2p[0].send(1, 7, body(0, 7, 0, 64)).await.unwrap();
    let (from, got) = posted.await.unwrap().unwrap();
    assert_eq!((from, got.into_bytes()), (0, body(0, 7, 0, 64)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_cross_both_ways_at_once() {
    let groups = group_with("p2p-large", 2, |_, c| c).await;
    let p2p: Vec<_> = groups.iter().map(Group::point_to_point).collect();
    let len = 24 << 20;
    let exchange = (0..2).map(|r| {
        let p2p = p2p[r].clone();
        async move {
            let (sent, got) = tokio::join!(
                p2p.send(1 - r, 1, body(r, 1, 0, len)),
                p2p.recv(Some(1 - r), 1)
            );
            sent.unwrap();
            got.unwrap()
        }
    });
    for (r, (from, got)) in join_all(exchange).await.into_iter().enumerate() {
        assert_eq!(from, 1 - r);
        // Read as quinn's chunks: copied into a buffer of its size.
        let mut out = vec![0u8; len];
        assert!(got.len() > 1 << 20 && got.copy_to(&mut out));
        assert!(!got.copy_to(&mut out[1..]), "a buffer of another size");
        assert!(out == body(1 - r, 1, 0, len), "rank {r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_from_a_rank_that_left_fails_naming_it() {
    let mut groups = group_with("p2p-gone", 2, |_, c| c).await;
    let p2p = groups[0].point_to_point();
    groups.pop().unwrap().close().await;
    match p2p.recv(Some(1), 4).await {
        Err(GroupError::Rank { rank, .. }) => assert_eq!(rank, 1),
        other => panic!("expected rank 1's error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_from_any_rank_outlives_a_sender_that_closed_after_its_last_message() {
    let mut groups = group_with("p2p-any-closed", 3, |_, c| c).await;
    let p2p: Vec<_> = groups.iter().map(Group::point_to_point).collect();
    // Rank 1 sends its messages and closes at once, as a rank whose last
    // act is a send ends; rank 2 sends only after that.
    for i in 0..3 {
        p2p[1].send(0, 6, body(1, 6, i, 40)).await.unwrap();
    }
    let rank_2 = groups.pop().unwrap();
    groups.pop().unwrap().close().await;
    let mut got = Vec::new();
    for _ in 0..3 {
        let (from, b) = p2p[0].recv(None, 6).await.unwrap();
        got.push((from, b.into_bytes()));
    }
    // Rank 1 is gone now, in order: a receive from any rank waits on for
    // rank 2 instead of failing on rank 1's end.
    let waiting = {
        let p2p = p2p[0].clone();
        tokio::spawn(async move { p2p.recv(None, 6).await })
    };
    for i in 0..2 {
        p2p[2].send(0, 6, body(2, 6, i, 40)).await.unwrap();
    }
    let (from, b) = waiting.await.unwrap().unwrap();
    got.push((from, b.into_bytes()));
    let (from, b) = p2p[0].recv(None, 6).await.unwrap();
    got.push((from, b.into_bytes()));
    let want: Vec<_> = [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]
        .into_iter()
        .map(|(r, i)| (r, body(r, 6, i, 40)))
        .collect();
    assert_eq!(got, want);
    // A receive from rank 1 itself still fails, naming it; from any rank
    // fails once every other rank has closed.
    match p2p[0].recv(Some(1), 6).await {
        Err(GroupError::Rank { rank: 1, .. }) => {}
        other => panic!("expected rank 1's error, got {other:?}"),
    }
    rank_2.close().await;
    match p2p[0].recv(None, 6).await {
        Err(e @ GroupError::Rank { .. }) => {
            assert!(e.to_string().contains("every other rank ([1, 2])"), "{e}")
        }
        other => panic!("expected every rank closed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_nothing_comes_for_ends_at_the_group_timeout() {
    let groups = group_configured("p2p-timeout", 2, |_, c| GroupConfig {
        collective_timeout: Some(Duration::from_secs(1)),
        ..c
    })
    .await;
    let started = Instant::now();
    match groups[0].point_to_point().recv(None, 2).await {
        Err(GroupError::Timeout { op, missing, .. }) => {
            assert_eq!((op, missing), ("recv", vec![1]));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_to_itself_or_outside_the_group_are_errors() {
    let groups = group_with("p2p-bad", 2, |_, c| c).await;
    let p2p = groups[0].point_to_point();
    for to in [0, 2, usize::MAX] {
        let e = p2p.send(to, 0, Bytes::new()).await.unwrap_err();
        assert!(matches!(e, GroupError::Size(_)), "to {to}: {e}");
        let e = p2p.recv(Some(to), 0).await.unwrap_err();
        assert!(matches!(e, GroupError::Size(_)), "from {to}: {e}");
    }
}
