//! One round's sender: when its lossy part is released, when that part
//! counts as sent and is reported, and what the round's outcome is.
//!
//! The phases, in order:
//! 1. `Important`: the driver hands the important part to the transport.
//! 2. `AwaitRelease`: the lossy part waits until the transport has sent as
//!    many stream bytes as the important part holds, or until the peer
//!    confirmed it ([`LossyRelease`](super::LossyRelease)).
//! 3. `Lossy`: the driver queues the datagrams, or writes the lossy
//!    streams.
//! 4. `Draining`: until the transport has sent what was queued: its
//!    datagram queue empty (giving up [`DRAIN_GIVE_UP`] after queueing),
//!    or its count of sent stream bytes past the lossy streams' end
//!    (giving up after [`DRAIN_GIVE_UP`] without progress); then, for
//!    datagrams, the report that they are all sent.
//! 5. `AwaitConfirm`: until the peer's confirmation.
//!
//! At any point the peer's confirmation decides the round: once it came,
//! nothing after it (a failed report, the peer closing at once) undoes it;
//! until it came, a failure, the peer's close or the driver giving up
//! abandons the round ([`SendAction::ResetStreams`], and the report, so
//! the peer does not wait out its grace for datagrams that will not
//! come).

use crate::control::CloseNote;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long draining the lossy part may take (datagrams, whose queue
/// shows no progress) or go without progress (streams) before the round
/// goes on without it: a path that stalls that long is better served by
/// the receiver's grace period than by a late report.
pub const DRAIN_GIVE_UP: Duration = Duration::from_secs(1);

/// What a round's sender decided before its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendPlan {
    /// The round's index.
    pub round: u32,
    /// The lossy part goes on streams, not as datagrams
    /// ([`RoundTiming::lossy_on_stream`](super::RoundTiming::lossy_on_stream)).
    pub lossy_on_stream: bool,
    /// The lossy part may go once the important part is sent, not only on
    /// the confirmation
    /// ([`RoundTiming::release_on_sent`](super::RoundTiming::release_on_sent)).
    pub release_on_sent: bool,
    /// The transport's count of stream bytes sent (less those lost) when
    /// the round started.
    pub sent_before: u64,
    /// Bytes of the important part's streams.
    pub reliable_len: u64,
    /// Payload bytes of the lossy part on the wire, in its format (on
    /// streams, when it goes there).
    pub lossy_len: u64,
    /// The round's deadline ([`StepDeadline`](super::StepDeadline)): the
    /// wait for the lossy part to leave gives up there, if not before.
    pub lossy_until: Option<Instant>,
}

/// What happened, as far as one round's sender cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendEvent {
    /// Every important byte is in the transport's hands and its streams
    /// are finished.
    ImportantHanded,
    /// A look at the transport's count of stream bytes sent on the
    /// connection, less those declared lost (it has no event for "sent"):
    /// asked for by [`RoundSend::wants`] with [`Counter::SentBytes`].
    SentBytes(u64),
    /// The transport's datagram queue is empty: asked for by
    /// [`RoundSend::wants`] with [`Counter::DatagramQueue`].
    DatagramsDrained,
    /// The peer confirmed the round's important part, at `at`.
    Confirmed {
        /// When the confirmation arrived.
        at: Instant,
    },
    /// Every lossy datagram was queued (or dropped by the deadline), or
    /// every lossy stream written and finished.
    LossyQueued,
    /// The peer finished its control stream and every confirmation it
    /// sent was read: no confirmation will come any more.
    PeerFinished,
    /// Sending failed, or the connection is gone.
    Failed {
        /// The note of the peer's orderly close, if it closed that way.
        note: Option<CloseNote>,
        /// The failure says the peer closed the link in order.
        peer_closed: bool,
    },
}

/// Which of the transport's counters a round waits on: the driver looks
/// at it while the round waits (the transport has no event for either).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// Stream bytes sent, less those declared lost
    /// ([`SendEvent::SentBytes`]).
    SentBytes,
    /// Whether the datagram queue is empty ([`SendEvent::DatagramsDrained`]).
    DatagramQueue,
}

/// What the driver must do for the round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendAction {
    /// Start the lossy part: queue its datagrams, or open its streams.
    ReleaseLossy,
    /// Tell the peer that every datagram of the round is sent (or will
    /// never be).
    ReportLossySent,
    /// Reset every stream of the round: it is abandoned.
    ResetStreams,
}

/// How a round's sending ended, when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendFailure {
    /// The peer closed the link in order before the round's important part
    /// was complete there: it was not delivered.
    PeerClosed,
    /// The transport failed; its error says why.
    Transport,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Important,
    AwaitRelease,
    Lossy,
    Draining {
        give_up: Instant,
        /// Stream bytes sent at the last progress (lossy streams).
        last: u64,
    },
    AwaitConfirm,
    Done,
}

