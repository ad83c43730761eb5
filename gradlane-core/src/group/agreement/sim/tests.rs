//! The simulation run: thousands of schedules against every invariant,
//! a flawed machine that it must catch, and one seed replayed.

use super::*;
use crate::group::agreement::Flaw;
use std::time::Instant;

/// How to replay `seed` from this module's tests (a flaw included).
fn replay_test(seed: u64, flaw: Option<Flaw>) -> String {
    let flaw = match flaw {
        Some(Flaw::NoQuorum) => " GRADLANE_AGREEMENT_FLAW=no-quorum",
        Some(Flaw::Impatient) => " GRADLANE_AGREEMENT_FLAW=impatient",
        Some(Flaw::Hasty) => " GRADLANE_AGREEMENT_FLAW=hasty",
        None => "",
    };
    format!(
        "GRADLANE_AGREEMENT_SEED={seed}{flaw} cargo test -p gradlane-core --lib \
         group::agreement::sim::tests::replay -- --nocapture"
    )
}

#[test]
fn thousands_of_schedules_keep_every_invariant() {
    let settings = Settings::default();
    let schedules = 100_000;
    let started = Instant::now();
    let tally = soak(54, 0, schedules, &settings);
    let secs = started.elapsed().as_secs_f64();
    let summary = format!(
        "{} schedules in {secs:.1} s ({:.0} schedules/s): {} members, {} removed, {} no quorum; \
         {} abandoned; {} schedules with two views installed for one epoch (first: seed {:?})",
        tally.schedules,
        tally.schedules as f64 / secs,
        tally.members,
        tally.removed,
        tally.no_quorum,
        tally.abandoned,
        tally.disagreements,
        tally.first_disagreement,
    );
    println!("{summary}");
    // The test command shows this line without running the test again.
    if let Some(path) = std::env::var_os("GRADLANE_AGREEMENT_SUMMARY") {
        std::fs::write(path, format!("{summary}\n")).expect("the summary file is writable");
    }
    for (seed, violation) in &tally.failures {
        println!(
            "seed {seed}: {violation}\n  replay: {}",
            replay_test(*seed, None)
        );
    }
    assert_eq!(tally.failed, 0, "schedules that broke an invariant");
    // Every kind of outcome came up: the schedules reach the cases.
    assert!(tally.members > 0 && tally.removed > 0 && tally.no_quorum > 0);
}

/// The first seed from `base` whose schedule under `flaw` breaks an
/// invariant that `wanted` accepts, within `tries`.
fn find(flaw: Flaw, tries: u64, wanted: impl Fn(&Violation) -> bool) -> Option<(u64, Violation)> {
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

#[test]
fn a_coordinator_that_decides_without_a_quorum_is_caught() {
    let found = find(Flaw::NoQuorum, 2000, |v| {
        matches!(v, Violation::SplitViews { .. })
    });
    let Some((seed, violation)) = found else {
        panic!("no schedule split the group though views need no quorum")
    };
    println!(
        "seed {seed}: {violation}\n  replay: {}",
        replay_test(seed, Some(Flaw::NoQuorum))
    );
}

#[test]
fn a_coordinator_that_does_not_wait_for_every_proposal_is_caught() {
    let found = find(Flaw::Impatient, 2000, |v| {
        matches!(v, Violation::Unactionable { .. })
    });
    let Some((seed, violation)) = found else {
        panic!("no schedule caught a coordinator that decides without the proposals")
    };
    println!(
        "seed {seed}: {violation}\n  replay: {}",
        replay_test(seed, Some(Flaw::Impatient))
    );
}

/// No member installs a view another member did not accept: over many
/// seeds no two ranks install different views for one epoch (the
/// schedules that made two coordinators decide before issue 54 are among
/// them).
#[test]
fn two_coordinators_never_install_two_views() {
    let settings = Settings::default();
    let found: Vec<u64> = (0..20_000)
        .map(|i| schedule_seed(7, i))
        .filter(|&seed| run(seed, &settings).disagreed())
        .collect();
    assert!(
        found.is_empty(),
        "seeds with two views installed: {found:?}"
    );
}

/// The acceptance round is what closes the gap: a member that installs
/// the first decision it hears, without waiting for every member to
/// accept it, is caught installing a view another member did not, and
/// the seed replays to the same violation.
#[test]
fn a_member_that_installs_before_every_member_accepted_is_caught() {
    let found = find(Flaw::Hasty, 2000, |v| v.is_disagreement());
    let Some((seed, violation)) = found else {
        panic!("no schedule caught a member installing a view before every member accepted it")
    };
    let settings = Settings {
        flaw: Some(Flaw::Hasty),
        ..Settings::default()
    };
    let again = trace(seed, &settings);
    assert!(
        again.violations.contains(&violation),
        "seed {seed} does not replay"
    );
    println!(
        "seed {seed}: {violation}\n  replay: {}",
        replay_test(seed, Some(Flaw::Hasty))
    );
}

#[test]
fn a_schedule_replays_exactly() {
    let settings = Settings::default();
    for i in 0..200 {
        let seed = schedule_seed(3, i);
        let (a, b) = (run(seed, &settings), trace(seed, &settings));
        assert_eq!(
            (a.steps, a.messages, &a.outcomes, &a.violations),
            (b.steps, b.messages, &b.outcomes, &b.violations),
            "seed {seed}"
        );
    }
}

/// Replays one schedule with every event written out: the seed in
/// `GRADLANE_AGREEMENT_SEED`, a flaw in `GRADLANE_AGREEMENT_FLAW`
/// (`no-quorum`, `impatient`, `hasty`).
#[test]
fn replay() {
    let seed = std::env::var("GRADLANE_AGREEMENT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| schedule_seed(54, 0));
    let flaw = match std::env::var("GRADLANE_AGREEMENT_FLAW").as_deref() {
        Ok("no-quorum") => Some(Flaw::NoQuorum),
        Ok("impatient") => Some(Flaw::Impatient),
        Ok("hasty") => Some(Flaw::Hasty),
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
