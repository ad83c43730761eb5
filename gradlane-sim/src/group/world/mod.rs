//! The ranks of a group in the world: one link per pair of a view's
//! members (a lane in order each way, as a QUIC stream), and each rank's
//! [`ViewKeeper`] (with the [`Agreement`]s it starts) driven as the shell
//! drives it.

mod faults;
mod links;
mod meshes;
mod program;

mod events;

use super::plan::{fold_values, Setup, MAX_ATTEMPTS, MAX_RESTARTS};
use crate::plan::{Fault, Plan};
use crate::report::Counts;
use crate::settings::{Mode, Settings};
use crate::violation::Violation;
use crate::world::{Lane, Model, Ran, World};
use bytes::Bytes;
use gradlane_core::group::agreement::{Agreement, Event as Heard, MessageKind};
use gradlane_core::group::view_keeper::{Action, Event, Failure, KeeperError, ViewKeeper};
use gradlane_core::group::{
    admission, view_digest, Dials, HelloVerdict, JoinRequest, MeshForming, MeshHello, MeshMark,
    OnRankFailure, ViewDecision,
};
use gradlane_core::rng::SplitMix64;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;

/// Something that happens at a time.
#[derive(Debug, Clone)]
pub(crate) enum Ev {
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

/// What travels outside the mesh.
#[derive(Debug, Clone)]
pub(crate) enum Post {
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
    /// Messages on their way toward each end.
    lanes: [Lane<Msg>; 2],
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
pub(crate) struct Install {
    /// The rank.
    pub rank: usize,
    /// The view's number.
    pub epoch: u64,
    /// Its members.
    pub members: Vec<usize>,
}

/// A call's result a rank returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Returned {
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
pub(crate) struct End {
    /// Alive at the end.
    pub alive: bool,
    /// Its stage's name.
    pub stage: &'static str,
    /// Calls its keeper began (0 without one).
    pub calls: u64,
    /// Whether it ever restarted.
    pub restarted: bool,
}

/// What a group's run left, for its checks.
pub(crate) struct Left {
    /// Every view installed, in order.
    pub installs: Vec<Install>,
    /// Every mesh that formed with members missing (the view taken as
    /// the base of the next agreement, not installed).
    pub partial: Vec<Install>,
    /// Every result returned, in order.
    pub returns: Vec<Returned>,
    /// How each rank ended.
    pub ends: Vec<End>,
    /// Whether the run was stopped at the cap on events.
    pub runaway: bool,
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

/// The ranks of a group, their links and what they did.
pub(crate) struct Grouping<'p> {
    setup: &'p Setup,
    n: usize,
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
    messages: u64,
    installs: Vec<Install>,
    partial: Vec<Install>,
    returns: Vec<Returned>,
    counts: Counts,
    violations: Vec<Violation>,
    #[cfg(test)]
    flaw: Option<gradlane_core::group::view_keeper::KeeperFlaw>,
}

/// Where process `inc` of `rank` listens (a fake address naming both).
fn address(rank: usize, inc: u64) -> SocketAddr {
    SocketAddr::from(([10, 0, (rank >> 8) as u8, rank as u8], 1000 + inc as u16))
}

/// The process an address names.
fn process_of(addr: &SocketAddr) -> u64 {
    u64::from(addr.port() - 1000)
}

/// Runs the group of `plan`, its randomness from `rng` on.
pub(crate) fn run(
    plan: &Plan<Setup>,
    rng: SplitMix64,
    traced: bool,
    settings: &Settings,
) -> Ran<Left> {
    let setup = &plan.setup;
    let n = plan.n;
    let c = setup.calls as usize;
    let m = Grouping {
        setup,
        n,
        ranks: (0..n).map(|_| Rank::new()).collect(),
        links: Vec::new(),
        blocked: vec![false; n * n],
        slow: vec![(0, 0); n * n],
        in_flight: 0,
        // Per view: two messages a call, an agreement's proposals
        // (one per rank lost) and decisions, and the close.
        link_bound: 2 * c + 2 * n + 8,
        flight_bound: 16 * n * n + 64,
        messages: 0,
        installs: Vec::new(),
        partial: Vec::new(),
        returns: Vec::new(),
        counts: Counts::default(),
        violations: Vec::new(),
        #[cfg(test)]
        flaw: settings.flaw,
    };
    // Outside the tests, the settings have drawn the plan already.
    let _ = settings;
    let mut world = World::new(plan, rng, traced, m);
    world.begin_all();
    let bound = 20_000 + 400 * (n * n) as u64 * (setup.calls + 2 * MAX_RESTARTS as u64);
    let runaway = world.run(bound);
    if runaway {
        let steps = world.steps;
        world.m.violations.push(Violation::Runaway { steps, bound });
    }
    let ends = world
        .m
        .ranks
        .iter()
        .map(|r| End {
            alive: r.alive,
            stage: r.stage.name(),
            calls: r.keeper.as_ref().map_or(0, ViewKeeper::calls),
            restarted: r.inc > 0,
        })
        .collect();
    let m = &mut world.m;
    let left = Left {
        installs: std::mem::take(&mut m.installs),
        partial: std::mem::take(&mut m.partial),
        returns: std::mem::take(&mut m.returns),
        ends,
        runaway,
    };
    m.counts.clashes = clashes(&left);
    let found = (
        m.messages,
        m.counts.clone(),
        std::mem::take(&mut m.violations),
    );
    world.finish(setup.calls, found, left)
}

impl Model for Grouping<'_> {
    const MODE: Mode = Mode::Group;
    type Setup = Setup;
    type Ev = Ev;

