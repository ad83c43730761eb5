//! Reading segments: how long a segment is, its fixed part, and whole
//! segments, every field checked before it is trusted.

use super::{
    u16_at, u32_at, u64_at, DataHeader, RoundEnd, WireError, CLASS_SLOTS, DATA_HEADER_LEN,
    KIND_DATA, KIND_ROUND_END, MAGIC, MAX_SEGMENT_PAYLOAD, PREFIX_LEN, ROUND_END_LEN, VERSION,
};
use crate::classify::{IMPORTANT, MAX_LEVELS};
use crate::format::ValueFormat;

/// One decoded segment, borrowing its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment<'a> {
    /// A byte range of a tensor.
    Data(DataHeader, &'a [u8]),
    /// The end of a round's important data.
    RoundEnd(RoundEnd),
}

/// The total length of the segment that starts with `head`, once at least
/// [`DATA_HEADER_LEN`] bytes (or the whole segment) are known: lets a stream
/// reader learn how much to read next. `Ok(None)` means "need more bytes".
pub fn segment_len(head: &[u8]) -> Result<Option<usize>, WireError> {
    if head.len() < PREFIX_LEN {
        return Ok(None);
    }
    check_prefix(head)?;
    match head[3] {
        KIND_ROUND_END => Ok(Some(ROUND_END_LEN)),
        _ if head.len() < DATA_HEADER_LEN => Ok(None),
        _ => {
            let len = u32_at(head, 36);
            if len > MAX_SEGMENT_PAYLOAD {
                return Err(WireError::PayloadTooLarge(len));
            }
            Ok(Some(DATA_HEADER_LEN + len as usize))
        }
    }
}

fn check_prefix(b: &[u8]) -> Result<(), WireError> {
    let magic = u16_at(b, 0);
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    if b[2] != VERSION {
        return Err(WireError::Version(b[2]));
    }
    if b[3] != KIND_DATA && b[3] != KIND_ROUND_END {
        return Err(WireError::Kind(b[3]));
    }
    match b[3] {
        KIND_DATA if ValueFormat::from_code(b[5]).is_none() => Err(WireError::Format(b[5])),
        KIND_ROUND_END if b[5] != 0 => Err(WireError::Reserved),
        _ => Ok(()),
    }
}

/// The fixed part of a segment: a data segment's header (its payload
/// follows) or a whole round end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// A data segment's header; `payload_len` payload bytes follow it.
    Data(DataHeader),
    /// A round end (it has no payload).
    RoundEnd(RoundEnd),
}

/// How many bytes the fixed part of the segment starting with `prefix` has
/// ([`DATA_HEADER_LEN`] or [`ROUND_END_LEN`]), once its [`PREFIX_LEN`]
/// bytes are known; `Ok(None)` means "need more bytes".
pub fn head_len(prefix: &[u8]) -> Result<Option<usize>, WireError> {
    if prefix.len() < PREFIX_LEN {
        return Ok(None);
    }
    check_prefix(prefix)?;
    Ok(Some(if prefix[3] == KIND_ROUND_END {
        ROUND_END_LEN
    } else {
        DATA_HEADER_LEN
    }))
}

