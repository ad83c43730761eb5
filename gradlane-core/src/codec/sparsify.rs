//! Choosing which gradient entries travel: a magnitude threshold (the patent's
//! rule) or the top-k by magnitude.
//!
//! Magnitudes are compared as the integer bits of `|v|`: for non-negative
//! finite floats the bit order equals the numeric order, and NaN/inf have
//! larger bits than any finite value. So every selection pass lets
//! non-finite values through to the (rare) kept path, where they become a
//! typed error — the finiteness check costs nothing on the hot loop.
//!
//! Exact zeros are never kept: they carry no mass and `S / |v|` would be
//! infinite. Top-k therefore keeps fewer than `k` entries when fewer than `k`
//! are non-zero.

use super::{EncodeError, MAX_DIM};

/// Mask clearing the sign bit of an f32's bits: what remains orders like |v|.
const MAG: u32 = 0x7fff_ffff;
/// Smallest magnitude bits of a non-finite value (+inf).
const NON_FINITE: u32 = 0x7f80_0000;

/// A sparse gradient: strictly increasing u32 keys below `dim`, each with a
/// finite non-zero value.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SparseGradient {
    dim: u64,
    keys: Vec<u32>,
    values: Vec<f32>,
}

impl SparseGradient {
    /// Builds from parallel key/value vectors, checking every invariant
    /// (strictly increasing keys below `dim`, finite non-zero values).
    pub fn new(dim: u64, keys: Vec<u32>, values: Vec<f32>) -> Result<Self, EncodeError> {
        check_dim(dim)?;
        if keys.len() != values.len() {
            return Err(EncodeError::LengthMismatch {
                keys: keys.len(),
                values: values.len(),
            });
        }
        for (i, (&k, &v)) in keys.iter().zip(&values).enumerate() {
            if u64::from(k) >= dim {
                return Err(EncodeError::KeyOutOfRange { key: k, dim });
            }
            if i > 0 && keys[i - 1] >= k {
                return Err(EncodeError::UnsortedKeys(i));
            }
            if !v.is_finite() {
                return Err(EncodeError::NonFinite { index: k.into() });
            }
            if v == 0.0 {
                return Err(EncodeError::ZeroValue(k.into()));
            }
        }
        Ok(Self { dim, keys, values })
    }

    /// Builds from unordered (key, value) pairs: sorts by key and **sums
    /// duplicates** (a gradient is additive, so two contributions to one key
    /// mean their sum — the same rule the master applies when aggregating).
    /// Exact zeros, including duplicates that cancel, are dropped.
    pub fn from_pairs(
        dim: u64,
        pairs: impl IntoIterator<Item = (u32, f32)>,
    ) -> Result<Self, EncodeError> {
        check_dim(dim)?;
        let mut pairs: Vec<(u32, f32)> = pairs.into_iter().collect();
        for &(k, v) in &pairs {
            if u64::from(k) >= dim {
                return Err(EncodeError::KeyOutOfRange { key: k, dim });
            }
            if !v.is_finite() {
                return Err(EncodeError::NonFinite { index: k.into() });
            }
        }
        // Stable so duplicates are summed in input order: deterministic.
        pairs.sort_by_key(|&(k, _)| k);
        let mut keys = Vec::with_capacity(pairs.len());
        let mut values = Vec::with_capacity(pairs.len());
        let mut iter = pairs.into_iter().peekable();
        while let Some((k, mut v)) = iter.next() {
            while let Some(&(k2, v2)) = iter.peek() {
                if k2 != k {
                    break;
                }
                v += v2;
                iter.next();
            }
            if !v.is_finite() {
                return Err(EncodeError::NonFinite { index: k.into() });
            }
            if v != 0.0 {
                keys.push(k);
                values.push(v);
            }
        }
        Ok(Self { dim, keys, values })
    }

    /// Dense length the keys index into.
    pub fn dim(&self) -> u64 {
        self.dim
    }

    /// Kept keys, strictly increasing.
    pub fn keys(&self) -> &[u32] {
        &self.keys
    }

    /// Kept values, parallel to [`keys`](Self::keys).
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// Number of kept entries.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Splits into `(dim, keys, values)`.
    pub fn into_parts(self) -> (u64, Vec<u32>, Vec<f32>) {
        (self.dim, self.keys, self.values)
    }

