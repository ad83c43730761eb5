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
//! (`GroupError::Removed`). Every decision (when to agree, what becomes
//! of the call, when a view is whole) is the core's machines'
//! (`gradlane_core::group::view_keeper::ViewKeeper`, which starts each
//! `gradlane_core::group::agreement::Agreement`); this module only
//! carries their messages over the links, forms the meshes they ask for
//! and maps transport errors to lost ranks.

use super::group_error::{classify, group_error};
use super::{tag, BucketOptions, Group, GroupConfig, GroupError, Kind, PointToPoint};
use crate::endpoint::Endpoint;
use crate::link::Link;
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use gradlane_core::control::codes;
use gradlane_core::group::agreement::{Agreement, Event, MessageKind, Outcome, Transmit};
use gradlane_core::group::view_keeper::{self, Action, ViewKeeper};
use gradlane_core::group::{Joiners, ViewDecision};
use gradlane_core::layout::Layout;
use quinn::VarInt;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
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
    /// The members, the view's number, the calls, and every decision
    /// about them: the core's machine.
    pub(super) keeper: ViewKeeper,
    /// Where every rank listens, by the rank it joined as.
    pub(super) addresses: Vec<SocketAddr>,
    /// What the group was joined with, to form the mesh of a new view.
    pub(super) config: GroupConfig,
    /// Every registered bucket's layout and options, to register them
    /// again on a new view's links.
    pub(super) buckets: Vec<(Layout, BucketOptions)>,
    /// The ranks waiting at this member to rejoin.
    pub(super) waiting: super::join_requests::Waiting,
    /// The links of the ranks being admitted, kept open until the new
    /// view's mesh is up.
    pub(super) admitting: Vec<Link>,
}

impl Membership {
    fn new(config: GroupConfig, addresses: Vec<SocketAddr>, keeper: ViewKeeper) -> Self {
        Self {
            policy: config.on_rank_failure,
            joined_rank: config.rank,
            joined_world: config.world,
            keeper,
            addresses,
            config,
            buckets: Vec::new(),
            waiting: Default::default(),
            admitting: Vec::new(),
        }
    }
}

