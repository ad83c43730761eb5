//! The labelled points the MLP trains on: [`Dataset`], its seeded
//! generators (a Gaussian mixture, interleaved spirals) and its train/test
//! split. Separate from the network, which reads a dataset through its
//! accessors only.

use gradlane_core::rng::SplitMix64;

use super::error::{check_size, check_value};
use super::MlpError;

/// Labelled points: `len` rows of `dim` features, one label per row.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    dim: usize,
    /// Row-major, `len * dim` values.
    features: Vec<f32>,
    labels: Vec<u32>,
}

/// Parameters of [`Dataset::gaussian_mixture`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixtureSpec {
    /// Feature dimension.
    pub dim: usize,
    /// Number of classes (at least 2).
    pub classes: usize,
    /// Gaussian clusters per class. With `classes * clusters_per_class`
    /// well above `dim` the classes are not linearly separable.
    pub clusters_per_class: usize,
    /// Points per class, spread round-robin over its clusters.
    pub points_per_class: usize,
    /// Standard deviation of the cluster centres, per coordinate.
    pub spread: f64,
    /// Standard deviation of a point around its centre, per coordinate.
    pub noise: f64,
}

impl MixtureSpec {
    /// The demo problem: 8 dimensions, 4 classes × 8 clusters (32 clusters, 4
    /// times the dimension), 1 000 points per class, centres with spread 1 and
    /// points with noise 0.4 around them: close enough that clusters touch
    /// (the best accuracy is below 1, so there is something left to learn
    /// late in training), far enough that an MLP passes 0.95.
    pub const DEMO: Self = Self {
        dim: 8,
        classes: 4,
        clusters_per_class: 8,
        points_per_class: 1000,
        spread: 1.0,
        noise: 0.4,
    };
}

impl Dataset {
    /// A dataset from row-major features (`labels.len() * dim` values) and
    /// labels. Labels are checked against a model's classes when it uses the
    /// data, not here: a dataset does not know the model.
    pub fn new(dim: usize, features: Vec<f32>, labels: Vec<u32>) -> Result<Self, MlpError> {
        check_size("dim", dim, 1)?;
        let expected = labels.len().checked_mul(dim).ok_or(MlpError::InvalidSize {
            what: "dataset length",
            value: labels.len(),
        })?;
        if features.len() != expected {
            return Err(MlpError::FeatureLength {
                expected,
                got: features.len(),
            });
        }
        if let Some(position) = features.iter().position(|x| !x.is_finite()) {
            return Err(MlpError::NonFiniteFeature { position });
        }
        Ok(Self {
            dim,
            features,
            labels,
        })
    }

    /// Gaussian clusters, several per class: centres drawn `N(0, spread²)`
    /// per coordinate, points `N(centre, noise²)`. Classes are interleaved
    /// (sample `i` has label `i % classes`) so any prefix is balanced.
    ///
    /// Why this shape: a mixture with more clusters than dimensions puts
    /// same-class clusters on both sides of every hyperplane, so softmax
    /// regression plateaus well below what a hidden layer reaches — the gap
    /// the parameter-server experiments need to show that training works.
    pub fn gaussian_mixture(seed: u64, spec: &MixtureSpec) -> Result<Self, MlpError> {
        check_size("dim", spec.dim, 1)?;
        check_size("classes", spec.classes, 2)?;
        check_size("clusters per class", spec.clusters_per_class, 1)?;
        check_size("points per class", spec.points_per_class, 1)?;
        check_value("spread", spec.spread)?;
        check_value("noise", spec.noise)?;
        let (dim, classes, per) = (spec.dim, spec.classes, spec.clusters_per_class);
        let mut rng = SplitMix64::new(seed);
        // Centre of cluster c of class k at (k * per + c) * dim.
        let centres: Vec<f64> = (0..classes * per * dim)
            .map(|_| spec.spread * rng.normal())
            .collect();
        let n = classes * spec.points_per_class;
        let mut features = Vec::with_capacity(n * dim);
        let mut labels = Vec::with_capacity(n);
        for i in 0..spec.points_per_class {
            for k in 0..classes {
                let cluster = k * per + i % per;
                let centre = &centres[cluster * dim..(cluster + 1) * dim];
                features.extend(
                    centre
                        .iter()
                        .map(|c| (c + spec.noise * rng.normal()) as f32),
                );
                labels.push(k as u32);
            }
        }
        Self::new(dim, features, labels)
    }

