//! LSB-first bit packing over u64 words.
//!
//! The writer accumulates into a u64 and spills eight bytes at a time so the
//! per-element cost is a shift and an or; the reader loads an unaligned u64
//! window per read, so every field up to 56 bits costs one load and one mask.

use super::DecodeError;

/// Appends bit fields LSB-first to a byte vector.
pub(crate) struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    used: u32,
}

impl<'a> BitWriter<'a> {
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Self {
        Self {
            out,
            acc: 0,
            used: 0,
        }
    }

    /// Writes the low `len` bits of `value`; `len <= 64`, higher bits of
    /// `value` must be zero.
    #[inline]
    pub(crate) fn write(&mut self, value: u64, len: u32) {
        debug_assert!(len <= 64);
        debug_assert!(len == 64 || value >> len == 0);
        if len == 0 {
            return;
        }
        self.acc |= value << self.used;
        let total = self.used + len;
        if total >= 64 {
            self.out.extend_from_slice(&self.acc.to_le_bytes());
            // The bits of `value` that did not fit; a shift by 64 would
            // overflow, and in that case nothing is left over.
            self.acc = if self.used == 0 {
                0
            } else {
                value >> (64 - self.used)
            };
            self.used = total - 64;
        } else {
            self.used = total;
        }
    }

    /// Flushes the partial word, zero-padding to a byte boundary.
    pub(crate) fn finish(self) {
        let bytes = self.used.div_ceil(8) as usize;
        self.out.extend_from_slice(&self.acc.to_le_bytes()[..bytes]);
    }
}

/// Reads LSB-first bit fields from a byte slice with bounds checks.
pub(crate) struct BitReader<'a> {
    data: &'a [u8],
    pos: u64,
    total: u64,
}

impl<'a> BitReader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Self {
            data,
            pos: 0,
            total: data.len() as u64 * 8,
        }
    }

    /// Reads `len <= 56` bits, or `Truncated` if the data ends first.
    #[inline]
    pub(crate) fn read(&mut self, len: u32) -> Result<u64, DecodeError> {
        debug_assert!(len <= 56);
        if len == 0 {
            return Ok(0);
        }
        if self.pos + u64::from(len) > self.total {
            return Err(DecodeError::Truncated);
        }
        let byte = (self.pos / 8) as usize;
        let shift = (self.pos % 8) as u32;
        let word = match self.data.get(byte..byte + 8) {
            Some(w) => {
                let mut buf = [0u8; 8];
                buf.copy_from_slice(w);
                u64::from_le_bytes(buf)
            }
            None => {
                // Near the end: pad with zeros; the bounds check above
                // guarantees the requested bits are all real.
                let mut buf = [0u8; 8];
                let tail = self.data.get(byte..).unwrap_or(&[]);
                buf[..tail.len()].copy_from_slice(tail);
                u64::from_le_bytes(buf)
            }
        };
        self.pos += u64::from(len);
        Ok((word >> shift) & ((1u64 << len) - 1))
    }

    /// Checks that only zero padding bits follow, and no further bytes.
    pub(crate) fn finish(mut self) -> Result<(), DecodeError> {
        let pad = (8 - (self.pos % 8) as u32) % 8;
        if self.read(pad)? != 0 || self.pos != self.total {
            return Err(DecodeError::TrailingBytes);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_mixed_widths() {
        let fields: Vec<(u64, u32)> = (0..500u64)
            .map(|i| {
                let len = (i * 7 % 57) as u32;
                let v = if len == 0 {
                    0
                } else {
                    (i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) & ((1u64 << len) - 1)
                };
                (v, len)
            })
            .collect();
        let mut out = Vec::new();
        let mut w = BitWriter::new(&mut out);
        for &(v, l) in &fields {
            w.write(v, l);
        }
        w.write(u64::MAX, 64);
        w.finish();
        let mut r = BitReader::new(&out);
        for &(v, l) in &fields {
            assert_eq!(r.read(l).unwrap(), v);
        }
        assert_eq!(r.read(32).unwrap(), u64::from(u32::MAX));
        assert_eq!(r.read(32).unwrap(), u64::from(u32::MAX));
        r.finish().unwrap();
    }

    #[test]
    fn truncated_and_trailing() {
        let data = [0xffu8, 0x01];
        let mut r = BitReader::new(&data);
        assert_eq!(r.read(9).unwrap(), 0x1ff);
        assert_eq!(r.read(8), Err(DecodeError::Truncated));
        let r = BitReader::new(&data[..1]);
        assert_eq!(r.finish(), Err(DecodeError::TrailingBytes));
        let mut r = BitReader::new(&[0b0000_0011]);
        assert_eq!(r.read(1).unwrap(), 1);
        assert_eq!(r.finish(), Err(DecodeError::TrailingBytes));
    }
}
