//! A rank's report after a bounded return (a differentiated allreduce
//! whose return half has a deadline): what every rank must know to end
//! with the same bits.
//!
//! With a bounded return an owner sends its summed shard as a round, its
//! least important chunks lossy; a chunk that missed the deadline at any
//! rank is zero-filled at every rank, and the owner adds its sum into its
//! next call. So after the return every rank sends every other one
//! report: as the owner of its shard, the chunks of each rank's part
//! that did not arrive in the first half (that rank's lost chunks); and,
//! as a receiver, the chunks of each owner's return it did not get.
//!
//! The layout: `[u32 world]`, then for each rank `[u32 count][u32 id;
//! count]` (the local ids, in the report's own shard, of that rank's lost
//! chunks), then for each owner `[u32 count][u32 id; count]` (the local
//! ids, in that owner's shard, of the return chunks this rank missed).
//! Ids ascend within a list; every id is checked against its shard's
//! chunk count before anything is allocated.

use super::error::ranks_reader;
use super::GroupMessageError;
use crate::bytes::Short;

const MESSAGE: &str = "return report";

/// The report of a rank: `lost[r]` lists rank `r`'s chunks of this rank's
/// shard that did not arrive in the first half; `missed[o]` the chunks of
/// owner `o`'s return this rank did not get in time (ids local to each
/// shard, ascending).
pub fn encode_return_report(lost: &[Vec<u32>], missed: &[Vec<u32>]) -> Vec<u8> {
    let ids: usize = lost.iter().chain(missed).map(Vec::len).sum();
    let mut out = Vec::with_capacity(4 + 4 * (lost.len() + missed.len()) + 4 * ids);
    out.extend_from_slice(&(lost.len() as u32).to_le_bytes());
    for list in lost.iter().chain(missed) {
        out.extend_from_slice(&(list.len() as u32).to_le_bytes());
        for id in list {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
    out
}

/// A peer's report, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReturnReport {
    /// This reader's chunks of the reporter's shard that did not arrive in
    /// the first half (local to the reporter's shard).
    pub lost: Vec<u32>,
    /// By owner: the chunks of that owner's return the reporter missed.
    pub missed: Vec<Vec<u32>>,
}

impl ReturnReport {
    /// Reads the report of rank `from` for rank `me` of `world`, whose
    /// shards have `chunks[r]` chunks: anything but what
    /// [`encode_return_report`] writes for that group is an error.
    pub fn parse(
        (me, from, world): (usize, usize, usize),
        message: &[u8],
        chunks: &[usize],
    ) -> Result<Self, GroupMessageError> {
        let short = |_: Short| GroupMessageError::Truncated {
            message: MESSAGE,
            len: message.len(),
        };
        if chunks.len() != world || me >= world || from >= world {
            return Err(GroupMessageError::ChunkPlan);
        }
        let mut r = ranks_reader(message, MESSAGE, world)?;
        let mut list = |of_shard: usize, what: &'static str| {
            let count = r.u32().map_err(short)? as usize;
            // `take` checks the bytes are there: a count alone allocates
            // nothing.
            let bytes = r.take(count.saturating_mul(4)).map_err(short)?;
            let mut ids: Vec<u32> = Vec::with_capacity(count);
            for id in bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            {
                if id as usize >= chunks[of_shard] || ids.last().is_some_and(|&last| id <= last) {
                    return Err(GroupMessageError::Chunk {
                        what,
                        id: id as usize,
                        chunks: chunks[of_shard],
                    });
                }
                ids.push(id);
            }
            Ok(ids)
        };
        let mut lost = Vec::new();
        for q in 0..world {
            let ids = list(from, "lost")?;
            if q == me {
                lost = ids;
            }
        }
        let mut missed = Vec::with_capacity(world);
        for owner in 0..world {
            missed.push(list(owner, "missed")?);
        }
        r.finish()
            .map_err(|_| GroupMessageError::Trailing { message: MESSAGE })?;
        Ok(Self { lost, missed })
    }
}

/// The union of the reports' misses of one owner's return: ascending,
/// each id once.
pub fn missed_by_any<'a>(lists: impl IntoIterator<Item = &'a [u32]>) -> Vec<u32> {
    let mut all: Vec<u32> = lists.into_iter().flatten().copied().collect();
    all.sort_unstable();
    all.dedup();
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_back_as_written_for_each_reader() {
        let lost = vec![vec![], vec![0, 3], vec![1]];
        let missed = vec![vec![2], vec![], vec![0, 4]];
        let m = encode_return_report(&lost, &missed);
        let chunks = [5, 4, 5];
        for (me, mine) in lost.iter().enumerate() {
            let got = ReturnReport::parse((me, 1, 3), &m, &chunks).unwrap();
            assert_eq!(&got.lost, mine);
            assert_eq!(got.missed, missed);
        }
    }

    #[test]
    fn bad_reports_are_errors_not_panics() {
        let chunks = [2, 2];
        let good = encode_return_report(&[vec![1], vec![]], &[vec![0], vec![1]]);
        assert!(ReturnReport::parse((0, 1, 2), &good, &chunks).is_ok());
        // Every truncation, a trailing byte, another world, an id out of
        // its shard or out of order.
        for cut in 0..good.len() {
            assert!(
                ReturnReport::parse((0, 1, 2), &good[..cut], &chunks).is_err(),
                "{cut}"
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert!(ReturnReport::parse((0, 1, 2), &long, &chunks).is_err());
        assert!(ReturnReport::parse((0, 1, 3), &good, &[2, 2, 2]).is_err());
        let out_of_shard = encode_return_report(&[vec![2], vec![]], &[vec![], vec![]]);
        assert!(ReturnReport::parse((0, 1, 2), &out_of_shard, &chunks).is_err());
        let unordered = encode_return_report(&[vec![], vec![]], &[vec![1, 0], vec![]]);
        assert!(ReturnReport::parse((0, 1, 2), &unordered, &chunks).is_err());
        // A count that claims more ids than the message holds allocates
        // nothing and is an error.
        let mut huge = 2u32.to_le_bytes().to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(ReturnReport::parse((0, 1, 2), &huge, &chunks).is_err());
        // A reader outside the group, or a plan of another size, is the
        // caller's mistake, still an error.
        assert!(ReturnReport::parse((2, 1, 2), &good, &chunks).is_err());
        assert!(ReturnReport::parse((0, 1, 2), &good, &[2]).is_err());
    }

    #[test]
    fn the_union_holds_every_miss_once_in_order() {
        let a: &[u32] = &[3, 5];
        let b: &[u32] = &[1, 3];
        assert_eq!(missed_by_any([a, b, &[][..]]), vec![1, 3, 5]);
    }
}
