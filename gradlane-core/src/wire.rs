//! The packet format: fixed-size little-endian headers, versioned.
//!
//! Everything gradlane sends is a sequence of *segments*. A datagram holds one
//! or more segments of one class; the reliable stream of a round is a run of
//! segments closed by a [`RoundEnd`]. Two kinds exist:
//!
//! * a data segment ([`DataHeader`], 40 bytes, then the payload): a contiguous
//!   byte range of one tensor — a whole chunk, several adjacent chunks of the
//!   same class, or a fragment of a chunk larger than a datagram;
//! * a round end ([`RoundEnd`], 152 bytes): sent on the reliable stream after
//!   the last important byte of a round, it tells the receiver how many
//!   chunks, bytes and packets of each class the sender sent, and a digest of
//!   the important chunk ids, so the receiver can *check* that it holds every
//!   important chunk rather than trust that it does.
//!
//! ```text
//! common prefix (8 bytes)
//!   0  u16  magic 0x4C47 ("GL" in memory)
//!   2  u8   version (2)
//!   3  u8   kind: 1 data, 2 round end
//!   4  u8   class (data: 0 important, 1..=7 lossy level; round end: levels)
//!   5  u8   data: the value format (0 f32, 1 bf16, 2 f16, 3 log8);
//!           round end: reserved, 0
//!   6  u16  layout: which of the sender's layouts on its link (0: the
//!           handshake's; a link may register more, one per bucket)
//! data (40 bytes in all)
//!   8  u32  round        12 u32 tensor       16 u32 chunk (holding byte_offset)
//!   20 u32  first chunk of the tensor        24 u32 last chunk of the tensor
//!   28 u32  tensor size in bytes             32 u32 byte_offset in the tensor
//!   36 u32  payload length in bytes (on the wire, in the value format)
//! round end (152 bytes in all)
//!   8  u32  round        12 u32 reserved, 0  16 u64 digest of important chunk ids
//!   24 [u32; 8] chunks per class   56 [u64; 8] bytes per class
//!   120 [u32; 8] packets per class
//! ```
//!
//! Tensor sizes and byte offsets count 4 bytes a value whatever the format
//! (positions in the `f32` tensor); the payload length counts the bytes
//! that follow the header, which [`payload`](crate::payload) lays out per
//! format. Version 1 (every value `f32`, byte 5 reserved) is refused: a
//! peer of that version is told so at the handshake
//! ([`control`](crate::control)).
//!
//! Decoding never panics and never trusts a length: every field is checked,
//! structurally here and against the [`ChunkPlan`] in [`DataHeader::validate`],
//! and each kind of bad field has its own [`WireError`].

use crate::classify::{Class, MAX_LEVELS};
use crate::format::ValueFormat;
use crate::layout::ChunkPlan;
use crate::rng::SplitMix64;
use thiserror::Error;

mod decode;

pub use decode::{decode, decode_all, decode_head, head_len, segment_len, Head, Segment};

/// Magic number at the start of every segment.
pub const MAGIC: u16 = 0x4C47;
/// The format version this build speaks.
pub const VERSION: u8 = 2;
/// Size of the common prefix, enough to learn a segment's kind.
pub const PREFIX_LEN: usize = 8;
/// Size of a data segment's header.
pub const DATA_HEADER_LEN: usize = 40;
/// Size of a round-end segment.
pub const ROUND_END_LEN: usize = 152;
/// The largest payload one data segment may carry. Bounds what a receiver
/// buffers before it can validate and place a segment.
pub const MAX_SEGMENT_PAYLOAD: u32 = 1 << 20;
/// Number of class slots in a round end (important + 7 levels).
pub const CLASS_SLOTS: usize = 1 + MAX_LEVELS as usize;

const KIND_DATA: u8 = 1;
const KIND_ROUND_END: u8 = 2;

