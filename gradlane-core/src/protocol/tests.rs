//! The round protocol over the simulated pair: each property over at
//! least a thousand seeds at every loss rate from 0 to 30%.

mod sim;

use super::*;
use crate::layout::ChunkOptions;
use sim::{layout, Abandon, Leave, Outcome, Pair, PathModel, Scenario};
use std::time::Duration;

const LOSSES: [f64; 6] = [0.0, 0.01, 0.05, 0.1, 0.2, 0.3];
const SEEDS: u64 = 1000;

fn run(s: Scenario) -> Outcome {
    Pair::new(s).run()
}

/// Every delivered round's important chunks hold exactly the sent values
/// (plus, where late lossy data of the round before merged in, that
/// data), and each lossy class's bytes were received or zero-filled.
fn check_delivered(out: &Outcome, what: &str) {
    let plan = layout().plan(ChunkOptions::default()).expect("plan");
    for round in &out.delivered {
        let r = round.index as usize;
        let stats = &round.stats;
        let important = &stats.classes[0];
        assert_eq!(
            important.received_bytes, important.sent_bytes,
            "{what} round {r}"
        );
        assert_eq!(important.zero_filled_bytes, 0, "{what} round {r}");
        for (l, c) in stats.classes.iter().enumerate().skip(1) {
            assert_eq!(
                c.sent_bytes,
                c.received_bytes + c.zero_filled_bytes,
                "{what} round {r} level {l}"
            );
        }
        // Late lossy data of earlier rounds may have merged into any
        // chunk: into an important one, the sum must hold its exact value.
        let late: Vec<usize> = stats
            .late_from
            .iter()
            .map(|&(from, _)| from as usize)
            .collect();
        for (id, chunk) in plan.chunks().iter().enumerate() {
            if out.classes[r][id] != 0 {
                continue;
            }
            let t = chunk.tensor as usize;
            let span = chunk.start as usize..(chunk.start + chunk.len) as usize;
            for i in span {
                let (got, sent) = (round.tensors[t][i], out.grads[r][t][i]);
                let merged = (1..1u32 << late.len()).any(|subset| {
                    let extra: f32 = (0..late.len())
                        .filter(|k| subset & (1 << k) != 0)
                        .map(|k| out.grads[late[k]][t][i])
                        .sum();
                    (got - (sent + extra)).abs() <= 1e-6 * (sent.abs() + extra.abs())
                });
                assert!(
                    got == sent || merged,
                    "{what} round {r} tensor {t}[{i}]: {got} != {sent}"
                );
            }
        }
    }
}

/// What was zero-filled is exactly what the path lost plus what came late
/// (merged into a later round, still waiting, or dropped as too late).
fn check_accounting(out: &Outcome, what: &str) {
    let zero_filled: u64 = out
        .delivered
        .iter()
        .map(|r| r.stats.lossy().zero_filled_bytes)
        .sum();
    let merged: u64 = out
        .delivered
        .iter()
        .map(|r| r.stats.lossy().late_merged_bytes)
        .sum();
    let late = merged + out.late_buffered + out.counters.late_dropped_bytes;
    assert_eq!(
        zero_filled,
        out.lossy_lost + late,
        "{what}: lost {} late {late}",
        out.lossy_lost
    );
}

#[test]
fn every_round_is_delivered_once_exact_and_accounted_for() {
    for loss in LOSSES {
        for seed in 0..SEEDS {
            let what = format!("loss {loss} seed {seed}");
            let out = run(Scenario::new(seed, loss));
            let indexes: Vec<u32> = out.delivered.iter().map(|r| r.index).collect();
            assert_eq!(indexes, [0, 1, 2], "{what}");
            assert!(
                out.sent.values().all(Result::is_ok),
                "{what}: {:?}",
                out.sent
            );
            check_delivered(&out, &what);
            check_accounting(&out, &what);
            // The lossy part never went ahead of the important part's
            // first sending.
            assert!(
                out.released_after_important.values().all(|&ok| ok),
                "{what}"
            );
            if loss == 0.0 {
                assert!(
                    out.on_stream.values().all(|&s| s),
                    "{what}: lossless rounds go on streams"
                );
                assert_eq!(out.lossy_lost, 0, "{what}");
            }
        }
    }
}

