//! The ranks of an agreement in the world: one link per pair of places
//! (a lane in order each way), each rank's [`Agreement`] fed whatever
//! reaches it, its transmits carried out at once.

use super::plan::Setup;
use crate::plan::{Fault, Plan};
use crate::report::Counts;
use crate::settings::{Mode, Settings};
use crate::violation::Violation;
use crate::world::{Lane, Model, Ran, World};
use bytes::Bytes;
use gradlane_core::group::agreement::{Agreement, Event, MessageKind, Outcome, Seat};
use gradlane_core::rng::SplitMix64;

/// Something that happens at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ev {
    /// The message at the head of `from`'s lane to `to` arrives (one
    /// such event per message sent; those of messages gone with their
    /// link find nothing).
    Deliver { from: usize, to: usize },
    /// The rank at `at` notices that its link to `of` failed.
    Notice { at: usize, of: usize },
    /// A rank that lost a rank begins its agreement on its own.
    Start(usize),
    /// The plan's fault with this index.
    Fault(usize),
    /// A rank that decided closes its old links.
    Close(usize),
}

/// What reaches a rank.
enum Input {
    Message {
        from: usize,
        kind: MessageKind,
        body: Bytes,
    },
    Lost(usize),
}

/// One rank of an agreement.
struct Rank {
    dead: bool,
    frozen_until: u64,
    /// Its agreement, once it began.
    machine: Option<Agreement>,
    /// Which places it was told it lost (by a reader or a send).
    knows: Vec<bool>,
    /// The decision it took.
    outcome: Option<Outcome>,
}

/// The places of an agreement and their links.
pub(crate) struct Agreeing<'p> {
    setup: &'p Setup,
    n: usize,
    ranks: Vec<Rank>,
    /// Whether the link between two places failed (both ways).
    cut: Vec<bool>,
    /// Messages on their way, per ordered pair `from * n + to`.
    lanes: Vec<Lane<(MessageKind, Bytes)>>,
    messages: u64,
    violations: Vec<Violation>,
    #[cfg(test)]
    flaw: Option<gradlane_core::group::agreement::Flaw>,
}

/// What an agreement left, for its checks.
pub(crate) struct Left {
    /// Each place's outcome, if it took one (dead or not).
    pub outcomes: Vec<Option<Outcome>>,
    /// Which places were dead at the end.
    pub dead: Vec<bool>,
}

/// Runs the agreement of `plan`, its randomness from `rng` on.
pub(crate) fn run(
    plan: &Plan<Setup>,
    rng: SplitMix64,
    traced: bool,
    settings: &Settings,
) -> Ran<Left> {
    let n = plan.n;
    let ranks = (0..n)
        .map(|_| Rank {
            dead: false,
            frozen_until: 0,
            machine: None,
            knows: vec![false; n],
            outcome: None,
        })
        .collect();
    let m = Agreeing {
        setup: &plan.setup,
        n,
        ranks,
        cut: vec![false; n * n],
        lanes: (0..n * n).map(|_| Lane::new()).collect(),
        messages: 0,
        violations: Vec::new(),
        #[cfg(test)]
        flaw: settings.flaw.and_then(crate::settings::agreement_flaw),
    };
    // Outside the tests, the settings have drawn the plan already.
    let _ = settings;
    let mut world = World::new(plan, rng, traced, m);
    world.begin_all();
    let n = n as u64;
    world.run(64 * n * n * n + 10_000);
    let mut counts = Counts::default();
    for outcome in world.m.ranks.iter().filter_map(|r| r.outcome.as_ref()) {
        match outcome {
            Outcome::Member { .. } => counts.members += 1,
            Outcome::Removed { .. } => counts.left_out += 1,
            Outcome::NoQuorum { .. } => counts.no_quorum += 1,
            Outcome::Abandoned { .. } => counts.abandoned += 1,
        }
    }
    let outcomes = world.m.ranks.iter().map(|r| r.outcome.clone()).collect();
    let dead = world.m.ranks.iter().map(|r| r.dead).collect();
    let found = std::mem::take(&mut world.m.violations);
    let found = (world.m.messages, counts, found);
    world.finish(0, found, Left { outcomes, dead })
}

