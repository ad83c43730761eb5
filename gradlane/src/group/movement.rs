//! Data movement and typed reductions: gather, scatter, all-to-all, the
//! reductions over every element type ([`gradlane_core::typed`]),
//! reduce to one rank, and the monitored barrier.
//!
//! Each is a numbered collective of its own kinds on
//! [`exchange`](Group::exchange), which sends a distinct body to each rank
//! and receives from the ranks it names, inside
//! [`resilient`](Group::resilient) like the float collectives: the failure
//! policy and the collective timeout apply. The data movement moves bytes;
//! a rank's part for another is whatever length the caller gives, and
//! each rank gets what was sent to it (the caller checks lengths where
//! they must agree). Ranks are places in the current view, as the other
//! collectives number them; a `root` is a rank as it joined.

use super::deadline::Deadline;
use super::exact::world_sized;
use super::shards::shard;
use super::{tag, Group, GroupError, Kind};
use bytes::Bytes;
use gradlane_core::typed::{self, Dtype, Op};
use std::ops::Range;
use std::time::Duration;

impl Group {
    /// The place in the current view of `root` (a rank as it joined), or
    /// an error naming the members.
    fn root_place(&self, op: &str, root: usize) -> Result<usize, GroupError> {
        self.place_of(root).ok_or_else(|| {
            GroupError::Size(format!(
                "{op}: root {root} is not a member of the group (members {:?})",
                self.members()
            ))
        })
    }

    /// Sends `input` to `root`; returns, on `root`, every member's input in
    /// rank order (its own included), and on the others nothing. Inputs
    /// may differ in length.
    pub async fn gather(&mut self, root: usize, input: &[u8]) -> Result<Vec<Bytes>, GroupError> {
        self.resilient(
            "gather",
            &mut [0u8; 0],
            async |g: &mut Group, _: &mut [u8]| g.gather_once(root, input).await,
        )
        .await
    }

    async fn gather_once(&mut self, root: usize, input: &[u8]) -> Result<Vec<Bytes>, GroupError> {
        let root = self.root_place("gather", root)?;
        let t = tag(self.next_seq(), Kind::Gather);
        if self.rank != root {
            let mut out = vec![None; self.world];
            out[root] = Some(Bytes::copy_from_slice(input));
            self.exchange(t, out, &[]).await?;
            return Ok(Vec::new());
        }
        let from = self.others();
        let got = self.exchange(t, Vec::new(), &from).await?;
        Ok(got
            .into_iter()
            .map(|b| b.unwrap_or_else(|| Bytes::copy_from_slice(input)))
            .collect())
    }

    /// Sends `inputs[r]` from `root` to each member `r` (rank order; the
    /// root keeps its own) and returns this rank's part. `inputs` is read
    /// on `root` only, where it must hold one part per member.
    pub async fn scatter(&mut self, root: usize, inputs: &[&[u8]]) -> Result<Bytes, GroupError> {
        self.resilient(
            "scatter",
            &mut [0u8; 0],
            async |g: &mut Group, _: &mut [u8]| g.scatter_once(root, inputs).await,
        )
        .await
    }

    async fn scatter_once(&mut self, root: usize, inputs: &[&[u8]]) -> Result<Bytes, GroupError> {
        let root = self.root_place("scatter", root)?;
        if self.rank == root && inputs.len() != self.world {
            return Err(GroupError::Size(format!(
                "scatter from {} parts among {} members",
                inputs.len(),
                self.world
            )));
        }
        let t = tag(self.next_seq(), Kind::Scatter);
        if self.rank == root {
            let out = (0..self.world)
                .map(|r| (r != root).then(|| Bytes::copy_from_slice(inputs[r])))
                .collect();
            self.exchange(t, out, &[]).await?;
            return Ok(Bytes::copy_from_slice(inputs[root]));
        }
        let mut from = vec![false; self.world];
        from[root] = true;
        let mut got = self.exchange(t, Vec::new(), &from).await?;
        Ok(got[root].take().unwrap_or_default())
    }

    /// Sends `inputs[r]` to each member `r` and returns what each sent to
    /// this rank, in rank order (its own part included): every rank must
    /// give one part per member, of any lengths.
    pub async fn all_to_all(&mut self, inputs: &[&[u8]]) -> Result<Vec<Bytes>, GroupError> {
        self.resilient(
            "all_to_all",
            &mut [0u8; 0],
            async |g: &mut Group, _: &mut [u8]| g.all_to_all_once(inputs).await,
        )
        .await
    }

