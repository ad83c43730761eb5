//! The whole group: every invariant over many schedules, and a healthy
//! schedule's exact counts.

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
