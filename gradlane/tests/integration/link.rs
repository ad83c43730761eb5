//! Links over real QUIC on loopback, with seeded injected loss.

use crate::common;

use common::{bit_equal, cert_dir, kernel_receive_drops, pair, quick, server};
use gradlane::{codes, presets, Congestion, Layout, Packets, TensorSpec, JUMBO_UDP_PAYLOAD};
use gradlane::{Config, DatagramSize, Endpoint, Faults, Link, LinkError, LossyCarrier, SendReport};
use std::sync::Arc;
use std::time::Duration;

/// Every round delivered, every important chunk exact, and in the first round
/// every other chunk exact or all zero; nothing unaccounted; the lossy part
/// on a stream or as datagrams as `LossyCarrier` says.
/// With the default settings, each round's important part goes on 4 lanes.
async fn rounds_under_loss(loss: f64, seed: u64) {
    let used = rounds_under_loss_with(loss, seed, quick()).await;
    assert_eq!(used, vec![4; 3]);
}

/// Returns the lanes each round's important part went on.
async fn rounds_under_loss_with(loss: f64, seed: u64, config: Config) -> Vec<usize> {
    rounds_sent_with(loss, seed, config, false).await
}

/// [`rounds_under_loss_with`], sent with `send_round` or, with `shared`,
/// with `send_round_shared`; then every shared tensor must become the
/// caller's alone again once quinn has let go of it.
async fn rounds_sent_with(loss: f64, seed: u64, mut config: Config, shared: bool) -> Vec<usize> {
    if loss == 0.0 {
        // Lossless, every lossy byte must arrive in time: give a receiver
        // starved of CPU by the other tests as long as it may wait, so
        // that a late byte is not taken for a lost one.
        config.timing.grace = config.timing.max_grace;
    }
    let adaptive = config.timing.lossy_carrier == LossyCarrier::Adaptive
        && config.timing.lossy_deadline.is_none();
    let layout = presets::resnet18();
    let faults = Faults::symmetric_loss(loss, seed);
    let (server_ep, mut server, client_ep, mut client) =
        pair(&format!("loss{seed}"), &layout, Some(faults), config).await;
    let drops_before = server_ep
        .local_addr()
        .ok()
        .and_then(kernel_receive_drops)
        .unwrap_or(0);
    let plan = layout.plan(Default::default()).unwrap();
    let mut sent_lossy_bytes = 0u64;
    let mut delivered_bytes = 0u64;
    let mut late_bytes = 0u64;
    let mut lanes = Vec::new();
    let mut on_stream = Vec::new();
    for r in 0..3u32 {
        let grads = gradlane::presets::gradients(&layout, 100 + r as u64);
        let arcs: Vec<Arc<Vec<f32>>> = match shared {
            true => grads.iter().cloned().map(Arc::new).collect(),
            false => Vec::new(),
        };
        let send = async {
            if shared {
                client.sender().send_round_shared(r, &arcs).await
            } else {
                client.sender().send_round(r, &grads).await
            }
        };
        let (report, round) = tokio::join!(send, server.receiver().recv_round());
        let (report, round) = (report.unwrap(), round.unwrap());
        assert_eq!(round.index, r);
        lanes.push(report.lanes);
        // On a stream only if asked to adapt, and then unless quinn
        // declared a packet lost since the last round started.
        if report.lossy_on_stream {
            assert!(adaptive, "round {r}");
        } else if adaptive {
            assert!(
                client.connection().stats().path.lost_packets > 0,
                "round {r}"
            );
        }
        on_stream.push(report.lossy_on_stream);
        // Datagrams at the MTU floor survive any fall of the path MTU:
        // quinn sent every datagram it was given, at any loss.
        assert_eq!(report.lossy_dropped_by_quinn, 0);
        let s = &round.stats;
        assert_eq!(s.classes[0].received_bytes, report.important_bytes);
        assert_eq!(s.classes[0].zero_filled_bytes, 0);
        sent_lossy_bytes += report.lossy_bytes.iter().sum::<u64>();
        delivered_bytes += s.lossy().received_bytes;
        late_bytes += s.lossy().late_merged_bytes;
        // Accounting: per class, sent = received + zero-filled.
        for c in &s.classes {
            assert_eq!(c.sent_bytes, c.received_bytes + c.zero_filled_bytes);
        }
        if r == 0 {
            // Chunk by chunk: important ones exact; lossy ones exact or zero
            // where bytes were lost (a chunk may straddle two datagrams).
            for (t, (got, want)) in round.tensors.iter().zip(&grads).enumerate() {
                for id in plan.tensor_chunks(t) {
                    let c = plan.chunks()[id];
                    let range = c.start as usize..(c.start + c.len) as usize;
                    let (g, w) = (&got[range.clone()], &want[range]);
                    if s.classes[0].sent_chunks > 0 && bit_equal(g, w) {
                        continue;
                    }
                    for (x, y) in g.iter().zip(w) {
                        assert!(
                            x.to_bits() == y.to_bits() || *x == 0.0,
                            "tensor {t} chunk {id}"
                        );
                    }
                }
            }
        }
    }
    // Lossy bytes: delivered in time, merged late, or lost on the wire.
    assert!(delivered_bytes + late_bytes <= sent_lossy_bytes);
    if loss > 0.0 {
        // The first round's losses put the later rounds on datagrams.
        assert_eq!(&on_stream[1..], [false, false]);
    }
    if loss == 0.0 {
        // No loss injected: every lossy byte arrives in time, but for what
        // the kernel dropped at the receiver's socket (a batch of packets
        // at most, up to 64 KiB, for each drop it counts).
        let missing = sent_lossy_bytes - delivered_bytes;
        if missing > 0 {
            let drops = server_ep
                .local_addr()
                .ok()
                .and_then(kernel_receive_drops)
                .unwrap_or(0)
                .saturating_sub(drops_before);
            assert!(
                missing <= drops * 65_536,
                "{missing} of {sent_lossy_bytes} lossy bytes missing, {drops} packets \
                 dropped by the kernel"
            );
            eprintln!("{missing} lossy bytes missing, {drops} packets dropped by the kernel");
        }
        // Every datagram quinn received was read by the link.
        assert_eq!(server.receiver().datagrams_dropped_by_quinn(), 0);
    } else {
        let stats = client_ep.fault_stats().unwrap();
        assert!(stats.segments_dropped_out > 0, "{stats:?}");
    }
    if shared {
        // quinn drops its views of the last round's tensors once the peer
        // acknowledged them: well within the deadline on loopback.
        let grads = gradlane::presets::gradients(&layout, 102);
        let arcs: Vec<Arc<Vec<f32>>> = grads.into_iter().map(Arc::new).collect();
        let (report, round) = tokio::join!(
            client.sender().send_round_shared(3, &arcs),
            server.receiver().recv_round()
        );
        report.unwrap();
        assert_eq!(round.unwrap().index, 3);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while arcs.iter().any(|a| Arc::strong_count(a) > 1) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "quinn still holds views of the tensors"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    client.close_now();
    lanes
}

/// Rounds sent from shared tensors (important runs as views, no copy)
/// meet every guarantee of copied ones, lossless and at 5% loss, and the
/// tensors come back to the caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_sent_from_shared_tensors() {
    for (loss, seed) in [(0.0, 61), (0.05, 62)] {
        let used = rounds_sent_with(loss, seed, quick(), true).await;
        assert_eq!(used, vec![4; 3]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_without_loss_are_exact() {
    rounds_under_loss(0.0, 1).await;
    // And with the lossy part always as datagrams.
    let mut config = quick();
    config.timing.lossy_carrier = LossyCarrier::Datagrams;
    assert_eq!(rounds_under_loss_with(0.0, 5, config).await, vec![4; 3]);
}

/// What the lossless rounds above allow for: the kernel's count of the
/// packets a full receive buffer dropped, read for the socket's address.
#[test]
fn the_kernels_receive_drops_count_what_a_full_socket_buffer_dropped() {
    let receiver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = receiver.local_addr().unwrap();
    let before = kernel_receive_drops(addr).expect("the socket's row in /proc/net/udp");
    let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // Far more than a default receive buffer holds, never read.
    let payload = [7u8; 1200];
    for _ in 0..4000 {
        sender.send_to(&payload, addr).unwrap();
    }
    let after = kernel_receive_drops(addr).unwrap();
    assert!(after > before, "no drops counted: {before} then {after}");
    assert_eq!(kernel_receive_drops(sender.local_addr().unwrap()), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_at_1_percent_loss() {
    rounds_under_loss(0.01, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_at_5_percent_loss() {
    rounds_under_loss(0.05, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_at_20_percent_loss() {
    rounds_under_loss(0.20, 4).await;
}

/// Datagrams at the MTU floor are never discarded by a fall of the path
/// MTU, at any loss; with datagrams at the path's size (the control),
/// quinn's detector takes the lost datagram packets (a few bytes short of
/// the largest packets it saw delivered) for a black hole, and the MTU
/// falls to QUIC's 1200-byte floor.
///
/// At the floor a datagram-only packet's loss never counts as a sign of a
/// black hole, but a packet that carries a datagram and the tail of the
/// important stream (retransmissions ride there once the datagrams are
/// released) is full-size, and now and then losses of those still add up
/// to a fall: once in a CI run on a loaded machine (one fall in four
/// rounds; release builds on loopback showed none in 7 rounds, the path's
/// size 3 in the first). So the number of falls at the floor is reported,
/// not asserted; what the floor guarantees is that a fall discards nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floor_datagrams_survive_random_loss_that_reads_as_a_black_hole_at_the_path_size() {
    let layout = presets::resnet18();
    let run = |datagram_size: DatagramSize, seed: u64| {
        let layout = layout.clone();
        async move {
            // An Ethernet-sized path, where discovery stops at 1452 bytes.
            let mut config = Config {
                packets: Packets::Ethernet,
                ..quick()
            };
            config.timing.datagram_size = datagram_size;
            let faults = Faults::symmetric_loss(0.05, seed);
            let tag = format!("mtu{seed}");
            let (_se, mut server, _ce, mut client) =
                pair(&tag, &layout, Some(faults), config).await;
            // Let MTU discovery rise above the floor before the first round.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while client.connection().stats().path.current_mtu <= 1200
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let mut discarded = 0;
            for r in 0..4u32 {
                let grads = gradlane::presets::gradients(&layout, 300 + r as u64);
                let (report, round) = tokio::join!(
                    client.sender().send_round(r, &grads),
                    server.receiver().recv_round()
                );
                discarded += report.unwrap().lossy_dropped_by_quinn;
                round.unwrap();
            }
            let path = client.connection().stats().path;
            client.close_now();
            (path.black_holes_detected, path.current_mtu, discarded)
        }
    };
    let (falls, mtu, discarded) = run(DatagramSize::MtuFloor, 71).await;
    assert_eq!(discarded, 0, "at the floor: {falls} falls, mtu {mtu}");
    let (falls, mtu, _) = run(DatagramSize::Path, 72).await;
    assert!(
        falls > 0 && mtu == 1200,
        "at the path's size: {falls} falls, mtu {mtu}"
    );
}

/// A path known to carry jumbo frames (`Tuning::jumbo`): at 5% loss the
/// rounds meet every guarantee above; quinn never takes the lost datagram
/// packets for a black hole (its floor is now the path's size; with MTU
/// discovery from 1200 up to 8952 instead, `round_bench` saw it fall to
/// 1200 in the first round at 5% loss); and
/// the lossy datagrams are framed for that floor, not for 1200 bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_in_jumbo_packets_at_5_percent_loss() {
    let jumbo = || {
        let mut config = quick();
        config.packets = Packets::Jumbo;
        config
    };
    assert_eq!(rounds_under_loss_with(0.05, 8, jumbo()).await, vec![4; 3]);

    let layout = presets::resnet18();
    let faults = Faults::symmetric_loss(0.05, 9);
    let (_se, mut server, _ce, mut client) = pair("jumbo", &layout, Some(faults), jumbo()).await;
    let (mut packets, mut bytes) = (0u64, 0u64);
    for r in 0..3u32 {
        let grads = gradlane::presets::gradients(&layout, 400 + r as u64);
        let (report, round) = tokio::join!(
            client.sender().send_round(r, &grads),
            server.receiver().recv_round()
        );
        let report = report.unwrap();
        round.unwrap();
        if !report.lossy_on_stream {
            packets += report.lossy_packets.iter().sum::<u64>();
            bytes += report.lossy_bytes.iter().sum::<u64>();
        }
    }
    let path = client.connection().stats().path;
    client.close_now();
    assert_eq!(path.black_holes_detected, 0, "{path:?}");
    assert_eq!(path.current_mtu, JUMBO_UDP_PAYLOAD, "{path:?}");
    assert!(packets > 0, "the lossy part went as datagrams after a loss");
    let mean = bytes / packets;
    assert!(mean > 8000, "{mean} bytes a datagram");
}

/// The important part on one stream, as before lanes: the same
/// guarantees. The tests above cover the default, 4. (0 lanes is refused:
/// `config.rs`'s tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_over_a_single_lane() {
    for (lanes, loss, seed) in [(1, 0.05, 21), (1, 0.20, 22), (1, 0.0, 23)] {
        let mut config = quick();
        config.lanes = lanes;
        let used = rounds_under_loss_with(loss, seed, config).await;
        assert_eq!(used, vec![1; 3], "lanes {lanes}");
    }
}

/// The queue-gated Cubic controller under random loss: every round
/// arrives with the same guarantees (with plain Cubic, 5% loss does not
/// finish a ResNet-50 round in a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_under_queue_gated_cubic() {
    rounds_under_controller(Congestion::QueueGatedCubic, 31).await;
}

/// Rounds at 0%, 5% and 20% loss (seeds `seed`, `seed + 1`, `seed + 2`)
/// under `congestion`, with every guarantee of [`rounds_under_loss_with`].
///
/// In Ethernet-sized packets: with loopback's 64 KB packets these two
/// unbounded windows (quinn's BBR, Cubic gated on queueing) outrun the
/// receiving socket's 4 MiB buffer now and then (1 run in 3 or 4 here),
/// and the kernel's drops zero-fill lossy data of a lossless round. The
/// default capped window does not; docs/RESULTS.md says so.
async fn rounds_under_controller(congestion: Congestion, seed: u64) {
    for (i, loss) in [0.0, 0.05, 0.20].into_iter().enumerate() {
        let mut config = quick();
        config.congestion = congestion;
        config.packets = Packets::Ethernet;
        rounds_under_loss_with(loss, seed + i as u64, config).await;
    }
}

/// quinn's own BBR under random loss (the default is BBR with a capped
/// window): every round arrives with the same guarantees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_under_uncapped_bbr() {
    rounds_under_controller(Congestion::Bbr, 41).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_mismatch_is_refused_clearly() {
    let dir = cert_dir("mismatch");
    let expected = Layout::new(vec![TensorSpec::dense("w", [10])]).unwrap();
    let server = server(
        &dir,
        Config {
            expect_layout: Some(expected),
            ..quick()
        },
    );
    let addr = server.local_addr().unwrap();
    let client = Endpoint::client(dir.join("ca.pem"), quick()).unwrap();
    let other = Layout::new(vec![TensorSpec::dense("w", [11])]).unwrap();
    let (s, c) = tokio::join!(server.accept(), client.connect(addr, "localhost", &other));
    assert!(matches!(s.unwrap(), Err(LinkError::Rejected { .. })));
    match c {
        Err(LinkError::Rejected { code, reason }) => {
            assert_eq!(code, codes::LAYOUT_MISMATCH as u64);
            assert!(reason.contains("tensor 0"), "{reason}");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_peer_is_an_error_not_a_hang() {
    let layout = presets::tiny();
    let dir = cert_dir("vanish");
    let server_ep = server(&dir, quick());
    let addr = server_ep.local_addr().unwrap();
    // The client lives in its own runtime, so that it can disappear without
    // saying goodbye: shutting the runtime down stops its packets at once.
    let (up_tx, up_rx) = tokio::sync::oneshot::channel();
    let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
    let client_layout = layout.clone();
    let client_thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let link = rt.block_on(async {
            let ep = Endpoint::client(dir.join("ca.pem"), quick()).unwrap();
            let mut link = ep.connect(addr, "localhost", &client_layout).await.unwrap();
            let grads = gradlane::presets::gradients(&client_layout, 1);
            link.sender().send_round(0, &grads).await.unwrap();
            (ep, link)
        });
        let _ = up_tx.send(());
        let _ = die_rx.recv();
        rt.shutdown_background();
        std::mem::forget(link);
    });
    let mut server = server_ep.accept().await.unwrap().unwrap();
    server.receiver().recv_round().await.unwrap();
    up_rx.await.unwrap();
    die_tx.send(()).unwrap();
    client_thread.join().unwrap();

    let grads = gradlane::presets::gradients(&layout, 2);
    let t = tokio::time::timeout(Duration::from_secs(20), server.receiver().recv_round()).await;
    assert!(matches!(t, Ok(Err(LinkError::Connection(_)))), "{t:?}");
    let t = tokio::time::timeout(
        Duration::from_secs(20),
        server.sender().send_round(1, &grads),
    )
    .await;
    assert!(matches!(t, Ok(Err(_))), "{t:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_are_bidirectional() {
    let layout = presets::tiny();
    let (_s, mut server, _c, mut client) = pair("bidi", &layout, None, quick()).await;
    let g = gradlane::presets::gradients(&layout, 9);
    let (a, b) = tokio::join!(
        server.sender().send_round(0, &g),
        client.receiver().recv_round()
    );
    a.unwrap();
    let round = b.unwrap();
    assert_eq!(round.stats.classes[0].zero_filled_bytes, 0);
    assert!(round.tensors.iter().zip(&g).all(|(x, y)| bit_equal(x, y)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_index_is_sent_once_and_indexes_increase() {
    let layout = presets::tiny();
    let (_s, mut server, _c, mut client) = pair("order", &layout, None, quick()).await;
    let g1 = gradlane::presets::gradients(&layout, 1);
    let (a, r) = tokio::join!(
        client.sender().send_round(1, &g1),
        server.receiver().recv_round()
    );
    a.unwrap();
    assert_eq!(r.unwrap().index, 1);
    // The same index again, and an older one: refused here, before a byte
    // leaves (the peer would otherwise close the link).
    for again in [1, 0] {
        match client.sender().send_round(again, &g1).await {
            Err(LinkError::RoundOrder { round, last }) => assert_eq!((round, last), (again, 1)),
            other => panic!("round {again} after round 1: {other:?}"),
        }
    }
    // Gradients the encoder refuses send nothing: their index stays free.
    let mut bad = gradlane::presets::gradients(&layout, 2);
    bad[0].pop();
    assert!(matches!(
        client.sender().send_round(3, &bad).await,
        Err(LinkError::Encode(_))
    ));
    let g3 = gradlane::presets::gradients(&layout, 3);
    let (a, r) = tokio::join!(
        client.sender().send_round(3, &g3),
        server.receiver().recv_round()
    );
    a.unwrap();
    let r = r.unwrap();
    assert_eq!(r.index, 3);
    assert!(r.tensors.iter().zip(&g3).all(|(x, y)| bit_equal(x, y)));
    assert_eq!(server.receiver().counters().malformed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_send_round_stops_sending_its_round() {
    // 16 MB a round over a 20 ms path: the congestion window needs many
    // round trips to carry it, so a round dropped once 1 MB has left still
    // has most of it to send, in quinn's buffers or the writers' queues.
    let layout = Layout::new(vec![TensorSpec::dense("w", [1 << 22])]).unwrap();
    let faults = Faults {
        delay: Duration::from_millis(20),
        ..Default::default()
    };
    let (_s, mut server, _c, mut client) = pair("dropped", &layout, Some(faults), quick()).await;
    let conn = client.connection().clone();
    let sent = move || conn.stats().udp_tx.bytes;
    let before = sent();
    let g0 = gradlane::presets::gradients(&layout, 1);
    {
        let send = client.sender().send_round(0, &g0);
        tokio::pin!(send);
        loop {
            tokio::select! {
                r = send.as_mut() => panic!("a 16 MB round over 20 ms finished early: {r:?}"),
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
            if sent() - before > 1 << 20 {
                break;
            }
        }
    }
    // Round 0 cannot have been whole when it was dropped: delivered, it
    // was sent on after the drop.
    next_round_is_whole_and_round_0_stopped(&mut client, &mut server, &layout, || sent() - before)
        .await;
    assert_eq!(server.receiver().counters().malformed, 0);
    let resets = client.connection().stats().frame_tx.reset_stream;
    assert!(resets >= 1, "no lane of the dropped round was reset");
}

/// A round whose writers have handed every byte to quinn, dropped while it
/// waits for the peer: quinn still holds most of it (a 100 ms path sends
/// one initial window a round trip), and a finished stream whose handle
/// is dropped is sent to its end unless reset. Every lane must be reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_dropped_after_its_lanes_finished_is_reset() {
    // 4 MB: a quarter per lane, well inside each lane's 4 MiB window, so
    // the writers finish at once.
    let layout = Layout::new(vec![TensorSpec::dense("w", [1 << 20])]).unwrap();
    let faults = Faults {
        delay: Duration::from_millis(100),
        ..Default::default()
    };
    let (_s, mut server, _c, mut client) =
        pair("dropped-late", &layout, Some(faults), quick()).await;
    let conn = client.connection().clone();
    let sent = move || conn.stats().udp_tx.bytes;
    let before = sent();
    let resets_before = client.connection().stats().frame_tx.reset_stream;
    let g0 = gradlane::presets::gradients(&layout, 1);
    let dropped = tokio::time::timeout(
        Duration::from_millis(150),
        client.sender().send_round(0, &g0),
    )
    .await;
    assert!(
        dropped.is_err(),
        "a round over 200 ms round trips finished in 150 ms"
    );
    // The frames leave once the congestion window has room: within a few
    // round trips.
    let resets = || client.connection().stats().frame_tx.reset_stream - resets_before;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while resets() < 4 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(resets() >= 4, "{} of the 4 finished lanes reset", resets());
    let report = next_round_is_whole_and_round_0_stopped(&mut client, &mut server, &layout, || {
        sent() - before
    })
    .await;
    assert_eq!(report.lanes, 4);
}

/// After round 0 was dropped: round 1 goes through whole and round 0 is
/// skipped. Without the reset quinn went on sending all of round 0 (it
/// holds what the writers handed over): twice the round in all. With it,
/// about one round plus what round 0 had sent before it was reset.
async fn next_round_is_whole_and_round_0_stopped(
    client: &mut Link,
    server: &mut Link,
    layout: &Layout,
    sent_since_round_0: impl Fn() -> u64,
) -> SendReport {
    let g1 = gradlane::presets::gradients(layout, 2);
    let (a, r) = tokio::join!(
        client.sender().send_round(1, &g1),
        server.receiver().recv_round()
    );
    let report = a.unwrap();
    let r = r.unwrap();
    assert_eq!(r.index, 1, "the dropped round was delivered");
    assert!(r.tensors.iter().zip(&g1).all(|(x, y)| bit_equal(x, y)));
    let (total, round_bytes) = (sent_since_round_0(), layout.total_bytes());
    assert!(
        (total as f64) < 1.4 * round_bytes as f64,
        "{total} bytes sent for a dropped and a whole {round_bytes}-byte round"
    );
    report
}

/// A raw QUIC client that speaks the handshake and then misbehaves.
async fn raw_client(
    dir: &std::path::Path,
    addr: std::net::SocketAddr,
    layout: &Layout,
) -> quinn::Connection {
    use gradlane_core::control::{framed, Hello};
    let local = "127.0.0.1:0".parse().unwrap();
    let ep = gradlane::quic::client(local, &dir.join("ca.pem"), &Config::default()).unwrap();
    let conn = ep.connect(addr, "localhost").unwrap().await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let hello = Hello {
        layout: layout.clone(),
        chunking: Default::default(),
    };
    send.write_all(&framed(&hello.encode())).await.unwrap();
    let mut welcome = [0u8; 5];
    recv.read_exact(&mut welcome).await.unwrap();
    std::mem::forget((send, recv, ep));
    conn
}

/// A peer of protocol 1 (every value f32, no format byte) is refused at
/// the handshake with a reason that names both versions, and the server
/// goes on accepting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_of_the_old_protocol_is_refused_at_the_handshake() {
    use gradlane_core::control::{codes, framed, Hello};
    let layout = presets::tiny();
    let dir = cert_dir("old-protocol");
    let server = server(&dir, quick());
    let addr = server.local_addr().unwrap();
    let local = "127.0.0.1:0".parse().unwrap();
    let ep = gradlane::quic::client(local, &dir.join("ca.pem"), &Config::default()).unwrap();
    let old_peer = async {
        let conn = ep.connect(addr, "localhost").unwrap().await.unwrap();
        let (mut send, _recv) = conn.open_bi().await.unwrap();
        let mut hello = Hello {
            layout: layout.clone(),
            chunking: Default::default(),
        }
        .encode();
        hello[3] = b'1'; // "GLH1": the f32-only protocol's hello
        send.write_all(&framed(&hello)).await.unwrap();
        conn.closed().await
    };
    let (refused, closed) = tokio::join!(server.accept(), old_peer);
    let err = refused.unwrap().unwrap_err().to_string();
    assert!(
        err.contains("protocol 1") && err.contains("same gradlane release"),
        "{err}"
    );
    match closed {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code.into_inner(), codes::BAD_HELLO as u64);
            let reason = String::from_utf8_lossy(&c.reason);
            assert!(
                reason.contains("protocol 1") && reason.contains("this end 2"),
                "{reason}"
            );
        }
        other => panic!("closed with {other:?}"),
    }
    // The server still takes a peer of this protocol.
    let client = gradlane::Endpoint::client(dir.join("ca.pem"), quick()).unwrap();
    let (link, accepted) =
        tokio::join!(client.connect(addr, "localhost", &layout), server.accept());
    link.unwrap();
    accepted.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_peers_are_counted_or_cut_off_and_others_keep_working() {
    let layout = presets::tiny();
    let dir = cert_dir("malformed");
    let server = server(&dir, quick());
    let addr = server.local_addr().unwrap();

    // 1. Garbage datagrams: counted and dropped; the link still delivers.
    let (bad, link) = tokio::join!(raw_client(&dir, addr, &layout), server.accept());
    let (bad_rx_tx, mut bad_link) = (bad, link.unwrap().unwrap());
    for i in 0..20u8 {
        bad_rx_tx
            .send_datagram(vec![0x47, 0x4C, 1, 1, i, 0, 0, 0, 1, 2].into())
            .unwrap();
    }
    // Wait until all 20 were counted (each is its own refusal).
    let (_, mut link_rx) = {
        let l = bad_link;
        l.split()
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while link_rx.counters().malformed < 20 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("malformed datagrams are counted");

    // 2. Garbage on a round stream: the server closes with the protocol code.
    let mut s = bad_rx_tx.open_uni().await.unwrap();
    s.write_all(&[0xFFu8; 64]).await.unwrap();
    s.finish().unwrap();
    let err = link_rx.recv_round().await.unwrap_err();
    assert!(matches!(err, LinkError::Protocol(_)), "{err:?}");
    match bad_rx_tx.closed().await {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code.into_inner(), codes::PROTOCOL as u64);
            assert!(String::from_utf8_lossy(&c.reason).contains("malformed"));
        }
        other => panic!("expected an application close, got {other:?}"),
    }
    bad_link = {
        // The endpoint still serves a well-behaved client.
        let client = Endpoint::client(dir.join("ca.pem"), quick()).unwrap();
        let (s, c) = tokio::join!(server.accept(), client.connect(addr, "localhost", &layout));
        let (mut s, mut c) = (s.unwrap().unwrap(), c.unwrap());
        let g = gradlane::presets::gradients(&layout, 3);
        let (a, r) = tokio::join!(c.sender().send_round(0, &g), s.receiver().recv_round());
        a.unwrap();
        assert!(r
            .unwrap()
            .tensors
            .iter()
            .zip(&g)
            .all(|(x, y)| bit_equal(x, y)));
        s
    };
    drop(bad_link);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_another_ca_fails_clearly() {
    let layout = presets::tiny();
    let dir = cert_dir("ca-a");
    let other = cert_dir("ca-b");
    let server = server(&dir, quick());
    let addr = server.local_addr().unwrap();
    let client = Endpoint::client(other.join("ca.pem"), quick()).unwrap();
    let accept = tokio::time::timeout(Duration::from_secs(3), server.accept());
    let (_, c) = tokio::join!(accept, client.connect(addr, "localhost", &layout));
    let err = c.unwrap_err().to_string();
    assert!(
        err.contains("UnknownIssuer") || err.contains("certificate"),
        "{err}"
    );
}

/// GSO and GRO at work on the real socket, as the endpoints count them:
/// with Ethernet-sized packets quinn hands the kernel several packets per
/// send, and the receiver takes several per buffer. By default (MTU
/// discovery up to what loopback carries) the packets grow to 64 KB, one
/// per send, and no batch is lost to the kernel's 64 KB limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gso_and_gro_batch_on_loopback_and_packets_grow_to_the_route() {
    let layout = presets::resnet18();
    let grads = presets::gradients(&layout, 7);
    for packets in [Packets::Ethernet, Packets::Route] {
        let config = Config {
            packets,
            loss_tolerance: 0.0,
            ..quick()
        };
        let (server_ep, mut server, client_ep, mut client) =
            pair(&format!("batches{packets:?}"), &layout, None, config).await;
        for r in 0..2 {
            let (sent, got) = tokio::join!(
                client.sender().send_round(r, &grads),
                server.receiver().recv_round()
            );
            sent.unwrap();
            let got = got.unwrap();
            let exact = got.tensors.iter().zip(&grads).all(|(a, b)| bit_equal(a, b));
            assert!(exact && got.tensors.len() == grads.len(), "round {r}");
        }
        let (tx, rx) = (client_ep.batch_counts(), server_ep.batch_counts());
        let mtu = client.connection().stats().path.current_mtu;
        eprintln!("{packets:?}: mtu {mtu}, sender {tx:?}, receiver {rx:?}");
        assert_eq!(tx.packets_dropped_full, 0, "{tx:?}");
        match packets {
            Packets::Ethernet => {
                assert!(mtu <= 1452, "{mtu}");
                assert!(tx.packets_sent > 2 * tx.sends, "GSO: {tx:?}");
                assert!(rx.packets_received > 2 * rx.buffers_received, "GRO: {rx:?}");
            }
            _ => {
                assert!(mtu > 60_000, "{mtu}");
                // Each quinn batch of 64 KB packets is split into sends.
                assert!(tx.batches_split > 0, "{tx:?}");
                let mean = client.connection().stats().udp_tx.bytes / tx.packets_sent.max(1);
                assert!(mean > 20_000, "mean packet {mean} bytes: {tx:?}");
            }
        }
        client.close().await.unwrap();
        client_ep.wait_idle().await;
    }
}
