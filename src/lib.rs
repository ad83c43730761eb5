//! gradlane moves gradient tensors between the processes of a distributed
//! training job over QUIC, and spends reliability only where it pays.
//!
//! Every round, each tensor is cut into chunks ([`layout`]); each chunk is
//! scored by its smoothed contribution ([`score`]); the most important chunks
//! travel on a reliable, highest-priority QUIC stream and the rest as QUIC
//! datagrams in graded lossy levels ([`classify`], [`encode`], [`wire`]);
//! while the path loses nothing, those levels ride lower-priority streams
//! instead, which cost less ([`transport::LossyCarrier`]). The receiver
//! rebuilds each tensor as soon as every important chunk is in,
//! fills what is missing with zeros, and adds chunks that arrive late into
//! the next round ([`reassembly`]). [`transport`] is the thin async shell
//! over quinn; everything else is a deterministic core with no sockets and
//! no clock, tested and benchmarked without a network.
//!
//! Around that core: a sparse log-quantized gradient codec ([`codec`]), the
//! parameter server's ordered momentum and straggler filter ([`ps`]), and
//! the server runtime and worker client that run them over links
//! ([`ps_net`]).
//!
//! # Example: one round over a real QUIC link on loopback
//!
//! ```
//! use gradlane::layout::{Layout, TensorSpec};
//! use gradlane::transport::{tls, Config, Endpoint};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Certificates come from files; `cargo run --example certs` makes them.
//! let dir = std::env::temp_dir().join(format!("gradlane-doc-{}", std::process::id()));
//! tls::generate_certs(&dir, &["localhost"])?;
//!
//! let layout = Layout::new(vec![
//!     TensorSpec::conv2d("conv1.weight", [64, 3, 7, 7]),
//!     TensorSpec::dense("fc.weight", [10, 64]),
//!     TensorSpec::dense("fc.bias", [10]),
//! ])?;
//!
//! // Receiving side: it learns the layout in the handshake.
//! let server = Endpoint::server(
//!     "127.0.0.1:0".parse()?,
//!     dir.join("server.pem"),
//!     dir.join("server.key"),
//!     Config::default(),
//! )?;
//! let addr = server.local_addr()?;
//!
//! // Sending side.
//! let client = Endpoint::client(dir.join("ca.pem"), Config::default())?;
//! let (accepted, connected) =
//!     tokio::join!(server.accept(), client.connect(addr, "localhost", &layout));
//! let (mut rx, mut tx) = (accepted.expect("endpoint open")?, connected?);
//!
//! let grads: Vec<Vec<f32>> = (0..layout.len())
//!     .map(|t| (0..layout.tensor_len(t)).map(|i| (i as f32).sin()).collect())
//!     .collect();
//! let (report, round) = tokio::join!(tx.send_round(0, &grads), rx.recv_round());
//! let (report, round) = (report?, round?);
//!
//! // 80% of each tensor's chunks travelled reliably and are exact.
//! assert_eq!(round.index, 0);
//! assert_eq!(round.stats.classes[0].received_bytes, report.important_bytes);
//! assert_eq!(round.tensors.len(), 3);
//! # Ok(())
//! # }
//! ```

pub mod classify;
/// Sparse log-quantized gradient codec: choose the entries worth sending,
/// pack each into a couple of bytes, and let the master sum workers' frames
/// straight into one dense vector.
pub mod codec;
pub mod encode;
pub mod layout;
pub mod presets;
pub mod ps;
pub mod ps_net;
pub mod reassembly;
pub mod score;
pub mod transport;
pub mod wire;
