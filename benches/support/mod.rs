//! Seeded synthetic gradients shared by the codec bench and the codec_table
//! example (included with `#[path]`, so no extra dependency is needed).
#![allow(dead_code)]

/// Number of parameters of ResNet-50.
pub const RESNET50: usize = 25_557_032;

/// splitmix64: tiny, seedable, good enough to drive a distribution.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1), never 0 or 1.
    pub fn open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller, one output per call for simplicity).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.open01(), self.open01());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// Shape of the synthetic gradient.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dist {
    /// Student-t with 3 degrees of freedom: heavy polynomial tail.
    StudentT3,
    /// Laplace: exponential tail.
    Laplace,
    /// Cauchy: extreme tail (Student-t with 1 degree of freedom).
    Cauchy,
}

/// `n` values scaled to gradient-like magnitudes (1e-3).
pub fn gradient(n: usize, seed: u64, dist: Dist) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    (0..n)
        .map(|_| {
            let x = match dist {
                Dist::StudentT3 => {
                    let z = rng.normal();
                    let chi2: f64 = (0..3).map(|_| rng.normal().powi(2)).sum();
                    z / (chi2 / 3.0).sqrt()
                }
                Dist::Laplace => {
                    let u = rng.open01() - 0.5;
                    -u.signum() * (1.0 - 2.0 * u.abs()).ln()
                }
                Dist::Cauchy => (std::f64::consts::PI * (rng.open01() - 0.5)).tan(),
            };
            (x * 1e-3) as f32
        })
        .collect()
}
