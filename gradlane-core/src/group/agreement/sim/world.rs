//! The simulated network and the ranks on it: events in simulated time,
//! one queue in order per ordered pair of ranks (what a QUIC stream
//! gives), failures noticed at each end a while after they happen, and
//! each rank's [`Agreement`] fed whatever reaches it, its transmits
//! carried out at once.

use super::plan::{Fault, Plan};
use super::Violation;
use crate::group::agreement::{Agreement, Event, MessageKind, Outcome, Seat};
use crate::rng::SplitMix64;
use bytes::Bytes;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Something that happens at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The message at the head of `from`'s queue to `to` arrives (one
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

/// A message on its way.
struct Message {
    at: u64,
    kind: MessageKind,
    body: Bytes,
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

/// One rank of the simulation.
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

/// What a run left, for the checks.
pub(super) struct Ran {
    /// Each place's outcome, if it took one (dead or not).
    pub outcomes: Vec<Option<Outcome>>,
    /// Which places were dead at the end.
    pub dead: Vec<bool>,
    /// Events taken in all.
    pub steps: u64,
    /// Events taken after the last fault.
    pub quiet_steps: u64,
    /// Messages sent.
    pub messages: u64,
    /// What was found while it ran (the bound on messages, a rank acting
    /// after its outcome).
    pub violations: Vec<Violation>,
    /// What happened, line by line, when asked for.
    pub trace: Vec<String>,
}

/// The network and its ranks while a run goes on.
pub(super) struct World<'p> {
    plan: &'p Plan,
    rng: SplitMix64,
    n: usize,
    now: u64,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    ranks: Vec<Rank>,
    /// Whether the link between two places failed (both ways).
    cut: Vec<bool>,
    /// Messages on their way, per ordered pair `from * n + to`.
    queues: Vec<VecDeque<Message>>,
    /// When the last message of each ordered pair arrives: the next one
    /// comes no earlier, so each pair stays in order.
    last_at: Vec<u64>,
    /// Messages sent on each ordered pair.
    sent: Vec<usize>,
    messages: u64,
    steps: u64,
    quiet_steps: u64,
    /// The time of the last fault (a freeze's end included).
    quiet_from: u64,
    violations: Vec<Violation>,
    trace: Option<Vec<String>>,
    #[cfg(test)]
    flaw: Option<crate::group::agreement::Flaw>,
}

impl<'p> World<'p> {
    /// The world of `plan`, its randomness from `rng` on.
    pub(super) fn new(plan: &'p Plan, rng: SplitMix64, trace: bool) -> Self {
        let n = plan.n;
        let quiet_from = plan
            .faults
            .iter()
            .map(|(t, f)| match f {
                Fault::Freeze { until, .. } => *until,
                _ => *t,
            })
            .max()
            .unwrap_or(0);
        let mut world = Self {
            plan,
            rng,
            n,
            now: 0,
            seq: 0,
            heap: BinaryHeap::new(),
            ranks: (0..n)
                .map(|_| Rank {
                    dead: false,
                    frozen_until: 0,
                    machine: None,
                    knows: vec![false; n],
                    outcome: None,
                })
                .collect(),
            cut: vec![false; n * n],
            queues: (0..n * n).map(|_| VecDeque::new()).collect(),
            last_at: vec![0; n * n],
            sent: vec![0; n * n],
            messages: 0,
            steps: 0,
            quiet_steps: 0,
            quiet_from,
            violations: Vec::new(),
            trace: trace.then(Vec::new),
            #[cfg(test)]
            flaw: None,
        };
        for (p, suspects) in plan.suspects.iter().enumerate() {
            for &s in suspects {
                world.ranks[p].knows[s] = true;
            }
        }
        for &d in &plan.dead {
            world.ranks[d].dead = true;
        }
        for &d in &plan.dead {
            for x in (0..n).filter(|&x| x != d) {
                world.fail_link(d, x, false);
            }
        }
        for &(a, b) in &plan.cut {
            world.fail_link(a, b, false);
        }
        for (p, start) in plan.start.iter().enumerate() {
            if let Some(t) = start {
                world.schedule(*t, Ev::Start(p));
            }
        }
        for (i, (t, _)) in plan.faults.iter().enumerate() {
            world.schedule(*t, Ev::Fault(i));
        }
        world
    }

