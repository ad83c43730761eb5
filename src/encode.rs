//! Turns one round's gradients into class-tagged packets.
//!
//! One call scores the chunks, classes them and frames them: the important
//! chunks become one buffer of segments for the reliable stream, closed by a
//! [`RoundEnd`]; every lossy level becomes a list of datagrams no larger than
//! the path's datagram limit, which is a run-time parameter because QUIC only
//! learns it after the handshake (and MTU discovery may change it).
//!
//! Framing works on *runs*: adjacent chunks of one tensor in the same class
//! form one contiguous byte range and travel as one segment, so headers cost
//! well under 1% on the stream. Datagrams are filled to the limit: a run that
//! does not fit is cut (at a 4-byte boundary) and continues in the next
//! datagram. Each fragment carries its own byte position, so a lost datagram
//! zero-fills exactly its own bytes and nothing else.
//!
//! All packets of a round live in one allocation; the [`Bytes`] handed out are
//! views into it, so the transport sends them without another copy.

use crate::classify::{Class, Classifier, ClassifyConfig, ClassifyError, IMPORTANT};
use crate::layout::{ChunkOptions, ChunkPlan, Layout, LayoutError};
use crate::score::{ContributionTracker, GradientError, DEFAULT_ALPHA};
use crate::wire::{
    id_digest, put_f32s, DataHeader, RoundEnd, CLASS_SLOTS, DATA_HEADER_LEN, MAX_SEGMENT_PAYLOAD,
    ROUND_END_LEN,
};
use bytes::Bytes;
use thiserror::Error;

/// A fragment shorter than this is not started at the tail of a datagram;
/// the datagram is closed instead, so headers never outweigh payload.
const MIN_FRAGMENT: usize = 128;

/// The smallest datagram limit the encoder accepts: one header and one value.
pub const MIN_DATAGRAM: usize = DATA_HEADER_LEN + 4;

/// Sender-side settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncoderConfig {
    /// How tensors are cut into chunks.
    pub chunking: ChunkOptions,
    /// Contribution smoothing factor (default 0.3).
    pub alpha: f32,
    /// Classification settings.
    pub classify: ClassifyConfig,
}

impl Default for EncoderConfig {
    fn default() -> Self {
        Self {
            chunking: ChunkOptions::default(),
            alpha: DEFAULT_ALPHA,
            classify: ClassifyConfig::default(),
        }
    }
}