    fn frozen_until(&self, ev: &Ev) -> u64 {
        let taker = match *ev {
            Ev::Begin(r) => r,
            Ev::Deliver { link, end } | Ev::Notice { link, end } => self.links[link].ends[end],
            Ev::Dial { to, .. } | Ev::Post { to, .. } => to,
            Ev::Check { rank, .. }
            | Ev::FormDeadline { rank, .. }
            | Ev::JoinTimeout { rank, .. }
            | Ev::Linger { rank, .. }
            | Ev::Next { rank, .. } => rank,
            Ev::Fault(_) | Ev::Heal(_) | Ev::Quiet | Ev::Restart(_) => return 0,
        };
        let rank = &self.ranks[taker];
        if rank.alive {
            rank.frozen_until
        } else {
            0
        }
    }

    fn take(w: &mut World<'_, Self>, ev: Ev) {
        w.take(ev);
    }
}

impl World<'_, Grouping<'_>> {
    /// View 0: every rank a member, a link for every pair; the programs
    /// begin and the faults are on their way.
    fn begin_all(&mut self) {
        let n = self.m.n;
        let members: Vec<usize> = (0..n).collect();
        for r in 0..n {
            self.m.ranks[r].keeper = Some(self.keeper(ViewKeeper::new(r, n)));
            self.m.installs.push(Install {
                rank: r,
                epoch: 0,
                members: members.clone(),
            });
        }
        for a in 0..n {
            for b in a + 1..n {
                let l = self.new_link(a, b);
                self.m.ranks[a].links.insert(b, l);
                self.m.ranks[b].links.insert(a, l);
            }
        }
        for r in 0..n {
            self.schedule(0, Ev::Begin(r));
        }
        let plan = self.plan;
        for (i, (t, _)) in plan.faults.iter().enumerate() {
            self.schedule(*t, Ev::Fault(i));
        }
        if !plan.faults.is_empty() {
            self.schedule(plan.quiet + 1, Ev::Quiet);
        }
    }

    /// A keeper as this world makes them (with its flaw, in tests).
    fn keeper(&self, keeper: ViewKeeper) -> ViewKeeper {
        #[cfg(test)]
        let keeper = keeper.with_flaw(self.m.flaw);
        keeper
    }

    /// Whether process `inc` of `rank` is the one alive.
    fn is(&self, rank: usize, inc: u64) -> bool {
        self.m.ranks[rank].alive && self.m.ranks[rank].inc == inc
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

/// How many epochs two ranks formed meshes of with different members
/// (one of them at least not whole): an admission and an agreement that
/// overlapped. Not a violation (neither mesh is whole, by the digest in
/// the hello), but counted, as each costs the ranks in it their view.
fn clashes(ran: &Left) -> u64 {
    let mut seen: BTreeMap<u64, &Vec<usize>> = BTreeMap::new();
    let mut clashed = std::collections::BTreeSet::new();
    for install in ran.installs.iter().chain(&ran.partial) {
        match seen.get(&install.epoch) {
            Some(members) if **members != install.members => {
                clashed.insert(install.epoch);
            }
            Some(_) => {}
            None => {
                seen.insert(install.epoch, &install.members);
            }
        }
    }
    clashed.len() as u64
}
