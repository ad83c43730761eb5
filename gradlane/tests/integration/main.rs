//! gradlane's tests over real QUIC on loopback, one module per subject.
//!
//! One test binary rather than one per file: each binary linked the
//! whole QUIC and TLS stack again and compiled `common` again, which made
//! these tests most of the workspace's test build. Run one subject with
//! `cargo test -p gradlane --test integration group_elastic::`.

mod common;

mod dscp;
mod group;
mod group_differentiated;
mod group_elastic;
mod group_formats;
mod group_job_certs;
mod group_paths;
mod link;
mod link_close;
mod link_layouts;
mod link_messages;
