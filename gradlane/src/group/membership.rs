//! What a group does when a rank dies ([`OnRankFailure`]).
//!
//! With `Continue`, every collective ends with a `Done` message from each
//! rank to every other, and no rank returns before it has them all: when a
//! rank dies, every survivor is therefore either still in the collective
//! (holding its result or not) or, having returned it, one collective on,
//! and then every survivor holds that result. The survivors agree on a new
//! view (who is left, and whether the collective in flight counts or runs
//! again among them), form a fresh mesh among themselves, register the
//! buckets again and go on. A lost rank costs the collective in flight and
//! a failure timeout, as a lost chunk costs its values.
//!
//! The agreement (docs/DESIGN.md, "Elastic membership"): every survivor
//! sends its proposal (whom it lost, which collective it is in) to every
//! rank it still reaches; the lowest rank a survivor reaches is its
//! coordinator, which decides once it has a proposal from every rank it
//! has not lost; every rank accepts the first decision it hears and
//! passes it on (its acceptance), and a member installs a view only once
//! every member accepted it. A decision needs a quorum of the last view
//! (a majority, or exactly half with its lowest rank), two quorums share
//! a rank that accepts one decision, so no two ranks install different
//! views of one epoch; a member whose view cannot be installed stops
//! (`GroupError::Removed`). The rule and the
//! exchange are the core's machine
//! (`gradlane_core::group::agreement::Agreement`); this module only
//! carries its messages over the links and acts on its outcome.

use super::{tag, BucketOptions, Group, GroupConfig, GroupError, Kind};
use crate::link::LinkError;
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use gradlane_core::control::codes;
use gradlane_core::group::agreement::{Agreement, Event, MessageKind, Outcome, Seat, Transmit};
use gradlane_core::group::{CallFate, Joiners, ViewDecision, ViewOutcome};
use gradlane_core::layout::Layout;
use quinn::VarInt;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// How long the coordinator tries to tell the ranks it left out.
const LEFT_OUT_WAIT: Duration = Duration::from_secs(1);

pub use gradlane_core::group::OnRankFailure;

/// A rank's place in its group across views: who it joined as, who the
/// members are now, and what a new view needs to form its mesh.
pub(super) struct Membership {
    pub(super) policy: OnRankFailure,
    /// The rank this process joined as (the collectives number ranks by
    /// their place in the current view instead).
    pub(super) joined_rank: usize,
    /// The size the group was formed with.
    pub(super) joined_world: usize,
    /// The members of the current view, by the ranks they joined as, in
    /// increasing order: member `i` is the view's rank `i`.
    pub(super) members: Vec<usize>,
    /// The current view's number (0 for the mesh the group joined with).
    pub(super) epoch: u64,
    /// Collectives called so far (with `Continue`): numbers the one in
    /// flight in a proposal.
    pub(super) calls: u64,
    /// Where every rank listens, by the rank it joined as.
    pub(super) addresses: Vec<SocketAddr>,
    /// What the group was joined with, to form the mesh of a new view.
    pub(super) config: GroupConfig,
    /// Every registered bucket's layout and options, to register them
    /// again on a new view's links.
    pub(super) buckets: Vec<(Layout, BucketOptions)>,
    /// What a failed collective left for the agreement: the ranks (places
    /// in the view) whose links failed, and the proposals that came.
    pub(super) lost: BTreeSet<usize>,
    alarms: BTreeMap<usize, Bytes>,
    /// How many ranks took part in the last collective.
    pub(super) contributors: usize,
    /// The ranks waiting at this member to rejoin.
    pub(super) waiting: super::rejoin::Waiting,
    /// The ranks waiting at any member, as the last collective's `Done`
    /// messages said: every member knows the same.
    pub(super) announced: Vec<(usize, SocketAddr)>,
    /// The ranks the last admission brought in.
    pub(super) joined: Vec<usize>,
    /// The links of the ranks being admitted, kept open until the new
    /// view's mesh is up.
    pub(super) admitting: Vec<crate::link::Link>,
    /// Set once this rank is out of the group: every later call fails
    /// with it at once.
    removed: Option<(u64, String)>,
}

