//! The self-describing wire frame, and the single decoder every read path
//! shares so that validation cannot drift between them.
//!
//! Layout (little-endian), version 1:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `b"GLSQ"` |
//! | 4 | 1 | version (1) |
//! | 5 | 1 | flag bits `f` (0..=3) |
//! | 6 | 1 | q width (0..=32) |
//! | 7 | 1 | reserved, 0 |
//! | 8 | 8 | dimension (u64, <= 2^32) |
//! | 16 | 8 | count (u64) |
//! | 24 | 4 | q_min (u32) |
//! | 28 | 8 | S, the sum of kept magnitudes (f64) |
//! | 36 | 8 | base (f64) |
//! | 44 | 2^f | widths (u8 each, strictly increasing, <= 32) |
//!
//! then one LSB-first bit stream with, per element, `flag` (f bits), the key
//! delta (`widths[flag]` bits), the sign (1 = negative) and `q - q_min`
//! (q-width bits), zero-padded to a byte. Interleaving lets a decoder stream
//! each element straight into an accumulator in a single pass. Every element
//! costs at least `f + widths[0] + 1 + q width` bits, so a count the payload
//! cannot hold is rejected before anything is allocated.

use super::bits::{BitReader, BitWriter};
use super::keys::{bit_len, delta_histogram, WidthScheme};
use super::quantize::{check_base, dequantize, quantize};
use super::{DecodeError, EncodeError, SparseGradient, MAX_BASE, MAX_DIM, MIN_BASE};

/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"GLSQ";
/// The frame version this build writes and reads.
pub const VERSION: u8 = 1;
const FIXED_HEADER: usize = 44;
/// Above this q width, decoded magnitudes are computed per element rather
/// than from a table (which would be too large to be worth building).
const TABLE_MAX_BITS: u32 = 12;

/// The parsed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrameHeader {
    /// Dense length the keys index into.
    pub dim: u64,
    /// Number of encoded elements.
    pub count: u64,
    /// Sum of the kept magnitudes.
    pub sum: f64,
    /// Logarithm base of the quantizer.
    pub base: f64,
    /// Smallest quantization integer.
    pub q_min: u32,
    /// Bits per `q - q_min`.
    pub q_width: u32,
    /// Length-flag scheme of the key deltas.
    pub scheme: WidthScheme,
}

/// Encodes a sparse gradient into a new frame.
pub fn encode(grad: &SparseGradient, base: f64) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::new();
    encode_into(grad, base, &mut out)?;
    Ok(out)
}

/// Appends the frame of `grad` to `out` (reusing its capacity across rounds).
pub fn encode_into(grad: &SparseGradient, base: f64, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    check_base(base)?;
    let keys = grad.keys();
    let qz = quantize(grad.values(), base);
    let hist = delta_histogram(keys);
    let scheme = WidthScheme::optimal_for_histogram(&hist);
    let lut = scheme.lookup();
    let key_bits = scheme.cost(&hist);
    let value_bits = keys.len() as u64 * u64::from(1 + qz.q_width);
    let payload = (key_bits + value_bits).div_ceil(8) as usize;
    out.reserve(FIXED_HEADER + scheme.widths().len() + payload + 8);

    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(scheme.flag_bits() as u8);
    out.push(qz.q_width as u8);
    out.push(0);
    out.extend_from_slice(&grad.dim().to_le_bytes());
    out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    out.extend_from_slice(&qz.q_min.to_le_bytes());
    out.extend_from_slice(&qz.sum.to_le_bytes());
    out.extend_from_slice(&base.to_le_bytes());
    out.extend_from_slice(scheme.widths());

    let fb = scheme.flag_bits();
    let mut w = BitWriter::new(out);
    let mut prev = 0u32;
    for ((&k, &v), &q) in keys.iter().zip(grad.values()).zip(&qz.qs) {
        let delta = k - prev;
        prev = k;
        let (flag, width) = lut[bit_len(delta) as usize];
        w.write(u64::from(flag) | (u64::from(delta) << fb), fb + width);
        let sign = u64::from(v.is_sign_negative());
        w.write(sign | (u64::from(q - qz.q_min) << 1), 1 + qz.q_width);
    }
    w.finish();
    Ok(())
}

