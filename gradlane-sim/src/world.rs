//! The world both modes run in: events in simulated time, ranks frozen
//! while what comes for them waits, links as queues in order each way
//! (what a QUIC stream gives), failures noticed a while after they
//! happen, and the trace. Each mode's ranks ([`Model`]) take the events.

use crate::plan::Plan;
use crate::report::{Counts, Report};
use crate::settings::Mode;
use crate::violation::Violation;
use gradlane_core::rng::SplitMix64;
use std::collections::{BTreeMap, VecDeque};

/// The ranks of one mode, as the world drives them.
pub(crate) trait Model: Sized {
    /// Which mode's ranks these are.
    const MODE: Mode;

    /// What the ranks start from.
    type Setup;

    /// Something that happens at a time.
    type Ev;

    /// Until when the rank that takes `ev` in is frozen (what comes for
    /// it waits); 0 where no live rank takes it or none is frozen.
    fn frozen_until(&self, ev: &Self::Ev) -> u64;

    /// `ev` happens now.
    fn take(world: &mut World<'_, Self>, ev: Self::Ev);
}

/// The network and its ranks while a run goes on.
pub(crate) struct World<'p, M: Model> {
    /// The schedule.
    pub plan: &'p Plan<M::Setup>,
    /// Every draw after the plan's.
    pub rng: SplitMix64,
    /// The time.
    pub now: u64,
    seq: u64,
    events: BTreeMap<(u64, u64), M::Ev>,
    /// Events taken in all.
    pub steps: u64,
    /// Events taken after the last fault.
    pub quiet_steps: u64,
    /// What happened, line by line, when asked for.
    pub trace: Option<Vec<String>>,
    /// The mode's ranks and links.
    pub m: M,
}

impl<'p, M: Model> World<'p, M> {
    /// The world of `plan` and the ranks `m`, its randomness from `rng`
    /// on.
    pub(crate) fn new(plan: &'p Plan<M::Setup>, rng: SplitMix64, trace: bool, m: M) -> Self {
        Self {
            plan,
            rng,
            now: 0,
            seq: 0,
            events: BTreeMap::new(),
            steps: 0,
            quiet_steps: 0,
            trace: trace.then(Vec::new),
            m,
        }
    }

    /// Takes events until nothing is left to happen; `true` where it
    /// stopped at `bound` events instead.
    pub(crate) fn run(&mut self, bound: u64) -> bool {
        while let Some(((t, seq), ev)) = self.events.pop_first() {
            self.now = t;
            self.steps += 1;
            if t > self.plan.quiet {
                self.quiet_steps += 1;
            }
            if self.steps > bound {
                return true;
            }
            let until = self.m.frozen_until(&ev);
            if until > t {
                // It keeps its place among the others that wait, so that
                // each link stays in order and a failure is noticed after
                // what arrived before it.
                self.events.insert((until, seq), ev);
                continue;
            }
            M::take(self, ev);
        }
        false
    }

    /// What the run left: its events and trace, with the mode's `calls`
    /// in each program, the messages, counts and violations it found as
    /// it ran, and what its checks read.
    pub(crate) fn finish<L>(
        &mut self,
        calls: u64,
        (messages, counts, violations): (u64, Counts, Vec<Violation>),
        left: L,
    ) -> Ran<L> {
        let report = Report {
            seed: self.plan.seed,
            mode: M::MODE,
            ranks: self.plan.n,
            calls,
            steps: self.steps,
            messages,
            counts,
            violations,
            trace: self.trace.take().unwrap_or_default(),
        };
        let quiet_steps = self.quiet_steps;
        Ran {
            report,
            quiet_steps,
            left,
        }
    }

    /// `ev` happens at `at`.
    pub(crate) fn schedule(&mut self, at: u64, ev: M::Ev) {
        self.seq += 1;
        self.events.insert((at, self.seq), ev);
    }

    /// Writes down a line, where the run is traced.
    pub(crate) fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            trace.push(format!("t={:<6} {}", self.now, line()));
        }
    }

    /// How long a message takes.
    pub(crate) fn delay(&mut self) -> u64 {
        1 + self.rng.below(self.plan.max_delay as usize) as u64
    }

    /// When a live end notices a failure whose last message arrives at
    /// `after`.
    pub(crate) fn notice_at(&mut self, after: u64) -> u64 {
        let (lo, hi) = self.plan.notice;
        after + lo + self.rng.below((hi - lo + 1) as usize) as u64
    }

    /// Whether a send on a failed link that the rank does not know failed
    /// fails at once (else its bytes are lost).
    pub(crate) fn send_finds_out(&mut self) -> bool {
        self.rng.below(256) < self.plan.send_fails as usize
    }
}

/// What a run left: its report so far (the violations in it those found
/// while it ran), and what the mode's checks read.
pub(crate) struct Ran<L> {
    /// What it did.
    pub report: Report,
    /// Events taken after the last fault.
    pub quiet_steps: u64,
    /// What the mode's checks read.
    pub left: L,
}

/// One way of a link: messages in order, each with when it arrives.
pub(crate) struct Lane<T> {
    /// The messages on their way.
    pub queue: VecDeque<(u64, T)>,
    /// When the last message arrives: the next comes no earlier.
    pub last_at: u64,
    /// Messages sent on it.
    pub sent: usize,
}

impl<T> Lane<T> {
    /// An empty lane.
    pub(crate) fn new() -> Self {
        Self {
            queue: VecDeque::new(),
            last_at: 0,
            sent: 0,
        }
    }

    /// Counts a message sent on it from `from` to `to`, and notes the
    /// one past `bound`.
    pub(crate) fn count(
        &mut self,
        (from, to, bound): (usize, usize, usize),
        found: &mut Vec<Violation>,
    ) {
        self.sent += 1;
        if self.sent == bound + 1 {
            found.push(Violation::Unbounded { from, to, bound });
        }
    }

    /// Puts `msg` on it to arrive at `earliest`, or after the one before
    /// it; says when.
    pub(crate) fn push(&mut self, earliest: u64, msg: T) -> u64 {
        let at = self.last_at.max(earliest);
        self.last_at = at;
        self.queue.push_back((at, msg));
        at
    }

    /// The link failed: of what is on its way, the first `keep` arrive.
    /// Says how many were dropped, and when the last kept arrives (`now`
    /// at the earliest).
    pub(crate) fn cut_to(&mut self, keep: usize, now: u64) -> (usize, u64) {
        let dropped = self.queue.len() - keep;
        self.queue.truncate(keep);
        let after = self.queue.back().map_or(now, |m| m.0).max(now);
        (dropped, after)
    }
}
