//! The sparse allgather with count negotiation (Baidu, "分布式训练方法、
//! 梯度通信方法"; docs/DESIGN.md §4).
//!
//! A sparse gradient is a set of rows of a `height × width` matrix (an
//! embedding's gradient touches only the rows of the ids in the batch).
//! Phase 1 exchanges every rank's row count. Phase 2 moves the rows and
//! their values:
//! - all counts equal: one allgather of the row indexes and one of the
//!   values, into buffers sized exactly from the counts;
//! - counts differ: either an allgatherv (every rank's rows and values in
//!   one message to each other rank, placed from the counts), or each rank
//!   broadcasting its rows and values in rank order (PaddlePaddle's choice).
//!
//! The result holds every rank's rows and values in rank order;
//! [`SparseRows::sum_duplicates`] sums rows that several ranks hold.

use super::shards::{copy_into, to_bytes};
use super::{tag, Group, GroupError, Kind};
use bytes::Bytes;
use gradlane_core::group::SparseShape;

/// Rows of a `height × width` matrix: row `rows[i]` holds
/// `values[i * width..(i + 1) * width]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseRows {
    /// Rows of the full matrix.
    pub height: u64,
    /// Values per row.
    pub width: usize,
    /// The row indexes present, each below `height`.
    pub rows: Vec<u64>,
    /// `rows.len() * width` values, row by row.
    pub values: Vec<f32>,
}

impl SparseRows {
    /// Checks the shape: values fill the rows, every row is in range.
    pub fn check(&self) -> Result<(), GroupError> {
        if self.values.len() != self.rows.len() * self.width {
            return Err(GroupError::Size(format!(
                "{} rows of width {} need {} values, not {}",
                self.rows.len(),
                self.width,
                self.rows.len() * self.width,
                self.values.len()
            )));
        }
        if let Some(r) = self.rows.iter().find(|&&r| r >= self.height) {
            return Err(GroupError::Size(format!(
                "row {r} is outside a height of {}",
                self.height
            )));
        }
        Ok(())
    }

    /// The same matrix with each row once, in increasing order, duplicate
    /// rows summed in the order they appear (so every rank that sums the
    /// same gathered rows gets the same bits).
    pub fn sum_duplicates(&self) -> SparseRows {
        let w = self.width;
        let mut order: Vec<usize> = (0..self.rows.len()).collect();
        // Stable: duplicates keep the order they appear in.
        order.sort_by_key(|&i| self.rows[i]);
        let mut rows: Vec<u64> = Vec::new();
        let mut values: Vec<f32> = Vec::new();
        for i in order {
            let src = &self.values[i * w..(i + 1) * w];
            if rows.last() == Some(&self.rows[i]) {
                let start = values.len() - w;
                for (a, b) in values[start..].iter_mut().zip(src) {
                    *a += b;
                }
            } else {
                rows.push(self.rows[i]);
                values.extend_from_slice(src);
            }
        }
        SparseRows {
            height: self.height,
            width: w,
            rows,
            values,
        }
    }
}

/// How phase 2 runs when the ranks' counts differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SparseAllgather {
    /// Every rank sends its rows and values to every other rank in one
    /// message, all at once (the default).
    #[default]
    Allgatherv,
    /// Each rank in turn broadcasts its rows, then its values
    /// (PaddlePaddle's choice): the same bytes, one rank at a time.
    BroadcastInOrder,
}

/// Which phase 2 ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparsePath {
    /// All counts were equal: one allgather of rows, one of values.
    EqualCounts,
    /// Counts differed: an allgatherv.
    Allgatherv,
    /// Counts differed: each rank broadcast in rank order.
    BroadcastInOrder,
}

/// What a sparse allgather did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparseReport {
    /// Every rank's row count, by rank.
    pub counts: Vec<u64>,
    /// Which phase 2 ran.
    pub path: SparsePath,
    /// Messages this rank sent, both phases.
    pub messages_sent: u64,
}

impl Group {
    /// Gathers every rank's sparse rows (same `height` and `width` on every
    /// rank): the result holds all of them in rank order. See the module
    /// docs for the two phases; `unequal` chooses phase 2 when the counts
    /// differ. With [`OnRankFailure::Continue`](super::OnRankFailure) a
    /// death ends it with the survivors' rows, in the order of the new
    /// view, on every survivor.
    pub async fn sparse_allgather(
        &mut self,
        mine: &SparseRows,
        unequal: SparseAllgather,
    ) -> Result<(SparseRows, SparseReport), GroupError> {
        mine.check()?;
        self.resilient(
            "sparse_allgather",
            &mut [0u8; 0],
            async |g: &mut Group, _: &mut [u8]| g.sparse_allgather_within(mine, unequal).await,
        )
        .await
    }

