//! One error for every group message a peer sends: what was wrong, in
//! words the shell's `GroupError::OutOfStep` can carry, found before
//! anything the message claims is allocated.

use crate::bytes::{Reader, Short};
use crate::format::ClassFormats;
use thiserror::Error;

/// Why a group message from a peer was refused.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum GroupMessageError {
    /// The message is longer than any valid one can be.
    #[error("a {message} of {len} bytes, over its bound of {max}")]
    TooLong {
        /// Which message.
        message: &'static str,
        /// Its length.
        len: usize,
        /// The most it may have.
        max: usize,
    },
    /// A text message that is not UTF-8.
    #[error("a {message} that is not text")]
    NotText {
        /// Which message.
        message: &'static str,
    },
    /// Another message, or another version of this one.
    #[error("not a {message}: it does not start with {expected:?}")]
    WrongKind {
        /// Which message was expected.
        message: &'static str,
        /// The word it must start with.
        expected: &'static str,
    },
    /// A field missing or not a number or address.
    #[error("a {message} whose {field} is missing or malformed")]
    BadField {
        /// Which message.
        message: &'static str,
        /// Which field.
        field: &'static str,
    },
    /// Words or bytes after the last field.
    #[error("a {message} with bytes after its end")]
    Trailing {
        /// Which message.
        message: &'static str,
    },
    /// A message that ends inside a field.
    #[error("a {message} cut short at {len} bytes")]
    Truncated {
        /// Which message.
        message: &'static str,
        /// Its length.
        len: usize,
    },
    /// A group of no ranks or of more than [`MAX_WORLD`](super::MAX_WORLD).
    #[error("a group of {world} ranks (at most {max})")]
    World {
        /// The size it claims.
        world: usize,
        /// The bound.
        max: usize,
    },
    /// A rank outside its group.
    #[error("rank {rank} in a group of {world}")]
    Rank {
        /// The rank it claims.
        rank: usize,
        /// The group's size.
        world: usize,
    },
    /// A list of ranks that repeats one or goes back: every list of ranks
    /// in a view message is strictly increasing, so it has one spelling.
    #[error("a {message} whose {field} repeat or go back at rank {rank}")]
    Unordered {
        /// Which message.
        message: &'static str,
        /// Which list.
        field: &'static str,
        /// The first rank not above the one before it.
        rank: usize,
    },
    /// A list with more entries than the group allows it.
    #[error("a {message} with {got} {field}, at most {max} in this group")]
    TooMany {
        /// Which message.
        message: &'static str,
        /// Which list.
        field: &'static str,
        /// The entries it holds.
        got: usize,
        /// The most it may hold.
        max: usize,
    },
    /// An address table, or a reduced shard, for another group size.
    #[error("a {message} for {got} ranks, the group has {world}")]
    WorldMismatch {
        /// Which message.
        message: &'static str,
        /// The ranks it holds.
        got: usize,
        /// The group's.
        world: usize,
    },
    /// More paths than sockets to carry them, or than a rank may open.
    #[error("an offer of {paths} paths on {ports} further sockets (at most {max} sockets)")]
    PathsDoNotFit {
        /// The paths offered.
        paths: usize,
        /// The further sockets' ports given.
        ports: usize,
        /// [`MAX_SOCKETS`](super::MAX_SOCKETS).
        max: usize,
    },
    /// A reduced shard in other formats than the bucket's: the ranks
    /// registered the bucket with different options.
    #[error(
        "a reduced shard in formats ({important}, {lossy}), this bucket's are {expected:?}: \
         register buckets with the same options on every rank"
    )]
    Formats {
        /// The important format's code it carries.
        important: u8,
        /// The lossy format's code it carries (or `NO_LOSSY_RETURN`).
        lossy: u8,
        /// The bucket's.
        expected: ClassFormats,
    },
    /// A chunk id that is not in the shard, or lossy ids out of order.
    #[error("{what} chunk {id} out of order or not in a shard of {chunks}")]
    Chunk {
        /// Which list: "lost" or "lossy".
        what: &'static str,
        /// The id.
        id: usize,
        /// The shard's chunks.
        chunks: usize,
    },
    /// A `log8` scale that no encoder writes.
    #[error("a log8 scale of {scale} in chunk {chunk}")]
    Log8Scale {
        /// The chunk.
        chunk: usize,
        /// The scale.
        scale: f32,
    },
    /// Value bytes that do not fit the shard's chunks.
    #[error("a reduced shard of {got} value bytes, its chunks need {need}")]
    ValueBytes {
        /// The bytes it carries.
        got: usize,
        /// The bytes its chunks need.
        need: usize,
    },
    /// The receiver's own chunk plan is not contiguous ranges in order (a
    /// caller's mistake, not the peer's).
    #[error("a shard's chunks that are not contiguous ranges in order")]
    ChunkPlan,
    /// A buffer that does not hold the shard the message was read for.
    #[error("a shard of {need} values decoded into {got}")]
    Output {
        /// The values the shard's chunks end at.
        need: usize,
        /// The buffer's length.
        got: usize,
    },
}

/// A reader of the binary `message` past its leading rank count, which
/// must be the group's `world` (`name` says which message, in the error).
pub(crate) fn ranks_reader<'m>(
    message: &'m [u8],
    name: &'static str,
    world: usize,
) -> Result<Reader<'m>, GroupMessageError> {
    let mut r = Reader::new(message);
    let ranks = r.u32().map_err(|_: Short| GroupMessageError::Truncated {
        message: name,
        len: message.len(),
    })? as usize;
    if ranks != world {
        return Err(GroupMessageError::WorldMismatch {
            message: name,
            got: ranks,
            world,
        });
    }
    Ok(r)
}
