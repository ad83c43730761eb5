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
//!
//! Values travel in the format of their class
//! ([`EncoderConfig::formats`]): `f32` by default; with a 16-bit or `Log8`
//! format a segment's payload is the values converted as it is framed
//! (see [`payload`]), and only `f32` segments are ever
//! handed out as views of the caller's memory. A chunk holding a value
//! that is not finite always travels in the important part, so an
//! overflow that mixed-precision training must see is never lost or
//! quantized away.
//!
//! Encoding has two steps, so a transport can send while it frames:
//! [`Encoder::start`] scores and classes the chunks and fixes every segment
//! and packet boundary (so the [`RoundEnd`] is known before a byte is
//! framed); the returned [`RoundFramer`] then writes the bytes, the
//! important ones first in pieces of a size the caller picks
//! ([`RoundFramer::next_reliable`]), the lossy datagrams last
//! ([`RoundFramer::finish`]). [`Encoder::encode`] does both at once; the
//! bytes are the same however the reliable part is cut.

use crate::classify::{Class, Classifier, ClassifyConfig, ClassifyError, IMPORTANT};
use crate::format::{ClassFormats, FormatError, ValueFormat, LOG8_SCALE_BYTES};
use crate::layout::{ChunkOptions, ChunkPlan, Layout, LayoutError};
use crate::payload;
use crate::score::{ContributionTracker, GradientError, DEFAULT_ALPHA};
use crate::wire::{
    id_digest, DataHeader, RoundEnd, CLASS_SLOTS, DATA_HEADER_LEN, MAX_SEGMENT_PAYLOAD,
    ROUND_END_LEN,
};
use bytes::{BufMut, Bytes, BytesMut};
use std::sync::Arc;
use thiserror::Error;

/// A fragment shorter than this is not started at the tail of a datagram;
/// the datagram is closed instead, so headers never outweigh payload.
const MIN_FRAGMENT: usize = 128;

/// The smallest datagram limit the encoder accepts: one header and one
/// value in any format (a `Log8` value needs its chunk's scale too).
pub const MIN_DATAGRAM: usize = DATA_HEADER_LEN + 5;

/// Sender-side settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncoderConfig {
    /// How tensors are cut into chunks.
    pub chunking: ChunkOptions,
    /// Contribution smoothing factor (default 0.3).
    pub alpha: f32,
    /// Classification settings.
    pub classify: ClassifyConfig,
    /// The layout id written into every segment (see
    /// [`wire::layout_of`](crate::wire::layout_of)): which of a sender's
    /// layouts on one link a round has. 0 unless a link carries several.
    pub layout_id: u16,
    /// The value format of the important part and of the lossy levels
    /// (default `f32` for both).
    pub formats: ClassFormats,
}

