//! The receiver's state machine: buffers, completion, zero fill, late merge
//! (CN110958187B, step S35; docs/DESIGN.md §2.6).
//!
//! Segments are pushed in any order, from the reliable stream or from
//! datagrams. Each open round owns zeroed tensors; every received byte range
//! is copied in place, so whatever never arrives stays zero. A round is
//! *complete* once its [`RoundEnd`] has arrived and every important chunk it
//! announces is held — checked by count, bytes and an id digest, not assumed.
//! The important part may come on several streams at once (lanes), so the
//! round end may arrive before the last important chunks do: it is then kept
//! and the round completes when the count is reached; holding more than it
//! announces, or the wrong chunks, is an error.
//! The caller (the transport, which owns the clock) then [`delivers`] it,
//! perhaps after a grace period for datagrams in flight.
//!
//! A segment of a round already delivered is *late*: it is kept (in a buffer
//! bounded in bytes) and added element-wise into the next round delivered —
//! the delayed update of the published design. A byte range already received is a
//! duplicate and ignored; that is tracked with one bit per value, kept for a
//! few rounds after delivery so that late duplicates are caught too.
//!
//! Nothing is dropped silently: every refusal has a counter in
//! [`ReceiverCounters`].
//!
//! [`delivers`]: Reassembler::deliver

use crate::classify::{Class, IMPORTANT};
use crate::format::read_elements;
use crate::layout::{ChunkOptions, ChunkPlan, Layout, LayoutError};
use crate::payload;
use crate::wire::{
    self, id_digest, DataHeader, Head, RoundEnd, Segment, WireError, CLASS_SLOTS, ROUND_END_LEN,
};
use std::collections::{BTreeMap, VecDeque};
use thiserror::Error;

/// Receiver-side limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReassemblyConfig {
    /// How tensors are cut into chunks; must match the sender's.
    pub chunking: ChunkOptions,
    /// Most rounds buffered at once; a segment that would open one more is
    /// dropped and counted. Each open round holds a full copy of the model.
    pub max_open_rounds: usize,
    /// Most payload bytes of late segments kept for the next round.
    pub late_buffer_bytes: usize,
    /// How many delivered rounds still accept late segments.
    pub late_window: u32,
    /// The layout id the sender writes into every segment (see
    /// [`EncoderConfig::layout_id`](crate::encode::EncoderConfig)); a
    /// segment of another layout is refused.
    pub layout_id: u16,
}

impl Default for ReassemblyConfig {
    fn default() -> Self {
        Self {
            chunking: ChunkOptions::default(),
            max_open_rounds: 3,
            late_buffer_bytes: 64 << 20,
            late_window: 4,
            layout_id: 0,
        }
    }
}

/// Which channel a packet came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// The reliable, ordered stream.
    Reliable,
    /// An unreliable datagram.
    Lossy,
}

/// Why the receiver refused input or a request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReassemblyError {
    /// A segment could not be decoded or does not fit the layout.
    #[error("malformed segment: {0}")]
    Wire(#[from] WireError),
    /// The layout cannot be chunked with these options.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Important data or a round end came as a datagram.
    #[error("{0} arrived on the lossy channel")]
    WrongChannel(&'static str),
    /// A segment of another layout than this receiver's.
    #[error("a segment of layout {got} reached the receiver of layout {expected}")]
    WrongLayout {
        /// This receiver's layout id.
        expected: u16,
        /// The segment's.
        got: u16,
    },
    /// A second round end for one round.
    #[error("round {0} ended twice")]
    DuplicateEnd(u32),
    /// A second round end for a round already delivered (and still in
    /// the late window).
    #[error("round end for round {0}, which was already delivered")]
    EndAfterDelivery(u32),
    /// The round end's important digest or bytes differ from what is held.
    #[error("round {0}: important chunks held differ from those announced")]
    ImportantMismatch(u32),
    /// Deliver was asked for a round that is not complete.
    #[error("round {0} is not complete")]
    NotComplete(u32),
    /// A stream decoder was fed again after refusing its input.
    #[error("the stream already failed")]
    StreamBroken,
    /// Deliver was asked for a round at or below the last delivered one.
    #[error("round {round} is not after the last delivered round {last}")]
    AlreadyDelivered {
        /// The round asked for.
        round: u32,
        /// The last delivered round.
        last: u32,
    },
}

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

/// A delivered round: the rebuilt tensors, in layout order, and what happened.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// Round index.
    pub index: u32,
    /// The sender's layout id ([`ReassemblyConfig::layout_id`]).
    pub layout: u16,
    /// One vector per tensor of the layout; missing bytes are zeros, late
    /// bytes of earlier rounds are added in.
    pub tensors: Vec<Vec<f32>>,
    /// Counts per class.
    pub stats: RoundStats,
    /// The chunks (ids of the layout's chunk plan, increasing) with bytes
    /// that did not arrive in time: zero-filled, in part or whole.
    pub missing_chunks: Vec<u32>,
}

