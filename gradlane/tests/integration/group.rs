//! Groups of ranks over real QUIC on loopback: forming the mesh, the exact
//! collectives against a local reference, bit for bit, the sparse
//! allgather, and ranks that fail.

use crate::common;

use common::{
    allreduce_all, at_root, barrier_all, bits, bytes_not_lost, cert_dir, free_port, group_config,
    group_configured, group_with, join_ranks, reference_sum_from_zero, values_from,
};
use futures_util::future::join_all;
use gradlane::{
    Group, GroupConfig, GroupError, ReduceOp, Rendezvous, SparseAllgather, SparsePath, SparseRows,
};
use gradlane_core::rng::SplitMix64;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// `world` ranks of one group, meeting at rank 0.
async fn group(tag: &str, world: usize) -> Vec<Group> {
    group_with(tag, world, |_, c| c).await
}

/// `world` ranks of one group, each told every rank's address.
async fn group_by_addresses(tag: &str, world: usize) -> Vec<Group> {
    let addrs: Vec<SocketAddr> = (0..world).map(|_| free_port()).collect();
    group_configured(tag, world, |_, c| GroupConfig {
        rendezvous: Rendezvous::Addresses(addrs.clone()),
        ..c
    })
    .await
}

fn config(dir: &Path, rank: usize, world: usize, root: SocketAddr) -> GroupConfig {
    group_config(dir, rank, world, at_root(root))
}

