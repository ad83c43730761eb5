//! Why the receiver refuses a packet or a request.

use crate::layout::LayoutError;
use crate::wire::WireError;
use thiserror::Error;

/// Why the receiver refused input or a request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReassemblyError {
    /// A segment could not be decoded or does not fit the layout.
    #[error("malformed segment: {0}")]
    Wire(#[from] WireError),
    /// The layout cannot be chunked with these options.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Important data or a round end came as a datagram.
    #[error("{0} arrived on the lossy channel")]
    WrongChannel(&'static str),
    /// A segment of another layout than this receiver's.
    #[error("a segment of layout {got} reached the receiver of layout {expected}")]
    WrongLayout {
        /// This receiver's layout id.
        expected: u16,
        /// The segment's.
        got: u16,
    },
    /// A second round end for one round.
    #[error("round {0} ended twice")]
    DuplicateEnd(u32),
    /// A second round end for a round already delivered (and still in
    /// the late window).
    #[error("round end for round {0}, which was already delivered")]
    EndAfterDelivery(u32),
    /// The round end's important digest or bytes differ from what is held.
    #[error("round {0}: important chunks held differ from those announced")]
    ImportantMismatch(u32),
    /// Deliver was asked for a round that is not complete.
    #[error("round {0} is not complete")]
    NotComplete(u32),
    /// A stream decoder was fed again after refusing its input.
    #[error("the stream already failed")]
    StreamBroken,
    /// Deliver was asked for a round at or below the last delivered one.
    #[error("round {round} is not after the last delivered round {last}")]
    AlreadyDelivered {
        /// The round asked for.
        round: u32,
        /// The last delivered round.
        last: u32,
    },
}
