//! What the schedules are drawn from: the mode, the ranks, the faults.

use std::fmt;

/// Which part of the control plane a schedule runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The survivors' agreement on the next view, alone.
    Agreement,
    /// The whole group: collectives, agreements, meshes, admissions.
    Group,
}

impl Mode {
    /// Its name on a command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Agreement => "agreement",
            Mode::Group => "group",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the schedules are drawn from.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Which part of the control plane runs.
    pub mode: Mode,
    /// The fewest ranks (at least 2).
    pub min_ranks: usize,
    /// The most ranks (in a group, at most the core's `MAX_WORLD`).
    pub max_ranks: usize,
    /// The most faults in one schedule (a freeze counts once, with the
    /// losses of it that come with it).
    pub max_faults: usize,
    /// A deliberate fault in every machine, to show the checks find it.
    #[cfg(test)]
    pub(crate) flaw: Option<gradlane_core::group::view_keeper::KeeperFlaw>,
}

impl Settings {
    /// The settings the soak and the tests start from, in `mode`.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            min_ranks: 2,
            max_ranks: 16,
            max_faults: 4,
            #[cfg(test)]
            flaw: None,
        }
    }
}

/// The agreement's flaw in a keeper's flaw, if it is one.
#[cfg(test)]
pub(crate) fn agreement_flaw(
    flaw: gradlane_core::group::view_keeper::KeeperFlaw,
) -> Option<gradlane_core::group::agreement::Flaw> {
    match flaw {
        gradlane_core::group::view_keeper::KeeperFlaw::Agreement(f) => Some(f),
        _ => None,
    }
}
