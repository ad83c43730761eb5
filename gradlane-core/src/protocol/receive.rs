//! The receiving side: what a round's receiver confirms, when it delivers
//! a round whose important part is in, and what the sender's reports of
//! datagrams sent tell it.
//!
//! A round is confirmed as soon as its important part and its end are in
//! (unless the link is closing), and delivered once its lossy part is all
//! in, or the grace after its last lossy byte ran out, or the sender
//! reported its datagrams sent and every datagram that reached the
//! transport by then is placed (then only a short tail is waited for).

use super::RoundTiming;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a receiver waits, after the sender reported a round's
/// datagrams all sent and every one received by then is placed, for
/// datagrams still arriving (each one restarts it): a few packets' worth
/// on any path, far below the grace period that covers not knowing
/// whether more will come.
pub const LOSSY_TAIL: Duration = Duration::from_millis(5);

/// What this end has confirmed, and whether it still confirms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Confirmations {
    last: Option<u32>,
    /// A close began: a round completing from now on is not confirmed (no
    /// one will take it).
    closing: bool,
}

impl Confirmations {
    /// A round's important part is complete: whether to confirm it (not
    /// once a close began).
    pub fn complete(&mut self, round: u32) -> bool {
        if self.closing {
            return false;
        }
        self.last = Some(self.last.map_or(round, |last| last.max(round)));
        true
    }

    /// Stops confirming; returns the last round confirmed.
    pub fn begin_close(&mut self) -> Option<u32> {
        self.closing = true;
        self.last
    }

    /// The last round confirmed.
    pub fn last(&self) -> Option<u32> {
        self.last
    }
}

/// The sender's reports that a round's datagrams are all sent, with how
/// many datagrams the transport had received when each came.
#[derive(Debug, Clone, Default)]
pub struct LossyReports {
    received_at_report: BTreeMap<u32, u64>,
}

impl LossyReports {
    /// The sender reported `round`'s datagrams all sent when the transport
    /// had received `datagrams` in all: every datagram sent before the
    /// report that was not lost is among them (the transport sends
    /// datagrams ahead of stream data), reordering on the path aside.
    pub fn reported(&mut self, round: u32, datagrams: u64) {
        self.received_at_report.insert(round, datagrams);
    }

    /// The count recorded for `round`, if it was reported.
    pub fn get(&self, round: u32) -> Option<u64> {
        self.received_at_report.get(&round).copied()
    }

    /// `round` was delivered: forget its report and older ones.
    pub fn delivered(&mut self, round: u32) {
        self.received_at_report = self.received_at_report.split_off(&round.saturating_add(1));
        if round == u32::MAX {
            self.received_at_report.clear();
        }
    }
}

/// Whether a round whose important part just completed is still to be
/// delivered: two rounds can complete at about the same time on their
/// own streams (a round the sender gave up, whose streams ran on, and
/// the next one), and their news can come in either order; one skipped
/// over by a later delivery has nothing left to deliver.
pub fn still_to_deliver(round: u32, last_delivered: Option<u32>) -> bool {
    last_delivered.is_none_or(|d| round > d)
}

/// Where a round's lossy part stands, as the receiver sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossyProgress {
    /// Lossy payload bytes held, and the sender's total once the round's
    /// end is in (`None`: the round is not open any more).
    pub held: Option<(u64, Option<u64>)>,
    /// Datagrams placed into the reassembler so far.
    pub placed: u64,
    /// Datagrams the transport had received when the sender reported this
    /// round's all sent, if it did.
    pub reported: Option<u64>,
}

/// What a round's receiver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Deliver the round now.
    Now,
    /// Wait for more of the lossy part until this time, then deliver.
    WaitUntil(Instant),
}

