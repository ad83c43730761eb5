//! Each deliberate flaw in the machines, caught by the checks.

use super::*;

/// How the checks must catch a flaw: the mode it shows in, the flaw,
/// what it does, and the violation it must cause.
type Case = (Mode, KeeperFlaw, &'static str, fn(&Violation) -> bool);

/// Each flaw shows, within a few thousand schedules, as the violation it
/// must cause, and its seed replays to it:
/// - a coordinator that decides without a quorum splits the view (two
///   decisions each taken whole; in a group, both sides of a partition
///   install a view of one epoch);
/// - a coordinator that does not wait for every proposal decides what
///   some member cannot act on;
/// - a member that installs the first decision it hears, without the
///   acceptance round, installs a view another member did not;
/// - a keeper that returns without the `Done` round returns a result
///   the others, still in the call when a rank dies, run again among
///   fewer ranks.
#[test]
fn every_flaw_is_caught() {
    let cases: [Case; 5] = [
        (
            Mode::Agreement,
            KeeperFlaw::Agreement(Flaw::NoQuorum),
            "a coordinator deciding without a quorum",
            |v| matches!(v, Violation::SplitDecisions { .. }),
        ),
        (
            Mode::Agreement,
            KeeperFlaw::Agreement(Flaw::Impatient),
            "a coordinator deciding without the proposals",
            |v| matches!(v, Violation::Unactionable { .. }),
        ),
        (
            Mode::Agreement,
            KeeperFlaw::Agreement(Flaw::Hasty),
            "a member installing a view before every member accepted it",
            Violation::is_disagreement,
        ),
        (
            Mode::Group,
            KeeperFlaw::NoDone,
            "a keeper returning without the Done round",
            |v| {
                matches!(
                    v,
                    Violation::ResultsDiffer { .. } | Violation::ReturnAfterRemoval { .. }
                )
            },
        ),
        (
            Mode::Group,
            KeeperFlaw::Agreement(Flaw::NoQuorum),
            "an agreement deciding without a quorum",
            |v| matches!(v, Violation::SplitViews { .. }),
        ),
    ];
    for (mode, flaw, what, wanted) in cases {
        let tries = match mode {
            Mode::Agreement => 2000,
            Mode::Group => 3000,
        };
        caught(mode, flaw, tries, what, wanted);
    }
}
