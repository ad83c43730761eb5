//! The exact collectives, on the links' exact messages.
//!
//! A reduction is a reduce-scatter followed by an allgather of the reduced
//! shards: rank `r` owns shard `r`, receives every other rank's part of it,
//! combines the parts in rank order and sends the result back to everyone.
//! Each rank sends `2 (N-1) / N` of the buffer, and every rank ends with
//! the owner's bits. A buffer of `bf16` or `f16` travels as itself (two
//! bytes a value); the owner combines in `f32` and rounds once.

use super::shards::{copy_into, shard, to_bytes};
use super::{tag, Group, GroupError, Kind, ReduceOp};
use bytes::Bytes;
use gradlane_core::format::Element;
use std::ops::Range;

impl Group {
    /// Returns once every rank has called `barrier`.
    pub async fn barrier(&mut self) -> Result<(), GroupError> {
        self.resilient(
            "barrier",
            &mut [0u8; 0],
            async |g: &mut Group, _: &mut [u8]| g.barrier_once().await,
        )
        .await
    }

    async fn barrier_once(&mut self) -> Result<(), GroupError> {
        let t = tag(self.next_seq(), Kind::Barrier);
        let out = self.others().iter().map(|&o| o.then(Bytes::new)).collect();
        let from = self.others();
        self.exchange(t, out, &from).await?;
        Ok(())
    }

    /// Makes `buf` on every rank equal to `buf` on `root`. Every rank's
    /// `buf` must have the same length. A `root` that is no longer a
    /// member is an error, but with
    /// [`OnRankFailure::Continue`](super::OnRankFailure::Continue), where
    /// the lowest member stands in for it
    /// ([`OnRankFailure::broadcast_root`](super::OnRankFailure::broadcast_root)).
    pub async fn broadcast(&mut self, root: usize, buf: &mut [f32]) -> Result<(), GroupError> {
        self.resilient("broadcast", buf, async |g: &mut Group, buf: &mut [f32]| {
            g.broadcast_once(root, buf).await
        })
        .await
    }

    async fn broadcast_once(&mut self, root: usize, buf: &mut [f32]) -> Result<(), GroupError> {
        let Some(root) = self.membership.policy.broadcast_root(self.place_of(root)) else {
            return Err(GroupError::Size(format!(
                "root {root} is not a member of the group (members {:?})",
                self.members()
            )));
        };
        let t = tag(self.next_seq(), Kind::Broadcast);
        if self.rank == root {
            let body = to_bytes(buf);
            let out = self.to_others(&body);
            self.exchange(t, out, &[]).await?;
        } else {
            let mut from = vec![false; self.world];
            from[root] = true;
            let got = self.exchange(t, Vec::new(), &from).await?;
            let body = got[root].as_deref().unwrap_or_default();
            copy_into(root, body, buf, "broadcast")?;
        }
        Ok(())
    }

    /// Gathers every member's `input` into `output`, in rank order:
    /// `output` holds [`members`](Self::members)`().len()` times `input`'s
    /// length.
    pub async fn allgather(&mut self, input: &[f32], output: &mut [f32]) -> Result<(), GroupError> {
        self.resilient(
            "allgather",
            output,
            async |g: &mut Group, output: &mut [f32]| g.allgather_once(input, output).await,
        )
        .await
    }

    async fn allgather_once(
        &mut self,
        input: &[f32],
        output: &mut [f32],
    ) -> Result<(), GroupError> {
        let n = input.len();
        world_sized("allgather", "values", n, output.len(), self.world, true)?;
        let t = tag(self.next_seq(), Kind::Allgather);
        let body = to_bytes(input);
        let got = self.exchange_with_all(t, &body).await?;
        for (r, part) in output.chunks_mut(n.max(1)).enumerate().take(self.world) {
            match &got[r] {
                Some(body) => copy_into(r, body, &mut part[..n], "allgather")?,
                None => part[..n].copy_from_slice(input),
            }
        }
        Ok(())
    }