/// The wait for one round's lossy part, from the moment its important
/// part was complete and it was taken up for delivery.
#[derive(Debug, Clone)]
pub struct DeliveryWait {
    timing: RoundTiming,
    /// The grace period plus two round trips: the wait after a lossy byte.
    idle: Duration,
    /// The longest wait, whatever arrives.
    cap: Instant,
    deadline: Option<Instant>,
}

impl DeliveryWait {
    /// Starts the wait at `now`, on a path of round-trip time `rtt`.
    pub fn new(now: Instant, timing: RoundTiming, rtt: Duration) -> Self {
        Self {
            timing,
            idle: timing.grace + rtt * 2,
            cap: now + timing.max_grace,
            deadline: None,
        }
    }

    /// Ends the wait at `until` at the latest (the round's
    /// [`StepDeadline`](super::StepDeadline)): whatever of the lossy part
    /// is in by then is delivered, the rest counts as missing.
    pub fn until(mut self, until: Option<Instant>) -> Self {
        if let Some(until) = until {
            self.cap = self.cap.min(until);
        }
        self
    }

    /// Re-decides at `now` (the first time, and whenever lossy data
    /// arrived or a report came): each arrival restarts the wait.
    pub fn progress(&mut self, now: Instant, p: LossyProgress) -> Delivery {
        let got = match p.held {
            Some((got, Some(sent))) if got < sent => got,
            // All in, or the round is gone (delivered past or abandoned).
            _ => return Delivery::Now,
        };
        // The sender reported them all sent, and every datagram the
        // transport had received by then is placed: what is missing was
        // lost, or was overtaken by the report by a packet or two (quinn
        // puts a small stream frame into the tail of a packet that the
        // next datagram does not fit) and is about to come.
        let drained = p.reported.is_some_and(|received| p.placed >= received);
        let idle = if drained {
            self.timing.grace.min(LOSSY_TAIL)
        } else if got == 0 && p.reported.is_none() {
            // Not one lossy byte yet and no report: the sender has not
            // started its lossy part (it may wait for this end's
            // confirmation, which, if lost, is resent only after a probe
            // timeout). The grace counts from the last lossy byte, and
            // there is none yet: wait for the first one or the report, up
            // to `max_grace`; under loss a round would otherwise be
            // delivered without any of its lossy part.
            self.timing.max_grace
        } else {
            self.idle
        };
        let wait = idle.min(self.cap.saturating_duration_since(now));
        if wait.is_zero() {
            return Delivery::Now;
        }
        let until = now + wait;
        self.deadline = Some(until);
        Delivery::WaitUntil(until)
    }

    /// Whether the wait ran out at `now`.
    pub fn timed_out(&self, now: Instant) -> bool {
        self.deadline.is_none_or(|d| now >= d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(got: u64) -> LossyProgress {
        LossyProgress {
            held: Some((got, Some(10_000))),
            placed: 0,
            reported: None,
        }
    }

    /// A deadline caps every wait, the first-byte wait included, and a
    /// round taken up past its deadline is delivered at once.
    #[test]
    fn a_deadline_ends_the_wait_whatever_is_still_coming() {
        let now = Instant::now();
        let timing = RoundTiming::default();
        let rtt = Duration::from_millis(1);
        let until = now + Duration::from_millis(7);
        let mut wait = DeliveryWait::new(now, timing, rtt).until(Some(until));
        assert_eq!(wait.progress(now, held(0)), Delivery::WaitUntil(until));
        assert_eq!(wait.progress(now, held(500)), Delivery::WaitUntil(until));
        assert_eq!(wait.progress(until, held(900)), Delivery::Now);
        let mut late = DeliveryWait::new(until, timing, rtt).until(Some(now));
        assert_eq!(late.progress(until, held(0)), Delivery::Now);
        // Without one, the grace after a lossy byte applies.
        let mut free = DeliveryWait::new(now, timing, rtt).until(None);
        assert_eq!(
            free.progress(now, held(500)),
            Delivery::WaitUntil(now + timing.grace + rtt * 2)
        );
    }
}