/// Why bytes could not be decoded as a segment, or a header does not fit the plan.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// Fewer bytes than the header or payload needs.
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes the segment needs.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The magic number is wrong: not a gradlane segment.
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    /// A version this build does not speak.
    #[error("unsupported version {0}")]
    Version(u8),
    /// An unknown segment kind.
    #[error("unknown segment kind {0}")]
    Kind(u8),
    /// A class outside `0..=7`.
    #[error("class {0} out of range")]
    Class(u8),
    /// A reserved field is not zero.
    #[error("reserved field is not zero")]
    Reserved,
    /// An unknown value format code.
    #[error("unknown value format {0}")]
    Format(u8),
    /// Important data in a format only the lossy levels may use.
    #[error("important data in {0}, a lossy-only format")]
    LossyOnlyFormat(ValueFormat),
    /// A payload that does not fit its format and the chunk plan.
    #[error(transparent)]
    Payload(#[from] crate::payload::PayloadError),
    /// Offset not a multiple of 4, or length not a whole number of values.
    #[error("offset {offset} or length {len} is not a whole number of values")]
    Misaligned {
        /// Byte offset.
        offset: u32,
        /// Payload length.
        len: u32,
    },
    /// A data segment with no payload.
    #[error("empty payload")]
    EmptyPayload,
    /// A payload larger than [`MAX_SEGMENT_PAYLOAD`].
    #[error("payload of {0} bytes exceeds the segment limit")]
    PayloadTooLarge(u32),
    /// The byte range runs past the tensor size in the header.
    #[error("bytes {offset}..{offset}+{len} outside a tensor of {tensor_bytes} bytes")]
    OutOfRange {
        /// Byte offset.
        offset: u32,
        /// Payload length.
        len: u32,
        /// Tensor size in the header.
        tensor_bytes: u32,
    },
    /// `first <= chunk <= last` does not hold.
    #[error("chunk {chunk} not within first {first} and last {last}")]
    ChunkOrder {
        /// Chunk id.
        chunk: u32,
        /// First chunk of the tensor.
        first: u32,
        /// Last chunk of the tensor.
        last: u32,
    },
    /// A tensor id the layout does not have.
    #[error("unknown tensor {0}")]
    UnknownTensor(u32),
    /// The tensor size disagrees with the layout.
    #[error("tensor {tensor} size {got} bytes, layout says {expected}")]
    TensorSize {
        /// Tensor id.
        tensor: u32,
        /// The layout's size.
        expected: u32,
        /// The header's size.
        got: u32,
    },
    /// The first/last chunk ids disagree with the plan.
    #[error("tensor {tensor} chunks {first}..={last} disagree with the plan")]
    ChunkSpan {
        /// Tensor id.
        tensor: u32,
        /// The header's first chunk.
        first: u32,
        /// The header's last chunk.
        last: u32,
    },
    /// The chunk id is not the chunk holding the byte offset.
    #[error("chunk {chunk} does not hold byte {offset} of tensor {tensor}")]
    ChunkMismatch {
        /// Tensor id.
        tensor: u32,
        /// Chunk id.
        chunk: u32,
        /// Byte offset.
        offset: u32,
    },
    /// A round end whose class counts are inconsistent.
    #[error("round end counts are inconsistent")]
    BadRoundEnd,
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}
fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

fn put_prefix(out: &mut [u8], kind: u8, class: u8, format: u8, layout: u16) {
    out[0..2].copy_from_slice(&MAGIC.to_le_bytes());
    out[2] = VERSION;
    out[3] = kind;
    out[4] = class;
    out[5] = format;
    out[6..8].copy_from_slice(&layout.to_le_bytes());
}

/// The layout a segment belongs to, from its first [`PREFIX_LEN`] bytes
/// (`None` if they are not a segment's): what a link routes segments by
/// before decoding them.
pub fn layout_of(prefix: &[u8]) -> Option<u16> {
    if prefix.len() < PREFIX_LEN || u16_at(prefix, 0) != MAGIC {
        return None;
    }
    Some(u16_at(prefix, 6))
}

/// The header of a data segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataHeader {
    /// Which of the sender's layouts the tensor belongs to.
    pub layout: u16,
    /// Class of the bytes: 0 important, `1..=7` a lossy level.
    pub class: Class,
    /// How the payload's values are written.
    pub format: ValueFormat,
    /// Round index.
    pub round: u32,
    /// Tensor id.
    pub tensor: u32,
    /// The chunk holding `byte_offset`.
    pub chunk: u32,
    /// First chunk id of the tensor.
    pub first_chunk: u32,
    /// Last chunk id of the tensor.
    pub last_chunk: u32,
    /// Size of the tensor in bytes.
    pub tensor_bytes: u32,
    /// Position of the payload's first value in the tensor, in bytes of
    /// the `f32` tensor (4 per value, whatever the format).
    pub byte_offset: u32,
    /// Payload length in bytes on the wire.
    pub payload_len: u32,
}

impl DataHeader {
    /// Writes the header into the first [`DATA_HEADER_LEN`] bytes of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than [`DATA_HEADER_LEN`] (a caller bug, not input).
    pub fn write(&self, out: &mut [u8]) {
        put_prefix(out, KIND_DATA, self.class, self.format.code(), self.layout);
        let fields = [
            self.round,
            self.tensor,
            self.chunk,
            self.first_chunk,
            self.last_chunk,
            self.tensor_bytes,
            self.byte_offset,
            self.payload_len,
        ];
        for (i, f) in fields.iter().enumerate() {
            out[8 + 4 * i..12 + 4 * i].copy_from_slice(&f.to_le_bytes());
        }
    }

