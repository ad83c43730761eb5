//! One schedule drawn from a seed, in either mode: the ranks, how fast
//! the network and the failure detector are, the faults by time, and
//! what the mode's own ranks start from (its setup); and the draws both
//! modes make.

use crate::settings::Settings;
use gradlane_core::rng::SplitMix64;

/// Something that goes wrong while the ranks run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The rank's process dies: what it had sent may still arrive, in
    /// order, up to a point; every peer loses it a while after. It comes
    /// back (a fresh process asking to rejoin) this long after, if at all
    /// (never in an agreement alone).
    Kill {
        /// The rank.
        rank: usize,
        /// How long until its process starts again.
        restart_after: Option<u64>,
    },
    /// The rank takes nothing in until `until` (what comes for it
    /// waits); its peers may lose it meanwhile (the [`Fault::Cut`]s drawn
    /// with it, their failure detectors firing).
    Freeze {
        /// The rank.
        rank: usize,
        /// When it takes things in again.
        until: u64,
    },
    /// The links between two ranks fail: of what was on each way, a
    /// prefix arrives.
    Cut(usize, usize),
    /// Every link between the two sides (`true` is one side) fails, and
    /// no new one forms across until `until`.
    Partition {
        /// Each rank's side.
        sides: Vec<bool>,
        /// When the network heals.
        until: u64,
    },
    /// Messages between two ranks take `extra` longer until `until`.
    Slow {
        /// One rank.
        a: usize,
        /// The other.
        b: usize,
        /// The added delay.
        extra: u64,
        /// When the link is fast again.
        until: u64,
    },
}

impl Fault {
    /// Whether the fault breaks nothing (it only slows a link down or
    /// holds a rank up): a schedule of only these completes every
    /// program, as a healthy one does.
    pub(crate) fn benign(&self) -> bool {
        matches!(self, Fault::Slow { .. } | Fault::Freeze { .. })
    }

    /// The time after which the fault no longer acts.
    fn ends(&self, at: u64) -> u64 {
        match self {
            Fault::Freeze { until, .. }
            | Fault::Partition { until, .. }
            | Fault::Slow { until, .. } => *until,
            _ => at,
        }
    }
}

/// One schedule.
#[derive(Debug, Clone)]
pub(crate) struct Plan<S> {
    /// The seed it was drawn from.
    pub seed: u64,
    /// The ranks: the view agreeing, or the group (every rank a member of
    /// view 0).
    pub n: usize,
    /// The faults, by time.
    pub faults: Vec<(u64, Fault)>,
    /// No fault acts after this time: from then on the network is quiet.
    pub quiet: u64,
    /// The longest a message takes (at least 1).
    pub max_delay: u64,
    /// How long a link's failure takes to notice: from, to.
    pub notice: (u64, u64),
    /// Chance in 256 that a send on a failed link fails at once (the rank
    /// learns the loss from the send, not from its reader).
    pub send_fails: u64,
    /// What the mode's ranks start from.
    pub setup: S,
}

/// How fast the network and the failure detector are: the longest a
/// message takes, how long a failure takes to notice (from, to), and the
/// chance in 256 that a send on a failed link fails at once.
pub(crate) type Network = (u64, (u64, u64), u64);

impl<S> Plan<S> {
    /// The schedule of `seed`: `n` ranks on `network`, with `faults` (in
    /// any order) and `setup`.
    pub(crate) fn new(
        seed: u64,
        n: usize,
        network: Network,
        faults: Vec<(u64, Fault)>,
        setup: S,
    ) -> Self {
        let (max_delay, notice, send_fails) = network;
        let mut faults = faults;
        faults.sort_by_key(|f| f.0);
        let quiet = faults.iter().map(|(t, f)| f.ends(*t)).max().unwrap_or(0);
        Self {
            seed,
            n,
            faults,
            quiet,
            max_delay,
            notice,
            send_fails,
            setup,
        }
    }

    /// Whether every fault is benign (none at all included).
    pub(crate) fn benign(&self) -> bool {
        self.faults.iter().all(|(_, f)| f.benign())
    }
}

/// How many ranks, from `settings` (at most `cap`): small groups more
/// often, as most orders of events are there.
pub(crate) fn draw_size(rng: &mut SplitMix64, settings: &Settings, cap: usize) -> usize {
    let (lo, hi) = (settings.min_ranks.max(2), settings.max_ranks.max(2));
    let hi = hi.max(lo).min(cap);
    let lo = lo.min(hi);
    let top = match rng.below(2) {
        0 => hi.min(lo + 3),
        _ => hi,
    };
    lo + rng.below(top - lo + 1)
}

/// How fast the network and the failure detector are: the longest a
/// message takes one of `delays`, the slowest failure detector `slowest`.
pub(crate) fn draw_network(rng: &mut SplitMix64, delays: [u64; 3], slowest: u64) -> Network {
    let max_delay = delays[rng.below(3)];
    let notice = match rng.below(3) {
        0 => (1, 10),
        1 => (5, 60),
        _ => (30, slowest),
    };
    let send_fails = [0, 64, 255][rng.below(3)];
    (max_delay, notice, send_fails)
}

/// Two different ranks of `n`.
pub(crate) fn draw_pair(rng: &mut SplitMix64, n: usize) -> (usize, usize) {
    let a = rng.below(n);
    (a, (a + 1 + rng.below(n - 1)) % n)
}

/// The link between two different ranks of `n` cut.
pub(crate) fn draw_cut(rng: &mut SplitMix64, n: usize) -> Fault {
    let (a, b) = draw_pair(rng, n);
    Fault::Cut(a, b)
}

/// Each of `n` ranks' side of a partition.
pub(crate) fn draw_sides(rng: &mut SplitMix64, n: usize) -> Vec<bool> {
    (0..n).map(|_| rng.below(2) == 0).collect()
}

/// `rank` frozen from `t` to `until`, and its peers that lose it
/// meanwhile (each a third of the time, at a time drawn within).
pub(crate) fn draw_freeze(
    rng: &mut SplitMix64,
    n: usize,
    (t, rank, until): (u64, usize, u64),
    faults: &mut Vec<(u64, Fault)>,
) {
    faults.push((t, Fault::Freeze { rank, until }));
    for p in (0..n).filter(|&p| p != rank) {
        if rng.below(3) == 0 {
            let at = t + rng.below((until - t) as usize) as u64;
            faults.push((at, Fault::Cut(p, rank)));
        }
    }
}