impl Membership {
    pub(super) fn new(config: GroupConfig, addresses: Vec<SocketAddr>) -> Self {
        Self {
            policy: config.on_rank_failure,
            joined_rank: config.rank,
            joined_world: config.world,
            members: (0..config.world).collect(),
            contributors: config.world,
            epoch: 0,
            calls: 0,
            addresses,
            config,
            buckets: Vec::new(),
            lost: BTreeSet::new(),
            alarms: BTreeMap::new(),
            removed: None,
            waiting: Default::default(),
            announced: Vec::new(),
            joined: Vec::new(),
            admitting: Vec::new(),
        }
    }
}

/// What one link said during an agreement, as it came: the core's
/// machine reads it.
enum ViewEvent {
    Proposal(Bytes),
    Decision(Bytes),
    Lost,
}

impl ViewEvent {
    /// The machine's event, from the rank at place `from`.
    fn as_event(&self, from: usize) -> Event<'_> {
        match self {
            ViewEvent::Proposal(body) => Event::Proposal { from, body },
            ViewEvent::Decision(body) => Event::Decision { from, body },
            ViewEvent::Lost => Event::Lost { from },
        }
    }
}

/// What a failed attempt at a collective means for the group.
enum Failure {
    /// A link failed: that rank (place in the view) is lost.
    Lost(usize),
    /// Another rank began an agreement.
    Alarm(usize, Bytes),
    /// Not a lost rank: the error stands.
    Fatal(GroupError),
}

fn classify(e: GroupError, me: usize, epoch: u64) -> Failure {
    match e {
        GroupError::Rank {
            rank,
            source: LinkError::Rejected { code, reason },
        } if code == u64::from(codes::REMOVED) => Failure::Fatal(GroupError::Removed {
            rank: me,
            epoch,
            why: format!("rank {rank} closed its link: {reason}"),
        }),
        GroupError::Rank { rank, source } => match source {
            LinkError::Connection(_)
            | LinkError::PeerClosed { .. }
            | LinkError::Rejected { .. }
            | LinkError::CloseUnacknowledged { .. }
            | LinkError::Write(_)
            | LinkError::Read(_) => Failure::Lost(rank),
            source => Failure::Fatal(GroupError::Rank { rank, source }),
        },
        GroupError::MembersChanging { rank, proposal } => Failure::Alarm(rank, proposal),
        e => Failure::Fatal(e),
    }
}

impl Group {
    /// The ranks of the current view, by the ranks they joined as (all of
    /// them until one dies with [`OnRankFailure::Continue`]).
    pub fn members(&self) -> &[usize] {
        &self.membership.members
    }

    /// The current view's number: 0 as joined, one more each time the
    /// members change.
    pub fn epoch(&self) -> u64 {
        self.membership.epoch
    }

    /// How many ranks took part in the last collective: the size of the
    /// view it ran in, which is [`members`](Self::members)`().len()` but
    /// where the view changed after every survivor held its result. A sum
    /// over fewer ranks than [`world`](Self::world) is short by the rest;
    /// torch's DDP divides by the world, so the backend scales it.
    pub fn contributors(&self) -> usize {
        self.membership.contributors
    }

    /// The place in the current view of the rank that joined as `rank`.
    pub(super) fn place_of(&self, rank: usize) -> Option<usize> {
        self.membership.members.binary_search(&rank).ok()
    }

    /// Notes what a failed exchange with one rank means for an agreement
    /// that may follow (every failure of a collective's exchange, not only
    /// the first, so that no proposal that came is lost).
    pub(super) fn note_failure(&mut self, e: &GroupError) {
        match e {
            GroupError::MembersChanging { rank, proposal } => {
                self.membership.alarms.insert(*rank, proposal.clone());
            }
            GroupError::Rank { rank, .. } => {
                self.membership.lost.insert(*rank);
            }
            _ => {}
        }
    }

