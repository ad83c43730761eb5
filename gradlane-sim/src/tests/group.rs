//! The whole group: every invariant over many schedules, a healthy
//! schedule's exact counts, and flawed keepers caught.

use super::*;

#[test]
fn thousands_of_group_schedules_keep_every_invariant() {
    let tally = soak_and_report(Mode::Group, 10_000);
    // The schedules reach the cases: views change, calls run again, ranks
    // are removed and rejoin.
    let c = &tally.counts;
    assert!(c.views > 0 && c.reruns > 0 && c.removed > 0, "{c:?}");
    assert!(c.admissions > 0 && c.joined > 0, "{c:?}");
}

/// Schedules without faults run every program to the end in view 0:
/// their counts are exact.
#[test]
fn a_schedule_without_faults_completes_every_program_with_equal_bits() {
    let settings = Settings {
        max_faults: 0,
        ..Settings::new(Mode::Group)
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

/// Without the `Done` round a rank returns a result that the others,
/// still in the call when a rank dies, run again among fewer ranks.
#[test]
fn a_keeper_that_returns_without_done_is_caught() {
    let what = "a keeper returning without the Done round";
    caught(Mode::Group, KeeperFlaw::NoDone, 3000, what, |v| {
        matches!(
            v,
            Violation::ResultsDiffer { .. } | Violation::ReturnAfterRemoval { .. }
        )
    });
}

/// An agreement that decides without a quorum lets both sides of a
/// partition install a view of the same epoch.
#[test]
fn an_agreement_without_a_quorum_is_caught() {
    let flaw = KeeperFlaw::Agreement(Flaw::NoQuorum);
    let what = "an agreement deciding without a quorum";
    caught(Mode::Group, flaw, 3000, what, |v| {
        matches!(v, Violation::SplitViews { .. })
    });
}
