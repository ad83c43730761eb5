//! The simulated network and the ranks on it: events in virtual time,
//! one link per pair of a view's members (a queue in order each way, as a
//! QUIC stream), failures noticed at each end a while after they happen,
//! and each rank's [`ViewKeeper`] (with the [`Agreement`]s it starts)
//! driven as the shell drives it.

mod faults;
mod links;
mod meshes;
mod program;

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