/// What [`Reassembler::push`] did with a packet.
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

/// One bit per value of the model.
#[derive(Debug, Clone)]
struct Bitmap(Vec<u64>);

impl Bitmap {
    fn new(bits: u64) -> Self {
        Bitmap(vec![0; bits.div_ceil(64) as usize])
    }

    /// The words covering `[start, start+len)` (`len > 0`) as (first word,
    /// last word, mask of the first, mask of the last). A segment covers
    /// hundreds of words and every received byte passes here: the words in
    /// between are whole and handled as a slice, which vectorizes.
    fn span(start: u64, len: u64) -> (usize, usize, u64, u64) {
        let end = start + len;
        let first = (start / 64) as usize;
        let last = ((end - 1) / 64) as usize;
        let head = !0u64 << (start % 64);
        let tail = !0u64 >> (63 - (end - 1) % 64);
        (first, last, head, tail)
    }

    /// Whether any bit of `[start, start+len)` is set.
    fn any(&self, start: u64, len: u64) -> bool {
        if len == 0 {
            return false;
        }
        let (first, last, head, tail) = Self::span(start, len);
        if first == last {
            return self.0[first] & head & tail != 0;
        }
        let middle = self.0[first + 1..last].iter().fold(0, |acc, w| acc | w);
        (self.0[first] & head) | middle | (self.0[last] & tail) != 0
    }

    /// Sets every bit of `[start, start+len)`.
    fn set(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (first, last, head, tail) = Self::span(start, len);
        if first == last {
            self.0[first] |= head & tail;
            return;
        }
        self.0[first] |= head;
        self.0[first + 1..last].fill(!0);
        self.0[last] |= tail;
    }
}

#[derive(Debug)]
struct OpenRound {
    tensors: Vec<Vec<f32>>,
    seen: Bitmap,
    /// Bytes held per chunk.
    chunk_bytes: Vec<u32>,
    /// Class per chunk as first claimed; `NO_CLASS` before any byte.
    chunk_class: Vec<Class>,
    received_chunks: [u64; CLASS_SLOTS],
    received_bytes: [u64; CLASS_SLOTS],
    important_digest: u64,
    end: Option<RoundEnd>,
    /// The end is in and every important chunk it announces is held.
    complete: bool,
}

const NO_CLASS: Class = u8::MAX;

#[derive(Debug)]
struct LateSegment {
    round: u32,
    class: Class,
    tensor: u32,
    offset: u32,
    values: Vec<f32>,
}

/// Decodes a validated and checked payload, `head` then `rest`, into `dst`
/// (its values). Only element formats are ever cut into a head and a rest
/// (a stream piece that completes a value the previous piece cut); a
/// `Log8` payload comes whole, in `rest`.
fn decode_payload(plan: &ChunkPlan, h: &DataHeader, (head, rest): (&[u8], &[u8]), dst: &mut [f32]) {
    match h.format.element_bytes() {
        Some(b) => {
            let (dst_head, dst_rest) = dst.split_at_mut(head.len() / b);
            read_elements(h.format, head, dst_head);
            read_elements(h.format, rest, dst_rest);
        }
        None => payload::read(
            h.format,
            plan,
            h.tensor as usize,
            h.first_value(),
            rest,
            dst,
        ),
    }
}

