//! The parameter server over gradlane links.
//!
//! A [`Worker`] connects a [`Link`](crate::Link) to the server and loops
//! *pull → compute → push* over one request stream; [`run`] accepts any
//! number of workers and drives one shared
//! [`ParameterServer`](gradlane_core::ps::ParameterServer) for all of them.
//! Parameters go to workers exact, on the request stream; gradients come
//! back as differentiated gradlane rounds or, with [`Compression::Codec`],
//! as codec frames on the request stream. A worker that leaves gives its
//! ticket back
//! ([`ParameterServer::leave`](gradlane_core::ps::ParameterServer::leave))
//! and the others go on.
//!
//! # Example: one worker, one push, on loopback
//!
//! ```
//! use gradlane::{Layout, TensorSpec};
//! use gradlane::ps::{Disposition, OrderedMomentum, OrderedMomentumConfig};
//! use gradlane::ps_net::{self, Compression, ServerHandle, Worker};
//! use gradlane::{generate_certs, Config, Endpoint};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = std::env::temp_dir().join(format!("gradlane-ps-doc-{}", std::process::id()));
//! generate_certs(&dir, &["localhost"])?;
//! let layout = Layout::new(vec![
//!     TensorSpec::dense("w", [16, 64]),
//!     TensorSpec::dense("b", [16]),
//! ])?;
//!
//! // The server: OrMo for two workers over 16 * 64 + 16 parameters.
//! let cfg = OrderedMomentumConfig { workers: 2, momentum: 0.9, learning_rate: 0.01 };
//! let handle = ServerHandle::new(OrderedMomentum::new(cfg, vec![0.0; 1040])?);
//! let endpoint = Endpoint::server(
//!     "127.0.0.1:0".parse()?,
//!     dir.join("server.pem"),
//!     dir.join("server.key"),
//!     Config::default(),
//! )?;
//! let addr = endpoint.local_addr()?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let serving = tokio::spawn({
//!     let handle = handle.clone();
//!     async move { ps_net::run(&endpoint, handle, stopped).await }
//! });
//!
//! // A worker: pull, compute (here: a constant gradient), push.
//! let client = Endpoint::client(dir.join("ca.pem"), Config::default())?;
//! let mut worker = Worker::join(&client, addr, "localhost", &layout, Compression::Rounds).await?;
//! let params = worker.pull().await?;
//! let reply = worker.push_flat(params.index, &vec![1.0; 1040]).await?;
//! assert_eq!(reply.disposition, Disposition::Applied { staleness: 0 });
//! assert!(reply.params.values.iter().all(|&w| w < 0.0));
//! worker.leave().await;
//!
//! stop.send(()).ok();
//! let stats = serving.await??;
//! assert_eq!(stats.applied, 1);
//! # Ok(())
//! # }
//! ```
//!
//! The messages are the core's ([`gradlane_core::ps::messages`]); here:
//! `server` ([`run`], [`ServerHandle`]), `worker` ([`Worker`]) and `stream`
//! (one message at a time over the request stream).

mod server;
mod stream;
mod worker;

pub use server::{run, ServeError, ServeStats, ServerHandle, WorkerInfo, CLOSE_FLUSH};
pub use stream::StreamError;
pub use worker::{Compression, Params, PushReply, Worker, WorkerError};
