//! Tensors as little-endian `f32` bytes: views that share the caller's
//! memory for zero-copy framing, their shape check, and the append that
//! copies values in that form.

use crate::layout::ChunkPlan;
use crate::score::GradientError;
use bytes::{BufMut, Bytes, BytesMut};
use std::sync::Arc;

/// Segments at least this long are handed to the transport as views of the
/// caller's tensors by [`RoundFramer::next_reliable_shared`] instead of
/// being copied. Each costs the QUIC send buffer two pieces (header and
/// values), and quinn finds a piece by walking the buffer from its oldest
/// unacknowledged one, so short runs are cheaper copied. For ResNet-50 at
/// the default ratio, runs of 16 KiB and more hold ~73% of the important
/// bytes in ~1300 segments.
///
/// [`RoundFramer::next_reliable_shared`]: super::RoundFramer::next_reliable_shared
pub const ZERO_COPY_MIN: usize = 16 << 10;

/// A tensor's values as little-endian f32 bytes that share `values`'
/// memory (on a little-endian machine; a big-endian one copies), for
/// [`RoundFramer::next_reliable_shared`]. The memory stays alive as long
/// as a view of it does.
///
/// [`RoundFramer::next_reliable_shared`]: super::RoundFramer::next_reliable_shared
pub fn shared_f32_bytes(values: Arc<Vec<f32>>) -> Bytes {
    if cfg!(target_endian = "little") {
        Bytes::from_owner(F32Bytes(values))
    } else {
        let mut buf = BytesMut::with_capacity(values.len() * 4);
        extend_f32s(&mut buf, &values);
        buf.freeze()
    }
}

/// Owner of [`shared_f32_bytes`]' memory.
struct F32Bytes(Arc<Vec<f32>>);

impl AsRef<[u8]> for F32Bytes {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// [`check_shapes`](crate::score::check_shapes) for tensors as bytes.
pub(super) fn check_byte_shapes(plan: &ChunkPlan, tensors: &[Bytes]) -> Result<(), GradientError> {
    if tensors.len() != plan.tensor_count() {
        return Err(GradientError::TensorCount {
            expected: plan.tensor_count(),
            got: tensors.len(),
        });
    }
    for (tensor, t) in tensors.iter().enumerate() {
        let expected = plan.tensor_bytes(tensor) as usize;
        if t.len() != expected {
            return Err(GradientError::TensorLength {
                tensor,
                expected: expected / 4,
                got: t.len() / 4,
            });
        }
    }
    Ok(())
}

/// Appends `values` as little-endian f32 bytes.
pub(super) fn extend_f32s(buf: &mut BytesMut, values: &[f32]) {
    if cfg!(target_endian = "little") {
        // The in-memory form is the wire form: one memcpy.
        buf.put_slice(bytemuck::cast_slice(values));
    } else {
        for v in values {
            buf.put_f32_le(*v);
        }
    }
}