    /// Runs a collective with the group's [`OnRankFailure`]: with
    /// `Continue`, ends it with every rank's `Done`, and on a lost rank
    /// agrees on a new view and either returns the result every survivor
    /// holds or runs it again among them from `buf` as it came.
    /// `op` names it in a timeout's error.
    pub(super) async fn resilient<T: Copy, R>(
        &mut self,
        op: &'static str,
        buf: &mut [T],
        attempt: impl AsyncFnMut(&mut Group, &mut [T]) -> Result<R, GroupError>,
    ) -> Result<R, GroupError> {
        self.begin_collective(op)?;
        let result = self.resilient_within(op, buf, attempt).await;
        self.end_collective();
        result
    }

    async fn resilient_within<T: Copy, R>(
        &mut self,
        op: &'static str,
        buf: &mut [T],
        mut attempt: impl AsyncFnMut(&mut Group, &mut [T]) -> Result<R, GroupError>,
    ) -> Result<R, GroupError> {
        if !self.membership.policy.recovers() {
            return attempt(self, buf).await;
        }
        self.check_member()?;
        let mut world = self.world;
        self.membership.calls += 1;
        let call = self.membership.calls;
        let input = buf.to_vec();
        loop {
            let (failure, held) = match attempt(self, buf).await {
                Ok(r) => match self.done().await {
                    Ok(()) => {
                        self.membership.contributors = world;
                        return Ok(r);
                    }
                    Err(e) => (e, Some(r)),
                },
                Err(e) => (e, None),
            };
            // The agreement has bounds of its own; a rerun gets a fresh
            // deadline.
            self.pause_deadline();
            let outcome = self.recover(failure, held.is_some()).await?;
            self.restart_deadline(op);
            match (outcome.for_call(call, held.is_some()), held) {
                (CallFate::Return, Some(r)) => {
                    self.membership.contributors = world;
                    return Ok(r);
                }
                (CallFate::Rerun, _) => {}
                _ => {
                    return Err(GroupError::OutOfStep {
                        rank: self.membership.joined_rank,
                        what: format!(
                            "view {} decided {outcome:?} in collective {call}",
                            self.epoch()
                        ),
                    })
                }
            }
            tracing::info!(
                rank = self.membership.joined_rank,
                epoch = self.epoch(),
                members = ?self.membership.members,
                "running the collective again among the survivors"
            );
            buf.copy_from_slice(&input);
            world = self.world;
        }
    }

    /// An error at once if this rank was removed from the group.
    fn check_member(&self) -> Result<(), GroupError> {
        match &self.membership.removed {
            Some((epoch, why)) => Err(GroupError::Removed {
                rank: self.membership.joined_rank,
                epoch: *epoch,
                why: why.clone(),
            }),
            None => Ok(()),
        }
    }

    /// The end of a collective with `Continue`: this rank holds the result;
    /// returns once every rank does. Each rank's message names the ranks
    /// waiting at it to rejoin, so that every member knows them all.
    async fn done(&mut self) -> Result<(), GroupError> {
        let t = tag(self.next_seq(), Kind::Done);
        let mine = self.waiting_announcement();
        let got = self.exchange_with_all(t, &mine).await?;
        let world = self.membership.joined_world;
        let mut announced = Vec::new();
        for (p, body) in got.iter().enumerate() {
            let body = body.as_ref().unwrap_or(&mine);
            let joiners = Joiners::decode(body, world).map_err(|e| GroupError::OutOfStep {
                rank: self.membership.members[p],
                what: e.to_string(),
            })?;
            announced.extend(joiners.0);
        }
        announced.sort_unstable_by_key(|j| j.0);
        announced.dedup_by_key(|j| j.0);
        self.membership.announced = announced;
        Ok(())
    }

