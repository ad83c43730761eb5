//! The simulation run in both modes: thousands of schedules against every
//! invariant, flawed machines it must catch, seeds that replay exactly,
//! and one seed replayed with every event written out.

mod agreement;
mod flaws;
mod group;

use super::*;
use gradlane_core::group::agreement::Flaw;
use gradlane_core::group::view_keeper::KeeperFlaw;
use std::time::Instant;

/// A flaw by its name in `GRADLANE_SIM_FLAW`.
fn flaw_named(name: &str) -> Option<KeeperFlaw> {
    match name {
        "no-quorum" => Some(KeeperFlaw::Agreement(Flaw::NoQuorum)),
        "impatient" => Some(KeeperFlaw::Agreement(Flaw::Impatient)),
        "hasty" => Some(KeeperFlaw::Agreement(Flaw::Hasty)),
        "no-done" => Some(KeeperFlaw::NoDone),
        _ => None,
    }
}

/// How to replay `seed` of `mode` from these tests (a flaw included).
fn replay_test(mode: Mode, seed: u64, flaw: Option<KeeperFlaw>) -> String {
    let flaw = match flaw {
        Some(KeeperFlaw::NoDone) => " GRADLANE_SIM_FLAW=no-done",
        Some(KeeperFlaw::Agreement(Flaw::NoQuorum)) => " GRADLANE_SIM_FLAW=no-quorum",
        Some(KeeperFlaw::Agreement(Flaw::Impatient)) => " GRADLANE_SIM_FLAW=impatient",
        Some(KeeperFlaw::Agreement(Flaw::Hasty)) => " GRADLANE_SIM_FLAW=hasty",
        _ => "",
    };
    format!(
        "GRADLANE_SIM_MODE={mode} GRADLANE_SIM_SEED={seed}{flaw} cargo test -p gradlane-sim \
         --lib tests::replay -- --nocapture"
    )
}

/// Runs `schedules` schedules of `mode` from seed 54, prints their
/// summary (and writes it where `GRADLANE_SIM_SUMMARY_<MODE>` says: the
/// test command shows it after the run), and fails on any invariant
/// broken.
fn soak_and_report(mode: Mode, schedules: u64) -> Tally {
    let started = Instant::now();
    let tally = soak(54, 0, schedules, &Settings::new(mode));
    let line = summary(mode, &tally, started.elapsed().as_secs_f64());
    println!("{mode}: {line}");
    let var = format!("GRADLANE_SIM_SUMMARY_{}", mode.name().to_uppercase());
    if let Some(path) = std::env::var_os(var) {
        std::fs::write(path, format!("{line}\n")).expect("the summary file is writable");
    }
    for (seed, violation) in &tally.failures {
        let replay = replay_test(mode, *seed, None);
        println!("seed {seed}: {violation}\n  replay: {replay}");
    }
    assert_eq!(tally.failed, 0, "schedules that broke an invariant");
    tally
}

/// Asserts that a schedule of `mode` under `flaw`, within `tries` from a
/// fixed base, breaks an invariant that `wanted` accepts (`what` says
/// what the flaw does, for the failure), and that its seed replays to
/// the same violation.
fn caught(
    mode: Mode,
    flaw: KeeperFlaw,
    tries: u64,
    what: &str,
    wanted: impl Fn(&Violation) -> bool,
) {
    let settings = Settings {
        flaw: Some(flaw),
        ..Settings::new(mode)
    };
    let found = (0..tries).find_map(|i| {
        let seed = schedule_seed(7, i);
        let report = run(seed, &settings);
        report
            .violations
            .into_iter()
            .find(|v| wanted(v))
            .map(|v| (seed, v))
    });
    let Some((seed, violation)) = found else {
        panic!("no schedule caught {what}")
    };
    let again = trace(seed, &settings);
    assert!(
        again.violations.contains(&violation),
        "seed {seed} does not replay"
    );
    let replay = replay_test(mode, seed, Some(flaw));
    println!("seed {seed}: {violation}\n  replay: {replay}");
}

/// Same seed, same schedule: traced twice, the same events; run without
/// the trace, the same counts and violations.
#[test]
fn a_schedule_replays_exactly() {
    for (mode, count) in [(Mode::Agreement, 200), (Mode::Group, 100)] {
        let settings = Settings::new(mode);
        for i in 0..count {
            let seed = schedule_seed(3, i);
            let (a, b) = (trace(seed, &settings), trace(seed, &settings));
            assert_eq!(a.trace, b.trace, "{mode} seed {seed}");
            let c = run(seed, &settings);
            assert_eq!(
                (a.steps, a.messages, &a.counts, &a.violations),
                (c.steps, c.messages, &c.counts, &c.violations),
                "{mode} seed {seed}"
            );
        }
    }
}

/// Replays one schedule with every event written out: the mode in
/// `GRADLANE_SIM_MODE` (`agreement`, `group`), the seed in
/// `GRADLANE_SIM_SEED`, a flaw in `GRADLANE_SIM_FLAW` (`no-quorum`,
/// `impatient`, `hasty`, `no-done`).
#[test]
fn replay() {
    let mode = match std::env::var("GRADLANE_SIM_MODE").as_deref() {
        Ok("agreement") => Mode::Agreement,
        _ => Mode::Group,
    };
    let seed = std::env::var("GRADLANE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| schedule_seed(54, 0));
    let flaw = std::env::var("GRADLANE_SIM_FLAW").ok();
    let settings = Settings {
        flaw: flaw.as_deref().and_then(flaw_named),
        ..Settings::new(mode)
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
