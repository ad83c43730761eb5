//! Opening a variant's fresh connection: gradlane's two endpoints, a raw
//! quinn connection with its reading task, or a TCP socket with its reader,
//! each held as a [`Runner`] between rounds. Nothing here is on the clock:
//! the timed rounds are in `rounds.rs`.

use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use common::BoxError;
use gradlane::{
    quic, Config, Congestion, DatagramSize, Endpoint, FaultStats, Link, LossyCarrier, LossyRelease,
    RoundTiming,
};
use gradlane_tools::cli as common;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use crate::variants::Kind;
use crate::{Bench, Datagrams};

impl Bench {
    /// Opens a variant's fresh connection.
    pub(crate) async fn start(
        &self,
        kind: Kind,
        congestion: Option<Congestion>,
        loss: f64,
    ) -> Result<Runner, BoxError> {
        let seed = 1000 + (loss * 1e4) as u64;
        let cc = congestion.unwrap_or_default();
        Ok(match kind {
            Kind::Gradlane(ratio, release, carrier, shared) => Runner::Gradlane(Box::new(
                self.gradlane((ratio, release, carrier, shared), cc, loss, seed)
                    .await?,
            )),
            Kind::Quinn(bytes, f32s) => {
                Runner::Quinn(self.quinn(bytes, f32s, cc, loss, seed).await?)
            }
            Kind::Tcp(bytes) => Runner::Tcp(self.tcp(bytes).await?),
        })
    }

    pub(crate) async fn gradlane(
        &self,
        (ratio, release, carrier, shared): (f64, LossyRelease, LossyCarrier, bool),
        congestion: Congestion,
        loss: f64,
        seed: u64,
    ) -> Result<GradlaneRun, BoxError> {
        let (client_faults, server_faults) = self.faults(loss, seed);
        let transport = self.transport(congestion);
        let base = Config {
            loss_tolerance: 1.0 - ratio,
            lanes: self.args.lanes.unwrap_or(transport.lanes),
            timing: RoundTiming {
                release,
                lossy_carrier: carrier,
                datagram_size: match self.args.datagram_size {
                    Datagrams::Floor => DatagramSize::MtuFloor,
                    Datagrams::Path => DatagramSize::Path,
                },
                ..RoundTiming::default()
            },
            ..transport
        };
        let server = Endpoint::server(
            "127.0.0.1:0".parse()?,
            &self.files.server_cert,
            &self.files.server_key,
            Config {
                faults: Some(server_faults),
                ..base.clone()
            },
        )?;
        let client = Endpoint::client(
            &self.files.ca_cert,
            Config {
                faults: Some(client_faults),
                ..base
            },
        )?;
        let addr = server.local_addr()?;
        let (s, c) = tokio::join!(
            server.accept(),
            client.connect(addr, "localhost", &self.layout)
        );
        let rx = s.ok_or("server endpoint closed")??;
        let tx = c?;
        let faults_before = client.fault_stats().unwrap_or_default();
        Ok(GradlaneRun {
            _server: server,
            client,
            tx,
            rx,
            faults_before,
            shared,
        })
    }