    /// Interleaved 2-d spirals: arm `k` of `classes` starts at the origin at
    /// angle `2πk / classes` and winds `turns` times outwards to radius 1;
    /// Gaussian noise of standard deviation `noise` is added to the angle
    /// (scaled by the radius, so the arms stay distinct near the centre).
    /// Classes are interleaved (sample `i` has label `i % classes`).
    ///
    /// An alternative, lower-dimensional problem to
    /// [`Dataset::gaussian_mixture`]; the more `turns`, the more a classifier
    /// has to bend and the slower plain SGD fits it.
    pub fn spirals(
        seed: u64,
        classes: usize,
        points_per_class: usize,
        turns: f64,
        noise: f64,
    ) -> Result<Self, MlpError> {
        check_size("classes", classes, 2)?;
        check_size("points per class", points_per_class, 1)?;
        check_value("turns", turns)?;
        check_value("noise", noise)?;
        let mut rng = SplitMix64::new(seed);
        let mut features = Vec::with_capacity(classes * points_per_class * 2);
        let mut labels = Vec::with_capacity(classes * points_per_class);
        for i in 0..points_per_class {
            // Radius in (0, 1]: evenly spaced, so every arm is covered.
            let r = (i + 1) as f64 / points_per_class as f64;
            for k in 0..classes {
                let base = std::f64::consts::TAU * k as f64 / classes as f64;
                let theta = base + std::f64::consts::TAU * turns * r + noise * rng.normal();
                features.push((r * theta.cos()) as f32);
                features.push((r * theta.sin()) as f32);
                labels.push(k as u32);
            }
        }
        Self::new(2, features, labels)
    }

    /// The demo problem, [`MixtureSpec::DEMO`] with `seed`, split into 3 000
    /// training and 1 000 test points (the split seeded by `seed` too).
    pub fn demo(seed: u64) -> Result<(Self, Self), MlpError> {
        Self::gaussian_mixture(seed, &MixtureSpec::DEMO)?.split(seed, 1000)
    }

    /// A seeded shuffle of the samples cut into `(train, test)`, `test` of
    /// them in the test set. Shuffling first keeps the split unbiased for
    /// generators whose sample order carries structure (the spirals' radius).
    pub fn split(&self, seed: u64, test: usize) -> Result<(Self, Self), MlpError> {
        let len = self.len();
        if test == 0 || test >= len {
            return Err(MlpError::Split { test, len });
        }
        let mut order: Vec<usize> = (0..len).collect();
        let mut rng = SplitMix64::new(seed);
        // Fisher–Yates.
        for i in (1..len).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let (test_idx, train_idx) = order.split_at(test);
        Ok((self.subset(train_idx), self.subset(test_idx)))
    }

    /// The samples at `indices` (all in range), in that order.
    fn subset(&self, indices: &[usize]) -> Self {
        let mut features = Vec::with_capacity(indices.len() * self.dim);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            features.extend_from_slice(self.features(i));
            labels.push(self.labels[i]);
        }
        Self {
            dim: self.dim,
            features,
            labels,
        }
    }

    /// Feature dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True if there are no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Features of sample `i`. Panics if `i >= len()`, like slice indexing.
    pub fn features(&self, i: usize) -> &[f32] {
        &self.features[i * self.dim..(i + 1) * self.dim]
    }

    /// All features, row-major.
    pub fn all_features(&self) -> &[f32] {
        &self.features
    }

    /// All labels, one per sample.
    pub fn labels(&self) -> &[u32] {
        &self.labels
    }
}
