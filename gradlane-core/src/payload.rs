//! A data segment's payload in its value format: how long it is, how it is
//! written, how it is checked and read (docs/DESIGN.md §2.2).
//!
//! A segment carries `n` consecutive values of one tensor, from value
//! `first`. In an element format ([`F32`](ValueFormat::F32),
//! [`Bf16`](ValueFormat::Bf16), [`F16`](ValueFormat::F16)) the payload is
//! the `n` values, little-endian. In [`Log8`](ValueFormat::Log8) it is cut
//! at the chunk boundaries it crosses into *sections*, each one scale
//! (`f32`, the whole chunk's, so that every fragment of a chunk agrees)
//! and a code per value of the section. A chunk's positions are implied by
//! the header's byte offset, so no keys travel.
//!
//! The header's byte offset and the chunk plan count in `f32` positions
//! (4 bytes a value) whatever the format: what a segment covers in the
//! tensor does not depend on how its values travel.

use crate::format::{
    log8_decode, log8_encode, log8_scale, log8_scale_ok, read_elements, write_elements,
    ValueFormat, LOG8_SCALE_BYTES,
};
use crate::layout::{Chunk, ChunkPlan};
use thiserror::Error;

/// Why a payload does not fit its format and the chunk plan.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PayloadError {
    /// A length that is not a whole number of the format's values.
    #[error("a payload of {len} bytes is not a whole number of {format} values")]
    Misaligned {
        /// The payload's format.
        format: ValueFormat,
        /// Its length in bytes.
        len: u32,
    },
    /// Values that run past the tensor's last.
    #[error("a payload of {len} bytes from value {first} runs past the tensor's {values} values")]
    OutOfRange {
        /// The payload's first value.
        first: u32,
        /// Its length in bytes.
        len: u32,
        /// The tensor's values.
        values: u32,
    },
    /// A `Log8` section without a code after its scale.
    #[error("a log8 section in the payload from value {first} has a scale and no code")]
    Log8Section {
        /// The payload's first value.
        first: u32,
    },
    /// A `Log8` scale that is not finite or is negative.
    #[error("a log8 scale in the payload from value {first} is not finite or is negative")]
    Log8Scale {
        /// The payload's first value.
        first: u32,
    },
}

/// The values `first..first + n` of tensor `tensor` cut at chunk
/// boundaries: `(start, len)` in values of the tensor, in order.
///
/// The range must lie inside the tensor (a validated header's does).
pub fn sections(
    plan: &ChunkPlan,
    tensor: usize,
    first: u32,
    n: u32,
) -> impl Iterator<Item = (u32, u32)> + '_ {
    let chunks = plan.chunks();
    let end = first + n;
    let mut id = match n {
        0 => usize::MAX,
        _ => plan.chunk_at(tensor, first * 4).unwrap_or(usize::MAX),
    };
    let mut at = first;
    std::iter::from_fn(move || {
        let c: &Chunk = chunks.get(id)?;
        if at >= end {
            return None;
        }
        let upto = (c.start + c.len).min(end);
        let s = (at, upto - at);
        at = upto;
        id += 1;
        Some(s)
    })
}

/// The values of the chunks that values `first..first + n` of `tensor`
/// touch, as a range of the tensor's values.
pub fn covering_chunks(
    plan: &ChunkPlan,
    tensor: usize,
    first: u32,
    n: u32,
) -> std::ops::Range<u32> {
    let chunks = plan.chunks();
    let start = plan
        .chunk_at(tensor, first * 4)
        .map_or(first, |id| chunks[id].start);
    let end = plan
        .chunk_at(tensor, (first + n).saturating_sub(1) * 4)
        .map_or(first + n, |id| chunks[id].start + chunks[id].len);
    start..end.max(first + n)
}

/// Bytes on the wire of `n` values of `tensor` from value `first` in
/// `format`.
pub fn wire_len(format: ValueFormat, plan: &ChunkPlan, tensor: usize, first: u32, n: u32) -> usize {
    match format.element_bytes() {
        Some(b) => b * n as usize,
        None => n as usize + LOG8_SCALE_BYTES * sections(plan, tensor, first, n).count(),
    }
}

/// How many of the values from `first` on fit `budget` wire bytes in
/// `format` (whole elements; in `Log8` whole sections' scales), at most
/// `n`. Zero when not even one fits.
pub fn values_within(
    format: ValueFormat,
    plan: &ChunkPlan,
    tensor: usize,
    first: u32,
    n: u32,
    budget: usize,
) -> u32 {
    match format.element_bytes() {
        Some(b) => n.min((budget / b) as u32),
        None => {
            let mut left = budget;
            let mut fit = 0;
            for (_, len) in sections(plan, tensor, first, n) {
                if left <= LOG8_SCALE_BYTES {
                    break;
                }
                let take = len.min((left - LOG8_SCALE_BYTES) as u32);
                fit += take;
                left -= LOG8_SCALE_BYTES + take as usize;
                if take < len {
                    break;
                }
            }
            fit
        }
    }
}

