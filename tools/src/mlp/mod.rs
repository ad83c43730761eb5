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
//!   the same vector as the per-tensor [`Layout`](gradlane::Layout) the
//!   transport chunks.
//!
//! Each has a file of its own, re-exported here: [`MlpError`] and the
//! argument checks (`error.rs`), the data (`dataset.rs`), the network
//! (`model.rs`).
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

mod dataset;
mod error;
mod model;

pub use dataset::{Dataset, MixtureSpec};
pub use error::MlpError;
pub use model::{Activation, Evaluation, Mlp};

/// Learning rate of plain SGD that trains [`Mlp::demo`] on [`Dataset::demo`].
pub const DEMO_LEARNING_RATE: f64 = 0.1;

/// Minibatch size for the demo.
pub const DEMO_BATCH: usize = 32;

/// SGD steps after which the demo model is at 0.95–0.97 test accuracy.
pub const DEMO_STEPS: usize = 500;
