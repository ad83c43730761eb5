//! An owner's summed shard in a differentiated allreduce: the one message
//! every rank gets from each shard's owner, with each rank's lost chunks
//! and the sum's values in the bucket's formats.
//!
//! The layout, `[u32 world]`, then for each rank `[u32 count][u32 id;
//! count]` (the local ids of its chunks that did not arrive), then `[u8
//! important format][u8 lossy format or NO_LOSSY_RETURN][u16 0]`, the count
//! and the ascending local ids of the chunks in the lossy format, then each
//! chunk's values in order in its format (a `log8` chunk as its scale and
//! codes). The reader checks every count against the bytes there are and
//! every chunk's length against the shard before a value is written.

use super::error::ranks_reader;
use super::GroupMessageError;
use crate::bytes::Short;
use crate::format::{
    self, log8_decode, log8_encode, log8_scale, log8_scale_ok, ClassFormats, ValueFormat,
    LOG8_SCALE_BYTES,
};
use std::ops::Range;

/// The lossy-format byte of a summed shard without lossy-format chunks.
pub const NO_LOSSY_RETURN: u8 = 0xFF;

const MESSAGE: &str = "reduced shard";

/// The owner's message for a shard cut into `chunks` (value ranges,
/// contiguous and in order, of `sum`): `missing[r]` lists rank `r`'s lost
/// chunks. `lossy[c]` says chunk `c` may travel in the lossy format (with
/// `None`, every chunk travels in the important one); a chunk whose sum is
/// not finite cannot in `log8` and travels in the important format.
pub fn encode_reduced_shard(
    missing: &[&[u32]],
    sum: &[f32],
    chunks: &[Range<usize>],
    formats: ClassFormats,
    lossy: Option<&[bool]>,
) -> Vec<u8> {
    let in_lossy = |c: usize| -> bool {
        let Some(lossy) = lossy else { return false };
        lossy.get(c).copied().unwrap_or(false)
            && (formats.lossy != ValueFormat::Log8 || log8_scale(&sum[chunks[c].clone()]).is_ok())
    };
    let ids: Vec<u32> = (0..chunks.len())
        .filter(|&c| in_lossy(c))
        .map(|c| c as u32)
        .collect();
    let lists: usize = missing.iter().map(|m| 4 + 4 * m.len()).sum();
    let mut out = Vec::with_capacity(4 + lists + 8 + ids.len() * 4 + sum.len() * 4);
    out.extend_from_slice(&(missing.len() as u32).to_le_bytes());
    for m in missing {
        out.extend_from_slice(&(m.len() as u32).to_le_bytes());
        for id in *m {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
    out.push(formats.important.code());
    out.push(match lossy {
        Some(_) => formats.lossy.code(),
        None => NO_LOSSY_RETURN,
    });
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    for id in &ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    let mut next = ids.iter().peekable();
    let mut c = 0;
    while c < chunks.len() {
        if next.peek() == Some(&&(c as u32)) {
            next.next();
            let values = &sum[chunks[c].clone()];
            match formats.lossy {
                ValueFormat::Log8 => {
                    let scale = log8_scale(values).unwrap_or(0.0);
                    out.extend_from_slice(&scale.to_le_bytes());
                    let at = out.len();
                    out.resize(at + values.len(), 0);
                    log8_encode(values, scale, &mut out[at..]);
                }
                f => format::put_elements(f, values, &mut out),
            }
            c += 1;
            continue;
        }
        // A run of chunks in the important format, up to the next lossy one.
        let upto = next.peek().map_or(chunks.len(), |&&id| id as usize);
        let run = chunks[c].start..chunks[upto - 1].end;
        format::put_elements(formats.important, &sum[run], &mut out);
        c = upto;
    }
    out
}

/// An owner's message, checked for one rank: its lost chunks, the chunks
/// in the lossy format, and the values' bytes, each chunk's there.
#[derive(Debug, Clone)]
pub struct ReducedShard<'m, 'c> {
    missing: Vec<u32>,
    lossy_ids: Vec<usize>,
    values: &'m [u8],
    chunks: &'c [Range<usize>],
    formats: ClassFormats,
}

impl<'m, 'c> ReducedShard<'m, 'c> {
    /// Reads and checks an owner's `message` for rank `me` of `world`,
    /// for a shard cut into `chunks` (value ranges, contiguous and in
    /// order) in `formats`: anything but what [`encode_reduced_shard`]
    /// writes for such a shard is an error, found before a value is
    /// written or a count is allocated.
    pub fn parse(
        (me, world): (usize, usize),
        message: &'m [u8],
        chunks: &'c [Range<usize>],
        formats: ClassFormats,
    ) -> Result<Self, GroupMessageError> {
        let short = |_: Short| GroupMessageError::Truncated {
            message: MESSAGE,
            len: message.len(),
        };
        let contiguous = chunks.iter().all(|c| c.start <= c.end)
            && chunks.windows(2).all(|w| w[0].end == w[1].start);
        if !contiguous {
            return Err(GroupMessageError::ChunkPlan);
        }
        let mut r = ranks_reader(message, MESSAGE, world)?;
        let mut missing = Vec::new();
        for q in 0..world {
            let count = r.u32().map_err(short)? as usize;
            // `take` checks the bytes are there: a count alone allocates nothing.
            let ids = r.take(count.saturating_mul(4)).map_err(short)?;
            if q == me {
                missing = ids.chunks_exact(4).map(u32_at).collect();
                if let Some(&id) = missing.iter().find(|&&id| id as usize >= chunks.len()) {
                    return Err(GroupMessageError::Chunk {
                        what: "lost",
                        id: id as usize,
                        chunks: chunks.len(),
                    });
                }
            }
        }
        let [important, lossy, _, _] = r.array::<4>().map_err(short)?;
        if important != formats.important.code()
            || (lossy != NO_LOSSY_RETURN && lossy != formats.lossy.code())
        {
            return Err(GroupMessageError::Formats {
                important,
                lossy,
                expected: formats,
            });
        }
        let count = r.u32().map_err(short)? as usize;
        if count > chunks.len() {
            return Err(GroupMessageError::Chunk {
                what: "lossy",
                id: count,
                chunks: chunks.len(),
            });
        }
        let ids = r.take(count * 4).map_err(short)?;
        let mut lossy_ids: Vec<usize> = Vec::with_capacity(count);
        for id in ids.chunks_exact(4).map(|c| u32_at(c) as usize) {
            if id >= chunks.len() || lossy_ids.last().is_some_and(|&last| id <= last) {
                return Err(GroupMessageError::Chunk {
                    what: "lossy",
                    id,
                    chunks: chunks.len(),
                });
            }
            lossy_ids.push(id);
        }
        let values = r.rest();
        // Every chunk's bytes, and every log8 scale, before any is decoded.
        let mut at = 0usize;
        let mut next = lossy_ids.iter().peekable();
        for (c, range) in chunks.iter().enumerate() {
            let format = match next.peek() {
                Some(&&id) if id == c => {
                    next.next();
                    formats.lossy
                }
                _ => formats.important,
            };
            match format.element_bytes() {
                Some(e) => at += range.len() * e,
                None => {
                    let scale = values
                        .get(at..at + LOG8_SCALE_BYTES)
                        .map(u32_at)
                        .map(f32::from_bits)
                        .ok_or_else(|| short(Short::Truncated))?;
                    if !log8_scale_ok(scale) {
                        return Err(GroupMessageError::Log8Scale { chunk: c, scale });
                    }
                    at += LOG8_SCALE_BYTES + range.len();
                }
            }
        }
        if at != values.len() {
            return Err(GroupMessageError::ValueBytes {
                got: values.len(),
                need: at,
            });
        }
        Ok(Self {
            missing,
            lossy_ids,
            values,
            chunks,
            formats,
        })
    }

    /// The local ids of this rank's chunks that did not reach the owner.
    pub fn missing(&self) -> &[u32] {
        &self.missing
    }

    /// The value ranges (within the shard) of this rank's lost chunks.
    pub fn lost_ranges(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.missing
            .iter()
            .map(|&c| self.chunks[c as usize].clone())
    }

    /// The ids of the chunks that came in the lossy format.
    pub fn lossy_chunks(&self) -> &[usize] {
        &self.lossy_ids
    }

    /// Decodes the values into `out`, the shard: an error, with nothing
    /// written, if `out` ends before the shard's last chunk.
    pub fn decode_into(&self, out: &mut [f32]) -> Result<(), GroupMessageError> {
        let need = self.chunks.last().map_or(0, |c| c.end);
        if out.len() < need {
            return Err(GroupMessageError::Output {
                need,
                got: out.len(),
            });
        }
        let (chunks, formats) = (self.chunks, self.formats);
        let mut bytes = self.values;
        let mut next = self.lossy_ids.iter().peekable();
        let mut c = 0;
        while c < chunks.len() {
            let (format, upto) = match next.peek() {
                Some(&&id) if id == c => {
                    next.next();
                    (formats.lossy, c + 1)
                }
                Some(&&id) => (formats.important, id),
                None => (formats.important, chunks.len()),
            };
            let range = chunks[c].start..chunks[upto - 1].end;
            let out = &mut out[range.clone()];
            match format.element_bytes() {
                Some(e) => {
                    let (these, rest) = bytes.split_at(range.len() * e);
                    format::read_elements(format, these, out);
                    bytes = rest;
                }
                None => {
                    let (scale, rest) = bytes.split_at(LOG8_SCALE_BYTES);
                    let scale = f32::from_bits(u32_at(scale));
                    let (codes, rest) = rest.split_at(range.len());
                    log8_decode(codes, scale, out);
                    bytes = rest;
                }
            }
            c = upto;
        }
        Ok(())
    }
}

fn u32_at(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four chunks of 3, 1, 4 and 2 values.
    fn plan() -> Vec<Range<usize>> {
        vec![0..3, 3..4, 4..8, 8..10]
    }

    fn sum() -> Vec<f32> {
        (0..10).map(|i| (i as f32 - 4.5) * 0.25).collect()
    }

    fn formats(important: ValueFormat, lossy: ValueFormat) -> ClassFormats {
        ClassFormats { important, lossy }
    }

    #[test]
    fn every_format_pair_round_trips_with_its_rounding() {
        let (chunks, sum) = (plan(), sum());
        let lossy = [false, true, false, true];
        for important in [ValueFormat::F32, ValueFormat::Bf16, ValueFormat::F16] {
            for lossy_format in ValueFormat::ALL {
                let f = formats(important, lossy_format);
                for lossy in [None, Some(&lossy[..])] {
                    let missing: [&[u32]; 3] = [&[], &[2, 0], &[3]];
                    let message = encode_reduced_shard(&missing, &sum, &chunks, f, lossy);
                    let shard = ReducedShard::parse((1, 3), &message, &chunks, f).unwrap();
                    assert_eq!(shard.missing(), &[2, 0]);
                    assert_eq!(shard.lost_ranges().collect::<Vec<_>>(), vec![4..8, 0..3]);
                    let expected_lossy: &[usize] = if lossy.is_some() { &[1, 3] } else { &[] };
                    assert_eq!(shard.lossy_chunks(), expected_lossy);
                    let mut out = vec![f32::NAN; 10];
                    shard.decode_into(&mut out).unwrap();
                    for (c, range) in chunks.iter().enumerate() {
                        let format = if expected_lossy.contains(&c) {
                            lossy_format
                        } else {
                            important
                        };
                        let mut want = vec![0.0; range.len()];
                        match format {
                            ValueFormat::Log8 => {
                                format::log8_round_trip(&sum[range.clone()], &mut want).unwrap()
                            }
                            f => want
                                .iter_mut()
                                .zip(&sum[range.clone()])
                                .for_each(|(w, &v)| *w = f.round(v)),
                        }
                        assert_eq!(&out[range.clone()], &want[..], "{f:?} chunk {c}");
                    }
                }
            }
        }
    }

    #[test]
    fn malformed_shards_are_typed_errors_before_any_value_is_written() {
        let (chunks, sum) = (plan(), sum());
        let f = formats(ValueFormat::F32, ValueFormat::Log8);
        let lossy = [false, true, false, false];
        let missing: [&[u32]; 2] = [&[1], &[]];
        let good = encode_reduced_shard(&missing, &sum, &chunks, f, Some(&lossy));
        let parse = |m: &[u8]| ReducedShard::parse((0, 2), m, &chunks, f).map(|_| ());
        assert_eq!(parse(&good), Ok(()));

        for cut in 0..good.len() {
            assert!(parse(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            parse(&long),
            Err(GroupMessageError::ValueBytes {
                got: good.len() + 1 - 28,
                need: good.len() - 28
            })
        );
        assert_eq!(
            ReducedShard::parse((0, 3), &good, &chunks, f).map(|_| ()),
            Err(GroupMessageError::WorldMismatch {
                message: MESSAGE,
                got: 2,
                world: 3
            })
        );
        // A count of lost ids far beyond the message: refused by length,
        // nothing allocated for it.
        let mut huge = good.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            parse(&huge),
            Err(GroupMessageError::Truncated { .. })
        ));
        let mut lost = good.clone();
        lost[8..12].copy_from_slice(&4u32.to_le_bytes());
        assert_eq!(
            parse(&lost),
            Err(GroupMessageError::Chunk {
                what: "lost",
                id: 4,
                chunks: 4
            })
        );
        let head = 4 + 8 + 4; // world, rank 0's list of one, rank 1's empty list
        let mut other = good.clone();
        other[head] = ValueFormat::Bf16.code();
        assert!(matches!(
            parse(&other),
            Err(GroupMessageError::Formats { .. })
        ));
        let mut many = good.clone();
        many[head + 4..head + 8].copy_from_slice(&5u32.to_le_bytes());
        assert!(matches!(
            parse(&many),
            Err(GroupMessageError::Chunk { what: "lossy", .. })
        ));
        let mut outside = good.clone();
        outside[head + 8..head + 12].copy_from_slice(&9u32.to_le_bytes());
        assert!(matches!(
            parse(&outside),
            Err(GroupMessageError::Chunk {
                what: "lossy",
                id: 9,
                ..
            })
        ));
        // Chunk 1's log8 scale: after chunk 0's three f32 values.
        let scale_at = head + 12 + 12;
        let mut scale = good.clone();
        scale[scale_at..scale_at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(matches!(
            parse(&scale),
            Err(GroupMessageError::Log8Scale { chunk: 1, .. })
        ));

        let shard = ReducedShard::parse((0, 2), &good, &chunks, f).unwrap();
        let mut short = vec![7.0; 9];
        assert_eq!(
            shard.decode_into(&mut short),
            Err(GroupMessageError::Output { need: 10, got: 9 })
        );
        assert!(short.iter().all(|&v| v == 7.0), "nothing written");
        let gap = vec![0..3, 4..5];
        assert_eq!(
            ReducedShard::parse((0, 2), &good, &gap, f).map(|_| ()),
            Err(GroupMessageError::ChunkPlan)
        );
    }
}
