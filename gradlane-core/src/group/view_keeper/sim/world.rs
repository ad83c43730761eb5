//! The simulated network and the ranks on it: events in virtual time,
//! one link per pair of a view's members (a queue in order each way, as a
//! QUIC stream), failures noticed at each end a while after they happen,
//! and each rank's [`ViewKeeper`] (with the [`Agreement`]s it starts)
//! driven as the shell drives it.

use super::plan::{fold_values, Fault, Plan, MAX_ATTEMPTS, MAX_RESTARTS};
use super::{Counts, Violation};
use crate::group::agreement::{Agreement, Event as Heard, MessageKind};
use crate::group::view_keeper::{Action, Event, Failure, KeeperError, ViewKeeper};
use crate::group::{
    admission, view_digest, Dials, HelloVerdict, JoinRequest, MeshForming, MeshHello, MeshMark,
    OnRankFailure, ViewDecision,
};
use crate::rng::SplitMix64;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;

/// Something that happens at a time.
#[derive(Debug, Clone)]
enum Ev {
    /// A rank of view 0 starts its program.
    Begin(usize),
    /// Process `inc` of `rank` is done computing: its next call begins.
    Next { rank: usize, inc: u64 },
    /// The message at the head of `link`'s queue toward its end `end`
    /// arrives (one such event per message sent; those gone with their
    /// link find nothing).
    Deliver { link: usize, end: usize },
    /// The rank at `link`'s end `end` notices that the link failed.
    Notice { link: usize, end: usize },
    /// `from` (as process `inc`) dials `to` to form the mesh of the view
    /// with this digest.
    Dial {
        from: usize,
        inc: u64,
        to: usize,
        digest: u64,
    },
    /// `rank` looks again at the mesh it forms (a link came up while
    /// another rank acted).
    Check { rank: usize, inc: u64 },
    /// `rank` stops waiting for the members of the mesh it forms.
    FormDeadline { rank: usize, inc: u64, digest: u64 },
    /// A message outside the mesh (a join request, its answer).
    Post { to: usize, inc: u64, post: Post },
    /// A rank asking to rejoin stops waiting for its contact.
    JoinTimeout { rank: usize, inc: u64, attempt: u32 },
    /// The plan's fault with this index.
    Fault(usize),
    /// The partition of the plan's fault with this index heals.
    Heal(usize),
    /// The network goes quiet: every path open, every link fast.
    Quiet,
    /// The rank's process starts again, to ask to rejoin.
    Restart(usize),
    /// A rank that finished its program closes its links.
    Linger { rank: usize, inc: u64 },
}

impl Ev {
    /// The rank that takes the event in (it waits while that rank is
    /// frozen), if one does.
    fn taker(&self, links: &[Link]) -> Option<usize> {
        match *self {
            Ev::Begin(r) => Some(r),
            Ev::Deliver { link, end } | Ev::Notice { link, end } => Some(links[link].ends[end]),
            Ev::Dial { to, .. } | Ev::Post { to, .. } => Some(to),
            Ev::Check { rank, .. }
            | Ev::FormDeadline { rank, .. }
            | Ev::JoinTimeout { rank, .. }
            | Ev::Linger { rank, .. }
            | Ev::Next { rank, .. } => Some(rank),
            Ev::Fault(_) | Ev::Heal(_) | Ev::Quiet | Ev::Restart(_) => None,
        }
    }
}

/// What travels outside the mesh.
#[derive(Debug, Clone)]
enum Post {
    /// A restarted rank asks to rejoin.
    Join { from: usize, inc: u64 },
    /// The contact refused it (it is a member still, as far as the
    /// contact knows).
    Refused,
    /// The members admit it to this view, with these joiners.
    Admission {
        decision: ViewDecision,
        joiners: Vec<usize>,
    },
}

/// A message on a link.
#[derive(Debug, Clone)]
enum Msg {
    /// A collective's contribution.
    Exch { epoch: u64, call: u64, value: u64 },
    /// A collective's `Done`, naming the ranks waiting at the sender.
    Done {
        epoch: u64,
        call: u64,
        joiners: Vec<(usize, SocketAddr)>,
    },
    /// An agreement's message for view `epoch`.
    View {
        epoch: u64,
        kind: MessageKind,
        body: Bytes,
    },
    /// The sender closed the link (saying it removed this rank, or not).
    Close { removed: bool },
}

/// One link of a mesh between two processes.
struct Link {
    ends: [usize; 2],
    incs: [u64; 2],
    failed: bool,
    /// Messages on their way toward each end, with when each arrives.
    queues: [VecDeque<(u64, Msg)>; 2],
    /// When the last message toward each end arrives.
    last_at: [u64; 2],
    /// Messages sent toward each end.
    sent: [usize; 2],
}

/// Where a rank stands.
#[derive(Debug)]
enum Stage {
    /// Nothing in hand (between actions, or a rank of view 0 before its
    /// program starts).
    Idle,
    /// In a collective's exchange: the contributions so far.
    Exchange {
        call: u64,
        got: BTreeMap<usize, u64>,
    },
    /// In its `Done` round: the messages so far.
    Done {
        call: u64,
        got: BTreeMap<usize, Vec<(usize, SocketAddr)>>,
    },
    /// Agreeing on the next view; the places told lost.
    Agree {
        machine: Box<Agreement>,
        told: BTreeSet<usize>,
    },
    /// Forming the mesh of `decision`'s view (as a rank admitted to it
    /// where `joiners` is some).
    Form {
        decision: ViewDecision,
        digest: u64,
        joiners: Option<Vec<usize>>,
        mesh: MeshForming,
    },
    /// A restarted process asking to rejoin.
    Joining { attempt: u32 },
    /// Its program is over.
    Finished,
    /// Its keeper failed (or its admission did): the program stopped
    /// with an error.
    Failed,
    /// It asked every contact it may and was not admitted.
    GaveUp,
    /// Killed.
    Dead,
}

impl Stage {
    fn name(&self) -> &'static str {
        match self {
            Stage::Idle => "idle",
            Stage::Exchange { .. } => "exchange",
            Stage::Done { .. } => "done",
            Stage::Agree { .. } => "agreement",
            Stage::Form { .. } => "mesh",
            Stage::Joining { .. } => "joining",
            Stage::Finished => "finished",
            Stage::Failed => "failed",
            Stage::GaveUp => "gave up",
            Stage::Dead => "dead",
        }
    }
}

/// The result of an exchange this rank holds.
#[derive(Debug, Clone)]
struct Held {
    call: u64,
    bits: u64,
    epoch: u64,
    members: Vec<usize>,
}