impl Model for Agreeing<'_> {
    const MODE: Mode = Mode::Agreement;
    type Setup = Setup;
    type Ev = Ev;

    fn frozen_until(&self, ev: &Ev) -> u64 {
        let rank = match *ev {
            Ev::Deliver { to, .. } => to,
            Ev::Notice { at, .. } => at,
            Ev::Start(p) => p,
            Ev::Fault(_) | Ev::Close(_) => return 0,
        };
        let r = &self.ranks[rank];
        if r.dead {
            0
        } else {
            r.frozen_until
        }
    }

    fn take(w: &mut World<'_, Self>, ev: Ev) {
        match ev {
            Ev::Deliver { from, to } => {
                if w.m.ranks[to].dead {
                    return;
                }
                // The head arrived by now: it came no later than the
                // message this event is for. Nothing left: gone with its
                // link.
                let n = w.m.n;
                let Some((_, (kind, body))) = w.m.lanes[from * n + to].queue.pop_front() else {
                    return;
                };
                w.feed(to, Input::Message { from, kind, body });
            }
            Ev::Notice { at, of } => {
                if w.m.ranks[at].dead {
                    return;
                }
                w.m.ranks[at].knows[of] = true;
                w.note(|| format!("place {at} loses {of}"));
                w.feed(at, Input::Lost(of));
            }
            Ev::Start(p) => {
                if w.m.ranks[p].dead || w.m.ranks[p].machine.is_some() {
                    return;
                }
                w.begin(p, None);
                w.pump(p);
            }
            Ev::Fault(i) => w.fault(i),
            Ev::Close(p) => {
                w.note(|| format!("place {p} closes its old links"));
                for x in (0..w.m.n).filter(|&x| x != p) {
                    w.fail_link(p, x, true);
                }
            }
        }
    }
}

impl World<'_, Agreeing<'_>> {
    /// The failure before the agreement, and its starts and faults to
    /// come.
    fn begin_all(&mut self) {
        let (setup, n) = (self.m.setup, self.m.n);
        for (p, suspects) in setup.suspects.iter().enumerate() {
            for &s in suspects {
                self.m.ranks[p].knows[s] = true;
            }
        }
        for &d in &setup.dead {
            self.m.ranks[d].dead = true;
        }
        for &d in &setup.dead {
            for x in (0..n).filter(|&x| x != d) {
                self.fail_link(d, x, false);
            }
        }
        for &(a, b) in &setup.cut {
            self.fail_link(a, b, false);
        }
        for (p, start) in setup.start.iter().enumerate() {
            if let Some(t) = start {
                self.schedule(*t, Ev::Start(p));
            }
        }
        for (i, (t, _)) in self.plan.faults.iter().enumerate() {
            self.schedule(*t, Ev::Fault(i));
        }
    }

    fn fault(&mut self, i: usize) {
        let plan = self.plan;
        let n = self.m.n;
        let fault = &plan.faults[i].1;
        self.note(|| format!("fault: {fault:?}"));
        match fault {
            Fault::Kill { rank: k, .. } => {
                if self.m.ranks[*k].dead {
                    return;
                }
                self.m.ranks[*k].dead = true;
                for x in (0..n).filter(|x| x != k) {
                    self.fail_link(*k, x, false);
                }
            }
            Fault::Cut(a, b) => self.fail_link(*a, *b, false),
            Fault::Partition { sides, .. } => {
                for a in 0..n {
                    for b in a + 1..n {
                        if sides[a] != sides[b] {
                            self.fail_link(a, b, false);
                        }
                    }
                }
            }
            Fault::Freeze { rank, until } => {
                let r = &mut self.m.ranks[*rank];
                r.frozen_until = r.frozen_until.max(*until);
            }
            Fault::Slow { .. } => {}
        }
    }

    /// The link between `a` and `b` fails. Of what was on its way each
    /// way, what arrives is a prefix (`whole`: all of it, as when a rank
    /// closes its links long after its last message); each live end
    /// notices a while after the last of it.
    fn fail_link(&mut self, a: usize, b: usize, whole: bool) {
        let n = self.m.n;
        if self.m.cut[a * n + b] {
            return;
        }
        self.m.cut[a * n + b] = true;
        self.m.cut[b * n + a] = true;
        for (x, y) in [(a, b), (b, a)] {
            let len = self.m.lanes[x * n + y].queue.len();
            let keep = match (self.m.ranks[y].dead, whole) {
                (true, _) => 0,
                (false, true) => len,
                (false, false) => self.rng.below(len + 1),
            };
            let (_, after) = self.m.lanes[x * n + y].cut_to(keep, self.now);
            if !self.m.ranks[y].dead && !self.m.ranks[y].knows[x] {
                let at = self.notice_at(after);
                self.schedule(at, Ev::Notice { at: y, of: x });
            }
        }
    }