/// Why a round could not be encoded.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum EncodeError {
    /// The gradients do not match the layout, or hold a non-finite value.
    #[error(transparent)]
    Gradient(#[from] GradientError),
    /// The classification settings are invalid.
    #[error(transparent)]
    Classify(#[from] ClassifyError),
    /// The layout cannot be chunked with these options.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A datagram handed to [`Encoder::reframe`] is not a valid one of this
    /// encoder's layout.
    #[error("cannot reframe: {0}")]
    Reframe(#[from] crate::wire::WireError),
    /// The datagram limit cannot hold a header and one value.
    #[error("datagram limit {got} is below the minimum of {MIN_DATAGRAM} bytes")]
    DatagramTooSmall {
        /// The limit passed.
        got: usize,
    },
}

/// One round, framed.
#[derive(Debug, Clone)]
pub struct EncodedRound {
    /// Round index.
    pub round: u32,
    /// The important segments, then the [`RoundEnd`] segment: write these
    /// bytes to the reliable stream as they are.
    pub reliable: Bytes,
    /// Datagrams per lossy level: `lossy[l - 1]` holds level `l`'s, in chunk order.
    pub lossy: Vec<Vec<Bytes>>,
    /// What was sent per class (also the last segment of `reliable`).
    pub end: RoundEnd,
    /// The class of every chunk, by chunk id.
    pub classes: Vec<Class>,
    /// The allocation every packet is a view of; see [`Encoder::recycle`].
    root: Bytes,
}

impl EncodedRound {
    /// Total bytes this round puts on the wire (headers included).
    pub fn wire_bytes(&self) -> usize {
        self.reliable.len() + self.lossy.iter().flatten().map(|d| d.len()).sum::<usize>()
    }
}

/// A segment to write: `len` bytes of `tensor` at `offset`.
#[derive(Debug, Clone, Copy)]
struct Piece {
    tensor: u32,
    offset: u32,
    len: u32,
}

/// Scores, classes and frames rounds; keeps the per-chunk contribution
/// history between rounds.
#[derive(Debug, Clone)]
pub struct Encoder {
    plan: ChunkPlan,
    tracker: ContributionTracker,
    classifier: Classifier,
    classes: Vec<Class>,
    /// A packet buffer handed back through [`Encoder::recycle`].
    spare: Option<Vec<u8>>,
}

impl Encoder {
    /// An encoder for `layout`.
    pub fn new(layout: &Layout, config: EncoderConfig) -> Result<Self, EncodeError> {
        let plan = layout.plan(config.chunking)?;
        let tracker = ContributionTracker::new(plan.len(), config.alpha);
        let classifier = Classifier::new(config.classify)?;
        Ok(Self {
            plan,
            tracker,
            classifier,
            classes: Vec::new(),
            spare: None,
        })
    }

    /// The chunk plan.
    pub fn plan(&self) -> &ChunkPlan {
        &self.plan
    }

    /// The contribution of every chunk after the last round.
    pub fn contributions(&self) -> &[f32] {
        self.tracker.values()
    }

    /// Reports the training loss for the adaptive ratio (see
    /// [`Classifier::report_loss`]).
    pub fn report_loss(&mut self, loss: f64) -> Result<(), EncodeError> {
        Ok(self.classifier.report_loss(loss)?)
    }

    /// Encodes round `round`; `grads` in layout order; `max_datagram` is the
    /// largest datagram payload the path takes now.
    ///
    /// On error nothing is changed: the contribution history only advances
    /// with a round that was encoded.
    pub fn encode<G: AsRef<[f32]>>(
        &mut self,
        round: u32,
        grads: &[G],
        max_datagram: usize,
    ) -> Result<EncodedRound, EncodeError> {
        if max_datagram < MIN_DATAGRAM {
            return Err(EncodeError::DatagramTooSmall { got: max_datagram });
        }
        let _span = tracing::debug_span!("encode", round).entered();
        let mut tracker = self.tracker.clone();
        let contributions = tracker.update(&self.plan, grads)?;
        let mut classes = std::mem::take(&mut self.classes);
        self.classifier
            .classify(&self.plan, contributions, &mut classes)?;
        self.tracker = tracker;
        let levels = self.classifier.config().levels;
        let spare = self.spare.take().unwrap_or_default();
        let out = frame(
            &self.plan,
            round,
            grads,
            &classes,
            levels,
            max_datagram,
            spare,
        );
        self.classes = classes.clone();
        Ok(EncodedRound { classes, ..out })
    }

    /// Cuts one datagram of an encoded round into datagrams of at most `max`
    /// bytes, each carrying its own byte positions.
    ///
    /// QUIC may lower the path's datagram limit after a round was framed
    /// (MTU black-hole detection under loss); rather than drop such a
    /// datagram, the transport reframes it for the new limit.
    pub fn reframe(&self, datagram: &[u8], max: usize) -> Result<Vec<Bytes>, EncodeError> {
        if max < MIN_DATAGRAM {
            return Err(EncodeError::DatagramTooSmall { got: max });
        }
        let step = (max - DATA_HEADER_LEN) & !3;
        let mut out = Vec::new();
        for seg in crate::wire::decode_all(datagram) {
            let crate::wire::Segment::Data(h, payload) = seg? else {
                return Err(crate::wire::WireError::Kind(2).into());
            };
            h.validate(&self.plan)?;
            for (i, piece) in payload.chunks(step).enumerate() {
                let offset = h.byte_offset + (i * step) as u32;
                let header = DataHeader {
                    // The piece starts inside the tensor (validated above).
                    chunk: self
                        .plan
                        .chunk_at(h.tensor as usize, offset)
                        .unwrap_or(h.chunk as usize) as u32,
                    byte_offset: offset,
                    payload_len: piece.len() as u32,
                    ..h
                };
                let mut d = vec![0u8; DATA_HEADER_LEN + piece.len()];
                header.write(&mut d);
                d[DATA_HEADER_LEN..].copy_from_slice(piece);
                out.push(Bytes::from(d));
            }
        }
        Ok(out)
    }

    /// Hands a sent round back so its buffer is reused by the next round:
    /// mapping ~100 MB of fresh memory every round costs more than the
    /// framing itself. Only works once every packet of the round has been
    /// dropped elsewhere (the transport has sent them); otherwise it does
    /// nothing.
    pub fn recycle(&mut self, sent: EncodedRound) {
        let EncodedRound {
            root,
            reliable,
            lossy,
            ..
        } = sent;
        // The views must go first, or the root is not unique.
        drop((reliable, lossy));
        if let Ok(buf) = root.try_into_mut() {
            self.spare = Some(buf.into());
        }
    }
}

/// Frames the chunks as classed; pure, so tests can frame any classing.
fn frame<G: AsRef<[f32]>>(
    plan: &ChunkPlan,
    round: u32,
    grads: &[G],
    classes: &[Class],
    levels: u8,
    max_datagram: usize,
    mut buf: Vec<u8>,
) -> EncodedRound {
    let mut end = RoundEnd {
        round,
        levels,
        ..Default::default()
    };
    // Runs per class: adjacent chunks of one tensor with the same class.
    let mut runs: Vec<Vec<Piece>> = vec![Vec::new(); CLASS_SLOTS];
    for (id, (chunk, &class)) in plan.chunks().iter().zip(classes).enumerate() {
        let c = class as usize;
        end.chunks[c] += 1;
        end.bytes[c] += chunk.byte_len() as u64;
        if class == IMPORTANT {
            end.important_digest = end.important_digest.wrapping_add(id_digest(id as u32));
        }
        match runs[c].last_mut() {
            Some(r) if r.tensor == chunk.tensor && r.offset + r.len == chunk.byte_start() => {
                r.len += chunk.byte_len();
            }
            _ => runs[c].push(Piece {
                tensor: chunk.tensor,
                offset: chunk.byte_start(),
                len: chunk.byte_len(),
            }),
        }
    }

    // Cut runs into segments: on the stream only at the segment limit, in
    // datagrams to fill each one up. `packets[c]` lists where each packet of
    // class c ends, as a count of segments.
    let mut segments: Vec<Vec<Piece>> = vec![Vec::new(); CLASS_SLOTS];
    let mut packet_ends: Vec<Vec<usize>> = vec![Vec::new(); CLASS_SLOTS];
    for r in &runs[IMPORTANT as usize] {
        let (mut off, mut rem) = (r.offset, r.len);
        while rem > 0 {
            let n = rem.min(MAX_SEGMENT_PAYLOAD);
            segments[0].push(Piece {
                tensor: r.tensor,
                offset: off,
                len: n,
            });
            off += n;
            rem -= n;
        }
    }
    end.packets[0] = segments[0].len() as u32;
    let max = max_datagram.min(DATA_HEADER_LEN + MAX_SEGMENT_PAYLOAD as usize);
    for c in 1..CLASS_SLOTS {
        let (segs, ends) = (&mut segments[c], &mut packet_ends[c]);
        let mut used = 0usize;
        for r in &runs[c] {
            let (mut off, mut rem) = (r.offset as usize, r.len as usize);
            while rem > 0 {
                let avail = max.saturating_sub(used + DATA_HEADER_LEN) & !3;
                let take = if rem <= avail {
                    rem
                } else if avail >= MIN_FRAGMENT || (used == 0 && avail >= 4) {
                    avail
                } else {
                    ends.push(segs.len());
                    used = 0;
                    continue;
                };
                segs.push(Piece {
                    tensor: r.tensor,
                    offset: off as u32,
                    len: take as u32,
                });
                used += DATA_HEADER_LEN + take;
                off += take;
                rem -= take;
            }
        }
        if used > 0 {
            ends.push(segs.len());
        }
        end.packets[c] = ends.len() as u32;
    }

    // Write everything into one buffer.
    let total: usize = segments
        .iter()
        .flatten()
        .map(|p| DATA_HEADER_LEN + p.len as usize)
        .sum::<usize>()
        + ROUND_END_LEN;
    // Every byte below `total` is written before it is read, but safe Rust
    // wants it initialised; on a recycled buffer this only touches the tail.
    buf.resize(total, 0);
    let mut pos = 0;
    let mut bounds: Vec<Vec<usize>> = vec![Vec::new(); CLASS_SLOTS];
    for (c, segs) in segments.iter().enumerate() {
        let mut next_end = packet_ends[c].iter().peekable();
        for (i, p) in segs.iter().enumerate() {
            let t = p.tensor as usize;
            let span = plan.tensor_chunks(t);
            let header = DataHeader {
                class: c as Class,
                round,
                tensor: p.tensor,
                // Pieces start inside the tensor, so a holder always exists.
                chunk: plan.chunk_at(t, p.offset).unwrap_or(span.start) as u32,
                first_chunk: span.start as u32,
                last_chunk: span.end as u32 - 1,
                tensor_bytes: plan.tensor_bytes(t),
                byte_offset: p.offset,
                payload_len: p.len,
            };
            header.write(&mut buf[pos..pos + DATA_HEADER_LEN]);
            pos += DATA_HEADER_LEN;
            let values = &grads[t].as_ref()[p.offset as usize / 4..(p.offset + p.len) as usize / 4];
            put_f32s(&mut buf[pos..pos + p.len as usize], values);
            pos += p.len as usize;
            if next_end.peek() == Some(&&(i + 1)) {
                next_end.next();
                bounds[c].push(pos);
            }
        }
        if c == 0 {
            end.write(&mut buf[pos..pos + ROUND_END_LEN]);
            pos += ROUND_END_LEN;
            bounds[0].push(pos);
        }
    }
    debug_assert_eq!(pos, total);

    let buf = Bytes::from(buf);
    let reliable = buf.slice(0..bounds[0][0]);
    let mut start = bounds[0][0];
    let mut lossy = Vec::with_capacity(levels as usize);
    for b in bounds.iter().take(levels as usize + 1).skip(1) {
        let mut datagrams = Vec::with_capacity(b.len());
        for &e in b {
            datagrams.push(buf.slice(start..e));
            start = e;
        }
        lossy.push(datagrams);
    }
    EncodedRound {
        round,
        reliable,
        lossy,
        end,
        classes: Vec::new(),
        root: buf,
    }
}

/// Frames a round with classes chosen by the caller instead of by
/// contribution: for tests and tools that need a particular split.
pub fn frame_with_classes<G: AsRef<[f32]>>(
    plan: &ChunkPlan,
    round: u32,
    grads: &[G],
    classes: &[Class],
    levels: u8,
    max_datagram: usize,
) -> Result<EncodedRound, EncodeError> {
    crate::score::check_shapes(plan, grads)?;
    if max_datagram < MIN_DATAGRAM {
        return Err(EncodeError::DatagramTooSmall { got: max_datagram });
    }
    let levels = levels.clamp(1, crate::classify::MAX_LEVELS);
    if classes.len() != plan.len() {
        return Err(ClassifyError::Contributions {
            expected: plan.len(),
            got: classes.len(),
        }
        .into());
    }
    if let Some(&bad) = classes.iter().find(|&&c| c > levels) {
        return Err(ClassifyError::Levels(bad).into());
    }
    let out = frame(
        plan,
        round,
        grads,
        classes,
        levels,
        max_datagram,
        Vec::new(),
    );
    Ok(EncodedRound {
        classes: classes.to_vec(),
        ..out
    })
}
