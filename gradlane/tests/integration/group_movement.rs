//! The data movement and typed reductions (`group/movement.rs`) over real
//! QUIC on loopback: values against a local reference, uneven parts, a
//! dead rank's typed error, the monitored barrier naming who stayed away.

use crate::common;

use common::group_with;
use futures_util::future::join_all;
use gradlane::{Dtype, GroupError, TypedOp};
use std::time::Duration;

/// Rank `r`'s part for rank `to`: `r + to + 1` bytes, each naming both.
fn part(r: usize, to: usize) -> Vec<u8> {
    vec![(16 * r + to) as u8; r + to + 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gather_scatter_and_all_to_all_move_uneven_parts() {
    let world = 3;
    let mut groups = group_with("movement", world, |_, c| c).await;

    // Gather to rank 1: every rank's input, in rank order, on rank 1 only.
    let got = join_all(
        groups
            .iter_mut()
            .enumerate()
            .map(|(r, g)| async move { g.gather(1, &part(r, 1)).await.unwrap() }),
    )
    .await;
    assert!(got[0].is_empty() && got[2].is_empty());
    let want: Vec<Vec<u8>> = (0..world).map(|r| part(r, 1)).collect();
    assert_eq!(got[1].iter().map(|b| b.to_vec()).collect::<Vec<_>>(), want);

    // Scatter from rank 2: only the root's parts count.
    let got = join_all(groups.iter_mut().enumerate().map(|(r, g)| async move {
        let parts: Vec<Vec<u8>> = (0..world).map(|to| part(r, to)).collect();
        let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let inputs = if r == 2 { &parts[..] } else { &[] };
        g.scatter(2, inputs).await.unwrap()
    }))
    .await;
    for (to, got) in got.iter().enumerate() {
        assert_eq!(got.to_vec(), part(2, to));
    }

    // All-to-all: rank `to` gets every rank's part for it.
    let got = join_all(groups.iter_mut().enumerate().map(|(r, g)| async move {
        let parts: Vec<Vec<u8>> = (0..world).map(|to| part(r, to)).collect();
        let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        g.all_to_all(&parts).await.unwrap()
    }))
    .await;
    for (to, got) in got.iter().enumerate() {
        let want: Vec<Vec<u8>> = (0..world).map(|r| part(r, to)).collect();
        assert_eq!(got.iter().map(|b| b.to_vec()).collect::<Vec<_>>(), want);
    }

    // A wrong number of parts is refused before anything is sent.
    match groups[0].all_to_all(&[&[1u8][..]]).await {
        Err(GroupError::Size(_)) => {}
        other => panic!("expected a size error, got {other:?}"),
    }
}

fn le_bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_reductions_are_exact_in_their_own_type() {
    let world = 3;
    let mut groups = group_with("typed", world, |_, c| c).await;
    // int64 sums that wrap, over an odd count (uneven shards).
    let ints = |r: usize| -> Vec<i64> {
        (0..7)
            .map(|i| {
                if i == 0 {
                    i64::MAX
                } else {
                    (r as i64 + 1) * (1 << 40) * i - 3
                }
            })
            .collect()
    };
    let want: Vec<i64> = (0..7)
        .map(|i| (0..world).fold(0i64, |a, r| a.wrapping_add(ints(r)[i])))
        .collect();
    let got = join_all(groups.iter_mut().enumerate().map(|(r, g)| async move {
        let mut buf = le_bytes(&ints(r));
        g.allreduce_typed(&mut buf, Dtype::I64, TypedOp::Sum)
            .await
            .unwrap();
        buf
    }))
    .await;
    for buf in &got {
        assert_eq!(buf, &le_bytes(&want));
    }

    // float64 in rank order: 1e16 + 1 + 1 keeps the ones f32 would lose.
    let floats = |r: usize| vec![if r == 0 { 1e16f64 } else { 1.0 }, 0.1 * r as f64];
    let want: Vec<f64> = (0..2)
        .map(|i| (1..world).fold(floats(0)[i], |a, r| a + floats(r)[i]))
        .collect();
    // A reduce to rank 2: the others' buffers stay as they were.
    let got = join_all(groups.iter_mut().enumerate().map(|(r, g)| async move {
        let mut buf = le_bytes(&floats(r));
        g.reduce(2, &mut buf, Dtype::F64, TypedOp::Sum)
            .await
            .unwrap();
        buf
    }))
    .await;
    assert_eq!(got[2], le_bytes(&want));
    assert_eq!(got[0], le_bytes(&floats(0)));

    // Reduce-scatter of int32 with max.
    let got = join_all(groups.iter_mut().enumerate().map(|(r, g)| async move {
        let input: Vec<i32> = (0..6)
            .map(|i| (i * 10 + r as i32) * if i % 2 == 0 { 1 } else { -1 })
            .collect();
        let mut out = vec![0u8; 2 * 4];
        g.reduce_scatter_typed(&le_bytes(&input), &mut out, Dtype::I32, TypedOp::Max)
            .await
            .unwrap();
        out
    }))
    .await;
    assert_eq!(got[0], le_bytes(&[2i32, -10]));
    assert_eq!(got[2], le_bytes(&[42i32, -50]));

    // A bitwise op on floats is refused before anything is sent, and the
    // group goes on.
    let mut buf = le_bytes(&[1f32]);
    match groups[0]
        .allreduce_typed(&mut buf, Dtype::F32, TypedOp::BAnd)
        .await
    {
        Err(GroupError::Unsupported(m)) => assert!(m.contains("BAND"), "{m}"),
        other => panic!("expected an unsupported op, got {other:?}"),
    }
    join_all(groups.iter_mut().map(|g| g.barrier()))
        .await
        .into_iter()
        .for_each(|r| r.unwrap());
}

/// A rank that dies (its runtime stops) before an all-to-all: the others'
/// call fails naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_rank_fails_an_all_to_all_naming_it() {
    let mut groups = group_with("movement-dead", 3, |_, c| c).await;
    let dead = groups.pop().unwrap();
    // Dropped without close: its connections go away as a crash's would.
    drop(dead);
    let got = join_all(groups.iter_mut().map(|g| async move {
        let parts: Vec<&[u8]> = vec![&[1u8][..]; 3];
        g.all_to_all(&parts).await
    }))
    .await;
    for r in got {
        match r {
            Err(GroupError::Rank { rank: 2, .. }) => {}
            other => panic!("expected an error naming rank 2, got {other:?}"),
        }
    }
}

/// Rank 2 never comes to the monitored barrier: rank 0's call names it
/// at the barrier's own timeout, and rank 1, which would wait longer,
/// fails with rank 0's giving up, which names that timeout too (not the
/// group's collective timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitored_barrier_names_the_rank_that_did_not_come() {
    let mut groups = group_with("monitored", 3, |_, c| c).await;
    let timeout = Duration::from_millis(500);
    // Everyone comes first: it passes.
    join_all(groups.iter_mut().map(|g| g.monitored_barrier(timeout)))
        .await
        .into_iter()
        .for_each(|r| r.unwrap());
    let started = std::time::Instant::now();
    let (first, _absent) = groups.split_at_mut(2);
    let (a, b) = first.split_at_mut(1);
    let (r0, r1) = tokio::join!(
        a[0].monitored_barrier(timeout),
        b[0].monitored_barrier(timeout * 20)
    );
    match r0 {
        Err(GroupError::Timeout {
            missing, waited, ..
        }) => {
            assert_eq!(missing, vec![2]);
            assert_eq!(waited, timeout);
        }
        other => panic!("expected a timeout naming rank 2, got {other:?}"),
    }
    match r1 {
        Err(e @ GroupError::Rank { rank: 0, .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("rank 0 gave up: monitored_barrier waited past its timeout (500ms)"),
                "{text}"
            );
        }
        other => panic!("expected rank 0's giving up, got {other:?}"),
    }
    assert!(started.elapsed() < timeout + Duration::from_secs(5));
}

