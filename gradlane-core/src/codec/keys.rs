//! Key deltas with length flags (CN113487036A, step 3; docs/DESIGN.md §3).
//!
//! Sorted keys become deltas (the first key as itself). Each delta is written
//! as an `f`-bit flag choosing one of `2^f` widths, then the delta in that
//! many bits. The patent derives the widths from the largest delta; we go one
//! step further and pick them *optimally*: the cost of a scheme only depends
//! on the histogram of delta bit-lengths (33 buckets), so a small dynamic
//! program over bucket boundaries finds, for each `f` in 0..=3, the widths
//! minimising total bits, and the best `f` wins. The largest width is always
//! the largest delta's bit-length, so every delta fits.

/// Most flag bits a scheme may use (eight widths).
pub const MAX_FLAG_BITS: u32 = 3;

/// A length-flag scheme: `2^flag_bits` strictly increasing widths (each <= 32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WidthScheme {
    flag_bits: u32,
    widths: [u8; 1 << MAX_FLAG_BITS],
}

impl WidthScheme {
    /// Builds a scheme, checking `flag_bits <= 3`, exactly `2^flag_bits`
    /// widths, each <= 32 and strictly increasing. `None` if invalid.
    pub fn new(flag_bits: u32, widths: &[u8]) -> Option<Self> {
        if flag_bits > MAX_FLAG_BITS || widths.len() != 1 << flag_bits {
            return None;
        }
        if widths.iter().any(|&w| w > 32) || widths.windows(2).any(|p| p[0] >= p[1]) {
            return None;
        }
        let mut ws = [0u8; 1 << MAX_FLAG_BITS];
        ws[..widths.len()].copy_from_slice(widths);
        Some(Self {
            flag_bits,
            widths: ws,
        })
    }

    /// Bits per flag.
    pub fn flag_bits(&self) -> u32 {
        self.flag_bits
    }

    /// The widths, indexed by flag value.
    pub fn widths(&self) -> &[u8] {
        &self.widths[..1 << self.flag_bits]
    }

    /// Picks the cheapest scheme for these sorted keys.
    pub fn optimal_for(keys: &[u32]) -> Self {
        Self::optimal_for_histogram(&delta_histogram(keys))
    }

    /// Picks the cheapest scheme for a histogram of delta bit-lengths.
    pub fn optimal_for_histogram(hist: &[u64; 33]) -> Self {
        let max_len = hist.iter().rposition(|&c| c != 0).unwrap_or(0);
        let n: u64 = hist.iter().sum();
        let mut best: Option<(u64, Self)> = None;
        for f in 0..=MAX_FLAG_BITS {
            let m = 1usize << f;
            if m > max_len + 1 {
                break;
            }
            let (bits, widths) = best_widths(hist, max_len, m);
            let cost = bits + n * u64::from(f);
            if best.is_none_or(|(c, _)| cost < c) {
                if let Some(s) = Self::new(f, &widths) {
                    best = Some((cost, s));
                }
            }
        }
        // `f = 0` with the single width `max_len` is always feasible.
        best.map_or(
            Self {
                flag_bits: 0,
                widths: [max_len as u8; 8],
            },
            |(_, s)| s,
        )
    }

    /// For each delta bit-length 0..=32, the flag and width to write it
    /// with: the smallest width that fits. Lengths above the largest width
    /// (impossible for a scheme built from the same keys) map to the widest.
    pub(crate) fn lookup(&self) -> [(u32, u32); 33] {
        let ws = self.widths();
        let last = ws.len() - 1;
        std::array::from_fn(|len| {
            let f = ws
                .iter()
                .position(|&w| usize::from(w) >= len)
                .unwrap_or(last);
            (f as u32, u32::from(ws[f]))
        })
    }

    /// Total bits of flags plus deltas for a histogram of delta bit-lengths.
    pub(crate) fn cost(&self, hist: &[u64; 33]) -> u64 {
        let lut = self.lookup();
        hist.iter()
            .zip(lut)
            .map(|(&c, (_, w))| c * u64::from(w + self.flag_bits))
            .sum()
    }
}

/// Histogram of the bit-lengths of the deltas of sorted keys.
pub(crate) fn delta_histogram(keys: &[u32]) -> [u64; 33] {
    let mut hist = [0u64; 33];
    let mut prev = 0u32;
    for &k in keys {
        hist[bit_len(k.wrapping_sub(prev)) as usize] += 1;
        prev = k;
    }
    hist
}

