//! Groups whose ranks have several sockets: each pair of ranks gets
//! several paths (connections), the exact collectives stripe their
//! messages over them and still end bit for bit as on one path; a path
//! that dies fails the collective with the peer's name; 32 ranks form a
//! group on loopback.

use crate::common;

use crate::group_differentiated::important_parts_arrived;
use common::{
    allreduce_all, bits, cert_dir, differentiated, group_configured, join_ranks, reference_sum,
    register_all, values_from,
};
use futures_util::future::join_all;
use gradlane::{
    paths_per_peer, BucketOptions, Faults, Group, GroupConfig, GroupError, Layout, LossRecovery,
    LossyCarrier, ReduceOp, TensorSpec,
};
use std::time::Duration;

/// `world` ranks, rank `r` with `sockets(r)` sockets.
async fn group_of(tag: &str, world: usize, sockets: impl Fn(usize) -> usize) -> Vec<Group> {
    group_configured(tag, world, |r, c| GroupConfig {
        sockets: sockets(r),
        ..c
    })
    .await
}

/// Rank `rank`'s values for the round `salt`.
fn values(rank: usize, n: usize, salt: u64) -> Vec<f32> {
    values_from(7000 + salt * 100 + rank as u64, n)
}

/// Allreduce (sum), broadcast and allgather of `n` values on every rank:
/// each result checked bit for bit against the local reference.
async fn collectives_are_exact(groups: &mut [Group], n: usize, salt: u64) {
    let world = groups.len();
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| values(r, n, salt)).collect();
    let want = bits(&reference_sum(&inputs));
    let mut bufs = inputs.clone();
    allreduce_all(groups, &mut bufs, ReduceOp::Sum).await;
    for (r, b) in bufs.iter().enumerate() {
        assert!(bits(b) == want, "allreduce on rank {r}");
    }
    let mut bufs = inputs.clone();
    let calls = groups
        .iter_mut()
        .zip(bufs.iter_mut())
        .map(|(g, b)| g.broadcast(world - 1, b));
    for r in join_all(calls).await {
        r.unwrap();
    }
    for (r, b) in bufs.iter().enumerate() {
        assert!(bits(b) == bits(&inputs[world - 1]), "broadcast on rank {r}");
    }
    let mut outs = vec![vec![0f32; n * world]; world];
    let calls = groups
        .iter_mut()
        .zip(inputs.iter().zip(outs.iter_mut()))
        .map(|(g, (i, o))| g.allgather(i, o));
    for r in join_all(calls).await {
        r.unwrap();
    }
    let all: Vec<f32> = inputs.concat();
    for (r, o) in outs.iter().enumerate() {
        assert!(bits(o) == bits(&all), "allgather on rank {r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ranks_stripe_over_four_paths_and_end_bit_for_bit() {
    let mut groups = group_of("paths2", 2, |_| 4).await;
    for g in &groups {
        let peer = 1 - g.rank();
        assert_eq!(g.path_connections(peer).len(), 4);
        assert_eq!(g.endpoints().count(), 4);
    }
    let before: Vec<Vec<u64>> = groups[0]
        .path_connections(1)
        .iter()
        .map(|c| vec![c.stats().udp_tx.bytes])
        .collect();
    // 4 MB a rank: pieces of 1 MB on each path.
    collectives_are_exact(&mut groups, 1 << 20, 1).await;
    // Every path carried its share of the large messages.
    for (i, c) in groups[0].path_connections(1).iter().enumerate() {
        let sent = c.stats().udp_tx.bytes - before[i][0];
        assert!(sent > 500_000, "path {i} sent {sent} bytes");
    }
    // Small messages stay whole on the first path, and still arrive.
    collectives_are_exact(&mut groups, 10, 2).await;
    for g in groups {
        g.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_ranks_share_their_sockets_and_ranks_that_differ_agree() {
    // Ranks 0-2 offer 4 sockets (2 paths a peer), rank 3 only 1: its
    // pairs use one path, the others two.
    let world = 4;
    let sockets = |r: usize| if r == 3 { 1 } else { 4 };
    let mut groups = group_of("paths4", world, sockets).await;
    for g in &groups {
        for peer in (0..world).filter(|&p| p != g.rank()) {
            let want =
                paths_per_peer(sockets(g.rank()), world).min(paths_per_peer(sockets(peer), world));
            assert_eq!(
                g.path_connections(peer).len(),
                want,
                "{} to {peer}",
                g.rank()
            );
        }
    }
    collectives_are_exact(&mut groups, 300_000, 3).await;
    for g in groups {
        g.close().await;
    }
}

/// A path closed under a collective: both ends of it fail with a
/// [`GroupError::Rank`] naming the other, and nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_dies_fails_the_collective_naming_the_peer() {
    let mut groups = group_of("pathdies", 2, |_| 3).await;
    let n = 1 << 20;
    let doomed = groups[1].path_connections(0)[2].clone();
    let mut bufs: Vec<Vec<f32>> = (0..2).map(|r| values(r, n, 4)).collect();
    let calls = groups
        .iter_mut()
        .zip(bufs.iter_mut())
        .map(|(g, b)| g.allreduce(b, ReduceOp::Sum));
    doomed.close(0u32.into(), b"test closes one path");
    let results = tokio::time::timeout(Duration::from_secs(30), join_all(calls))
        .await
        .expect("a dead path must not hang the collective");
    for (r, got) in results.into_iter().enumerate() {
        match got {
            Err(GroupError::Rank { rank, .. }) => assert_eq!(rank, 1 - r),
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

/// The differentiated allreduce over ranks with several paths, at 30%
/// loss: its rounds keep to the first path, its exact return is striped,
/// and every rank ends with the same bits, every important byte in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_differentiated_allreduce_keeps_its_promises_over_several_paths() {
    let world = 2;
    let mut groups = group_configured("pathsdiff", world, |r, mut c| {
        c.sockets = 4;
        // Ethernet-sized packets: the seeded draws must meet many packets.
        c.link.packets = gradlane::Packets::Ethernet;
        // At 30% loss each way a probe and its ack both get through only
        // half the time, and QUIC doubles its probe timeout at each miss:
        // on a loaded machine (a wide RTT variance) both ends of a path
        // can fall silent for over 15 s and still recover.
        c.link.quic.max_idle_timeout = Some(Duration::from_secs(60));
        c.link.timing.lossy_carrier = LossyCarrier::Datagrams;
        c.link.faults = Some(Faults {
            loss_out: 0.3,
            seed: 99 + r as u64,
            ..Faults::default()
        });
        c
    })
    .await;
    assert_eq!(groups[0].path_connections(1).len(), 4);
    let layout = Layout::new(vec![
        TensorSpec::conv2d("conv", [64, 64, 3, 3]),
        TensorSpec::dense("fc", [256, 1024]),
    ])
    .unwrap();
    let options = BucketOptions {
        recovery: LossRecovery::ZeroFill,
        ..BucketOptions::default()
    };
    let id = register_all(&mut groups, &layout, options).await;
    let n = layout.total_values() as usize;
    let mut lost = 0;
    for step in 0..3u64 {
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| values(r, n, 10 + step)).collect();
        let (bufs, reports) = differentiated(&mut groups, id, &inputs, ReduceOp::Sum).await;
        assert!(
            bits(&bufs[0]) == bits(&bufs[1]),
            "step {step}: replicas differ"
        );
        important_parts_arrived(&reports);
        lost += reports.iter().map(|rep| rep.lost.len()).sum::<usize>();
    }
    assert!(lost > 0, "at 30% loss some lossy chunks were lost");
    for g in groups {
        g.close().await;
    }
}

/// 32 ranks in one process form a group on loopback and allreduce bit for
/// bit; with 2 sockets each, every pair has one path and every rank 31
/// connections (the sockets are shared among the peers, not multiplied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_ranks_form_a_group_and_allreduce_bit_for_bit() {
    let world = 32;
    let mut groups = group_configured("paths32", world, |_, mut c| {
        c.sockets = 2;
        c.join_timeout = Duration::from_secs(60);
        c.link.quic.max_idle_timeout = Some(Duration::from_secs(30));
        c
    })
    .await;
    for g in &groups {
        let paths: usize = (0..world).map(|p| g.path_connections(p).len()).sum();
        assert_eq!(paths, world - 1);
    }
    collectives_are_exact(&mut groups, 4096, 5).await;
    join_all(groups.into_iter().map(Group::close)).await;
}

/// A group under a port range: every socket of every rank (the root's
/// given port, the others' any-port listen addresses, the further
/// sockets) is bound inside it, and a range with no free port is a clear
/// error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_socket_comes_from_the_port_range_and_an_exhausted_range_says_so() {
    use gradlane::PortRange;
    let world = 3;
    // Three ranks of four sockets (two paths a peer): twelve ports. The range starts at the root's
    // port (free a moment ago) and leaves room for ports other programs hold.
    let root = common::free_port();
    let range = PortRange::new(root.port(), root.port().saturating_add(63)).unwrap();
    let dir = cert_dir("port-range");
    let groups = join_ranks((0..world).map(|r| {
        let mut c = common::group_config(&dir, r, world, common::at_root(root));
        c.sockets = 4;
        c.port_range = Some(range);
        c
    }))
    .await;
    let mut ports = Vec::new();
    for g in &groups {
        for e in g.endpoints() {
            ports.push(e.local_addr().unwrap().port());
        }
    }
    assert_eq!(ports.len(), world * 4, "{ports:?}");
    assert!(
        ports.iter().all(|&p| range.contains(p)),
        "{ports:?} outside {range}"
    );
    join_all(groups.into_iter().map(|g| g.close())).await;

    // A range of one port that another socket holds.
    let held = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let mut c = common::group_config(&dir, 1, 2, common::at_root(common::free_port()));
    c.port_range = Some(PortRange::new(port, port).unwrap());
    match Group::join(c).await {
        Err(e @ GroupError::Setup(_)) => {
            let text = e.to_string();
            assert!(
                text.contains(&format!(
                    "no free UDP port on 127.0.0.1 in the port range {port}-{port}"
                )),
                "{text}"
            );
        }
        other => panic!("joined without a free port: {other:?}"),
    }
}
