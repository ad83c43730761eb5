//! A round being rebuilt: its tensors and bitmap (reused from delivered
//! rounds), what it holds per chunk and class, and its round end, with the
//! check that it holds exactly the important chunks the end announces.

use super::{Bitmap, Reassembler, ReassemblyError};
use crate::classify::Class;
use crate::wire::{RoundEnd, CLASS_SLOTS};

#[derive(Debug)]
pub(super) struct OpenRound {
    pub(super) tensors: Vec<Vec<f32>>,
    pub(super) seen: Bitmap,
    /// Bytes held per chunk.
    pub(super) chunk_bytes: Vec<u32>,
    /// Class per chunk as first claimed; `NO_CLASS` before any byte.
    pub(super) chunk_class: Vec<Class>,
    pub(super) received_chunks: [u64; CLASS_SLOTS],
    pub(super) received_bytes: [u64; CLASS_SLOTS],
    pub(super) important_digest: u64,
    pub(super) end: Option<RoundEnd>,
    /// The end is in and every important chunk it announces is held.
    pub(super) complete: bool,
}

pub(super) const NO_CLASS: Class = u8::MAX;

impl Reassembler {
    pub(super) fn new_round(&mut self) -> OpenRound {
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
    pub(super) fn end_round(&mut self, end: RoundEnd) -> Result<bool, ReassemblyError> {
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
}

/// Whether round `r` holds exactly the important chunks `end` announces:
/// `Ok(false)` while some are still to come, an error once it holds more
/// than announced or, at the announced count, other chunks or bytes.
pub(super) fn check_important(r: &OpenRound, end: &RoundEnd) -> Result<bool, ReassemblyError> {
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
