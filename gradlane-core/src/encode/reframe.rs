//! A datagram already framed, cut again for a smaller datagram limit, for
//! when the path's limit shrinks after a round was framed.

use super::{EncodeError, Encoder, MIN_DATAGRAM};
use crate::format::LOG8_SCALE_BYTES;
use crate::payload;
use crate::wire::DATA_HEADER_LEN;
use bytes::Bytes;

impl Encoder {
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
}