/// The sending side of one round (see the module's docs for its phases).
#[derive(Debug)]
pub struct RoundSend {
    plan: SendPlan,
    phase: Phase,
    confirmed: Option<Instant>,
    /// The report of the datagrams is out (or queued as an action).
    reported: bool,
    /// Whether the datagram queue drained before the give-up.
    drained: Option<bool>,
    actions: VecDeque<SendAction>,
    outcome: Option<Result<Instant, SendFailure>>,
}

impl RoundSend {
    /// A round about to hand its important part to the transport.
    pub fn new(plan: SendPlan) -> Self {
        Self {
            plan,
            phase: Phase::Important,
            confirmed: None,
            reported: false,
            drained: None,
            actions: VecDeque::new(),
            outcome: None,
        }
    }

    /// The round's plan.
    pub fn plan(&self) -> &SendPlan {
        &self.plan
    }

    /// Feeds one event in.
    pub fn handle(&mut self, now: Instant, event: SendEvent) {
        if self.outcome.is_some() {
            return;
        }
        match event {
            SendEvent::ImportantHanded if self.phase == Phase::Important => {
                self.phase = Phase::AwaitRelease;
            }
            SendEvent::ImportantHanded => {}
            SendEvent::SentBytes(sent) => self.sent_bytes(now, sent),
            SendEvent::DatagramsDrained => {
                if let Phase::Draining { .. } = self.phase {
                    if !self.plan.lossy_on_stream {
                        self.drained_lossy(Some(true));
                    }
                }
            }
            SendEvent::Confirmed { at } => {
                self.confirmed.get_or_insert(at);
            }
            // Lossy streams with nothing on them (an all-reliable round):
            // there is nothing to wait for, and the estimate of sent
            // stream bytes may never quite reach the important part's own
            // length, which would cost the give-up second every round.
            SendEvent::LossyQueued
                if self.phase == Phase::Lossy
                    && self.plan.lossy_on_stream
                    && self.plan.lossy_len == 0 =>
            {
                self.drained_lossy(None);
            }
            SendEvent::LossyQueued if self.phase == Phase::Lossy => {
                self.phase = Phase::Draining {
                    give_up: self.give_up(now),
                    last: 0,
                };
            }
            SendEvent::LossyQueued => {}
            // Confirmations are read before the stream's end: one that
            // came is known by now.
            SendEvent::PeerFinished if self.confirmed.is_none() => {
                self.fail(SendFailure::PeerClosed)
            }
            SendEvent::PeerFinished => {}
            SendEvent::Failed { note, peer_closed } => {
                if self.confirmed.is_some() {
                    // The round arrived; what failed came after.
                    self.phase = Phase::Done;
                } else if note
                    .is_some_and(|n| n.last_confirmed.is_some_and(|c| c >= self.plan.round))
                {
                    // The confirmation was cut off by the close, whose
                    // note still names the round.
                    self.confirmed = Some(now);
                    self.phase = Phase::Done;
                } else if note.is_some() || peer_closed {
                    self.fail(SendFailure::PeerClosed);
                } else {
                    self.fail(SendFailure::Transport);
                }
            }
        }
        self.advance(now);
    }

