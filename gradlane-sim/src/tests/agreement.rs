//! The agreement alone: every invariant over many schedules, and never
//! two views installed for one epoch.

use super::*;

#[test]
fn thousands_of_agreements_keep_every_invariant() {
    let tally = soak_and_report(Mode::Agreement, 100_000);
    // Every kind of outcome came up: the schedules reach the cases.
    let c = &tally.counts;
    assert!(c.members > 0 && c.left_out > 0 && c.no_quorum > 0, "{c:?}");
}

/// No member installs a view another member did not accept: over many
/// seeds no two ranks install different views for one epoch (the
/// schedules that made two coordinators decide before issue 54 are among
/// them).
#[test]
fn two_coordinators_never_install_two_views() {
    let settings = Settings::new(Mode::Agreement);
    let found: Vec<u64> = (0..20_000)
        .map(|i| schedule_seed(7, i))
        .filter(|&seed| run(seed, &settings).disagreed())
        .collect();
    assert!(
        found.is_empty(),
        "seeds with two views installed: {found:?}"
    );
}
