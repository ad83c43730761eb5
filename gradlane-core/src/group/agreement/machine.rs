//! One rank's agreement on the next view, as a state machine: events in
//! ([`Agreement::handle`], [`Agreement::send_failed`]), messages out
//! ([`Agreement::poll_transmit`]), then its [`Outcome`].
//!
//! The driver's loop, which the shell runs over its links and the
//! simulation over its model of them:
//! 1. send every [`Transmit`] the machine has, telling it of each send
//!    that failed;
//! 2. once it has an outcome, stop;
//! 3. otherwise wait for the next thing any rank it has not lost says
//!    about this view (its proposal, the decision, or that its link
//!    failed), hand it in and go to 1.
//!
//! In that loop the machine does what the rank did before it was one: it
//! proposes to every rank it reaches, again whenever it has lost one more
//! since it last said (so the coordinator it now has hears it); as the
//! coordinator (the lowest place it has not lost) it decides once every
//! rank it has not lost has proposed, and sends the decision to the
//! members, then to the ranks left out; otherwise it accepts the first
//! decision that comes and passes it on to every rank it reaches, the
//! sender included, so that a rank that lost its coordinator still hears
//! it.
//!
//! A decision passed on is also its sender's acceptance: a rank accepts
//! one decision per view and never another, and a member installs the
//! view (its [`Outcome::Member`]) only once every member of it accepted
//! it. Two views of one epoch each need a quorum of the last view, two
//! quorums share a rank, and that rank accepted only one: so no two
//! ranks ever install different views of one epoch. A member that learns
//! its view cannot be installed (a member of it accepted another, or its
//! link to a member that had not accepted failed) stops
//! ([`Outcome::Abandoned`]); stopping conflicts with no view.

use super::rule::{self, Decided};
use super::Seat;
use crate::group::{ViewDecision, ViewOutcome, ViewProposal};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// What one link said about the view being agreed on: the shell has
/// already dropped everything else (other views' messages, the failed
/// collective's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// A proposal's bytes, from the rank at place `from`.
    Proposal {
        /// Its place in the view.
        from: usize,
        /// The message as it came.
        body: &'a [u8],
    },
    /// A decision's bytes, from the rank at place `from` (which decided
    /// it or passes it on).
    Decision {
        /// Its place in the view.
        from: usize,
        /// The message as it came.
        body: &'a [u8],
    },
    /// The link to the rank at place `from` failed (or there is none).
    Lost {
        /// Its place in the view.
        from: usize,
    },
}

/// Which of the view's messages a [`Transmit`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    /// A [`ViewProposal`].
    Proposal,
    /// A [`ViewDecision`].
    Decision,
}

/// One message for several ranks: the same bytes to every place in `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The places to send to, increasing, never this rank's.
    pub to: Vec<usize>,
    /// Which message.
    pub kind: MessageKind,
    /// Its bytes.
    pub body: Bytes,
    /// The decision for the ranks it leaves out: they hear it where they
    /// still can, so that they stop at once with a clear error. A dead
    /// rank's stream may be out of credit, so the driver bounds how long
    /// these sends may take; their failures change nothing.
    pub left_out: bool,
}

/// The decision this rank took, and what it means for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// This rank is a member of the next view.
    Member {
        /// The decision.
        decision: ViewDecision,
        /// The rank (as it joined) it came from: the coordinator, or the
        /// rank that passed it on; this rank's own when it decided.
        from: usize,
    },
    /// The next view was decided without this rank: it must stop.
    Removed {
        /// The decision.
        decision: ViewDecision,
        /// The rank (as it joined) it came from.
        from: usize,
    },
    /// Too few ranks were reached to form a view: every rank that hears
    /// it stops.
    NoQuorum {
        /// The decision (its members are the ranks reached).
        decision: ViewDecision,
        /// The rank (as it joined) it came from.
        from: usize,
    },
    /// This rank accepted `decision`, which names it, but that view can
    /// never be installed by all its members: one of them accepted
    /// another decision, or this rank lost its link to one that had not
    /// accepted it yet. It must stop; no rank installs a view that
    /// conflicts with what it accepted.
    Abandoned {
        /// The decision it had accepted.
        decision: ViewDecision,
        /// The rank (as it joined) whose message or lost link showed it.
        from: usize,
    },
}

impl Outcome {
    /// The decision taken.
    pub fn decision(&self) -> &ViewDecision {
        match self {
            Outcome::Member { decision, .. }
            | Outcome::Removed { decision, .. }
            | Outcome::NoQuorum { decision, .. }
            | Outcome::Abandoned { decision, .. } => decision,
        }
    }

