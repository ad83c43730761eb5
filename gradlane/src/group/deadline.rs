//! The group's collective timeout: each collective's deadline, and what
//! happens to the ranks that have not answered by it.

use super::{Group, GroupError, TimedOut};
use crate::link::LinkError;
use gradlane_core::control::codes;
use gradlane_core::group::OnTimeout;
use quinn::{ConnectionError, VarInt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// When the running collective's time is up, and what it is told it
/// waited.
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadline {
    /// The collective.
    pub(super) op: &'static str,
    /// When its time is up.
    pub(super) at: tokio::time::Instant,
    /// The bound a timeout names: the group's collective timeout, or the
    /// call's own (a monitored barrier's), so that the error and the
    /// reason sent to the other ranks say what the caller asked for.
    pub(super) after: Duration,
}

impl Group {
    /// Starts collective `op`: its deadline, where the group has a
    /// timeout. A group that timed out before
    /// ([`OnRankFailure::Fail`](super::OnRankFailure::Fail)) runs nothing
    /// more: the same error again; nor does one whose last collective
    /// never ended (its future was dropped).
    pub(super) fn begin_collective(&mut self, op: &'static str) -> Result<(), GroupError> {
        if let Some(t) = &self.timed_out {
            return Err(t.error());
        }
        if let Some(op) = self.unfinished {
            return Err(GroupError::Interrupted { op });
        }
        self.unfinished = Some(op);
        self.restart_deadline(op);
        Ok(())
    }

    /// Ends the running collective.
    pub(super) fn end_collective(&mut self) {
        self.running = None;
        self.unfinished = None;
    }

    /// Lifts the running collective's deadline while the survivors agree
    /// on a new view, which has bounds of its own.
    pub(super) fn pause_deadline(&mut self) {
        self.running = None;
    }

    /// A fresh deadline for collective `op`, run again in a new view.
    pub(super) fn restart_deadline(&mut self, op: &'static str) {
        self.running = self.membership.config.collective_timeout.map(|t| Deadline {
            op,
            at: tokio::time::Instant::now() + t,
            after: t,
        });
    }

    /// The error of an exchange cut at the deadline, the ranks of `heard`
    /// not marked being the silent ones (by place in the view). With
    /// `Fail` the group is then unusable and every link is closed, so
    /// that the other ranks fail at once rather than at their own
    /// deadline. With `Continue` the silent ranks' links are closed as
    /// removed and they count as lost, so that the survivors agree on a
    /// view without them; the error is a lost rank's.
    pub(super) fn silent_past_deadline(&mut self, tag: u64, heard: &[AtomicBool]) -> GroupError {
        let op = self.running.map_or("collective", |d| d.op);
        let waited = self.running.map_or_else(
            || {
                self.membership
                    .config
                    .collective_timeout
                    .unwrap_or_default()
            },
            |d| d.after,
        );
        let silent: Vec<usize> = (0..self.world)
            .filter(|&p| p != self.rank && self.senders[p].is_some())
            .filter(|&p| !heard.get(p).is_some_and(|h| h.load(Ordering::Relaxed)))
            .collect();
        let timed_out = TimedOut {
            op,
            collective: tag >> 8,
            missing: silent.iter().map(|&p| self.members()[p]).collect(),
            waited,
        };
        tracing::warn!(
            rank = self.membership.joined_rank,
            op,
            missing = ?timed_out.missing,
            ?waited,
            "a collective timed out"
        );
        match self.membership.policy.on_timeout() {
            OnTimeout::CloseEveryLink => {
                let error = timed_out.error();
                let reason = format!("rank {} gave up: {error}", self.membership.joined_rank);
                for sender in self.senders.iter().flatten() {
                    sender
                        .connection()
                        .close(VarInt::from_u32(codes::ABORTED), reason.as_bytes());
                }
                self.timed_out = Some(timed_out);
                error
            }
            OnTimeout::RemoveTheSilent => {
                let reason =
                    format!("silent past the timeout ({waited:?}) of {op}: removed from the group");
                for &p in &silent {
                    if let Some(sender) = &self.senders[p] {
                        sender
                            .connection()
                            .close(VarInt::from_u32(codes::REMOVED), reason.as_bytes());
                    }
                    self.membership.keeper.note_lost(p);
                }
                GroupError::Rank {
                    rank: silent.first().copied().unwrap_or(self.rank),
                    source: LinkError::Connection(ConnectionError::TimedOut),
                }
            }
        }
    }
}
