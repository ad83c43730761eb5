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
//! has not lost, and every rank passes the decision on. A decision needs a
//! quorum of the last view (a majority, or exactly half with its lowest
//! rank), so two sides of a partition never both go on.

use super::{tag, BucketOptions, Group, GroupConfig, GroupError, Kind};
use crate::link::LinkError;
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use gradlane_core::control::codes;
use gradlane_core::group::{Joiners, ViewDecision, ViewOutcome, ViewProposal};
use gradlane_core::layout::Layout;
use quinn::VarInt;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

/// How long the coordinator tries to tell the ranks it left out.
const LEFT_OUT_WAIT: Duration = Duration::from_secs(1);

/// What a group does when one of its ranks dies (its connections close,
/// or are silent past [`GroupConfig::failure_timeout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnRankFailure {
    /// Every collective fails from then on with an error naming the rank
    /// (as gloo and NCCL do): restart the job from a checkpoint.
    #[default]
    Fail,
    /// The survivors agree on who is left and go on: the collective in
    /// flight either counts (every survivor already holds its result) or
    /// runs again among them, its mean divided by the ranks that took
    /// part. Replicas stay bit-identical. Costs one small message per
    /// collective (no rank returns before every rank holds the result) and
    /// a copy of each buffer while its collective runs.
    Continue,
}

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