/// What each rank sends is what the algorithm says, within headers: a
/// reduce sends (N-1)/N of the buffer from every rank to the shards'
/// owners and each owner's shard to the root alone (the root sends no
/// shard back); a gather sends each input to the root once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reduce_and_gather_send_what_their_algorithms_say() {
    let world = 3;
    let mut groups = group_with("movement-bytes", world, |_, c| c).await;
    let n = 6 << 20; // bytes: 786,432 int64 values, shards of 2 MiB
    let before: Vec<u64> = groups.iter().map(common::bytes_not_lost).collect();
    join_all(groups.iter_mut().map(|g| async move {
        let mut buf = vec![1u8; n];
        g.reduce(0, &mut buf, Dtype::I64, TypedOp::Sum)
            .await
            .unwrap();
    }))
    .await;
    let shard = (n / world) as f64;
    for (r, g) in groups.iter().enumerate() {
        let sent = (common::bytes_not_lost(g) - before[r]) as f64;
        // Two shards to their owners; a non-root's reduced shard to root.
        let bound = shard * if r == 0 { 2.0 } else { 3.0 };
        // Headers, and on two loaded cores the retransmissions of packets
        // quinn has not declared lost yet: up to a quarter more.
        assert!(
            sent >= bound && sent <= 1.25 * bound,
            "reduce: rank {r} sent {sent} bytes, bound {bound}"
        );
    }
    let before: Vec<u64> = groups.iter().map(common::bytes_not_lost).collect();
    join_all(groups.iter_mut().map(|g| async move {
        g.gather(1, &vec![2u8; n]).await.unwrap();
    }))
    .await;
    for (r, g) in groups.iter().enumerate() {
        let sent = (common::bytes_not_lost(g) - before[r]) as f64;
        // The root sends no data, only acknowledgements.
        let (low, high) = match r {
            1 => (0.0, n as f64 / 4.0),
            _ => (n as f64, 1.25 * n as f64),
        };
        assert!(
            sent >= low && sent <= high,
            "gather: rank {r} sent {sent} bytes, expected {low}..{high}"
        );
    }
    join_all(groups.into_iter().map(|g| g.close())).await;
}
