//! What one schedule did: its counts, its violations, its trace.

use crate::settings::Mode;
use crate::violation::Violation;

/// What one schedule did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Its seed.
    pub seed: u64,
    /// Its mode.
    pub mode: Mode,
    /// The view's or the group's size.
    pub ranks: usize,
    /// Calls in each program (0 in an agreement alone).
    pub calls: u64,
    /// Events it took.
    pub steps: u64,
    /// Messages sent on links.
    pub messages: u64,
    /// What the ranks did.
    pub counts: Counts,
    /// The invariants it broke.
    pub violations: Vec<Violation>,
    /// Every event, where it was run by [`trace`](crate::trace).
    pub trace: Vec<String>,
}

impl Report {
    /// Whether two of its ranks installed different views.
    pub fn disagreed(&self) -> bool {
        self.violations.iter().any(Violation::is_disagreement)
    }
}

/// What the ranks of a schedule (or many) did, counted. An agreement
/// alone counts its outcomes; a group counts the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Agreement: ranks that took a view they are members of.
    pub members: u64,
    /// Agreement: ranks that took a view without them.
    pub left_out: u64,
    /// Agreement: ranks that took "no quorum".
    pub no_quorum: u64,
    /// Agreement: members that stopped because the view they accepted
    /// could not be installed by all its members.
    pub abandoned: u64,
    /// Views installed (a mesh whole at a rank, its admission included),
    /// after view 0.
    pub views: u64,
    /// Calls returned.
    pub returned: u64,
    /// Exchanges run again among a new view.
    pub reruns: u64,
    /// Agreements begun.
    pub agreements: u64,
    /// Admissions begun by members.
    pub admissions: u64,
    /// Ranks admitted: a rejoining rank whose new mesh was whole.
    pub joined: u64,
    /// Rejoining ranks whose mesh was not whole.
    pub failed_admissions: u64,
    /// Keepers that failed removed (or without a quorum).
    pub removed: u64,
    /// Keepers that failed out of step.
    pub out_of_step: u64,
    /// Calls failed on a message out of its order.
    pub fatal: u64,
    /// Ranks killed.
    pub killed: u64,
    /// Fresh processes started to rejoin.
    pub restarts: u64,
    /// Rejoining ranks that gave up.
    pub gave_up: u64,
    /// Epochs for which ranks formed meshes of different members (an
    /// admission and an agreement that overlapped; neither mesh whole).
    pub clashes: u64,
    /// Hellos a rank forming a mesh refused (the same epoch with other
    /// members): it stopped, as the shell's does.
    pub refused_hellos: u64,
}

impl Counts {
    /// Adds `other`.
    pub fn add(&mut self, other: &Counts) {
        self.members += other.members;
        self.left_out += other.left_out;
        self.no_quorum += other.no_quorum;
        self.abandoned += other.abandoned;
        self.views += other.views;
        self.returned += other.returned;
        self.reruns += other.reruns;
        self.agreements += other.agreements;
        self.admissions += other.admissions;
        self.joined += other.joined;
        self.failed_admissions += other.failed_admissions;
        self.removed += other.removed;
        self.out_of_step += other.out_of_step;
        self.fatal += other.fatal;
        self.killed += other.killed;
        self.restarts += other.restarts;
        self.gave_up += other.gave_up;
        self.clashes += other.clashes;
        self.refused_hellos += other.refused_hellos;
    }
}