/// One rank (one process at a time) of the simulation.
struct Rank {
    alive: bool,
    /// Which process of this rank: each restart is a new one.
    inc: u64,
    frozen_until: u64,
    keeper: Option<ViewKeeper>,
    stage: Stage,
    /// The current view's links, by peer.
    links: BTreeMap<usize, usize>,
    /// What came on them that was not read yet, by peer.
    pending: BTreeMap<usize, VecDeque<Msg>>,
    /// The peers whose current link this rank knows failed (`true`:
    /// closed saying it was removed).
    failed: BTreeMap<usize, bool>,
    /// The same three for the mesh being formed.
    next_links: BTreeMap<usize, usize>,
    next_pending: BTreeMap<usize, VecDeque<Msg>>,
    next_failed: BTreeMap<usize, bool>,
    held: Option<Held>,
    /// The ranks waiting at this member to rejoin.
    waiting: Vec<(usize, SocketAddr)>,
    /// Whether this process was removed (it must return nothing after).
    removed: bool,
    restarts: usize,
}

impl Rank {
    fn new() -> Self {
        Self {
            alive: true,
            inc: 0,
            frozen_until: 0,
            keeper: None,
            stage: Stage::Idle,
            links: BTreeMap::new(),
            pending: BTreeMap::new(),
            failed: BTreeMap::new(),
            next_links: BTreeMap::new(),
            next_pending: BTreeMap::new(),
            next_failed: BTreeMap::new(),
            held: None,
            waiting: Vec::new(),
            removed: false,
            restarts: 0,
        }
    }
}

/// A view a rank installed: its mesh whole, or its admission done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Install {
    /// The rank.
    pub rank: usize,
    /// The view's number.
    pub epoch: u64,
    /// Its members.
    pub members: Vec<usize>,
}

/// A call's result a rank returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Returned {
    /// The rank.
    pub rank: usize,
    /// Its process.
    pub inc: u64,
    /// The call.
    pub call: u64,
    /// The result's bits.
    pub bits: u64,
    /// The view whose exchange computed them.
    pub epoch: u64,
    /// That view's members.
    pub members: Vec<usize>,
    /// The keeper's members when it returned.
    pub members_now: Vec<usize>,
    /// Whether this process had been removed before.
    pub after_removal: bool,
}

/// How a rank ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct End {
    /// Alive at the end.
    pub alive: bool,
    /// Its stage's name.
    pub stage: &'static str,
    /// Calls its keeper began (0 without one).
    pub calls: u64,
    /// Whether it ever restarted.
    pub restarted: bool,
}

/// What a run left, for the checks.
pub(super) struct Ran {
    /// Every view installed, in order.
    pub installs: Vec<Install>,
    /// Every mesh that formed with members missing (the view taken as
    /// the base of the next agreement, not installed).
    pub partial: Vec<Install>,
    /// Every result returned, in order.
    pub returns: Vec<Returned>,
    /// How each rank ended.
    pub ends: Vec<End>,
    /// Events taken in all.
    pub steps: u64,
    /// Whether the run was stopped at the cap on events.
    pub runaway: bool,
    /// Messages sent on links.
    pub messages: u64,
    /// What the ranks did, counted.
    pub counts: Counts,
    /// What was found while it ran.
    pub violations: Vec<Violation>,
    /// What happened, line by line, when asked for.
    pub trace: Vec<String>,
}

/// What a rank does once an event changed what it waits for.
enum Poke {
    /// Still waiting.
    Wait,
    /// Hand this event to its keeper, then carry out what it says.
    Hand(Event),
    /// Carry out what its keeper says.
    Poll,
}

/// The network and its ranks while a run goes on.
pub(super) struct World<'p> {
    plan: &'p Plan,
    rng: SplitMix64,
    n: usize,
    now: u64,
    seq: u64,
    events: BTreeMap<(u64, u64), Ev>,
    ranks: Vec<Rank>,
    links: Vec<Link>,
    /// Whether the path between two ranks is blocked (a partition).
    blocked: Vec<bool>,
    /// Extra delay on each pair, and until when.
    slow: Vec<(u64, u64)>,
    /// Messages on their way on links.
    in_flight: usize,
    /// The most messages one link may carry each way.
    link_bound: usize,
    /// The most messages on their way at once.
    flight_bound: usize,
    /// The most events one schedule may take.
    step_bound: u64,
    steps: u64,
    messages: u64,
    installs: Vec<Install>,
    partial: Vec<Install>,
    returns: Vec<Returned>,
    counts: Counts,
    violations: Vec<Violation>,
    trace: Option<Vec<String>>,
    #[cfg(test)]
    flaw: Option<crate::group::view_keeper::KeeperFlaw>,
}

/// Where process `inc` of `rank` listens (a fake address naming both).
fn address(rank: usize, inc: u64) -> SocketAddr {
    SocketAddr::from(([10, 0, (rank >> 8) as u8, rank as u8], 1000 + inc as u16))
}

/// The process an address names.
fn process_of(addr: &SocketAddr) -> u64 {
    u64::from(addr.port() - 1000)
}

impl<'p> World<'p> {
    /// The world of `plan`, its randomness from `rng` on.
    pub(super) fn new(plan: &'p Plan, rng: SplitMix64, trace: bool) -> Self {
        let n = plan.n;
        let c = plan.calls as usize;
        let mut world = Self {
            plan,
            rng,
            n,
            now: 0,
            seq: 0,
            events: BTreeMap::new(),
            ranks: (0..n).map(|_| Rank::new()).collect(),
            links: Vec::new(),
            blocked: vec![false; n * n],
            slow: vec![(0, 0); n * n],
            in_flight: 0,
            // Per view: two messages a call, an agreement's proposals
            // (one per rank lost) and decisions, and the close.
            link_bound: 2 * c + 2 * n + 8,
            flight_bound: 16 * n * n + 64,
            step_bound: 20_000 + 400 * (n * n) as u64 * (plan.calls + 2 * MAX_RESTARTS as u64),
            steps: 0,
            messages: 0,
            installs: Vec::new(),
            partial: Vec::new(),
            returns: Vec::new(),
            counts: Counts::default(),
            violations: Vec::new(),
            trace: trace.then(Vec::new),
            #[cfg(test)]
            flaw: None,
        };
        // View 0: every rank a member, a link for every pair.
        let members: Vec<usize> = (0..n).collect();
        for r in 0..n {
            world.ranks[r].keeper = Some(world.keeper(ViewKeeper::new(r, n)));
            world.installs.push(Install {
                rank: r,
                epoch: 0,
                members: members.clone(),
            });
        }
        for a in 0..n {
            for b in a + 1..n {
                let l = world.new_link(a, b);
                world.ranks[a].links.insert(b, l);
                world.ranks[b].links.insert(a, l);
            }
        }
        for r in 0..n {
            world.schedule(0, Ev::Begin(r));
        }
        for (i, (t, _)) in plan.faults.iter().enumerate() {
            world.schedule(*t, Ev::Fault(i));
        }
        if !plan.faults.is_empty() {
            world.schedule(plan.quiet + 1, Ev::Quiet);
        }
        world
    }

