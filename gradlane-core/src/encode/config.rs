//! The encoder's settings, and the smallest datagram limit it accepts.

use crate::classify::ClassifyConfig;
use crate::format::ClassFormats;
use crate::layout::ChunkOptions;
use crate::score::DEFAULT_ALPHA;
use crate::wire::DATA_HEADER_LEN;

/// The smallest datagram limit the encoder accepts: one header and one
/// value in any format (a `Log8` value needs its chunk's scale too).
pub const MIN_DATAGRAM: usize = DATA_HEADER_LEN + 5;

/// Sender-side settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncoderConfig {
    /// How tensors are cut into chunks.
    pub chunking: ChunkOptions,
    /// Contribution smoothing factor (default 0.3).
    pub alpha: f32,
    /// Classification settings.
    pub classify: ClassifyConfig,
    /// The layout id written into every segment (see
    /// [`wire::layout_of`](crate::wire::layout_of)): which of a sender's
    /// layouts on one link a round has. 0 unless a link carries several.
    pub layout_id: u16,
    /// The value format of the important part and of the lossy levels
    /// (default `f32` for both).
    pub formats: ClassFormats,
}

impl Default for EncoderConfig {
    fn default() -> Self {
        Self {
            chunking: ChunkOptions::default(),
            alpha: DEFAULT_ALPHA,
            classify: ClassifyConfig::default(),
            layout_id: 0,
            formats: ClassFormats::F32,
        }
    }
}
