//! Closing a link, in order or by dropping it, around the last round: a
//! round the receiver had is never reported failed to its sender, and one
//! it did not have fails with an error that says the peer closed.
//!
//! The protocol's side of this (a receiver closing or dropping its link at
//! every event of a round, over thousands of seeds) is tested in
//! simulation, in `gradlane_core::protocol`; these tests carry a few
//! seeds of it out over real QUIC connections at 30% loss.

use crate::common;

use common::{cert_dir, pair_in, quick};
use gradlane::{presets, Config, Faults, LinkError};
use std::path::PathBuf;
use std::time::Duration;

/// Rounds without a lossy part (nothing holds the receiver back from
/// closing once the important part is in) and with one.
fn config_for(seed: u64) -> Config {
    let mut config = quick();
    if seed % 2 == 0 {
        config.loss_tolerance = 0.0;
    }
    config
}

/// A receiver that closes in order right after its last round: the
/// sender's `send_round` of that round succeeds, even when loss delays the
/// confirmation, and the close itself is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_after_the_last_round_keeps_its_confirmation() {
    let layout = presets::tiny();
    let dir = cert_dir("in-order");
    for seed in 0..4 {
        // The client receives; its socket loses 30% of what it sends (its
        // confirmations, and its close).
        let faults = Faults {
            loss_out: 0.3,
            seed: 40 + seed,
            ..Faults::default()
        };
        let (_se, mut sender, _ce, mut receiver) =
            pair_in(&dir, &layout, Some(faults), config_for(seed)).await;
        let grads = gradlane::presets::gradients(&layout, seed);
        let receive = async {
            let round = receiver.receiver().recv_round().await.unwrap();
            let closed = receiver.close().await;
            (round, closed)
        };
        let (sent, (round, closed)) = tokio::join!(sender.sender().send_round(0, &grads), receive);
        assert_eq!(round.index, 0);
        let sent = sent.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(sent.important_bytes, round.stats.classes[0].received_bytes);
        closed.unwrap_or_else(|e| panic!("seed {seed}: close: {e}"));
        // The sender learns of the close as an orderly one.
        match sender.receiver().recv_round().await {
            Err(LinkError::PeerClosed { round: None }) => {}
            other => panic!("seed {seed}: {other:?}"),
        }
    }
}

/// How the receiver goes after its last round.
#[derive(Clone, Copy, Debug)]
enum Leave {
    Drop,
    CloseNow,
}

/// One seed of [`dropping_the_receiver_after_the_last_round_fails_no_send`]:
/// two rounds at 30% loss each way, the receiver leaving right after the
/// second. Returns how the second `send_round` ended.
async fn leave_after_two_rounds(
    dir: PathBuf,
    seed: u64,
    leave: Leave,
) -> Result<Result<(), LinkError>, String> {
    let layout = presets::tiny();
    let faults = Faults::symmetric_loss(0.3, 1000 + seed);
    let (_se, mut sender, _ce, mut receiver) =
        pair_in(&dir, &layout, Some(faults), config_for(seed)).await;
    let first = gradlane::presets::gradients(&layout, seed);
    let (sent, got) = tokio::join!(
        sender.sender().send_round(0, &first),
        receiver.receiver().recv_round()
    );
    sent.map_err(|e| format!("seed {seed}: round 0: {e}"))?;
    got.map_err(|e| format!("seed {seed}: round 0 received: {e}"))?;
    let second = gradlane::presets::gradients(&layout, seed + 1);
    let receive = async move {
        let round = receiver.receiver().recv_round().await;
        // Right after taking its last round.
        if let Leave::CloseNow = leave {
            receiver.close_now();
        }
        drop(receiver);
        round
    };
    let (sent, got) = tokio::join!(sender.sender().send_round(1, &second), receive);
    let got = got.map_err(|e| format!("seed {seed}: round 1 received: {e}"))?;
    if got.index != 1 {
        return Err(format!("seed {seed}: delivered round {}", got.index));
    }
    match sent {
        Ok(sent) if sent.important_bytes != got.stats.classes[0].received_bytes => {
            Err(format!("seed {seed}: {sent:?} vs {:?}", got.stats))
        }
        Ok(_) => Ok(Ok(())),
        Err(e) => Ok(Err(e)),
    }
}