    /// The same world with a deliberate fault in every rank's keeper.
    #[cfg(test)]
    pub(super) fn with_flaw(mut self, flaw: Option<crate::group::view_keeper::KeeperFlaw>) -> Self {
        self.flaw = flaw;
        for r in &mut self.ranks {
            r.keeper = r.keeper.take().map(|k| k.with_flaw(flaw));
        }
        self
    }

    /// A keeper as this world makes them (with its flaw, in tests).
    fn keeper(&self, keeper: ViewKeeper) -> ViewKeeper {
        #[cfg(test)]
        let keeper = keeper.with_flaw(self.flaw);
        keeper
    }

    /// Runs until nothing is left to happen (or past the bound on
    /// events), and says what it left.
    pub(super) fn run(mut self) -> Ran {
        let mut runaway = false;
        while let Some(((t, seq), ev)) = self.events.pop_first() {
            self.now = t;
            self.steps += 1;
            if self.steps > self.step_bound {
                runaway = true;
                self.violations.push(Violation::Runaway {
                    steps: self.steps,
                    bound: self.step_bound,
                });
                break;
            }
            if let Some(r) = ev.taker(&self.links) {
                let rank = &self.ranks[r];
                if rank.alive && rank.frozen_until > t {
                    // It keeps its place among the others that wait.
                    self.events.insert((rank.frozen_until, seq), ev);
                    continue;
                }
            }
            self.take(ev);
        }
        let ends = self
            .ranks
            .iter()
            .map(|r| End {
                alive: r.alive,
                stage: r.stage.name(),
                calls: r.keeper.as_ref().map_or(0, ViewKeeper::calls),
                restarted: r.inc > 0,
            })
            .collect();
        Ran {
            installs: self.installs,
            partial: self.partial,
            returns: self.returns,
            ends,
            steps: self.steps,
            runaway,
            messages: self.messages,
            counts: self.counts,
            violations: self.violations,
            trace: self.trace.unwrap_or_default(),
        }
    }

