//! How a buffer is cut among the ranks, and a message's bytes to and from
//! values: shared by every collective.

use super::GroupError;
use bytes::Bytes;
use std::ops::Range;

/// The values as the bytes of a message.
pub(super) fn to_bytes<T: bytemuck::Pod>(values: &[T]) -> Bytes {
    Bytes::copy_from_slice(bytemuck::cast_slice(values))
}

/// Copies a message's body into `out` (values or row indices), which it
/// must fill exactly.
pub(super) fn copy_into<T: bytemuck::Pod>(
    rank: usize,
    body: &[u8],
    out: &mut [T],
    what: &str,
) -> Result<(), GroupError> {
    let want = std::mem::size_of_val(out);
    if body.len() != want {
        return Err(GroupError::OutOfStep {
            rank,
            what: format!("{what} of {} bytes, expected {want}", body.len()),
        });
    }
    bytemuck::cast_slice_mut::<T, u8>(out).copy_from_slice(body);
    Ok(())
}

/// Shard `r` of `n` values split over `world` ranks: sizes differ by at
/// most one, the first `n % world` shards are the longer ones.
pub(super) fn shard(n: usize, world: usize, r: usize) -> Range<usize> {
    let (base, extra) = (n / world, n % world);
    let start = r * base + r.min(extra);
    start..start + base + usize::from(r < extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_buffer_in_order() {
        for n in [0, 1, 2, 7, 100, 101] {
            for world in 1..6 {
                let mut next = 0;
                for r in 0..world {
                    let s = shard(n, world, r);
                    assert_eq!(s.start, next);
                    assert!(s.len() == n / world || s.len() == n / world + 1);
                    next = s.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