/// Sets to zero every value of `tensor` (whose first value is bit `base`
/// of `seen`) that `seen` does not mark as received. Whole words of 64
/// received values are skipped at once, so a complete round costs one scan
/// of the bitmap.
fn zero_unseen(seen: &Bitmap, base: u64, tensor: &mut [f32]) {
    let len = tensor.len() as u64;
    let mut i = 0u64;
    while i < len {
        let g = base + i;
        let word = seen.0[(g / 64) as usize];
        let bit = g % 64;
        if bit == 0 && i + 64 <= len {
            match word {
                u64::MAX => {}
                0 => tensor[i as usize..i as usize + 64].fill(0.0),
                w => {
                    for b in 0..64 {
                        if (w >> b) & 1 == 0 {
                            tensor[(i + b) as usize] = 0.0;
                        }
                    }
                }
            }
            i += 64;
            continue;
        }
        if (word >> bit) & 1 == 0 {
            tensor[i as usize] = 0.0;
        }
        i += 1;
    }
}

/// Rebuilds rounds from segments; see the module docs.
#[derive(Debug)]
pub struct Reassembler {
    layout: Layout,
    plan: ChunkPlan,
    config: ReassemblyConfig,
    open: BTreeMap<u32, OpenRound>,
    last_delivered: Option<u32>,
    /// Bitmaps of recently delivered rounds, oldest first.
    recent: VecDeque<(u32, Bitmap)>,
    late: Vec<LateSegment>,
    late_bytes: usize,
    counters: ReceiverCounters,
    /// Tensor sets handed back by the caller, reused for new rounds: fresh
    /// memory costs a page fault per 4 KiB on first write, which is slower
    /// than clearing memory already mapped.
    spare_tensors: Vec<Vec<Vec<f32>>>,
    spare_bitmaps: Vec<Bitmap>,
}

impl Reassembler {
    /// A receiver for `layout`.
    pub fn new(layout: Layout, config: ReassemblyConfig) -> Result<Self, ReassemblyError> {
        let plan = layout.plan(config.chunking)?;
        Ok(Self {
            layout,
            plan,
            config: ReassemblyConfig {
                max_open_rounds: config.max_open_rounds.max(1),
                ..config
            },
            open: BTreeMap::new(),
            last_delivered: None,
            recent: VecDeque::new(),
            late: Vec::new(),
            late_bytes: 0,
            counters: ReceiverCounters::default(),
            spare_tensors: Vec::new(),
            spare_bitmaps: Vec::new(),
        })
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The chunk plan.
    pub fn plan(&self) -> &ChunkPlan {
        &self.plan
    }

    /// What was refused or ignored so far.
    pub fn counters(&self) -> ReceiverCounters {
        self.counters
    }

    /// The last delivered round.
    pub fn last_delivered(&self) -> Option<u32> {
        self.last_delivered
    }

    /// Payload bytes in the late buffer now.
    pub fn late_buffered_bytes(&self) -> usize {
        self.late_bytes
    }

    /// Rounds open now.
    pub fn open_rounds(&self) -> impl Iterator<Item = u32> + '_ {
        self.open.keys().copied()
    }

    /// Takes one packet: a datagram or a run of stream segments.
    ///
    /// The whole packet is decoded and checked before anything is applied, so
    /// a malformed packet changes nothing but the `malformed` counter.
    pub fn push(
        &mut self,
        packet: &[u8],
        channel: Channel,
    ) -> Result<PushOutcome, ReassemblyError> {
        let mut segments: Vec<Segment<'_>> = Vec::new();
        if let Err(e) = self.check_packet(packet, channel, &mut segments) {
            self.counters.malformed += 1;
            return Err(e);
        }
        let mut out = PushOutcome::default();
        for seg in segments {
            match seg {
                Segment::Data(h, payload) => self.place(h, &[], payload, &mut out)?,
                Segment::RoundEnd(end) => {
                    if self.end_round(end)? {
                        out.completed = Some(end.round);
                    }
                }
            }
        }
        Ok(out)
    }

    /// For an open round: lossy payload bytes held so far, and once its end
    /// is in, how many the sender sent. Lets the transport stop waiting for
    /// datagrams as soon as all have come.
    ///
    /// Bytes, not datagrams: a sender may cut a datagram into several when
    /// the path's limit shrinks after the round was framed, so the round
    /// end's packet count can be reached while pieces are still on the way.
    /// Duplicates add no bytes.
    pub fn lossy_progress(&self, round: u32) -> Option<(u64, Option<u64>)> {
        let r = self.open.get(&round)?;
        let sent = r.end.map(|e| e.bytes[1..].iter().sum());
        Some((r.received_bytes[1..].iter().sum(), sent))
    }