/// Runs [`leave_after_two_rounds`] for 8 seeds at once (each pair spends
/// most of its time waiting out loss recovery, not on the CPU): per seed,
/// how the second `send_round` ended.
async fn leave_after_two_rounds_8(tag: &str, leave: Leave) -> Vec<(u64, Result<(), LinkError>)> {
    let dir = cert_dir(tag);
    let mut ends = Vec::new();
    let mut set = tokio::task::JoinSet::new();
    for seed in 0..8u64 {
        let dir = dir.clone();
        set.spawn(async move { (seed, leave_after_two_rounds(dir, seed, leave).await) });
    }
    while let Some(done) = set.join_next().await {
        let (seed, end) = done.unwrap();
        ends.push((seed, end.unwrap_or_else(|e| panic!("{leave:?}: {e}"))));
    }
    ends.sort_by_key(|(seed, _)| *seed);
    ends
}

/// A receiver that drops its link right after taking the last of two
/// rounds, at 30% loss each way: every `send_round` returns Ok. Dropping
/// closes the link in order in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_receiver_after_the_last_round_fails_no_send() {
    let ends = leave_after_two_rounds_8("drop-after", Leave::Drop).await;
    let failed: Vec<_> = ends.iter().filter(|(_, end)| end.is_err()).collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

/// A receiver that closes at once right after taking its last round, at
/// 30% loss each way: quinn discards the confirmation if it is still
/// unsent, and the close frame's note names the round instead. Whether the
/// frame arrives is up to the loss (when it does not, the sender's
/// connection ends in a stateless reset or a timeout, and the round's fate
/// is unknown), but the round is never reported as not delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_at_once_after_the_last_round_never_denies_it() {
    let ends = leave_after_two_rounds_8("close-now-after", Leave::CloseNow).await;
    for (seed, end) in &ends {
        assert!(
            matches!(end, Ok(()) | Err(LinkError::Connection(_))),
            "seed {seed}: {end:?}"
        );
    }
    let ok = ends.iter().filter(|(_, end)| end.is_ok()).count();
    eprintln!(
        "closed at once: {ok} of {} last rounds confirmed",
        ends.len()
    );
}

/// A receiver that goes before it has a round: the sender's error says the
/// peer closed, and before which round, whether the receiver dropped its
/// link or closed it at once or in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_gone_before_the_round_fails_it_with_the_cause() {
    let layout = presets::tiny();
    let dir = cert_dir("drop-before");
    for how in ["drop", "close_now", "close"] {
        let (_se, mut sender, _ce, receiver) = pair_in(&dir, &layout, None, quick()).await;
        match how {
            "drop" => drop(receiver),
            "close_now" => receiver.close_now(),
            _ => receiver.close().await.unwrap(),
        }
        let grads = gradlane::presets::gradients(&layout, 5);
        let sent = tokio::time::timeout(
            Duration::from_secs(10),
            sender.sender().send_round(0, &grads),
        )
        .await
        .unwrap_or_else(|_| panic!("{how}: send_round hung"));
        match sent {
            Err(e @ LinkError::PeerClosed { round: Some(0) }) => {
                let text = e.to_string();
                assert!(
                    text.contains("peer closed") && text.contains("round 0"),
                    "{text}"
                );
            }
            other => panic!("{how}: {other:?}"),
        }
    }
}

/// A receiver that took round 0 and then went: round 0 succeeded, round 1
/// (sent after it went) fails with the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_round_after_the_receiver_went_fails_with_the_cause() {
    let layout = presets::tiny();
    let dir = cert_dir("drop-between");
    for how in ["drop", "close_now", "close"] {
        let (_se, mut sender, _ce, mut receiver) = pair_in(&dir, &layout, None, quick()).await;
        let grads = gradlane::presets::gradients(&layout, 6);
        let (sent, got) = tokio::join!(
            sender.sender().send_round(0, &grads),
            receiver.receiver().recv_round()
        );
        sent.unwrap();
        got.unwrap();
        match how {
            "drop" => drop(receiver),
            "close_now" => receiver.close_now(),
            _ => receiver.close().await.unwrap(),
        }
        let sent = tokio::time::timeout(
            Duration::from_secs(10),
            sender.sender().send_round(1, &grads),
        )
        .await
        .unwrap_or_else(|_| panic!("{how}: send_round hung"));
        assert!(
            matches!(sent, Err(LinkError::PeerClosed { round: Some(1) })),
            "{how}: {sent:?}"
        );
    }
}