    async fn all_to_all_once(&mut self, inputs: &[&[u8]]) -> Result<Vec<Bytes>, GroupError> {
        if inputs.len() != self.world {
            return Err(GroupError::Size(format!(
                "all_to_all of {} parts among {} members",
                inputs.len(),
                self.world
            )));
        }
        let t = tag(self.next_seq(), Kind::AllToAll);
        let out = (0..self.world)
            .map(|r| (r != self.rank).then(|| Bytes::copy_from_slice(inputs[r])))
            .collect();
        let from = self.others();
        let got = self.exchange(t, out, &from).await?;
        let own = self.rank;
        Ok(got
            .into_iter()
            .map(|b| b.unwrap_or_else(|| Bytes::copy_from_slice(inputs[own])))
            .collect())
    }

    /// Reduces `buf` (native-endian values of `dtype`) across the ranks in
    /// place with `op`: each shard is combined in rank order by its owner
    /// in the type itself ([`typed::reduce`]: integers wrap, `f64` in
    /// `f64`), so every rank ends with the same bits. For `f32`, `bf16` and
    /// `f16` with sum, mean, max or min, [`allreduce`](Self::allreduce) is
    /// the same and takes the values typed.
    pub async fn allreduce_typed(
        &mut self,
        buf: &mut [u8],
        dtype: Dtype,
        op: Op,
    ) -> Result<(), GroupError> {
        check(buf.len(), dtype, op)?;
        self.resilient("allreduce", buf, async |g: &mut Group, buf: &mut [u8]| {
            g.allreduce_typed_once(buf, dtype, op, None).await
        })
        .await
    }

    /// Reduces `buf` as [`allreduce_typed`](Self::allreduce_typed) does,
    /// into `root`'s `buf` only: the shards are reduced by their owners,
    /// then sent to `root` alone. Every other rank's `buf` is left as it
    /// was.
    pub async fn reduce(
        &mut self,
        root: usize,
        buf: &mut [u8],
        dtype: Dtype,
        op: Op,
    ) -> Result<(), GroupError> {
        check(buf.len(), dtype, op)?;
        self.resilient("reduce", buf, async |g: &mut Group, buf: &mut [u8]| {
            let root = g.root_place("reduce", root)?;
            g.allreduce_typed_once(buf, dtype, op, Some(root)).await
        })
        .await
    }

    async fn allreduce_typed_once(
        &mut self,
        buf: &mut [u8],
        dtype: Dtype,
        op: Op,
        root: Option<usize>,
    ) -> Result<(), GroupError> {
        let size = dtype.size();
        let (n, world) = (buf.len() / size, self.world);
        let part = |r: usize| {
            let s = shard(n, world, r);
            s.start * size..s.end * size
        };
        let mut reduced = vec![0u8; part(self.rank).len()];
        self.typed_to_owners(buf, dtype, op, &mut reduced, part)
            .await?;
        let body = Bytes::from(reduced);
        let got = match root {
            // The reduced shards back to everyone.
            None => {
                let t = tag(self.next_seq(), Kind::TypedReducedShard);
                self.exchange_with_all(t, &body).await?
            }
            // To the root alone.
            Some(root) => {
                let t = tag(self.next_seq(), Kind::ReducedToRoot);
                if self.rank != root {
                    let mut out = vec![None; self.world];
                    out[root] = Some(body);
                    self.exchange(t, out, &[]).await?;
                    return Ok(());
                }
                let from = self.others();
                self.exchange(t, Vec::new(), &from).await?
            }
        };
        for (r, got) in got.iter().enumerate() {
            let got = got.as_ref().unwrap_or(&body);
            let range = part(r);
            if got.len() != range.len() {
                return Err(GroupError::OutOfStep {
                    rank: r,
                    what: format!(
                        "reduced shard of {} bytes, expected {}",
                        got.len(),
                        range.len()
                    ),
                });
            }
            buf[range].copy_from_slice(got);
        }
        Ok(())
    }

    /// Reduces `input` (one part of `output`'s length per member, in rank
    /// order, values of `dtype`) across the ranks: `output` on each member
    /// is the reduction of every member's part for it, in rank order, in
    /// the type itself.
    pub async fn reduce_scatter_typed(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        op: Op,
    ) -> Result<(), GroupError> {
        check(output.len(), dtype, op)?;
        self.resilient(
            "reduce_scatter",
            output,
            async |g: &mut Group, output: &mut [u8]| {
                let k = output.len();
                world_sized("reduce-scatter", "bytes", input.len(), k, g.world, false)?;
                g.typed_to_owners(input, dtype, op, output, |r| r * k..(r + 1) * k)
                    .await
            },
        )
        .await
    }