    fn check_packet<'a>(
        &self,
        packet: &'a [u8],
        channel: Channel,
        segments: &mut Vec<Segment<'a>>,
    ) -> Result<(), ReassemblyError> {
        if packet.is_empty() {
            return Err(WireError::Truncated {
                need: wire::PREFIX_LEN,
                have: 0,
            }
            .into());
        }
        for seg in wire::decode_all(packet) {
            let seg = seg?;
            match (&seg, channel) {
                (Segment::RoundEnd(_), Channel::Lossy) => {
                    return Err(ReassemblyError::WrongChannel("a round end"))
                }
                (Segment::Data(h, _), Channel::Lossy) if h.class == IMPORTANT => {
                    return Err(ReassemblyError::WrongChannel("important data"))
                }
                (Segment::Data(h, payload), _) => {
                    self.check_layout(h.layout)?;
                    h.validate(&self.plan)?;
                    payload::check(
                        h.format,
                        &self.plan,
                        h.tensor as usize,
                        h.first_value(),
                        payload,
                    )
                    .map_err(WireError::from)?;
                }
                (Segment::RoundEnd(end), _) => self.check_layout(end.layout)?,
            }
            segments.push(seg);
        }
        Ok(())
    }

    fn check_layout(&self, got: u16) -> Result<(), ReassemblyError> {
        match got == self.config.layout_id {
            true => Ok(()),
            false => Err(ReassemblyError::WrongLayout {
                expected: self.config.layout_id,
                got,
            }),
        }
    }

    fn global_value(&self, h: &DataHeader) -> u64 {
        self.layout.value_offset(h.tensor as usize) + h.byte_offset as u64 / 4
    }

    /// How many values a validated and checked segment whose payload is
    /// `head` followed by `rest` carries.
    fn value_count(&self, h: &DataHeader, head: &[u8], rest: &[u8]) -> u64 {
        match h.format.element_bytes() {
            Some(b) => ((head.len() + rest.len()) / b) as u64,
            None => h.values(&self.plan).unwrap_or(0) as u64,
        }
    }

    /// Places a validated segment whose payload is `head` followed by
    /// `rest` (a stream piece that completes a value the previous piece cut
    /// is placed as that value and the piece's whole values, in one go).
    /// Fails only when it is important data beyond what the round's end
    /// (already in) announces.
    fn place(
        &mut self,
        h: DataHeader,
        head: &[u8],
        rest: &[u8],
        out: &mut PushOutcome,
    ) -> Result<(), ReassemblyError> {
        let start = self.global_value(&h);
        let n = self.value_count(&h, head, rest);
        if n == 0 {
            return Ok(());
        }
        if self.last_delivered.is_some_and(|d| h.round <= d) {
            self.place_late(h, head, rest, start, n, out);
            return Ok(());
        }
        if !self.open.contains_key(&h.round) {
            if self.open.len() >= self.config.max_open_rounds {
                self.counters.too_many_open += 1;
                out.dropped += 1;
                return Ok(());
            }
            let fresh = self.new_round();
            self.open.insert(h.round, fresh);
        }
        let Some(r) = self.open.get_mut(&h.round) else {
            return Ok(());
        };
        if r.seen.any(start, n) {
            self.counters.duplicates += 1;
            out.duplicates += 1;
            return Ok(());
        }
        // Every chunk the range touches must keep the class it was first
        // given: one chunk cannot be both important and lossy in a round.
        let chunks = self.plan.chunks();
        let end = h.byte_offset + 4 * n as u32;
        let last = self.plan.chunk_at(h.tensor as usize, end - 4);
        let ids = h.chunk as usize..=last.unwrap_or(h.chunk as usize);
        if ids
            .clone()
            .any(|id| r.chunk_class[id] != NO_CLASS && r.chunk_class[id] != h.class)
        {
            self.counters.malformed += 1;
            out.dropped += 1;
            return Ok(());
        }
        let class = h.class as usize;
        r.seen.set(start, n);
        let t = h.tensor as usize;
        let off = h.byte_offset as usize / 4;
        decode_payload(
            &self.plan,
            &h,
            (head, rest),
            &mut r.tensors[t][off..off + n as usize],
        );
        r.received_bytes[class] += n * 4;
        let (mut id, mut byte) = (h.chunk as usize, h.byte_offset);
        while byte < end {
            let c = &chunks[id];
            let upto = (c.byte_start() + c.byte_len()).min(end);
            if r.chunk_class[id] == NO_CLASS {
                r.chunk_class[id] = h.class;
            }
            r.chunk_bytes[id] += upto - byte;
            if r.chunk_bytes[id] == c.byte_len() {
                r.received_chunks[r.chunk_class[id] as usize] += 1;
                if r.chunk_class[id] == IMPORTANT {
                    r.important_digest = r.important_digest.wrapping_add(id_digest(id as u32));
                }
            }
            byte = upto;
            id += 1;
        }
        out.accepted += 1;
        // The round's end came first, on another lane: this may be the
        // last important chunk it waits for.
        if h.class == IMPORTANT && !r.complete {
            if let Some(end) = r.end {
                if check_important(r, &end)? {
                    r.complete = true;
                    out.completed = Some(h.round);
                }
            }
        }
        Ok(())
    }

    fn place_late(
        &mut self,
        h: DataHeader,
        head: &[u8],
        rest: &[u8],
        start: u64,
        n: u64,
        out: &mut PushOutcome,
    ) {
        let bytes = n as usize * 4;
        let Some((_, seen)) = self.recent.iter_mut().find(|(r, _)| *r == h.round) else {
            self.counters.too_old += 1;
            out.dropped += 1;
            return;
        };
        if seen.any(start, n) {
            self.counters.duplicates += 1;
            out.duplicates += 1;
            return;
        }
        if self.late_bytes + bytes > self.config.late_buffer_bytes {
            self.counters.late_dropped_full += 1;
            self.counters.late_dropped_bytes += bytes as u64;
            out.dropped += 1;
            return;
        }
        seen.set(start, n);
        let mut values = vec![0f32; n as usize];
        decode_payload(&self.plan, &h, (head, rest), &mut values);
        self.late_bytes += bytes;
        self.late.push(LateSegment {
            round: h.round,
            class: h.class,
            tensor: h.tensor,
            offset: h.byte_offset,
            values,
        });
        self.counters.late_buffered += 1;
        out.late += 1;
    }

    fn new_round(&mut self) -> OpenRound {
        let tensors = match self.spare_tensors.pop() {
            // Not cleared here: `deliver` zeroes exactly the values that
            // never arrived, which for a whole round is none (clearing ~100
            // MB up front cost a pass over memory, in the receive path).
            Some(t) => t,
            // vec![0.0; n] comes from zeroed pages.
            None => (0..self.layout.len())
                .map(|t| vec![0f32; self.layout.tensor_len(t)])
                .collect(),
        };
        let seen = match self.spare_bitmaps.pop() {
            Some(mut b) => {
                b.0.fill(0);
                b
            }
            None => Bitmap::new(self.layout.total_values()),
        };
        OpenRound {
            tensors,
            seen,
            chunk_bytes: vec![0; self.plan.len()],
            chunk_class: vec![NO_CLASS; self.plan.len()],
            received_chunks: [0; CLASS_SLOTS],
            received_bytes: [0; CLASS_SLOTS],
            important_digest: 0,
            end: None,
            complete: false,
        }
    }

    /// Hands a delivered round's tensors back for reuse by a later round,
    /// which saves mapping fresh memory every round. Tensors that do not
    /// match the layout are refused (returned), so a mix-up cannot corrupt a
    /// round.
    pub fn recycle(&mut self, tensors: Vec<Vec<f32>>) -> Result<(), Vec<Vec<f32>>> {
        let fits = tensors.len() == self.layout.len()
            && tensors
                .iter()
                .enumerate()
                .all(|(t, v)| v.len() == self.layout.tensor_len(t));
        if !fits || self.spare_tensors.len() >= self.config.max_open_rounds {
            return Err(tensors);
        }
        self.spare_tensors.push(tensors);
        Ok(())
    }

    /// Records the end of a round's important data; returns whether every
    /// important chunk it announces is held (if not, the round completes
    /// when the last one comes, see [`check_important`]).
    fn end_round(&mut self, end: RoundEnd) -> Result<bool, ReassemblyError> {
        if self.last_delivered.is_some_and(|d| end.round <= d) {
            // A second end for a delivered round: the peer is broken.
            if self.recent.iter().any(|(r, _)| *r == end.round) {
                return Err(ReassemblyError::EndAfterDelivery(end.round));
            }
            // The end of a round skipped over: its sender gave it up (a
            // cancelled `send_round`) while its streams ran on, and the
            // next round overtook it. Nothing to do with it.
            self.counters.stale_ends += 1;
            return Ok(false);
        }
        if !self.open.contains_key(&end.round) {
            if self.open.len() >= self.config.max_open_rounds {
                // The stream is ordered and flow-controlled: a round end can
                // only outrun delivery if the caller stopped delivering.
                self.counters.too_many_open += 1;
                return Err(ReassemblyError::NotComplete(end.round));
            }
            let fresh = self.new_round();
            self.open.insert(end.round, fresh);
        }
        let Some(r) = self.open.get_mut(&end.round) else {
            return Ok(false);
        };
        if r.end.is_some() {
            return Err(ReassemblyError::DuplicateEnd(end.round));
        }
        r.complete = check_important(r, &end)?;
        r.end = Some(end);
        Ok(r.complete)
    }

    /// True when round `round` has its end and every important chunk.
    pub fn is_complete(&self, round: u32) -> bool {
        self.open.get(&round).is_some_and(|r| r.complete)
    }

    /// The lowest complete round, if any: the next one to deliver.
    pub fn next_complete(&self) -> Option<u32> {
        self.open.iter().find(|(_, r)| r.complete).map(|(&i, _)| i)
    }

    /// Delivers a complete round: its tensors with zeros where nothing
    /// arrived, plus every buffered late segment added in. Open rounds
    /// below it are abandoned (counted).
    pub fn deliver(&mut self, round: u32) -> Result<Round, ReassemblyError> {
        if let Some(last) = self.last_delivered.filter(|&d| round <= d) {
            return Err(ReassemblyError::AlreadyDelivered { round, last });
        }
        if !self.is_complete(round) {
            return Err(ReassemblyError::NotComplete(round));
        }
        let _span = tracing::debug_span!("deliver", round).entered();
        let below: Vec<u32> = self.open.range(..round).map(|(&i, _)| i).collect();
        for q in below {
            if let Some(r) = self.open.remove(&q) {
                self.counters.abandoned_rounds += 1;
                self.counters.abandoned_bytes += r.received_bytes.iter().sum::<u64>();
            }
        }
        let Some(mut r) = self.open.remove(&round) else {
            return Err(ReassemblyError::NotComplete(round));
        };
        let Some(end) = r.end.filter(|_| r.complete) else {
            return Err(ReassemblyError::NotComplete(round));
        };
        let mut stats = RoundStats {
            levels: end.levels,
            ..Default::default()
        };
        for (c, s) in stats.classes.iter_mut().enumerate() {
            s.sent_chunks = end.chunks[c] as u64;
            s.sent_bytes = end.bytes[c];
            s.sent_packets = end.packets[c] as u64;
            s.received_chunks = r.received_chunks[c];
            s.received_bytes = r.received_bytes[c];
            s.zero_filled_bytes = end.bytes[c].saturating_sub(r.received_bytes[c]);
        }
        let mut missing_chunks = Vec::new();
        for (id, &class) in r.chunk_class.iter().enumerate() {
            if r.chunk_bytes[id] < self.plan.chunks()[id].byte_len() {
                missing_chunks.push(id as u32);
                if class != NO_CLASS {
                    stats.classes[class as usize].partial_chunks += 1;
                }
            }
        }
        // Recycled tensors still hold an older round where nothing arrived.
        for (t, tensor) in r.tensors.iter_mut().enumerate() {
            zero_unseen(&r.seen, self.layout.value_offset(t), tensor);
        }
        for seg in self.late.drain(..) {
            let t = &mut r.tensors[seg.tensor as usize];
            let off = seg.offset as usize / 4;
            for (d, v) in t[off..off + seg.values.len()].iter_mut().zip(&seg.values) {
                *d += v;
            }
            let bytes = seg.values.len() as u64 * 4;
            let s = &mut stats.classes[seg.class as usize];
            s.late_merged_bytes += bytes;
            s.late_merged_segments += 1;
            match stats.late_from.iter_mut().find(|(o, _)| *o == seg.round) {
                Some((_, b)) => *b += bytes,
                None => stats.late_from.push((seg.round, bytes)),
            }
        }
        self.late_bytes = 0;
        self.last_delivered = Some(round);
        self.recent.push_back((round, r.seen));
        while self.recent.len() > self.config.late_window as usize {
            if let Some((_, b)) = self.recent.pop_front() {
                if self.spare_bitmaps.len() < self.config.max_open_rounds {
                    self.spare_bitmaps.push(b);
                }
            }
        }
        stats.counters = self.counters;
        Ok(Round {
            index: round,
            layout: self.config.layout_id,
            tensors: r.tensors,
            stats,
            missing_chunks,
        })
    }
}