    fn schedule(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.events.insert((at, self.seq), ev);
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            trace.push(format!("t={:<6} {}", self.now, line()));
        }
    }

    fn delay(&mut self) -> u64 {
        1 + self.rng.below(self.plan.max_delay as usize) as u64
    }

    /// Whether process `inc` of `rank` is the one alive.
    fn is(&self, rank: usize, inc: u64) -> bool {
        self.ranks[rank].alive && self.ranks[rank].inc == inc
    }

    fn take(&mut self, ev: Ev) {
        match ev {
            Ev::Begin(r) => {
                if self.is(r, 0) && matches!(self.ranks[r].stage, Stage::Idle) {
                    self.note(|| format!("rank {r} begins its program"));
                    self.next_call(r);
                    self.step(r, None);
                }
            }
            Ev::Next { rank, inc } => {
                if self.is(rank, inc) && matches!(self.ranks[rank].stage, Stage::Idle) {
                    self.next_call(rank);
                    self.step(rank, None);
                }
            }
            Ev::Deliver { link, end } => self.deliver(link, end),
            Ev::Notice { link, end } => {
                let (r, inc) = (self.links[link].ends[end], self.links[link].incs[end]);
                if self.is(r, inc) {
                    let peer = self.links[link].ends[1 - end];
                    self.note(|| format!("rank {r} notices its link to {peer} failed"));
                    self.lose(r, peer, link, false);
                }
            }
            Ev::Dial {
                from,
                inc,
                to,
                digest,
            } => self.dialed(from, inc, to, digest),
            Ev::Check { rank, inc } => {
                if self.is(rank, inc) {
                    self.poke(rank);
                }
            }
            Ev::FormDeadline { rank, inc, digest } => {
                if !self.is(rank, inc) {
                    return;
                }
                if matches!(&self.ranks[rank].stage, Stage::Form { digest: d, .. } if *d == digest)
                {
                    let poke = self.finish_form(rank);
                    self.act_on(rank, poke);
                }
            }
            Ev::Post { to, inc, post } => self.posted(to, inc, post),
            Ev::JoinTimeout { rank, inc, attempt } => {
                if self.is(rank, inc)
                    && matches!(self.ranks[rank].stage, Stage::Joining { attempt: a } if a == attempt)
                {
                    self.ask(rank);
                }
            }
            Ev::Fault(i) => self.fault(i),
            Ev::Heal(i) => {
                if let Fault::Partition { sides, .. } = &self.plan.faults[i].1 {
                    self.note(|| format!("partition {sides:?} heals"));
                    for a in 0..self.n {
                        for b in 0..self.n {
                            if sides[a] != sides[b] {
                                self.blocked[a * self.n + b] = false;
                            }
                        }
                    }
                }
            }
            Ev::Quiet => {
                self.note(|| "the network goes quiet".into());
                self.blocked.iter_mut().for_each(|b| *b = false);
                self.slow.iter_mut().for_each(|s| *s = (0, 0));
            }
            Ev::Restart(r) => self.restart(r),
            Ev::Linger { rank, inc } => {
                if self.is(rank, inc) && matches!(self.ranks[rank].stage, Stage::Finished) {
                    self.note(|| format!("rank {rank} closes its links"));
                    self.close_all(rank);
                }
            }
        }
    }

    // ---- links ------------------------------------------------------

    fn new_link(&mut self, a: usize, b: usize) -> usize {
        self.links.push(Link {
            ends: [a, b],
            incs: [self.ranks[a].inc, self.ranks[b].inc],
            failed: false,
            queues: [VecDeque::new(), VecDeque::new()],
            last_at: [0, 0],
            sent: [0, 0],
        });
        self.links.len() - 1
    }

    /// Sends `msg` from `from` on `link`; `false` where the send fails at
    /// once (the rank then knows the link failed).
    fn send(&mut self, from: usize, link: usize, msg: Msg) -> bool {
        let end = usize::from(self.links[link].ends[0] == from);
        let peer = self.links[link].ends[end];
        if self.links[link].failed {
            let knows = self.ranks[from].failed.contains_key(&peer)
                || self.ranks[from].next_failed.contains_key(&peer);
            let finds_out = self.rng.below(256) < self.plan.send_fails as usize;
            return !(knows || finds_out);
        }
        self.messages += 1;
        let l = &mut self.links[link];
        l.sent[end] += 1;
        if l.sent[end] == self.link_bound + 1 {
            self.violations.push(Violation::Unbounded {
                from,
                to: peer,
                bound: self.link_bound,
            });
        }
        let (extra, until) = self.slow[from * self.n + peer];
        let extra = if self.now < until { extra } else { 0 };
        let at = self.links[link].last_at[end].max(self.now + self.delay() + extra);
        let l = &mut self.links[link];
        l.last_at[end] = at;
        l.queues[end].push_back((at, msg));
        self.in_flight += 1;
        if self.in_flight == self.flight_bound + 1 {
            self.violations.push(Violation::Flooded {
                bound: self.flight_bound,
            });
        }
        self.schedule(at, Ev::Deliver { link, end });
        true
    }

    /// The link fails. Of what was on its way each way, what arrives is
    /// a prefix; each live end notices a while after the last of it.
    fn fail_link(&mut self, link: usize) {
        if self.links[link].failed {
            return;
        }
        self.links[link].failed = true;
        for end in 0..2 {
            let (r, inc) = (self.links[link].ends[end], self.links[link].incs[end]);
            let len = self.links[link].queues[end].len();
            let keep = match self.is(r, inc) {
                true => self.rng.below(len + 1),
                false => 0,
            };
            self.in_flight -= len - keep;
            let queue = &mut self.links[link].queues[end];
            queue.truncate(keep);
            let after = queue.back().map_or(self.now, |m| m.0).max(self.now);
            if self.is(r, inc) {
                let (lo, hi) = self.plan.notice;
                let at = after + lo + self.rng.below((hi - lo + 1) as usize) as u64;
                self.schedule(at, Ev::Notice { link, end });
            }
        }
    }

    /// `by` closes `link`: what it sent arrives, then the close (saying
    /// the peer was removed, or not); nothing more is read at `by`.
    fn close(&mut self, by: usize, link: usize, removed: bool) {
        if self.links[link].failed {
            return;
        }
        let end = usize::from(self.links[link].ends[0] == by);
        let l = &mut self.links[link];
        l.failed = true;
        let dropped = l.queues[1 - end].len();
        l.queues[1 - end].clear();
        self.in_flight -= dropped;
        let at = self.links[link].last_at[end].max(self.now + self.delay());
        let l = &mut self.links[link];
        l.last_at[end] = at;
        l.queues[end].push_back((at, Msg::Close { removed }));
        self.in_flight += 1;
        self.schedule(at, Ev::Deliver { link, end });
    }

    /// `rank` closes every link it has (its process ends or gives up).
    fn close_all(&mut self, rank: usize) {
        let r = &mut self.ranks[rank];
        let links: Vec<usize> = r
            .links
            .values()
            .chain(r.next_links.values())
            .copied()
            .collect();
        r.links.clear();
        r.next_links.clear();
        r.pending.clear();
        r.next_pending.clear();
        for l in links {
            self.close(rank, l, false);
        }
    }

    fn deliver(&mut self, link: usize, end: usize) {
        let Some((_, msg)) = self.links[link].queues[end].pop_front() else {
            return;
        };
        self.in_flight -= 1;
        let (r, inc) = (self.links[link].ends[end], self.links[link].incs[end]);
        if !self.is(r, inc) {
            return;
        }
        let peer = self.links[link].ends[1 - end];
        if let Msg::Close { removed } = msg {
            self.note(|| format!("rank {r} <- {peer}: close (removed: {removed})"));
            self.lose(r, peer, link, removed);
            return;
        }
        let rank = &mut self.ranks[r];
        let queue = if rank.links.get(&peer) == Some(&link) {
            rank.pending.entry(peer).or_default()
        } else if rank.next_links.get(&peer) == Some(&link) {
            rank.next_pending.entry(peer).or_default()
        } else {
            // A link this rank no longer reads.
            return;
        };
        let line = self
            .trace
            .is_some()
            .then(|| format!("rank {r} <- {peer}: {msg:?}"));
        queue.push_back(msg);
        if let Some(line) = line {
            self.note(|| line);
        }
        self.poke(r);
    }

    /// `r` learns its link to `peer` failed (closed saying removed).
    fn lose(&mut self, r: usize, peer: usize, link: usize, removed: bool) {
        let rank = &mut self.ranks[r];
        if rank.links.get(&peer) == Some(&link) {
            rank.failed.entry(peer).or_insert(removed);
        } else if rank.next_links.get(&peer) == Some(&link) {
            rank.next_failed.entry(peer).or_insert(removed);
        } else {
            return;
        }
        self.poke(r);
    }

    // ---- faults and restarts ----------------------------------------

    fn fault(&mut self, i: usize) {
        let plan = self.plan;
        let fault = &plan.faults[i].1;
        self.note(|| format!("fault: {fault:?}"));
        match fault {
            Fault::Kill {
                rank,
                restart_after,
            } => {
                let k = *rank;
                if !self.ranks[k].alive {
                    return;
                }
                self.counts.killed += 1;
                let r = &mut self.ranks[k];
                let inc = r.inc;
                for l in 0..self.links.len() {
                    let link = &self.links[l];
                    if link
                        .ends
                        .iter()
                        .zip(link.incs)
                        .any(|(&e, i)| e == k && i == inc)
                    {
                        self.fail_link(l);
                    }
                }
                let r = &mut self.ranks[k];
                r.alive = false;
                r.frozen_until = 0;
                r.stage = Stage::Dead;
                if let Some(after) = restart_after {
                    self.schedule(self.now + after, Ev::Restart(k));
                }
            }
            Fault::Cut(a, b) => self.cut(*a, *b),
            Fault::Partition { sides, until } => {
                for a in 0..self.n {
                    for b in 0..self.n {
                        if sides[a] != sides[b] {
                            self.blocked[a * self.n + b] = true;
                            if a < b {
                                self.cut(a, b);
                            }
                        }
                    }
                }
                self.schedule(*until, Ev::Heal(i));
            }
            Fault::Freeze { rank, until } => {
                let r = &mut self.ranks[*rank];
                if r.alive {
                    r.frozen_until = r.frozen_until.max(*until);
                }
            }
            Fault::Slow { a, b, extra, until } => {
                self.slow[a * self.n + b] = (*extra, *until);
                self.slow[b * self.n + a] = (*extra, *until);
            }
        }
    }

    /// Every live link between `a` and `b` fails.
    fn cut(&mut self, a: usize, b: usize) {
        for l in 0..self.links.len() {
            let ends = self.links[l].ends;
            if ends == [a, b] || ends == [b, a] {
                self.fail_link(l);
            }
        }
    }

    /// A fresh process of rank `r` starts, and asks to rejoin.
    fn restart(&mut self, r: usize) {
        let rank = &mut self.ranks[r];
        if rank.alive && !matches!(rank.stage, Stage::Failed) {
            return;
        }
        if rank.restarts >= MAX_RESTARTS {
            return;
        }
        rank.restarts += 1;
        rank.inc += 1;
        rank.alive = true;
        rank.frozen_until = 0;
        rank.keeper = None;
        rank.links.clear();
        rank.pending.clear();
        rank.failed.clear();
        rank.next_links.clear();
        rank.next_pending.clear();
        rank.next_failed.clear();
        rank.held = None;
        rank.waiting.clear();
        rank.removed = false;
        rank.stage = Stage::Joining { attempt: 0 };
        self.counts.restarts += 1;
        self.note(|| format!("rank {r} restarts, to rejoin"));
        self.ask(r);
    }

    /// A restarted rank asks a contact (any other rank, as it cannot
    /// know who is alive) to admit it, or gives up after enough tries.
    fn ask(&mut self, r: usize) {
        let Stage::Joining { attempt } = self.ranks[r].stage else {
            return;
        };
        if attempt >= MAX_ATTEMPTS {
            self.note(|| format!("rank {r} gives up rejoining"));
            self.counts.gave_up += 1;
            self.ranks[r].stage = Stage::GaveUp;
            return;
        }
        let attempt = attempt + 1;
        self.ranks[r].stage = Stage::Joining { attempt };
        let contact = (r + 1 + self.rng.below(self.n - 1)) % self.n;
        let inc = self.ranks[r].inc;
        self.note(|| format!("rank {r} asks rank {contact} to admit it (try {attempt})"));
        let at = self.now + self.delay();
        self.schedule(
            at,
            Ev::Post {
                to: contact,
                inc: u64::MAX,
                post: Post::Join { from: r, inc },
            },
        );
        let wait = self.plan.join_wait;
        self.schedule(
            self.now + wait,
            Ev::JoinTimeout {
                rank: r,
                inc,
                attempt,
            },
        );
    }

    /// Something sent outside the mesh reaches `to` (if its path is open
    /// and its process is the one meant).
    fn posted(&mut self, to: usize, inc: u64, post: Post) {
        if !self.ranks[to].alive || (inc != u64::MAX && self.ranks[to].inc != inc) {
            return;
        }
        match post {
            Post::Join {
                from,
                inc: from_inc,
            } => {
                if self.blocked[from * self.n + to] || !self.is(from, from_inc) {
                    return;
                }
                let rank = &self.ranks[to];
                let member = matches!(
                    rank.stage,
                    Stage::Idle
                        | Stage::Exchange { .. }
                        | Stage::Done { .. }
                        | Stage::Agree { .. }
                        | Stage::Form { joiners: None, .. }
                );
                let Some(keeper) = rank
                    .keeper
                    .as_ref()
                    .filter(|k| member && k.removed().is_none())
                else {
                    return;
                };
                let request = JoinRequest {
                    rank: from,
                    world: self.n,
                    listen: address(from, from_inc),
                    member_of: None,
                };
                match admission::screen(&request, keeper.members(), self.n) {
                    Ok(()) => {
                        self.note(|| format!("rank {to} keeps rank {from} waiting to rejoin"));
                        let waiting = &mut self.ranks[to].waiting;
                        waiting.retain(|w| w.0 != from);
                        waiting.push((from, request.listen));
                    }
                    Err(why) => {
                        self.note(|| format!("rank {to} refuses rank {from}: {why}"));
                        let at = self.now + self.delay();
                        self.schedule(
                            at,
                            Ev::Post {
                                to: from,
                                inc: from_inc,
                                post: Post::Refused,
                            },
                        );
                    }
                }
            }
            Post::Refused => {
                if let Stage::Joining { attempt } = self.ranks[to].stage {
                    // Ask again a while later: the members may not have
                    // lost it yet.
                    let wait = 4 * self.plan.max_delay + 60;
                    let inc = self.ranks[to].inc;
                    self.schedule(
                        self.now + wait,
                        Ev::JoinTimeout {
                            rank: to,
                            inc,
                            attempt,
                        },
                    );
                }
            }
            Post::Admission { decision, joiners } => {
                if matches!(self.ranks[to].stage, Stage::Joining { .. }) {
                    self.note(|| format!("rank {to} is admitted to {decision:?}"));
                    self.form(to, decision, Some(joiners));
                    self.poke(to);
                }
            }
        }
    }

    // ---- the program and the keeper ---------------------------------

    /// The next call of `r`'s program, or its end.
    fn next_call(&mut self, r: usize) {
        let calls = self.plan.calls;
        let rank = &mut self.ranks[r];
        let Some(keeper) = rank.keeper.as_mut() else {
            return;
        };
        if keeper.calls() >= calls {
            rank.stage = Stage::Finished;
            let inc = rank.inc;
            self.note(|| format!("rank {r} finished its program"));
            let linger = self.plan.linger;
            self.schedule(self.now + linger, Ev::Linger { rank: r, inc });
            return;
        }
        if let Err(e) = keeper.begin_call() {
            self.failed(r, e);
        }
    }

    /// `r` computes its next step (the time between two collectives),
    /// then begins its next call.
    fn compute(&mut self, r: usize) {
        let rank = &mut self.ranks[r];
        rank.stage = Stage::Idle;
        let inc = rank.inc;
        let at = self.now + self.rng.below(self.plan.compute as usize + 1) as u64;
        self.schedule(at, Ev::Next { rank: r, inc });
    }

    /// `r`'s program stopped with `error`.
    fn failed(&mut self, r: usize, error: KeeperError) {
        self.note(|| format!("rank {r} fails: {error}"));
        match &error {
            KeeperError::Removed { .. } | KeeperError::NoQuorum { .. } => {
                self.counts.removed += 1;
                self.ranks[r].removed = true;
            }
            KeeperError::OutOfStep { .. } => self.counts.out_of_step += 1,
            KeeperError::Fatal => self.counts.fatal += 1,
        }
        self.ranks[r].stage = Stage::Failed;
        self.close_all(r);
        let removed = matches!(
            error,
            KeeperError::Removed { .. } | KeeperError::NoQuorum { .. }
        );
        if removed && self.plan.restart_removed && self.ranks[r].restarts < MAX_RESTARTS {
            let after = 20 + self.rng.below(4 * self.plan.join_wait as usize) as u64;
            self.schedule(self.now + after, Ev::Restart(r));
        }
    }

    /// Looks at what `r` waits for again, and acts on it.
    fn poke(&mut self, r: usize) {
        let poke = self.settle(r);
        self.act_on(r, poke);
    }

    fn act_on(&mut self, r: usize, poke: Poke) {
        match poke {
            Poke::Wait => {}
            Poke::Hand(e) => self.step(r, Some(e)),
            Poke::Poll => self.step(r, None),
        }
    }

    /// Hands `event` to `r`'s keeper, then carries out every action it
    /// polls until it waits for something.
    fn step(&mut self, r: usize, mut event: Option<Event>) {
        loop {
            let Some(keeper) = self.ranks[r].keeper.as_mut() else {
                return;
            };
            if let Some(e) = event.take() {
                keeper.handle(e);
            }
            let Some(action) = keeper.poll() else {
                return;
            };
            match self.act(r, action) {
                Poke::Wait => return,
                Poke::Hand(e) => event = Some(e),
                Poke::Poll => {}
            }
        }
    }

    /// Carries out `action` of `r`'s keeper (as the shell does).
    fn act(&mut self, r: usize, action: Action) -> Poke {
        self.note(|| format!("rank {r} acts: {}", describe(&action)));
        let keeper = self.ranks[r].keeper.as_ref().expect("a keeper acts");
        let (epoch, members) = (keeper.epoch(), keeper.members().to_vec());
        match action {
            Action::Exchange { rerun } => {
                if rerun {
                    self.counts.reruns += 1;
                }
                let call = keeper.calls();
                let value = self.plan.value(r, call);
                let rank = &mut self.ranks[r];
                rank.held = None;
                rank.stage = Stage::Exchange {
                    call,
                    got: BTreeMap::new(),
                };
                self.send_all(r, &members, |_| Msg::Exch { epoch, call, value });
                self.settle(r)
            }
            Action::Done => {
                let call = keeper.calls();
                let world = self.n;
                // As the shell's announcement: refuse those that cannot
                // rejoin, name the rest.
                let mut refused = Vec::new();
                let rank = &mut self.ranks[r];
                rank.waiting.retain(|&(j, addr)| {
                    let request = JoinRequest {
                        rank: j,
                        world,
                        listen: addr,
                        member_of: None,
                    };
                    let ok = admission::screen(&request, &members, world).is_ok();
                    if !ok {
                        refused.push((j, process_of(&addr)));
                    }
                    ok
                });
                let mut joiners = rank.waiting.clone();
                joiners.sort_unstable_by_key(|j| j.0);
                rank.stage = Stage::Done {
                    call,
                    got: BTreeMap::new(),
                };
                for (j, inc) in refused {
                    let at = self.now + self.delay();
                    self.schedule(
                        at,
                        Ev::Post {
                            to: j,
                            inc,
                            post: Post::Refused,
                        },
                    );
                }
                let mine = joiners.clone();
                self.send_all(r, &members, |_| Msg::Done {
                    epoch,
                    call,
                    joiners: mine.clone(),
                });
                if let Stage::Done { got, .. } = &mut self.ranks[r].stage {
                    got.insert(r, joiners);
                }
                self.settle(r)
            }
            Action::Agree(machine) => {
                self.counts.agreements += 1;
                self.ranks[r].stage = Stage::Agree {
                    machine,
                    told: BTreeSet::new(),
                };
                self.settle(r)
            }
            Action::Admit { decision, joiners } => {
                for (j, addr) in joiners.iter().copied() {
                    let rank = &mut self.ranks[r];
                    if let Some(i) = rank.waiting.iter().position(|w| *w == (j, addr)) {
                        rank.waiting.remove(i);
                        let joiners = joiners.iter().map(|j| j.0).collect();
                        let at = self.now + self.delay();
                        self.schedule(
                            at,
                            Ev::Post {
                                to: j,
                                inc: process_of(&addr),
                                post: Post::Admission {
                                    decision: decision.clone(),
                                    joiners,
                                },
                            },
                        );
                    }
                }
                Poke::Poll
            }
            Action::FormMesh(decision) => {
                self.form(r, decision, None);
                self.settle(r)
            }
            Action::Return => {
                self.counts.returned += 1;
                let rank = &self.ranks[r];
                let keeper = rank.keeper.as_ref().expect("a keeper returns");
                let call = keeper.calls();
                match rank.held.clone() {
                    Some(held) if held.call == call => {
                        self.returns.push(Returned {
                            rank: r,
                            inc: rank.inc,
                            call,
                            bits: held.bits,
                            epoch: held.epoch,
                            members: held.members,
                            members_now: keeper.members().to_vec(),
                            after_removal: rank.removed,
                        });
                    }
                    _ => self.violations.push(Violation::NoResult { rank: r, call }),
                }
                let keeper = self.ranks[r].keeper.as_mut().expect("a keeper");
                match keeper.admit(OnRankFailure::Continue) {
                    Ok(true) => {
                        self.counts.admissions += 1;
                        Poke::Poll
                    }
                    Ok(false) => {
                        self.compute(r);
                        Poke::Wait
                    }
                    Err(e) => {
                        self.failed(r, e);
                        Poke::Wait
                    }
                }
            }
            Action::Admitted(joined) => {
                self.note(|| format!("rank {r}: the admission took in {joined:?}"));
                self.compute(r);
                Poke::Wait
            }
            Action::Fail(e) => {
                self.failed(r, e);
                Poke::Wait
            }
        }
    }

    /// Sends `msg(peer)` to every other member of `members` on `r`'s
    /// current links; a send that fails at once counts as the link's
    /// failure, known.
    fn send_all(&mut self, r: usize, members: &[usize], msg: impl Fn(usize) -> Msg) {
        for &m in members.iter().filter(|&&m| m != r) {
            match self.ranks[r].links.get(&m).copied() {
                Some(l) => {
                    if !self.send(r, l, msg(m)) {
                        self.ranks[r].failed.entry(m).or_insert(false);
                    }
                }
                None => {
                    self.ranks[r].failed.entry(m).or_insert(false);
                }
            }
        }
    }

    /// What `r` does with what came, for the stage it is in.
    fn settle(&mut self, r: usize) -> Poke {
        match self.ranks[r].stage {
            Stage::Exchange { .. } | Stage::Done { .. } => self.settle_call(r),
            Stage::Agree { .. } => self.settle_agreement(r),
            Stage::Form { ref mesh, .. } => match mesh.is_settled() {
                true => self.finish_form(r),
                false => Poke::Wait,
            },
            _ => Poke::Wait,
        }
    }

    /// In an exchange or its `Done`: reads each member it still waits for,
    /// in order, as the shell's collective does (a proposal where a
    /// message was due is an alarm; another message is out of step).
    fn settle_call(&mut self, r: usize) -> Poke {
        let rank = &mut self.ranks[r];
        let keeper = rank.keeper.as_ref().expect("a member has a keeper");
        let members = keeper.members().to_vec();
        let epoch = keeper.epoch();
        let (done, call) = match &rank.stage {
            Stage::Exchange { call, .. } => (false, *call),
            Stage::Done { call, .. } => (true, *call),
            _ => return Poke::Wait,
        };
        let mut terminal: Option<Failure> = None;
        let mut lost = Vec::new();
        let mut alarms = Vec::new();
        for (place, &peer) in members.iter().enumerate() {
            if peer == r {
                continue;
            }
            let have = match &rank.stage {
                Stage::Exchange { got, .. } => got.contains_key(&peer),
                Stage::Done { got, .. } => got.contains_key(&peer),
                _ => true,
            };
            if have {
                continue;
            }
            let queue = rank.pending.entry(peer).or_default();
            match queue.pop_front() {
                Some(Msg::Exch {
                    epoch: e,
                    call: c,
                    value,
                }) if !done && e == epoch && c == call => {
                    if let Stage::Exchange { got, .. } = &mut rank.stage {
                        got.insert(peer, value);
                    }
                }
                Some(Msg::Done {
                    epoch: e,
                    call: c,
                    joiners,
                }) if done && e == epoch && c == call => {
                    if let Stage::Done { got, .. } = &mut rank.stage {
                        got.insert(peer, joiners);
                    }
                }
                Some(Msg::View {
                    kind: MessageKind::Proposal,
                    body,
                    ..
                }) => alarms.push((place, body.to_vec())),
                Some(other) => {
                    // Not what was due: the shell's reader fails the call
                    // (out of step), which is not about membership.
                    if let Some(trace) = &mut self.trace {
                        let line = format!("rank {r} reads {other:?} from {peer}: out of step");
                        trace.push(line);
                    }
                    terminal.get_or_insert(Failure::Fatal);
                }
                None => match rank.failed.get(&peer) {
                    Some(true) => {
                        terminal.get_or_insert(Failure::Removed(format!(
                            "rank {peer} closed its link: removed"
                        )));
                    }
                    Some(false) => lost.push(place),
                    None => {}
                },
            }
        }
        let whole = match &rank.stage {
            Stage::Exchange { got, .. } => got.len() + 1 == members.len(),
            Stage::Done { got, .. } => got.len() == members.len(),
            _ => false,
        };
        if terminal.is_none() && alarms.is_empty() && lost.is_empty() {
            if !whole {
                // At most one message is due from each member: nothing
                // more to read until another comes.
                return Poke::Wait;
            }
            let stage = std::mem::replace(&mut rank.stage, Stage::Idle);
            return match stage {
                Stage::Exchange { call, mut got } => {
                    got.insert(r, self.plan.value(r, call));
                    let bits = fold_values(call, members.iter().map(|m| (*m, got[m])));
                    rank.held = Some(Held {
                        call,
                        bits,
                        epoch,
                        members,
                    });
                    Poke::Hand(Event::Exchanged)
                }
                Stage::Done { got, .. } => {
                    // In place order, as the shell builds it.
                    let announced = members
                        .iter()
                        .flat_map(|m| got[m].iter().copied())
                        .collect();
                    Poke::Hand(Event::DoneExchanged(announced))
                }
                _ => unreachable!("the stage was a collective's"),
            };
        }
        // The exchange failed: the first failure ends it, the others are
        // noted for the agreement, as the shell notes them.
        let terminal = match terminal {
            Some(t) => {
                for &p in &lost {
                    keeper_of(rank).note_lost(p);
                }
                for (p, body) in alarms {
                    keeper_of(rank).note_alarm(p, body);
                }
                t
            }
            None if !alarms.is_empty() => {
                let (p, body) = alarms.remove(0);
                for &l in &lost {
                    keeper_of(rank).note_lost(l);
                }
                for (q, b) in alarms {
                    keeper_of(rank).note_alarm(q, b);
                }
                Failure::Alarm(p, body)
            }
            None => {
                for &l in &lost[1..] {
                    keeper_of(rank).note_lost(l);
                }
                Failure::Lost(lost[0])
            }
        };
        rank.stage = Stage::Idle;
        Poke::Hand(Event::ExchangeFailed(terminal))
    }

    /// In an agreement: feeds it what came on the view's links and the
    /// links lost (as the shell's reader does), sends what it has, and
    /// hands in its outcome once there is one.
    fn settle_agreement(&mut self, r: usize) -> Poke {
        let Stage::Agree {
            mut machine,
            mut told,
        } = std::mem::replace(&mut self.ranks[r].stage, Stage::Idle)
        else {
            return Poke::Wait;
        };
        let x = machine.seat().epoch();
        let me = machine.seat().place();
        let members = machine.seat().members().to_vec();
        let rank = &mut self.ranks[r];
        for (p, &peer) in members.iter().enumerate() {
            if p == me {
                continue;
            }
            if let Some(queue) = rank.pending.get_mut(&peer) {
                while let Some(msg) = queue.pop_front() {
                    // Everything but this view's proposals and decisions
                    // is dropped, as the shell's reader drops it.
                    if let Msg::View { epoch, kind, body } = msg {
                        if epoch == x {
                            let event = match kind {
                                MessageKind::Proposal => Heard::Proposal {
                                    from: p,
                                    body: &body,
                                },
                                MessageKind::Decision => Heard::Decision {
                                    from: p,
                                    body: &body,
                                },
                            };
                            machine.handle(event);
                        }
                    }
                }
            }
            let unlinked = !rank.links.contains_key(&peer);
            if (rank.failed.contains_key(&peer) || unlinked) && told.insert(p) {
                machine.handle(Heard::Lost { from: p });
            }
        }
        while let Some(t) = machine.poll_transmit() {
            let mut failed = Vec::new();
            for &p in &t.to {
                let peer = members[p];
                let link = self.ranks[r].links.get(&peer).copied();
                let ok = match link {
                    Some(l) if !self.ranks[r].failed.contains_key(&peer) => self.send(
                        r,
                        l,
                        Msg::View {
                            epoch: x,
                            kind: t.kind,
                            body: t.body.clone(),
                        },
                    ),
                    _ => false,
                };
                // The decision for the ranks left out: its failures are
                // not told.
                if !ok && !t.left_out {
                    failed.push(p);
                }
            }
            if self.trace.is_some() {
                let text = String::from_utf8_lossy(&t.body).to_string();
                self.note(|| format!("rank {r} -> places {:?}: {text}; failed {failed:?}", t.to));
            }
            for p in failed {
                self.ranks[r].failed.entry(members[p]).or_insert(false);
                told.insert(p);
                machine.send_failed(p);
            }
        }
        if let Some(outcome) = machine.outcome() {
            let outcome = outcome.clone();
            self.note(|| format!("rank {r} agrees: {outcome:?}"));
            return Poke::Hand(Event::Agreed(outcome));
        }
        if (0..members.len()).all(|p| p == me || machine.suspects().contains(&p)) {
            return Poke::Hand(Event::Stopped(format!(
                "no link left to hear view {x} from"
            )));
        }
        self.ranks[r].stage = Stage::Agree { machine, told };
        Poke::Wait
    }

    // ---- meshes -----------------------------------------------------

    /// `r` begins forming the mesh of `decision`'s view with the core's
    /// [`MeshForming`]: it dials the lower members it says, takes the
    /// higher members' hellos as it judges them, and waits up to the
    /// bound.
    fn form(&mut self, r: usize, decision: ViewDecision, joiners: Option<Vec<usize>>) {
        let digest = view_digest(decision.epoch, &decision.members);
        let inc = self.ranks[r].inc;
        let place = decision
            .members
            .iter()
            .position(|&m| m == r)
            .expect("a view formed by one of its members");
        let mark = MeshMark {
            epoch: decision.epoch,
            digest: Some(digest),
        };
        let mut mesh = MeshForming::new(place, decision.members.len(), mark, Dials::EachAlone);
        let mut dials = Vec::new();
        while let Some(q) = mesh.poll_dial() {
            dials.push(decision.members[q]);
        }
        let rank = &mut self.ranks[r];
        rank.next_links.clear();
        rank.next_pending.clear();
        rank.next_failed.clear();
        rank.stage = Stage::Form {
            decision,
            digest,
            joiners,
            mesh,
        };
        for to in dials {
            let at = self.now + self.delay();
            self.schedule(
                at,
                Ev::Dial {
                    from: r,
                    inc,
                    to,
                    digest,
                },
            );
        }
        let wait = self.plan.form_wait;
        self.schedule(
            self.now + wait,
            Ev::FormDeadline {
                rank: r,
                inc,
                digest,
            },
        );
    }

    /// Whether `r` forms the mesh of the view with `digest`.
    fn forming(&self, r: usize, digest: u64) -> bool {
        matches!(&self.ranks[r].stage, Stage::Form { digest: d, .. } if *d == digest)
    }

    /// A dial from `from` (a higher member) reaches `to`: a blocked path,
    /// or a rank not forming a mesh yet, is tried again while `from`
    /// forms (the shell's dial retries within its wait); else `to`'s
    /// machine judges `from`'s hello. Taken, the pair is linked; another
    /// view's, the connection is dropped and `from` goes without it;
    /// refused (the same epoch with other members), `to` stops as the
    /// shell's does.
    fn dialed(&mut self, from: usize, inc: u64, to: usize, digest: u64) {
        if !self.is(from, inc) || !self.forming(from, digest) || !self.ranks[to].alive {
            return;
        }
        let to_forms = matches!(self.ranks[to].stage, Stage::Form { .. });
        if self.blocked[from * self.n + to] || !to_forms {
            let at = self.now + 2 * self.plan.max_delay + 10;
            self.schedule(
                at,
                Ev::Dial {
                    from,
                    inc,
                    to,
                    digest,
                },
            );
            return;
        }
        let Stage::Form {
            decision: theirs, ..
        } = &self.ranks[from].stage
        else {
            return;
        };
        let hello = MeshHello {
            view: Some(digest),
            rank: theirs.members.iter().position(|&m| m == from).unwrap_or(0),
            world: theirs.members.len(),
            listen: None,
            epoch: theirs.epoch,
        };
        let to_place = theirs.members.iter().position(|&m| m == to).unwrap_or(0);
        let Stage::Form { mesh, .. } = &mut self.ranks[to].stage else {
            return;
        };
        let verdict = mesh.hello(&hello);
        let linked = verdict == HelloVerdict::Take;
        if let Stage::Form { mesh, .. } = &mut self.ranks[from].stage {
            // A failed dial leaves that member out of a new view's mesh.
            let _ = mesh.dialed(to_place, linked);
        }
        match verdict {
            HelloVerdict::Take => {
                let l = self.new_link(from, to);
                self.ranks[from].next_links.insert(to, l);
                self.ranks[to].next_links.insert(from, l);
                self.note(|| format!("ranks {from} and {to} link up"));
                self.poke(to);
            }
            HelloVerdict::OtherView => {
                self.note(|| format!("rank {to} drops {from}'s hello for another view"));
            }
            HelloVerdict::Refuse(why) => {
                self.note(|| format!("rank {to} refuses {from}'s hello: {why}"));
                self.counts.refused_hellos += 1;
                let poke = self.form_failed(to, why.to_string());
                self.act_on(to, poke);
            }
        }
        let at = self.now + self.delay();
        self.schedule(at, Ev::Check { rank: from, inc });
    }

    /// `r`'s mesh cannot form (a hello it refused): a member's keeper
    /// hears it stopped; a rank being admitted fails, and may start
    /// again.
    fn form_failed(&mut self, r: usize, why: String) -> Poke {
        let Stage::Form { joiners, .. } = std::mem::replace(&mut self.ranks[r].stage, Stage::Idle)
        else {
            return Poke::Wait;
        };
        match joiners {
            None => Poke::Hand(Event::Stopped(why)),
            Some(_) => {
                self.counts.failed_admissions += 1;
                self.fail_admission(r);
                Poke::Wait
            }
        }
    }

    /// `r` stops forming: its old links close (saying removed to the ranks
    /// the view leaves out), the new mesh is its links, and its keeper
    /// hears which members did not link up (a rank admitted fails where
    /// any did not).
    fn finish_form(&mut self, r: usize) -> Poke {
        let Stage::Form {
            decision,
            joiners,
            mesh,
            ..
        } = std::mem::replace(&mut self.ranks[r].stage, Stage::Idle)
        else {
            return Poke::Wait;
        };
        let rank = &mut self.ranks[r];
        let old = std::mem::take(&mut rank.links);
        rank.links = std::mem::take(&mut rank.next_links);
        rank.pending = std::mem::take(&mut rank.next_pending);
        rank.failed = std::mem::take(&mut rank.next_failed);
        let unlinked = mesh.missing();
        for (peer, l) in old {
            let removed = !decision.members.contains(&peer);
            self.close(r, l, removed);
        }
        self.note(|| format!("rank {r} formed {decision:?}, unlinked places {unlinked:?}"));
        let install = Install {
            rank: r,
            epoch: decision.epoch,
            members: decision.members.clone(),
        };
        if unlinked.is_empty() {
            self.counts.views += 1;
            self.installs.push(install);
        } else {
            self.partial.push(install);
        }
        match joiners {
            None => Poke::Hand(Event::MeshFormed { unlinked }),
            Some(joiners) if unlinked.is_empty() => {
                self.counts.joined += 1;
                let keeper = self.keeper(ViewKeeper::admitted(r, self.n, &decision, joiners));
                self.ranks[r].keeper = Some(keeper);
                self.next_call(r);
                Poke::Poll
            }
            Some(_) => {
                // Its mesh is not whole: it fails, and may start again.
                self.note(|| format!("rank {r} failed to link up with its new view"));
                self.counts.failed_admissions += 1;
                self.fail_admission(r);
                Poke::Wait
            }
        }
    }

    /// A rank being admitted whose mesh did not form: it fails, closes
    /// what it linked, and may start again.
    fn fail_admission(&mut self, r: usize) {
        self.ranks[r].stage = Stage::Failed;
        self.close_all(r);
        if self.ranks[r].restarts < MAX_RESTARTS {
            let after = 20 + self.rng.below(self.plan.join_wait as usize) as u64;
            self.schedule(self.now + after, Ev::Restart(r));
        }
    }
}

fn keeper_of(rank: &mut Rank) -> &mut ViewKeeper {
    rank.keeper.as_mut().expect("a member has a keeper")
}

/// An action in a line (an agreement by its seat, not its state).
fn describe(action: &Action) -> String {
    match action {
        Action::Agree(a) => format!(
            "agree on view {} (call {}, result held: {}, suspects {:?})",
            a.seat().epoch(),
            a.seat().call(),
            a.seat().has_result(),
            a.suspects()
        ),
        other => format!("{other:?}"),
    }
}
