//! The worker side: pull parameters, push gradients, over one gradlane link.

use super::protocol::{self, ParamsHeader, ReplyKind, Request, PARAMS_HEADER_LEN};
use super::stream::{read_into, read_len, write_bytes, StreamError};
use crate::codec::{self, Selection};
use crate::layout::Layout;
use crate::ps::Disposition;
use crate::transport::{Endpoint, Link, LinkError, SendReport};
use bytes::Bytes;
use quinn::{RecvStream, SendStream};
use std::net::SocketAddr;
use thiserror::Error;

/// How a worker sends its gradients.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Compression {
    /// As a gradlane round: important chunks reliably, the rest as lossy
    /// datagrams; lost chunks reach the server as zeros.
    #[default]
    Rounds,
    /// As a sparse log-quantized codec frame on the reliable request
    /// stream: only the selected entries, each to within the codec's error
    /// bound, nothing lost.
    Codec {
        /// Which entries to keep.
        selection: Selection,
        /// Logarithm base (see [`codec::DEFAULT_BASE`]).
        base: f64,
    },
}

/// Parameters from the server with the ticket that goes with them.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// The index to push back with the gradient computed on `values`.
    pub index: u64,
    /// The server's step count when the parameters were copied.
    pub steps: u64,
    /// The parameters, flat, in layout order.
    pub values: Vec<f32>,
}

/// The server's answer to a push.
#[derive(Debug, Clone, PartialEq)]
pub struct PushReply {
    /// What the server did with the gradient.
    pub disposition: Disposition,
    /// Fresh parameters and the next ticket.
    pub params: Params,
    /// What the link did, when the gradient went as a round.
    pub send: Option<SendReport>,
    /// Gradient payload bytes sent: the round's reliable and lossy payload,
    /// or the codec frame.
    pub gradient_bytes: u64,
}

