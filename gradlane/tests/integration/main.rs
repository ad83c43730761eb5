//! gradlane's tests over real QUIC on loopback, one module per subject.
//!
//! One test binary rather than one per file: each binary linked the
//! whole QUIC and TLS stack again and compiled `common` again, which made
//! these tests most of the workspace's test build. Run one subject with
//! `cargo test -p gradlane --test integration link::`.
//!
//! tests/group_elastic.rs and tests/group_formats.rs stay binaries of
//! their own, run alone: they wait out failure timeouts or count the
//! bytes on the wire, which tests of other subjects on the same cores
//! would disturb.

mod common;

mod connect;
mod dscp;
mod group;
mod group_bounded_return;
mod group_differentiated;
mod group_job_certs;
mod group_movement;
mod group_paths;
mod group_point_to_point;
mod group_timeout;
mod link;
mod link_close;
mod link_layouts;
mod link_messages;
