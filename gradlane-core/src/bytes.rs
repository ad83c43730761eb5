//! The one byte reader and the one length-prefixed framing, shared by every
//! message a peer sends outside the round segments: the link's handshake
//! and control messages, and the parameter server's requests and replies.
//!
//! A frame is a u32 little-endian length and that many bytes of body.
//! Reading never panics: running out of bytes is [`Short::Truncated`],
//! bytes left over are [`Short::Trailing`]; each message type maps them
//! into its own error.

/// Bytes of a frame's length prefix.
pub const LEN_PREFIX: usize = 4;

/// What went wrong reading fixed-size fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Short {
    /// Fewer bytes than the field needs.
    Truncated,
    /// Bytes after the last field.
    Trailing,
}

/// A cursor over a message body, reading little-endian fields.
#[derive(Debug, Clone)]
pub struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// A reader of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self(bytes)
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Short> {
        if self.0.len() < n {
            return Err(Short::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], Short> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A byte.
    pub fn u8(&mut self) -> Result<u8, Short> {
        Ok(self.array::<1>()?[0])
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> Result<u32, Short> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> Result<u64, Short> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.0.len()
    }

    /// Succeeds if every byte was read.
    pub fn finish(&self) -> Result<(), Short> {
        match self.0.is_empty() {
            true => Ok(()),
            false => Err(Short::Trailing),
        }
    }
}

/// `body` behind its length prefix. A body over 4 GiB (which no message
/// here comes near: their lengths are capped far below) gets a saturated
/// prefix, which the reader refuses as too large rather than misreading.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(LEN_PREFIX + body.len());
    out.extend_from_slice(&prefix(body.len()));
    out.extend_from_slice(body);
    out
}

/// The length prefix of a body of `len` bytes.
pub fn prefix(len: usize) -> [u8; LEN_PREFIX] {
    u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_in_order_and_shortness_is_an_error() {
        let mut body = vec![7u8];
        body.extend_from_slice(&0xdead_beefu32.to_le_bytes());
        body.extend_from_slice(&u64::MAX.to_le_bytes());
        let mut r = Reader::new(&body);
        assert_eq!(r.u8(), Ok(7));
        assert_eq!(r.u32(), Ok(0xdead_beef));
        assert_eq!(r.finish(), Err(Short::Trailing));
        assert_eq!(r.u64(), Ok(u64::MAX));
        assert_eq!(r.finish(), Ok(()));
        assert_eq!(r.u8(), Err(Short::Truncated));
        let mut r = Reader::new(&body[..3]);
        assert_eq!(r.u8(), Ok(7));
        assert_eq!(r.u32(), Err(Short::Truncated));
    }

    #[test]
    fn a_frame_is_its_length_and_body() {
        let f = frame(b"abc");
        assert_eq!(f, [3, 0, 0, 0, b'a', b'b', b'c']);
        assert_eq!(prefix(usize::MAX), [0xff; 4]);
    }
}