    /// Reduces `buf` (`f32`, [`bf16`](crate::bf16) or [`f16`](crate::f16))
    /// across the ranks in place: every rank ends with the same bits (each
    /// shard combined by its owner in rank order, in `f32`, and rounded
    /// once to the buffer's type).
    pub async fn allreduce<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), GroupError> {
        self.resilient("allreduce", buf, async |g: &mut Group, buf: &mut [T]| {
            g.allreduce_once(buf, op).await
        })
        .await
    }

    async fn allreduce_once<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), GroupError> {
        let large = super::pipelined::pipelines(std::mem::size_of_val(buf), self.world);
        if large && self.membership.policy.pipelines_collectives() {
            return self.allreduce_pipelined(buf, op).await;
        }
        let n = buf.len();
        let own = shard(n, self.world, self.rank);
        let mut reduced = vec![T::zeroed(); own.len()];
        let world = self.world;
        self.reduce_to_owners(buf, op, &mut reduced, |r| shard(n, world, r))
            .await?;
        // The reduced shards back to everyone.
        let t = tag(self.next_seq(), Kind::ReducedShard);
        let body = to_bytes(&reduced);
        let got = self.exchange_with_all(t, &body).await?;
        for (r, body) in got.iter().enumerate() {
            let range = shard(n, self.world, r);
            match body {
                Some(body) => copy_into(r, body, &mut buf[range], "reduced shard")?,
                None => buf[range].copy_from_slice(&reduced),
            }
        }
        Ok(())
    }

    /// Reduces `input` (one part of `output`'s length per member, in rank
    /// order) across the ranks: `output` on each member is the reduction
    /// of every member's part for it, combined in rank order in `f32` and
    /// rounded once to the type.
    pub async fn reduce_scatter<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), GroupError> {
        self.resilient(
            "reduce_scatter",
            output,
            async |g: &mut Group, output: &mut [T]| g.reduce_scatter_once(input, output, op).await,
        )
        .await
    }

    async fn reduce_scatter_once<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), GroupError> {
        let k = output.len();
        world_sized(
            "reduce-scatter",
            "values",
            input.len(),
            k,
            self.world,
            false,
        )?;
        self.reduce_to_owners(input, op, output, |r| r * k..(r + 1) * k)
            .await
    }

    /// The first half of a reduction: sends part `part(r)` of `input` to
    /// each rank `r`, and combines this rank's part of every rank's input,
    /// in rank order, into `out`.
    async fn reduce_to_owners<T: Element>(
        &mut self,
        input: &[T],
        op: ReduceOp,
        out: &mut [T],
        part: impl Fn(usize) -> Range<usize>,
    ) -> Result<(), GroupError> {
        let t = tag(self.next_seq(), Kind::ReduceShard);
        let out_msgs = (0..self.world)
            .map(|r| (r != self.rank).then(|| to_bytes(&input[part(r)])))
            .collect();
        let from = self.others();
        let got = self.exchange(t, out_msgs, &from).await?;
        let own = part(self.rank);
        let mut contribution = vec![T::zeroed(); own.len()];
        let mut acc = vec![0f32; own.len()];
        for (r, body) in got.iter().enumerate() {
            let values: &[T] = match body {
                Some(body) => {
                    copy_into(r, body, &mut contribution, "shard")?;
                    &contribution
                }
                None => &input[own.clone()],
            };
            op.fold(&mut acc, values, r == 0);
        }
        op.finish(&mut acc, self.world);
        gradlane_core::format::narrow(&acc, out);
        Ok(())
    }
}

/// `Err(Size)` unless the longer of a collective's `input` and `output`
/// (the output when it `gathers`) holds one of the shorter per rank of
/// `world`; `unit` names what the lengths count.
pub(super) fn world_sized(
    what: &str,
    unit: &str,
    input: usize,
    output: usize,
    world: usize,
    gathers: bool,
) -> Result<(), GroupError> {
    let (part, whole) = if gathers {
        (input, output)
    } else {
        (output, input)
    };
    if whole == part * world {
        return Ok(());
    }
    Err(GroupError::Size(format!(
        "{what} of {input} {unit} into {output} (needs {})",
        part * world
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn world_sized_names_the_lengths_and_what_was_needed() {
        assert!(world_sized("allgather", "values", 3, 12, 4, true).is_ok());
        assert!(world_sized("reduce-scatter", "bytes", 12, 3, 4, false).is_ok());
        let Err(GroupError::Size(gather)) = world_sized("allgather", "values", 3, 10, 4, true)
        else {
            panic!("an allgather into too little is refused")
        };
        assert_eq!(gather, "allgather of 3 values into 10 (needs 12)");
        let Err(GroupError::Size(scatter)) =
            world_sized("reduce-scatter", "bytes", 10, 3, 4, false)
        else {
            panic!("a reduce-scatter of the wrong size is refused")
        };
        assert_eq!(scatter, "reduce-scatter of 10 bytes into 3 (needs 12)");
    }
}
