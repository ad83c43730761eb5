//! Typed errors, one enum per operation, so callers can tell a bad input
//! gradient (their bug) from a bad frame (a peer's bug or a corrupted wire).

use thiserror::Error;

/// Why a gradient could not be sparsified or encoded.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// An input value is NaN or infinite; `index` is its key (dense index).
    #[error("non-finite value at index {index}")]
    NonFinite {
        /// Key of the offending value.
        index: u64,
    },
    /// The threshold is negative, NaN or infinite.
    #[error("bad threshold {0}")]
    BadThreshold(f32),
    /// The base is not finite or lies outside `[MIN_BASE, MAX_BASE]`.
    #[error("bad base {0}")]
    BadBase(f64),
    /// The dense dimension exceeds `u32::MAX + 1`, so keys would not fit in u32.
    #[error("dimension {0} too large")]
    DimensionTooLarge(u64),
    /// A key is not below the declared dimension.
    #[error("key {key} out of range for dimension {dim}")]
    KeyOutOfRange {
        /// The offending key.
        key: u32,
        /// The declared dimension.
        dim: u64,
    },
    /// Keys and values have different lengths.
    #[error("{keys} keys but {values} values")]
    LengthMismatch {
        /// Number of keys given.
        keys: usize,
        /// Number of values given.
        values: usize,
    },
    /// Keys handed to [`SparseGradient::new`](super::SparseGradient::new) are
    /// not strictly increasing.
    #[error("keys not strictly increasing at position {0}")]
    UnsortedKeys(usize),
    /// A value handed to [`SparseGradient::new`](super::SparseGradient::new)
    /// is exactly zero; zeros carry no mass and cannot be log-quantized.
    #[error("zero value at index {0}")]
    ZeroValue(u64),
}

/// Why a byte string is not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The frame does not start with the codec magic.
    #[error("bad magic")]
    BadMagic,
    /// The frame's version is not one this build reads.
    #[error("unsupported version {0}")]
    UnsupportedVersion(u8),
    /// The frame ends before its header or payload does.
    #[error("truncated frame")]
    Truncated,
    /// The reserved header byte is not zero.
    #[error("bad reserved byte")]
    BadReserved,
    /// The declared dimension exceeds `u32::MAX + 1`.
    #[error("dimension {0} too large")]
    DimensionTooLarge(u64),
    /// The element count exceeds the dimension or what the payload can hold.
    #[error("count {0} too large")]
    CountTooLarge(u64),
    /// The base is not finite or lies outside `[MIN_BASE, MAX_BASE]`.
    #[error("bad base")]
    BadBase,
    /// The magnitude sum is negative, non-finite, or inconsistent with the count.
    #[error("bad sum")]
    BadSum,
    /// The flag scheme is invalid (too many flag bits, widths over 32 or not
    /// strictly increasing).
    #[error("bad width scheme")]
    BadWidthScheme,
    /// The q width is over 32 bits.
    #[error("bad q width {0}")]
    BadQWidth(u8),
    /// A decoded key is not below the dimension (or overflowed u32).
    #[error("key out of range")]
    KeyOutOfRange,
    /// A key delta of zero after the first key: keys must strictly increase.
    #[error("non-increasing keys")]
    NonIncreasingKeys,
    /// Bytes (or non-zero padding bits) remain after the last element.
    #[error("trailing bytes")]
    TrailingBytes,
    /// The output slice's length differs from the frame's dimension.
    #[error("dimension mismatch: frame {frame}, output {output}")]
    DimensionMismatch {
        /// Dimension declared by the frame.
        frame: u64,
        /// Length of the caller's slice.
        output: usize,
    },
}

/// Why a set of worker frames could not be aggregated.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum AggregateError {
    /// Frame number `index` (0-based) is invalid; nothing was added.
    #[error("frame {index}: {source}")]
    Frame {
        /// Position of the bad frame in the input.
        index: usize,
        /// What is wrong with it.
        source: DecodeError,
    },
}
