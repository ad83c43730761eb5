//! The exact allreduce of a large buffer as a pipeline.
//!
//! The plain allreduce (`exact.rs`) sends each owner its whole shard, waits
//! for all of them, sums, and sends the whole sum back: the link idles
//! while the owner sums, the owner idles while the link moves, and every
//! call takes several shard-sized buffers of fresh memory, whose pages the
//! kernel zeroes on first touch. Here each shard travels in chunks of
//! [`PIPELINE_CHUNK_BYTES`]: an owner sums chunk `c` of its shard as soon
//! as every rank's part of it is in and sends it back at once, while the
//! next chunks are still arriving; its buffers are chunk-sized, which the
//! allocator reuses.
//!
//! Every link carries its messages in one order that both ends compute
//! ([`schedule`]): a rank's contributions run [`LAG`] chunks ahead of the
//! sums it returns. A rank waits only for a sum of a chunk that every rank
//! contributed to before waiting itself, so the pipeline cannot deadlock.
//! The sums are the plain allreduce's bit for bit: each owner combines
//! every rank's part in rank order, in `f32`, and rounds once. Only a
//! group whose first failure ends the collective pipelines
//! ([`OnRankFailure::pipelines_collectives`](super::OnRankFailure::pipelines_collectives)).

use super::shards::{copy_into, shard, to_bytes};
use super::{join_peers, paths, tag, Group, GroupError, Kind, ReduceOp};
use bytes::Bytes;
use gradlane_core::format::Element;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use tokio::sync::watch;

/// Bytes of one chunk's message: large enough that a message's fixed
/// costs vanish, small enough that summing one chunk overlaps moving the
/// next and that the allocator reuses the buffers.
pub(super) const PIPELINE_CHUNK_BYTES: usize = 1 << 20;

/// Chunks a rank contributes ahead of the sums it returns.
const LAG: usize = 2;

/// Whether an allreduce of `bytes` among `world` ranks is pipelined: where
/// a shard is more than one chunk.
pub(super) fn pipelines(bytes: usize, world: usize) -> bool {
    world > 1 && bytes / world > PIPELINE_CHUNK_BYTES
}

/// The chunks of every rank's shard of a buffer: as many for every shard
/// (a shorter shard's last may be empty), the same on every rank.
struct Chunks {
    shards: Vec<Range<usize>>,
    per: usize,
    count: usize,
}

impl Chunks {
    fn new(n: usize, world: usize, value_bytes: usize) -> Self {
        let shards: Vec<_> = (0..world).map(|r| shard(n, world, r)).collect();
        let per = (PIPELINE_CHUNK_BYTES / value_bytes.max(1)).max(1);
        let longest = shards.iter().map(|s| s.len()).max().unwrap_or(0);
        Self {
            shards,
            per,
            count: longest.div_ceil(per).max(1),
        }
    }

    /// Chunk `c` of `owner`'s shard, within that shard.
    fn local(&self, owner: usize, c: usize) -> Range<usize> {
        let len = self.shards[owner].len();
        (c * self.per).min(len)..((c + 1) * self.per).min(len)
    }
}

/// One message on a link, in the order both ends expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The sender's part of chunk `c` of the receiver's shard.
    Contribute(usize),
    /// The sum of chunk `c` of the sender's shard.
    Return(usize),
}

/// The order of the messages on every link of a pipeline of `count`
/// chunks: contributions [`LAG`] ahead of the sums.
fn schedule(count: usize) -> impl Iterator<Item = Step> {
    let interleaved = (0..count).flat_map(|c| {
        std::iter::once(Step::Contribute(c)).chain((c >= LAG).then(|| Step::Return(c - LAG)))
    });
    interleaved.chain((count.saturating_sub(LAG)..count).map(Step::Return))
}

/// This rank as the owner of its shard: the parts of each chunk as they
/// come in, and the sums, once made, for the links to send.
struct Owner<'a, T> {
    world: usize,
    op: ReduceOp,
    /// This rank's shard of the buffer: its own part in, the sum out.
    own: &'a mut [T],
    /// Each chunk's parts from the other ranks, by rank.
    parts: Vec<Vec<Option<Bytes>>>,
    /// Each chunk's parts not yet in.
    missing: Vec<usize>,
    /// The sums of the chunks made so far, until every link took them.
    sums: Vec<Option<Bytes>>,
    /// How many links took each sum.
    taken: Vec<usize>,
    acc: Vec<f32>,
    unaligned: Vec<T>,
    /// The number of sums made (they are made in chunk order).
    made: watch::Sender<usize>,
}