/// The `Log8` scale of each chunk of a round, computed once however many
/// segments the chunk's values are cut into (a large convolution kernel
/// spans several datagrams, and each piece carries the whole chunk's
/// scale).
#[derive(Debug, Clone, Default)]
pub struct Log8Scales {
    /// By chunk id; NaN until computed (a scale is never NaN).
    by_chunk: Vec<f32>,
}

impl Log8Scales {
    /// Forgets every scale: for a round of a plan of `chunks` chunks.
    pub fn reset(&mut self, chunks: usize) {
        self.by_chunk.clear();
        self.by_chunk.resize(chunks, f32::NAN);
    }

    /// Chunk `id`'s scale, `whole` being all its values.
    fn get(&mut self, id: usize, tensor: usize, whole: &[f32]) -> f32 {
        if let Some(&s) = self.by_chunk.get(id).filter(|s| !s.is_nan()) {
            return s;
        }
        let scale = log8_scale(whole).unwrap_or_else(|e| {
            tracing::warn!(
                tensor,
                chunk = id,
                index = e.index,
                "log8 chunk not finite: sent as zeros"
            );
            0.0
        });
        if let Some(s) = self.by_chunk.get_mut(id) {
            *s = scale;
        }
        scale
    }
}

/// Writes values `first..first + n` of `tensor` in `format` into `out`,
/// which is exactly [`wire_len`] bytes long. `values` holds the tensor's
/// values from value `base` on: at least the chunks the range touches
/// (`Log8` takes each chunk's scale from all its values).
///
/// A `Log8` chunk with a value that is not finite cannot be carried (the
/// encoder sends such chunks in the important part's format): should one
/// get here, its section is written as zeros with scale 0, and a warning
/// is logged.
pub fn write(
    format: ValueFormat,
    plan: &ChunkPlan,
    tensor: usize,
    (base, values): (u32, &[f32]),
    (first, n): (u32, u32),
    out: &mut [u8],
    scales: &mut Log8Scales,
) {
    let at = |v: u32| (v - base) as usize;
    if format.element_bytes().is_some() {
        write_elements(format, &values[at(first)..at(first + n)], out);
        return;
    }
    let chunks = plan.chunks();
    let mut pos = 0;
    for (start, len) in sections(plan, tensor, first, n) {
        let id = plan.chunk_at(tensor, start * 4).unwrap_or(0);
        let c = chunks[id];
        let whole = &values[at(c.start)..at(c.start + c.len)];
        let scale = scales.get(id, tensor, whole);
        out[pos..pos + LOG8_SCALE_BYTES].copy_from_slice(&scale.to_le_bytes());
        pos += LOG8_SCALE_BYTES;
        let codes = &mut out[pos..pos + len as usize];
        log8_encode(&values[at(start)..at(start + len)], scale, codes);
        pos += len as usize;
    }
}

/// How many values a payload of `wire_len` bytes in `format` carries from
/// value `first` of `tensor`, checking that it fits: whole elements, and
/// in `Log8` sections of a scale and at least one code that end at chunk
/// boundaries or at the payload's end, inside the tensor.
pub fn value_count(
    format: ValueFormat,
    plan: &ChunkPlan,
    tensor: usize,
    first: u32,
    wire_len: u32,
) -> Result<u32, PayloadError> {
    let tensor_values = plan.tensor_bytes(tensor) / 4;
    let n = match format.element_bytes() {
        Some(b) => {
            if wire_len % b as u32 != 0 {
                return Err(PayloadError::Misaligned {
                    format,
                    len: wire_len,
                });
            }
            wire_len / b as u32
        }
        None => {
            let chunks = plan.chunks();
            let mut at = first;
            let mut left = wire_len;
            while left > 0 {
                if left <= LOG8_SCALE_BYTES as u32 {
                    return Err(PayloadError::Log8Section { first });
                }
                let Some(id) = plan.chunk_at(tensor, at.saturating_mul(4)) else {
                    break;
                };
                let c = chunks[id];
                let take = (c.start + c.len - at).min(left - LOG8_SCALE_BYTES as u32);
                left -= LOG8_SCALE_BYTES as u32 + take;
                at += take;
            }
            if left > 0 {
                // Codes run past the tensor's last value.
                return Err(PayloadError::OutOfRange {
                    first,
                    len: wire_len,
                    values: tensor_values,
                });
            }
            at - first
        }
    };
    if first as u64 + n as u64 > tensor_values as u64 {
        return Err(PayloadError::OutOfRange {
            first,
            len: wire_len,
            values: tensor_values,
        });
    }
    Ok(n)
}

/// Checks what [`value_count`] cannot: every `Log8` scale is one a sender
/// could write (finite, not negative).
pub fn check(
    format: ValueFormat,
    plan: &ChunkPlan,
    tensor: usize,
    first: u32,
    payload: &[u8],
) -> Result<(), PayloadError> {
    if format != ValueFormat::Log8 {
        return Ok(());
    }
    let n = value_count(format, plan, tensor, first, payload.len() as u32)?;
    let mut pos = 0;
    for (_, len) in sections(plan, tensor, first, n) {
        let scale = scale_at(payload, pos);
        if !log8_scale_ok(scale) {
            return Err(PayloadError::Log8Scale { first });
        }
        pos += LOG8_SCALE_BYTES + len as usize;
    }
    Ok(())
}