    /// The rank (as it joined) the decision came from.
    pub fn from(&self) -> usize {
        match self {
            Outcome::Member { from, .. }
            | Outcome::Removed { from, .. }
            | Outcome::NoQuorum { from, .. }
            | Outcome::Abandoned { from, .. } => *from,
        }
    }

    /// What `decision`, from `from`, means for the rank that joined as
    /// `me`.
    fn of(decision: ViewDecision, from: usize, me: usize) -> Self {
        if decision.outcome == ViewOutcome::NoQuorum {
            Outcome::NoQuorum { decision, from }
        } else if decision.members.contains(&me) {
            Outcome::Member { decision, from }
        } else {
            Outcome::Removed { decision, from }
        }
    }
}

/// A deliberate fault, for a simulation (`gradlane-sim`) to show that
/// its checks find one; only with the `flaws` feature, never in a build
/// that runs a group.
#[cfg(any(test, feature = "flaws"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    /// The coordinator forms a view from whoever is left, quorum or not.
    NoQuorum,
    /// The coordinator decides as soon as it is one, without waiting for
    /// the other ranks' proposals.
    Impatient,
    /// A member installs the first decision it accepts, without waiting
    /// for every member to accept it (the machine before issue 54).
    Hasty,
}

/// One rank's agreement on the next view (the module's docs).
#[derive(Debug, Clone)]
pub struct Agreement {
    seat: Seat,
    /// The places this rank has lost: no message from them is read, none
    /// is sent to them but the decision for the ranks left out.
    suspects: BTreeSet<usize>,
    /// What its last proposal said it had lost.
    told: BTreeSet<usize>,
    /// Whether to propose again if it lost a rank since it last said: at
    /// the start and after each event, but not straight after a proposal
    /// went out. A rank those sends found lost is said with the next
    /// proposal, once an event comes; meanwhile the coordinator may
    /// decide, with it among the lost already.
    recheck: bool,
    /// The latest proposal from each other place.
    proposals: BTreeMap<usize, ViewProposal>,
    transmits: VecDeque<Transmit>,
    /// The one decision this rank accepted, and the rank (as it joined)
    /// it came from first.
    accepted: Option<(ViewDecision, usize)>,
    /// The places that accepted it, this rank's own included.
    acks: BTreeSet<usize>,
    outcome: Option<Outcome>,
    #[cfg(any(test, feature = "flaws"))]
    flaw: Option<Flaw>,
}

impl Agreement {
    /// The agreement of the rank at `seat`, which has lost the places in
    /// `suspects`, and to which the ranks at the places in `alarms` had
    /// already sent these bytes where a collective's message was due.
    /// An alarm for another view is stale and dropped; a malformed one
    /// counts its rank as lost. The first proposal is ready to send.
    pub fn new<B: AsRef<[u8]>>(
        seat: Seat,
        suspects: impl IntoIterator<Item = usize>,
        alarms: impl IntoIterator<Item = (usize, B)>,
    ) -> Self {
        let n = seat.size();
        let mut suspects: BTreeSet<usize> = suspects.into_iter().filter(|&p| p < n).collect();
        let mut proposals = BTreeMap::new();
        for (p, body) in alarms {
            if p >= n || p == seat.place() {
                continue;
            }
            match ViewProposal::decode(body.as_ref(), seat.world()) {
                Ok(prop) if prop.epoch == seat.epoch() => {
                    proposals.insert(p, prop);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(rank = seat.members()[p], %e, "a malformed proposal: that rank counts as lost");
                    suspects.insert(p);
                }
            }
        }
        let mut agreement = Self {
            seat,
            told: suspects.clone(),
            suspects,
            recheck: true,
            proposals,
            transmits: VecDeque::new(),
            accepted: None,
            acks: BTreeSet::new(),
            outcome: None,
            #[cfg(any(test, feature = "flaws"))]
            flaw: None,
        };
        agreement.propose();
        agreement
    }

    /// The same machine with a deliberate fault.
    #[cfg(any(test, feature = "flaws"))]
    pub fn with_flaw(mut self, flaw: Option<Flaw>) -> Self {
        self.flaw = flaw;
        self
    }

    /// This rank's part in the agreement.
    pub fn seat(&self) -> &Seat {
        &self.seat
    }

    /// The places this rank has lost: the driver need not read their
    /// links (whatever comes from them is dropped).
    pub fn suspects(&self) -> &BTreeSet<usize> {
        &self.suspects
    }

    /// This rank's coordinator: the lowest place it has not lost.
    pub fn coordinator(&self) -> usize {
        (0..self.seat.size())
            .find(|p| !self.suspects.contains(p))
            .unwrap_or(self.seat.place())
    }

