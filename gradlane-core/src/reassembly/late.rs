//! Late segments: those of a round already delivered, kept in a buffer
//! bounded in bytes and added element-wise into the next round delivered.

use super::placement::decode_payload;
use super::{PushOutcome, Reassembler, RoundStats};
use crate::classify::Class;
use crate::wire::DataHeader;

#[derive(Debug)]
pub(super) struct LateSegment {
    round: u32,
    class: Class,
    tensor: u32,
    offset: u32,
    values: Vec<f32>,
}

impl Reassembler {
    pub(super) fn place_late(
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

    /// Adds every buffered late segment into `tensors`, those of the round
    /// being delivered, and counts them in its `stats`; the buffer is left
    /// empty.
    pub(super) fn merge_late(&mut self, tensors: &mut [Vec<f32>], stats: &mut RoundStats) {
        for seg in self.late.drain(..) {
            let t = &mut tensors[seg.tensor as usize];
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
    }
}