impl<T: Element> Owner<'_, T> {
    /// Rank `from`'s part of chunk `c` (`range` within the shard); sums the
    /// chunk once it holds every part.
    fn part(
        &mut self,
        from: usize,
        c: usize,
        range: Range<usize>,
        body: Bytes,
    ) -> Result<(), GroupError> {
        let want = range.len() * std::mem::size_of::<T>();
        if body.len() != want {
            return Err(GroupError::OutOfStep {
                rank: from,
                what: format!("a chunk of {} bytes, expected {want}", body.len()),
            });
        }
        self.parts[c][from] = Some(body);
        self.missing[c] -= 1;
        if self.missing[c] == 0 {
            self.sum(c, range);
        }
        Ok(())
    }

    /// Sums chunk `c` in rank order into the shard and keeps its bytes
    /// for the links.
    fn sum(&mut self, c: usize, range: Range<usize>) {
        let parts = std::mem::take(&mut self.parts[c]);
        self.acc.clear();
        self.acc.resize(range.len(), 0.0);
        for (r, part) in parts.iter().enumerate() {
            let values: &[T] = match part {
                None => &self.own[range.clone()],
                Some(body) => match bytemuck::try_cast_slice(body) {
                    Ok(values) => values,
                    // A striped message's bytes may sit at any offset.
                    Err(_) => {
                        self.unaligned.clear();
                        self.unaligned.resize(range.len(), T::zeroed());
                        bytemuck::cast_slice_mut::<T, u8>(&mut self.unaligned)
                            .copy_from_slice(body);
                        &self.unaligned
                    }
                },
            };
            self.op.fold(&mut self.acc, values, r == 0);
        }
        self.op.finish(&mut self.acc, self.world);
        gradlane_core::format::narrow(&self.acc, &mut self.own[range.clone()]);
        self.sums[c] = Some(to_bytes(&self.own[range]));
        self.made.send_replace(c + 1);
    }

    /// The sum of chunk `c` for one link; dropped once every link took it.
    fn take_sum(&mut self, c: usize) -> Bytes {
        self.taken[c] += 1;
        let sum = match self.taken[c] + 1 == self.world {
            true => self.sums[c].take(),
            false => self.sums[c].clone(),
        };
        sum.unwrap_or_default()
    }
}

