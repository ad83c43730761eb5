//! A small real model for the parameter server to train: a multi-layer
//! perceptron on a seeded synthetic classification problem.
//!
//! [`sim`](crate::sim)'s least squares is convex and quadratic; this is the
//! next step up — a non-convex model whose gradient is worth sending, with
//! tensors shaped like a real network's, and still small, pure and
//! deterministic (no sockets, no clock, no threads, no floating-point
//! reductions whose order depends on anything but the inputs).
//!
//! * [`Dataset`] — features (`f32`) and labels (`u32`). Two generators:
//!   [`Dataset::gaussian_mixture`] (several Gaussian clusters per class, more
//!   clusters than dimensions, so a linear model cannot separate them) and
//!   [`Dataset::spirals`] (interleaved 2-d spiral arms). [`Dataset::split`]
//!   makes a train/test split.
//! * [`Mlp`] — dense layers, ReLU or tanh hidden units, softmax cross-entropy
//!   output. Parameters are one flat `Vec<f32>`; [`Mlp::layout`] describes
//!   the same vector as the per-tensor [`Layout`] the transport chunks.
//!
//! # Flat parameter order
//!
//! Layer `l` (0-based, the output layer last) maps `n_l` inputs to `n_{l+1}`
//! outputs and contributes, in this order:
//!
//! 1. `fc{l}.weight`, shape `[n_{l+1}, n_l]`, row-major: the weight from
//!    input `i` to output `o` is at `o * n_l + i` within the tensor;
//! 2. `fc{l}.bias`, shape `[n_{l+1}]`.
//!
//! Layers follow each other, so the flat vector is
//! `fc0.weight, fc0.bias, fc1.weight, fc1.bias, …` — exactly the layout's
//! tensors concatenated in layout order (the same convention as a PyTorch
//! `state_dict` of `nn.Linear` layers).
//!
//! # Demo defaults
//!
//! [`Dataset::demo`] and [`Mlp::demo`] are sized for a parameter-server
//! demo: 4 000 points (3 000 train, 1 000 test) in 8 dimensions, 4 classes of
//! 8 clusters each, and a 8 → 128 → 64 → 4 ReLU network with 9 668
//! parameters in 6 tensors. Plain minibatch SGD from [`Mlp::init`] with
//! [`DEMO_LEARNING_RATE`] (0.1) and [`DEMO_BATCH`] (32) passes 0.9 test
//! accuracy after 100–200 steps and sits at about 0.95–0.97 by [`DEMO_STEPS`]
//! (500; measured on seeds 1–3; `tests/ps_mlp.rs` asserts ≥ 0.93 for seed
//! 1). Softmax regression on the same data ([`Mlp::new`] with no hidden
//! layers) plateaus at 0.53–0.61 test accuracy within 250 steps and stays there. A
//! learning rate of 0.2 behaves alike (measured too).
//!
//! ```
//! use gradlane_tools::mlp::{Dataset, Mlp, DEMO_BATCH, DEMO_LEARNING_RATE};
//! use gradlane_core::rng::SplitMix64;
//!
//! # fn main() -> Result<(), gradlane_tools::mlp::MlpError> {
//! let (train, test) = Dataset::demo(7)?;
//! let model = Mlp::demo();
//! let mut params = model.init(7);
//! let mut grad = vec![0.0f32; model.param_count()];
//! let mut rng = SplitMix64::new(7);
//! let mut batch = vec![0usize; DEMO_BATCH];
//! for _ in 0..50 {
//!     batch.iter_mut().for_each(|i| *i = rng.below(train.len()));
//!     model.gradient(&params, &train, &batch, &mut grad)?;
//!     for (p, g) in params.iter_mut().zip(&grad) {
//!         *p -= DEMO_LEARNING_RATE as f32 * g;
//!     }
//! }
//! let eval = model.evaluate(&params, &test)?;
//! assert!(eval.accuracy > 0.3 && eval.loss.is_finite());
//! # Ok(())
//! # }
//! ```

use thiserror::Error;

use gradlane::{Layout, LayoutError, TensorSpec};
use gradlane_core::rng::SplitMix64;

