//! Decoding frames: to sparse pairs, into a dense vector, and the master's
//! step of summing many workers' frames into one accumulator.
//!
//! Dense paths stream each element straight into the caller's slice, so no
//! per-worker dense copy exists. They validate a frame fully (one cheap
//! read-only pass) before touching the output, so a bad frame leaves the
//! accumulator exactly as it was.

use super::frame::{parse_header, walk, FrameHeader};
use super::{AggregateError, DecodeError, SparseGradient};

/// Decodes a frame to sparse pairs.
pub fn decode(bytes: &[u8]) -> Result<SparseGradient, DecodeError> {
    let (h, _) = parse_header(bytes)?;
    // `count` is bounded by the payload's bit length, so this allocation is
    // at most 8 entries per input byte.
    let mut keys = Vec::with_capacity(h.count as usize);
    let mut values = Vec::with_capacity(h.count as usize);
    walk(bytes, |k, v| {
        keys.push(k);
        values.push(v);
    })?;
    Ok(SparseGradient::from_trusted(h.dim, keys, values))
}

/// Validates a frame without producing anything; returns its header.
pub fn validate(bytes: &[u8]) -> Result<FrameHeader, DecodeError> {
    walk(bytes, |_, _| {})
}

/// Adds a frame's values into `acc` (whose length must equal the frame's
/// dimension). On error `acc` is unchanged.
pub fn decode_add_into(bytes: &[u8], acc: &mut [f32]) -> Result<FrameHeader, DecodeError> {
    let h = validate(bytes)?;
    check_len(&h, acc.len())?;
    add_validated(bytes, acc)
}

/// Overwrites `out` with the frame's dense vector (zeros where no key).
/// On error `out` is unchanged.
pub fn decode_into_dense(bytes: &[u8], out: &mut [f32]) -> Result<FrameHeader, DecodeError> {
    let h = validate(bytes)?;
    check_len(&h, out.len())?;
    out.fill(0.0);
    add_validated(bytes, out)
}

/// The master's step: sums every worker's frame into `acc`.
///
/// All frames are validated before any is added, so on error `acc` is
/// unchanged and the error names the first bad frame.
pub fn aggregate<B: AsRef<[u8]>>(frames: &[B], acc: &mut [f32]) -> Result<(), AggregateError> {
    for (index, f) in frames.iter().enumerate() {
        validate(f.as_ref())
            .and_then(|h| check_len(&h, acc.len()))
            .map_err(|source| AggregateError::Frame { index, source })?;
    }
    for (index, f) in frames.iter().enumerate() {
        add_validated(f.as_ref(), acc).map_err(|source| AggregateError::Frame { index, source })?;
    }
    Ok(())
}

fn check_len(h: &FrameHeader, len: usize) -> Result<(), DecodeError> {
    if h.dim != len as u64 {
        return Err(DecodeError::DimensionMismatch {
            frame: h.dim,
            output: len,
        });
    }
    Ok(())
}

/// Adds an already validated frame whose dimension equals `acc.len()`.
fn add_validated(bytes: &[u8], acc: &mut [f32]) -> Result<FrameHeader, DecodeError> {
    walk(bytes, |k, v| {
        // Keys were checked against the dimension, which equals the length.
        if let Some(slot) = acc.get_mut(k as usize) {
            *slot += v;
        }
    })
}
