//! Reciprocal log quantization of the kept values (CN113487036A, step 2;
//! docs/DESIGN.md §3).
//!
//! With `S = sum |v|` over the kept values, each value becomes
//! `r = S / |v| >= 1` and `q = ceil(log_b r)`, so `b^(q-1) < r <= b^q`. The
//! decoder returns `S / b^(q - 1/2)`, the geometric middle of that bucket,
//! which minimises the worst-case *ratio* error: the decoded magnitude `m`
//! satisfies `|v| / sqrt(b) < m <= sqrt(b) * |v|`. `q = 0` only when
//! `r == 1` (the value holds all the mass) and decodes to `S` exactly.
//!
//! `q` is computed from a logarithm in f64 and then *verified* against the
//! powers `b^(q-1)` and `b^q` (adjusting by one where rounding put it in a
//! neighbouring bucket), so the bucket inequality holds for the f64 values
//! the decoder will use.

use super::{EncodeError, MAX_BASE, MIN_BASE};

/// Quantized magnitudes of one set of kept values.
pub(crate) struct Quantized {
    /// Sum of kept magnitudes, in f64 so it is exact enough and cannot overflow.
    pub(crate) sum: f64,
    /// Smallest q; the frame stores `q - q_min`.
    pub(crate) q_min: u32,
    /// Bits per stored `q - q_min`.
    pub(crate) q_width: u32,
    /// One q per value.
    pub(crate) qs: Vec<u32>,
}

/// Checks a base for encoding.
pub(crate) fn check_base(base: f64) -> Result<(), EncodeError> {
    if !(MIN_BASE..=MAX_BASE).contains(&base) {
        return Err(EncodeError::BadBase(base));
    }
    Ok(())
}

/// Quantizes finite non-zero values.
pub(crate) fn quantize(values: &[f32], base: f64) -> Quantized {
    let (mut amin, mut amax) = (f32::INFINITY, 0f32);
    let mut sum = 0f64;
    for v in values {
        let a = v.abs();
        amin = amin.min(a);
        amax = amax.max(a);
        sum += f64::from(a);
    }
    if values.is_empty() {
        return Quantized {
            sum: 0.0,
            q_min: 0,
            q_width: 0,
            qs: Vec::new(),
        };
    }
    // Every q lies between those of the largest and smallest magnitude; the
    // exact logarithm, run twice, brackets them (with one bucket of slack on
    // each side for its rounding) and a table of powers over that bracket
    // is what every q is checked against.
    let ln_b = base.ln();
    let q_of = |r: f64| (r.ln() / ln_b).ceil().max(0.0) as u32;
    let lo = q_of(sum / f64::from(amax)).saturating_sub(1);
    let hi = q_of(sum / f64::from(amin)).saturating_add(1);
    let pow: Vec<f64> = (lo..=hi).map(|q| base.powf(f64::from(q))).collect();
    let top = pow.len() - 1;
    let inv_log2_b = 1.0 / base.log2();
    let mut qs = Vec::with_capacity(values.len());
    let (mut q_min, mut q_max) = (u32::MAX, 0u32);
    for &v in values {
        let r = sum / f64::from(v.abs());
        // A cheap estimate, then walk to the bucket with
        // pow[i-1] < r <= pow[i]; the walk makes the result exact whatever
        // the estimate's error, the estimate just makes it short.
        // Truncation rather than `ceil`, which is a libm call on baseline
        // x86-64; the walk absorbs the difference of at most one bucket.
        let est = fast_log2(r) * inv_log2_b - f64::from(lo) + 1.0;
        let mut i = (est.max(0.0) as usize).min(top);
        while i > 0 && pow[i - 1] >= r {
            i -= 1;
        }
        while i < top && pow[i] < r {
            i += 1;
        }
        let q = lo + i as u32;
        q_min = q_min.min(q);
        q_max = q_max.max(q);
        qs.push(q);
    }
    let q_width = 32 - (q_max - q_min).leading_zeros();
    Quantized {
        sum,
        q_min,
        q_width,
        qs,
    }
}

