//! The core's behaviour through its public API, one module per subject.
//!
//! One test binary rather than one per file, so that the core and the
//! shared helpers are linked once. Run one subject with
//! `cargo test -p gradlane-core --test behaviour codec::`.

mod common;

mod codec;
mod layout_plan;
mod ps_core;
mod reassembly;
mod score_classify;
mod value_formats;
mod wire_decode;
