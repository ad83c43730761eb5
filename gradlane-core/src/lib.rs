//! gradlane's deterministic core: no sockets, no clock, no async.
//!
//! Everything that decides what a gradient round is and what becomes of it
//! lives here, so it can be tested, fuzzed and benchmarked without a
//! network; the `gradlane` crate drives it over QUIC.
//!
//! - [`layout`]: the model's tensors and how each is cut into chunks.
//! - [`score`]: each chunk's smoothed contribution.
//! - [`classify`]: important chunks and graded lossy levels.
//! - [`wire`]: the segment header every piece of a round carries.
//! - [`encode`]: a round scored, classed and framed for sending.
//! - [`reassembly`]: the receiver: placement, zero fill, late merge.
//! - [`control`]: the messages of a link's control stream.
//! - [`bytes`]: the one byte reader and length-prefixed framing they use.
//! - [`codec`]: the sparse log-quantized gradient codec.
//! - [`ps`]: the parameter-server algorithms and their request messages.
//! - [`presets`]: layouts of well-known models.
//! - [`rng`]: the one seeded random number generator.

#![warn(unreachable_pub)]

pub mod bytes;
pub mod classify;
/// Sparse log-quantized gradient codec: choose the entries worth sending,
/// pack each into a couple of bytes, and let the master sum workers' frames
/// straight into one dense vector.
pub mod codec;
pub mod control;
pub mod encode;
pub mod layout;
pub mod presets;
pub mod ps;
pub mod reassembly;
pub mod rng;
pub mod score;
pub mod wire;