    /// Keeps only entries with `|v| > threshold`.
    pub fn retain_threshold(mut self, threshold: f32) -> Result<Self, EncodeError> {
        let tb = threshold_bits(threshold)?;
        let mut j = 0;
        for i in 0..self.keys.len() {
            if self.values[i].to_bits() & MAG > tb {
                self.keys[j] = self.keys[i];
                self.values[j] = self.values[i];
                j += 1;
            }
        }
        self.keys.truncate(j);
        self.values.truncate(j);
        Ok(self)
    }

    /// Keeps the `k` entries of largest magnitude (ties broken by lower key).
    pub fn retain_top_k(self, k: usize) -> Self {
        let mags: Vec<u32> = self.values.iter().map(|v| v.to_bits() & MAG).collect();
        let idx: Vec<u32> = (0..self.keys.len() as u32).collect();
        let chosen = top_k_of(&idx, &mags, k);
        let keys = chosen.iter().map(|&i| self.keys[i as usize]).collect();
        let values = chosen.iter().map(|&i| self.values[i as usize]).collect();
        Self {
            dim: self.dim,
            keys,
            values,
        }
    }

    /// Constructor for callers that have already established the invariants.
    pub(crate) fn from_trusted(dim: u64, keys: Vec<u32>, values: Vec<f32>) -> Self {
        debug_assert_eq!(keys.len(), values.len());
        Self { dim, keys, values }
    }
}

fn check_dim(dim: u64) -> Result<(), EncodeError> {
    if dim > MAX_DIM {
        return Err(EncodeError::DimensionTooLarge(dim));
    }
    Ok(())
}

fn threshold_bits(threshold: f32) -> Result<u32, EncodeError> {
    // `-0.0` is accepted as zero; any other negative is a caller bug.
    if !threshold.is_finite() || threshold < 0.0 {
        return Err(EncodeError::BadThreshold(threshold));
    }
    Ok(threshold.to_bits() & MAG)
}

/// Keeps `(i, values[i])` for every `|values[i]| > threshold`, in one pass.
///
/// Keys are dense indices. Any non-finite value is an error naming its index.
pub fn threshold(values: &[f32], threshold: f32) -> Result<SparseGradient, EncodeError> {
    let dim = values.len() as u64;
    check_dim(dim)?;
    let tb = threshold_bits(threshold)?;
    let (keys, vals) = collect_above(values, tb)?;
    Ok(SparseGradient::from_trusted(dim, keys, vals))
}

/// Keeps the `k` non-zero values of largest magnitude (ties broken by lower
/// index), in O(n).
///
/// A strided sample estimates a magnitude a little below the k-th largest; one
/// pass collects the candidates at or above it, and a selection over those
/// (about `k` of them) finds the exact cut. If the estimate was too high, the
/// pass is repeated with the cut halved until it holds `k` candidates (or
/// every non-zero), so the result is always exact.
pub fn top_k(values: &[f32], k: usize) -> Result<SparseGradient, EncodeError> {
    let n = values.len();
    let dim = n as u64;
    check_dim(dim)?;
    let mut lower = estimate_lower_cut(values, k);
    loop {
        // `lower - 1` turns "at least `lower`" into the strict test the
        // scanner uses; `lower >= 1` so zeros are never candidates.
        let (keys, vals) = collect_above(values, lower - 1)?;
        if keys.len() >= k || lower == 1 {
            let mags: Vec<u32> = vals.iter().map(|v| v.to_bits() & MAG).collect();
            let chosen = top_k_of(&keys, &mags, k);
            let (mut ck, mut cv) = (Vec::with_capacity(chosen.len()), Vec::new());
            cv.reserve(chosen.len());
            for &i in &chosen {
                ck.push(keys[i as usize]);
                cv.push(vals[i as usize]);
            }
            return Ok(SparseGradient::from_trusted(dim, ck, cv));
        }
        // The sample was unlucky: halve the magnitude cut (one less in the
        // f32 exponent) rather than collecting every non-zero at once.
        lower = if lower > 2 << 23 {
            lower - (1 << 23)
        } else {
            1
        };
    }
}

