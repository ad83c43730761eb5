//! Planning: a classed round cut into segments and datagrams before a byte
//! is written. Adjacent chunks of one tensor in one class form runs; the
//! stream cuts them only at the segment limit, datagrams are filled up to
//! the path's limit. The round end follows from the plan alone.

use crate::classify::{Class, IMPORTANT};
use crate::format::{ClassFormats, ValueFormat};
use crate::layout::ChunkPlan;
use crate::payload;
use crate::wire::{
    id_digest, DataHeader, RoundEnd, CLASS_SLOTS, DATA_HEADER_LEN, MAX_SEGMENT_PAYLOAD,
};

/// A fragment shorter than this is not started at the tail of a datagram;
/// the datagram is closed instead, so headers never outweigh payload.
const MIN_FRAGMENT: usize = 128;

/// A segment to write: `len` bytes of the `f32` tensor `tensor` at
/// `offset` (positions), which take `wire` bytes in the segment's format.
#[derive(Debug, Clone, Copy)]
pub(super) struct Piece {
    pub(super) tensor: u32,
    pub(super) offset: u32,
    pub(super) len: u32,
    pub(super) wire: u32,
}

/// A round cut into segments: per class, the segments in order and
/// (for the lossy classes) where each datagram ends, and the round end
/// that describes them.
pub(super) struct SegmentPlan {
    pub(super) end: RoundEnd,
    pub(super) segments: Vec<Vec<Piece>>,
    /// `packet_ends[c]` lists where each packet of class `c` ends, as a
    /// count of segments.
    pub(super) packet_ends: Vec<Vec<usize>>,
}

/// Cuts a classed round into segments: adjacent chunks of one tensor with
/// the same class form runs; runs are cut on the stream only at the
/// segment limit, in datagrams so as to fill each one up (in wire bytes of
/// the class's format).
pub(super) fn plan_segments(
    plan: &ChunkPlan,
    (layout, round): (u16, u32),
    classes: &[Class],
    (levels, formats): (u8, ClassFormats),
    max_datagram: usize,
) -> SegmentPlan {
    let mut end = RoundEnd {
        layout,
        round,
        levels,
        ..Default::default()
    };
    // Runs per class: adjacent chunks of one tensor with the same class.
    let mut runs: Vec<Vec<Piece>> = vec![Vec::new(); CLASS_SLOTS];
    for (id, (chunk, &class)) in plan.chunks().iter().zip(classes).enumerate() {
        let c = class as usize;
        end.chunks[c] += 1;
        end.bytes[c] += chunk.byte_len() as u64;
        if class == IMPORTANT {
            end.important_digest = end.important_digest.wrapping_add(id_digest(id as u32));
        }
        match runs[c].last_mut() {
            Some(r) if r.tensor == chunk.tensor && r.offset + r.len == chunk.byte_start() => {
                r.len += chunk.byte_len();
            }
            _ => runs[c].push(Piece {
                tensor: chunk.tensor,
                offset: chunk.byte_start(),
                len: chunk.byte_len(),
                wire: 0,
            }),
        }
    }

    // Cut runs into segments: on the stream only at the segment limit, in
    // datagrams to fill each one up.
    let mut segments: Vec<Vec<Piece>> = vec![Vec::new(); CLASS_SLOTS];
    let mut packet_ends: Vec<Vec<usize>> = vec![Vec::new(); CLASS_SLOTS];
    let wire = |format, p: &Piece| {
        payload::wire_len(format, plan, p.tensor as usize, p.offset / 4, p.len / 4) as u32
    };
    for r in &runs[IMPORTANT as usize] {
        let (mut off, mut rem) = (r.offset, r.len);
        while rem > 0 {
            let n = rem.min(MAX_SEGMENT_PAYLOAD);
            let mut p = Piece {
                tensor: r.tensor,
                offset: off,
                len: n,
                wire: 0,
            };
            p.wire = wire(formats.important, &p);
            segments[0].push(p);
            off += n;
            rem -= n;
        }
    }
    end.packets[0] = segments[0].len() as u32;
    let max = max_datagram.min(DATA_HEADER_LEN + MAX_SEGMENT_PAYLOAD as usize);
    let format = formats.lossy;
    for c in 1..CLASS_SLOTS {
        let (segs, ends) = (&mut segments[c], &mut packet_ends[c]);
        let mut used = 0usize;
        for r in &runs[c] {
            let t = r.tensor as usize;
            let (mut first, mut rem) = (r.offset / 4, r.len / 4);
            while rem > 0 {
                let avail = max.saturating_sub(used + DATA_HEADER_LEN);
                let fit = payload::values_within(format, plan, t, first, rem, avail);
                let take = if fit == rem {
                    rem
                } else if fit > 0
                    && (used == 0 || payload::wire_len(format, plan, t, first, fit) >= MIN_FRAGMENT)
                {
                    fit
                } else if used > 0 {
                    ends.push(segs.len());
                    used = 0;
                    continue;
                } else {
                    // Not even one value fits an empty datagram: the limit
                    // is below MIN_DATAGRAM, which callers check. Send one
                    // value over the limit rather than loop.
                    1
                };
                let mut p = Piece {
                    tensor: r.tensor,
                    offset: first * 4,
                    len: take * 4,
                    wire: 0,
                };
                p.wire = wire(format, &p);
                used += DATA_HEADER_LEN + p.wire as usize;
                segs.push(p);
                first += take;
                rem -= take;
            }
        }
        if used > 0 {
            ends.push(segs.len());
        }
        end.packets[c] = ends.len() as u32;
    }
    SegmentPlan {
        end,
        segments,
        packet_ends,
    }
}

/// The header of the segment that carries piece `p` of class `class` in
/// `format`.
pub(super) fn piece_header(
    plan: &ChunkPlan,
    (layout, round): (u16, u32),
    (class, format): (Class, ValueFormat),
    p: &Piece,
) -> DataHeader {
    let t = p.tensor as usize;
    let span = plan.tensor_chunks(t);
    DataHeader {
        layout,
        class,
        format,
        round,
        tensor: p.tensor,
        // Pieces start inside the tensor, so a holder always exists.
        chunk: plan.chunk_at(t, p.offset).unwrap_or(span.start) as u32,
        first_chunk: span.start as u32,
        last_chunk: span.end as u32 - 1,
        tensor_bytes: plan.tensor_bytes(t),
        byte_offset: p.offset,
        payload_len: p.wire,
    }
}
