//! When a round's lossy part is released, what carries it, and how long a
//! receiver waits for it: settings whose defaults hold on any path
//! (gradlane's `Config::timing`).

use std::time::Duration;

/// When a round's lossy part may start.
///
/// quinn puts datagrams ahead of stream data in every packet, so lossy
/// data released too early slows the important bytes; released too late,
/// the path idles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossyRelease {
    /// Once every important byte is in quinn's hands and quinn has sent at
    /// least as many stream bytes (less those lost) as the important part
    /// holds; or on the peer's confirmation, if that comes first. The path
    /// does not idle while the confirmation travels back: the lossy data
    /// may overtake only retransmissions of the stream's last packets.
    #[default]
    Sent,
    /// Once the peer confirmed every important chunk: the path idles for
    /// about a round trip, but no lossy byte competes with important data
    /// on the path or for the receiver's CPU. For paths whose queues are
    /// so deep that even the last retransmissions must not wait.
    Acknowledged,
}

/// How large the lossy datagrams are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DatagramSize {
    /// Packets of at most the MTU floor
    /// (gradlane's `Packets` minimum; 1162-byte datagrams at QUIC's
    /// 1200). quinn 0.11 reads the random loss of packets smaller than the
    /// largest it has seen acknowledged as an MTU black hole, falls back
    /// to the floor and discards queued datagrams that no longer fit:
    /// datagrams at the floor are immune to both.
    #[default]
    MtuFloor,
    /// The path's size when the round is framed (1414 bytes on a
    /// 1500-byte path once discovery has run): about 18% fewer datagrams,
    /// for paths without random loss. Datagrams an MTU fall discards are
    /// counted in gradlane's `SendReport::lossy_dropped_by_quinn`.
    Path,
}

/// What carries a round's lossy levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossyCarrier {
    /// Always datagrams.
    Datagrams,
    /// Streams below the important lanes while the path loses nothing
    /// (they cost less CPU than datagrams at both ends, and quinn sends
    /// them only when no lane has anything to send); datagrams from the
    /// first round after quinn declared a packet lost, until a round starts
    /// with no loss declared since the last. A receiver waits for a lossy
    /// stream no longer than for datagrams ([`RoundTiming::grace`]): what
    /// comes later merges into the next round. A round with a
    /// [`RoundTiming::lossy_deadline`] uses datagrams.
    #[default]
    Adaptive,
}

/// When a round's lossy part is released, what carries it, and how long a
/// receiver waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundTiming {
    /// When the lossy part starts (default [`LossyRelease::Sent`]).
    pub release: LossyRelease,
    /// How long a receiver that has a round's important part waits after
    /// the last lossy byte before it delivers without the rest (plus two
    /// round trips); default 30 ms, above quinn's 25 ms maximum ACK delay,
    /// which a sender with a full window can stall for. Once the sender
    /// reports the round's datagrams all sent, the wait shrinks to a few
    /// milliseconds. Raise it on a path with much jitter.
    pub grace: Duration,
    /// The longest a receiver waits for a round's lossy part, whatever
    /// arrives (default 2 s).
    pub max_grace: Duration,
    /// Drop the lossy data not yet queued this long after `send_round`
    /// started, lowest level first (default none: all of it is queued).
    /// For a round that must end by a deadline.
    pub lossy_deadline: Option<Duration>,
    /// How large the lossy datagrams are (default [`DatagramSize::MtuFloor`]).
    pub datagram_size: DatagramSize,
    /// What carries the lossy levels (default [`LossyCarrier::Adaptive`]).
    pub lossy_carrier: LossyCarrier,
}

impl Default for RoundTiming {
    fn default() -> Self {
        Self {
            release: LossyRelease::default(),
            grace: Duration::from_millis(30),
            max_grace: Duration::from_secs(2),
            lossy_deadline: None,
            datagram_size: DatagramSize::default(),
            lossy_carrier: LossyCarrier::default(),
        }
    }
}

impl RoundTiming {
    /// Whether a round's lossy levels go on streams rather than as
    /// datagrams ([`LossyCarrier`]): `lost_since_last` says whether the
    /// transport declared a packet lost since the last round started;
    /// `marked`, whether its packets are marked by class, which only
    /// datagrams sent level by level can follow.
    pub fn lossy_on_stream(&self, lost_since_last: bool, marked: bool) -> bool {
        self.lossy_carrier == LossyCarrier::Adaptive
            && self.lossy_deadline.is_none()
            && !lost_since_last
            && !marked
    }

    /// Whether the lossy part may go once the transport has sent the
    /// important part ([`LossyRelease::Sent`]), rather than only on the
    /// peer's confirmation. Marked packets are classed by the time they
    /// leave, so a marked connection waits for the confirmation.
    pub fn release_on_sent(&self, marked: bool) -> bool {
        self.release == LossyRelease::Sent && !marked
    }
}
