//! gradlane: gradient transport over QUIC.
//!
//! (crate docs are written with the transport; this is the core.)

pub mod classify;
/// Sparse log-quantized gradient codec: choose the entries worth sending,
/// pack each into a couple of bytes, and let the master sum workers' frames
/// straight into one dense vector.
pub mod codec;
pub mod encode;
pub mod layout;
pub mod presets;
pub mod ps;
pub mod reassembly;
pub mod score;
pub mod transport;
pub mod wire;