    /// The same world with a deliberate fault in every rank's machine.
    #[cfg(test)]
    pub(super) fn with_flaw(mut self, flaw: Option<crate::group::agreement::Flaw>) -> Self {
        self.flaw = flaw;
        self
    }

    /// Runs until nothing is left to happen (or far past any bound the
    /// protocol keeps), and says what it left.
    pub(super) fn run(mut self) -> Ran {
        let n = self.n as u64;
        let limit = 64 * n * n * n + 10_000;
        while let Some(Reverse((t, seq, ev))) = self.heap.pop() {
            self.now = t;
            self.steps += 1;
            if t > self.quiet_from {
                self.quiet_steps += 1;
            }
            if self.steps > limit {
                break;
            }
            self.take(seq, ev);
        }
        Ran {
            outcomes: self.ranks.iter().map(|r| r.outcome.clone()).collect(),
            dead: self.ranks.iter().map(|r| r.dead).collect(),
            steps: self.steps,
            quiet_steps: self.quiet_steps,
            messages: self.messages,
            violations: self.violations,
            trace: self.trace.unwrap_or_default(),
        }
    }

    fn schedule(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, ev)));
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            trace.push(format!("t={:<5} {}", self.now, line()));
        }
    }

    /// Whether `rank` takes nothing in now; if so, `ev` (scheduled as
    /// `seq`) waits for it. It keeps its place among the others that
    /// wait, so that each pair stays in order and a failure is noticed
    /// after what arrived before it.
    fn held(&mut self, rank: usize, seq: u64, ev: Ev) -> bool {
        let until = self.ranks[rank].frozen_until;
        if until > self.now {
            self.heap.push(Reverse((until, seq, ev)));
            return true;
        }
        false
    }

    fn take(&mut self, seq: u64, ev: Ev) {
        match ev {
            Ev::Deliver { from, to } => {
                if self.ranks[to].dead || self.held(to, seq, ev) {
                    return;
                }
                // The head arrived by now: it came no later than the
                // message this event is for. Nothing left: gone with its
                // link.
                let Some(m) = self.queues[from * self.n + to].pop_front() else {
                    return;
                };
                let input = Input::Message {
                    from,
                    kind: m.kind,
                    body: m.body,
                };
                self.feed(to, input);
            }
            Ev::Notice { at, of } => {
                if self.ranks[at].dead || self.held(at, seq, ev) {
                    return;
                }
                self.ranks[at].knows[of] = true;
                self.note(|| format!("place {at} loses {of}"));
                self.feed(at, Input::Lost(of));
            }
            Ev::Start(p) => {
                if self.ranks[p].dead || self.held(p, seq, ev) || self.ranks[p].machine.is_some() {
                    return;
                }
                self.begin(p, None);
                self.pump(p);
            }
            Ev::Fault(i) => self.fault(i),
            Ev::Close(p) => {
                self.note(|| format!("place {p} closes its old links"));
                for x in (0..self.n).filter(|&x| x != p) {
                    self.fail_link(p, x, true);
                }
            }
        }
    }

    fn fault(&mut self, i: usize) {
        let plan = self.plan;
        let fault = &plan.faults[i].1;
        self.note(|| format!("fault: {fault:?}"));
        match fault {
            Fault::Kill(k) => {
                if self.ranks[*k].dead {
                    return;
                }
                self.ranks[*k].dead = true;
                for x in (0..self.n).filter(|x| x != k) {
                    self.fail_link(*k, x, false);
                }
            }
            Fault::Cut(a, b) => self.fail_link(*a, *b, false),
            Fault::Partition(sides) => {
                for a in 0..self.n {
                    for b in a + 1..self.n {
                        if sides[a] != sides[b] {
                            self.fail_link(a, b, false);
                        }
                    }
                }
            }
            Fault::Freeze { rank, until } => {
                let r = &mut self.ranks[*rank];
                r.frozen_until = r.frozen_until.max(*until);
            }
        }
    }

    /// The link between `a` and `b` fails. Of what was on its way each
    /// way, what arrives is a prefix (`whole`: all of it, as when a rank
    /// closes its links long after its last message); each live end
    /// notices a while after the last of it.
    fn fail_link(&mut self, a: usize, b: usize, whole: bool) {
        let n = self.n;
        if self.cut[a * n + b] {
            return;
        }
        self.cut[a * n + b] = true;
        self.cut[b * n + a] = true;
        for (x, y) in [(a, b), (b, a)] {
            let len = self.queues[x * n + y].len();
            let keep = match (self.ranks[y].dead, whole) {
                (true, _) => 0,
                (false, true) => len,
                (false, false) => self.rng.below(len + 1),
            };
            let queue = &mut self.queues[x * n + y];
            queue.truncate(keep);
            let after = queue.back().map_or(self.now, |m| m.at).max(self.now);
            if !self.ranks[y].dead && !self.ranks[y].knows[x] {
                let (lo, hi) = self.plan.notice;
                let at = after + lo + self.rng.below((hi - lo + 1) as usize) as u64;
                self.schedule(at, Ev::Notice { at: y, of: x });
            }
        }
    }

    /// `rank` begins its agreement: its collective failed on a loss or a
    /// proposal (`alarm`), or it had lost a rank already.
    fn begin(&mut self, rank: usize, alarm: Option<(usize, Bytes)>) {
        let plan = self.plan;
        let (call, has_result) = plan.at[rank];
        let seat = Seat::new(
            rank,
            plan.members.clone(),
            plan.world,
            plan.epoch,
            call,
            has_result,
        )
        .expect("the plan draws valid views");
        let suspects: Vec<usize> = (0..self.n).filter(|&p| self.ranks[rank].knows[p]).collect();
        self.note(|| format!("place {rank} begins, having lost {suspects:?}"));
        let machine = Agreement::new(seat, suspects, alarm);
        #[cfg(test)]
        let machine = machine.with_flaw(self.flaw);
        self.ranks[rank].machine = Some(machine);
    }

    /// What reaches `rank`: its machine takes it (a rank still in its
    /// collective begins its agreement on it), then sends what it has.
    fn feed(&mut self, rank: usize, input: Input) {
        if self.ranks[rank].machine.is_none() {
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
        let Some(machine) = self.ranks[rank].machine.as_mut() else {
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
                self.violations
                    .push(Violation::AfterOutcome { place: rank });
            }
            return;
        }
        if let (Some(trace), Input::Message { from, body, .. }) = (&mut self.trace, &input) {
            let text = String::from_utf8_lossy(body);
            trace.push(format!("t={:<5} place {rank} <- {from}: {text}", self.now));
        }
        self.pump(rank);
    }

    /// Carries out every transmit `rank`'s machine has, and notes its
    /// outcome once it has one.
    fn pump(&mut self, rank: usize) {
        let n = self.n;
        let Some(mut machine) = self.ranks[rank].machine.take() else {
            return;
        };
        while let Some(t) = machine.poll_transmit() {
            let mut failed = Vec::new();
            for &to in &t.to {
                let pair = rank * n + to;
                self.sent[pair] += 1;
                self.messages += 1;
                if self.sent[pair] == n + 1 {
                    self.violations.push(Violation::Unbounded {
                        from: rank,
                        to,
                        bound: n,
                    });
                }
                if self.cut[pair] {
                    // The send fails where the rank knows its link is
                    // gone, or finds out now; otherwise the bytes are lost.
                    let finds_out = self.rng.below(256) < self.plan.send_fails as usize;
                    if self.ranks[rank].knows[to] || finds_out {
                        failed.push(to);
                    }
                    continue;
                }
                let delay = 1 + self.rng.below(self.plan.max_delay as usize) as u64;
                let at = self.last_at[pair].max(self.now + delay);
                self.last_at[pair] = at;
                self.queues[pair].push_back(Message {
                    at,
                    kind: t.kind,
                    body: t.body.clone(),
                });
                self.schedule(at, Ev::Deliver { from: rank, to });
            }
            if let Some(trace) = &mut self.trace {
                let text = String::from_utf8_lossy(&t.body);
                let left_out = if t.left_out { " (left out)" } else { "" };
                trace.push(format!(
                    "t={:<5} place {rank} -> {:?}{left_out}: {text}; failed {failed:?}",
                    self.now, t.to
                ));
            }
            for to in failed {
                self.ranks[rank].knows[to] = true;
                machine.send_failed(to);
            }
        }
        if self.ranks[rank].outcome.is_none() {
            if let Some(outcome) = machine.outcome() {
                let outcome = outcome.clone();
                self.note(|| format!("place {rank} takes {outcome:?}"));
                if let Some(after) = self.plan.close_after[rank] {
                    self.schedule(self.now + after, Ev::Close(rank));
                }
                self.ranks[rank].outcome = Some(outcome);
            }
        }
        self.ranks[rank].machine = Some(machine);
    }
}
