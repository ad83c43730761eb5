//! Groups that go on when ranks die ([`OnRankFailure::Continue`]): four
//! ranks over real QUIC on loopback, at 0% and 20% loss, a rank cut off
//! (its endpoint drops every datagram, as a process killed without closing
//! or a pulled cable) before, during and between collectives; the
//! survivors' results against a local reference, bit for bit; and a
//! restarted rank that rejoins.

// A binary of its own: these tests read the bytes on the wire or wait
// out failure timeouts, and other subjects' tests beside them on the
// same cores change what they measure.
#[allow(dead_code)]
#[path = "integration/common.rs"]
mod common;

use common::{
    at_root, bucket, cert_dir, free_port, group_config, inside, join_ranks, reference_sum,
    same_bits, values_from,
};
use futures_util::future::join_all;
use gradlane::{
    AllreduceReport, BucketId, Faults, Group, GroupConfig, GroupError, LossRecovery, LossyCarrier,
    OnRankFailure, ReduceOp, SparseAllgather, SparseRows,
};
use gradlane_core::rng::SplitMix64;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

const WORLD: usize = 4;

/// Four ranks that go on after a death. Every rank has the fault injector
/// (so that it can be cut off), dropping a share `loss` of what it sends.
/// A rank is dead after 5 s of silence without loss, at 20% loss after
/// 8 s: long enough that a live rank's keep-alives get through though the
/// tests of this file share two cores, short enough to run quickly.
async fn elastic_group(tag: &str, loss: f64) -> Vec<Group> {
    elastic_group_with(tag, loss, |_, _| {}).await
}

/// [`elastic_group`], each rank's configuration changed by `tweak` first.
async fn elastic_group_with(
    tag: &str,
    loss: f64,
    tweak: impl Fn(usize, &mut GroupConfig),
) -> Vec<Group> {
    logs();
    let dir = cert_dir(tag);
    let root = free_port();
    join_ranks((0..WORLD).map(|r| {
        let mut config = elastic_config(&dir, r, root, loss);
        tweak(r, &mut config);
        config
    }))
    .await
}

/// The group's log in a failing test's output (`RUST_LOG` to change it):
/// who lost whom, and what each view decided.
fn logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "gradlane::group=info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

fn elastic_config(dir: &Path, rank: usize, root: SocketAddr, loss: f64) -> GroupConfig {
    let mut c = group_config(dir, rank, WORLD, at_root(root));
    c.on_rank_failure = OnRankFailure::Continue;
    c.failure_timeout = Some(Duration::from_secs(if loss > 0.0 { 8 } else { 5 }));
    c.link.packets = gradlane::Packets::Ethernet;
    if loss > 0.0 {
        c.link.timing.lossy_carrier = LossyCarrier::Datagrams;
    }
    c.link.faults = Some(Faults {
        loss_out: loss,
        seed: 77 + rank as u64,
        ..Faults::default()
    });
    c
}

/// Rank `rank`'s values at step `step`.
fn values(rank: usize, step: usize, n: usize) -> Vec<f32> {
    values_from(1000 * step as u64 + rank as u64, n)
}

/// The mean the owners compute: the sum in rank order from the first
/// rank's value, divided by the number of ranks summed.
fn mean_of<P: AsRef<[f32]>>(parts: &[P]) -> Vec<f32> {
    let k = parts.len() as f32;
    reference_sum(parts).into_iter().map(|v| v / k).collect()
}

/// Cuts a rank off: from now on its endpoint drops every datagram both
/// ways. It stays alive (not dropped, so it closes nothing), as a killed
/// process's connections do until they time out.
fn cut_off(g: &Group) {
    assert!(g.endpoint().sever(true), "the fault injector is on");
}

/// One exact allreduce (mean) on each of `groups` with `inputs`: the
/// results and buffers after it.
async fn allreduce_mean(
    groups: &mut [&mut Group],
    inputs: &[Vec<f32>],
) -> Vec<(Result<(), GroupError>, Vec<f32>)> {
    let mut bufs = inputs.to_vec();
    let calls = groups
        .iter_mut()
        .zip(bufs.iter_mut())
        .map(|(g, b)| g.allreduce(b, ReduceOp::Mean));
    let results = join_all(calls).await;
    results.into_iter().zip(bufs).collect()
}