    /// The header of a piece of this (validated) segment: `len` payload
    /// bytes (on the wire) whose first value is at tensor byte `offset`,
    /// with `chunk` set to the chunk that holds `offset`.
    pub fn fragment(&self, plan: &ChunkPlan, offset: u32, len: u32) -> DataHeader {
        DataHeader {
            // Inside a validated segment, so inside the tensor; keep the
            // segment's chunk should a caller pass an offset outside it.
            chunk: plan
                .chunk_at(self.tensor as usize, offset)
                .unwrap_or(self.chunk as usize) as u32,
            byte_offset: offset,
            payload_len: len,
            ..*self
        }
    }

    /// The first value's index in the tensor.
    pub fn first_value(&self) -> u32 {
        self.byte_offset / 4
    }

    /// How many values the payload carries (see
    /// [`payload::value_count`](crate::payload::value_count)).
    pub fn values(&self, plan: &ChunkPlan) -> Result<u32, WireError> {
        Ok(crate::payload::value_count(
            self.format,
            plan,
            self.tensor as usize,
            self.first_value(),
            self.payload_len,
        )?)
    }

    /// Checks the header against the plan: known tensor, its size, its chunk
    /// span, that `chunk` holds `byte_offset`, and that the payload's
    /// length fits the tensor in its format; returns how many values the
    /// payload carries.
    pub fn validate(&self, plan: &ChunkPlan) -> Result<u32, WireError> {
        let t = self.tensor as usize;
        if t >= plan.tensor_count() {
            return Err(WireError::UnknownTensor(self.tensor));
        }
        let expected = plan.tensor_bytes(t);
        if self.tensor_bytes != expected {
            return Err(WireError::TensorSize {
                tensor: self.tensor,
                expected,
                got: self.tensor_bytes,
            });
        }
        let span = plan.tensor_chunks(t);
        if self.first_chunk as usize != span.start || self.last_chunk as usize + 1 != span.end {
            return Err(WireError::ChunkSpan {
                tensor: self.tensor,
                first: self.first_chunk,
                last: self.last_chunk,
            });
        }
        if plan.chunk_at(t, self.byte_offset) != Some(self.chunk as usize) {
            return Err(WireError::ChunkMismatch {
                tensor: self.tensor,
                chunk: self.chunk,
                offset: self.byte_offset,
            });
        }
        self.values(plan)
    }
}

/// The end of a round's important data, with what the sender sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RoundEnd {
    /// Which of the sender's layouts the round has.
    pub layout: u16,
    /// Round index.
    pub round: u32,
    /// Number of lossy levels in use (1..=7).
    pub levels: u8,
    /// [`id_digest`] summed over the important chunks.
    pub important_digest: u64,
    /// Chunks sent per class (index 0 important, `l` level `l`).
    pub chunks: [u32; CLASS_SLOTS],
    /// Payload bytes sent per class.
    pub bytes: [u64; CLASS_SLOTS],
    /// Packets sent per class (segments on the stream, datagrams otherwise).
    pub packets: [u32; CLASS_SLOTS],
}

/// The per-chunk term of the important-id digest: order-independent (summed
/// with wrapping add) and well mixed, so a missing or extra chunk changes it.
pub fn id_digest(chunk: u32) -> u64 {
    SplitMix64::at(chunk as u64 ^ 0x6772_6164_6c61_6e65, 0)
}

impl RoundEnd {
    /// Writes the segment into the first [`ROUND_END_LEN`] bytes of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than [`ROUND_END_LEN`] (a caller bug, not input).
    pub fn write(&self, out: &mut [u8]) {
        put_prefix(out, KIND_ROUND_END, self.levels, 0, self.layout);
        out[8..12].copy_from_slice(&self.round.to_le_bytes());
        out[12..16].fill(0);
        out[16..24].copy_from_slice(&self.important_digest.to_le_bytes());
        for i in 0..CLASS_SLOTS {
            out[24 + 4 * i..28 + 4 * i].copy_from_slice(&self.chunks[i].to_le_bytes());
            out[56 + 8 * i..64 + 8 * i].copy_from_slice(&self.bytes[i].to_le_bytes());
            out[120 + 4 * i..124 + 4 * i].copy_from_slice(&self.packets[i].to_le_bytes());
        }
    }

    /// The encoded segment.
    pub fn to_bytes(&self) -> [u8; ROUND_END_LEN] {
        let mut out = [0u8; ROUND_END_LEN];
        self.write(&mut out);
        out
    }

    /// Total chunks sent in all classes.
    pub fn total_chunks(&self) -> u64 {
        self.chunks.iter().map(|&c| c as u64).sum()
    }
}

pub use crate::format::{get_f32s, put_f32s};
