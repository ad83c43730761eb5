//! An agreement's schedule drawn from a seed.

use crate::plan::{
    draw_cut, draw_freeze, draw_network, draw_pair, draw_sides, draw_size, Fault, Plan,
};
use crate::settings::Settings;
use gradlane_core::rng::SplitMix64;
use std::collections::BTreeSet;

/// No fault comes after this time: from then on the network is quiet, and
/// every rank left must decide.
const FAULTS_UNTIL: u64 = 300;

/// What the ranks of an agreement start from.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    /// The view's members, by the ranks they joined as.
    pub members: Vec<usize>,
    /// The size the group was formed with.
    pub world: usize,
    /// The view being agreed on.
    pub epoch: u64,
    /// Where each place's collective stands: its call, and whether it
    /// holds that call's result.
    pub at: Vec<(u64, bool)>,
    /// The places dead before the agreement.
    pub dead: Vec<usize>,
    /// The links cut before the agreement.
    pub cut: Vec<(usize, usize)>,
    /// What each place has lost when its agreement begins (some of the
    /// dead and cut; the rest it loses later).
    pub suspects: Vec<BTreeSet<usize>>,
    /// When a place that lost a rank begins on its own (the others begin
    /// when the first proposal or loss reaches them).
    pub start: Vec<Option<u64>>,
    /// How long after deciding each place closes its old links, if it
    /// does before the end (as it does once its new mesh forms).
    pub close_after: Vec<Option<u64>>,
}

/// The schedule of an agreement of `seed` that `rng` draws under
/// `settings`: the view,
/// where each rank's collective stands, the failure that began the
/// agreement, the faults while it runs (a freeze counts once, with the
/// losses of it that come with it; a partition never heals) and how fast
/// the network and the failure detector are.
pub(crate) fn draw(seed: u64, rng: &mut SplitMix64, settings: &Settings) -> Plan<Setup> {
    let n = draw_size(rng, settings, usize::MAX);
    let world = n + rng.below(4);
    let mut members: Vec<usize> = (0..world).collect();
    while members.len() > n {
        members.remove(rng.below(members.len()));
    }
    let epoch = 1 + rng.below(1000) as u64;
    let at = draw_calls(rng, n);

    let mut dead = Vec::new();
    for _ in 0..rng.below(n.min(3)) {
        let p = rng.below(n);
        if !dead.contains(&p) && dead.len() + 1 < n {
            dead.push(p);
        }
    }
    let live: Vec<usize> = (0..n).filter(|p| !dead.contains(p)).collect();
    let mut cut = Vec::new();
    if live.len() >= 2 {
        for _ in 0..rng.below(3) {
            let a = live[rng.below(live.len())];
            let b = live[rng.below(live.len())];
            if a != b && !cut.contains(&(a.min(b), a.max(b))) {
                cut.push((a.min(b), a.max(b)));
            }
        }
    }
    // Some failure began it: without one drawn, a death or a cut.
    if dead.is_empty() && cut.is_empty() {
        let (a, b) = draw_pair(rng, n);
        match rng.below(2) {
            0 => dead.push(b),
            _ => cut.push((a.min(b), a.max(b))),
        }
    }
    let suspects = draw_suspects(rng, n, &dead, &cut);
    let start = suspects
        .iter()
        .map(|s| (!s.is_empty()).then(|| rng.below(30) as u64))
        .collect();

    let mut faults = Vec::new();
    for _ in 0..rng.below(settings.max_faults + 1) {
        let t = rng.below(FAULTS_UNTIL as usize) as u64;
        let fault = match rng.below(20) {
            0..=4 => Fault::Kill {
                rank: rng.below(n),
                restart_after: None,
            },
            5..=10 => draw_cut(rng, n),
            11..=13 => Fault::Partition {
                sides: draw_sides(rng, n),
                until: t,
            },
            _ => {
                let rank = rng.below(n);
                let until = t + 1 + rng.below((FAULTS_UNTIL - t) as usize) as u64;
                draw_freeze(rng, n, (t, rank, until), &mut faults);
                continue;
            }
        };
        faults.push((t, fault));
    }

    let close_after = (0..n)
        .map(|_| (rng.below(2) == 0).then(|| 1 + rng.below(200) as u64))
        .collect();
    let network = draw_network(rng, [2, 10, 60], 250);
    let setup = Setup {
        members,
        world,
        epoch,
        at,
        dead,
        cut,
        suspects,
        start,
        close_after,
    };
    Plan::new(seed, n, network, faults, setup)
}

/// What each place has lost when its agreement begins: each of the dead
/// and each end of a cut, half the time; at least one somewhere.
fn draw_suspects(
    rng: &mut SplitMix64,
    n: usize,
    dead: &[usize],
    cut: &[(usize, usize)],
) -> Vec<BTreeSet<usize>> {
    let mut suspects = vec![BTreeSet::new(); n];
    for p in (0..n).filter(|p| !dead.contains(p)) {
        for &d in dead {
            if rng.below(2) == 0 {
                suspects[p].insert(d);
            }
        }
        for &(a, b) in cut {
            let other = match p {
                p if p == a => b,
                p if p == b => a,
                _ => continue,
            };
            if rng.below(2) == 0 {
                suspects[p].insert(other);
            }
        }
    }
    if suspects.iter().all(BTreeSet::is_empty) {
        // The failure was noticed somewhere first.
        match (cut.first(), dead.first()) {
            (Some(&(a, b)), _) => {
                suspects[a].insert(b);
            }
            (None, Some(&d)) => {
                if let Some(p) = (0..n).find(|q| !dead.contains(q)) {
                    suspects[p].insert(d);
                }
            }
            (None, None) => {}
        }
    }
    suspects
}

/// Where each of `n` ranks' collectives stands, as a real group can be:
/// calls differ by at most one, and a rank one call on returned the
/// call before, which it does only once every rank holds that call's
/// result.
fn draw_calls(rng: &mut SplitMix64, n: usize) -> Vec<(u64, bool)> {
    let call = 1 + rng.below(100) as u64;
    match rng.below(3) {
        // All in one call, each holding its result or not.
        0 => (0..n).map(|_| (call, rng.below(2) == 0)).collect(),
        // All in one call, all holding its result or none.
        1 => {
            let held = rng.below(2) == 0;
            vec![(call, held); n]
        }
        // Some one call on: the rest hold the call they are in.
        _ => (0..n)
            .map(|_| match rng.below(2) {
                0 => (call + 1, rng.below(2) == 0),
                _ => (call, true),
            })
            .collect(),
    }
}