/// Magnitude bits (>= 1) at which to start collecting top-k candidates.
fn estimate_lower_cut(values: &[f32], k: usize) -> u32 {
    const SAMPLES: usize = 1 << 16;
    let n = values.len();
    if k == 0 {
        // Nothing is kept, but the pass must still see every value to
        // report non-finite input: only non-finite bits reach the kept path.
        return NON_FINITE;
    }
    if n <= SAMPLES || k >= n / 8 {
        return 1;
    }
    // Evenly spaced runs of 64 contiguous values (a few cache lines each)
    // rather than single strided values: same coverage of every layer of the
    // gradient, but the hardware prefetcher can follow it.
    const RUN: usize = 64;
    let stride = n / (SAMPLES / RUN);
    let mut sample: Vec<u32> = values
        .chunks(stride)
        .flat_map(|c| c.iter().take(RUN))
        .map(|v| v.to_bits() & MAG)
        .collect();
    let m = sample.len() as f64;
    let expect = k as f64 / n as f64 * m;
    // Aim a few standard deviations past the expected rank so the candidate
    // set almost surely holds the true top k.
    let rank = (expect + 4.0 * expect.sqrt() + 16.0).ceil() as usize;
    if rank >= sample.len() {
        return 1;
    }
    let (_, nth, _) = sample.select_nth_unstable_by(rank, |a, b| b.cmp(a));
    (*nth).clamp(1, NON_FINITE)
}

/// Collects `(index, value)` with magnitude bits `> tb`; errors on the first
/// non-finite value.
fn collect_above(values: &[f32], tb: u32) -> Result<(Vec<u32>, Vec<f32>), EncodeError> {
    const LANES: usize = 32;
    let mut keys = Vec::new();
    let mut vals = Vec::new();
    let chunks = values.chunks_exact(LANES);
    let tail_start = values.len() - chunks.remainder().len();
    let (mut kbuf, mut vbuf) = ([0u32; LANES], [0f32; LANES]);
    for (c, chunk) in chunks.enumerate() {
        // Signed i32 compares (magnitude bits fit in 31 bits) map to SSE2's
        // pcmpgtd; summing the 0/1 results keeps the test branch-free, and at
        // 1% density most chunks have nothing to keep.
        let hits: u32 = chunk
            .iter()
            .map(|v| u32::from(((v.to_bits() & MAG) as i32) > tb as i32))
            .sum();
        if hits != 0 {
            // Branch-free compaction: write every element, advance only on a
            // keep, so scattered hits cost no mispredictions.
            let base = c * LANES;
            let mut n = 0usize;
            for (j, &v) in chunk.iter().enumerate() {
                kbuf[n % LANES] = (base + j) as u32;
                vbuf[n % LANES] = v;
                n += usize::from(v.to_bits() & MAG > tb);
            }
            check_finite(&kbuf[..n], &vbuf[..n])?;
            keys.extend_from_slice(&kbuf[..n]);
            vals.extend_from_slice(&vbuf[..n]);
        }
    }
    for (j, &v) in values[tail_start..].iter().enumerate() {
        if v.to_bits() & MAG > tb {
            check_finite(&[(tail_start + j) as u32], &[v])?;
            keys.push((tail_start + j) as u32);
            vals.push(v);
        }
    }
    Ok((keys, vals))
}

fn check_finite(keys: &[u32], vals: &[f32]) -> Result<(), EncodeError> {
    match vals.iter().position(|v| v.to_bits() & MAG >= NON_FINITE) {
        Some(i) => Err(EncodeError::NonFinite {
            index: keys.get(i).map_or(0, |&k| k.into()),
        }),
        None => Ok(()),
    }
}