    /// After a failed attempt: agree on the next view, form its mesh, and
    /// say what becomes of the collective in flight.
    async fn recover(
        &mut self,
        failure: GroupError,
        has_result: bool,
    ) -> Result<ViewOutcome, GroupError> {
        let me = self.membership.joined_rank;
        match classify(failure, me, self.epoch()) {
            Failure::Lost(rank) => {
                self.membership.lost.insert(rank);
            }
            Failure::Alarm(rank, body) => {
                self.membership.alarms.insert(rank, body);
            }
            Failure::Fatal(e) => {
                if let GroupError::Removed { epoch, why, .. } = &e {
                    self.membership.removed = Some((*epoch, why.clone()));
                }
                return Err(e);
            }
        }
        // Who waits to rejoin is announced again after the next collective
        // of the new view: the last one's may not have reached everyone.
        self.membership.announced.clear();
        let suspects = std::mem::take(&mut self.membership.lost);
        let alarms = std::mem::take(&mut self.membership.alarms);
        self.settle(suspects, alarms, has_result).await
    }

    /// Agrees on the next view and forms its mesh, again without any
    /// member that did not link up (it died after the agreement, or this
    /// rank cannot reach it), until a view's mesh is whole: each round
    /// leaves a rank out, so at most a view's size of them. Says what
    /// becomes of the collective in flight, as the last view decided.
    /// `has_result`: this rank holds the result of the call it is in.
    pub(super) async fn settle(
        &mut self,
        mut suspects: BTreeSet<usize>,
        mut alarms: BTreeMap<usize, Bytes>,
        mut has_result: bool,
    ) -> Result<ViewOutcome, GroupError> {
        let me = self.membership.joined_rank;
        loop {
            let formed = match self.agree(suspects, alarms, has_result).await {
                Ok(decision) => self
                    .form_view(&decision)
                    .await
                    .map(|unlinked| (decision, unlinked)),
                Err(e) => Err(e),
            };
            let (decision, unlinked) = match formed {
                Ok(formed) => formed,
                Err(e) => {
                    // Whatever stopped the agreement or the new mesh, this
                    // rank is out: it must not go on with its old state.
                    self.membership.removed = Some(match &e {
                        GroupError::Removed { epoch, why, .. } => (*epoch, why.clone()),
                        e => (self.epoch(), e.to_string()),
                    });
                    return Err(e);
                }
            };
            if unlinked.is_empty() {
                tracing::warn!(
                    rank = me,
                    epoch = decision.epoch,
                    members = ?decision.members,
                    outcome = ?decision.outcome,
                    "the group goes on without the ranks it lost"
                );
                return Ok(decision.outcome);
            }
            tracing::warn!(
                rank = me,
                epoch = decision.epoch,
                unlinked = ?unlinked.iter().map(|&p| self.membership.members[p]).collect::<Vec<_>>(),
                "members of the new view did not link up; agreeing on the next without them"
            );
            // Still this call: a result held is still held where the view
            // completed it, and to be run again where it did not.
            let call = self.membership.calls;
            has_result = decision.outcome.for_call(call, has_result) == CallFate::Return;
            suspects = unlinked.into_iter().collect();
            alarms = BTreeMap::new();
        }
    }

    /// The agreement on the next view (the module's header): drives the
    /// core's machine over the links and returns the decision, once this
    /// rank has it and has passed it on.
    async fn agree(
        &mut self,
        suspects: BTreeSet<usize>,
        alarms: BTreeMap<usize, Bytes>,
        has_result: bool,
    ) -> Result<ViewDecision, GroupError> {
        let m = &self.membership;
        let epoch = m.epoch + 1;
        let seat = Seat::new(
            self.rank,
            m.members.clone(),
            m.joined_world,
            epoch,
            m.calls,
            has_result,
        )
        .map_err(|e| GroupError::Setup(format!("agreeing on view {epoch}: {e}")))?;
        let mut agreement = Agreement::new(seat, suspects, alarms);
        loop {
            while let Some(transmit) = agreement.poll_transmit() {
                for p in self.send_view(epoch, &transmit).await {
                    agreement.send_failed(p);
                }
            }
            if let Some(outcome) = agreement.outcome() {
                return self.take_decision(outcome.clone());
            }
            let Some((p, event)) = self.next_view_event(epoch, agreement.suspects()).await else {
                return Err(GroupError::Setup(format!(
                    "no link left to hear view {epoch} from"
                )));
            };
            agreement.handle(event.as_event(p));
        }
    }

