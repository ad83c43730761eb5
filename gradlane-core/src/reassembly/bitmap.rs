//! One bit per value of the model: which values a round holds, so that
//! duplicates are caught and whatever never arrived is zero-filled.

/// One bit per value of the model.
#[derive(Debug, Clone)]
pub(super) struct Bitmap(pub(super) Vec<u64>);

impl Bitmap {
    pub(super) fn new(bits: u64) -> Self {
        Bitmap(vec![0; bits.div_ceil(64) as usize])
    }

    /// The words covering `[start, start+len)` (`len > 0`) as (first word,
    /// last word, mask of the first, mask of the last). A segment covers
    /// hundreds of words and every received byte passes here: the words in
    /// between are whole and handled as a slice, which vectorizes.
    fn span(start: u64, len: u64) -> (usize, usize, u64, u64) {
        let end = start + len;
        let first = (start / 64) as usize;
        let last = ((end - 1) / 64) as usize;
        let head = !0u64 << (start % 64);
        let tail = !0u64 >> (63 - (end - 1) % 64);
        (first, last, head, tail)
    }

    /// Whether any bit of `[start, start+len)` is set.
    pub(super) fn any(&self, start: u64, len: u64) -> bool {
        if len == 0 {
            return false;
        }
        let (first, last, head, tail) = Self::span(start, len);
        if first == last {
            return self.0[first] & head & tail != 0;
        }
        let middle = self.0[first + 1..last].iter().fold(0, |acc, w| acc | w);
        (self.0[first] & head) | middle | (self.0[last] & tail) != 0
    }

    /// Sets every bit of `[start, start+len)`.
    pub(super) fn set(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (first, last, head, tail) = Self::span(start, len);
        if first == last {
            self.0[first] |= head & tail;
            return;
        }
        self.0[first] |= head;
        self.0[first + 1..last].fill(!0);
        self.0[last] |= tail;
    }
}

#[cfg(test)]
mod tests {
    use super::Bitmap;
    use proptest::prelude::*;

    proptest! {
        /// `any` and `set` agree with one bool per bit, for ranges that
        /// start, end and span words anywhere.
        #[test]
        fn bitmap_matches_a_bool_per_bit(
            ops in prop::collection::vec((0u64..300, 0u64..200), 1..40)
        ) {
            let bits = 512;
            let mut map = Bitmap::new(bits);
            let mut model = vec![false; bits as usize];
            for (start, len) in ops {
                let len = len.min(bits - start);
                let range = start as usize..(start + len) as usize;
                prop_assert_eq!(map.any(start, len), model[range.clone()].iter().any(|&b| b));
                map.set(start, len);
                model[range].fill(true);
                for (i, &b) in model.iter().enumerate() {
                    prop_assert_eq!(map.0[i / 64] >> (i % 64) & 1 == 1, b, "bit {}", i);
                }
            }
        }
    }
}