/// Rank `rank`'s values (seeded by `rank`).
fn values(rank: usize, n: usize) -> Vec<f32> {
    values_from(1000 + rank as u64, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_collectives_equal_a_local_reference_bit_for_bit() {
    for world in [3usize, 4] {
        // Both ways of meeting: every address known, or rank 0's only.
        let mut groups = match world {
            3 => group_by_addresses("exact3", world).await,
            _ => group(&format!("exact{world}"), world).await,
        };
        for n in [0usize, 1, 7, 1000] {
            let inputs: Vec<Vec<f32>> = (0..world).map(|r| values(r, n)).collect();
            let sum = reference_sum_from_zero(&inputs);
            let mean: Vec<f32> = sum.iter().map(|v| v / world as f32).collect();

            // allreduce, sum and mean
            for (op, want) in [(ReduceOp::Sum, &sum), (ReduceOp::Mean, &mean)] {
                let mut bufs = inputs.clone();
                allreduce_all(&mut groups, &mut bufs, op).await;
                for (r, b) in bufs.iter().enumerate() {
                    assert_eq!(
                        bits(b),
                        bits(want),
                        "allreduce {op:?} n {n} world {world} rank {r}"
                    );
                }
            }

            // broadcast from rank 1
            let mut bufs = inputs.clone();
            let calls = groups
                .iter_mut()
                .zip(bufs.iter_mut())
                .map(|(g, b)| g.broadcast(1, b));
            for r in join_all(calls).await {
                r.unwrap();
            }
            for b in &bufs {
                assert_eq!(bits(b), bits(&inputs[1]), "broadcast n {n}");
            }

            // allgather
            let mut outs = vec![vec![0f32; n * world]; world];
            let calls = groups
                .iter_mut()
                .zip(outs.iter_mut())
                .zip(&inputs)
                .map(|((g, o), i)| g.allgather(i, o));
            for r in join_all(calls).await {
                r.unwrap();
            }
            let want: Vec<f32> = inputs.concat();
            for o in &outs {
                assert_eq!(bits(o), bits(&want), "allgather n {n}");
            }

            // reduce-scatter: every rank's input is `world` parts of n
            let big: Vec<Vec<f32>> = (0..world).map(|r| values(r + 10, n * world)).collect();
            let full = reference_sum_from_zero(&big);
            let mut outs = vec![vec![0f32; n]; world];
            let calls = groups
                .iter_mut()
                .zip(outs.iter_mut())
                .zip(&big)
                .map(|((g, o), i)| g.reduce_scatter(i, o, ReduceOp::Sum));
            for r in join_all(calls).await {
                r.unwrap();
            }
            for (r, o) in outs.iter().enumerate() {
                assert_eq!(
                    bits(o),
                    bits(&full[r * n..(r + 1) * n]),
                    "reduce-scatter n {n} rank {r}"
                );
            }
        }
        barrier_all(&mut groups).await;
        join_all(groups.into_iter().map(|g| g.close())).await;
    }
}

/// Each rank sends about 2 (N-1) / N of the buffer per allreduce: at most
/// 1.1 times that, from quinn's counters less what was resent (QUIC's
/// headers and acknowledgements are the rest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allreduce_sends_two_n_minus_one_over_n_of_the_buffer() {
    let world = 4;
    let mut groups = group("bytes", world).await;
    let n = 4 << 20; // 16 MiB of f32
    let mut bufs: Vec<Vec<f32>> = (0..world).map(|r| values(r, n)).collect();
    let before: Vec<u64> = groups.iter().map(bytes_not_lost).collect();
    allreduce_all(&mut groups, &mut bufs, ReduceOp::Sum).await;
    let bound = 2.0 * (world - 1) as f64 / world as f64 * (n * 4) as f64;
    for (r, g) in groups.iter().enumerate() {
        let sent = (bytes_not_lost(g) - before[r]) as f64;
        assert!(
            sent >= bound && sent <= 1.1 * bound,
            "rank {r} sent {sent} bytes, bound {bound}"
        );
    }
    join_all(groups.into_iter().map(|g| g.close())).await;
}

/// An allreduce whose shards are several chunks of its pipeline (and not a
/// whole number of them, nor equal), in f32, bf16 and as a mean: every
/// rank ends with the rank-order reference, bit for bit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_allreduce_equals_the_reference_bit_for_bit() {
    let world = 3;
    let mut groups = group("pipelined", world).await;
    let n = 3 * (700 << 10) + 5; // shards of 2.7 MiB of f32, uneven
    let parts: Vec<Vec<f32>> = (0..world).map(|r| values(r, n)).collect();
    let want = reference_sum_from_zero(&parts);
    for op in [ReduceOp::Sum, ReduceOp::Mean] {
        let mut bufs = parts.clone();
        allreduce_all(&mut groups, &mut bufs, op).await;
        let want: Vec<f32> = match op {
            ReduceOp::Mean => want.iter().map(|v| v / world as f32).collect(),
            _ => want.clone(),
        };
        for (r, b) in bufs.iter().enumerate() {
            assert!(bits(b) == bits(&want), "{op:?}: rank {r} differs");
        }
    }
    // bf16: summed in f32 from the rounded inputs, rounded once.
    let halves: Vec<Vec<gradlane::bf16>> = parts
        .iter()
        .map(|p| p.iter().map(|&v| gradlane::bf16::from_f32(v)).collect())
        .collect();
    let widened: Vec<Vec<f32>> = halves
        .iter()
        .map(|p| p.iter().map(|v| v.to_f32()).collect())
        .collect();
    let want: Vec<u16> = reference_sum_from_zero(&widened)
        .iter()
        .map(|&v| gradlane::bf16::from_f32(v).to_bits())
        .collect();
    let mut bufs = halves.clone();
    allreduce_all(&mut groups, &mut bufs, ReduceOp::Sum).await;
    for (r, b) in bufs.iter().enumerate() {
        let got: Vec<u16> = b.iter().map(|v| v.to_bits()).collect();
        assert!(got == want, "bf16: rank {r} differs");
    }
    join_all(groups.into_iter().map(|g| g.close())).await;
}

