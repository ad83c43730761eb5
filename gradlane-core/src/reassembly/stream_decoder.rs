//! The reliable stream decoded as QUIC hands it over, in pieces cut
//! anywhere: payload bytes are placed straight from the pieces, and only a
//! header or a value cut by a piece boundary is copied aside.

use super::{PushOutcome, Reassembler, ReassemblyError};
use crate::payload;
use crate::wire::{self, DataHeader, Head, WireError, ROUND_END_LEN};

/// Feeds one round's reliable stream into a [`Reassembler`] in whatever
/// pieces the transport hands over (QUIC gives one packet's worth at a
/// time), placing payload bytes straight from those pieces into the round:
/// a segment may straddle any number of pieces, and only a header or a
/// value cut by a piece boundary is ever copied aside.
///
/// A segment's header is decoded and validated in full before any of its
/// payload is placed; the payload then lands fragment by fragment, each
/// fragment being a valid segment of its own (its own byte position and
/// holding chunk), so the round ends up exactly as if the segments had been
/// pushed whole. [`PushOutcome`] counts fragments, not segments. After an
/// error the stream is broken and the decoder refuses further input.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    /// The start of a header cut by a piece boundary.
    head: Vec<u8>,
    /// The data segment whose payload is arriving.
    payload: Option<Payload>,
    /// A previous input was refused.
    failed: bool,
    /// The allocation `Payload::whole` gathers `Log8` payloads in, kept
    /// between segments.
    gathered: Vec<u8>,
}

#[derive(Debug)]
struct Payload {
    header: DataHeader,
    /// Payload bytes consumed so far (placed, or waiting in `carry`).
    consumed: u32,
    /// The first bytes of a value cut by a piece boundary.
    carry: [u8; 4],
    carry_len: usize,
    /// A `Log8` payload, gathered whole before it is checked and placed
    /// (its sections' scales and codes are read together; a lossy segment
    /// is at most a datagram long, and any segment at most
    /// [`MAX_SEGMENT_PAYLOAD`](crate::wire::MAX_SEGMENT_PAYLOAD)).
    whole: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// True between segments: a stream that ends here ends cleanly.
    pub fn at_boundary(&self) -> bool {
        self.head.is_empty() && self.payload.is_none()
    }

    /// Decodes the next piece of the stream into `rx`.
    pub fn feed(
        &mut self,
        rx: &mut Reassembler,
        piece: &[u8],
    ) -> Result<PushOutcome, ReassemblyError> {
        let mut out = PushOutcome::default();
        if self.failed {
            return Err(ReassemblyError::StreamBroken);
        }
        match self.feed_inner(rx, piece, &mut out) {
            Ok(()) => Ok(out),
            Err(e) => {
                self.failed = true;
                if matches!(e, ReassemblyError::Wire(_)) {
                    rx.counters.malformed += 1;
                }
                Err(e)
            }
        }
    }

    fn feed_inner(
        &mut self,
        rx: &mut Reassembler,
        mut bytes: &[u8],
        out: &mut PushOutcome,
    ) -> Result<(), ReassemblyError> {
        while !bytes.is_empty() {
            if let Some(p) = &mut self.payload {
                let h = p.header;
                let Some(e) = h.format.element_bytes() else {
                    let take = (h.payload_len as usize - p.whole.len()).min(bytes.len());
                    p.whole.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if p.whole.len() == h.payload_len as usize {
                        let mut whole = std::mem::take(&mut p.whole);
                        self.payload = None;
                        let t = h.tensor as usize;
                        let placed = payload::check(h.format, &rx.plan, t, h.first_value(), &whole)
                            .map_err(|e| ReassemblyError::from(WireError::from(e)))
                            .and_then(|()| rx.place(h, &[], &whole, out));
                        whole.clear();
                        self.gathered = whole;
                        placed?;
                    }
                    continue;
                };
                // A piece boundary may cut a value (QUIC frames end at any
                // byte): a cut value waits in `carry` and is placed with
                // the next piece's whole values, as one fragment.
                let mut head = 0;
                if p.carry_len > 0 {
                    let take = (e - p.carry_len).min(bytes.len());
                    for (c, b) in p.carry[p.carry_len..].iter_mut().zip(&bytes[..take]) {
                        *c = *b;
                    }
                    p.carry_len += take;
                    p.consumed += take as u32;
                    bytes = &bytes[take..];
                    if p.carry_len < e {
                        // The piece was shorter than the cut value's rest.
                        continue;
                    }
                    p.carry_len = 0;
                    head = e;
                }
                let n = ((h.payload_len - p.consumed) as usize).min(bytes.len());
                let whole = n - n % e;
                if head + whole > 0 {
                    // Wire bytes before this fragment, as f32 positions.
                    let before = (p.consumed as usize - head) / e * 4;
                    let offset = h.byte_offset + before as u32;
                    let fragment = h.fragment(&rx.plan, offset, (head + whole) as u32);
                    let carried = p.carry;
                    rx.place(fragment, &carried[..head], &bytes[..whole], out)?;
                }
                for (c, b) in p.carry.iter_mut().zip(&bytes[whole..n]) {
                    *c = *b;
                }
                p.carry_len = n - whole;
                p.consumed += n as u32;
                bytes = &bytes[n..];
                if p.consumed == h.payload_len && p.carry_len == 0 {
                    self.payload = None;
                }
                continue;
            }
            if self.head.is_empty() {
                // Decode the header in place when the piece holds all of it.
                if let Some(len) = wire::head_len(bytes)? {
                    if bytes.len() >= len {
                        self.start_segment(rx, &bytes[..len], out)?;
                        bytes = &bytes[len..];
                        continue;
                    }
                }
                // Headers are at most a round end long.
                let take = bytes.len().min(ROUND_END_LEN);
                self.head.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                continue;
            }
            // Complete a cut header from this piece: first its prefix, which
            // tells its length, then the rest.
            let want = wire::head_len(&self.head)?.unwrap_or(wire::PREFIX_LEN);
            let take = want.saturating_sub(self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if wire::head_len(&self.head)? == Some(self.head.len()) {
                let head = std::mem::take(&mut self.head);
                let started = self.start_segment(rx, &head, out);
                // Keep the allocation for the next cut header.
                self.head = head;
                self.head.clear();
                started?;
            }
        }
        Ok(())
    }

    /// Takes a decoded header: a round end is applied, a data header is
    /// validated and its payload awaited.
    fn start_segment(
        &mut self,
        rx: &mut Reassembler,
        head: &[u8],
        out: &mut PushOutcome,
    ) -> Result<(), ReassemblyError> {
        match wire::decode_head(head)?.0 {
            Head::RoundEnd(end) => {
                rx.check_layout(end.layout)?;
                if rx.end_round(end)? {
                    out.completed = Some(end.round);
                }
            }
            Head::Data(h) => {
                rx.check_layout(h.layout)?;
                h.validate(&rx.plan)?;
                self.payload = Some(Payload {
                    header: h,
                    consumed: 0,
                    carry: [0; 4],
                    carry_len: 0,
                    whole: std::mem::take(&mut self.gathered),
                });
            }
        }
        Ok(())
    }
}
