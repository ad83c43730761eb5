//! Closing a link in order, as a state machine.
//!
//! A round's sender learns that the round arrived from the receiver's
//! confirmation on the control stream, and a transport discards unsent
//! stream data when its connection closes: a receiver that closed at once
//! after taking its last round could cut that confirmation off. So an
//! orderly close stops confirming ([`Confirmations::begin_close`]),
//! finishes the control stream behind the confirmations already written,
//! waits until the peer has read all of it (the peer finishes its own
//! control stream in reply) and this end's messages are acknowledged,
//! then closes the connection. Whichever way the connection closes, the
//! close carries a [`CloseNote`] naming the last round confirmed, so a
//! confirmation cut off by a close is still learnt from the close itself.
//!
//! [`Confirmations::begin_close`]: super::Confirmations::begin_close

use crate::control::CloseNote;
use std::time::{Duration, Instant};

/// How a connection ended, as far as closing cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClosedBy {
    /// This end closed it.
    Locally,
    /// The peer closed it in order, with its note (if the note could be
    /// read).
    PeerInOrder(Option<CloseNote>),
    /// Anything else: an error code, a timeout, a reset.
    Other,
}

/// How an orderly close ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseOutcome {
    /// The peer read everything this end sent.
    Acknowledged,
    /// The peer did not answer within the wait: closed anyway.
    Unacknowledged {
        /// How long the close waited.
        waited: Duration,
    },
    /// The connection ended before the peer acknowledged: how.
    Closed(ClosedBy),
}

/// What a close finds when the connection ended already: fine if this end
/// closed it, or the peer closed it in order after reading everything.
pub fn already_closed(by: ClosedBy) -> CloseOutcome {
    match by {
        ClosedBy::Locally => CloseOutcome::Acknowledged,
        ClosedBy::PeerInOrder(Some(note)) if note.read_all => CloseOutcome::Acknowledged,
        by => CloseOutcome::Closed(by),
    }
}

/// One orderly close, from the moment this end finished its control
/// stream.
#[derive(Debug, Clone)]
pub struct CloseInOrder {
    started: Instant,
    wait: Duration,
    last_confirmed: Option<u32>,
    peer_finished: bool,
    messages_flushed: bool,
    outcome: Option<CloseOutcome>,
}

impl CloseInOrder {
    /// Starts at `now`, giving the peer `wait` to answer; this end last
    /// confirmed `last_confirmed` (from
    /// [`Confirmations::begin_close`](super::Confirmations::begin_close)).
    /// `messages_pending`: this end sent messages the peer has not
    /// acknowledged yet.
    pub fn new(
        now: Instant,
        wait: Duration,
        last_confirmed: Option<u32>,
        messages_pending: bool,
    ) -> Self {
        Self {
            started: now,
            wait,
            last_confirmed,
            peer_finished: false,
            messages_flushed: !messages_pending,
            outcome: None,
        }
    }

    /// The peer finished its control stream: it read all of this end's.
    pub fn peer_finished(&mut self) {
        self.peer_finished = true;
        self.decide();
    }

    /// The peer acknowledged every message this end sent.
    pub fn messages_flushed(&mut self) {
        self.messages_flushed = true;
        self.decide();
    }

    /// The connection ended.
    pub fn connection_closed(&mut self, by: ClosedBy) {
        if self.outcome.is_none() {
            self.outcome = Some(already_closed(by));
        }
    }

    /// When the wait runs out.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.outcome.is_none().then_some(self.started + self.wait)
    }

    /// The wait ran out (if `now` is past it).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.outcome.is_none() && now >= self.started + self.wait {
            self.outcome = Some(CloseOutcome::Unacknowledged { waited: self.wait });
        }
    }

    /// How the close ended, once it has: the driver then closes the
    /// connection with [`note`](Self::note).
    pub fn outcome(&self) -> Option<CloseOutcome> {
        self.outcome
    }

    /// What the close frame says.
    pub fn note(&self) -> CloseNote {
        CloseNote {
            last_confirmed: self.last_confirmed,
            read_all: self.peer_finished,
        }
    }

    fn decide(&mut self) {
        if self.outcome.is_none() && self.peer_finished && self.messages_flushed {
            self.outcome = Some(CloseOutcome::Acknowledged);
        }
    }
}