/// Positions (into `keys`/`mags`, ascending) of the `k` largest non-zero
/// magnitudes; ties at the cut go to the earliest positions.
fn top_k_of(keys: &[u32], mags: &[u32], k: usize) -> Vec<u32> {
    debug_assert_eq!(keys.len(), mags.len());
    let nonzero = mags.iter().filter(|&&m| m != 0).count();
    if k >= nonzero {
        return (0..mags.len() as u32)
            .filter(|&i| mags[i as usize] != 0)
            .collect();
    }
    if k == 0 {
        return Vec::new();
    }
    let mut scratch = mags.to_vec();
    let (_, cut, _) = scratch.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
    let cut = *cut;
    let above = mags.iter().filter(|&&m| m > cut).count();
    let mut ties = k - above;
    let mut out = Vec::with_capacity(k);
    for (i, &m) in mags.iter().enumerate() {
        if m > cut || (m == cut && ties > 0) {
            if m == cut {
                ties -= 1;
            }
            out.push(i as u32);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_is_strict_and_skips_zero() {
        let v = [0.0, 1.0, -2.0, 0.5, -0.0, 2.0];
        let s = threshold(&v, 1.0).unwrap();
        assert_eq!(s.keys(), &[2, 5]);
        assert_eq!(s.values(), &[-2.0, 2.0]);
        let s = threshold(&v, 0.0).unwrap();
        assert_eq!(s.keys(), &[1, 2, 3, 5]);
    }

    #[test]
    fn non_finite_named() {
        let mut v = vec![0.0f32; 100];
        v[77] = f32::NAN;
        assert_eq!(
            threshold(&v, 1.0),
            Err(EncodeError::NonFinite { index: 77 })
        );
        assert_eq!(top_k(&v, 0), Err(EncodeError::NonFinite { index: 77 }));
        v[77] = f32::NEG_INFINITY;
        assert_eq!(top_k(&v, 3), Err(EncodeError::NonFinite { index: 77 }));
    }

    #[test]
    fn top_k_matches_sort_on_large_input() {
        // Large enough to take the sampling path.
        let n = 200_003usize;
        let mut x = 12345u64;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
            })
            .collect();
        for k in [1, 10, 2000, 20_000] {
            let s = top_k(&v, k).unwrap();
            let mut idx: Vec<usize> = (0..n).filter(|&i| v[i] != 0.0).collect();
            idx.sort_by(|&a, &b| v[b].abs().total_cmp(&v[a].abs()).then(a.cmp(&b)));
            let mut want: Vec<u32> = idx[..k].iter().map(|&i| i as u32).collect();
            want.sort_unstable();
            assert_eq!(s.keys(), &want[..], "k={k}");
        }
    }

    #[test]
    fn top_k_recovers_from_a_misleading_sample() {
        // Every sampled position (stride 15) is large and the rest small, so
        // the sample's cut keeps too few: the halving retry must still find
        // the exact top k.
        let n = 1_000_000usize;
        let stride = n / (1 << 16);
        assert_eq!(stride, 15);
        let v: Vec<f32> = (0..n)
            .map(|i| if i % stride == 0 { 100.0 } else { -1.0 })
            .collect();
        let k = 100_000;
        let s = top_k(&v, k).unwrap();
        assert_eq!(s.len(), k);
        let big = n.div_ceil(stride);
        assert_eq!(s.values().iter().filter(|&&x| x == 100.0).count(), big);
        // The rest are the lowest-index -1.0 entries.
        let ones: Vec<u32> = (0..n as u32)
            .filter(|&i| i as usize % stride != 0)
            .take(k - big)
            .collect();
        let mut want: Vec<u32> = (0..n as u32)
            .filter(|&i| i as usize % stride == 0)
            .chain(ones)
            .collect();
        want.sort_unstable();
        assert_eq!(s.keys(), &want[..]);
    }

    #[test]
    fn top_k_ties_and_short() {
        let v = [1.0, -1.0, 1.0, 0.0, 1.0];
        assert_eq!(top_k(&v, 2).unwrap().keys(), &[0, 1]);
        assert_eq!(top_k(&v, 10).unwrap().keys(), &[0, 1, 2, 4]);
    }

    #[test]
    fn pairs_sum_duplicates() {
        let s = SparseGradient::from_pairs(10, [(5, 1.0), (2, 3.0), (5, 2.0), (7, 1.0), (7, -1.0)])
            .unwrap();
        assert_eq!(s.keys(), &[2, 5]);
        assert_eq!(s.values(), &[3.0, 3.0]);
        assert!(matches!(
            SparseGradient::from_pairs(10, [(10, 1.0)]),
            Err(EncodeError::KeyOutOfRange { key: 10, dim: 10 })
        ));
        assert_eq!(
            SparseGradient::new(10, vec![3, 3], vec![1.0, 1.0]),
            Err(EncodeError::UnsortedKeys(1))
        );
    }
}