/// Why a worker operation failed.
#[derive(Debug, Error)]
pub enum WorkerError {
    /// The link could not be made or broke.
    #[error("link: {0}")]
    Link(#[from] LinkError),
    /// The request stream failed or carried a malformed reply.
    #[error("request stream: {0}")]
    Stream(#[from] StreamError),
    /// The server refused the request; the worker's ticket is unchanged.
    #[error("server refused: {0}")]
    Refused(String),
    /// The gradients do not match the layout.
    #[error("gradient tensor {tensor} has {got} values, layout says {expected}")]
    GradientShape {
        /// Tensor position.
        tensor: usize,
        /// Values the layout gives it.
        expected: usize,
        /// Values passed.
        got: usize,
    },
    /// A flat gradient of the wrong length.
    #[error("flat gradient has {got} values, the model {expected}")]
    FlatLength {
        /// Values in the layout.
        expected: usize,
        /// Values passed.
        got: usize,
    },
    /// Not one gradient tensor per layout tensor.
    #[error("{got} gradient tensors for a layout of {expected}")]
    TensorCount {
        /// Tensors in the layout.
        expected: usize,
        /// Tensors passed.
        got: usize,
    },
    /// Compressing the gradient failed (non-finite values, bad base).
    #[error("codec: {0}")]
    Codec(#[from] codec::EncodeError),
    /// The server answered a push with a pull's reply or the other way round.
    #[error("unexpected reply: {0}")]
    UnexpectedReply(&'static str),
}

/// A worker's session with a parameter server.
pub struct Worker {
    link: Link,
    send: SendStream,
    recv: RecvStream,
    dim: usize,
    compression: Compression,
    next_round: u32,
    /// A params buffer handed back by the caller, reused by the next reply.
    spare: Vec<f32>,
    /// Flat gradient for the codec.
    flat: Vec<f32>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("link", &self.link)
            .field("params", &self.dim)
            .field("compression", &self.compression)
            .finish()
    }
}

impl Worker {
    /// Connects to the server at `addr` with the model's `layout` and opens
    /// the request stream.
    pub async fn join(
        endpoint: &Endpoint,
        addr: SocketAddr,
        server_name: &str,
        layout: &Layout,
        compression: Compression,
    ) -> Result<Self, WorkerError> {
        let link = endpoint.connect(addr, server_name, layout).await?;
        let (send, recv) = link
            .connection()
            .open_bi()
            .await
            .map_err(LinkError::from_conn)?;
        let dim = layout.total_values() as usize;
        Ok(Self {
            link,
            send,
            recv,
            dim,
            compression,
            next_round: 0,
            spare: Vec::new(),
            flat: Vec::new(),
        })
    }

    /// The link under this session (statistics, layout).
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Asks for parameters and a ticket. A synchronous server answers once
    /// its current round has room.
    pub async fn pull(&mut self) -> Result<Params, WorkerError> {
        write_bytes(&mut self.send, Bytes::from(Request::Pull.encode())).await?;
        match self.read_reply().await? {
            (None, params) => Ok(params),
            (Some(_), _) => Err(WorkerError::UnexpectedReply("push reply to a pull")),
        }
    }

    /// Pushes the gradient computed for ticket `index` (`grads` in layout
    /// order) and returns the server's verdict with fresh parameters.
    pub async fn push<G: AsRef<[f32]>>(
        &mut self,
        index: u64,
        grads: &[G],
    ) -> Result<PushReply, WorkerError> {
        self.check_shape(grads)?;
        let (send, gradient_bytes) = match self.compression {
            Compression::Rounds => {
                // The round goes first and the request naming it after: a
                // round the encoder refuses (a NaN, say) is refused before
                // any byte leaves, and then no request announces it, so the
                // server is never left waiting for a round that never comes.
                let round = self.next_round;
                // Once this round may have left, its index is spent: the
                // link refuses it again (`LinkError::RoundOrder`), and the
                // server drops a round no request names. Only a round the
                // encoder refused sent nothing and keeps its index. Set
                // before sending, so a cancelled push spends it too.
                self.next_round = round.wrapping_add(1);
                let report = match self.link.send_round(round, grads).await {
                    Err(LinkError::Encode(e)) => {
                        self.next_round = round;
                        return Err(LinkError::Encode(e).into());
                    }
                    sent => sent?,
                };
                let header = Request::PushRound { index, round }.encode();
                write_bytes(&mut self.send, Bytes::from(header)).await?;
                let bytes = report.important_bytes + report.lossy_bytes.iter().sum::<u64>();
                (Some(report), bytes)
            }
            Compression::Codec { selection, base } => {
                self.flat.clear();
                for g in grads {
                    self.flat.extend_from_slice(g.as_ref());
                }
                let frame = codec::encode_dense(&self.flat, selection, base)?;
                let bytes = frame.len() as u64;
                let msg = Request::PushCodec { index, frame }.encode();
                write_bytes(&mut self.send, Bytes::from(msg)).await?;
                (None, bytes)
            }
        };
        match self.read_reply().await? {
            (Some(disposition), params) => Ok(PushReply {
                disposition,
                params,
                send,
                gradient_bytes,
            }),
            (None, _) => Err(WorkerError::UnexpectedReply("pull reply to a push")),
        }
    }

    /// [`push`](Self::push) with the gradient flat, in layout order (the
    /// shape [`Params::values`] has).
    pub async fn push_flat(&mut self, index: u64, grad: &[f32]) -> Result<PushReply, WorkerError> {
        if grad.len() != self.dim {
            return Err(WorkerError::FlatLength {
                expected: self.dim,
                got: grad.len(),
            });
        }
        let layout = self.link.layout();
        let mut tensors = Vec::with_capacity(layout.len());
        let mut at = 0;
        for t in 0..layout.len() {
            let n = layout.tensor_len(t);
            tensors.push(&grad[at..at + n]);
            at += n;
        }
        self.push(index, &tensors).await
    }

    /// Hands a [`Params::values`] buffer back so the next reply reuses it
    /// (saves mapping fresh memory for every reply of a large model).
    pub fn recycle(&mut self, values: Vec<f32>) {
        self.spare = values;
    }

    /// Ends the session in an orderly way: the server gives the ticket back.
    pub async fn leave(mut self) {
        let _ = self.send.finish();
        // Wait until the server has seen the end (it closes nothing itself),
        // bounded so a vanished server cannot hold us.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), self.send.stopped()).await;
        self.link.close();
    }

    fn check_shape<G: AsRef<[f32]>>(&self, grads: &[G]) -> Result<(), WorkerError> {
        let layout = self.link.layout();
        if grads.len() != layout.len() {
            return Err(WorkerError::TensorCount {
                expected: layout.len(),
                got: grads.len(),
            });
        }
        for (t, g) in grads.iter().enumerate() {
            let expected = layout.tensor_len(t);
            if g.as_ref().len() != expected {
                return Err(WorkerError::GradientShape {
                    tensor: t,
                    expected,
                    got: g.as_ref().len(),
                });
            }
        }
        Ok(())
    }

    /// Reads one reply: parameters (with the disposition of a push), or a
    /// refusal as an error.
    async fn read_reply(&mut self) -> Result<(Option<Disposition>, Params), WorkerError> {
        let len = read_len(&mut self.recv)
            .await?
            .ok_or(StreamError::Truncated)?;
        let mut tag = [0u8; 1];
        if len == 0 {
            return Err(StreamError::Message(protocol::MessageError::Empty).into());
        }
        read_into(&mut self.recv, &mut tag).await?;
        let kind = protocol::reply_kind(tag[0]).map_err(StreamError::from)?;
        protocol::check_reply_len(kind, len, self.dim).map_err(StreamError::from)?;
        match kind {
            ReplyKind::Refused => {
                let mut body = vec![0u8; len];
                body[0] = tag[0];
                read_into(&mut self.recv, &mut body[1..]).await?;
                let why = protocol::decode_refused(&body).map_err(StreamError::from)?;
                Err(WorkerError::Refused(why))
            }
            ReplyKind::Params => {
                let mut head = [0u8; PARAMS_HEADER_LEN];
                head[0] = tag[0];
                read_into(&mut self.recv, &mut head[1..]).await?;
                let header = ParamsHeader::decode(&head).map_err(StreamError::from)?;
                let mut values = std::mem::take(&mut self.spare);
                values.resize(self.dim, 0.0);
                // Straight into the f32 buffer: one copy from quinn's.
                read_into(&mut self.recv, bytemuck::cast_slice_mut(&mut values)).await?;
                if cfg!(target_endian = "big") {
                    for v in &mut values {
                        *v = f32::from_bits(u32::from_le(v.to_bits()));
                    }
                }
                Ok((
                    header.disposition,
                    Params {
                        index: header.index,
                        steps: header.steps,
                        values,
                    },
                ))
            }
        }
    }
}
