//! `Log8`'s tables and codes: a chunk's scale, its values' levels, and
//! back, the same bits on every machine.

use super::{LOG8_BASE, LOG8_LEVELS, LOG8_ZERO};
use std::sync::LazyLock;
use thiserror::Error;

/// `Log8`'s tables, with `lower[q] = b^-q` the smallest `|v|/S` of level
/// `q` and `middle[q]` the factor of `S` that level `q` decodes to: each
/// code's signed factor; and the level search's: `guess[k][j]`, the level of the smallest `x` whose
/// exponent is `-k` and whose mantissa's top 8 bits are `j`, and
/// `above[q] = lower[q - 1]` (infinite for `q = 0`).
pub(super) struct Log8Tables {
    /// What each of the 256 codes decodes to against a scale of 1: the
    /// signed middle of its level, 0 for either sign of zero's code.
    by_code: [f32; 256],
    guess: Box<[[u8; 256]; GUESS_OCTAVES + 1]>,
    pub(super) above: [f32; LOG8_LEVELS + 1],
}

/// Octaves below 1 that hold a level: `b^-126 > 2^-18`, so an `x` below
/// `2^-18` is zero (the row after them, all [`LOG8_ZERO`]).
pub(super) const GUESS_OCTAVES: usize = 19;

pub(super) static LOG8: LazyLock<Log8Tables> = LazyLock::new(|| {
    let mut lower = [0f32; LOG8_LEVELS];
    let mut middle = [0f32; LOG8_LEVELS];
    // Division and square root are exactly rounded in IEEE 754, so these
    // are the same bits on every machine (a libm `powf` need not be).
    let half_step = LOG8_BASE.sqrt();
    let mut p = 1.0f64;
    for q in 0..LOG8_LEVELS {
        lower[q] = p as f32;
        middle[q] = if q == 0 { 1.0 } else { (p * half_step) as f32 };
        p /= LOG8_BASE;
    }
    // The level by its definition: the smallest q with x >= lower[q].
    let exact = |x: f32| {
        (0..LOG8_LEVELS)
            .find(|&q| x >= lower[q])
            .unwrap_or(LOG8_LEVELS)
    };
    let mut guess = Box::new([[LOG8_ZERO; 256]; GUESS_OCTAVES + 1]);
    for (k, row) in guess.iter_mut().take(GUESS_OCTAVES).enumerate() {
        for (j, g) in row.iter_mut().enumerate() {
            let x0 = f32::from_bits(((127 - k as u32) << 23) | ((j as u32) << 15));
            *g = exact(x0) as u8;
        }
    }
    let mut above = [f32::INFINITY; LOG8_LEVELS + 1];
    above[1..].copy_from_slice(&lower);
    let mut by_code = [0f32; 256];
    for (code, d) in by_code.iter_mut().enumerate() {
        let q = code & 0x7F;
        if q < LOG8_LEVELS {
            *d = if code & 0x80 != 0 {
                -middle[q]
            } else {
                middle[q]
            };
        }
    }
    Log8Tables {
        by_code,
        guess,
        above,
    }
});

/// The level of `x = |v|/S` in `[0, 1]`: the smallest `q` with
/// `x ≥ lower[q]`, or [`LOG8_LEVELS`] below the last level (and for 0).
///
/// A bucket of `x`s that share an exponent and their mantissa's top 8
/// bits spans 0.0056 octaves, less than a level's 0.1375: at most one
/// level boundary falls inside it, so its first `x`'s level, less one
/// where `x` has passed the boundary above, is the level. One table
/// look-up and one comparison, no branch on the data.
#[inline]
pub(super) fn log8_level(x: f32, t: &Log8Tables) -> usize {
    let bits = x.to_bits();
    // x <= 1: the biased exponent is at most 127.
    let octave = (127u32.saturating_sub(bits >> 23) as usize).min(GUESS_OCTAVES);
    let guess = t.guess[octave][((bits >> 15) & 0xFF) as usize] as usize;
    guess - usize::from(x >= t.above[guess])
}