    pub(crate) async fn quinn(
        &self,
        bytes: usize,
        f32s: bool,
        congestion: Congestion,
        loss: f64,
        seed: u64,
    ) -> Result<QuinnRun, BoxError> {
        let (client_faults, server_faults) = self.faults(loss, seed);
        let transport = self.transport(congestion);
        let local: SocketAddr = "127.0.0.1:0".parse()?;
        let files = &self.files;
        let server_config = Config {
            faults: Some(server_faults),
            ..transport.clone()
        };
        let client_config = Config {
            faults: Some(client_faults),
            ..transport
        };
        let server = quic::server(local, &files.server_cert, &files.server_key, &server_config)?;
        let client = quic::client(local, &files.ca_cert, &client_config)?;
        let addr = server.local_addr()?;
        let accept = {
            let server = server.clone();
            tokio::spawn(async move {
                let incoming = server.accept().await.ok_or("server endpoint closed")?;
                Ok::<_, BoxError>(incoming.await?)
            })
        };
        let conn = client.connect(addr, "localhost")?.await?;
        let server_conn = accept.await??;
        // The receiver: every stream read to its end (with `f32s`, copied
        // into tensors of the layout's shapes, as an application must),
        // then its arrival time.
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let mut tensors: Vec<Vec<f32>> = if f32s {
            (0..self.layout.len())
                .map(|t| vec![0f32; self.layout.tensor_len(t)])
                .collect()
        } else {
            Vec::new()
        };
        let reader = tokio::spawn(async move {
            while let Ok(mut recv) = server_conn.accept_uni().await {
                let mut got = 0usize;
                let mut cursor = (0, 0);
                loop {
                    match recv.read_chunk(usize::MAX, true).await {
                        Ok(Some(chunk)) => {
                            if f32s {
                                copy_into(&mut tensors, &mut cursor, got, &chunk.bytes);
                            }
                            got += chunk.bytes.len();
                        }
                        Ok(None) => break,
                        Err(_) => return,
                    }
                }
                if done_tx.send((got, Instant::now())).is_err() {
                    return;
                }
            }
        });
        Ok(QuinnRun {
            client,
            conn,
            reader,
            done_rx,
            payload: self.payload.slice(..bytes),
            f32s,
        })
    }

    pub(crate) async fn tcp(&self, bytes: usize) -> Result<TcpRun, BoxError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await?;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let mut got = 0;
                while got < bytes {
                    let want = (bytes - got).min(buf.len());
                    let n = sock.read(&mut buf[..want]).await?;
                    if n == 0 {
                        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
                    }
                    got += n;
                }
                if done_tx.send(Instant::now()).is_err() {
                    break;
                }
            }
            Ok::<_, std::io::Error>(())
        });
        let sock = tokio::net::TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        Ok(TcpRun {
            sock,
            reader,
            done_rx,
            payload: self.payload.slice(..bytes),
        })
    }
}

/// Copies received stream bytes at stream offset `at` into the tensors
/// (laid end to end), as little-endian f32.
/// `cursor` is (tensor, its first byte in the stream) of the last copy:
/// chunks come in order, so the search goes on from there.
pub(crate) fn copy_into(
    tensors: &mut [Vec<f32>],
    cursor: &mut (usize, usize),
    mut at: usize,
    mut bytes: &[u8],
) {
    let (t, base) = cursor;
    while !bytes.is_empty() && *t < tensors.len() {
        let len = tensors[*t].len() * 4;
        if at >= *base + len {
            *base += len;
            *t += 1;
            continue;
        }
        let off = at - *base;
        let n = (len - off).min(bytes.len());
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut tensors[*t][..]);
        dst[off..off + n].copy_from_slice(&bytes[..n]);
        bytes = &bytes[n..];
        at += n;
    }
}

/// A variant's open connection, between rounds.
pub(crate) enum Runner {
    Gradlane(Box<GradlaneRun>),
    Quinn(QuinnRun),
    Tcp(TcpRun),
}

pub(crate) struct GradlaneRun {
    pub(crate) _server: Endpoint,
    pub(crate) client: Endpoint,
    pub(crate) tx: Link,
    pub(crate) rx: Link,
    pub(crate) faults_before: FaultStats,
    /// Send with `send_round_shared` (else `send_round`).
    pub(crate) shared: bool,
}

pub(crate) struct QuinnRun {
    pub(crate) client: quinn::Endpoint,
    pub(crate) conn: quinn::Connection,
    pub(crate) reader: tokio::task::JoinHandle<()>,
    pub(crate) done_rx: mpsc::UnboundedReceiver<(usize, Instant)>,
    pub(crate) payload: Bytes,
    /// Serialize the gradients each round instead of sending `payload`.
    pub(crate) f32s: bool,
}

pub(crate) struct TcpRun {
    pub(crate) sock: tokio::net::TcpStream,
    pub(crate) reader: tokio::task::JoinHandle<Result<(), std::io::Error>>,
    pub(crate) done_rx: mpsc::UnboundedReceiver<Instant>,
    pub(crate) payload: Bytes,
}