/// log2 of a finite `x >= 1` to within about 2e-5: the exponent from the
/// bits, the mantissa's log from the atanh series
/// `ln m = 2 (t + t^3/3 + t^5/5 + t^7/7 + ...)`, `t = (m-1)/(m+1) <= 1/3`.
#[inline]
fn fast_log2(x: f64) -> f64 {
    let bits = x.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    let ln_m = 2.0 * t * (1.0 + t2 * (1.0 / 3.0 + t2 * (1.0 / 5.0 + t2 * (1.0 / 7.0))));
    e as f64 + ln_m * std::f64::consts::LOG2_E
}

/// Decoded magnitude for quantization integer `q`, as f32.
///
/// The f64 result is finite (`sum` is, and the divisor is > 1 for q >= 1).
/// It is clamped to the f32 magnitudes a kept value can have, from the
/// smallest subnormal to `f32::MAX`: the original lies in that range, so
/// clamping only moves the result closer to it, and a kept value never
/// decodes to zero (which would break re-encoding).
#[inline]
pub(crate) fn dequantize(sum: f64, base: f64, q: u64) -> f32 {
    let m = if q == 0 {
        sum
    } else {
        sum / base.powf(q as f64 - 0.5)
    };
    m.clamp(f64::from(f32::from_bits(1)), f64::from(f32::MAX)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within_bound(v: f32, m: f64, base: f64) -> bool {
        let a = f64::from(v.abs());
        let s = base.sqrt();
        // f32 output rounding: half an ulp, or 2^-150 in the subnormal range.
        let (rel, abs) = (1.0 + 2f64.powi(-24), 2f64.powi(-150));
        m <= a * s * rel + abs && m >= a / s / rel - abs
    }

    #[test]
    fn bound_holds_over_many_magnitudes() {
        for &base in &[1.01, 1.5, 2.0, 2.5, 4.0, 1000.0] {
            let values: Vec<f32> = (0..2000)
                .map(|i| {
                    (1.0001f64.powi(i * 37) * 1e-30) as f32 * if i % 3 == 0 { -1.0 } else { 1.0 }
                })
                .chain([f32::MIN_POSITIVE / 4.0, 3.0e38])
                .collect();
            let qz = quantize(&values, base);
            for (&v, &q) in values.iter().zip(&qz.qs) {
                let m = f64::from(dequantize(qz.sum, base, q.into()));
                assert!(within_bound(v, m, base), "base {base} v {v} q {q} m {m}");
                assert!(q - qz.q_min < (1u32 << qz.q_width).max(1) || qz.q_width == 32);
            }
        }
    }

    #[test]
    fn single_and_dominant_values_are_exact() {
        let qz = quantize(&[-3.5], 2.0);
        assert_eq!(qz.qs, vec![0]);
        assert_eq!(dequantize(qz.sum, 2.0, 0), 3.5f32);
        let qz = quantize(&[1.0, 1e-30], 2.0);
        assert_eq!(qz.qs[0], 0);
        assert_eq!(dequantize(qz.sum, 2.0, 0), 1.0);
    }

    #[test]
    fn fast_log2_is_close() {
        for i in 0..10_000 {
            let x = 1.0 + f64::from(i) * 0.37 + 1e-3 * f64::from(i).powi(4);
            assert!((fast_log2(x) - x.log2()).abs() < 3e-5, "{x}");
        }
    }

    #[test]
    fn exact_powers_land_in_their_bucket() {
        // r exactly b^q must give q, not q+1.
        let qz = quantize(&[1.0, 1.0, 1.0, 1.0], 2.0);
        assert_eq!(qz.qs, vec![2; 4]);
        let qz = quantize(&[0.5, 0.25, 0.25], 2.0);
        assert_eq!(qz.qs, vec![1, 2, 2]);
    }

    #[test]
    fn all_equal_share_one_bucket() {
        let qz = quantize(&[0.25; 8], 2.0);
        assert!(qz.qs.iter().all(|&q| q == 3));
        assert_eq!(qz.q_width, 0);
    }
}