/// Feeds one round's reliable stream into a [`Reassembler`] in whatever
/// pieces the transport hands over (QUIC gives one packet's worth at a
/// time), placing payload bytes straight from those pieces into the round:
/// a segment may straddle any number of pieces, and only a header or a
/// value cut by a piece boundary is ever copied aside.
///
/// A segment's header is decoded and validated in full before any of its
/// payload is placed; the payload then lands fragment by fragment, each
/// fragment being a valid segment of its own (its own byte position and
/// holding chunk), so the round ends up exactly as if the segments had been
/// pushed whole. [`PushOutcome`] counts fragments, not segments. After an
/// error the stream is broken and the decoder refuses further input.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    /// The start of a header cut by a piece boundary.
    head: Vec<u8>,
    /// The data segment whose payload is arriving.
    payload: Option<Payload>,
    /// A previous input was refused.
    failed: bool,
    /// The allocation `Payload::whole` gathers `Log8` payloads in, kept
    /// between segments.
    gathered: Vec<u8>,
}

#[derive(Debug)]
struct Payload {
    header: DataHeader,
    /// Payload bytes consumed so far (placed, or waiting in `carry`).
    consumed: u32,
    /// The first bytes of a value cut by a piece boundary.
    carry: [u8; 4],
    carry_len: usize,
    /// A `Log8` payload, gathered whole before it is checked and placed
    /// (its sections' scales and codes are read together; a lossy segment
    /// is at most a datagram long, and any segment at most
    /// [`MAX_SEGMENT_PAYLOAD`](crate::wire::MAX_SEGMENT_PAYLOAD)).
    whole: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// True between segments: a stream that ends here ends cleanly.
    pub fn at_boundary(&self) -> bool {
        self.head.is_empty() && self.payload.is_none()
    }

