//! Why a dataset or model call is refused ([`MlpError`]), and the checks
//! of sizes and values that both the data generators and the network use.

use gradlane::LayoutError;
use thiserror::Error;

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
        /// [`Mlp::param_count`](super::Mlp::param_count).
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// The gradient output buffer has the wrong length.
    #[error("gradient buffer length {got}, expected {expected}")]
    GradientLength {
        /// [`Mlp::param_count`](super::Mlp::param_count).
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
    /// The model's tensors do not form a valid [`Layout`](gradlane::Layout) (a weight matrix
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

/// Checks a generator's real-valued argument.
pub(super) fn check_value(what: &'static str, value: f64) -> Result<(), MlpError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(MlpError::InvalidValue { what, value })
    }
}

/// Checks a size that must be at least `min`.
pub(super) fn check_size(what: &'static str, value: usize, min: usize) -> Result<(), MlpError> {
    if value >= min {
        Ok(())
    } else {
        Err(MlpError::InvalidSize { what, value })
    }
}
