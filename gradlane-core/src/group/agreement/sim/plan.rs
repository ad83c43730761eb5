//! One schedule drawn from a seed: the view, where each rank's collective
//! stands, the failure that began the agreement, the faults while it runs
//! and how fast the network and the failure detector are.

use super::Settings;
use crate::rng::SplitMix64;
use std::collections::BTreeSet;

/// No fault comes after this time: from then on the network is quiet, and
/// every rank left must decide.
pub(super) const FAULTS_UNTIL: u64 = 300;

/// Something that goes wrong while the ranks agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fault {
    /// The rank stops: what it had sent may still arrive, in order, up to
    /// a point; every peer loses it a while after.
    Kill(usize),
    /// The link between two ranks fails: what was on it may still
    /// arrive, in order, up to a point; each end loses the other a while
    /// after.
    Cut(usize, usize),
    /// Every link between the two sides fails (`true` is one side).
    Partition(Vec<bool>),
    /// The rank stops taking anything in until `until` (what comes for it
    /// waits); its peers may lose it meanwhile ([`Fault::Cut`]s drawn
    /// with it).
    Freeze {
        /// Which place.
        rank: usize,
        /// When it takes things in again.
        until: u64,
    },
}

/// One schedule.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    /// The view's size.
    pub n: usize,
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
    /// The faults during the agreement, by time.
    pub faults: Vec<(u64, Fault)>,
    /// How long after deciding each place closes its old links, if it
    /// does before the end (as it does once its new mesh forms).
    pub close_after: Vec<Option<u64>>,
    /// The longest a message takes (at least 1).
    pub max_delay: u64,
    /// How long a link's failure takes to notice: from, to.
    pub notice: (u64, u64),
    /// Chance in 256 that a send on a failed link fails at once (the rank
    /// learns the loss from the send, not from its reader).
    pub send_fails: u64,
}

impl Plan {
    /// The schedule `rng` draws under `settings`.
    pub(super) fn draw(rng: &mut SplitMix64, settings: &Settings) -> Self {
        let (lo, hi) = (settings.min_ranks.max(2), settings.max_ranks.max(2));
        let hi = hi.max(lo);
        // Small groups more often: most orders of events are there.
        let top = match rng.below(2) {
            0 => hi.min(lo + 3),
            _ => hi,
        };
        let n = lo + rng.below(top - lo + 1);
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
            let a = rng.below(n);
            let b = (a + 1 + rng.below(n - 1)) % n;
            match rng.below(2) {
                0 => dead.push(b),
                _ => cut.push((a.min(b), a.max(b))),
            }
        }
        let mut suspects = vec![BTreeSet::new(); n];
        for p in (0..n).filter(|p| !dead.contains(p)) {
            for &d in &dead {
                if rng.below(2) == 0 {
                    suspects[p].insert(d);
                }
            }
            for &(a, b) in &cut {
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
        let start = suspects
            .iter()
            .map(|s| (!s.is_empty()).then(|| rng.below(30) as u64))
            .collect();

        let mut faults = Vec::new();
        for _ in 0..rng.below(settings.max_faults + 1) {
            let t = rng.below(FAULTS_UNTIL as usize) as u64;
            match rng.below(20) {
                0..=4 => faults.push((t, Fault::Kill(rng.below(n)))),
                5..=10 => {
                    let a = rng.below(n);
                    let b = (a + 1 + rng.below(n - 1)) % n;
                    faults.push((t, Fault::Cut(a, b)));
                }
                11..=13 => {
                    let sides = (0..n).map(|_| rng.below(2) == 0).collect();
                    faults.push((t, Fault::Partition(sides)));
                }
                _ => {
                    let rank = rng.below(n);
                    let until = t + 1 + rng.below((FAULTS_UNTIL - t) as usize) as u64;
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

        let close_after = (0..n)
            .map(|_| (rng.below(2) == 0).then(|| 1 + rng.below(200) as u64))
            .collect();
        let max_delay = [2, 10, 60][rng.below(3)];
        let notice = match rng.below(3) {
            0 => (1, 10),
            1 => (5, 60),
            _ => (30, 250),
        };
        let send_fails = [0, 64, 255][rng.below(3)];
        Self {
            n,
            members,
            world,
            epoch,
            at,
            dead,
            cut,
            suspects,
            start,
            faults,
            close_after,
            max_delay,
            notice,
            send_fails,
        }
    }
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
