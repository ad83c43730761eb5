//! Setup the fuzz targets share (a module of theirs, not a target).

use gradlane_core::layout::{Layout, TensorSpec};

/// Small enough that a round frames in microseconds, with tensors smaller
/// than a chunk, of one chunk and of many, and a convolution.
pub fn layout() -> Layout {
    Layout::new(vec![
        TensorSpec::conv2d("conv", [4, 3, 3, 3]),
        TensorSpec::dense("bias", [5]),
        TensorSpec::dense("fc", [10, 37]),
        TensorSpec::dense("scalar", [1]),
    ])
    .expect("a valid layout")
}