    /// The give-up deadline fired (the driver calls this at
    /// [`poll_timeout`](Self::poll_timeout)).
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Phase::Draining { give_up, .. } = self.phase {
            if now >= give_up {
                self.drained_lossy(Some(false));
            }
        }
        self.advance(now);
    }

    /// When [`handle_timeout`](Self::handle_timeout) is due, if a timer
    /// is armed.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Draining { give_up, .. } if self.outcome.is_none() => Some(give_up),
            _ => None,
        }
    }

    /// Which counter the round waits on, if any: the driver looks at it
    /// while it waits and feeds it in.
    pub fn wants(&self) -> Option<Counter> {
        if self.outcome.is_some() {
            return None;
        }
        match self.phase {
            Phase::AwaitRelease if self.plan.release_on_sent => Some(Counter::SentBytes),
            Phase::Draining { .. } if self.plan.lossy_on_stream => Some(Counter::SentBytes),
            Phase::Draining { .. } => Some(Counter::DatagramQueue),
            _ => None,
        }
    }

    /// The next thing to do, if any.
    pub fn poll_action(&mut self) -> Option<SendAction> {
        self.actions.pop_front()
    }

    /// The round's outcome once decided: when the peer's confirmation
    /// came, or why the round failed. A failed round has queued its
    /// abandoning actions.
    pub fn outcome(&self) -> Option<Result<Instant, SendFailure>> {
        self.outcome
    }

    /// Whether the lossy part has left (or draining it gave up): from
    /// here the round waits only for the confirmation.
    pub fn lossy_sent(&self) -> bool {
        matches!(self.phase, Phase::AwaitConfirm | Phase::Done)
    }

    /// Whether the lossy part's datagrams left the queue before the
    /// give-up (`None` before draining ended, and for streams).
    pub fn datagrams_drained(&self) -> Option<bool> {
        self.drained
    }

    /// The driver stops (its caller dropped the send, or it failed on
    /// its own): unless the round is confirmed, it is abandoned.
    pub fn abandon(&mut self) {
        if self.outcome.is_none() {
            self.fail(SendFailure::Transport);
        }
    }

    fn sent_bytes(&mut self, now: Instant, sent: u64) {
        match self.phase {
            Phase::AwaitRelease
                if self.plan.release_on_sent
                    && sent >= self.plan.sent_before + self.plan.reliable_len =>
            {
                self.release();
            }
            Phase::Draining { last, .. } if self.plan.lossy_on_stream => {
                let target = self.plan.sent_before + self.plan.reliable_len + self.plan.lossy_len;
                if sent >= target {
                    self.drained_lossy(None);
                } else if sent > last {
                    self.phase = Phase::Draining {
                        give_up: self.give_up(now),
                        last: sent,
                    };
                }
            }
            _ => {}
        }
    }

    /// When draining gives up, waiting from `now`: [`DRAIN_GIVE_UP`]
    /// without progress, or the round's deadline.
    fn give_up(&self, now: Instant) -> Instant {
        let wait = now + DRAIN_GIVE_UP;
        self.plan.lossy_until.map_or(wait, |until| wait.min(until))
    }

    fn release(&mut self) {
        self.phase = Phase::Lossy;
        self.actions.push_back(SendAction::ReleaseLossy);
    }

    fn drained_lossy(&mut self, datagrams: Option<bool>) {
        if !self.plan.lossy_on_stream {
            self.drained = datagrams;
            self.report();
        }
        self.phase = Phase::AwaitConfirm;
    }

    fn report(&mut self) {
        if !self.reported {
            self.reported = true;
            self.actions.push_back(SendAction::ReportLossySent);
        }
    }

    /// Moves on as far as what is known allows.
    fn advance(&mut self, _now: Instant) {
        if self.outcome.is_some() {
            return;
        }
        match (self.phase, self.confirmed) {
            (Phase::AwaitRelease, Some(_)) => self.release(),
            (Phase::AwaitConfirm | Phase::Done, Some(at)) => {
                self.phase = Phase::Done;
                self.outcome = Some(Ok(at));
            }
            _ => {}
        }
    }

    fn fail(&mut self, why: SendFailure) {
        self.phase = Phase::Done;
        self.outcome = Some(Err(why));
        self.actions.clear();
        self.actions.push_back(SendAction::ResetStreams);
        // Datagrams of the round may be on their way: tell the peer none
        // follow, so it does not wait out its grace for them.
        self.report();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An all-reliable round on the stream carrier: once the lossy part
    /// (empty) is queued the round waits only for its confirmation, not
    /// for a count of sent bytes.
    #[test]
    fn an_empty_lossy_part_on_streams_is_not_drained() {
        let now = Instant::now();
        let mut m = RoundSend::new(SendPlan {
            round: 3,
            lossy_on_stream: true,
            release_on_sent: true,
            sent_before: 1000,
            reliable_len: 500,
            lossy_len: 0,
            lossy_until: None,
        });
        m.handle(now, SendEvent::ImportantHanded);
        m.handle(now, SendEvent::SentBytes(1000 + 500));
        assert_eq!(m.poll_action(), Some(SendAction::ReleaseLossy));
        m.handle(now, SendEvent::LossyQueued);
        assert_eq!(m.wants(), None);
        assert_eq!(m.poll_timeout(), None);
        let at = now + Duration::from_millis(2);
        m.handle(at, SendEvent::Confirmed { at });
        assert_eq!(m.outcome(), Some(Ok(at)));
    }

    /// A round with a deadline stops waiting for its datagrams to leave
    /// at the deadline, well before the give-up, and reports them sent.
    #[test]
    fn draining_gives_up_at_the_round_s_deadline() {
        let now = Instant::now();
        let until = now + Duration::from_millis(40);
        let mut m = RoundSend::new(SendPlan {
            round: 1,
            lossy_on_stream: false,
            release_on_sent: true,
            sent_before: 0,
            reliable_len: 500,
            lossy_len: 5000,
            lossy_until: Some(until),
        });
        m.handle(now, SendEvent::ImportantHanded);
        m.handle(now, SendEvent::SentBytes(500));
        assert_eq!(m.poll_action(), Some(SendAction::ReleaseLossy));
        m.handle(now, SendEvent::LossyQueued);
        assert_eq!(m.poll_timeout(), Some(until));
        assert!(!m.lossy_sent());
        m.handle_timeout(until);
        assert!(m.lossy_sent());
        assert_eq!(m.datagrams_drained(), Some(false));
        assert_eq!(m.poll_action(), Some(SendAction::ReportLossySent));
    }
}
