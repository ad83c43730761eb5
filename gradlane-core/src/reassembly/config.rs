//! The receiver's settings, and the two channels a packet can come on.

use crate::layout::ChunkOptions;

/// Receiver-side limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReassemblyConfig {
    /// How tensors are cut into chunks; must match the sender's.
    pub chunking: ChunkOptions,
    /// Most rounds buffered at once; a segment that would open one more is
    /// dropped and counted. Each open round holds a full copy of the model.
    pub max_open_rounds: usize,
    /// Most payload bytes of late segments kept for the next round.
    pub late_buffer_bytes: usize,
    /// How many delivered rounds still accept late segments.
    pub late_window: u32,
    /// The layout id the sender writes into every segment (see
    /// [`EncoderConfig::layout_id`](crate::encode::EncoderConfig)); a
    /// segment of another layout is refused.
    pub layout_id: u16,
}

impl Default for ReassemblyConfig {
    fn default() -> Self {
        Self {
            chunking: ChunkOptions::default(),
            max_open_rounds: 3,
            late_buffer_bytes: 64 << 20,
            late_window: 4,
            layout_id: 0,
        }
    }
}

/// Which channel a packet came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// The reliable, ordered stream.
    Reliable,
    /// An unreliable datagram.
    Lossy,
}