/// What one link said during an agreement.
enum ViewEvent {
    Proposal(ViewProposal),
    Decision(ViewDecision),
    Lost,
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
        if self.membership.policy == OnRankFailure::Fail {
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
            self.end_collective();
            let outcome = self.recover(failure, held.is_some()).await?;
            self.begin_collective(op)?;
            match (outcome, held) {
                (ViewOutcome::Complete { call: c }, Some(r)) if c == call => {
                    self.membership.contributors = world;
                    return Ok(r);
                }
                (ViewOutcome::Complete { call: c }, _) if c + 1 == call => {}
                (ViewOutcome::Rerun { call: c }, _) if c == call => {}
                (outcome, _) => {
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
        let decision = self.agree(suspects, alarms, has_result).await;
        let formed = match decision {
            Ok(decision) => self.form_view(&decision).await.map(|()| decision),
            Err(e) => Err(e),
        };
        let decision = match formed {
            Ok(decision) => decision,
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
        tracing::warn!(
            rank = me,
            epoch = decision.epoch,
            members = ?decision.members,
            outcome = ?decision.outcome,
            "the group goes on without the ranks it lost"
        );
        Ok(decision.outcome)
    }

    /// The agreement on the next view (the module's header): returns the
    /// decision, once this rank has it and has passed it on.
    async fn agree(
        &mut self,
        mut suspects: BTreeSet<usize>,
        alarms: BTreeMap<usize, Bytes>,
        has_result: bool,
    ) -> Result<ViewDecision, GroupError> {
        let epoch = self.membership.epoch + 1;
        let (me, n) = (self.rank, self.world);
        let joined = self.membership.members.clone();
        let world = self.membership.joined_world;
        let mut proposals = BTreeMap::new();
        for (p, body) in alarms {
            match ViewProposal::decode(&body, world) {
                Ok(prop) if prop.epoch == epoch => {
                    proposals.insert(p, prop);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(rank = joined[p], %e, "a malformed proposal: that rank counts as lost");
                    suspects.insert(p);
                }
            }
        }
        let calls = self.membership.calls;
        let proposal = |suspects: &BTreeSet<usize>| ViewProposal {
            epoch,
            call: calls,
            has_result,
            suspects: suspects.iter().map(|&p| joined[p]).collect(),
        };
        let mut told = suspects.clone();
        self.send_view(
            tag(epoch, Kind::ViewProposal),
            proposal(&suspects).encode().into(),
            &mut suspects,
            None,
        )
        .await;
        loop {
            if suspects != told {
                // What this rank lost since it last said: say it again, to
                // the coordinator it now has among the rest.
                told = suspects.clone();
                let body = proposal(&suspects).encode().into();
                self.send_view(tag(epoch, Kind::ViewProposal), body, &mut suspects, None)
                    .await;
            }
            let coordinator = (0..n).find(|p| !suspects.contains(p)).unwrap_or(me);
            let heard_all =
                (0..n).all(|p| p == me || suspects.contains(&p) || proposals.contains_key(&p));
            if coordinator == me && heard_all {
                let decision = self.decide(epoch, &mut suspects, &proposals, has_result);
                let body: Bytes = decision.encode().into();
                let t = tag(epoch, Kind::ViewDecision);
                let mut left_out = suspects.clone();
                self.send_view(t, body.clone(), &mut left_out, None).await;
                // The ranks left out hear it too, where they still can, so
                // that they stop at once with a clear error; a dead one's
                // stream may be out of credit, so none holds this up long.
                let members: BTreeSet<usize> = (0..n).filter(|p| !suspects.contains(p)).collect();
                let _ = tokio::time::timeout(
                    LEFT_OUT_WAIT,
                    self.send_view(t, body, &mut members.clone(), None),
                )
                .await;
                return self.take_decision(decision, self.membership.joined_rank);
            }
            let (p, event) = self.next_view_event(epoch, &suspects).await;
            match event {
                ViewEvent::Proposal(prop) => {
                    proposals.insert(p, prop);
                }
                ViewEvent::Lost if p != me => {
                    suspects.insert(p);
                }
                ViewEvent::Lost => {}
                ViewEvent::Decision(decision) => {
                    let body: Bytes = decision.encode().into();
                    self.send_view(tag(epoch, Kind::ViewDecision), body, &mut suspects, Some(p))
                        .await;
                    return self.take_decision(decision, joined[p]);
                }
            }
        }
    }

    /// The coordinator's decision from every proposal it has: a rank any
    /// survivor lost is left out (the mesh needs every pair), as is a rank
    /// that lost the coordinator.
    fn decide(
        &self,
        epoch: u64,
        suspects: &mut BTreeSet<usize>,
        proposals: &BTreeMap<usize, ViewProposal>,
        has_result: bool,
    ) -> ViewDecision {
        let (me, n) = (self.rank, self.world);
        let joined = &self.membership.members;
        let before = suspects.clone();
        for (&p, prop) in proposals.iter().filter(|(p, _)| !before.contains(p)) {
            for s in &prop.suspects {
                match self.place_of(*s) {
                    Some(s) if s == me => suspects.insert(p),
                    Some(s) => suspects.insert(s),
                    None => false,
                };
            }
        }
        let alive: Vec<usize> = (0..n).filter(|p| !suspects.contains(p)).collect();
        let members: Vec<usize> = alive.iter().map(|&p| joined[p]).collect();
        let quorum = 2 * alive.len() > n || (2 * alive.len() == n && alive.first() == Some(&0));
        if !quorum {
            return ViewDecision {
                epoch,
                outcome: ViewOutcome::NoQuorum,
                members,
            };
        }
        // Where each member is: the collective it is in, and whether it
        // holds that collective's result.
        let mut at: Vec<(u64, bool)> = vec![(self.membership.calls, has_result)];
        at.extend(
            alive
                .iter()
                .filter_map(|p| proposals.get(p))
                .map(|prop| (prop.call, prop.has_result)),
        );
        let first = at.iter().map(|a| a.0).min().unwrap_or(0);
        // A member one collective on has returned the first, which it
        // could only do once every rank held its result.
        let complete = at.iter().all(|&(call, held)| call > first || held);
        ViewDecision {
            epoch,
            outcome: match complete {
                true => ViewOutcome::Complete { call: first },
                false => ViewOutcome::Rerun { call: first },
            },
            members,
        }
    }

    /// Takes a decision from the rank that joined as `from`: this rank's
    /// next view, or why it has none.
    fn take_decision(
        &mut self,
        decision: ViewDecision,
        from: usize,
    ) -> Result<ViewDecision, GroupError> {
        let me = self.membership.joined_rank;
        self.membership.epoch = decision.epoch;
        if decision.outcome == ViewOutcome::NoQuorum {
            return Err(GroupError::NoQuorum {
                rank: me,
                reached: decision.members,
                members: self.membership.members.clone(),
            });
        }
        if !decision.members.contains(&me) {
            return Err(GroupError::Removed {
                rank: me,
                epoch: decision.epoch,
                why: format!(
                    "rank {from} decided the view without it (members {:?})",
                    decision.members
                ),
            });
        }
        Ok(decision)
    }

    /// Sends `body` to every rank of the view but this one, those in
    /// `skip` and `except`; a rank its send fails to is added to `skip`.
    async fn send_view(
        &mut self,
        tag: u64,
        body: Bytes,
        skip: &mut BTreeSet<usize>,
        except: Option<usize>,
    ) {
        let sends = self.senders.iter_mut().enumerate().filter_map(|(p, s)| {
            let s = s.as_mut()?;
            if skip.contains(&p) || except == Some(p) {
                return None;
            }
            let body = body.clone();
            Some(async move { (p, s.send_message(tag, body).await) })
        });
        for (p, sent) in futures_util::future::join_all(sends).await {
            if let Err(e) = sent {
                tracing::info!(rank = p, %e, "a view message did not go out");
                skip.insert(p);
            }
        }
    }

    /// The next thing any rank not in `suspects` says about view `epoch`:
    /// its proposal, the decision, or that its link failed. Everything
    /// else on the links (the failed collective's messages) is dropped.
    async fn next_view_event(
        &mut self,
        epoch: u64,
        suspects: &BTreeSet<usize>,
    ) -> (usize, ViewEvent) {
        let world = self.membership.joined_world;
        let joined = self.membership.members.clone();
        let mut waiting: FuturesUnordered<_> = self
            .receivers
            .iter_mut()
            .enumerate()
            .filter(|(p, r)| r.is_some() && !suspects.contains(p))
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
                    let event = match kind {
                        k if k == Kind::ViewProposal as u64 => {
                            ViewProposal::decode(&body, world).map(ViewEvent::Proposal)
                        }
                        k if k == Kind::ViewDecision as u64 => {
                            ViewDecision::decode(&body, world).map(ViewEvent::Decision)
                        }
                        _ => continue,
                    };
                    return match event {
                        Ok(event) => (p, event),
                        Err(e) => {
                            tracing::warn!(rank = joined[p], %e, "a malformed view message: that rank counts as lost");
                            (p, ViewEvent::Lost)
                        }
                    };
                }
                }
            })
            .collect();
        match waiting.next().await {
            Some(event) => event,
            // Nobody left to hear from: this rank is alone.
            None => (self.rank, ViewEvent::Lost),
        }
    }

    /// Forms the mesh of `decision`'s view among its members on this
    /// rank's endpoint, closes the old links (those to ranks left out with
    /// [`codes::REMOVED`]) and registers the buckets again, each keeping
    /// what it carries into the next gradient.
    pub(super) async fn form_view(&mut self, decision: &ViewDecision) -> Result<(), GroupError> {
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
            wait,
        )
        .await
        .map_err(|e| match e {
            GroupError::Missing {
                missing,
                waited,
                failed,
            } => GroupError::Missing {
                missing: missing.iter().map(|&p| members[p]).collect(),
                waited,
                failed,
            },
            e => e,
        })?;
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
        let old = std::mem::take(&mut self.buckets);
        let specs = self.membership.buckets.clone();
        for ((layout, options), old) in specs.iter().zip(old) {
            let id = self.register_bucket_on_links(layout, *options).await?;
            let b = &mut self.buckets[id.0];
            if b.residual.len() == old.residual.len() {
                b.residual = old.residual;
            }
        }
        Ok(())
    }
}