    /// Decodes the next piece of the stream into `rx`.
    pub fn feed(
        &mut self,
        rx: &mut Reassembler,
        piece: &[u8],
    ) -> Result<PushOutcome, ReassemblyError> {
        let mut out = PushOutcome::default();
        if self.failed {
            return Err(ReassemblyError::StreamBroken);
        }
        match self.feed_inner(rx, piece, &mut out) {
            Ok(()) => Ok(out),
            Err(e) => {
                self.failed = true;
                if matches!(e, ReassemblyError::Wire(_)) {
                    rx.counters.malformed += 1;
                }
                Err(e)
            }
        }
    }

    fn feed_inner(
        &mut self,
        rx: &mut Reassembler,
        mut bytes: &[u8],
        out: &mut PushOutcome,
    ) -> Result<(), ReassemblyError> {
        while !bytes.is_empty() {
            if let Some(p) = &mut self.payload {
                let h = p.header;
                let Some(e) = h.format.element_bytes() else {
                    let take = (h.payload_len as usize - p.whole.len()).min(bytes.len());
                    p.whole.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if p.whole.len() == h.payload_len as usize {
                        let mut whole = std::mem::take(&mut p.whole);
                        self.payload = None;
                        let t = h.tensor as usize;
                        let placed = payload::check(h.format, &rx.plan, t, h.first_value(), &whole)
                            .map_err(|e| ReassemblyError::from(WireError::from(e)))
                            .and_then(|()| rx.place(h, &[], &whole, out));
                        whole.clear();
                        self.gathered = whole;
                        placed?;
                    }
                    continue;
                };
                // A piece boundary may cut a value (QUIC frames end at any
                // byte): a cut value waits in `carry` and is placed with
                // the next piece's whole values, as one fragment.
                let mut head = 0;
                if p.carry_len > 0 {
                    let take = (e - p.carry_len).min(bytes.len());
                    for (c, b) in p.carry[p.carry_len..].iter_mut().zip(&bytes[..take]) {
                        *c = *b;
                    }
                    p.carry_len += take;
                    p.consumed += take as u32;
                    bytes = &bytes[take..];
                    if p.carry_len < e {
                        // The piece was shorter than the cut value's rest.
                        continue;
                    }
                    p.carry_len = 0;
                    head = e;
                }
                let n = ((h.payload_len - p.consumed) as usize).min(bytes.len());
                let whole = n - n % e;
                if head + whole > 0 {
                    // Wire bytes before this fragment, as f32 positions.
                    let before = (p.consumed as usize - head) / e * 4;
                    let offset = h.byte_offset + before as u32;
                    let fragment = h.fragment(&rx.plan, offset, (head + whole) as u32);
                    let carried = p.carry;
                    rx.place(fragment, &carried[..head], &bytes[..whole], out)?;
                }
                for (c, b) in p.carry.iter_mut().zip(&bytes[whole..n]) {
                    *c = *b;
                }
                p.carry_len = n - whole;
                p.consumed += n as u32;
                bytes = &bytes[n..];
                if p.consumed == h.payload_len && p.carry_len == 0 {
                    self.payload = None;
                }
                continue;
            }
            if self.head.is_empty() {
                // Decode the header in place when the piece holds all of it.
                if let Some(len) = wire::head_len(bytes)? {
                    if bytes.len() >= len {
                        self.start_segment(rx, &bytes[..len], out)?;
                        bytes = &bytes[len..];
                        continue;
                    }
                }
                // Headers are at most a round end long.
                let take = bytes.len().min(ROUND_END_LEN);
                self.head.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                continue;
            }
            // Complete a cut header from this piece: first its prefix, which
            // tells its length, then the rest.
            let want = wire::head_len(&self.head)?.unwrap_or(wire::PREFIX_LEN);
            let take = want.saturating_sub(self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if wire::head_len(&self.head)? == Some(self.head.len()) {
                let head = std::mem::take(&mut self.head);
                let started = self.start_segment(rx, &head, out);
                // Keep the allocation for the next cut header.
                self.head = head;
                self.head.clear();
                started?;
            }
        }
        Ok(())
    }

    /// Takes a decoded header: a round end is applied, a data header is
    /// validated and its payload awaited.
    fn start_segment(
        &mut self,
        rx: &mut Reassembler,
        head: &[u8],
        out: &mut PushOutcome,
    ) -> Result<(), ReassemblyError> {
        match wire::decode_head(head)?.0 {
            Head::RoundEnd(end) => {
                rx.check_layout(end.layout)?;
                if rx.end_round(end)? {
                    out.completed = Some(end.round);
                }
            }
            Head::Data(h) => {
                rx.check_layout(h.layout)?;
                h.validate(&rx.plan)?;
                self.payload = Some(Payload {
                    header: h,
                    consumed: 0,
                    carry: [0; 4],
                    carry_len: 0,
                    whole: std::mem::take(&mut self.gathered),
                });
            }
        }
        Ok(())
    }
}

/// Whether round `r` holds exactly the important chunks `end` announces:
/// `Ok(false)` while some are still to come, an error once it holds more
/// than announced or, at the announced count, other chunks or bytes.
fn check_important(r: &OpenRound, end: &RoundEnd) -> Result<bool, ReassemblyError> {
    let held = r.received_chunks[0];
    let want = end.chunks[0] as u64;
    let bytes = r.received_bytes[0];
    if held > want || bytes > end.bytes[0] {
        return Err(ReassemblyError::ImportantMismatch(end.round));
    }
    if held < want {
        return Ok(false);
    }
    if r.important_digest != end.important_digest || bytes != end.bytes[0] {
        return Err(ReassemblyError::ImportantMismatch(end.round));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::Bitmap;
    use proptest::prelude::*;

    proptest! {
        /// `any` and `set` agree with one bool per bit, for ranges that
        /// start, end and span words anywhere.
        #[test]
        fn bitmap_matches_a_bool_per_bit(
            ops in prop::collection::vec((0u64..300, 0u64..200), 1..40)
        ) {
            let bits = 512;
            let mut map = Bitmap::new(bits);
            let mut model = vec![false; bits as usize];
            for (start, len) in ops {
                let len = len.min(bits - start);
                let range = start as usize..(start + len) as usize;
                prop_assert_eq!(map.any(start, len), model[range.clone()].iter().any(|&b| b));
                map.set(start, len);
                model[range].fill(true);
                for (i, &b) in model.iter().enumerate() {
                    prop_assert_eq!(map.0[i / 64] >> (i % 64) & 1 == 1, b, "bit {}", i);
                }
            }
        }
    }
}