#[test]
fn the_lossy_part_waits_for_the_confirmation_when_asked() {
    for loss in LOSSES {
        for seed in 0..SEEDS {
            let what = format!("loss {loss} seed {seed}");
            let mut s = Scenario::new(seed, loss);
            s.timing.release = LossyRelease::Acknowledged;
            let out = run(s);
            assert_eq!(out.delivered.len(), 3, "{what}");
            assert!(out.sent.values().all(Result::is_ok), "{what}");
            check_delivered(&out, &what);
            check_accounting(&out, &what);
        }
    }
}

#[test]
fn datagrams_are_used_from_the_first_round_after_a_loss() {
    for loss in LOSSES {
        let mut with_datagrams = 0;
        for seed in 0..SEEDS {
            let what = format!("loss {loss} seed {seed}");
            let mut s = Scenario::new(seed, loss);
            s.rounds = 4;
            let out = run(s);
            assert_eq!(out.delivered.len(), 4, "{what}");
            // The first round knows of no loss yet.
            assert!(out.on_stream[&0], "{what}");
            for (&r, &on_stream) in &out.on_stream {
                assert_eq!(on_stream, !out.loss_declared_before[&r], "{what} round {r}");
            }
            with_datagrams += out.on_stream.values().any(|&s| !s) as u64;
            check_accounting(&out, &what);
        }
        if loss >= 0.05 {
            assert!(
                with_datagrams > SEEDS / 2,
                "at {loss}: {with_datagrams} runs used datagrams"
            );
        }
    }
}

#[test]
fn lossy_data_later_than_the_grace_merges_into_the_next_round() {
    // By what carried the late data: datagrams, streams.
    let mut merged = [0u32; 2];
    for loss in LOSSES {
        for seed in 0..SEEDS {
            let what = format!("loss {loss} seed {seed}");
            let mut s = Scenario::new(seed, loss);
            // A tenth of the packets come 200 ms later than the rest, past
            // the 10 ms grace plus two round trips of 60 ms.
            s.path = PathModel {
                delay: Duration::from_millis(30),
                reorder: 0.1,
                hold: Duration::from_millis(200),
                ..PathModel::lossy(loss)
            };
            s.timing.grace = Duration::from_millis(10);
            s.rounds = 4;
            let out = run(s);
            let indexes: Vec<u32> = out.delivered.iter().map(|r| r.index).collect();
            assert_eq!(indexes, [0, 1, 2, 3], "{what}");
            assert!(out.sent.values().all(Result::is_ok), "{what}");
            check_delivered(&out, &what);
            check_accounting(&out, &what);
            // Late data of round r merges into round r + 1: count it by
            // what carried round r's lossy part.
            for d in &out.delivered {
                if d.stats.lossy().late_merged_bytes > 0 {
                    for &(from, _) in &d.stats.late_from {
                        merged[out.on_stream[&from] as usize] += 1;
                    }
                }
            }
        }
    }
    let [datagrams, streams] = merged;
    assert!(
        datagrams > 100 && streams > 100,
        "late merges: {datagrams} from datagrams, {streams} from streams"
    );
}

/// The sender's caller drops `send_round` of round 1 at every event of a
/// run: the round fails unless the peer confirmed it first, is delivered
/// only if its important part was all in, and round 2 is whole.
#[test]
fn a_round_given_up_at_any_event_leaves_the_next_whole() {
    let mut given_up = 0;
    for loss in LOSSES {
        for seed in 0..SEEDS {
            let base = run(Scenario::new(seed, loss));
            // One event per seed, spread over the run.
            let at = 1 + (seed * 7919) % base.events;
            let what = format!("loss {loss} seed {seed} given up at event {at}");
            let mut s = Scenario::new(seed, loss);
            s.abandon = Abandon::At { round: 1, at };
            let out = run(s);
            let indexes: Vec<u32> = out.delivered.iter().map(|r| r.index).collect();
            assert_eq!(out.sent.len(), 3, "{what}: every round has an outcome");
            match out.sent[&1] {
                Ok(()) => assert_eq!(indexes, [0, 1, 2], "{what}"),
                Err(e) => {
                    given_up += 1;
                    assert_eq!(e, SendFailure::Transport, "{what}");
                    assert!(
                        !indexes.contains(&1) || out.confirmed.contains(&1),
                        "{what}"
                    );
                    assert!(indexes.contains(&2), "{what}: {indexes:?}");
                }
            }
            assert!(
                out.sent[&0].is_ok() && out.sent[&2].is_ok(),
                "{what}: {:?}",
                out.sent
            );
            check_delivered(&out, &what);
        }
    }
    assert!(given_up > 1000, "only {given_up} rounds were given up");
}

