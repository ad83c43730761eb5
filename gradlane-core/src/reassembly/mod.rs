//! The receiver's state machine: buffers, completion, zero fill, late merge
//! (CN110958187B, step S35; docs/DESIGN.md §2.6).
//!
//! Segments are pushed in any order, from the reliable stream or from
//! datagrams. Each open round owns zeroed tensors; every received byte range
//! is copied in place, so whatever never arrives stays zero. A round is
//! *complete* once its [`RoundEnd`] has arrived and every important chunk it
//! announces is held — checked by count, bytes and an id digest, not assumed.
//! The important part may come on several streams at once (lanes), so the
//! round end may arrive before the last important chunks do: it is then kept
//! and the round completes when the count is reached; holding more than it
//! announces, or the wrong chunks, is an error.
//! The caller (the transport, which owns the clock) then [`delivers`] it,
//! perhaps after a grace period for datagrams in flight.
//!
//! A segment of a round already delivered is *late*: it is kept (in a buffer
//! bounded in bytes) and added element-wise into the next round delivered —
//! the delayed update of the published design. A byte range already received is a
//! duplicate and ignored; that is tracked with one bit per value, kept for a
//! few rounds after delivery so that late duplicates are caught too.
//!
//! Nothing is dropped silently: every refusal has a counter in
//! [`ReceiverCounters`].
//!
//! [`delivers`]: Reassembler::deliver
//! [`RoundEnd`]: crate::wire::RoundEnd

mod bitmap;
mod config;
mod delivery;
mod error;
mod late;
mod open_round;
mod placement;
mod stats;
mod stream_decoder;

pub use config::{Channel, ReassemblyConfig};
pub use delivery::Round;
pub use error::ReassemblyError;
pub use stats::{ClassStats, PushOutcome, ReceiverCounters, RoundStats};
pub use stream_decoder::StreamDecoder;

use crate::layout::{ChunkPlan, Layout};
use bitmap::Bitmap;
use late::LateSegment;
use open_round::OpenRound;
use std::collections::{BTreeMap, VecDeque};

/// Rebuilds rounds from segments; see the module docs.
#[derive(Debug)]
pub struct Reassembler {
    layout: Layout,
    plan: ChunkPlan,
    config: ReassemblyConfig,
    open: BTreeMap<u32, OpenRound>,
    last_delivered: Option<u32>,
    /// Bitmaps of recently delivered rounds, oldest first.
    recent: VecDeque<(u32, Bitmap)>,
    late: Vec<LateSegment>,
    late_bytes: usize,
    counters: ReceiverCounters,
    /// Tensor sets handed back by the caller, reused for new rounds: fresh
    /// memory costs a page fault per 4 KiB on first write, which is slower
    /// than clearing memory already mapped.
    spare_tensors: Vec<Vec<Vec<f32>>>,
    spare_bitmaps: Vec<Bitmap>,
}

impl Reassembler {
    /// A receiver for `layout`.
    pub fn new(layout: Layout, config: ReassemblyConfig) -> Result<Self, ReassemblyError> {
        let plan = layout.plan(config.chunking)?;
        Ok(Self {
            layout,
            plan,
            config: ReassemblyConfig {
                max_open_rounds: config.max_open_rounds.max(1),
                ..config
            },
            open: BTreeMap::new(),
            last_delivered: None,
            recent: VecDeque::new(),
            late: Vec::new(),
            late_bytes: 0,
            counters: ReceiverCounters::default(),
            spare_tensors: Vec::new(),
            spare_bitmaps: Vec::new(),
        })
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The chunk plan.
    pub fn plan(&self) -> &ChunkPlan {
        &self.plan
    }

    /// What was refused or ignored so far.
    pub fn counters(&self) -> ReceiverCounters {
        self.counters
    }

    /// The last delivered round.
    pub fn last_delivered(&self) -> Option<u32> {
        self.last_delivered
    }

    /// Payload bytes in the late buffer now.
    pub fn late_buffered_bytes(&self) -> usize {
        self.late_bytes
    }

    /// Rounds open now.
    pub fn open_rounds(&self) -> impl Iterator<Item = u32> + '_ {
        self.open.keys().copied()
    }

    /// For an open round: lossy payload bytes held so far, and once its end
    /// is in, how many the sender sent. Lets the transport stop waiting for
    /// datagrams as soon as all have come.
    ///
    /// Bytes, not datagrams: a sender may cut a datagram into several when
    /// the path's limit shrinks after the round was framed, so the round
    /// end's packet count can be reached while pieces are still on the way.
    /// Duplicates add no bytes.
    pub fn lossy_progress(&self, round: u32) -> Option<(u64, Option<u64>)> {
        let r = self.open.get(&round)?;
        let sent = r.end.map(|e| e.bytes[1..].iter().sum());
        Some((r.received_bytes[1..].iter().sum(), sent))
    }

    /// True when round `round` has its end and every important chunk.
    pub fn is_complete(&self, round: u32) -> bool {
        self.open.get(&round).is_some_and(|r| r.complete)
    }

    /// The lowest complete round, if any: the next one to deliver.
    pub fn next_complete(&self) -> Option<u32> {
        self.open.iter().find(|(_, r)| r.complete).map(|(&i, _)| i)
    }
}
