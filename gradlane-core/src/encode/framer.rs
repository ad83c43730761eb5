//! Writing a planned round's bytes: the reliable part in pieces of a size
//! the caller picks, then the lossy datagrams, copied from the gradients or,
//! for long `f32` segments, handed out as views of the caller's tensors;
//! and a round framed with classes the caller chose, for tests and tools.

use super::segment_plan::{piece_header, plan_segments, Piece, SegmentPlan};
use super::tensor_bytes::{check_byte_shapes, extend_f32s, ZERO_COPY_MIN};
use super::{EncodeError, EncodedRound, MIN_DATAGRAM};
use crate::classify::{Class, ClassifyError, IMPORTANT};
use crate::format::{ClassFormats, ValueFormat};
use crate::layout::ChunkPlan;
use crate::payload;
use crate::wire::{RoundEnd, CLASS_SLOTS, DATA_HEADER_LEN, ROUND_END_LEN};
use bytes::{BufMut, Bytes, BytesMut};
use std::sync::Arc;

/// Writes one round's packets, in sending order: the important segments and
/// the round end, then the lossy datagrams level by level. Made by
/// [`Encoder::start`] (or [`frame_with_classes`]).
///
/// `grads` must be the gradients the round was started with; they are
/// passed again rather than borrowed so that the caller can frame on one
/// thread while it sends on another. Gradients of the right shapes but
/// other values are framed as they are (the round end was computed from the
/// classes, not the values, so it stays true).
///
/// [`Encoder::start`]: super::Encoder::start
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
    pub(super) fn new(
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
    ///
    /// [`Encoder::encode`]: super::Encoder::encode
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
    ///
    /// [`shared_f32_bytes`]: super::shared_f32_bytes
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
    ///
    /// [`shared_f32_bytes`]: super::shared_f32_bytes
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
