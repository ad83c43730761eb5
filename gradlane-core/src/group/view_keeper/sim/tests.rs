//! The simulation run: thousands of schedules against every invariant,
//! a healthy schedule's exact counts, flawed keepers that it must catch,
//! and one seed replayed.

use super::*;
use crate::group::agreement::Flaw;
use crate::group::view_keeper::KeeperFlaw;
use std::time::Instant;

/// How to replay `seed` from this module's tests (a flaw included).
fn replay_test(seed: u64, flaw: Option<KeeperFlaw>) -> String {
    let flaw = match flaw {
        Some(KeeperFlaw::NoDone) => " GRADLANE_GROUP_FLAW=no-done",
        Some(KeeperFlaw::Agreement(Flaw::NoQuorum)) => " GRADLANE_GROUP_FLAW=no-quorum",
        Some(KeeperFlaw::Agreement(_)) => " GRADLANE_GROUP_FLAW=?",
        None => "",
    };
    format!(
        "GRADLANE_GROUP_SEED={seed}{flaw} cargo test -p gradlane-core --lib \
         group::view_keeper::sim::tests::replay -- --nocapture"
    )
}

#[test]
fn thousands_of_schedules_keep_every_invariant() {
    let settings = Settings::default();
    let schedules = 10_000;
    let started = Instant::now();
    let tally = soak(54, 0, schedules, &settings);
    let secs = started.elapsed().as_secs_f64();
    let c = &tally.counts;
    let summary = format!(
        "{} schedules in {secs:.1} s ({:.0} schedules/s): {} views installed, {} calls returned, \
         {} reruns, {} agreements, {} admissions ({} ranks joined, {} failed to link up), \
         {} removed, {} killed, {} restarts; {} epochs formed with different members, \
         {} hellos refused",
        tally.schedules,
        tally.schedules as f64 / secs,
        c.views,
        c.returned,
        c.reruns,
        c.agreements,
        c.admissions,
        c.joined,
        c.failed_admissions,
        c.removed,
        c.killed,
        c.restarts,
        c.clashes,
        c.refused_hellos,
    );
    println!("{summary}");
    // The test command shows it after the run (scripts/test.sh).
    if let Some(path) = std::env::var_os("GRADLANE_GROUP_SIM_SUMMARY") {
        std::fs::write(path, format!("{summary}\n")).expect("the summary file is writable");
    }
    for (seed, violation) in &tally.failures {
        println!(
            "seed {seed}: {violation}\n  replay: {}",
            replay_test(*seed, None)
        );
    }
    assert_eq!(tally.failed, 0, "schedules that broke an invariant");
    // The schedules reach the cases: views change, calls run again, ranks
    // are removed and rejoin.
    assert!(c.views > 0 && c.reruns > 0 && c.removed > 0, "{c:?}");
    assert!(c.admissions > 0 && c.joined > 0, "{c:?}");
}

/// The first seed (of `tries`) whose schedule in a plan without faults
/// runs every program to the end: its counts are exact.
#[test]
fn a_schedule_without_faults_completes_every_program_with_equal_bits() {
    let settings = Settings {
        max_faults: 0,
        ..Settings::default()
    };
    for i in 0..50 {
        let seed = schedule_seed(11, i);
        let report = trace(seed, &settings);
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}",
            report.violations
        );
        let n = report.ranks as u64;
        let c = &report.counts;
        assert_eq!(
            c.returned,
            n * report.calls,
            "seed {seed}: every call returned"
        );
        assert_eq!(
            (c.agreements, c.reruns, c.views, c.removed, c.admissions),
            (0, 0, 0, 0, 0),
            "seed {seed}: nothing changed"
        );
        // Each call: an exchange and a Done between every ordered pair.
        assert_eq!(report.messages, 2 * n * (n - 1) * report.calls);
    }
}

/// The first seed from a fixed base whose schedule under `flaw` breaks an
/// invariant that `wanted` accepts, within `tries`.
fn find(
    flaw: KeeperFlaw,
    tries: u64,
    wanted: impl Fn(&Violation) -> bool,
) -> Option<(u64, Violation)> {
    let settings = Settings {
        flaw: Some(flaw),
        ..Settings::default()
    };
    (0..tries).find_map(|i| {
        let seed = schedule_seed(7, i);
        let report = run(seed, &settings);
        report
            .violations
            .into_iter()
            .find(|v| wanted(v))
            .map(|v| (seed, v))
    })
}

/// Without the `Done` round a rank returns a result that the others,
/// still in the call when a rank dies, run again among fewer ranks.
#[test]
fn a_keeper_that_returns_without_done_is_caught() {
    let flaw = KeeperFlaw::NoDone;
    let found = find(flaw, 3000, |v| {
        matches!(
            v,
            Violation::ResultsDiffer { .. } | Violation::ReturnAfterRemoval { .. }
        )
    });
    let Some((seed, violation)) = found else {
        panic!("no schedule caught a keeper returning without the Done round")
    };
    let settings = Settings {
        flaw: Some(flaw),
        ..Settings::default()
    };
    let again = trace(seed, &settings);
    assert!(
        again.violations.contains(&violation),
        "seed {seed} does not replay"
    );
    println!(
        "seed {seed}: {violation}\n  replay: {}",
        replay_test(seed, Some(flaw))
    );
}

/// An agreement that decides without a quorum lets both sides of a
/// partition install a view of the same epoch.
#[test]
fn an_agreement_without_a_quorum_is_caught() {
    let flaw = KeeperFlaw::Agreement(Flaw::NoQuorum);
    let found = find(flaw, 3000, |v| matches!(v, Violation::SplitViews { .. }));
    let Some((seed, violation)) = found else {
        panic!("no schedule split the group though views need no quorum")
    };
    println!(
        "seed {seed}: {violation}\n  replay: {}",
        replay_test(seed, Some(flaw))
    );
}

#[test]
fn a_schedule_replays_exactly() {
    let settings = Settings::default();
    for i in 0..100 {
        let seed = schedule_seed(3, i);
        let (a, b) = (trace(seed, &settings), trace(seed, &settings));
        assert_eq!(a.trace, b.trace, "seed {seed}");
        let c = run(seed, &settings);
        assert_eq!(
            (a.steps, a.messages, &a.counts, &a.violations),
            (c.steps, c.messages, &c.counts, &c.violations),
            "seed {seed}"
        );
    }
}

/// Replays one schedule with every event written out: the seed in
/// `GRADLANE_GROUP_SEED`, a flaw in `GRADLANE_GROUP_FLAW` (`no-done`,
/// `no-quorum`).
#[test]
fn replay() {
    let seed = std::env::var("GRADLANE_GROUP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| schedule_seed(54, 0));
    let flaw = match std::env::var("GRADLANE_GROUP_FLAW").as_deref() {
        Ok("no-done") => Some(KeeperFlaw::NoDone),
        Ok("no-quorum") => Some(KeeperFlaw::Agreement(Flaw::NoQuorum)),
        _ => None,
    };
    let settings = Settings {
        flaw,
        ..Settings::default()
    };
    let report = trace(seed, &settings);
    for line in &report.trace {
        println!("{line}");
    }
    for v in &report.violations {
        println!("violation: {v}");
    }
    assert!(!report.trace.is_empty());
}
