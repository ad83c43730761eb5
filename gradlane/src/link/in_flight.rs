//! A round in flight, between its first important byte and its outcome:
//! its machine, and abandoning it (resetting its streams) if `send_round`
//! returns or is dropped before the peer confirmed the important part.

use super::*;
use gradlane_core::protocol::RoundSend;
use tokio::sync::watch;

/// A round between its first important byte and its outcome: its machine,
/// and what abandoning it takes, done when `send_round` returns (fails,
/// or is dropped by its caller) before the peer confirmed the round's
/// important part.
///
/// Without it, a dropped `send_round` left its writer tasks running and
/// quinn holding up to its send window of the round: all of it was sent,
/// and resent under loss, for a round no one waits for any more.
/// Abandoning resets every lane: a writer still running resets its
/// stream, and a finished lane, whose data quinn may still hold, is reset
/// by its [`Unconfirmed`] (held here, or in the output of a writer not
/// yet awaited). The peer then delivers the round only if its important
/// part had all arrived; its datagrams are reported sent (none will
/// follow), so that delivery does not wait out the grace for them.
pub(super) struct InFlight {
    pub(super) machine: RoundSend,
    /// Dropped with this guard: the running writers' signal.
    signal: watch::Sender<()>,
    /// Lanes whose writer finished the stream.
    pub(super) finished: Vec<Unconfirmed>,
    control: SharedControl,
    /// The report of the round's datagrams was written.
    reported: bool,
    /// quinn's free datagram queue space when the lossy part was released
    /// (its queue is empty between rounds): what "all sent" looks like.
    pub(super) datagrams_empty: usize,
}

impl InFlight {
    pub(super) fn new(machine: RoundSend, control: SharedControl) -> Self {
        Self {
            machine,
            signal: watch::Sender::new(()),
            finished: Vec::new(),
            control,
            reported: false,
            datagrams_empty: usize::MAX,
        }
    }

    /// What a lane's writer watches: it fires when this guard goes.
    pub(super) fn signal(&self) -> watch::Receiver<()> {
        self.signal.subscribe()
    }

    /// Tells the peer that every datagram of the round is sent. The report
    /// only saves the peer time. It fails when the peer is closing the
    /// link (this end finished its control stream in reply) or the
    /// connection is gone; the confirmation tells which, and whether the
    /// round arrived.
    pub(super) async fn report_lossy_sent(&mut self) {
        let round = self.machine.plan().round;
        let stream = &mut *self.control.stream.lock().await;
        if let Err(e) = write_control(stream, Control::LossySent(round)).await {
            tracing::debug!(%e, "report of the datagrams not written");
        }
        self.reported = true;
    }

    /// The peer confirmed the round: let quinn finish sending its streams.
    pub(super) fn disarm(&mut self) {
        for stream in self.finished.drain(..) {
            stream.confirm();
        }
    }
}

/// A finished stream of a round the peer has not confirmed yet: reset
/// when dropped, unless confirmed. quinn goes on sending what it holds of
/// a finished stream whose handle is dropped; whoever drops this one (an
/// abandoned round's guard, or a writer's output no one awaited) stops
/// that.
pub(super) struct Unconfirmed(Option<SendStream>);

impl Unconfirmed {
    /// A stream its writer has just finished.
    pub(super) fn new(stream: SendStream) -> Self {
        Self(Some(stream))
    }

    /// The round was confirmed: let quinn finish sending the stream.
    pub(super) fn confirm(mut self) {
        self.0.take();
    }
}

impl Drop for Unconfirmed {
    fn drop(&mut self) {
        if let Some(stream) = &mut self.0 {
            // Fails harmlessly if the peer already acknowledged it all.
            let _ = stream.reset(VarInt::from_u32(codes::ROUND_ABANDONED));
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(Ok(_)) = self.machine.outcome() {
            return self.disarm();
        }
        self.machine.abandon();
        tracing::debug!(round = self.machine.plan().round, "round abandoned");
        // Dropping them resets them (the machine's `ResetStreams`).
        self.finished.clear();
        if self.reported {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let control = self.control.clone();
            let round = self.machine.plan().round;
            runtime.spawn(async move {
                // The link may be gone: nothing to tell then.
                let stream = &mut *control.stream.lock().await;
                let _ = write_control(stream, Control::LossySent(round)).await;
            });
        }
    }
}