    /// Takes the agreement's outcome: this rank's next view, or why it
    /// has none.
    fn take_decision(&mut self, outcome: Outcome) -> Result<ViewDecision, GroupError> {
        let me = self.membership.joined_rank;
        self.membership.epoch = outcome.decision().epoch;
        match outcome {
            Outcome::Member { decision, .. } => Ok(decision),
            Outcome::NoQuorum { decision, .. } => Err(GroupError::NoQuorum {
                rank: me,
                reached: decision.members,
                members: self.membership.members.clone(),
            }),
            Outcome::Abandoned { decision, from } => Err(GroupError::Removed {
                rank: me,
                epoch: decision.epoch,
                why: format!(
                    "it accepted view {:?} but rank {from} showed that not every member \
                     can install it",
                    decision.members
                ),
            }),
            Outcome::Removed { decision, from } => Err(GroupError::Removed {
                rank: me,
                epoch: decision.epoch,
                why: format!(
                    "rank {from} decided the view without it (members {:?})",
                    decision.members
                ),
            }),
        }
    }

    /// Sends the agreement's `transmit` for view `epoch` to each of its
    /// ranks at once, and returns those it failed to reach. The decision
    /// for the ranks left out gets [`LEFT_OUT_WAIT`], and its failures
    /// are not told.
    async fn send_view(&mut self, epoch: u64, transmit: &Transmit) -> Vec<usize> {
        let kind = match transmit.kind {
            MessageKind::Proposal => Kind::ViewProposal,
            MessageKind::Decision => Kind::ViewDecision,
        };
        let t = tag(epoch, kind);
        let sends = self.senders.iter_mut().enumerate().filter_map(|(p, s)| {
            let s = s.as_mut()?;
            if !transmit.to.contains(&p) {
                return None;
            }
            let body = transmit.body.clone();
            Some(async move { (p, s.send_message(t, body).await) })
        });
        let sends = futures_util::future::join_all(sends);
        let sent = match transmit.left_out {
            false => sends.await,
            // A dead rank's stream may be out of credit: none holds this
            // up long.
            true => tokio::time::timeout(LEFT_OUT_WAIT, sends)
                .await
                .unwrap_or_default(),
        };
        sent.into_iter()
            .filter_map(|(p, sent)| match sent {
                Ok(()) => None,
                Err(e) => {
                    tracing::info!(rank = p, %e, "a view message did not go out");
                    Some(p)
                }
            })
            .collect()
    }

    /// The next thing any rank not in `suspects` says about view `epoch`,
    /// as it came: its proposal, the decision, or that its link failed (a
    /// rank with no link at all is lost at once). Everything else on the
    /// links (the failed collective's messages) is dropped. `None` when
    /// there is no rank left to hear from.
    async fn next_view_event(
        &mut self,
        epoch: u64,
        suspects: &BTreeSet<usize>,
    ) -> Option<(usize, ViewEvent)> {
        let me = self.rank;
        let unlinked = (0..self.world)
            .find(|&p| p != me && !suspects.contains(&p) && self.receivers[p].is_none());
        if let Some(p) = unlinked {
            return Some((p, ViewEvent::Lost));
        }
        let joined = self.membership.members.clone();
        let mut waiting: FuturesUnordered<_> = self
            .receivers
            .iter_mut()
            .enumerate()
            .filter(|(p, _)| !suspects.contains(p))
            .filter_map(|(p, r)| Some((p, r.as_mut()?)))
            .map(|(p, receiver)| {
                let joined = &joined;
                async move {
                    loop {
                        let (t, body) = match receiver.recv_message().await {
                            Ok(m) => m,
                            Err(e) => {
                                tracing::info!(rank = joined[p], %e, "lost during the agreement");
                                return (p, ViewEvent::Lost);
                            }
                        };
                        let (number, kind) = (t >> 8, t & 0xff);
                        if number != epoch {
                            continue;
                        }
                        match kind {
                            k if k == Kind::ViewProposal as u64 => {
                                return (p, ViewEvent::Proposal(body))
                            }
                            k if k == Kind::ViewDecision as u64 => {
                                return (p, ViewEvent::Decision(body))
                            }
                            _ => continue,
                        }
                    }
                }
            })
            .collect();
        waiting.next().await
    }

