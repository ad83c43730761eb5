//! Placement: a packet is checked whole, then each segment's values are
//! decoded straight into its open round, at their byte position, once
//! duplicates and chunks claimed by another class are ruled out.

use super::open_round::{check_important, NO_CLASS};
use super::{Channel, PushOutcome, Reassembler, ReassemblyError};
use crate::classify::IMPORTANT;
use crate::format::read_elements;
use crate::layout::ChunkPlan;
use crate::payload;
use crate::wire::{self, id_digest, DataHeader, Segment, WireError};

impl Reassembler {
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

    pub(super) fn check_layout(&self, got: u16) -> Result<(), ReassemblyError> {
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
    pub(super) fn place(
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
}

/// Decodes a validated and checked payload, `head` then `rest`, into `dst`
/// (its values). Only element formats are ever cut into a head and a rest
/// (a stream piece that completes a value the previous piece cut); a
/// `Log8` payload comes whole, in `rest`.
pub(super) fn decode_payload(
    plan: &ChunkPlan,
    h: &DataHeader,
    (head, rest): (&[u8], &[u8]),
    dst: &mut [f32],
) {
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
