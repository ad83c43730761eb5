//! Sparse log-quantized gradient codec (CN113487036A; docs/DESIGN.md §3).
//!
//! Why: a worker's gradient is mostly small values that barely move the
//! model; sending only the largest entries, each as a few bits, cuts the
//! traffic per round by one to two orders of magnitude while the master can
//! still sum what matters.
//!
//! Pipeline:
//! 1. [`sparsify`](crate::codec::sparsify) keeps `|v| > threshold` or the top-k by magnitude
//!    ([`threshold`](crate::codec::threshold), [`top_k`](crate::codec::top_k), [`SparseGradient`](crate::codec::SparseGradient)).
//! 2. `quantize`: with `S = sum |kept|`, each value becomes
//!    `q = ceil(log_b(S / |v|))` plus a sign bit; decoding gives
//!    `sign * S / b^(q - 1/2)` (and exactly `S` when `q = 0`).
//! 3. `keys`: sorted keys as deltas, each with a length flag choosing one of
//!    a few widths picked optimally per frame ([`WidthScheme`](crate::codec::WidthScheme)).
//! 4. `frame`: a versioned, little-endian, self-describing frame
//!    ([`encode`](crate::codec::encode), [`parse_header`](crate::codec::parse_header)).
//! 5. `aggregate`: decoding to pairs ([`decode`](crate::codec::decode)) or streaming into a dense
//!    accumulator ([`decode_add_into`](crate::codec::decode_add_into), [`aggregate`](crate::codec::aggregate)).
//!
//! # Error bound
//! For every kept value `v` with decoded `d` (same sign):
//! `|v| / sqrt(b) < |d| <= sqrt(b) * |v|`, i.e. the relative error is at most
//! `sqrt(b) - 1` upward and strictly below `1 - 1/sqrt(b)` downward
//! (41.4% / 29.3% at `b = 2`; 11.8% / 10.6% at the default `b = 1.25`). This
//! holds for the f64 result; converting to f32 adds at most half an ulp, and
//! for results in the subnormal range at most `2^-150` absolute. Results are
//! clamped to `[smallest subnormal, f32::MAX]` (closer to the original, so
//! still within the bound; a kept value never decodes to zero). Dropped
//! entries decode as zero.
//!
//! # Zeros and non-finite input
//! Exact zeros are never kept by any path (threshold keep is strict `>`;
//! top-k skips zeros, so it may keep fewer than `k`). Any NaN or infinity in
//! the input is an [`EncodeError::NonFinite`](crate::codec::EncodeError::NonFinite) naming its index.

mod aggregate;
mod bits;
mod error;
mod frame;
mod keys;
mod quantize;
pub mod sparsify;

pub use aggregate::{aggregate, decode, decode_add_into, decode_into_dense, validate};
pub use error::{AggregateError, DecodeError, EncodeError};
pub use frame::{encode, encode_into, parse_header, FrameHeader, MAGIC, VERSION};
pub use keys::{WidthScheme, MAX_FLAG_BITS};
pub use sparsify::{threshold, top_k, SparseGradient};

/// Default logarithm base (worst-case error +11.8% / -10.6%).
///
/// On 25.6M-value gradients at top 1% (`cargo run --bin codec_table`):
/// key deltas cost about 9 bits and the sign 1, so `q` gets about 6 bits
/// within 2 bytes per element. The q width is `ceil(log2(log_b(max|v| /
/// min|v|) + 1))` over the kept values: with b = 1.25 it is 5 bits for
/// Student-t(3) (1.87 B/element), 3 for Laplace (1.62) and 6 for Cauchy
/// (1.997). Smaller bases cut the error but cross into the next q width on
/// heavy tails (b = 1.15: 7 bits, 2.12 B on Cauchy). b = 1.2 also fits 6
/// bits on that sample, but 6 bits span a max/min ratio of only 1.2^64 ~ 1e5
/// versus 1.25^64 ~ 1.6e6, so 1.25 leaves more headroom for outliers.
pub const DEFAULT_BASE: f64 = 1.25;
/// Smallest accepted base; keeps q below 2^18 for any f32 input.
pub const MIN_BASE: f64 = 1.0 + 1.0 / 1024.0;
/// Largest accepted base.
pub const MAX_BASE: f64 = 65536.0;
/// Largest dense dimension: keys are u32.
pub const MAX_DIM: u64 = 1 << 32;

/// Which entries of a dense gradient to keep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Selection {
    /// Keep entries with `|v| > threshold` (strict).
    Threshold(f32),
    /// Keep the `k` largest non-zero magnitudes.
    TopK(usize),
}

/// Sparsifies a dense gradient and encodes it in one call.
pub fn encode_dense(
    values: &[f32],
    selection: Selection,
    base: f64,
) -> Result<Vec<u8>, EncodeError> {
    quantize::check_base(base)?;
    let grad = match selection {
        Selection::Threshold(t) => threshold(values, t)?,
        Selection::TopK(k) => top_k(values, k)?,
    };
    encode(&grad, base)
}
