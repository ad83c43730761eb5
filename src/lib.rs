//! gradlane: gradient transport over QUIC.
//!
//! (crate docs are written with the transport; this is the core.)

pub mod classify;
pub mod encode;
pub mod layout;
pub mod presets;
pub mod reassembly;
pub mod score;
pub mod wire;