    async fn sparse_allgather_within(
        &mut self,
        mine: &SparseRows,
        unequal: SparseAllgather,
    ) -> Result<(SparseRows, SparseReport), GroupError> {
        let (world, me, w) = (self.world, self.rank, mine.width);
        let peers = (world - 1) as u64;
        // Phase 1: the counts, with the shape so a mismatch is caught here.
        let t = tag(self.next_seq(), Kind::Counts);
        let head = SparseShape {
            count: mine.rows.len() as u64,
            height: mine.height,
            width: w as u64,
        };
        let head = Bytes::from(head.encode());
        let got = self.exchange_with_all(t, &head).await?;
        let mut counts = vec![mine.rows.len() as u64; world];
        for (r, body) in got.iter().enumerate() {
            let Some(body) = body else { continue };
            let SparseShape {
                count,
                height,
                width,
            } = SparseShape::decode(body).map_err(|e| GroupError::OutOfStep {
                rank: r,
                what: e.to_string(),
            })?;
            if (height, width) != (mine.height, w as u64) {
                return Err(GroupError::OutOfStep {
                    rank: r,
                    what: format!(
                        "rows of {height} x {width}, this rank has {} x {w}",
                        mine.height
                    ),
                });
            }
            counts[r] = count;
        }
        let total: u64 = counts.iter().sum();
        let mut rows = vec![0u64; total as usize];
        let mut values = vec![0f32; total as usize * w];
        let starts: Vec<usize> = counts
            .iter()
            .scan(0usize, |acc, &c| {
                let s = *acc;
                *acc += c as usize;
                Some(s)
            })
            .collect();
        let place = |r: usize| starts[r]..starts[r] + counts[r] as usize;
        let own = place(me);
        rows[own.clone()].copy_from_slice(&mine.rows);
        values[own.start * w..own.end * w].copy_from_slice(&mine.values);
        let equal = counts.iter().all(|&c| c == counts[0]);
        let path = match (equal, unequal) {
            (true, _) => SparsePath::EqualCounts,
            (false, SparseAllgather::Allgatherv) => SparsePath::Allgatherv,
            (false, SparseAllgather::BroadcastInOrder) => SparsePath::BroadcastInOrder,
        };
        let mut sent = peers;
        match path {
            SparsePath::EqualCounts => {
                let t = tag(self.next_seq(), Kind::Rows);
                let body: Bytes = Bytes::copy_from_slice(bytemuck::cast_slice(&mine.rows));
                let got = self.exchange_with_all(t, &body).await?;
                for (r, body) in got.iter().enumerate() {
                    if let Some(body) = body {
                        copy_into(r, body, &mut rows[place(r)], "rows")?;
                    }
                }
                let t = tag(self.next_seq(), Kind::Values);
                let body = to_bytes(&mine.values);
                let got = self.exchange_with_all(t, &body).await?;
                for (r, body) in got.iter().enumerate() {
                    if let Some(body) = body {
                        let p = place(r);
                        copy_into(r, body, &mut values[p.start * w..p.end * w], "values")?;
                    }
                }
                sent += 2 * peers;
            }
            SparsePath::Allgatherv => {
                let t = tag(self.next_seq(), Kind::RowsAndValues);
                let body = rows_and_values(mine);
                let got = self.exchange_with_all(t, &body).await?;
                for (r, body) in got.iter().enumerate() {
                    if let Some(body) = body {
                        let p = place(r);
                        let (row_bytes, value_bytes) =
                            body.split_at(8 * p.len().min(body.len() / 8));
                        copy_into(r, row_bytes, &mut rows[p.clone()], "rows")?;
                        copy_into(
                            r,
                            value_bytes,
                            &mut values[p.start * w..p.end * w],
                            "values",
                        )?;
                    }
                }
                sent += peers;
            }
            SparsePath::BroadcastInOrder => {
                for root in 0..world {
                    let t = tag(self.next_seq(), Kind::RowsAndValues);
                    let mut from_root = vec![false; world];
                    if root == me {
                        let body = rows_and_values(mine);
                        let out = self.to_others(&body);
                        self.exchange(t, out, &[]).await?;
                        sent += peers;
                    } else {
                        from_root[root] = true;
                        let got = self.exchange(t, Vec::new(), &from_root).await?;
                        let body = got[root].as_deref().unwrap_or_default();
                        let p = place(root);
                        let (row_bytes, value_bytes) =
                            body.split_at(8 * p.len().min(body.len() / 8));
                        copy_into(root, row_bytes, &mut rows[p.clone()], "rows")?;
                        copy_into(
                            root,
                            value_bytes,
                            &mut values[p.start * w..p.end * w],
                            "values",
                        )?;
                    }
                }
            }
        }
        if let Some(r) = rows.iter().find(|&&r| r >= mine.height) {
            return Err(GroupError::Size(format!(
                "a rank sent row {r}, outside a height of {}",
                mine.height
            )));
        }
        let gathered = SparseRows {
            height: mine.height,
            width: w,
            rows,
            values,
        };
        let report = SparseReport {
            counts,
            path,
            messages_sent: sent,
        };
        Ok((gathered, report))
    }
}

fn rows_and_values(rows: &SparseRows) -> Bytes {
    let mut b: Vec<u8> = Vec::with_capacity(rows.rows.len() * 8 + rows.values.len() * 4);
    b.extend_from_slice(bytemuck::cast_slice(&rows.rows));
    b.extend_from_slice(bytemuck::cast_slice(&rows.values));
    b.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_summed_in_the_order_they_appear() {
        let rows = SparseRows {
            height: 10,
            width: 2,
            rows: vec![7, 1, 7, 3, 1],
            values: vec![1.0, 2.0, 10.0, 20.0, 100.0, 200.0, 5.0, 5.0, 0.5, 0.25],
        };
        rows.check().unwrap();
        let sum = rows.sum_duplicates();
        assert_eq!(sum.rows, vec![1, 3, 7]);
        assert_eq!(sum.values, vec![10.5, 20.25, 5.0, 5.0, 101.0, 202.0]);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let mut rows = SparseRows {
            height: 4,
            width: 3,
            rows: vec![0, 4],
            values: vec![0.0; 6],
        };
        assert!(rows.check().is_err(), "row 4 of 4");
        rows.rows = vec![0, 3];
        rows.values.pop();
        assert!(rows.check().is_err(), "5 values for 2 rows of 3");
    }
}
