//! Seeded synthetic gradients of a chosen distribution, for the codec's
//! benchmark and table.

use gradlane_core::rng::SplitMix64;

/// Number of parameters of ResNet-50.
pub const RESNET50: usize = 25_557_032;

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
    let mut rng = SplitMix64::new(seed);
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
