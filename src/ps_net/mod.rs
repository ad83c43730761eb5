//! The parameter server over gradlane links.
//!
//! A [`Worker`] connects a [`Link`](crate::transport::Link) to the server,
//! opens one request stream on it and loops *pull → compute → push*. The
//! server side, [`run`], accepts any number of workers and drives one shared
//! [`ParameterServer`](crate::ps::ParameterServer) (OrMo, the straggler
//! filter, or a baseline) for all of them.
//!
//! What travels how:
//! - **parameters** go server → worker on the request stream, reliably and
//!   bit-exact (raw little-endian f32);
//! - **gradients** go worker → server as differentiated gradlane rounds
//!   (important chunks reliable, the rest lossy and zero-filled when lost,
//!   late chunks added into the worker's next gradient), or — with
//!   [`Compression::Codec`] — as a sparse log-quantized codec frame on the
//!   request stream.
//!
//! A worker that disconnects gives its ticket back
//! ([`ParameterServer::leave`](crate::ps::ParameterServer::leave)); the
//! others go on. A synchronous server shrinks its round to the workers left.
//!
//! - [`protocol`]: the request/reply messages (pure, no sockets).
//! - [`server`]: [`run`] and [`ServerHandle`].
//! - [`worker`]: [`Worker`], the client side.

pub mod protocol;
pub mod server;
mod stream;
pub mod worker;

pub use server::{run, ServeError, ServeStats, ServerHandle};
pub use stream::StreamError;
pub use worker::{Compression, Params, PushReply, Worker, WorkerError};
