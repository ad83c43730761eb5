//! The one random number generator of the workspace: splitmix64.
//!
//! Everything random in gradlane is seeded and reproducible: random
//! ranking (an ablation), injected loss and jitter, synthetic gradients and
//! datasets in tests, benchmarks and experiments. splitmix64 is small,
//! fast, passes BigCrush, and its n-th output can be computed directly
//! ([`SplitMix64::at`]), which the loss injector needs so that a packet's
//! fate depends on its index alone, not on how many decisions came before.

/// splitmix64: a 64-bit state advanced by a fixed odd constant, mixed on
/// output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64(u64);

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The output number `index` (from 0) of a generator seeded with
    /// `seed`, without producing the ones before it.
    pub fn at(seed: u64, index: u64) -> u64 {
        mix(seed.wrapping_add(index.wrapping_add(1).wrapping_mul(GAMMA)))
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix(self.0)
    }

    /// Uniform in `[0, 1)`, 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        unit(self.next_u64())
    }

    /// Uniform in `(0, 1)`: never 0 or 1 (for logarithms and tangents).
    pub fn open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n > 0`); the modulo bias is below 2^-40 for
    /// `n` under 2^24.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Standard normal, by Box-Muller (one output per call).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]: ln stays finite
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// 64 random bits as a uniform number in `[0, 1)` (the top 53 bits).
pub fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_access_matches_the_stream() {
        let mut g = SplitMix64::new(42);
        for i in 0..100 {
            assert_eq!(g.next_u64(), SplitMix64::at(42, i));
        }
    }

    #[test]
    fn known_output() {
        // The reference implementation's first output for seed 0.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn ranges_hold() {
        let mut g = SplitMix64::new(7);
        for _ in 0..10_000 {
            let x = g.next_f64();
            assert!((0.0..1.0).contains(&x));
            let y = g.open01();
            assert!(y > 0.0 && y < 1.0);
            assert!(g.below(13) < 13);
            assert!(g.normal().is_finite());
        }
    }
}
