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
//!
//! [`payload`]: crate::payload

mod config;
mod error;
mod framer;
mod reframe;
mod segment_plan;
mod tensor_bytes;

#[cfg(test)]
mod tests;

pub use config::{EncoderConfig, MIN_DATAGRAM};
pub use error::EncodeError;
pub use framer::{frame_with_classes, RoundFramer};
pub use tensor_bytes::{shared_f32_bytes, ZERO_COPY_MIN};

use crate::classify::{Class, Classifier, IMPORTANT};
use crate::format::ClassFormats;
use crate::layout::{ChunkPlan, Layout};
use crate::score::ContributionTracker;
use crate::wire::{RoundEnd, CLASS_SLOTS};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;

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

    /// Fixes the packets of round `round` with the caller's `classes` (one
    /// per chunk: [`IMPORTANT`] or a lossy level of this encoder's), not
    /// scored and classed: for a sender whose split must be the same on
    /// several links and known to itself (an owner's return of a summed
    /// shard). The contribution history does not advance. A chunk that
    /// holds a value that is not finite must be important (a lossy level
    /// in `Log8` could not carry it); else, as a bad level or a wrong
    /// count, nothing is framed and the error says why.
    pub fn start_classed<G: AsRef<[f32]>>(
        &mut self,
        round: u32,
        grads: &[G],
        classes: &[Class],
        max_datagram: usize,
    ) -> Result<RoundFramer, EncodeError> {
        if max_datagram < MIN_DATAGRAM {
            return Err(EncodeError::DatagramTooSmall { got: max_datagram });
        }
        crate::score::check_shapes(&self.plan, grads)?;
        let levels = self.classifier.config().levels;
        if classes.len() != self.plan.len() {
            return Err(crate::classify::ClassifyError::Contributions {
                expected: self.plan.len(),
                got: classes.len(),
            }
            .into());
        }
        if let Some(&bad) = classes.iter().find(|&&c| c > levels) {
            return Err(crate::classify::ClassifyError::Levels(bad).into());
        }
        for (id, chunk) in self.plan.chunks().iter().enumerate() {
            let values = &grads[chunk.tensor as usize].as_ref()
                [chunk.start as usize..(chunk.start + chunk.len) as usize];
            if classes[id] != IMPORTANT && values.iter().any(|v| !v.is_finite()) {
                return Err(
                    crate::score::GradientError::NonFiniteLossy { chunk: id as u32 }.into(),
                );
            }
        }
        let spare = self.spare.take();
        Ok(RoundFramer::new(
            self.plan.clone(),
            (self.layout_id, round),
            classes.to_vec(),
            (levels, self.formats),
            max_datagram,
            spare,
        ))
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
