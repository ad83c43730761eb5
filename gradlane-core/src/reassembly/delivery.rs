//! Delivery: a complete round handed over with zeros where nothing arrived
//! and late bytes of earlier rounds added in, its statistics filled in and
//! its bitmap kept a few rounds to catch late duplicates.

use super::open_round::NO_CLASS;
use super::{Bitmap, Reassembler, ReassemblyError, RoundStats};

/// A delivered round: the rebuilt tensors, in layout order, and what happened.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// Round index.
    pub index: u32,
    /// The sender's layout id ([`ReassemblyConfig::layout_id`]).
    ///
    /// [`ReassemblyConfig::layout_id`]: super::ReassemblyConfig::layout_id
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

impl Reassembler {
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
        self.merge_late(&mut r.tensors, &mut stats);
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