    /// Forms the mesh of `decision`'s view among its members on this
    /// rank's endpoint, closes the old links (those to ranks left out with
    /// [`codes::REMOVED`]) and registers the buckets again, each keeping
    /// what it carries into the next gradient. Returns the places of the
    /// members no link to which formed: then the view is installed with
    /// their links missing, for the next agreement only (no collective
    /// runs on it; its paths and buckets wait for a whole mesh).
    pub(super) async fn form_view(
        &mut self,
        decision: &ViewDecision,
    ) -> Result<Vec<usize>, GroupError> {
        if self.membership.config.stop_at_view == Some(decision.epoch) {
            return Err(GroupError::Setup(format!(
                "stopped before forming view {}'s mesh (GroupConfig::stop_at_view)",
                decision.epoch
            )));
        }
        let m = &self.membership;
        let members = decision.members.clone();
        let place = members
            .iter()
            .position(|&r| r == m.joined_rank)
            .ok_or_else(|| {
                GroupError::Setup(format!(
                    "view {} does not hold rank {}",
                    decision.epoch, m.joined_rank
                ))
            })?;
        let table: Vec<SocketAddr> = members.iter().map(|&r| m.addresses[r]).collect();
        let wait = m
            .config
            .link
            .quic
            .max_idle_timeout
            .unwrap_or(Duration::from_secs(30))
            .max(Duration::from_secs(5));
        let links = super::rendezvous::form_view(
            &m.config,
            &self.endpoint,
            place,
            table,
            decision.epoch,
            &decision.members,
            wait,
        )
        .await?;
        let unlinked = links.missing;
        let reason = format!(
            "removed from the group in view {} (members {members:?})",
            decision.epoch
        );
        for (p, sender) in self.senders.iter().enumerate() {
            let Some(sender) = sender else { continue };
            match members.contains(&self.membership.members[p]) {
                true => sender
                    .connection()
                    .close(VarInt::from_u32(codes::CLOSED), b"a new view"),
                false => sender
                    .connection()
                    .close(VarInt::from_u32(codes::REMOVED), reason.as_bytes()),
            }
        }
        let (senders, receivers) = links
            .links
            .into_iter()
            .map(|l| match l.map(crate::link::Link::split) {
                Some((s, r)) => (Some(s), Some(r)),
                None => (None, None),
            })
            .unzip();
        self.senders = senders;
        self.receivers = receivers;
        self.world = members.len();
        self.rank = place;
        self.seq = 0;
        self.next_round = vec![0; members.len()];
        self.stripes = (0..members.len()).map(|_| Vec::new()).collect();
        self.membership.members = members;
        self.open_point_to_point();
        if !unlinked.is_empty() {
            return Ok(unlinked);
        }
        // Every member, and a rank rejoining, stripes the new view's pairs
        // at this point, before anything else is sent on them.
        let config = self.membership.config.clone();
        self.form_paths(&config, Instant::now() + config.join_timeout)
            .await?;
        let old = std::mem::take(&mut self.buckets);
        let specs = self.membership.buckets.clone();
        for ((layout, options), old) in specs.iter().zip(old) {
            let id = self.register_bucket_on_links(layout, *options).await?;
            let b = &mut self.buckets[id.0];
            if b.residual.len() == old.residual.len() {
                b.residual = old.residual;
            }
        }
        Ok(Vec::new())
    }
}