    /// `rank` begins its agreement: its collective failed on a loss or a
    /// proposal (`alarm`), or it had lost a rank already.
    fn begin(&mut self, rank: usize, alarm: Option<(usize, Bytes)>) {
        let setup = self.m.setup;
        let (call, has_result) = setup.at[rank];
        let members = setup.members.clone();
        let seat = Seat::new(rank, members, setup.world, setup.epoch, call, has_result)
            .expect("the plan draws valid views");
        let knows = &self.m.ranks[rank].knows;
        let suspects: Vec<usize> = (0..self.m.n).filter(|&p| knows[p]).collect();
        self.note(|| format!("place {rank} begins, having lost {suspects:?}"));
        let machine = Agreement::new(seat, suspects, alarm);
        #[cfg(test)]
        let machine = machine.with_flaw(self.m.flaw);
        self.m.ranks[rank].machine = Some(machine);
    }

    /// What reaches `rank`: its machine takes it (a rank still in its
    /// collective begins its agreement on it), then sends what it has.
    fn feed(&mut self, rank: usize, input: Input) {
        if self.m.ranks[rank].machine.is_none() {
            match input {
                Input::Lost(_) => self.begin(rank, None),
                Input::Message {
                    from,
                    kind: MessageKind::Proposal,
                    body,
                } => {
                    self.note(|| format!("place {rank} <- alarm from {from}"));
                    self.begin(rank, Some((from, body)));
                    self.pump(rank);
                    return;
                }
                Input::Message { .. } => self.begin(rank, None),
            }
        }
        let Some(machine) = self.m.ranks[rank].machine.as_mut() else {
            return;
        };
        let decided = machine.outcome().cloned();
        match &input {
            Input::Lost(of) => machine.handle(Event::Lost { from: *of }),
            Input::Message { from, kind, body } => {
                let from = *from;
                let event = match kind {
                    MessageKind::Proposal => Event::Proposal { from, body },
                    MessageKind::Decision => Event::Decision { from, body },
                };
                machine.handle(event);
            }
        }
        if let Some(before) = decided {
            // A rank that took its decision is done: it neither sends nor
            // changes its mind.
            let after = machine.outcome().cloned();
            if machine.poll_transmit().is_some() || after.as_ref() != Some(&before) {
                self.m
                    .violations
                    .push(Violation::AfterOutcome { place: rank });
            }
            return;
        }
        if let Input::Message { from, body, .. } = &input {
            self.note(|| format!("place {rank} <- {from}: {}", String::from_utf8_lossy(body)));
        }
        self.pump(rank);
    }

    /// Carries out every transmit `rank`'s machine has, and notes its
    /// outcome once it has one.
    fn pump(&mut self, rank: usize) {
        let n = self.m.n;
        let Some(mut machine) = self.m.ranks[rank].machine.take() else {
            return;
        };
        while let Some(t) = machine.poll_transmit() {
            let mut failed = Vec::new();
            for &to in &t.to {
                let pair = rank * n + to;
                self.m.messages += 1;
                self.m.lanes[pair].count((rank, to, n), &mut self.m.violations);
                if self.m.cut[pair] {
                    // The send fails where the rank knows its link is
                    // gone, or finds out now; otherwise the bytes are lost.
                    let finds_out = self.send_finds_out();
                    if self.m.ranks[rank].knows[to] || finds_out {
                        failed.push(to);
                    }
                    continue;
                }
                let earliest = self.now + self.delay();
                self.m.lanes[pair].push(earliest, (t.kind, t.body.clone()));
                let at = self.m.lanes[pair].last_at;
                self.schedule(at, Ev::Deliver { from: rank, to });
            }
            let left_out = if t.left_out { " (left out)" } else { "" };
            self.note(|| {
                let text = String::from_utf8_lossy(&t.body);
                format!(
                    "place {rank} -> {:?}{left_out}: {text}; failed {failed:?}",
                    t.to
                )
            });
            for to in failed {
                self.m.ranks[rank].knows[to] = true;
                machine.send_failed(to);
            }
        }
        if self.m.ranks[rank].outcome.is_none() {
            if let Some(outcome) = machine.outcome() {
                let outcome = outcome.clone();
                self.note(|| format!("place {rank} takes {outcome:?}"));
                if let Some(after) = self.m.setup.close_after[rank] {
                    self.schedule(self.now + after, Ev::Close(rank));
                }
                self.m.ranks[rank].outcome = Some(outcome);
            }
        }
        self.m.ranks[rank].machine = Some(machine);
    }
}
