//! How a reduction combines the ranks' values ([`ReduceOp`]).

use gradlane_core::format::Element;

/// How a reduction combines the ranks' values. Every rank's values are
/// taken as `f32` and combined in rank order by the rank that owns them,
/// then rounded once to the buffer's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReduceOp {
    /// The sum, in rank order.
    #[default]
    Sum,
    /// The sum in rank order, divided by the number of ranks.
    Mean,
    /// The largest value (NaN if any rank's is NaN, as `torch.maximum`).
    /// Exact collectives only.
    Max,
    /// The smallest value (NaN if any rank's is NaN). Exact collectives
    /// only.
    Min,
}

impl ReduceOp {
    /// Folds one rank's `values` into `acc` (rank order); `first` for the
    /// first rank, whose values start the fold.
    pub(super) fn fold<T: Element>(self, acc: &mut [f32], values: &[T], first: bool) {
        match (self, first) {
            (_, true) => gradlane_core::format::widen(values, acc),
            (ReduceOp::Sum | ReduceOp::Mean, false) => {
                for (a, v) in acc.iter_mut().zip(values) {
                    *a += v.to_f32();
                }
            }
            (ReduceOp::Max, false) => {
                for (a, v) in acc.iter_mut().zip(values) {
                    let v = v.to_f32();
                    if v.is_nan() || v > *a {
                        *a = v;
                    }
                }
            }
            (ReduceOp::Min, false) => {
                for (a, v) in acc.iter_mut().zip(values) {
                    let v = v.to_f32();
                    if v.is_nan() || v < *a {
                        *a = v;
                    }
                }
            }
        }
    }

    /// What is left to do once every rank is folded in: a mean divides.
    pub(super) fn finish(self, acc: &mut [f32], world: usize) {
        if self == ReduceOp::Mean {
            let n = world as f32;
            acc.iter_mut().for_each(|v| *v /= n);
        }
    }
}