/// Learning rate of plain SGD that trains [`Mlp::demo`] on [`Dataset::demo`].
pub const DEMO_LEARNING_RATE: f64 = 0.1;

/// Minibatch size for the demo.
pub const DEMO_BATCH: usize = 32;

/// SGD steps after which the demo model is at 0.95–0.97 test accuracy.
pub const DEMO_STEPS: usize = 500;

/// Why a dataset or model call was refused. Every check runs before any
/// output is written, so a refused call leaves its output buffer untouched.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum MlpError {
    /// A size that must be positive is zero (input dimension, hidden width,
    /// points per class, …), or fewer than two classes.
    #[error("invalid {what}: {value}")]
    InvalidSize {
        /// Which size.
        what: &'static str,
        /// The value given.
        value: usize,
    },
    /// A real-valued generator argument (noise, spread) is negative or not
    /// finite.
    #[error("invalid {what}: {value}")]
    InvalidValue {
        /// Which argument.
        what: &'static str,
        /// The value given.
        value: f64,
    },
    /// The parameter vector has the wrong length.
    #[error("params length {got}, expected {expected}")]
    ParamLength {
        /// [`Mlp::param_count`].
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// The gradient output buffer has the wrong length.
    #[error("gradient buffer length {got}, expected {expected}")]
    GradientLength {
        /// [`Mlp::param_count`].
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// A parameter is NaN or infinite.
    #[error("non-finite param at {position}")]
    NonFiniteParam {
        /// Index of the first bad value in the flat vector.
        position: usize,
    },
    /// A feature is NaN or infinite.
    #[error("non-finite feature at {position}")]
    NonFiniteFeature {
        /// Index of the first bad value in the flat feature vector.
        position: usize,
    },
    /// The feature vector is not `labels.len() * dim` long.
    #[error("features length {got}, expected {expected}")]
    FeatureLength {
        /// `labels.len() * dim`.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// The dataset's feature dimension is not the model's input dimension.
    #[error("data dim {got}, model input {expected}")]
    InputDim {
        /// The model's input dimension.
        expected: usize,
        /// The dataset's dimension.
        got: usize,
    },
    /// A gradient needs at least one sample.
    #[error("empty batch")]
    EmptyBatch,
    /// Evaluation needs at least one sample.
    #[error("empty dataset")]
    EmptyDataset,
    /// A batch index is not a sample of the dataset.
    #[error("batch index {index} out of range for {len} samples")]
    BatchIndex {
        /// The bad index.
        index: usize,
        /// The dataset's length.
        len: usize,
    },
    /// A sample's label is not a class of the model.
    #[error("label {label} of sample {sample} not below {classes} classes")]
    Label {
        /// The sample's index in the dataset.
        sample: usize,
        /// Its label.
        label: u32,
        /// The model's class count.
        classes: usize,
    },
    /// The model's tensors do not form a valid [`Layout`] (a weight matrix
    /// larger than the wire format's 4 GiB per tensor).
    #[error("layout: {0}")]
    Layout(#[from] LayoutError),
    /// A split needs at least one sample on each side.
    #[error("test size {test} leaves no split of {len} samples")]
    Split {
        /// Requested test size.
        test: usize,
        /// The dataset's length.
        len: usize,
    },
}

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

/// Checks a generator's real-valued argument.
fn check_value(what: &'static str, value: f64) -> Result<(), MlpError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(MlpError::InvalidValue { what, value })
    }
}

/// Checks a size that must be at least `min`.
fn check_size(what: &'static str, value: usize, min: usize) -> Result<(), MlpError> {
    if value >= min {
        Ok(())
    } else {
        Err(MlpError::InvalidSize { what, value })
    }
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

/// Nonlinearity of the hidden layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    /// `max(0, x)`, He-initialised (the default).
    #[default]
    Relu,
    /// `tanh(x)`, Xavier-initialised. Smooth everywhere, which makes it the
    /// better choice for finite-difference checks.
    Tanh,
}

impl Activation {
    fn apply(self, x: f64) -> f64 {
        match self {
            Self::Relu => x.max(0.0),
            Self::Tanh => x.tanh(),
        }
    }

    /// The derivative expressed through the activation's *output* `y`, so the
    /// backward pass needs only the stored post-activations.
    fn derivative_from_output(self, y: f64) -> f64 {
        match self {
            Self::Relu => {
                if y > 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            Self::Tanh => 1.0 - y * y,
        }
    }
}

/// Shape of one dense layer and where its tensors sit in the flat vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dense {
    inputs: usize,
    outputs: usize,
    /// Offset of the `[outputs, inputs]` weight in the flat vector.
    weight: usize,
    /// Offset of the `[outputs]` bias; always `weight + outputs * inputs`.
    bias: usize,
}

/// Loss and accuracy of a model on a dataset.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean softmax cross-entropy (natural log).
    pub loss: f64,
    /// Fraction of samples whose highest logit is their label (ties go to the
    /// lower class).
    pub accuracy: f64,
}

/// A multi-layer perceptron: dense layers with a hidden nonlinearity and a
/// softmax cross-entropy output. The struct holds only the shape; parameters
/// live in a flat `&[f32]` owned by the caller (the parameter server), in the
/// order described in the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mlp {
    input: usize,
    hidden: Vec<usize>,
    classes: usize,
    activation: Activation,
    layers: Vec<Dense>,
    param_count: usize,
    /// Built and validated once in [`Mlp::new`], so [`Mlp::layout`] cannot fail.
    layout: Layout,
}

