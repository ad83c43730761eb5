//! The network: [`Mlp`] (shape, flat-parameter layout, initialisation,
//! gradient and evaluation), its [`Activation`] and [`Evaluation`]. The
//! flat parameter order is described in the [module docs](crate::mlp).

use gradlane::{Layout, TensorSpec};
use gradlane_core::rng::SplitMix64;

use super::error::check_size;
use super::{Dataset, MlpError};

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
/// order described in the [module docs](crate::mlp).
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
            let label = data.labels()[i] as usize;
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
            let label = data.labels()[i] as usize;
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
        if data.dim() != self.input {
            return Err(MlpError::InputDim {
                expected: self.input,
                got: data.dim(),
            });
        }
        Ok(())
    }

    fn check_label(&self, data: &Dataset, sample: usize) -> Result<(), MlpError> {
        let label = data.labels()[sample];
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
