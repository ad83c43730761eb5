//! gradlane: gradient transport over QUIC.
//!
//! (crate docs are written with the core; this is the skeleton.)

pub mod transport;