/// Per-call working memory, allocated once per [`Mlp::gradient`] or
/// [`Mlp::evaluate`] call and reused for every sample.
struct Scratch {
    /// The parameters widened to `f64` once per call rather than per use.
    params: Vec<f64>,
    /// `acts[0]` is the input, `acts[l + 1]` the output of layer `l` (after
    /// the nonlinearity for hidden layers; the logits, then the softmax
    /// probabilities, for the last).
    acts: Vec<Vec<f64>>,
}

impl Mlp {
    /// A network `input → hidden[0] → … → classes`. `hidden` may be empty:
    /// that is softmax (multinomial logistic) regression, the linear
    /// baseline. Refuses zero sizes, fewer than two classes, and a weight
    /// tensor too large for the wire format ([`MlpError::Layout`]).
    pub fn new(
        input: usize,
        hidden: &[usize],
        classes: usize,
        activation: Activation,
    ) -> Result<Self, MlpError> {
        check_size("input dim", input, 1)?;
        check_size("classes", classes, 2)?;
        for &h in hidden {
            check_size("hidden width", h, 1)?;
        }
        let mut layers = Vec::with_capacity(hidden.len() + 1);
        let mut offset = 0usize;
        let mut inputs = input;
        for &outputs in hidden.iter().chain(std::iter::once(&classes)) {
            let too_big = MlpError::InvalidSize {
                what: "param count",
                value: usize::MAX,
            };
            let weight_len = outputs.checked_mul(inputs).ok_or(too_big.clone())?;
            let bias = offset.checked_add(weight_len).ok_or(too_big.clone())?;
            layers.push(Dense {
                inputs,
                outputs,
                weight: offset,
                bias,
            });
            offset = bias.checked_add(outputs).ok_or(too_big)?;
            inputs = outputs;
        }
        let layout = Layout::new(
            layers
                .iter()
                .enumerate()
                .flat_map(|(l, d)| {
                    [
                        TensorSpec::dense(format!("fc{l}.weight"), [d.outputs, d.inputs]),
                        TensorSpec::dense(format!("fc{l}.bias"), [d.outputs]),
                    ]
                })
                .collect(),
        )?;
        Ok(Self {
            input,
            hidden: hidden.to_vec(),
            classes,
            activation,
            layers,
            param_count: offset,
            layout,
        })
    }

    /// The demo model for [`Dataset::demo`]: 8 → 128 → 64 → 4, ReLU,
    /// 9 668 parameters in 6 tensors.
    pub fn demo() -> Self {
        // A constant shape far below every limit; the tests build it.
        Self::new(8, &[128, 64], 4, Activation::Relu).expect("the demo shape is valid")
    }

    /// Input dimension.
    pub fn input_dim(&self) -> usize {
        self.input
    }

    /// Hidden layer widths, input side first.
    pub fn hidden(&self) -> &[usize] {
        &self.hidden
    }

    /// Number of classes (output width).
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// The hidden nonlinearity.
    pub fn activation(&self) -> Activation {
        self.activation
    }