    /// The first half of a typed reduction: sends bytes `part(r)` of
    /// `input` to each rank `r`, and combines this rank's part of every
    /// rank's input, in rank order, into `out`.
    async fn typed_to_owners(
        &mut self,
        input: &[u8],
        dtype: Dtype,
        op: Op,
        out: &mut [u8],
        part: impl Fn(usize) -> Range<usize>,
    ) -> Result<(), GroupError> {
        let t = tag(self.next_seq(), Kind::TypedReduceShard);
        let msgs = (0..self.world)
            .map(|r| (r != self.rank).then(|| Bytes::copy_from_slice(&input[part(r)])))
            .collect();
        let from = self.others();
        let got = self.exchange(t, msgs, &from).await?;
        let own = &input[part(self.rank)];
        let mut parts = Vec::with_capacity(self.world);
        for (r, body) in got.iter().enumerate() {
            let body = body.as_deref().unwrap_or(own);
            if body.len() != own.len() {
                return Err(GroupError::OutOfStep {
                    rank: r,
                    what: format!("shard of {} bytes, expected {}", body.len(), own.len()),
                });
            }
            parts.push(body);
        }
        typed::reduce(dtype, op, &parts, out).map_err(|e| GroupError::Unsupported(e.to_string()))
    }

    /// A barrier that names the ranks that did not come: the lowest member
    /// waits for every other at most `timeout`, then lets them go. A rank
    /// it did not hear from in time is a [`GroupError::Timeout`] naming it
    /// (`missing`: all of them) there, and the others' wait for the lowest
    /// ends at the same bound. With
    /// [`OnRankFailure::Fail`](super::OnRankFailure::Fail) the group is
    /// then unusable, as after any timeout; with
    /// [`OnRankFailure::Continue`](super::OnRankFailure::Continue) the
    /// ranks that stayed away are removed, as dead ones are, and the
    /// barrier passes among the rest (the others wait longer:
    /// [`OnRankFailure::monitored_barrier_wait`](super::OnRankFailure::monitored_barrier_wait)).
    /// As gloo's `monitoredBarrier`.
    pub async fn monitored_barrier(&mut self, timeout: Duration) -> Result<(), GroupError> {
        self.resilient(
            "monitored_barrier",
            &mut [0u8; 0],
            async |g: &mut Group, _: &mut [u8]| g.monitored_barrier_once(timeout).await,
        )
        .await
    }

    async fn monitored_barrier_once(&mut self, timeout: Duration) -> Result<(), GroupError> {
        // Its own bound, not the group's collective timeout.
        let bound = self
            .membership
            .policy
            .monitored_barrier_wait(self.rank, timeout);
        let saved = self.running;
        self.running = Some(Deadline {
            op: "monitored_barrier",
            at: tokio::time::Instant::now() + bound,
            after: timeout,
        });
        let result = self.monitored_exchanges().await;
        self.running = saved;
        result
    }

    async fn monitored_exchanges(&mut self) -> Result<(), GroupError> {
        let arrive = tag(self.next_seq(), Kind::MonitoredArrive);
        let release = tag(self.next_seq(), Kind::MonitoredRelease);
        let lowest = 0;
        let mut only_lowest = vec![false; self.world];
        only_lowest[lowest] = true;
        if self.rank == lowest {
            let from = self.others();
            self.exchange(arrive, Vec::new(), &from).await?;
            let out = self.to_others(&Bytes::new());
            self.exchange(release, out, &[]).await?;
        } else {
            let out = only_lowest.iter().map(|&l| l.then(Bytes::new)).collect();
            self.exchange(arrive, out, &[]).await?;
            self.exchange(release, Vec::new(), &only_lowest).await?;
        }
        Ok(())
    }
}

/// A typed reduction's buffer and op, checked before anything is sent.
fn check(len: usize, dtype: Dtype, op: Op) -> Result<(), GroupError> {
    typed::check(dtype, op).map_err(|e| GroupError::Unsupported(e.to_string()))?;
    if len % dtype.size() != 0 {
        return Err(GroupError::Size(format!(
            "{len} bytes are not a whole number of {dtype} values"
        )));
    }
    Ok(())
}