/// Parses and validates a frame header; returns it with the payload.
pub fn parse_header(bytes: &[u8]) -> Result<(FrameHeader, &[u8]), DecodeError> {
    if bytes.len() < 4 {
        return Err(if MAGIC.starts_with(bytes) {
            DecodeError::Truncated
        } else {
            DecodeError::BadMagic
        });
    }
    if bytes[..4] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    if bytes.len() < 5 {
        return Err(DecodeError::Truncated);
    }
    if bytes[4] != VERSION {
        return Err(DecodeError::UnsupportedVersion(bytes[4]));
    }
    let head = bytes.get(..FIXED_HEADER).ok_or(DecodeError::Truncated)?;
    let flag_bits = u32::from(head[5]);
    let q_width = head[6];
    if head[7] != 0 {
        return Err(DecodeError::BadReserved);
    }
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&head[o..o + 8]);
        u64::from_le_bytes(b)
    };
    let dim = u64_at(8);
    let count = u64_at(16);
    let q_min = u32::from_le_bytes([head[24], head[25], head[26], head[27]]);
    let sum = f64::from_bits(u64_at(28));
    let base = f64::from_bits(u64_at(36));
    if dim > MAX_DIM {
        return Err(DecodeError::DimensionTooLarge(dim));
    }
    if !(MIN_BASE..=MAX_BASE).contains(&base) {
        return Err(DecodeError::BadBase);
    }
    if q_width > 32 {
        return Err(DecodeError::BadQWidth(q_width));
    }
    if flag_bits > super::keys::MAX_FLAG_BITS {
        return Err(DecodeError::BadWidthScheme);
    }
    let nw = 1usize << flag_bits;
    let widths = bytes
        .get(FIXED_HEADER..FIXED_HEADER + nw)
        .ok_or(DecodeError::Truncated)?;
    let scheme = WidthScheme::new(flag_bits, widths).ok_or(DecodeError::BadWidthScheme)?;
    let payload = &bytes[FIXED_HEADER + nw..];
    // Every element holds at least its flag, the narrowest width, its sign
    // and its q: bounding the count by that keeps any allocation sized by it
    // proportional to the input.
    let min_bits = u64::from(flag_bits) + u64::from(widths[0]) + 1 + u64::from(q_width);
    if count > dim || count.saturating_mul(min_bits) > payload.len() as u64 * 8 {
        return Err(DecodeError::CountTooLarge(count));
    }
    let sum_ok = if count == 0 {
        sum == 0.0
    } else {
        sum.is_finite() && sum > 0.0
    };
    if !sum_ok {
        return Err(DecodeError::BadSum);
    }
    let header = FrameHeader {
        dim,
        count,
        sum,
        base,
        q_min,
        q_width: u32::from(q_width),
        scheme,
    };
    Ok((header, payload))
}

/// Decodes every element of a frame in key order, calling `sink(key, value)`.
///
/// Errors may surface after some calls to `sink`; callers that must not see
/// a partial frame run a first pass with a no-op sink.
pub(crate) fn walk(
    bytes: &[u8],
    mut sink: impl FnMut(u32, f32),
) -> Result<FrameHeader, DecodeError> {
    let (h, payload) = parse_header(bytes)?;
    let fb = h.scheme.flag_bits();
    let widths = h.scheme.widths();
    let qw = h.q_width;
    let table: Vec<f32> = if qw <= TABLE_MAX_BITS {
        // Only as many entries as could be used: small frames stay cheap.
        let size = (1u64 << qw).min(h.count) as usize;
        (0..size as u64)
            .map(|off| dequantize(h.sum, h.base, u64::from(h.q_min) + off))
            .collect()
    } else {
        Vec::new()
    };
    let mut r = BitReader::new(payload);
    let mut prev = 0u32;
    for i in 0..h.count {
        let flag = r.read(fb)? as usize;
        let width = u32::from(widths.get(flag).copied().unwrap_or(32));
        let delta = r.read(width)? as u32;
        if i > 0 && delta == 0 {
            return Err(DecodeError::NonIncreasingKeys);
        }
        let key = if i == 0 {
            delta
        } else {
            prev.checked_add(delta).ok_or(DecodeError::KeyOutOfRange)?
        };
        if u64::from(key) >= h.dim {
            return Err(DecodeError::KeyOutOfRange);
        }
        prev = key;
        let sv = r.read(1 + qw)?;
        let off = sv >> 1;
        let mag = match table.get(off as usize) {
            Some(&m) => m,
            None => dequantize(h.sum, h.base, u64::from(h.q_min) + off),
        };
        sink(key, if sv & 1 == 1 { -mag } else { mag });
    }
    r.finish()?;
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_errors() {
        let g = SparseGradient::new(100, vec![3, 50, 99], vec![1.0, -2.0, 0.5]).unwrap();
        let f = encode(&g, 2.0).unwrap();
        let (h, _) = parse_header(&f).unwrap();
        assert_eq!((h.dim, h.count, h.sum), (100, 3, 3.5));
        let mut got = Vec::new();
        walk(&f, |k, v| got.push((k, v))).unwrap();
        assert_eq!(got.iter().map(|p| p.0).collect::<Vec<_>>(), vec![3, 50, 99]);
        assert!(got[1].1 < 0.0 && got[0].1 > 0.0);

        let mut bad = f.clone();
        bad[0] = b'X';
        assert_eq!(parse_header(&bad).unwrap_err(), DecodeError::BadMagic);
        let mut bad = f.clone();
        bad[4] = 9;
        assert_eq!(
            parse_header(&bad).unwrap_err(),
            DecodeError::UnsupportedVersion(9)
        );
        let mut bad = f.clone();
        bad[36..44].copy_from_slice(&1.0f64.to_le_bytes());
        assert_eq!(parse_header(&bad).unwrap_err(), DecodeError::BadBase);
        let mut bad = f.clone();
        bad[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            parse_header(&bad).unwrap_err(),
            DecodeError::CountTooLarge(u64::MAX)
        );
        let mut bad = f.clone();
        bad.push(0);
        assert_eq!(
            walk(&bad, |_, _| {}).unwrap_err(),
            DecodeError::TrailingBytes
        );
        assert_eq!(
            walk(&f[..f.len() - 1], |_, _| {}).unwrap_err(),
            DecodeError::Truncated
        );
        assert_eq!(parse_header(&f[..10]).unwrap_err(), DecodeError::Truncated);
    }
}