fn scale_at(payload: &[u8], pos: usize) -> f32 {
    f32::from_le_bytes([
        payload[pos],
        payload[pos + 1],
        payload[pos + 2],
        payload[pos + 3],
    ])
}

/// Reads a checked payload (see [`value_count`] and [`check`]) into `out`,
/// which holds exactly its values.
pub fn read(
    format: ValueFormat,
    plan: &ChunkPlan,
    tensor: usize,
    first: u32,
    payload: &[u8],
    out: &mut [f32],
) {
    if format.element_bytes().is_some() {
        read_elements(format, payload, out);
        return;
    }
    let mut pos = 0;
    for (start, len) in sections(plan, tensor, first, out.len() as u32) {
        let scale = scale_at(payload, pos);
        pos += LOG8_SCALE_BYTES;
        let at = (start - first) as usize;
        log8_decode(
            &payload[pos..pos + len as usize],
            scale,
            &mut out[at..at + len as usize],
        );
        pos += len as usize;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{ChunkOptions, Layout, TensorSpec};

    fn plan() -> ChunkPlan {
        Layout::new(vec![
            TensorSpec::dense("a", [10]),
            TensorSpec::dense("b", [1000]),
        ])
        .unwrap()
        .plan(ChunkOptions {
            block_values: 256,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn sections_end_at_chunk_boundaries() {
        let p = plan();
        let s: Vec<_> = sections(&p, 1, 250, 300).collect();
        assert_eq!(s, vec![(250, 6), (256, 256), (512, 38)]);
        assert_eq!(wire_len(ValueFormat::Log8, &p, 1, 250, 300), 300 + 12);
        assert_eq!(wire_len(ValueFormat::Bf16, &p, 1, 250, 300), 600);
        assert_eq!(sections(&p, 1, 0, 0).count(), 0);
    }

    #[test]
    fn values_within_a_budget_keep_whole_sections() {
        let p = plan();
        // 4 + 6, then 4 + 10 of the next chunk.
        assert_eq!(values_within(ValueFormat::Log8, &p, 1, 250, 300, 24), 16);
        assert_eq!(values_within(ValueFormat::Log8, &p, 1, 250, 300, 4), 0);
        assert_eq!(
            values_within(ValueFormat::Log8, &p, 1, 250, 300, 10_000),
            300
        );
        assert_eq!(values_within(ValueFormat::F16, &p, 1, 250, 300, 101), 50);
    }

    #[test]
    fn every_format_writes_what_it_reads_back() {
        let p = plan();
        let values: Vec<f32> = (0..1000).map(|i| (i as f32 - 400.0) * 0.01).collect();
        for format in ValueFormat::ALL {
            for (first, n) in [(0u32, 1000u32), (250, 300), (999, 1), (3, 2)] {
                let len = wire_len(format, &p, 1, first, n);
                let mut scales = Log8Scales::default();
                scales.reset(p.len());
                let mut out = vec![0u8; len];
                write(
                    format,
                    &p,
                    1,
                    (0, &values),
                    (first, n),
                    &mut out,
                    &mut scales,
                );
                assert_eq!(value_count(format, &p, 1, first, len as u32), Ok(n));
                check(format, &p, 1, first, &out).unwrap();
                let mut back = vec![0f32; n as usize];
                read(format, &p, 1, first, &out, &mut back);
                for (i, (&b, &v)) in back.iter().zip(&values[first as usize..]).enumerate() {
                    let tol = match format {
                        ValueFormat::F32 => 0.0,
                        ValueFormat::Bf16 => v.abs() / 256.0,
                        ValueFormat::F16 => v.abs() / 2048.0,
                        ValueFormat::Log8 => v.abs() * 0.05 + 1e-4,
                    };
                    assert!((b - v).abs() <= tol, "{format} {first}+{i}: {b} vs {v}");
                }
            }
        }
    }

    #[test]
    fn bad_payloads_are_errors() {
        let p = plan();
        // A scale and no code.
        assert!(matches!(
            value_count(ValueFormat::Log8, &p, 1, 0, 4),
            Err(PayloadError::Log8Section { .. })
        ));
        // A section that runs past the tensor.
        assert!(matches!(
            value_count(ValueFormat::Log8, &p, 1, 999, 4 + 1 + 4 + 1),
            Err(PayloadError::OutOfRange { .. })
        ));
        assert!(matches!(
            value_count(ValueFormat::Bf16, &p, 1, 0, 3),
            Err(PayloadError::Misaligned { .. })
        ));
        assert!(matches!(
            value_count(ValueFormat::F32, &p, 0, 8, 12),
            Err(PayloadError::OutOfRange { .. })
        ));
        let mut payload = vec![0u8; 4 + 6];
        payload[..4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(matches!(
            check(ValueFormat::Log8, &p, 1, 250, &payload),
            Err(PayloadError::Log8Scale { .. })
        ));
    }
}
