//! One schedule drawn from a seed: the group, its program of collectives,
//! how fast the network and the failure detector are, the bounds each
//! rank waits, and the faults until the network goes quiet.

use super::Settings;
use crate::rng::SplitMix64;

/// How many times one rank may come back (after a death, a removal or a
/// failed admission) in one schedule.
pub(super) const MAX_RESTARTS: usize = 2;

/// How many contacts a restarted rank asks before it gives up.
pub(super) const MAX_ATTEMPTS: u32 = 6;

/// Something that goes wrong while the ranks run their programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fault {
    /// The rank's process dies: what it had sent may still arrive, in
    /// order, up to a point; every peer loses it a while after. It comes
    /// back (a fresh process asking to rejoin) this long after, if at all.
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
    /// The links between two ranks fail (their current one, and one
    /// being formed): of what was on each way, a prefix arrives.
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
    pub(super) fn benign(&self) -> bool {
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
pub(super) struct Plan {
    /// The group's size: every rank a member of view 0.
    pub n: usize,
    /// Collectives in each rank's program.
    pub calls: u64,
    /// What rank `r`'s input to call `c` is drawn from.
    pub values: u64,
    /// The faults, by time.
    pub faults: Vec<(u64, Fault)>,
    /// No fault acts after this time: the network is healthy for the
    /// live ranks (partitions healed) from then on.
    pub quiet: u64,
    /// The longest a message takes (at least 1).
    pub max_delay: u64,
    /// The longest a rank computes between two calls.
    pub compute: u64,
    /// How long a link's failure takes to notice: from, to.
    pub notice: (u64, u64),
    /// Chance in 256 that a send on a failed link fails at once (the rank
    /// learns the loss from the send, not from its reader).
    pub send_fails: u64,
    /// How long a rank forming a mesh waits for each member.
    pub form_wait: u64,
    /// How long a rank asking to rejoin waits for its contact.
    pub join_wait: u64,
    /// How long a rank that finished its program keeps its links open.
    pub linger: u64,
    /// Whether a rank that its keeper removed (or found without a quorum)
    /// comes back as a fresh process, as an elastic launcher restarts it.
    pub restart_removed: bool,
}

impl Plan {
    /// The schedule `rng` draws under `settings`.
    pub(super) fn draw(rng: &mut SplitMix64, settings: &Settings) -> Self {
        let (lo, hi) = (settings.min_ranks.max(2), settings.max_ranks.max(2));
        let hi = hi.max(lo).min(crate::group::MAX_WORLD);
        let lo = lo.min(hi);
        // Small groups more often: most orders of events are there.
        let top = match rng.below(2) {
            0 => hi.min(lo + 3),
            _ => hi,
        };
        let n = lo + rng.below(top - lo + 1);
        let calls = 2 + rng.below(4) as u64;
        let values = rng.next_u64();
        let max_delay = [3, 10, 40][rng.below(3)];
        let notice = match rng.below(3) {
            0 => (1, 10),
            1 => (5, 60),
            _ => (30, 200),
        };
        let send_fails = [0, 64, 255][rng.below(3)];
        let compute = [0, 4 * max_delay, 20 * max_delay][rng.below(3)];
        let form_wait = 20 * max_delay + 100;
        let join_wait = 10 * max_delay + 100;
        let linger = 4 * max_delay + rng.below(200) as u64;
        let restart_removed = rng.below(2) == 0;
        // Faults come while the programs run: a call takes a few delays.
        let window = calls * (4 * max_delay + compute / 2) + 50;
        let mut faults = Vec::new();
        let count = match rng.below(6) {
            0 => 0,
            _ => rng.below(settings.max_faults + 1),
        };
        for _ in 0..count {
            let t = rng.below(window as usize) as u64;
            let pair = |rng: &mut SplitMix64| {
                let a = rng.below(n);
                (a, (a + 1 + rng.below(n - 1)) % n)
            };
            match rng.below(20) {
                0..=4 => {
                    let restart_after =
                        (rng.below(3) != 0).then(|| 10 + rng.below(window as usize / 2) as u64);
                    let rank = rng.below(n);
                    faults.push((
                        t,
                        Fault::Kill {
                            rank,
                            restart_after,
                        },
                    ));
                }
                5..=9 => {
                    let (a, b) = pair(rng);
                    faults.push((t, Fault::Cut(a, b)));
                }
                10..=12 => {
                    let sides = (0..n).map(|_| rng.below(2) == 0).collect();
                    // Healed later, or only once the network goes quiet.
                    let until = match rng.below(2) {
                        0 => t + 1 + rng.below(4 * max_delay as usize + 100) as u64,
                        _ => window,
                    };
                    faults.push((t, Fault::Partition { sides, until }));
                }
                13..=15 => {
                    let (a, b) = pair(rng);
                    let extra = 1 + rng.below(6 * max_delay as usize) as u64;
                    let until = t + 1 + rng.below(window as usize) as u64;
                    faults.push((t, Fault::Slow { a, b, extra, until }));
                }
                _ => {
                    let rank = rng.below(n);
                    let until = t + 1 + rng.below(3 * notice.1 as usize + 50) as u64;
                    faults.push((t, Fault::Freeze { rank, until }));
                    // Its peers may lose it while it is frozen.
                    for p in (0..n).filter(|&p| p != rank) {
                        if rng.below(3) == 0 {
                            let at = t + rng.below((until - t) as usize) as u64;
                            faults.push((at, Fault::Cut(p, rank)));
                        }
                    }
                }
            }
        }
        faults.sort_by_key(|f| f.0);
        let quiet = faults.iter().map(|(t, f)| f.ends(*t)).max().unwrap_or(0);
        Self {
            n,
            calls,
            values,
            faults,
            quiet,
            max_delay,
            compute,
            notice,
            send_fails,
            form_wait,
            join_wait,
            linger,
            restart_removed,
        }
    }

    /// Whether every fault is benign (none at all included): nothing
    /// fails, so every program completes in view 0.
    pub(super) fn benign(&self) -> bool {
        self.faults.iter().all(|(_, f)| f.benign())
    }

    /// Rank `rank`'s input to call `call`.
    pub(super) fn value(&self, rank: usize, call: u64) -> u64 {
        SplitMix64::at(self.values, ((rank as u64) << 40) | call)
    }

    /// The result of call `call` run among `members` (increasing): a
    /// fold over each member and its input, so equal bits mean the same
    /// members and call (but for a 64-bit collision).
    pub(super) fn fold(&self, members: &[usize], call: u64) -> u64 {
        fold_values(call, members.iter().map(|&m| (m, self.value(m, call))))
    }
}

/// The fold of `(member, value)` pairs in the order given, for call
/// `call`: what every rank computes from the contributions it received.
pub(super) fn fold_values(call: u64, pairs: impl IntoIterator<Item = (usize, u64)>) -> u64 {
    let mut h = SplitMix64::at(call, 0);
    for (m, v) in pairs {
        h = SplitMix64::at(h ^ m as u64, 1);
        h = SplitMix64::at(h ^ v, 2);
    }
    h
}