/// Decodes the fixed part of the segment at the start of `buf` without
/// needing its payload, so a stream reader can place payload bytes as they
/// arrive; returns it and its length (see [`head_len`]).
///
/// Checks everything [`decode`] checks except that the payload is there.
pub fn decode_head(buf: &[u8]) -> Result<(Head, usize), WireError> {
    if buf.len() < PREFIX_LEN {
        return Err(WireError::Truncated {
            need: PREFIX_LEN,
            have: buf.len(),
        });
    }
    check_prefix(buf)?;
    let class = buf[4];
    if buf[3] == KIND_ROUND_END {
        if buf.len() < ROUND_END_LEN {
            return Err(WireError::Truncated {
                need: ROUND_END_LEN,
                have: buf.len(),
            });
        }
        if !(1..=MAX_LEVELS).contains(&class) {
            return Err(WireError::Class(class));
        }
        if u32_at(buf, 12) != 0 {
            return Err(WireError::Reserved);
        }
        let mut end = RoundEnd {
            layout: u16_at(buf, 6),
            round: u32_at(buf, 8),
            levels: class,
            important_digest: u64_at(buf, 16),
            ..Default::default()
        };
        for i in 0..CLASS_SLOTS {
            end.chunks[i] = u32_at(buf, 24 + 4 * i);
            end.bytes[i] = u64_at(buf, 56 + 8 * i);
            end.packets[i] = u32_at(buf, 120 + 4 * i);
            // A class that sent chunks sent at least 4 bytes per chunk and at
            // least one packet; levels beyond `levels` sent nothing.
            let unused = i > class as usize;
            let c = end.chunks[i] as u64;
            if (unused && (c | end.bytes[i] | end.packets[i] as u64) != 0)
                || end.bytes[i] < 4 * c
                || (c > 0 && end.packets[i] == 0)
                || end.bytes[i] % 4 != 0
            {
                return Err(WireError::BadRoundEnd);
            }
        }
        return Ok((Head::RoundEnd(end), ROUND_END_LEN));
    }
    if buf.len() < DATA_HEADER_LEN {
        return Err(WireError::Truncated {
            need: DATA_HEADER_LEN,
            have: buf.len(),
        });
    }
    if class > MAX_LEVELS {
        return Err(WireError::Class(class));
    }
    // Checked by `check_prefix`.
    let format = ValueFormat::from_code(buf[5]).unwrap_or_default();
    if class == IMPORTANT && format == ValueFormat::Log8 {
        return Err(WireError::LossyOnlyFormat(format));
    }
    let h = DataHeader {
        layout: u16_at(buf, 6),
        class,
        format,
        round: u32_at(buf, 8),
        tensor: u32_at(buf, 12),
        chunk: u32_at(buf, 16),
        first_chunk: u32_at(buf, 20),
        last_chunk: u32_at(buf, 24),
        tensor_bytes: u32_at(buf, 28),
        byte_offset: u32_at(buf, 32),
        payload_len: u32_at(buf, 36),
    };
    if h.payload_len == 0 {
        return Err(WireError::EmptyPayload);
    }
    if h.payload_len > MAX_SEGMENT_PAYLOAD {
        return Err(WireError::PayloadTooLarge(h.payload_len));
    }
    // In f32 positions: 4 for f32, 2 for the 16-bit formats; log8's
    // length depends on the chunks it crosses (checked against the plan
    // in `validate`), but every value costs at least a byte.
    let (unit, positions_per_byte) = match format.element_bytes() {
        Some(b) => (b as u32, 4 / b as u64),
        None => (1, 4),
    };
    if h.byte_offset % 4 != 0 || h.payload_len % unit != 0 {
        return Err(WireError::Misaligned {
            offset: h.byte_offset,
            len: h.payload_len,
        });
    }
    let covers = match format {
        ValueFormat::Log8 => 4,
        _ => h.payload_len as u64 * positions_per_byte,
    };
    if h.byte_offset as u64 + covers > h.tensor_bytes as u64 {
        return Err(WireError::OutOfRange {
            offset: h.byte_offset,
            len: h.payload_len,
            tensor_bytes: h.tensor_bytes,
        });
    }
    if !(h.first_chunk <= h.chunk && h.chunk <= h.last_chunk) {
        return Err(WireError::ChunkOrder {
            chunk: h.chunk,
            first: h.first_chunk,
            last: h.last_chunk,
        });
    }
    Ok((Head::Data(h), DATA_HEADER_LEN))
}

/// Decodes the segment at the start of `buf`; returns it and the bytes it used.
///
/// Checks everything that can be checked without the layout; use
/// [`DataHeader::validate`] for the rest.
pub fn decode(buf: &[u8]) -> Result<(Segment<'_>, usize), WireError> {
    match decode_head(buf)? {
        (Head::RoundEnd(end), used) => Ok((Segment::RoundEnd(end), used)),
        (Head::Data(h), _) => {
            let total = DATA_HEADER_LEN + h.payload_len as usize;
            if buf.len() < total {
                return Err(WireError::Truncated {
                    need: total,
                    have: buf.len(),
                });
            }
            Ok((Segment::Data(h, &buf[DATA_HEADER_LEN..total]), total))
        }
    }
}

/// Decodes every segment of a packet (a datagram, or a run of stream bytes).
pub fn decode_all(mut buf: &[u8]) -> impl Iterator<Item = Result<Segment<'_>, WireError>> {
    let mut failed = false;
    std::iter::from_fn(move || {
        if buf.is_empty() || failed {
            return None;
        }
        match decode(buf) {
            Ok((seg, used)) => {
                buf = &buf[used..];
                Some(Ok(seg))
            }
            Err(e) => {
                failed = true;
                Some(Err(e))
            }
        }
    })
}