impl Default for EncoderConfig {
    fn default() -> Self {
        Self {
            chunking: ChunkOptions::default(),
            alpha: DEFAULT_ALPHA,
            classify: ClassifyConfig::default(),
            layout_id: 0,
            formats: ClassFormats::F32,
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
    /// The formats cannot be used (`Log8` for the important part).
    #[error(transparent)]
    Format(#[from] FormatError),
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
    /// bytes to the reliable stream as they are. When the round was framed
    /// with [`RoundFramer`], only the part not already taken with
    /// [`RoundFramer::next_reliable`] (empty if all was).
    pub reliable: Bytes,
    /// Datagrams per lossy level: `lossy[l - 1]` holds level `l`'s, in chunk order.
    pub lossy: Vec<Vec<Bytes>>,
    /// What was sent per class (also the last segment of `reliable`).
    pub end: RoundEnd,
    /// The class of every chunk, by chunk id.
    pub classes: Vec<Class>,
    /// Payload bytes each class puts on the wire in its format (see
    /// [`RoundFramer::wire_payload`]).
    pub wire_payload: [u64; CLASS_SLOTS],
    /// The empty tail of the allocation every packet is a view of; it gets
    /// the whole allocation back once the views are gone (see
    /// [`Encoder::recycle`]).
    root: BytesMut,
}

impl EncodedRound {
    /// Total bytes this round puts on the wire (headers included), not
    /// counting reliable pieces already taken with
    /// [`RoundFramer::next_reliable`].
    pub fn wire_bytes(&self) -> usize {
        self.reliable.len() + self.lossy.iter().flatten().map(|d| d.len()).sum::<usize>()
    }
}

/// A segment to write: `len` bytes of the `f32` tensor `tensor` at
/// `offset` (positions), which take `wire` bytes in the segment's format.
#[derive(Debug, Clone, Copy)]
struct Piece {
    tensor: u32,
    offset: u32,
    len: u32,
    wire: u32,
}

/// Scores, classes and frames rounds; keeps the per-chunk contribution
/// history between rounds.
#[derive(Debug, Clone)]
pub struct Encoder {
    /// Shared with the [`RoundFramer`]s it starts, which need it to write
    /// headers (cloning a ~100k-chunk plan per round would cost more).
    plan: Arc<ChunkPlan>,
    tracker: ContributionTracker,
    classifier: Classifier,
    classes: Vec<Class>,
    /// The buffer of an earlier round, handed back through
    /// [`Encoder::recycle`]; reclaimed when no packet of it is alive.
    spare: Option<BytesMut>,
    /// Written into every segment.
    layout_id: u16,
    formats: ClassFormats,
}

impl Encoder {
    /// An encoder for `layout`.
    pub fn new(layout: &Layout, config: EncoderConfig) -> Result<Self, EncodeError> {
        config.formats.validate()?;
        let plan = Arc::new(layout.plan(config.chunking)?);
        let tracker = ContributionTracker::new(plan.len(), config.alpha);
        let classifier = Classifier::new(config.classify)?;
        Ok(Self {
            plan,
            tracker,
            classifier,
            classes: Vec::new(),
            spare: None,
            layout_id: config.layout_id,
            formats: config.formats,
        })
    }

    /// The value formats of the classes.
    pub fn formats(&self) -> ClassFormats {
        self.formats
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
        self.start(round, grads, max_datagram)?.finish(grads)
    }

    /// Scores and classes round `round` and fixes its packets, without
    /// framing a byte yet: the returned framer writes them. Every check on
    /// `grads` (shapes, finite values) happens here, so once this returns,
    /// framing cannot fail on the values and a transport may start sending
    /// the first pieces while later ones are framed.
    ///
    /// On error nothing is changed: the contribution history only advances
    /// with a round that was started.
    pub fn start<G: AsRef<[f32]>>(
        &mut self,
        round: u32,
        grads: &[G],
        max_datagram: usize,
    ) -> Result<RoundFramer, EncodeError> {
        if max_datagram < MIN_DATAGRAM {
            return Err(EncodeError::DatagramTooSmall { got: max_datagram });
        }
        let _span = tracing::debug_span!("encode_start", round).entered();
        let mut tracker = self.tracker.clone();
        let contributions = tracker.update(&self.plan, grads)?;
        let mut classes = std::mem::take(&mut self.classes);
        self.classifier
            .classify(&self.plan, contributions, &mut classes)?;
        // What mixed precision must see of an overflow arrives exact.
        for &id in tracker.non_finite() {
            classes[id as usize] = IMPORTANT;
        }
        self.tracker = tracker;
        let levels = self.classifier.config().levels;
        let spare = self.spare.take();
        let framer = RoundFramer::new(
            self.plan.clone(),
            (self.layout_id, round),
            classes.clone(),
            (levels, self.formats),
            max_datagram,
            spare,
        );
        self.classes = classes;
        Ok(framer)
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
        let budget = max - DATA_HEADER_LEN;
        let mut out = Vec::new();
        for seg in crate::wire::decode_all(datagram) {
            let crate::wire::Segment::Data(h, payload) = seg? else {
                return Err(crate::wire::WireError::Kind(2).into());
            };
            let n = h.validate(&self.plan)?;
            let t = h.tensor as usize;
            payload::check(h.format, &self.plan, t, h.first_value(), payload)
                .map_err(crate::wire::WireError::from)?;
            let mut emit = |first: u32, bytes: &[u8]| {
                let header = h.fragment(&self.plan, first * 4, bytes.len() as u32);
                let mut d = vec![0u8; DATA_HEADER_LEN + bytes.len()];
                header.write(&mut d);
                d[DATA_HEADER_LEN..].copy_from_slice(bytes);
                out.push(Bytes::from(d));
            };
            match h.format.element_bytes() {
                Some(e) => {
                    let step = budget / e * e;
                    for (i, piece) in payload.chunks(step).enumerate() {
                        emit(h.first_value() + (i * step / e) as u32, piece);
                    }
                }
                None => {
                    // Cut between codes; a section cut in two carries its
                    // chunk's scale in both pieces.
                    let (mut piece, mut piece_first) = (Vec::with_capacity(budget), 0);
                    let mut pos = 0;
                    for (start, len) in payload::sections(&self.plan, t, h.first_value(), n) {
                        let scale = &payload[pos..pos + LOG8_SCALE_BYTES];
                        let mut codes = &payload[pos + LOG8_SCALE_BYTES..][..len as usize];
                        pos += LOG8_SCALE_BYTES + len as usize;
                        let mut at = start;
                        while !codes.is_empty() {
                            let room = budget - piece.len();
                            if room <= LOG8_SCALE_BYTES {
                                emit(piece_first, &piece);
                                piece.clear();
                                continue;
                            }
                            if piece.is_empty() {
                                piece_first = at;
                            }
                            let k = codes.len().min(room - LOG8_SCALE_BYTES);
                            piece.extend_from_slice(scale);
                            piece.extend_from_slice(&codes[..k]);
                            codes = &codes[k..];
                            at += k as u32;
                        }
                    }
                    if !piece.is_empty() {
                        emit(piece_first, &piece);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Hands a sent round back so its buffer is reused by the next round:
    /// mapping ~100 MB of fresh memory every round costs more than the
    /// framing itself. The buffer is reclaimed when the next round starts,
    /// if by then every packet of this round has been dropped elsewhere (the
    /// transport has sent them, and the peer acknowledged the stream);
    /// otherwise the next round takes fresh memory.
    pub fn recycle(&mut self, sent: EncodedRound) {
        self.spare = Some(sent.root);
    }
}

/// Writes one round's packets, in sending order: the important segments and
/// the round end, then the lossy datagrams level by level. Made by
/// [`Encoder::start`] (or [`frame_with_classes`]).
///
/// `grads` must be the gradients the round was started with; they are
/// passed again rather than borrowed so that the caller can frame on one
/// thread while it sends on another. Gradients of the right shapes but
/// other values are framed as they are (the round end was computed from the
/// classes, not the values, so it stays true).
#[derive(Debug)]
pub struct RoundFramer {
    plan: Arc<ChunkPlan>,
    layout: u16,
    round: u32,
    levels: u8,
    formats: ClassFormats,
    end: RoundEnd,
    classes: Vec<Class>,
    /// Segments per class, in sending order.
    segments: Vec<Vec<Piece>>,
    /// Per lossy class, where each datagram ends, as a count of segments.
    packet_ends: Vec<Vec<usize>>,
    /// Important segments framed so far.
    next_important: usize,
    /// The round end is written: the reliable part is complete.
    reliable_done: bool,
    /// The part of the round's allocation not yet handed out.
    buf: BytesMut,
    /// The log8 chunks' scales, each computed once.
    scales: payload::Log8Scales,
}

impl RoundFramer {
    /// Fixes every segment and packet of a classed round and makes room for
    /// its bytes (in `spare` if it can be reclaimed and is large enough).
    fn new(
        plan: Arc<ChunkPlan>,
        (layout, round): (u16, u32),
        classes: Vec<Class>,
        (levels, formats): (u8, ClassFormats),
        max_datagram: usize,
        spare: Option<BytesMut>,
    ) -> Self {
        let SegmentPlan {
            end,
            segments,
            packet_ends,
        } = plan_segments(
            &plan,
            (layout, round),
            &classes,
            (levels, formats),
            max_datagram,
        );

        let total: usize = segments
            .iter()
            .flatten()
            .map(|p| DATA_HEADER_LEN + p.wire as usize)
            .sum::<usize>()
            + ROUND_END_LEN;
        let had_spare = spare.is_some();
        let reclaimed = spare.and_then(|mut b| {
            b.clear();
            // Reclaiming never copies (the spare is an empty tail) and fails
            // while a packet of its round is still alive somewhere.
            b.try_reclaim(total).then_some(b)
        });
        if had_spare && reclaimed.is_none() {
            tracing::debug!(round, "previous round's buffer still in use: fresh memory");
        }
        // A little headroom, so that a later round with a few more headers
        // still fits the recycled buffer.
        let buf = reclaimed.unwrap_or_else(|| BytesMut::with_capacity(total + total / 64));
        let mut scales = payload::Log8Scales::default();
        if formats.lossy == ValueFormat::Log8 {
            scales.reset(plan.len());
        }
        Self {
            plan,
            layout,
            round,
            levels,
            formats,
            end,
            classes,
            segments,
            packet_ends,
            next_important: 0,
            reliable_done: false,
            buf,
            scales,
        }
    }

    /// Round index.
    pub fn round(&self) -> u32 {
        self.round
    }

    /// What the round sends per class; known before any byte is framed.
    pub fn end(&self) -> &RoundEnd {
        &self.end
    }

    /// The class of every chunk, by chunk id.
    pub fn classes(&self) -> &[Class] {
        &self.classes
    }

    /// The value formats of the classes.
    pub fn formats(&self) -> ClassFormats {
        self.formats
    }

    /// Payload bytes each class puts on the wire in its format (index 0
    /// important, `l` level `l`), headers not counted; the round end's
    /// `bytes` count the same values as `f32`.
    pub fn wire_payload(&self) -> [u64; CLASS_SLOTS] {
        let mut out = [0u64; CLASS_SLOTS];
        for (o, segs) in out.iter_mut().zip(&self.segments) {
            *o = segs.iter().map(|p| p.wire as u64).sum();
        }
        out
    }

    /// Bytes of the reliable stream (important segments and the round end).
    pub fn reliable_len(&self) -> usize {
        self.segments[0]
            .iter()
            .map(|p| DATA_HEADER_LEN + p.wire as usize)
            .sum::<usize>()
            + ROUND_END_LEN
    }

    /// True once every reliable byte was handed out or framed.
    pub fn reliable_done(&self) -> bool {
        self.reliable_done
    }

    /// Frames the next important segments, whole, until at least
    /// `min_bytes` are written or none is left, and returns them; after the
    /// last segment, the round end is appended. `None` once the reliable
    /// part is complete. Concatenated, the pieces are exactly the reliable
    /// part [`Encoder::encode`] produces.
    pub fn next_reliable<G: AsRef<[f32]>>(
        &mut self,
        grads: &[G],
        min_bytes: usize,
    ) -> Result<Option<Bytes>, EncodeError> {
        if self.reliable_done {
            return Ok(None);
        }
        crate::score::check_shapes(&self.plan, grads)?;
        self.write_reliable(grads, min_bytes);
        Ok(Some(self.buf.split().freeze()))
    }

    /// Like [`next_reliable`](Self::next_reliable), but a segment of at
    /// least [`ZERO_COPY_MIN`] bytes is not copied: its header is framed
    /// and its values are handed out as a view of `tensors`, which hold
    /// every tensor's values as little-endian f32 bytes (see
    /// [`shared_f32_bytes`]). Shorter segments are copied and coalesced, so
    /// a QUIC send buffer holds few pieces. Values in another format than
    /// `f32` are converted, so copied. Concatenated, the pieces are
    /// exactly what [`next_reliable`](Self::next_reliable) would return.
    pub fn next_reliable_shared(
        &mut self,
        tensors: &[Bytes],
        min_bytes: usize,
    ) -> Result<Option<Vec<Bytes>>, EncodeError> {
        if self.reliable_done {
            return Ok(None);
        }
        check_byte_shapes(&self.plan, tensors)?;
        let mut pieces = Vec::new();
        let mut handed = 0;
        let views = self.formats.important == ValueFormat::F32;
        while !self.reliable_done && handed + self.buf.len() < min_bytes {
            match self.segments[0].get(self.next_important).copied() {
                Some(p) if views && p.len as usize >= ZERO_COPY_MIN => {
                    self.write_header(IMPORTANT, p);
                    let head = self.buf.split().freeze();
                    let (from, to) = (p.offset as usize, (p.offset + p.len) as usize);
                    handed += head.len() + p.len as usize;
                    pieces.push(head);
                    pieces.push(tensors[p.tensor as usize].slice(from..to));
                    self.next_important += 1;
                }
                Some(p) => {
                    self.write_header(IMPORTANT, p);
                    self.put_values(IMPORTANT, p, &tensors[p.tensor as usize]);
                    self.next_important += 1;
                }
                None => {
                    self.buf.put_slice(&self.end.to_bytes());
                    self.reliable_done = true;
                }
            }
        }
        if !self.buf.is_empty() {
            pieces.push(self.buf.split().freeze());
        }
        Ok(Some(pieces))
    }

    /// Frames what is left: the rest of the reliable part (in
    /// [`EncodedRound::reliable`]) and every lossy datagram.
    pub fn finish<G: AsRef<[f32]>>(mut self, grads: &[G]) -> Result<EncodedRound, EncodeError> {
        crate::score::check_shapes(&self.plan, grads)?;
        let _span = tracing::debug_span!("encode_finish", round = self.round).entered();
        self.write_reliable(grads, usize::MAX);
        let reliable = self.buf.split().freeze();
        let mut lossy = Vec::with_capacity(self.levels as usize);
        let packet_ends = std::mem::take(&mut self.packet_ends);
        for (c, ends) in packet_ends
            .iter()
            .enumerate()
            .take(self.levels as usize + 1)
            .skip(1)
        {
            let mut datagrams = Vec::with_capacity(ends.len());
            let mut first = 0;
            for &e in ends {
                for i in first..e {
                    self.write_segment(grads, c as Class, self.segments[c][i]);
                }
                datagrams.push(self.buf.split().freeze());
                first = e;
            }
            lossy.push(datagrams);
        }
        Ok(EncodedRound {
            round: self.round,
            reliable,
            lossy,
            end: self.end,
            wire_payload: self.wire_payload(),
            classes: self.classes,
            root: self.buf,
        })
    }

    /// Frames what is left for a transport that sends the lossy levels on
    /// a stream rather than as datagrams: `lossy[l - 1]` is then level
    /// `l`'s stream bytes as pieces, not datagrams, and as in
    /// [`next_reliable_shared`](Self::next_reliable_shared) a segment of
    /// at least [`ZERO_COPY_MIN`] bytes is a view of `tensors`, not a
    /// copy. Concatenated, a level's pieces are exactly the bytes of its
    /// datagrams from [`finish`](Self::finish). A piece of exactly
    /// [`DATA_HEADER_LEN`] bytes is a segment's header, whose values are
    /// the next piece; every other piece ends where a segment ends, so a
    /// transport may spread a level over several streams there. The rest
    /// of the reliable part, if any, is copied into
    /// [`EncodedRound::reliable`].
    pub fn finish_shared(mut self, tensors: &[Bytes]) -> Result<EncodedRound, EncodeError> {
        check_byte_shapes(&self.plan, tensors)?;
        let _span = tracing::debug_span!("encode_finish_shared", round = self.round).entered();
        let mut reliable = BytesMut::new();
        while let Some(pieces) = self.next_reliable_shared(tensors, usize::MAX)? {
            for p in pieces {
                reliable.extend_from_slice(&p);
            }
        }
        let mut lossy = Vec::with_capacity(self.levels as usize);
        let views = self.formats.lossy == ValueFormat::F32;
        for c in 1..=self.levels as usize {
            let mut pieces = Vec::new();
            for i in 0..self.segments[c].len() {
                let p = self.segments[c][i];
                let (from, to) = (p.offset as usize, (p.offset + p.len) as usize);
                let values = tensors[p.tensor as usize].slice(from..to);
                if views && values.len() >= ZERO_COPY_MIN {
                    // Whole segments before the header, never a header
                    // after whole segments in one piece.
                    if !self.buf.is_empty() {
                        pieces.push(self.buf.split().freeze());
                    }
                    self.write_header(c as Class, p);
                    pieces.push(self.buf.split().freeze());
                    pieces.push(values);
                } else {
                    self.write_header(c as Class, p);
                    self.put_values(c as Class, p, &tensors[p.tensor as usize]);
                }
            }
            if !self.buf.is_empty() {
                pieces.push(self.buf.split().freeze());
            }
            lossy.push(pieces);
        }
        Ok(EncodedRound {
            round: self.round,
            reliable: reliable.freeze(),
            lossy,
            end: self.end,
            wire_payload: self.wire_payload(),
            classes: self.classes,
            root: self.buf,
        })
    }

    /// Writes important segments (then the round end) into the buffer
    /// until `min_bytes` are pending or the reliable part is complete.
    fn write_reliable<G: AsRef<[f32]>>(&mut self, grads: &[G], min_bytes: usize) {
        while !self.reliable_done && self.buf.len() < min_bytes {
            match self.segments[0].get(self.next_important).copied() {
                Some(p) => {
                    self.write_segment(grads, IMPORTANT, p);
                    self.next_important += 1;
                }
                None => {
                    self.buf.put_slice(&self.end.to_bytes());
                    self.reliable_done = true;
                }
            }
        }
    }

    /// Appends one segment: header, then the values in the class's format.
    fn write_segment<G: AsRef<[f32]>>(&mut self, grads: &[G], class: Class, p: Piece) {
        self.write_header(class, p);
        let tensor = grads[p.tensor as usize].as_ref();
        let format = self.formats.of(class);
        if format == ValueFormat::F32 {
            extend_f32s(
                &mut self.buf,
                &tensor[p.offset as usize / 4..(p.offset + p.len) as usize / 4],
            );
            return;
        }
        let at = self.buf.len();
        self.buf.resize(at + p.wire as usize, 0);
        payload::write(
            format,
            &self.plan,
            p.tensor as usize,
            (0, tensor),
            (p.offset / 4, p.len / 4),
            &mut self.buf[at..],
            &mut self.scales,
        );
    }

    /// Appends piece `p`'s values in the class's format, from `tensor`, the
    /// whole tensor as little-endian f32 bytes (see [`shared_f32_bytes`]).
    fn put_values(&mut self, class: Class, p: Piece, tensor: &[u8]) {
        let format = self.formats.of(class);
        let (first, n) = (p.offset / 4, p.len / 4);
        if format == ValueFormat::F32 {
            self.buf
                .put_slice(&tensor[p.offset as usize..(p.offset + p.len) as usize]);
            return;
        }
        // The piece's chunks whole: Log8 scales each by all its values.
        let cover = payload::covering_chunks(&self.plan, p.tensor as usize, first, n);
        let mut values = vec![0f32; cover.len()];
        crate::format::get_f32s(
            &mut values,
            &tensor[cover.start as usize * 4..cover.end as usize * 4],
        );
        let at = self.buf.len();
        self.buf.resize(at + p.wire as usize, 0);
        payload::write(
            format,
            &self.plan,
            p.tensor as usize,
            (cover.start, &values),
            (first, n),
            &mut self.buf[at..],
            &mut self.scales,
        );
    }

    /// Appends the header of one segment.
    fn write_header(&mut self, class: Class, p: Piece) {
        let header = piece_header(
            &self.plan,
            (self.layout, self.round),
            (class, self.formats.of(class)),
            &p,
        );
        let mut h = [0u8; DATA_HEADER_LEN];
        header.write(&mut h);
        self.buf.put_slice(&h);
    }
}

/// A round cut into segments: per class, the segments in order and
/// (for the lossy classes) where each datagram ends, and the round end
/// that describes them.
struct SegmentPlan {
    end: RoundEnd,
    segments: Vec<Vec<Piece>>,
    /// `packet_ends[c]` lists where each packet of class `c` ends, as a
    /// count of segments.
    packet_ends: Vec<Vec<usize>>,
}

/// Cuts a classed round into segments: adjacent chunks of one tensor with
/// the same class form runs; runs are cut on the stream only at the
/// segment limit, in datagrams so as to fill each one up (in wire bytes of
/// the class's format).
fn plan_segments(
    plan: &ChunkPlan,
    (layout, round): (u16, u32),
    classes: &[Class],
    (levels, formats): (u8, ClassFormats),
    max_datagram: usize,
) -> SegmentPlan {
    let mut end = RoundEnd {
        layout,
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
                wire: 0,
            }),
        }
    }

    // Cut runs into segments: on the stream only at the segment limit, in
    // datagrams to fill each one up.
    let mut segments: Vec<Vec<Piece>> = vec![Vec::new(); CLASS_SLOTS];
    let mut packet_ends: Vec<Vec<usize>> = vec![Vec::new(); CLASS_SLOTS];
    let wire = |format, p: &Piece| {
        payload::wire_len(format, plan, p.tensor as usize, p.offset / 4, p.len / 4) as u32
    };
    for r in &runs[IMPORTANT as usize] {
        let (mut off, mut rem) = (r.offset, r.len);
        while rem > 0 {
            let n = rem.min(MAX_SEGMENT_PAYLOAD);
            let mut p = Piece {
                tensor: r.tensor,
                offset: off,
                len: n,
                wire: 0,
            };
            p.wire = wire(formats.important, &p);
            segments[0].push(p);
            off += n;
            rem -= n;
        }
    }
    end.packets[0] = segments[0].len() as u32;
    let max = max_datagram.min(DATA_HEADER_LEN + MAX_SEGMENT_PAYLOAD as usize);
    let format = formats.lossy;
    for c in 1..CLASS_SLOTS {
        let (segs, ends) = (&mut segments[c], &mut packet_ends[c]);
        let mut used = 0usize;
        for r in &runs[c] {
            let t = r.tensor as usize;
            let (mut first, mut rem) = (r.offset / 4, r.len / 4);
            while rem > 0 {
                let avail = max.saturating_sub(used + DATA_HEADER_LEN);
                let fit = payload::values_within(format, plan, t, first, rem, avail);
                let take = if fit == rem {
                    rem
                } else if fit > 0
                    && (used == 0 || payload::wire_len(format, plan, t, first, fit) >= MIN_FRAGMENT)
                {
                    fit
                } else if used > 0 {
                    ends.push(segs.len());
                    used = 0;
                    continue;
                } else {
                    // Not even one value fits an empty datagram: the limit
                    // is below MIN_DATAGRAM, which callers check. Send one
                    // value over the limit rather than loop.
                    1
                };
                let mut p = Piece {
                    tensor: r.tensor,
                    offset: first * 4,
                    len: take * 4,
                    wire: 0,
                };
                p.wire = wire(format, &p);
                used += DATA_HEADER_LEN + p.wire as usize;
                segs.push(p);
                first += take;
                rem -= take;
            }
        }
        if used > 0 {
            ends.push(segs.len());
        }
        end.packets[c] = ends.len() as u32;
    }
    SegmentPlan {
        end,
        segments,
        packet_ends,
    }
}

/// The header of the segment that carries piece `p` of class `class` in
/// `format`.
fn piece_header(
    plan: &ChunkPlan,
    (layout, round): (u16, u32),
    (class, format): (Class, ValueFormat),
    p: &Piece,
) -> DataHeader {
    let t = p.tensor as usize;
    let span = plan.tensor_chunks(t);
    DataHeader {
        layout,
        class,
        format,
        round,
        tensor: p.tensor,
        // Pieces start inside the tensor, so a holder always exists.
        chunk: plan.chunk_at(t, p.offset).unwrap_or(span.start) as u32,
        first_chunk: span.start as u32,
        last_chunk: span.end as u32 - 1,
        tensor_bytes: plan.tensor_bytes(t),
        byte_offset: p.offset,
        payload_len: p.wire,
    }
}

/// Segments at least this long are handed to the transport as views of the
/// caller's tensors by [`RoundFramer::next_reliable_shared`] instead of
/// being copied. Each costs the QUIC send buffer two pieces (header and
/// values), and quinn finds a piece by walking the buffer from its oldest
/// unacknowledged one, so short runs are cheaper copied. For ResNet-50 at
/// the default ratio, runs of 16 KiB and more hold ~73% of the important
/// bytes in ~1300 segments.
pub const ZERO_COPY_MIN: usize = 16 << 10;

/// A tensor's values as little-endian f32 bytes that share `values`'
/// memory (on a little-endian machine; a big-endian one copies), for
/// [`RoundFramer::next_reliable_shared`]. The memory stays alive as long
/// as a view of it does.
pub fn shared_f32_bytes(values: Arc<Vec<f32>>) -> Bytes {
    if cfg!(target_endian = "little") {
        Bytes::from_owner(F32Bytes(values))
    } else {
        let mut buf = BytesMut::with_capacity(values.len() * 4);
        extend_f32s(&mut buf, &values);
        buf.freeze()
    }
}

/// Owner of [`shared_f32_bytes`]' memory.
struct F32Bytes(Arc<Vec<f32>>);

impl AsRef<[u8]> for F32Bytes {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// [`check_shapes`](crate::score::check_shapes) for tensors as bytes.
fn check_byte_shapes(plan: &ChunkPlan, tensors: &[Bytes]) -> Result<(), GradientError> {
    if tensors.len() != plan.tensor_count() {
        return Err(GradientError::TensorCount {
            expected: plan.tensor_count(),
            got: tensors.len(),
        });
    }
    for (tensor, t) in tensors.iter().enumerate() {
        let expected = plan.tensor_bytes(tensor) as usize;
        if t.len() != expected {
            return Err(GradientError::TensorLength {
                tensor,
                expected: expected / 4,
                got: t.len() / 4,
            });
        }
    }
    Ok(())
}

/// Appends `values` as little-endian f32 bytes.
fn extend_f32s(buf: &mut BytesMut, values: &[f32]) {
    if cfg!(target_endian = "little") {
        // The in-memory form is the wire form: one memcpy.
        buf.put_slice(bytemuck::cast_slice(values));
    } else {
        for v in values {
            buf.put_f32_le(*v);
        }
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
    RoundFramer::new(
        Arc::new(plan.clone()),
        (0, round),
        classes.to_vec(),
        (levels, ClassFormats::F32),
        max_datagram,
        None,
    )
    .finish(grads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::put_f32s;
    use crate::rng::SplitMix64;

    /// The one-shot framer as it was before framing became incremental, kept
    /// as the oracle the incremental one must match byte for byte.
    fn oracle_frame<G: AsRef<[f32]>>(
        plan: &ChunkPlan,
        round: u32,
        grads: &[G],
        classes: &[Class],
        levels: u8,
        max_datagram: usize,
        mut buf: Vec<u8>,
    ) -> EncodedRound {
        // The planning is shared: what the oracle checks is the writing.
        let SegmentPlan {
            end,
            segments,
            packet_ends,
        } = plan_segments(
            plan,
            (0, round),
            classes,
            (levels, ClassFormats::F32),
            max_datagram,
        );

        // Write everything into one buffer.
        let total: usize = segments
            .iter()
            .flatten()
            .map(|p| DATA_HEADER_LEN + p.wire as usize)
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
                let header = piece_header(plan, (0, round), (c as Class, ValueFormat::F32), p);
                header.write(&mut buf[pos..pos + DATA_HEADER_LEN]);
                pos += DATA_HEADER_LEN;
                let values =
                    &grads[t].as_ref()[p.offset as usize / 4..(p.offset + p.len) as usize / 4];
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
            wire_payload: [0; CLASS_SLOTS],
            root: BytesMut::new(),
        }
    }

    fn grads(layout: &Layout, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = SplitMix64::new(seed);
        (0..layout.len())
            .map(|t| {
                (0..layout.tensor_len(t))
                    .map(|_| {
                        let s = rng.next_u64();
                        ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * (1 + (s & 7)) as f32
                    })
                    .collect()
            })
            .collect()
    }

    fn assert_same(a: &EncodedRound, b: &EncodedRound) {
        assert_eq!(a.reliable, b.reliable);
        assert_eq!(a.lossy, b.lossy);
        assert_eq!(a.end, b.end);
    }

    /// One-shot and incremental framing, whatever the piece size and with
    /// recycled buffers, give exactly the bytes of the original framer.
    #[test]
    fn incremental_framing_matches_the_one_shot_oracle() {
        let layout = crate::presets::resnet18();
        for (levels, max_datagram) in [(3u8, 1414usize), (1, 1162), (7, MIN_DATAGRAM + 60)] {
            let config = EncoderConfig {
                classify: ClassifyConfig {
                    levels,
                    ..Default::default()
                },
                ..Default::default()
            };
            let mut one_shot = Encoder::new(&layout, config).unwrap();
            let mut pieces = Encoder::new(&layout, config).unwrap();
            for (round, piece) in [(0u32, 1usize), (1, 4096), (2, 1 << 20), (3, usize::MAX)] {
                let g = grads(&layout, 10 + round as u64);
                let a = one_shot.encode(round, &g, max_datagram).unwrap();
                let want = oracle_frame(
                    one_shot.plan(),
                    round,
                    &g,
                    &a.classes,
                    levels,
                    max_datagram,
                    Vec::new(),
                );
                assert_same(&a, &want);

                let mut framer = pieces.start(round, &g, max_datagram).unwrap();
                assert_eq!(framer.end(), &want.end);
                assert_eq!(framer.classes(), &a.classes[..]);
                assert_eq!(framer.reliable_len(), want.reliable.len());
                let mut reliable = Vec::new();
                while let Some(b) = framer.next_reliable(&g, piece).unwrap() {
                    // Whole segments only, at least `piece` bytes unless last.
                    assert!(b.len() >= piece.min(want.reliable.len() - reliable.len()));
                    reliable.extend_from_slice(&b);
                }
                assert!(framer.reliable_done());
                assert_eq!(reliable, want.reliable);
                let b = framer.finish(&g).unwrap();
                assert!(b.reliable.is_empty());
                assert_eq!(b.lossy, want.lossy);
                assert_eq!(b.classes, a.classes);
                one_shot.recycle(a);
                pieces.recycle(b);
            }
        }
    }

    /// Framing from shared tensors gives the bytes of the copying framer;
    /// long segments are views of the tensors' own memory.
    #[test]
    fn shared_framing_matches_copying_and_shares_long_segments() {
        let layout = crate::presets::resnet18();
        let mut copying = Encoder::new(&layout, EncoderConfig::default()).unwrap();
        let mut sharing = Encoder::new(&layout, EncoderConfig::default()).unwrap();
        for (round, piece) in [(0u32, 1usize), (1, 64 << 10), (2, usize::MAX)] {
            let g = grads(&layout, 20 + round as u64);
            let want = copying.encode(round, &g, 1414).unwrap();
            let shared: Vec<Arc<Vec<f32>>> = g.iter().cloned().map(Arc::new).collect();
            let views: Vec<Bytes> = shared.iter().cloned().map(shared_f32_bytes).collect();
            let mut framer = sharing.start(round, &g, 1414).unwrap();
            let (mut reliable, mut viewed) = (Vec::new(), 0);
            while let Some(pieces) = framer.next_reliable_shared(&views, piece).unwrap() {
                let len: usize = pieces.iter().map(Bytes::len).sum();
                assert!(len >= piece.min(want.reliable.len() - reliable.len()));
                for p in &pieces {
                    let inside = shared.iter().any(|t| {
                        let range = t.as_ptr_range();
                        let start = p.as_ptr() as *const f32;
                        range.contains(&start) && p.len() >= ZERO_COPY_MIN
                    });
                    if inside {
                        viewed += p.len();
                    }
                    reliable.extend_from_slice(p);
                }
            }
            assert_eq!(reliable, want.reliable);
            assert!(
                viewed > want.reliable.len() / 10,
                "round {round}: only {viewed} of {} bytes shared",
                want.reliable.len()
            );
            let b = framer.finish(&g).unwrap();
            assert_eq!(b.lossy, want.lossy);
            copying.recycle(want);
            sharing.recycle(b);
        }
        // Tensors of other sizes are refused, not sliced out of bounds.
        let g = grads(&layout, 1);
        let mut framer = sharing.start(9, &g, 1414).unwrap();
        let mut views: Vec<Bytes> = g
            .iter()
            .cloned()
            .map(Arc::new)
            .map(shared_f32_bytes)
            .collect();
        views[3] = views[3].slice(4..);
        assert!(matches!(
            framer.next_reliable_shared(&views, 1),
            Err(EncodeError::Gradient(GradientError::TensorLength {
                tensor: 3,
                ..
            }))
        ));
        assert!(matches!(
            framer.next_reliable_shared(&views[1..], 1),
            Err(EncodeError::Gradient(GradientError::TensorCount { .. }))
        ));
    }

    /// The lossy part framed for a stream from shared tensors: each level's
    /// pieces are its datagrams' bytes end to end, long segments are views,
    /// and what the reliable pieces left is in `reliable`.
    #[test]
    fn shared_lossy_framing_matches_the_datagrams_end_to_end() {
        let layout = crate::presets::resnet18();
        let mut copying = Encoder::new(&layout, EncoderConfig::default()).unwrap();
        let mut sharing = Encoder::new(&layout, EncoderConfig::default()).unwrap();
        // Datagrams large enough that some lossy segments are shared.
        let max = 64 << 10;
        for (round, taken) in [(0u32, usize::MAX), (1, 0)] {
            let g = grads(&layout, 40 + round as u64);
            let want = copying.encode(round, &g, max).unwrap();
            let shared: Vec<Arc<Vec<f32>>> = g.iter().cloned().map(Arc::new).collect();
            let views: Vec<Bytes> = shared.iter().cloned().map(shared_f32_bytes).collect();
            let mut framer = sharing.start(round, &g, max).unwrap();
            // Round 0 takes the whole reliable part first, round 1 none.
            let mut reliable = Vec::new();
            if taken > 0 {
                while let Some(pieces) = framer.next_reliable_shared(&views, taken).unwrap() {
                    pieces.iter().for_each(|p| reliable.extend_from_slice(p));
                }
            }
            let b = framer.finish_shared(&views).unwrap();
            reliable.extend_from_slice(&b.reliable);
            assert_eq!(reliable, want.reliable);
            assert_eq!(b.lossy.len(), want.lossy.len());
            let mut viewed = 0;
            for (pieces, datagrams) in b.lossy.iter().zip(&want.lossy) {
                let got: Vec<u8> = pieces.iter().flat_map(|p| p.to_vec()).collect();
                let whole: Vec<u8> = datagrams.iter().flat_map(|d| d.to_vec()).collect();
                assert_eq!(got, whole);
                // Every piece but a lone header ends a segment: the
                // pieces up to it decode whole.
                let (mut from, mut upto) = (0, 0);
                for (i, p) in pieces.iter().enumerate() {
                    upto += p.len();
                    if p.len() == DATA_HEADER_LEN {
                        assert!(pieces.get(i + 1).is_some_and(|v| v.len() >= ZERO_COPY_MIN));
                        continue;
                    }
                    assert!(crate::wire::decode_all(&got[from..upto]).all(|s| s.is_ok()));
                    from = upto;
                }
                viewed += pieces
                    .iter()
                    .filter(|p| {
                        shared
                            .iter()
                            .any(|t| t.as_ptr_range().contains(&(p.as_ptr() as *const f32)))
                    })
                    .map(|p| p.len())
                    .sum::<usize>();
            }
            assert!(viewed > 0, "round {round}: no lossy segment shared");
            assert_eq!(b.end, want.end);
            copying.recycle(want);
            sharing.recycle(b);
        }
        // Tensors of other sizes are refused.
        let g = grads(&layout, 1);
        let framer = sharing.start(9, &g, max).unwrap();
        let views: Vec<Bytes> = g
            .iter()
            .cloned()
            .map(Arc::new)
            .map(shared_f32_bytes)
            .collect();
        assert!(matches!(
            framer.finish_shared(&views[1..]),
            Err(EncodeError::Gradient(GradientError::TensorCount { .. }))
        ));
    }

    #[test]
    fn a_recycled_buffer_is_reused_once_its_packets_are_gone() {
        let layout = crate::presets::tiny();
        let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
        let g = grads(&layout, 1);
        let a = enc.encode(0, &g, 1414).unwrap();
        let ptr = a.reliable.as_ptr();
        enc.recycle(a);
        let b = enc.encode(1, &g, 1414).unwrap();
        assert_eq!(b.reliable.as_ptr(), ptr, "the buffer was reclaimed");
        // A packet still held (by a transport) keeps the buffer from being
        // reclaimed; the next round takes fresh memory and is still right.
        let held = b.reliable.clone();
        enc.recycle(b);
        let c = enc.encode(2, &g, 1414).unwrap();
        assert_ne!(c.reliable.as_ptr(), held.as_ptr());
        assert_eq!(c.reliable[8..12], 2u32.to_le_bytes());
        assert_eq!(held[8..12], 1u32.to_le_bytes());
    }

    #[test]
    fn framing_other_shapes_is_an_error() {
        let layout = crate::presets::tiny();
        let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
        let g = grads(&layout, 1);
        let mut framer = enc.start(0, &g, 1414).unwrap();
        let short: Vec<Vec<f32>> = g.iter().skip(1).cloned().collect();
        assert!(matches!(
            framer.next_reliable(&short, 1),
            Err(EncodeError::Gradient(_))
        ));
        assert!(matches!(
            framer.finish(&short),
            Err(EncodeError::Gradient(_))
        ));
    }
}
