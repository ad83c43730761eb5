//! Why a round could not be encoded or a datagram reframed.

use super::MIN_DATAGRAM;
use crate::classify::ClassifyError;
use crate::format::FormatError;
use crate::layout::LayoutError;
use crate::score::GradientError;
use thiserror::Error;

/// Why a round could not be encoded.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum EncodeError {
    /// The gradients do not match the layout, or hold a non-finite value.
    #[error(transparent)]
    Gradient(#[from] GradientError),
    /// The classification settings are invalid.
    #[error(transparent)]
    Classify(#[from] ClassifyError),
    /// The layout cannot be chunked with these options.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The formats cannot be used (`Log8` for the important part).
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A datagram handed to [`Encoder::reframe`] is not a valid one of this
    /// encoder's layout.
    ///
    /// [`Encoder::reframe`]: super::Encoder::reframe
    #[error("cannot reframe: {0}")]
    Reframe(#[from] crate::wire::WireError),
    /// The datagram limit cannot hold a header and one value.
    #[error("datagram limit {got} is below the minimum of {MIN_DATAGRAM} bytes")]
    DatagramTooSmall {
        /// The limit passed.
        got: usize,
    },
}