    /// The decision this rank took, once it has one. Send what
    /// [`poll_transmit`](Self::poll_transmit) still has before acting on
    /// it: the decision goes on to the other ranks first.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// Feeds in what a link said. Once there is an outcome, and from a
    /// place this rank has lost, nothing changes anything.
    pub fn handle(&mut self, event: Event<'_>) {
        let (from, me) = match event {
            Event::Proposal { from, .. } | Event::Decision { from, .. } | Event::Lost { from } => {
                (from, self.seat.place())
            }
        };
        if self.outcome.is_some() || from >= self.seat.size() || self.suspects.contains(&from) {
            return;
        }
        self.recheck = true;
        let rank = self.seat.members()[from];
        match event {
            Event::Lost { .. } => {
                if from != me {
                    self.suspects.insert(from);
                    self.lost_acceptor(from);
                }
            }
            _ if from == me => {}
            Event::Proposal { body, .. } => match ViewProposal::decode(body, self.seat.world()) {
                Ok(prop) if prop.epoch == self.seat.epoch() => {
                    self.proposals.insert(from, prop);
                }
                Ok(prop) => {
                    tracing::warn!(
                        rank,
                        epoch = prop.epoch,
                        "a proposal for another view: that rank counts as lost"
                    );
                    self.suspects.insert(from);
                }
                Err(e) => {
                    tracing::warn!(rank, %e, "a malformed proposal: that rank counts as lost");
                    self.suspects.insert(from);
                }
            },
            Event::Decision { body, .. } => match ViewDecision::decode(body, self.seat.world()) {
                Ok(decision) if decision.epoch == self.seat.epoch() => {
                    self.take(decision, from);
                }
                Ok(decision) => {
                    tracing::warn!(
                        rank,
                        epoch = decision.epoch,
                        "a decision for another view: that rank counts as lost"
                    );
                    self.suspects.insert(from);
                }
                Err(e) => {
                    tracing::warn!(rank, %e, "a malformed decision: that rank counts as lost");
                    self.suspects.insert(from);
                }
            },
        }
    }

    /// A send to the rank at place `to` failed: it counts as lost. After
    /// the outcome this changes nothing.
    pub fn send_failed(&mut self, to: usize) {
        if self.outcome.is_none() && to < self.seat.size() && to != self.seat.place() {
            self.suspects.insert(to);
            self.lost_acceptor(to);
        }
    }

