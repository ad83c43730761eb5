//! gradlane: gradient transport over QUIC.
//!
//! (crate docs are written with the core; this is the skeleton.)

/// Sparse log-quantized gradient codec: choose the entries worth sending,
/// pack each into a couple of bytes, and let the master sum workers' frames
/// straight into one dense vector.
pub mod codec;
