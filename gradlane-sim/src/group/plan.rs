//! A group's schedule drawn from a seed.

use crate::plan::{
    draw_cut, draw_freeze, draw_network, draw_pair, draw_sides, draw_size, Fault, Plan,
};
use crate::settings::Settings;
use gradlane_core::group::MAX_WORLD;
use gradlane_core::rng::SplitMix64;

/// How many times one rank may come back (after a death, a removal or a
/// failed admission) in one schedule.
pub(crate) const MAX_RESTARTS: usize = 2;

/// How many contacts a restarted rank asks before it gives up.
pub(crate) const MAX_ATTEMPTS: u32 = 6;

/// What the ranks of a group start from: their program, the bounds each
/// waits, whether the removed come back.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    /// Collectives in each rank's program.
    pub calls: u64,
    /// What rank `r`'s input to call `c` is drawn from.
    pub values: u64,
    /// The longest a rank computes between two calls.
    pub compute: u64,
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

impl Setup {
    /// Rank `rank`'s input to call `call`.
    pub(crate) fn value(&self, rank: usize, call: u64) -> u64 {
        SplitMix64::at(self.values, ((rank as u64) << 40) | call)
    }

    /// The result of call `call` run among `members` (increasing): a
    /// fold over each member and its input, so equal bits mean the same
    /// members and call (but for a 64-bit collision).
    pub(crate) fn fold(&self, members: &[usize], call: u64) -> u64 {
        fold_values(call, members.iter().map(|&m| (m, self.value(m, call))))
    }
}

/// The schedule of a group of `seed` that `rng` draws under `settings`: the group, its
/// program of collectives, how fast the network and the failure detector
/// are, the bounds each rank waits, and the faults (during the programs,
/// agreements, meshes forming and admissions) until the network goes
/// quiet.
pub(crate) fn draw(seed: u64, rng: &mut SplitMix64, settings: &Settings) -> Plan<Setup> {
    let n = draw_size(rng, settings, MAX_WORLD);
    let calls = 2 + rng.below(4) as u64;
    let values = rng.next_u64();
    let network = draw_network(rng, [3, 10, 40], 200);
    let (max_delay, notice, _) = network;
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
        let fault = match rng.below(20) {
            0..=4 => {
                let restart_after =
                    (rng.below(3) != 0).then(|| 10 + rng.below(window as usize / 2) as u64);
                let rank = rng.below(n);
                Fault::Kill {
                    rank,
                    restart_after,
                }
            }
            5..=9 => draw_cut(rng, n),
            10..=12 => {
                let sides = draw_sides(rng, n);
                // Healed later, or only once the network goes quiet.
                let until = match rng.below(2) {
                    0 => t + 1 + rng.below(4 * max_delay as usize + 100) as u64,
                    _ => window,
                };
                Fault::Partition { sides, until }
            }
            13..=15 => {
                let (a, b) = draw_pair(rng, n);
                let extra = 1 + rng.below(6 * max_delay as usize) as u64;
                let until = t + 1 + rng.below(window as usize) as u64;
                Fault::Slow { a, b, extra, until }
            }
            _ => {
                let rank = rng.below(n);
                let until = t + 1 + rng.below(3 * notice.1 as usize + 50) as u64;
                draw_freeze(rng, n, (t, rank, until), &mut faults);
                continue;
            }
        };
        faults.push((t, fault));
    }
    let setup = Setup {
        calls,
        values,
        compute,
        form_wait,
        join_wait,
        linger,
        restart_removed,
    };
    Plan::new(seed, n, network, faults, setup)
}

/// The fold of `(member, value)` pairs in the order given, for call
/// `call`: what every rank computes from the contributions it received.
pub(crate) fn fold_values(call: u64, pairs: impl IntoIterator<Item = (usize, u64)>) -> u64 {
    let mut h = SplitMix64::at(call, 0);
    for (m, v) in pairs {
        h = SplitMix64::at(h ^ m as u64, 1);
        h = SplitMix64::at(h ^ v, 2);
    }
    h
}
