//! The agreement alone: every invariant over many schedules, and each
//! of its flaws caught.

use super::*;

#[test]
fn thousands_of_agreements_keep_every_invariant() {
    let tally = soak_and_report(Mode::Agreement, 100_000);
    // Every kind of outcome came up: the schedules reach the cases.
    let c = &tally.counts;
    assert!(c.members > 0 && c.left_out > 0 && c.no_quorum > 0, "{c:?}");
}

#[test]
fn a_coordinator_that_decides_without_a_quorum_is_caught() {
    let flaw = KeeperFlaw::Agreement(Flaw::NoQuorum);
    let what = "a coordinator deciding without a quorum";
    caught(Mode::Agreement, flaw, 2000, what, |v| {
        matches!(v, Violation::SplitDecisions { .. })
    });
}

#[test]
fn a_coordinator_that_does_not_wait_for_every_proposal_is_caught() {
    let flaw = KeeperFlaw::Agreement(Flaw::Impatient);
    let what = "a coordinator deciding without the proposals";
    caught(Mode::Agreement, flaw, 2000, what, |v| {
        matches!(v, Violation::Unactionable { .. })
    });
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

/// The acceptance round is what closes the gap: a member that installs
/// the first decision it hears, without waiting for every member to
/// accept it, is caught installing a view another member did not.
#[test]
fn a_member_that_installs_before_every_member_accepted_is_caught() {
    let flaw = KeeperFlaw::Agreement(Flaw::Hasty);
    let what = "a member installing a view before every member accepted it";
    caught(
        Mode::Agreement,
        flaw,
        2000,
        what,
        Violation::is_disagreement,
    );
}