/// Bits needed to write `x` (0 for 0).
#[inline]
pub(crate) fn bit_len(x: u32) -> u32 {
    32 - x.leading_zeros()
}

/// Exactly `m` strictly increasing widths ending at `max_len`, minimising
/// `sum_l hist[l] * (smallest width >= l)`; returns (bits, widths).
fn best_widths(hist: &[u64; 33], max_len: usize, m: usize) -> (u64, Vec<u8>) {
    const INF: u64 = u64::MAX / 4;
    // cum[l] = number of deltas with bit-length < l.
    let mut cum = [0u64; 34];
    for l in 0..33 {
        cum[l + 1] = cum[l] + hist[l];
    }
    // dp[j][w]: least bits for lengths 0..=w using j+1 widths, the largest
    // being w; from[j][w] is the previous width.
    let mut dp = vec![[INF; 33]; m];
    let mut from = vec![[0usize; 33]; m];
    for w in 0..=max_len {
        dp[0][w] = w as u64 * cum[w + 1];
    }
    for j in 1..m {
        for w in j..=max_len {
            for p in (j - 1)..w {
                if dp[j - 1][p] == INF {
                    continue;
                }
                let c = dp[j - 1][p] + w as u64 * (cum[w + 1] - cum[p + 1]);
                if c < dp[j][w] {
                    dp[j][w] = c;
                    from[j][w] = p;
                }
            }
        }
    }
    let mut widths = vec![0u8; m];
    let mut w = max_len;
    for j in (0..m).rev() {
        widths[j] = w as u8;
        w = from[j][w];
    }
    (dp[m - 1][max_len], widths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dp_matches_brute_force() {
        let hist_sets: [[u64; 33]; 3] = [
            {
                let mut h = [0; 33];
                h[3] = 10;
                h[7] = 100;
                h[8] = 50;
                h[20] = 1;
                h
            },
            {
                let mut h = [0; 33];
                h[32] = 1;
                h[1] = 1000;
                h[2] = 5;
                h
            },
            {
                let mut h = [0; 33];
                for (l, c) in h.iter_mut().enumerate().take(12) {
                    *c = (l as u64 * 37) % 11 + 1;
                }
                h
            },
        ];
        for hist in &hist_sets {
            let max_len = hist.iter().rposition(|&c| c != 0).unwrap();
            for m in [1usize, 2, 4] {
                let (bits, ws) = best_widths(hist, max_len, m);
                // brute force over all (m-1)-subsets of 0..max_len.
                let mut best = u64::MAX;
                let cands: Vec<usize> = (0..max_len).collect();
                let mut stack = vec![(0usize, Vec::<usize>::new())];
                while let Some((start, chosen)) = stack.pop() {
                    if chosen.len() == m - 1 {
                        let mut w = chosen.clone();
                        w.push(max_len);
                        let c: u64 = (0..=max_len)
                            .map(|l| hist[l] * *w.iter().find(|&&x| x >= l).unwrap() as u64)
                            .sum();
                        best = best.min(c);
                        continue;
                    }
                    for (i, &c) in cands.iter().enumerate().skip(start) {
                        let mut c2 = chosen.clone();
                        c2.push(c);
                        stack.push((i + 1, c2));
                    }
                }
                assert_eq!(bits, best, "m={m}");
                assert_eq!(ws.len(), m);
                assert_eq!(*ws.last().unwrap() as usize, max_len);
            }
        }
    }

    #[test]
    fn scheme_fits_every_delta() {
        let keys = [0u32, 1, 5, 1000, 1001, u32::MAX - 1, u32::MAX];
        let s = WidthScheme::optimal_for(&keys);
        assert_eq!(*s.widths().last().unwrap(), 32);
        let lut = s.lookup();
        let mut prev = 0;
        for &k in &keys {
            let len = bit_len(k - prev);
            let (f, w) = lut[len as usize];
            assert!(w >= len && s.widths()[f as usize] as u32 == w);
            prev = k;
        }
        let empty = WidthScheme::optimal_for(&[]);
        assert_eq!(empty.widths(), &[0]);
    }

    #[test]
    fn rejects_bad_schemes() {
        assert!(WidthScheme::new(1, &[3, 3]).is_none());
        assert!(WidthScheme::new(1, &[3]).is_none());
        assert!(WidthScheme::new(0, &[33]).is_none());
        assert!(WidthScheme::new(4, &[0; 16]).is_none());
        assert!(WidthScheme::new(2, &[1, 2, 5, 32]).is_some());
    }
}
