//! The first message of a sparse allgather: how many rows a rank sends,
//! and the shape they come from, so that a mismatch is caught before any
//! row moves and the receiver can place every rank's rows.

use super::GroupMessageError;
use crate::bytes::{Reader, Short};

/// The most bytes one exact message carries (its length is a u32): a
/// count of rows that could not travel is refused.
const MAX_MESSAGE_BYTES: u64 = u32::MAX as u64;

/// A rank's rows in a sparse allgather: `count` rows of `width` values
/// each, from a table of `height` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SparseShape {
    /// The rows it sends (duplicates included).
    pub count: u64,
    /// The table's rows.
    pub height: u64,
    /// The values per row.
    pub width: u64,
}

impl SparseShape {
    /// The message's bytes: three little-endian u64s.
    pub fn encode(&self) -> Vec<u8> {
        [self.count, self.height, self.width]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    /// The shape in `body`: a count whose row ids (8 bytes each) and
    /// values (4 bytes each) each fit one message, so that the receiver
    /// never sizes a buffer for rows no message could carry.
    pub fn decode(body: &[u8]) -> Result<Self, GroupMessageError> {
        const MESSAGE: &str = "sparse shape";
        let short = |s| match s {
            Short::Truncated => GroupMessageError::Truncated {
                message: MESSAGE,
                len: body.len(),
            },
            Short::Trailing => GroupMessageError::Trailing { message: MESSAGE },
        };
        let mut r = Reader::new(body);
        let shape = Self {
            count: r.u64().map_err(short)?,
            height: r.u64().map_err(short)?,
            width: r.u64().map_err(short)?,
        };
        r.finish().map_err(short)?;
        let ids = shape.count.checked_mul(8);
        let values = shape
            .count
            .checked_mul(shape.width)
            .and_then(|v| v.checked_mul(4));
        match (ids, values) {
            (Some(i), Some(v)) if i <= MAX_MESSAGE_BYTES && v <= MAX_MESSAGE_BYTES => Ok(shape),
            _ => Err(GroupMessageError::BadField {
                message: MESSAGE,
                field: "count (more rows than a message carries)",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_round_trip_and_impossible_counts_are_refused() {
        let s = SparseShape {
            count: 7,
            height: 100,
            width: 3,
        };
        assert_eq!(SparseShape::decode(&s.encode()), Ok(s));
        let huge = SparseShape {
            count: u64::MAX / 2,
            ..s
        };
        assert!(matches!(
            SparseShape::decode(&huge.encode()),
            Err(GroupMessageError::BadField { .. })
        ));
        let wide = SparseShape {
            count: 1 << 20,
            width: 1 << 20,
            ..s
        };
        assert!(SparseShape::decode(&wide.encode()).is_err());
        assert!(matches!(
            SparseShape::decode(&s.encode()[..23]),
            Err(GroupMessageError::Truncated { len: 23, .. })
        ));
        let mut long = s.encode();
        long.push(0);
        assert!(matches!(
            SparseShape::decode(&long),
            Err(GroupMessageError::Trailing { .. })
        ));
    }
}