fn sparse(rank: usize, count: usize, height: u64, width: usize) -> SparseRows {
    let mut rng = SplitMix64::new(77 + rank as u64);
    SparseRows {
        height,
        width,
        rows: (0..count).map(|_| rng.next_u64() % height).collect(),
        values: (0..count * width).map(|_| rng.next_f64() as f32).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sparse_allgather_negotiates_its_path_from_the_counts() {
    let world = 3;
    let mut groups = group("sparse", world).await;
    let cases = [
        (
            vec![5usize, 5, 5],
            SparseAllgather::Allgatherv,
            SparsePath::EqualCounts,
            3,
        ),
        (
            vec![2usize, 0, 9],
            SparseAllgather::Allgatherv,
            SparsePath::Allgatherv,
            2,
        ),
        (
            vec![4usize, 1, 3],
            SparseAllgather::BroadcastInOrder,
            SparsePath::BroadcastInOrder,
            2,
        ),
    ];
    for (counts, unequal, path, messages_per_peer) in cases {
        let mine: Vec<SparseRows> = counts
            .iter()
            .enumerate()
            .map(|(r, &c)| sparse(r, c, 50, 3))
            .collect();
        let calls = groups
            .iter_mut()
            .zip(&mine)
            .map(|(g, m)| g.sparse_allgather(m, unequal));
        let results: Vec<_> = join_all(calls)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        let want = SparseRows {
            height: 50,
            width: 3,
            rows: mine.iter().flat_map(|m| m.rows.clone()).collect(),
            values: mine.iter().flat_map(|m| m.values.clone()).collect(),
        };
        for (r, (got, report)) in results.iter().enumerate() {
            assert_eq!(got, &want, "{path:?} rank {r}");
            assert_eq!(report.path, path);
            assert_eq!(
                report.counts,
                counts.iter().map(|&c| c as u64).collect::<Vec<_>>()
            );
            // Phase 1 and phase 2, per other rank.
            assert_eq!(
                report.messages_sent,
                messages_per_peer * (world as u64 - 1),
                "{path:?}"
            );
        }
        // Duplicate rows summed, the same bits on every rank.
        let summed: Vec<SparseRows> = results.iter().map(|(g, _)| g.sum_duplicates()).collect();
        assert!(summed.iter().all(|s| s == &summed[0]));
        let mut rows = summed[0].rows.clone();
        rows.dedup();
        assert_eq!(rows, summed[0].rows, "each row once");
    }
    join_all(groups.into_iter().map(|g| g.close())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_that_never_joins_is_named() {
    let dir = cert_dir("missing");
    let root = free_port();
    let mut c0 = config(&dir, 0, 3, root);
    let mut c1 = config(&dir, 1, 3, root);
    c0.join_timeout = Duration::from_secs(2);
    c1.join_timeout = Duration::from_secs(2);
    let (g0, _g1) = tokio::join!(Group::join(c0), Group::join(c1));
    match g0 {
        Err(GroupError::Missing { missing, .. }) => assert_eq!(missing, vec![2]),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_out_of_step_is_named() {
    let mut groups = group("step", 2).await;
    let mut buf = vec![1f32; 4];
    let (g0, g1) = groups.split_at_mut(1);
    let (a, _b) = tokio::join!(g0[0].barrier(), g1[0].broadcast(1, &mut buf));
    match a {
        Err(GroupError::OutOfStep { rank: 1, .. }) => {}
        other => panic!("{other:?}"),
    }
}

/// A rank that dies in the middle of an allreduce (its runtime stops: no
/// close, no more packets): every other rank's call fails, naming it,
/// within the links' idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_killed_mid_allreduce_is_named_by_the_others() {
    killed_mid_allreduce("killed", 1 << 16).await;
}

/// The same in a pipelined allreduce (shards of 4 MiB): the others' calls
/// end at the first failure, though their pipelines wait for parts of the
/// dead rank's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_killed_mid_pipelined_allreduce_is_named_by_the_others() {
    killed_mid_allreduce("killed-pipelined", 3 << 20).await;
}

async fn killed_mid_allreduce(tag: &str, n: usize) {
    let world = 3;
    let dir = cert_dir(tag);
    let root = free_port();
    // Rank 2 lives in a runtime of its own, to be stopped at once.
    let (joined_tx, joined_rx) = tokio::sync::oneshot::channel();
    let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
    let c2 = config(&dir, 2, world, root);
    let killed = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let g = rt.block_on(Group::join(c2)).unwrap();
        let _ = joined_tx.send(());
        let _ = die_rx.recv();
        rt.shutdown_background();
        std::mem::forget(g);
    });
    let (g0, g1) = tokio::join!(
        Group::join(config(&dir, 0, world, root)),
        Group::join(config(&dir, 1, world, root))
    );
    let (mut g0, mut g1) = (g0.unwrap(), g1.unwrap());
    joined_rx.await.unwrap();
    die_tx.send(()).unwrap();
    killed.join().unwrap();
    let (mut a, mut b) = (values(0, n), values(1, n));
    let started = std::time::Instant::now();
    let (ra, rb) = tokio::join!(
        g0.allreduce(&mut a, ReduceOp::Sum),
        g1.allreduce(&mut b, ReduceOp::Sum)
    );
    for r in [ra, rb] {
        match r {
            Err(GroupError::Rank { rank: 2, .. }) => {}
            other => panic!("expected an error naming rank 2, got {other:?}"),
        }
    }
    // quick()'s idle timeout is 3 s.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

/// A closed group frees its sockets by the time close() returns: the same
/// ranks join again on the same addresses and work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_closes_and_is_rebuilt_on_the_same_addresses() {
    let world = 3;
    let dir = cert_dir("rebuild");
    let addrs: Vec<SocketAddr> = (0..world).map(|_| free_port()).collect();
    for attempt in 0..2 {
        let mut groups = join_ranks(
            (0..world).map(|r| group_config(&dir, r, world, Rendezvous::Addresses(addrs.clone()))),
        )
        .await;
        let mut bufs: Vec<Vec<f32>> = (0..world).map(|r| values(r, 100)).collect();
        allreduce_all(&mut groups, &mut bufs, ReduceOp::Sum).await;
        assert!(
            bufs.iter().all(|b| bits(b) == bits(&bufs[0])),
            "attempt {attempt}"
        );
        join_all(groups.into_iter().map(|g| g.close())).await;
    }
}

/// Counts the warnings whose message names a socket still bound.
struct StillBound(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for StillBound {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        if *event.metadata().level() == tracing::Level::WARN && message.0.contains("still bound") {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// close() lets go of every connection before it waits for the socket, so
/// the socket is free when it returns rather than after its wait gives up
/// (a connection left held kept it bound, and every close took its whole
/// wait). One thread, so that the counting subscriber sees every task.
#[tokio::test(flavor = "current_thread")]
async fn close_frees_the_socket_before_its_wait_gives_up() {
    use tracing_subscriber::layer::SubscriberExt;
    let warned = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry().with(StillBound(warned.clone()));
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut groups = group_by_addresses("close-frees", 3).await;
    let mut bufs: Vec<Vec<f32>> = (0..3).map(|r| values(r, 100)).collect();
    allreduce_all(&mut groups, &mut bufs, ReduceOp::Sum).await;
    join_all(groups.into_iter().map(|g| g.close())).await;
    assert_eq!(warned.load(std::sync::atomic::Ordering::Relaxed), 0);
}

/// Ranks start at different times: a rank that reaches rank 0 before it
/// listens keeps trying until the join timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rank_zero_may_start_after_the_others() {
    let world = 3;
    let dir = cert_dir("late");
    let root = free_port();
    let late = async {
        // Longer than one connect attempt (5 s) of the others.
        tokio::time::sleep(std::time::Duration::from_secs(6)).await;
        Group::join(config(&dir, 0, world, root)).await
    };
    let (g0, g1, g2) = tokio::join!(
        late,
        Group::join(config(&dir, 1, world, root)),
        Group::join(config(&dir, 2, world, root))
    );
    let mut groups = vec![g0.unwrap(), g1.unwrap(), g2.unwrap()];
    barrier_all(&mut groups).await;
    join_all(groups.into_iter().map(|g| g.close())).await;
}

/// Ranks that listen on every interface (`0.0.0.0:0`, as a launcher that
/// does not know the host's addresses would) tell rank 0 the address that
/// routes to it, not the unspecified one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_listening_on_every_interface_advertise_a_reachable_address() {
    let world = 3;
    let dir = cert_dir("any-if");
    let root = free_port();
    let mut groups = join_ranks((0..world).map(|r| {
        let mut c = config(&dir, r, world, root);
        c.rendezvous = Rendezvous::Root {
            root,
            listen: "0.0.0.0:0".parse().unwrap(),
        };
        c
    }))
    .await;
    barrier_all(&mut groups).await;
    join_all(groups.into_iter().map(|g| g.close())).await;
}