    /// The next message to send, if any: the driver sends it, calls
    /// [`send_failed`](Self::send_failed) for each rank it failed to
    /// reach, and polls again until there is none.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        loop {
            if let Some(t) = self.transmits.pop_front() {
                return Some(t);
            }
            if self.outcome.is_some() {
                return None;
            }
            if self.accepted.is_some() {
                // Nothing more to say: what is left is to hear the
                // members accept it.
                return None;
            }
            if std::mem::take(&mut self.recheck) && self.suspects != self.told {
                // What this rank lost since it last said: say it again,
                // to the coordinator it now has among the rest.
                self.told = self.suspects.clone();
                self.propose();
                continue;
            }
            if self.coordinator() == self.seat.place() && self.heard_all() {
                self.decide();
                continue;
            }
            return None;
        }
    }

    /// Whether every place this rank has not lost has proposed.
    fn heard_all(&self) -> bool {
        #[cfg(any(test, feature = "flaws"))]
        if self.flaw == Some(Flaw::Impatient) {
            return true;
        }
        let me = self.seat.place();
        (0..self.seat.size())
            .all(|p| p == me || self.suspects.contains(&p) || self.proposals.contains_key(&p))
    }

    /// Queues this rank's proposal for every rank it has not lost.
    fn propose(&mut self) {
        let proposal = ViewProposal {
            epoch: self.seat.epoch(),
            call: self.seat.call(),
            has_result: self.seat.has_result(),
            suspects: self.told.iter().map(|&p| self.seat.members()[p]).collect(),
        };
        let to = self.places_but(&self.suspects, None);
        self.queue(to, MessageKind::Proposal, proposal.encode().into(), false);
    }

    /// As the coordinator: decides, queues the decision for the members,
    /// then for the ranks left out, and takes it.
    fn decide(&mut self) {
        #[cfg(any(test, feature = "flaws"))]
        let need_quorum = self.flaw != Some(Flaw::NoQuorum);
        #[cfg(not(any(test, feature = "flaws")))]
        let need_quorum = true;
        let Decided { decision, left_out } =
            rule::decide_with(&self.seat, &self.suspects, &self.proposals, need_quorum);
        let body: Bytes = decision.encode().into();
        let members = self.places_but(&left_out, None);
        self.queue(members, MessageKind::Decision, body.clone(), false);
        let me = self.seat.place();
        let left_out: Vec<usize> = left_out.into_iter().filter(|&p| p != me).collect();
        self.queue(left_out, MessageKind::Decision, body, true);
        let joined = self.seat.joined();
        self.accept(decision, joined);
    }

    /// A decision came from place `from`, which accepted it (a rank
    /// sends only the decision it accepted). The first one is this
    /// rank's too: it passes it on to every rank it reaches, the sender
    /// included (its acceptance), and accepts it. Later ones count
    /// toward installing the accepted one, or show it never can be.
    fn take(&mut self, decision: ViewDecision, from: usize) {
        let joined = self.seat.members()[from];
        let Some((accepted, _)) = &self.accepted else {
            let to = self.places_but(&self.suspects, None);
            self.queue(to, MessageKind::Decision, decision.encode().into(), false);
            self.acks.insert(from);
            self.accept(decision, joined);
            return;
        };
        if *accepted == decision {
            self.acks.insert(from);
            self.try_install();
        } else if accepted.members.contains(&joined) {
            // A member of the accepted view accepted another: it never
            // accepts this one, so this view is never installed.
            self.abandon(joined);
        }
    }

    /// This rank accepts `decision` (from the rank that joined as
    /// `from`): a rank left out or without a quorum stops at once (a stop
    /// conflicts with no view); a member waits for every member to
    /// accept it.
    fn accept(&mut self, decision: ViewDecision, from: usize) {
        self.acks.insert(self.seat.place());
        let me = self.seat.joined();
        let outcome = Outcome::of(decision.clone(), from, me);
        self.accepted = Some((decision, from));
        #[cfg(any(test, feature = "flaws"))]
        let hasty = self.flaw == Some(Flaw::Hasty);
        #[cfg(not(any(test, feature = "flaws")))]
        let hasty = false;
        if hasty || !matches!(outcome, Outcome::Member { .. }) {
            self.outcome = Some(outcome);
            return;
        }
        // A member of the view lost before it was heard to accept.
        let lost = self
            .members_of_accepted()
            .into_iter()
            .find(|p| self.suspects.contains(p) && !self.acks.contains(p));
        match lost {
            Some(p) => self.abandon(self.seat.members()[p]),
            None => self.try_install(),
        }
    }

    /// The places of the members of the accepted view.
    fn members_of_accepted(&self) -> Vec<usize> {
        let Some((accepted, _)) = &self.accepted else {
            return Vec::new();
        };
        accepted
            .members
            .iter()
            .filter_map(|&m| self.seat.place_of(m))
            .collect()
    }

    /// Installs the accepted view once every member of it accepted it.
    fn try_install(&mut self) {
        let Some((accepted, from)) = &self.accepted else {
            return;
        };
        if self.outcome.is_none()
            && self
                .members_of_accepted()
                .iter()
                .all(|p| self.acks.contains(p))
        {
            self.outcome = Some(Outcome::Member {
                decision: accepted.clone(),
                from: *from,
            });
        }
    }

    /// The link to place `p` failed: if this rank accepted a view with
    /// `p` in it that `p` was not heard to accept, it can never know
    /// whether every member accepted it, and stops.
    fn lost_acceptor(&mut self, p: usize) {
        if self.accepted.is_some()
            && !self.acks.contains(&p)
            && self.members_of_accepted().contains(&p)
        {
            self.abandon(self.seat.members()[p]);
        }
    }

    /// Stops: the accepted view can never be installed by all its
    /// members; `from` (as it joined) is the rank that showed it.
    fn abandon(&mut self, from: usize) {
        if let (None, Some((decision, _))) = (&self.outcome, &self.accepted) {
            self.outcome = Some(Outcome::Abandoned {
                decision: decision.clone(),
                from,
            });
        }
    }

    /// Every place of the view but this rank's, those in `skip` and
    /// `except`.
    fn places_but(&self, skip: &BTreeSet<usize>, except: Option<usize>) -> Vec<usize> {
        let me = self.seat.place();
        (0..self.seat.size())
            .filter(|&p| p != me && Some(p) != except && !skip.contains(&p))
            .collect()
    }

    fn queue(&mut self, to: Vec<usize>, kind: MessageKind, body: Bytes, left_out: bool) {
        if !to.is_empty() {
            self.transmits.push_back(Transmit {
                to,
                kind,
                body,
                left_out,
            });
        }
    }
}