/// One exact allreduce (mean) on `groups`, ranks `first` and on, each
/// with its of `inputs`: asserts that each succeeds and ends with the
/// mean, bit for bit.
async fn mean_among(groups: &mut [Group], inputs: &[Vec<f32>], first: usize, what: &str) {
    let mut alive: Vec<&mut Group> = groups.iter_mut().collect();
    let out = allreduce_mean(&mut alive, inputs).await;
    let want = mean_of(inputs);
    for (r, (res, buf)) in out.iter().enumerate() {
        let rank = first + r;
        assert!(res.is_ok(), "{what}, rank {rank}: {res:?}");
        same_bits(buf, &want, &format!("{what}, rank {rank}"));
    }
}

/// Asserts a cut-off rank's collective ended with the error that it is
/// out of the group.
#[track_caller]
fn is_out(r: &Result<(), GroupError>) {
    match r {
        Err(GroupError::NoQuorum { .. } | GroupError::Removed { .. }) => {}
        other => panic!("expected the rank to be out of the group, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_killed_between_collectives_leaves_the_mean_of_the_survivors() {
    for (i, loss) in [0.0, 0.2].into_iter().enumerate() {
        let mut groups = elastic_group(&format!("elastic-between{i}"), loss).await;
        let n = 20_000;
        // All four first.
        let inputs: Vec<Vec<f32>> = (0..WORLD).map(|r| values(r, 0, n)).collect();
        mean_among(&mut groups, &inputs, 0, &format!("loss {loss}: all four")).await;
        // Rank 3 dies; the next two collectives run among the others.
        let dead = groups.pop().unwrap();
        cut_off(&dead);
        for step in 1..3 {
            let inputs: Vec<Vec<f32>> = (0..3).map(|r| values(r, step, n)).collect();
            mean_among(&mut groups, &inputs, 0, &format!("loss {loss} step {step}")).await;
        }
        for g in &groups {
            assert_eq!(g.members(), &[0, 1, 2]);
            assert_eq!(g.epoch(), 1);
            assert_eq!((g.world(), g.members().len()), (4, 3));
        }
        drop(dead);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_killed_in_an_allreduce_costs_its_contribution_only() {
    for (i, loss) in [0.0, 0.2].into_iter().enumerate() {
        let mut groups = elastic_group(&format!("elastic-during{i}"), loss).await;
        let n = 1 << 18;
        let inputs: Vec<Vec<f32>> = (0..WORLD).map(|r| values(r, 1, n)).collect();
        // The survivors are in the allreduce when rank 3 dies (it never
        // sends its part): the mean is over the three that took part.
        let dead = groups.pop().unwrap();
        let mut alive: Vec<&mut Group> = groups.iter_mut().collect();
        let kill = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            cut_off(&dead);
        };
        let (out, ()) = tokio::join!(allreduce_mean(&mut alive, &inputs[..3]), kill);
        let want = mean_of(&inputs[..3]);
        for (r, (res, buf)) in out.iter().enumerate() {
            assert!(res.is_ok(), "loss {loss} rank {r}: {res:?}");
            same_bits(buf, &want, &format!("loss {loss}: survivors, rank {r}"));
        }
        drop(dead);

        // Killed inside its own allreduce, at some point of it: the
        // survivors end with the same bits, either the mean of all four
        // (every survivor held it) or of the three (run again), and the
        // killed rank's own call ends with the error that it is out.
        let mut groups = elastic_group(&format!("elastic-inside{i}"), loss).await;
        let mut all: Vec<&mut Group> = groups.iter_mut().collect();
        let (head, last) = all.split_at_mut(3);
        let victim: &mut Group = last[0];
        let mut bufs = inputs.clone();
        let (mine, theirs) = bufs.split_at_mut(3);
        let survivors = join_all(
            head.iter_mut()
                .zip(mine.iter_mut())
                .map(|(g, b)| g.allreduce(b, ReduceOp::Mean)),
        );
        // The victim stops where it is 30 ms into its call, and is cut off.
        let victim_run = async {
            let stopped = tokio::time::sleep(Duration::from_millis(30));
            let ended = tokio::select! {
                r = victim.allreduce(&mut theirs[0], ReduceOp::Mean) => Some(r),
                () = stopped => None,
            };
            cut_off(victim);
            ended
        };
        let (results, victim_ended) = tokio::join!(survivors, victim_run);
        for (r, res) in results.iter().enumerate() {
            assert!(res.is_ok(), "loss {loss} rank {r}: {res:?}");
            same_bits(
                &mine[r],
                &mine[0],
                &format!("loss {loss}: rank {r} against rank 0"),
            );
        }
        let four = mean_of(&inputs);
        let three = mean_of(&inputs[..3]);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(&mine[0]) == bits(&four) || bits(&mine[0]) == bits(&three),
            "loss {loss}: the survivors' result is neither mean"
        );
        if head[0].members().len() == 3 {
            // Out: its next call fails (a collective dropped midway, as
            // here, may also leave it out of step with its own links).
            assert!(!matches!(victim_ended, Some(Ok(()))) || bits(&mine[0]) == bits(&four));
            let mut buf = inputs[3].clone();
            let next = victim.allreduce(&mut buf, ReduceOp::Mean).await;
            assert!(next.is_err(), "a rank cut off went on: {next:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ranks_killed_at_once_and_the_coordinator_killed() {
    let n = 5000;
    // Ranks 2 and 3 at once: the two left are half of four with the lowest
    // rank, a quorum.
    let mut groups = elastic_group("elastic-two", 0.0).await;
    let dead: Vec<Group> = groups.drain(2..).collect();
    dead.iter().for_each(cut_off);
    let inputs: Vec<Vec<f32>> = (0..2).map(|r| values(r, 3, n)).collect();
    mean_among(&mut groups, &inputs, 0, "two killed").await;
    assert_eq!(groups[0].members(), &[0, 1]);
    drop(dead);

    // Rank 0, the coordinator of the agreement, then rank 1 in the next
    // view's: the last two go on, each time among the survivors.
    let mut groups = elastic_group("elastic-coordinator", 0.0).await;
    let first = groups.remove(0);
    cut_off(&first);
    let inputs: Vec<Vec<f32>> = (1..4).map(|r| values(r, 4, n)).collect();
    mean_among(&mut groups, &inputs, 1, "rank 0 killed").await;
    assert_eq!(groups[0].members(), &[1, 2, 3]);
    let second = groups.remove(0);
    cut_off(&second);
    let inputs: Vec<Vec<f32>> = (2..4).map(|r| values(r, 5, n)).collect();
    // Two of three: a majority of the last view.
    mean_among(&mut groups, &inputs, 2, "rank 1 killed").await;
    assert_eq!(groups[0].members(), &[2, 3]);
    assert_eq!(groups[0].epoch(), 2);
    drop((first, second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_that_dies_while_the_new_mesh_forms_is_left_out_of_the_view_after() {
    let n = 5000;
    // Rank 3 dies; rank 2 agrees on the view without it, then stops where
    // it would form that view's mesh (its acceptance out: a death any
    // earlier leaves the view abandoned by the agreement's rule). Ranks 0
    // and 1 wait for its links in vain, agree on a view without it too,
    // and finish the allreduce.
    let mut groups = elastic_group_with("elastic-remesh", 0.0, |r, c| {
        if r == 2 {
            c.stop_at_view = Some(1);
        }
    })
    .await;
    let dead = groups.pop().unwrap();
    cut_off(&dead);
    let inputs: Vec<Vec<f32>> = (0..3).map(|r| values(r, 6, n)).collect();
    let mut alive: Vec<&mut Group> = groups.iter_mut().collect();
    let out = allreduce_mean(&mut alive, &inputs).await;
    let want = mean_of(&[&inputs[0], &inputs[1]]);
    for (r, (res, buf)) in out.iter().take(2).enumerate() {
        assert!(res.is_ok(), "rank {r}: {res:?}");
        same_bits(buf, &want, &format!("died in the re-mesh, rank {r}"));
    }
    assert!(
        matches!(&out[2].0, Err(GroupError::Setup(why)) if why.contains("stop_at_view")),
        "{:?}",
        out[2].0
    );
    for g in &groups[..2] {
        assert_eq!(g.members(), &[0, 1]);
        assert_eq!(g.epoch(), 2, "view 1 lost rank 2 while forming");
    }
    // View 2's mesh is whole: the next allreduce runs on it.
    let inputs: Vec<Vec<f32>> = (0..2).map(|r| values(r, 7, n)).collect();
    mean_among(&mut groups[..2], &inputs, 0, "the view after").await;
    drop(dead);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_rank_that_comes_back_is_refused() {
    let n = 5000;
    let mut groups = elastic_group("elastic-cutoff", 0.0).await;
    // Rank 3 is cut off (a partition) while all four are in an allreduce:
    // the three go on, and rank 3, alone, stops.
    cut_off(&groups[3]);
    let inputs: Vec<Vec<f32>> = (0..WORLD).map(|r| values(r, 6, n)).collect();
    let mut all: Vec<&mut Group> = groups.iter_mut().collect();
    let out = allreduce_mean(&mut all, &inputs).await;
    let want = mean_of(&inputs[..3]);
    for (r, (res, buf)) in out.iter().take(3).enumerate() {
        assert!(res.is_ok(), "rank {r}: {res:?}");
        same_bits(buf, &want, &format!("cut off, rank {r}"));
    }
    is_out(&out[3].0);
    // The partition heals. Rank 3 comes back with its old state: refused
    // at once, never merged; the three are not disturbed.
    assert!(groups[3].endpoint().sever(false));
    let mut buf = inputs[3].clone();
    let again = groups[3].allreduce(&mut buf, ReduceOp::Mean).await;
    is_out(&again);
    assert_eq!(buf, inputs[3], "a refused rank's buffer is left as it was");
    let message = again.unwrap_err().to_string();
    assert!(message.contains("rank 3"), "{message}");
    let inputs: Vec<Vec<f32>> = (0..3).map(|r| values(r, 7, n)).collect();
    mean_among(&mut groups[..3], &inputs, 0, "after the partition healed").await;
}

/// The stated zero fill of a first round on fresh links: per value, the
/// sum in rank order of the parts that arrived at its owner, over the
/// ranks of the view.
fn zero_filled_mean(inputs: &[Vec<f32>], reports: &[AllreduceReport]) -> Vec<f32> {
    let missing = |r: usize, i: usize| reports.iter().any(|rep| inside(&rep.missing[r], i));
    (0..inputs[0].len())
        .map(|i| {
            let sum = inputs
                .iter()
                .enumerate()
                .filter(|&(r, _)| !missing(r, i))
                .fold(0f32, |acc, (_, v)| acc + v[i]);
            sum / inputs.len() as f32
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_killed_in_a_differentiated_allreduce_leaves_the_stated_zero_fill() {
    for (i, loss) in [0.0, 0.2].into_iter().enumerate() {
        let mut groups = elastic_group(&format!("elastic-diff{i}"), loss).await;
        let layout = bucket();
        let ids = join_all(
            groups
                .iter_mut()
                .map(|g| g.register_bucket(&layout, LossRecovery::ZeroFill)),
        )
        .await;
        let id: BucketId = ids.into_iter().map(|r| r.unwrap()).next_back().unwrap();
        let n = layout.total_values() as usize;
        let inputs: Vec<Vec<f32>> = (0..WORLD).map(|r| values(r, 8, n)).collect();
        // Rank 1 dies while the others are in the allreduce: its shard is
        // taken over, the view's shards cut again among three.
        let dead = groups.remove(1);
        let survivors = [0usize, 2, 3];
        let mine: Vec<Vec<f32>> = survivors.iter().map(|&r| inputs[r].clone()).collect();
        let mut bufs = mine.clone();
        let calls = groups
            .iter_mut()
            .zip(bufs.iter_mut())
            .map(|(g, b)| g.allreduce_differentiated(id, b, ReduceOp::Mean));
        let kill = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            cut_off(&dead);
        };
        let (reports, ()) = tokio::join!(join_all(calls), kill);
        let reports: Vec<AllreduceReport> = reports
            .into_iter()
            .enumerate()
            .map(|(r, rep)| rep.unwrap_or_else(|e| panic!("loss {loss} rank {r}: {e}")))
            .collect();
        for (k, buf) in bufs.iter().enumerate() {
            same_bits(
                buf,
                &bufs[0],
                &format!("loss {loss}: survivor {k} against the first"),
            );
        }
        let want = zero_filled_mean(&mine, &reports);
        same_bits(
            &bufs[0],
            &want,
            &format!("loss {loss}: the stated zero fill"),
        );
        if loss == 0.0 {
            let exact = mean_of(&mine);
            same_bits(&bufs[0], &exact, "no loss: the exact mean of the survivors");
        }
        assert_eq!(groups[0].members(), &[0, 2, 3]);
        // The next step, on the re-registered bucket among the three.
        let next: Vec<Vec<f32>> = survivors.iter().map(|&r| values(r, 9, n)).collect();
        let mut bufs = next.clone();
        let calls = groups
            .iter_mut()
            .zip(bufs.iter_mut())
            .map(|(g, b)| g.allreduce_differentiated(id, b, ReduceOp::Mean));
        for (r, rep) in join_all(calls).await.into_iter().enumerate() {
            rep.unwrap_or_else(|e| panic!("loss {loss} next step rank {r}: {e}"));
        }
        for (k, buf) in bufs.iter().enumerate() {
            same_bits(
                buf,
                &bufs[0],
                &format!("loss {loss} next step: survivor {k}"),
            );
        }
        drop(dead);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_rank_rejoins_and_the_next_allreduce_includes_it() {
    let n = 5000;
    for (i, loss) in [0.0, 0.2].into_iter().enumerate() {
        logs();
        let dir = cert_dir(&format!("elastic-rejoin{i}"));
        let root = free_port();
        let mut groups = join_ranks((0..WORLD).map(|r| elastic_config(&dir, r, root, loss))).await;
        let dead = groups.pop().unwrap();
        cut_off(&dead);
        let inputs: Vec<Vec<f32>> = (0..3).map(|r| values(r, 10, n)).collect();
        let mut alive: Vec<&mut Group> = groups.iter_mut().collect();
        for (res, _) in allreduce_mean(&mut alive, &inputs).await {
            res.unwrap();
        }
        drop(dead);

        // Rank 3 again, a new process: it asks rank 0 and waits; the three
        // train on (an allreduce a step) and admit at each step's end.
        let restarted = Group::rejoin(elastic_config(&dir, 3, root, loss));
        let members_train_on = async {
            for step in 0..100 {
                let inputs: Vec<Vec<f32>> = (0..3).map(|r| values(r, 11 + step, n)).collect();
                for (res, _) in allreduce_mean(&mut alive, &inputs).await {
                    res.unwrap();
                }
                let admitted = join_all(alive.iter_mut().map(|g| g.admit())).await;
                let admitted: Vec<Vec<usize>> = admitted.into_iter().map(|a| a.unwrap()).collect();
                assert!(admitted.iter().all(|a| *a == admitted[0]), "{admitted:?}");
                if !admitted[0].is_empty() {
                    return admitted[0].clone();
                }
            }
            panic!("loss {loss}: rank 3 was not admitted in 100 steps");
        };
        let (restarted, admitted) = tokio::join!(restarted, members_train_on);
        let mut restarted = restarted.unwrap_or_else(|e| panic!("loss {loss}: {e}"));
        assert_eq!(admitted, vec![3]);
        assert_eq!(restarted.joined(), &[3]);
        alive.push(&mut restarted);
        for g in &alive {
            assert_eq!(g.members(), &[0, 1, 2, 3]);
            assert_eq!(g.epoch(), 2);
        }
        // The next allreduce includes it.
        let inputs: Vec<Vec<f32>> = (0..WORLD).map(|r| values(r, 200, n)).collect();
        let want = mean_of(&inputs);
        for (r, (res, buf)) in allreduce_mean(&mut alive, &inputs).await.iter().enumerate() {
            assert!(res.is_ok(), "loss {loss} rank {r}: {res:?}");
            same_bits(buf, &want, &format!("loss {loss}: rejoined, rank {r}"));
        }
        assert_eq!(alive[3].contributors(), 4);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_that_is_still_a_member_cannot_rejoin() {
    logs();
    let dir = cert_dir("elastic-twice");
    let root = free_port();
    let mut groups = join_ranks((0..WORLD).map(|r| elastic_config(&dir, r, root, 0.0))).await;
    // A second process claims rank 2, alive and well.
    let impostor = Group::rejoin(elastic_config(&dir, 2, root, 0.0));
    let members_go_on = async {
        let mut alive: Vec<&mut Group> = groups.iter_mut().collect();
        for step in 0..20 {
            let inputs: Vec<Vec<f32>> = (0..WORLD).map(|r| values(r, 300 + step, 100)).collect();
            for (res, _) in allreduce_mean(&mut alive, &inputs).await {
                res.unwrap();
            }
            for a in join_all(alive.iter_mut().map(|g| g.admit())).await {
                assert_eq!(a.unwrap(), Vec::<usize>::new());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (impostor, ()) = tokio::join!(impostor, members_go_on);
    match impostor {
        Err(GroupError::Removed { why, .. }) => {
            assert!(why.contains("rank 2 is a member"), "{why}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(groups[0].members(), &[0, 1, 2, 3]);
}

/// A rank's sparse rows: `count` rows of a 40 × 3 matrix, seeded by rank
/// and step.
fn sparse_rows(rank: usize, step: usize, count: usize) -> SparseRows {
    let mut rng = SplitMix64::new(500 + 10 * step as u64 + rank as u64);
    SparseRows {
        height: 40,
        width: 3,
        rows: (0..count).map(|_| rng.next_u64() % 40).collect(),
        values: (0..count * 3).map(|_| rng.next_f64() as f32).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sparse_allgather_goes_on_with_the_survivors_rows() {
    let mut groups = elastic_group("elastic-sparse", 0.0).await;
    // Rank 3 is cut off before it calls: the others' call meets its death,
    // and ends with their own rows, in rank order, on each of them.
    let dead = groups.pop().unwrap();
    cut_off(&dead);
    for (step, unequal) in [
        SparseAllgather::Allgatherv,
        SparseAllgather::BroadcastInOrder,
    ]
    .into_iter()
    .enumerate()
    {
        let mine: Vec<SparseRows> = (0..3).map(|r| sparse_rows(r, step, 2 + r)).collect();
        let calls = groups
            .iter_mut()
            .zip(&mine)
            .map(|(g, m)| g.sparse_allgather(m, unequal));
        let want = SparseRows {
            height: 40,
            width: 3,
            rows: mine.iter().flat_map(|m| m.rows.clone()).collect(),
            values: mine.iter().flat_map(|m| m.values.clone()).collect(),
        };
        for (r, result) in join_all(calls).await.into_iter().enumerate() {
            let (got, _) = result.unwrap_or_else(|e| panic!("step {step} rank {r}: {e}"));
            assert_eq!(got, want, "step {step} rank {r}");
        }
    }
    for g in &groups {
        assert_eq!(g.members(), &[0, 1, 2]);
        assert_eq!(g.epoch(), 1);
    }
    drop(dead);
}

/// Every pair of `groups` has `paths` paths, and a striped allreduce
/// (`n` values, more than a stripe piece on each path) gives every rank the
/// mean, with bytes on every path.
async fn striped_allreduce(groups: &mut [&mut Group], paths: usize, step: usize, what: &str) {
    let members = groups[0].members().to_vec();
    for g in groups.iter() {
        for &peer in members.iter().filter(|&&p| p != g.rank()) {
            let got = g.path_connections(peer).len();
            assert_eq!(got, paths, "{what}: rank {} to {peer}", g.rank());
        }
    }
    let sent_before: Vec<Vec<u64>> = groups
        .iter()
        .map(|g| {
            let peer = members.iter().copied().find(|&p| p != g.rank()).unwrap();
            let c = g.path_connections(peer);
            c.iter().map(|c| c.stats().udp_tx.bytes).collect()
        })
        .collect();
    let n = 400_000;
    let inputs: Vec<Vec<f32>> = (0..groups.len()).map(|r| values(r, step, n)).collect();
    let want = mean_of(&inputs);
    for (r, (res, buf)) in allreduce_mean(groups, &inputs).await.iter().enumerate() {
        assert!(res.is_ok(), "{what}: rank {r}: {res:?}");
        same_bits(buf, &want, &format!("{what}: rank {r}"));
    }
    for (g, before) in groups.iter().zip(sent_before) {
        let peer = members.iter().copied().find(|&p| p != g.rank()).unwrap();
        for (path, (c, b)) in g.path_connections(peer).iter().zip(before).enumerate() {
            let moved = c.stats().udp_tx.bytes - b;
            assert!(
                moved > 100_000,
                "{what}: rank {} path {path} to {peer} sent {moved} B",
                g.rank()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_are_striped_again_after_a_death_and_after_a_rejoin() {
    logs();
    let dir = cert_dir("elastic-stripes");
    let root = free_port();
    // Four sockets a rank: two paths to each of three peers, and still
    // two to each of two.
    let config = |r| {
        let mut c = elastic_config(&dir, r, root, 0.0);
        c.sockets = 4;
        c
    };
    let mut groups = join_ranks((0..WORLD).map(config)).await;
    let mut all: Vec<&mut Group> = groups.iter_mut().collect();
    striped_allreduce(&mut all, 2, 0, "all four").await;
    let dead = groups.pop().unwrap();
    let mut alive: Vec<&mut Group> = groups.iter_mut().collect();

    for e in dead.endpoints() {
        assert!(e.sever(true), "the fault injector is on");
    }
    // The first allreduce after the death changes the view; the second
    // runs on the new view's paths.
    let inputs: Vec<Vec<f32>> = (0..3).map(|r| values(r, 1, 1000)).collect();
    for (res, _) in allreduce_mean(&mut alive, &inputs).await {
        res.unwrap();
    }
    assert!(alive.iter().all(|g| g.members() == [0, 1, 2]));
    striped_allreduce(&mut alive, 2, 2, "after the death").await;
    drop(dead);

    let restarted = Group::rejoin(config(3));
    // The members run a step (a barrier: who waits to rejoin is announced
    // at a collective's end) and admit, until the restarted rank's request
    // has come.
    let members_admit = async {
        for _ in 0..400 {
            for res in join_all(alive.iter_mut().map(|g| g.barrier())).await {
                res.unwrap();
            }
            let admitted = join_all(alive.iter_mut().map(|g| g.admit())).await;
            let admitted: Vec<Vec<usize>> = admitted.into_iter().map(|a| a.unwrap()).collect();
            if !admitted[0].is_empty() {
                return;
            }
        }
        panic!("rank 3 was not admitted");
    };
    let (restarted, ()) = tokio::join!(restarted, members_admit);
    let mut restarted = restarted.unwrap();
    alive.push(&mut restarted);
    assert!(alive.iter().all(|g| g.members() == [0, 1, 2, 3]));
    striped_allreduce(&mut alive, 2, 3, "after the rejoin").await;
}
