//! The default congestion controller's window over a real link.

use super::link_pair;
use crate::congestion::capped_bbr::CappedBbr;
use crate::socket::faults::Faults;
use gradlane_core::presets;
use std::time::Duration;

/// The default controller bounds what is in flight by the path, not by the
/// bytes sent: after three ResNet-18 rounds (140 MB) over loopback with 1 ms
/// injected delay, its window is the cap (a few MB: 2.5x bandwidth x RTT), where
/// quinn's own BBR has been seen at 40-380 MB after such rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_window_is_capped_by_the_path() {
    let layout = presets::resnet18();
    let faults = Faults {
        delay: Duration::from_millis(1),
        seed: 51,
        ..Faults::default()
    };
    let (_se, mut server, _ce, mut client) = link_pair("capped", &layout, Some(faults)).await;
    let mut sent = 0u64;
    for r in 0..3u32 {
        let grads = presets::gradients(&layout, 200 + r as u64);
        let (report, round) = tokio::join!(
            client.sender().send_round(r, &grads),
            server.receiver().recv_round()
        );
        assert_eq!(round.unwrap().index, r);
        let report = report.unwrap();
        sent += report.important_bytes + report.lossy_bytes.iter().sum::<u64>();
    }
    let state = client.connection().congestion_state();
    let window = state.window();
    let capped = state
        .into_any()
        .downcast::<CappedBbr>()
        .expect("the default controller is the capped BBR");
    let cap = capped.gate().cap().expect("bandwidth and RTT measured");
    assert!(window <= cap, "window {window} above the cap {cap}");
    let rtt = capped.gate().min_rtt().unwrap();
    // The client delays what it sends by 1 ms, but quinn stamps a received
    // datagram with the start of its receive batch, so on a loaded host
    // an RTT sample can fall below that (0.64 ms has been seen), down to
    // zero, which the gate ignores.
    assert!(!rtt.is_zero(), "a zero RTT sample was kept");
    assert!(
        window < 16 << 20 && window < sent / 8,
        "window {window} after {sent} bytes sent (bandwidth {:?}, min RTT {rtt:?}, floor {})",
        capped.gate().bandwidth(),
        capped.gate().floor(),
    );
    client.close_now();
}