    /// Length of the flat parameter (and gradient) vector.
    pub fn param_count(&self) -> usize {
        self.param_count
    }

    /// The parameters as tensors `fc0.weight [h0, input]`, `fc0.bias [h0]`,
    /// …, `fc{L}.weight [classes, h_{L-1}]`, `fc{L}.bias [classes]`, all
    /// dense; their concatenation in this order is the flat vector.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Fresh parameters: weights `N(0, σ²)` with `σ = sqrt(2 / fan_in)`
    /// (He) before ReLU and `sqrt(1 / fan_in)` (Xavier/LeCun) before tanh
    /// and for the output layer, biases zero. The scale keeps activations
    /// around unit variance from layer to layer, so SGD starts neither
    /// saturated nor vanishing. Same seed, same vector.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut rng = SplitMix64::new(seed);
        let mut params = vec![0.0f32; self.param_count];
        let last = self.layers.len() - 1;
        for (l, d) in self.layers.iter().enumerate() {
            let gain = if l < last && self.activation == Activation::Relu {
                2.0
            } else {
                1.0
            };
            let sigma = (gain / d.inputs as f64).sqrt();
            for w in &mut params[d.weight..d.bias] {
                *w = (sigma * rng.normal()) as f32;
            }
        }
        params
    }

    /// Mean softmax cross-entropy gradient over the samples `batch` (indices
    /// into `data`, repeats allowed) written into `out`; returns the mean loss
    /// over the batch, evaluated at `params`.
    ///
    /// Computed in `f64` and rounded to `f32` once at the end, so rounding
    /// error does not grow with the batch and a finite-difference check can
    /// be tight. All inputs are checked first; on error `out` is
    /// untouched.
    pub fn gradient(
        &self,
        params: &[f32],
        data: &Dataset,
        batch: &[usize],
        out: &mut [f32],
    ) -> Result<f64, MlpError> {
        self.check_params(params)?;
        if out.len() != self.param_count {
            return Err(MlpError::GradientLength {
                expected: self.param_count,
                got: out.len(),
            });
        }
        self.check_data(data)?;
        if batch.is_empty() {
            return Err(MlpError::EmptyBatch);
        }
        for &index in batch {
            if index >= data.len() {
                return Err(MlpError::BatchIndex {
                    index,
                    len: data.len(),
                });
            }
            self.check_label(data, index)?;
        }

        let mut scratch = self.scratch(params);
        let mut grad = vec![0.0f64; self.param_count];
        // Backward deltas: the current layer's and the one below it, sized for
        // the widest layer and reused.
        let widest = self.layers.iter().map(|d| d.outputs).max().unwrap_or(0);
        let mut delta = vec![0.0f64; widest];
        let mut below = vec![0.0f64; widest];
        let mut loss = 0.0f64;

        for &i in batch {
            let label = data.labels[i] as usize;
            loss += self.forward(&mut scratch, data.features(i), label);
            // dLoss/dlogits = softmax - onehot.
            let probs = &scratch.acts[self.layers.len()];
            delta[..self.classes].copy_from_slice(probs);
            delta[label] -= 1.0;
            for (l, d) in self.layers.iter().enumerate().rev() {
                let x = &scratch.acts[l];
                for (o, &g) in delta[..d.outputs].iter().enumerate() {
                    let row = d.weight + o * d.inputs;
                    for (gw, xi) in grad[row..row + d.inputs].iter_mut().zip(x) {
                        *gw += g * xi;
                    }
                    grad[d.bias + o] += g;
                }
                if l == 0 {
                    break; // no gradient needed for the input
                }
                let below = &mut below[..d.inputs];
                below.fill(0.0);
                for (o, &g) in delta[..d.outputs].iter().enumerate() {
                    let row = d.weight + o * d.inputs;
                    for (b, w) in below.iter_mut().zip(&scratch.params[row..row + d.inputs]) {
                        *b += w * g;
                    }
                }
                for (b, &y) in below.iter_mut().zip(x) {
                    *b *= self.activation.derivative_from_output(y);
                }
                delta[..d.inputs].copy_from_slice(below);
            }
        }

        let inv = 1.0 / batch.len() as f64;
        for (o, g) in out.iter_mut().zip(&grad) {
            *o = (g * inv) as f32;
        }
        Ok(loss * inv)
    }

    /// Mean loss and accuracy over every sample of `data`.
    pub fn evaluate(&self, params: &[f32], data: &Dataset) -> Result<Evaluation, MlpError> {
        self.check_params(params)?;
        self.check_data(data)?;
        if data.is_empty() {
            return Err(MlpError::EmptyDataset);
        }
        for i in 0..data.len() {
            self.check_label(data, i)?;
        }
        let mut scratch = self.scratch(params);
        let mut loss = 0.0f64;
        let mut correct = 0usize;
        for i in 0..data.len() {
            let label = data.labels[i] as usize;
            loss += self.forward(&mut scratch, data.features(i), label);
            let probs = &scratch.acts[self.layers.len()];
            // First maximum wins, so ties resolve the same way every run.
            let best = probs
                .iter()
                .enumerate()
                .fold(0, |b, (k, &p)| if p > probs[b] { k } else { b });
            correct += usize::from(best == label);
        }
        let n = data.len() as f64;
        Ok(Evaluation {
            loss: loss / n,
            accuracy: correct as f64 / n,
        })
    }

    fn check_params(&self, params: &[f32]) -> Result<(), MlpError> {
        if params.len() != self.param_count {
            return Err(MlpError::ParamLength {
                expected: self.param_count,
                got: params.len(),
            });
        }
        if let Some(position) = params.iter().position(|x| !x.is_finite()) {
            return Err(MlpError::NonFiniteParam { position });
        }
        Ok(())
    }

    fn check_data(&self, data: &Dataset) -> Result<(), MlpError> {
        if data.dim != self.input {
            return Err(MlpError::InputDim {
                expected: self.input,
                got: data.dim,
            });
        }
        Ok(())
    }

    fn check_label(&self, data: &Dataset, sample: usize) -> Result<(), MlpError> {
        let label = data.labels[sample];
        if label as usize >= self.classes {
            return Err(MlpError::Label {
                sample,
                label,
                classes: self.classes,
            });
        }
        Ok(())
    }

    fn scratch(&self, params: &[f32]) -> Scratch {
        let mut acts = Vec::with_capacity(self.layers.len() + 1);
        acts.push(vec![0.0; self.input]);
        acts.extend(self.layers.iter().map(|d| vec![0.0; d.outputs]));
        Scratch {
            params: params.iter().map(|&p| f64::from(p)).collect(),
            acts,
        }
    }

    /// Runs one sample forward, leaving every layer's output in
    /// `scratch.acts` (softmax probabilities last), and returns its
    /// cross-entropy loss for `label`.
    fn forward(&self, scratch: &mut Scratch, x: &[f32], label: usize) -> f64 {
        for (a, &v) in scratch.acts[0].iter_mut().zip(x) {
            *a = f64::from(v);
        }
        let last = self.layers.len() - 1;
        for (l, d) in self.layers.iter().enumerate() {
            let (lower, upper) = scratch.acts.split_at_mut(l + 1);
            let (x, y) = (&lower[l], &mut upper[0]);
            for (o, yo) in y.iter_mut().enumerate() {
                let row = d.weight + o * d.inputs;
                let w = &scratch.params[row..row + d.inputs];
                let z = scratch.params[d.bias + o]
                    + w.iter().zip(x.iter()).map(|(w, x)| w * x).sum::<f64>();
                *yo = if l < last {
                    self.activation.apply(z)
                } else {
                    z
                };
            }
        }
        // Softmax with the maximum subtracted, so exp never overflows and the
        // loss log(sum exp) - logit[label] stays finite for finite logits.
        let logits = &mut scratch.acts[last + 1];
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let shifted_label = logits[label] - max;
        let mut sum = 0.0;
        for z in logits.iter_mut() {
            *z = (*z - max).exp();
            sum += *z;
        }
        // From the shifted logit, not ln(p): p may underflow to 0 when the
        // model is confidently wrong, the logit difference does not.
        let loss = sum.ln() - shifted_label;
        for p in logits.iter_mut() {
            *p /= sum;
        }
        loss
    }
}