/// A chunk that `Log8` cannot carry: it holds a value that is not finite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("value {index} of the chunk is not finite")]
pub struct NonFinite {
    /// Where, in the values given.
    pub index: usize,
}

/// The `Log8` scale of a chunk: its largest magnitude, or where the chunk
/// holds a value that is not finite.
pub fn log8_scale(values: &[f32]) -> Result<f32, NonFinite> {
    let mut lanes = [0f32; 8];
    let mut blocks = values.chunks_exact(8);
    for b in &mut blocks {
        for i in 0..8 {
            lanes[i] = lanes[i].max(b[i].abs());
        }
    }
    let mut scale = blocks.remainder().iter().fold(0f32, |m, v| m.max(v.abs()));
    for l in lanes {
        scale = scale.max(l);
    }
    // `max` ignores NaN, so a NaN needs its own check; a finite scale
    // proves every value finite but NaN.
    if !scale.is_finite() || values.iter().any(|v| v.is_nan()) {
        let index = values.iter().position(|v| !v.is_finite()).unwrap_or(0);
        return Err(NonFinite { index });
    }
    Ok(scale)
}

/// Encodes one chunk (or the part of one chunk that a segment carries,
/// with the whole chunk's `scale` from [`log8_scale`]) into `out`, one
/// code per value. `scale` must be finite and at least every `|v|`.
pub fn log8_encode(values: &[f32], scale: f32, out: &mut [u8]) {
    let tables = &*LOG8;
    if scale == 0.0 || !scale.is_finite() {
        out.fill(LOG8_ZERO);
        return;
    }
    for (o, &v) in out.iter_mut().zip(values) {
        // A division, not a product with 1/S: the largest value must come
        // out at exactly 1 to be exact.
        let x = (v.abs() / scale).min(1.0);
        let q = log8_level(x, tables);
        // The sign bit, except on zero's code.
        let sign = ((v.to_bits() >> 24) as u8 & 0x80) & if q < LOG8_LEVELS { 0xFF } else { 0 };
        *o = sign | q as u8;
    }
}

/// Whether `scale` can be a `Log8` chunk's scale: finite and not negative.
/// A peer's other scale is a malformed segment.
pub fn log8_scale_ok(scale: f32) -> bool {
    scale.is_finite() && scale >= 0.0
}

/// The value a `Log8` code decodes to against `scale`.
#[inline]
pub fn log8_value(code: u8, scale: f32) -> f32 {
    // A product with a signed factor is the negated product (IEEE 754
    // multiplication is symmetric in sign): the same bits as negating.
    scale * LOG8.by_code[code as usize]
}

/// Decodes codes against `scale` into `out` (one value per code).
pub fn log8_decode(codes: &[u8], scale: f32, out: &mut [f32]) {
    let by_code = &LOG8.by_code;
    // One look-up and one product a value, no branch on the data.
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = scale * by_code[c as usize];
    }
}

/// `values` after a `Log8` round trip as one chunk: what a receiver of
/// them holds. A chunk with a value that is not finite is refused.
pub fn log8_round_trip(values: &[f32], out: &mut [f32]) -> Result<(), NonFinite> {
    let scale = log8_scale(values)?;
    let tables = &*LOG8;
    if scale == 0.0 {
        out.fill(0.0);
        return Ok(());
    }
    // Encoding and decoding fused: the same level and the same product as
    // `log8_encode` then `log8_decode`, without the codes in between.
    for (o, &v) in out.iter_mut().zip(values) {
        let x = (v.abs() / scale).min(1.0);
        let q = log8_level(x, tables);
        let sign = ((v.to_bits() >> 24) as u8 & 0x80) & if q < LOG8_LEVELS { 0xFF } else { 0 };
        *o = scale * tables.by_code[(sign | q as u8) as usize];
    }
    Ok(())
}
