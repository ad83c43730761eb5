//! What the receiver counts: per class for each delivered round, what it
//! refused since it was made, and what one push did.

use crate::wire::CLASS_SLOTS;

/// Per-class counts of one delivered round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassStats {
    /// Chunks the sender sent in this class.
    pub sent_chunks: u64,
    /// Payload bytes the sender sent in this class.
    pub sent_bytes: u64,
    /// Packets the sender sent in this class.
    pub sent_packets: u64,
    /// Chunks held whole at delivery.
    pub received_chunks: u64,
    /// Payload bytes held at delivery.
    pub received_bytes: u64,
    /// Chunks of which only part was held (the rest zero-filled).
    pub partial_chunks: u64,
    /// Bytes sent but not held at delivery: delivered as zeros.
    pub zero_filled_bytes: u64,
    /// Bytes of earlier rounds' late segments added into this round.
    pub late_merged_bytes: u64,
    /// Late segments of earlier rounds added into this round.
    pub late_merged_segments: u64,
}

/// What the receiver refused or ignored, counted since it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReceiverCounters {
    /// Packets refused as malformed (bad header, wrong layout, wrong
    /// channel), and segments claiming a second class for a chunk.
    pub malformed: u64,
    /// Segments whose bytes were already held.
    pub duplicates: u64,
    /// Late segments kept for merging into the next round.
    pub late_buffered: u64,
    /// Late segments dropped because the late buffer was full.
    pub late_dropped_full: u64,
    /// Payload bytes dropped because the late buffer was full.
    pub late_dropped_bytes: u64,
    /// Segments of rounds delivered longer ago than the late window.
    pub too_old: u64,
    /// Segments of new rounds dropped because too many rounds were open.
    pub too_many_open: u64,
    /// Rounds skipped over (a later round was delivered first); their data
    /// was discarded.
    pub abandoned_rounds: u64,
    /// Payload bytes discarded with abandoned rounds.
    pub abandoned_bytes: u64,
    /// Round ends of rounds that were skipped over, or delivered longer
    /// ago than the late window, ignored (a sender that gave a round up
    /// while its streams ran on).
    pub stale_ends: u64,
}

/// Statistics of one delivered round.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RoundStats {
    /// Per class: index 0 important, `l` lossy level `l`.
    pub classes: [ClassStats; CLASS_SLOTS],
    /// Lossy levels the sender used.
    pub levels: u8,
    /// Late bytes merged into this round, by the round they belonged to.
    pub late_from: Vec<(u32, u64)>,
    /// The receiver's counters at delivery (cumulative).
    pub counters: ReceiverCounters,
}

impl RoundStats {
    /// Sums the lossy levels.
    pub fn lossy(&self) -> ClassStats {
        let mut s = ClassStats::default();
        for c in &self.classes[1..] {
            s.sent_chunks += c.sent_chunks;
            s.sent_bytes += c.sent_bytes;
            s.sent_packets += c.sent_packets;
            s.received_chunks += c.received_chunks;
            s.received_bytes += c.received_bytes;
            s.partial_chunks += c.partial_chunks;
            s.zero_filled_bytes += c.zero_filled_bytes;
            s.late_merged_bytes += c.late_merged_bytes;
            s.late_merged_segments += c.late_merged_segments;
        }
        s
    }
}

/// What [`Reassembler::push`] did with a packet.
///
/// [`Reassembler::push`]: super::Reassembler::push
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PushOutcome {
    /// Segments placed into an open round.
    pub accepted: u32,
    /// Segments of delivered rounds kept for the next one.
    pub late: u32,
    /// Segments ignored as duplicates.
    pub duplicates: u32,
    /// Segments dropped for a limit (late buffer, window, open rounds).
    pub dropped: u32,
    /// A round this packet completed: its end and every important chunk it
    /// announces are now held (the end may have come first, on another
    /// lane).
    pub completed: Option<u32>,
}