impl Group {
    /// A group of the links of a view, this rank being `place` among them
    /// and `keeper` keeping the view; `addresses` says where every rank
    /// listens, by the rank it joined as.
    pub(super) fn assemble(
        place: usize,
        config: GroupConfig,
        addresses: Vec<SocketAddr>,
        keeper: ViewKeeper,
        links: Vec<Option<Link>>,
        endpoint: Endpoint,
    ) -> Group {
        let membership = Membership::new(config, addresses, keeper);
        let world = links.len();
        let (senders, receivers): (Vec<_>, Vec<_>) = links
            .into_iter()
            .map(|l| match l.map(Link::split) {
                Some((s, r)) => (Some(s), Some(r)),
                None => (None, None),
            })
            .unzip();
        let mut group = Group {
            rank: place,
            world,
            membership,
            senders,
            receivers,
            endpoint,
            seq: 0,
            buckets: Vec::new(),
            next_round: vec![0; world],
            stripes: (0..world).map(|_| Vec::new()).collect(),
            extra_endpoints: Vec::new(),
            running: None,
            unfinished: None,
            timed_out: None,
            point_to_point: Arc::new(PointToPoint::new(0, 0, &[], Vec::new(), None)),
        };
        let members = group.members().to_vec();
        group.open_point_to_point(&members);
        group
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

impl Group {
    /// The ranks of the current view, by the ranks they joined as (all of
    /// them until one dies with [`OnRankFailure::Continue`]).
    pub fn members(&self) -> &[usize] {
        self.membership.keeper.members()
    }

    /// The current view's number: 0 as joined, one more each time the
    /// members change.
    pub fn epoch(&self) -> u64 {
        self.membership.keeper.epoch()
    }

    /// How many ranks took part in the last collective: the size of the
    /// view it ran in, which is [`members`](Self::members)`().len()` but
    /// where the view changed after every survivor held its result. A sum
    /// over fewer ranks than [`world`](Self::world) is short by the rest;
    /// torch's DDP divides by the world, so the backend scales it.
    pub fn contributors(&self) -> usize {
        self.membership.keeper.contributors()
    }

    /// The place in the current view of the rank that joined as `rank`.
    pub(super) fn place_of(&self, rank: usize) -> Option<usize> {
        self.members().binary_search(&rank).ok()
    }

    /// Notes what a failed exchange with one rank means for an agreement
    /// that may follow (every failure of a collective's exchange, not only
    /// the first, so that no proposal that came is lost).
    pub(super) fn note_failure(&mut self, e: &GroupError) {
        match e {
            GroupError::MembersChanging { rank, proposal } => {
                self.membership.keeper.note_alarm(*rank, proposal.to_vec());
            }
            GroupError::Rank { rank, .. } => self.membership.keeper.note_lost(*rank),
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

    /// Carries out the keeper's actions for one collective until it says
    /// return or fail.
    async fn resilient_within<T: Copy, R>(
        &mut self,
        op: &'static str,
        buf: &mut [T],
        mut attempt: impl AsyncFnMut(&mut Group, &mut [T]) -> Result<R, GroupError>,
    ) -> Result<R, GroupError> {
        if !self.membership.policy.recovers() {
            return attempt(self, buf).await;
        }
        let me = self.membership.joined_rank;
        self.membership
            .keeper
            .begin_call()
            .map_err(|e| group_error(e, None))?;
        let input = buf.to_vec();
        let mut held = None;
        let mut stands = None;
        loop {
            let event = match self.membership.keeper.poll() {
                Some(Action::Exchange { rerun }) => {
                    if rerun {
                        tracing::info!(
                            rank = me,
                            epoch = self.epoch(),
                            members = ?self.members(),
                            "running the collective again among the survivors"
                        );
                        buf.copy_from_slice(&input);
                        held = None;
                        self.restart_deadline(op);
                    }
                    match attempt(self, buf).await {
                        Ok(r) => {
                            held = Some(r);
                            view_keeper::Event::Exchanged
                        }
                        Err(e) => self.failed_exchange(e, &mut stands),
                    }
                }
                Some(Action::Done) => match self.done().await {
                    Ok(announced) => view_keeper::Event::DoneExchanged(announced),
                    Err(e) => self.failed_exchange(e, &mut stands),
                },
                Some(Action::Return) => {
                    return held.ok_or_else(|| GroupError::OutOfStep {
                        rank: me,
                        what: "the view kept a result this rank does not hold".into(),
                    });
                }
                Some(action) => match self.carry_view_action(action, &mut stands).await? {
                    Some(event) => event,
                    None => continue,
                },
                None => {
                    return Err(GroupError::Setup(
                        "the view keeper asked nothing in a collective".into(),
                    ))
                }
            };
            self.membership.keeper.handle(event);
        }
    }

    /// The keeper's event for a failed exchange; the error that stands,
    /// where it is not about membership, goes to `stands`.
    fn failed_exchange(
        &mut self,
        e: GroupError,
        stands: &mut Option<GroupError>,
    ) -> view_keeper::Event {
        let (failure, error) = classify(e);
        *stands = error;
        view_keeper::Event::ExchangeFailed(failure)
    }

    /// Carries out an action about the view (agree, form a mesh, tell the
    /// ranks admitted), returning the keeper's event (none where it has
    /// more to say at once), or its error where it failed.
    pub(super) async fn carry_view_action(
        &mut self,
        action: Action,
        stands: &mut Option<GroupError>,
    ) -> Result<Option<view_keeper::Event>, GroupError> {
        let stopped = |e: GroupError, stands: &mut Option<GroupError>| {
            let why = e.to_string();
            *stands = Some(e);
            view_keeper::Event::Stopped(why)
        };
        Ok(Some(match action {
            Action::Agree(agreement) => {
                // The agreement has bounds of its own; a rerun gets a fresh
                // deadline.
                self.pause_deadline();
                match self.agree(*agreement).await {
                    Ok(outcome) => view_keeper::Event::Agreed(outcome),
                    Err(e) => stopped(e, stands),
                }
            }
            Action::FormMesh(decision) => match self.form_view(&decision).await {
                Ok(unlinked) => {
                    if unlinked.is_empty() {
                        tracing::warn!(
                            rank = self.membership.joined_rank,
                            epoch = decision.epoch,
                            members = ?decision.members,
                            outcome = ?decision.outcome,
                            "the group goes on in a new view"
                        );
                    } else {
                        tracing::warn!(
                            rank = self.membership.joined_rank,
                            epoch = decision.epoch,
                            unlinked = ?unlinked.iter().map(|&p| decision.members[p]).collect::<Vec<_>>(),
                            "members of the new view did not link up; agreeing on the next without them"
                        );
                    }
                    view_keeper::Event::MeshFormed { unlinked }
                }
                Err(e) => stopped(e, stands),
            },
            Action::Admit { decision, joiners } => {
                self.send_admissions(&decision, &joiners).await;
                return Ok(None);
            }
            Action::Fail(e) => return Err(group_error(e, stands.take())),
            action => {
                return Err(GroupError::Setup(format!(
                    "the view keeper asked {action:?} out of its order"
                )))
            }
        }))
    }

    /// The end of a collective with `Continue`: this rank holds the result;
    /// returns once every rank does, with the ranks waiting to rejoin that
    /// each rank's message named, so that every member knows them all.
    async fn done(&mut self) -> Result<Vec<(usize, SocketAddr)>, GroupError> {
        let t = tag(self.next_seq(), Kind::Done);
        let mine = self.waiting_announcement();
        let got = self.exchange_with_all(t, &mine).await?;
        let world = self.membership.joined_world;
        let mut announced = Vec::new();
        for (p, body) in got.iter().enumerate() {
            let body = body.as_ref().unwrap_or(&mine);
            let joiners = Joiners::decode(body, world).map_err(|e| GroupError::OutOfStep {
                rank: self.members()[p],
                what: e.to_string(),
            })?;
            announced.extend(joiners.0);
        }
        Ok(announced)
    }

    /// The agreement on the next view (the module's header): drives the
    /// core's machine over the links and returns its outcome, once this
    /// rank has it and has passed it on.
    async fn agree(&mut self, mut agreement: Agreement) -> Result<Outcome, GroupError> {
        let epoch = agreement.seat().epoch();
        loop {
            while let Some(transmit) = agreement.poll_transmit() {
                for p in self.send_view(epoch, &transmit).await {
                    agreement.send_failed(p);
                }
            }
            if let Some(outcome) = agreement.outcome() {
                return Ok(outcome.clone());
            }
            let Some((p, event)) = self.next_view_event(epoch, agreement.suspects()).await else {
                return Err(GroupError::Setup(format!(
                    "no link left to hear view {epoch} from"
                )));
            };
            agreement.handle(event.as_event(p));
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
        let joined = self.members().to_vec();
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
            match members.contains(&self.members()[p]) {
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
            .map(|l| match l.map(Link::split) {
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
        self.open_point_to_point(&members);
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
