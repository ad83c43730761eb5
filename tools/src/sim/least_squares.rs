//! The problem the simulated workers train on: least squares on seeded
//! synthetic data with column scales spread over a chosen condition number,
//! so momentum has something to win.

use gradlane_core::rng::SplitMix64;

/// Least squares `f(w) = 1/(2n) * sum_i (x_i . w - y_i)^2` on synthetic data.
#[derive(Debug, Clone)]
pub struct LeastSquares {
    dim: usize,
    x: Vec<f64>,
    y: Vec<f64>,
    /// X^T X, X^T y and y^T y: the loss is a quadratic in w, so evaluating it
    /// costs O(dim^2) instead of O(samples * dim) — the simulation evaluates
    /// it after every server step.
    xtx: Vec<f64>,
    xty: Vec<f64>,
    yty: f64,
    optimum: f64,
}

impl LeastSquares {
    /// `samples` rows of `dim` Gaussian features, column j scaled by
    /// `condition^(-j / (2 (dim-1)))` so the Hessian's spread is about
    /// `condition`; targets from a random true model plus Gaussian noise.
    /// Returns `None` for zero sizes or a singular design.
    pub fn synthetic(
        seed: u64,
        samples: usize,
        dim: usize,
        condition: f64,
        noise: f64,
    ) -> Option<Self> {
        if samples == 0 || dim == 0 {
            return None;
        }
        let mut rng = SplitMix64::new(seed);
        let scales: Vec<f64> = (0..dim)
            .map(|j| {
                let frac = if dim > 1 {
                    j as f64 / (dim - 1) as f64
                } else {
                    0.0
                };
                condition.powf(-0.5 * frac)
            })
            .collect();
        let truth: Vec<f64> = (0..dim).map(|_| rng.normal()).collect();
        let mut x = Vec::with_capacity(samples * dim);
        let mut y = Vec::with_capacity(samples);
        for _ in 0..samples {
            let row: Vec<f64> = scales.iter().map(|s| s * rng.normal()).collect();
            let clean: f64 = row.iter().zip(&truth).map(|(a, b)| a * b).sum();
            y.push(clean + noise * rng.normal());
            x.extend(row);
        }
        let mut xtx = vec![0.0f64; dim * dim];
        let mut xty = vec![0.0f64; dim];
        for (row, yi) in x.chunks_exact(dim).zip(&y) {
            for i in 0..dim {
                for j in 0..dim {
                    xtx[i * dim + j] += row[i] * row[j];
                }
                xty[i] += row[i] * yi;
            }
        }
        let yty = y.iter().map(|v| v * v).sum();
        let mut p = Self {
            dim,
            x,
            y,
            xtx,
            xty,
            yty,
            optimum: 0.0,
        };
        let w_star = p.solve_normal_equations()?;
        p.optimum = p.loss_f64(&w_star);
        Some(p)
    }

    /// Parameter dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Number of samples.
    pub fn samples(&self) -> usize {
        self.y.len()
    }

    /// The minimum of the loss (from the normal equations).
    pub fn optimum(&self) -> f64 {
        self.optimum
    }

    /// Full-data loss at `w`.
    pub fn loss(&self, w: &[f32]) -> f64 {
        let w: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
        self.loss_f64(&w)
    }

    /// `(w^T X^T X w - 2 w^T X^T y + y^T y) / 2n`, clamped at 0 against
    /// cancellation.
    fn loss_f64(&self, w: &[f64]) -> f64 {
        let d = self.dim;
        let mut quad = 0.0;
        for i in 0..d {
            let row = &self.xtx[i * d..(i + 1) * d];
            quad += w[i] * row.iter().zip(w).map(|(a, b)| a * b).sum::<f64>();
        }
        let lin: f64 = self.xty.iter().zip(w).map(|(a, b)| a * b).sum();
        ((quad - 2.0 * lin + self.yty) / (2.0 * self.samples() as f64)).max(0.0)
    }

    /// Mean gradient over the rows in `batch`, written into `out`.
    pub fn gradient(&self, w: &[f32], batch: &[usize], out: &mut Vec<f32>) {
        let mut g = vec![0.0f64; self.dim];
        for &i in batch {
            let row = &self.x[i * self.dim..(i + 1) * self.dim];
            let r: f64 = row
                .iter()
                .zip(w)
                .map(|(a, &b)| a * f64::from(b))
                .sum::<f64>()
                - self.y[i];
            for (gj, a) in g.iter_mut().zip(row) {
                *gj += r * a;
            }
        }
        let inv = 1.0 / batch.len().max(1) as f64;
        out.clear();
        out.extend(g.iter().map(|v| (v * inv) as f32));
    }

    /// Solve `X^T X w = X^T y` by Gaussian elimination with partial pivoting.
    fn solve_normal_equations(&self) -> Option<Vec<f64>> {
        let d = self.dim;
        let mut a = vec![0.0f64; d * (d + 1)]; // augmented [X^T X | X^T y]
        for i in 0..d {
            a[i * (d + 1)..i * (d + 1) + d].copy_from_slice(&self.xtx[i * d..(i + 1) * d]);
            a[i * (d + 1) + d] = self.xty[i];
        }
        for col in 0..d {
            let pivot = (col..d).max_by(|&p, &q| {
                a[p * (d + 1) + col]
                    .abs()
                    .total_cmp(&a[q * (d + 1) + col].abs())
            })?;
            if a[pivot * (d + 1) + col].abs() < 1e-300 {
                return None;
            }
            for j in 0..=d {
                a.swap(col * (d + 1) + j, pivot * (d + 1) + j);
            }
            for r in 0..d {
                if r != col {
                    let f = a[r * (d + 1) + col] / a[col * (d + 1) + col];
                    for j in col..=d {
                        a[r * (d + 1) + j] -= f * a[col * (d + 1) + j];
                    }
                }
            }
        }
        Some(
            (0..d)
                .map(|i| a[i * (d + 1) + d] / a[i * (d + 1) + i])
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quadratic_loss_matches_residuals() {
        let p = LeastSquares::synthetic(3, 50, 4, 10.0, 0.1).unwrap();
        let w = [0.3f32, -1.0, 2.0, 0.5];
        let mut direct = 0.0;
        for (row, y) in p.x.chunks_exact(4).zip(&p.y) {
            let r: f64 = row
                .iter()
                .zip(&w)
                .map(|(a, &b)| a * f64::from(b))
                .sum::<f64>()
                - y;
            direct += r * r;
        }
        direct /= 100.0;
        assert!((p.loss(&w) - direct).abs() < 1e-9 * direct.max(1.0));
        // The optimum is a minimum: nudging any coordinate of w* raises it.
        let mut g = Vec::new();
        let all: Vec<usize> = (0..50).collect();
        p.gradient(&w, &all, &mut g);
        assert!(g.iter().any(|v| v.abs() > 1e-3));
        assert!(p.optimum() < p.loss(&w));
    }
}