/// The receiver closes (in order, or at once) at an event of the run.
fn check_close(out: &Outcome, leave: Leave, what: &str) {
    assert_eq!(
        out.sent.len(),
        out.grads.len(),
        "{what}: every round started has an outcome"
    );
    for (&r, sent) in &out.sent {
        let delivered = out.delivered.iter().any(|d| d.index == r);
        let confirmed = out.confirmed.contains(&r);
        match sent {
            Ok(()) => assert!(confirmed, "{what}: round {r} succeeded unconfirmed"),
            Err(SendFailure::PeerClosed) => {
                assert!(!confirmed, "{what}: round {r} confirmed but failed");
                assert!(!delivered, "{what}: round {r} delivered but failed");
            }
            // Only a close frame lost every time leaves the sender to time
            // out, without knowing what the peer had.
            Err(SendFailure::Transport) => {
                assert!(
                    !out.close_delivered,
                    "{what}: round {r} failed without a reason"
                )
            }
        }
        if delivered {
            assert!(
                sent.is_ok() || !out.close_delivered,
                "{what}: round {r} delivered but failed"
            );
        }
    }
    if let Leave::Close(_) = leave {
        assert_eq!(out.close, Some(CloseOutcome::Acknowledged), "{what}");
    }
    check_delivered(out, what);
}

/// Runs the scenario of `seed` with the receiver closing at event `at`,
/// in order and at once, and checks both.
fn close_both_ways(seed: u64, loss: f64, at: u64) {
    for leave in [Leave::Close(at), Leave::CloseNow(at)] {
        let what = format!("loss {loss} seed {seed} {leave:?}");
        let mut s = Scenario::new(seed, loss);
        s.leave = leave;
        check_close(&run(s), leave, &what);
    }
}

#[test]
fn a_receiver_closing_at_every_event_never_fails_a_delivered_round() {
    for loss in [0.0, 0.05, 0.3] {
        for seed in 0..10 {
            let base = run(Scenario::new(seed, loss));
            for at in 1..=base.events + 1 {
                close_both_ways(seed, loss, at);
            }
        }
    }
}

#[test]
fn a_receiver_closing_at_a_random_event_never_fails_a_delivered_round() {
    for loss in LOSSES {
        for seed in 0..SEEDS {
            let base = run(Scenario::new(seed, loss));
            let at = 1 + (seed * 104_729) % (base.events + 1);
            close_both_ways(seed, loss, at);
        }
    }
}

/// A run is a function of its scenario: the same seed gives the same
/// events, times and rounds, bit for bit.
#[test]
fn the_same_seed_runs_the_same() {
    for loss in LOSSES {
        for seed in 0..50 {
            let (a, b) = (
                run(Scenario::new(seed, loss)),
                run(Scenario::new(seed, loss)),
            );
            assert_eq!(
                (a.events, a.elapsed),
                (b.events, b.elapsed),
                "loss {loss} seed {seed}"
            );
            assert_eq!(a.sent, b.sent);
            assert_eq!(a.lossy_lost, b.lossy_lost);
            let stats = |o: &Outcome| -> Vec<_> {
                o.delivered
                    .iter()
                    .map(|r| (r.index, r.stats.clone(), r.tensors.clone()))
                    .collect()
            };
            assert_eq!(stats(&a), stats(&b), "loss {loss} seed {seed}");
        }
    }
}