impl Group {
    /// [`allreduce`](Group::allreduce)'s attempt for a buffer
    /// [`pipelines`] says is large: the same sums, pipelined in chunks.
    pub(super) async fn allreduce_pipelined<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), GroupError> {
        let (world, me) = (self.world, self.rank);
        let chunks = Chunks::new(buf.len(), world, std::mem::size_of::<T>());
        let contribute = tag(self.next_seq(), Kind::ReduceShard);
        let give_back = tag(self.next_seq(), Kind::ReducedShard);
        // Every rank's shard of the buffer on its own: a link reads the
        // peer's (this rank's parts of it) and writes it (the peer's sums),
        // never at once for one chunk (the sum comes after the part).
        let mut shards: Vec<Mutex<&mut [T]>> = Vec::with_capacity(world);
        let mut rest = &mut *buf;
        for r in 0..world {
            let (this, more) = rest.split_at_mut(chunks.shards[r].len());
            shards.push(Mutex::new(this));
            rest = more;
        }
        let own = std::mem::replace(&mut shards[me], Mutex::new(&mut [][..]));
        let (made, made_rx) = watch::channel(0usize);
        let owner = Mutex::new(Owner {
            world,
            op,
            own: own.into_inner().unwrap_or_else(|e| e.into_inner()),
            parts: vec![vec![None; world]; chunks.count],
            missing: vec![world - 1; chunks.count],
            sums: vec![None; chunks.count],
            taken: vec![0; chunks.count],
            acc: Vec::new(),
            unaligned: Vec::new(),
            made,
        });
        let heard: Vec<AtomicBool> = (0..world).map(|_| AtomicBool::new(false)).collect();
        let (owner, shards, chunks, heard_ref) = (&owner, &shards, &chunks, &heard);
        let halves = self
            .senders
            .iter_mut()
            .zip(self.receivers.iter_mut())
            .zip(self.stripes.iter_mut());
        let work = halves
            .enumerate()
            .filter_map(|(peer, ((sender, receiver), stripes))| {
                let (sender, receiver) = (sender.as_mut()?, receiver.as_mut()?);
                let mut made = made_rx.clone();
                Some(async move {
                    let failed = |source| GroupError::Rank { rank: peer, source };
                    let (mut senders, mut receivers) = paths::halves(stripes);
                    let send = async {
                        for step in schedule(chunks.count) {
                            let (t, body) = match step {
                                Step::Contribute(c) => {
                                    let shard = lock(&shards[peer]);
                                    (contribute, to_bytes(&shard[chunks.local(peer, c)]))
                                }
                                Step::Return(c) => {
                                    // The owner lives as long as this; a
                                    // closed channel cannot happen.
                                    let _ = made.wait_for(|&n| n > c).await;
                                    (give_back, lock(owner).take_sum(c))
                                }
                            };
                            paths::send_striped(sender, &mut senders, t, body)
                                .await
                                .map_err(failed)?;
                        }
                        Ok::<_, GroupError>(())
                    };
                    let receive = async {
                        for step in schedule(chunks.count) {
                            match step {
                                Step::Contribute(c) => {
                                    let body = paths::recv_striped(
                                        peer,
                                        receiver,
                                        &mut receivers,
                                        contribute,
                                    )
                                    .await?;
                                    lock(owner).part(peer, c, chunks.local(me, c), body)?;
                                }
                                Step::Return(c) => {
                                    let body = paths::recv_striped(
                                        peer,
                                        receiver,
                                        &mut receivers,
                                        give_back,
                                    )
                                    .await?;
                                    let mut shard = lock(&shards[peer]);
                                    let range = chunks.local(peer, c);
                                    copy_into(peer, &body, &mut shard[range], "a summed chunk")?;
                                }
                            }
                        }
                        heard_ref[peer].store(true, Ordering::Relaxed);
                        Ok::<_, GroupError>(())
                    };
                    tokio::try_join!(send, receive).map(drop)
                })
            });
        let deadline = self.running.map(|d| d.at);
        let waits = self.membership.policy.exchange_waits_for_every_peer();
        let ended = join_peers(waits, deadline, work).await;
        self.peers_ended(give_back, &heard, ended).map(drop)
    }
}

/// The lock of a mutex only this collective's futures take, one at a time
/// (they run on one task): never held across an await, never poisoned by
/// a panic that would not have ended the collective already.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contributions_run_ahead_and_every_chunk_comes_back_once() {
        for count in 1..8 {
            let steps: Vec<Step> = schedule(count).collect();
            assert_eq!(steps.len(), 2 * count);
            for c in 0..count {
                let at = |s| steps.iter().position(|&x| x == s).unwrap();
                let back = at(Step::Return(c));
                assert!(at(Step::Contribute(c)) < back);
                // The sum of c goes back only after the part of c + LAG (or
                // the last) went out: the receiver has it.
                let ahead = (c + LAG).min(count - 1);
                assert!(
                    at(Step::Contribute(ahead)) < back,
                    "count {count}, chunk {c}"
                );
            }
        }
    }

    #[test]
    fn chunks_cover_every_shard_in_order_with_one_count() {
        for (n, world) in [(0, 2), (1, 3), (10, 3), (1 << 20, 2), ((1 << 20) + 7, 3)] {
            let chunks = Chunks::new(n, world, 4);
            for r in 0..world {
                let mut next = 0;
                for c in 0..chunks.count {
                    let range = chunks.local(r, c);
                    assert_eq!(range.start, next);
                    assert!(range.len() <= chunks.per);
                    next = range.end;
                }
                assert_eq!(next, chunks.shards[r].len());
            }
        }
    }

    #[test]
    fn only_a_shard_of_more_than_one_chunk_is_pipelined() {
        assert!(!pipelines(100 << 20, 1));
        assert!(!pipelines(2 * PIPELINE_CHUNK_BYTES, 2));
        assert!(pipelines(2 * PIPELINE_CHUNK_BYTES + 2, 2));
    }
}
