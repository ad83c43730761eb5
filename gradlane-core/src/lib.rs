//! gradlane's deterministic core: no sockets, no clock, no async.
//!
//! Everything that decides what a gradient round is and what becomes of it
//! lives here, so it can be tested, fuzzed and benchmarked without a
//! network; the `gradlane` crate drives it over QUIC, and anyone can drive
//! it over their own transport.
//!
//! # Example: a round encoded, a third of its lossy part lost, rebuilt
//!
//! ```
//! use gradlane_core::encode::{Encoder, EncoderConfig};
//! use gradlane_core::presets;
//! use gradlane_core::reassembly::{Channel, Reassembler, ReassemblyConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layout = presets::resnet18();
//! let grads = presets::gradients(&layout, 1);
//! let mut encoder = Encoder::new(&layout, EncoderConfig::default())?;
//! let round = encoder.encode(0, &grads, 1162)?; // datagrams of at most 1162 bytes
//!
//! let mut receiver = Reassembler::new(layout.clone(), ReassemblyConfig::default())?;
//! receiver.push(&round.reliable, Channel::Reliable)?; // the important part, exact
//! for (i, datagram) in round.lossy.iter().flatten().enumerate() {
//!     if i % 3 != 0 {
//!         receiver.push(datagram, Channel::Lossy)?; // every third datagram lost
//!     }
//! }
//! let delivered = receiver.deliver(0)?;
//! let stats = &delivered.stats;
//! assert_eq!(stats.classes[0].received_bytes, stats.classes[0].sent_bytes);
//! assert!(stats.lossy().zero_filled_bytes > 0);
//! # Ok(())
//! # }
//! ```
//!
//! - [`layout`]: the model's tensors and how each is cut into chunks.
//! - [`score`]: each chunk's smoothed contribution.
//! - [`classify`]: important chunks and graded lossy levels.
//! - [`wire`]: the segment header every piece of a round carries.
//! - [`mod@format`]: the value formats a class travels in (`f32`, `bf16`,
//!   `f16`, `log8`) and their error bounds.
//! - [`payload`]: a segment's payload laid out in its format.
//! - [`encode`]: a round scored, classed and framed for sending.
//! - [`reassembly`]: the receiver: placement, zero fill, late merge.
//! - [`control`]: the messages of a link's control stream.
//! - [`group`]: the messages of a group's ranks outside the rounds: the
//!   rendezvous, the further paths, a sparse allgather's shapes, an
//!   owner's summed shard, a new view; the control plane as state
//!   machines (a rank's view across collectives, the survivors'
//!   agreement on the next view, a mesh forming), which the `gradlane-sim`
//!   crate checks in deterministic simulations of N ranks.
//! - [`protocol`]: the round protocol as state machines: release, report,
//!   confirmation, delivery, close.
//! - [`bytes`]: the one byte reader and length-prefixed framing they use.
//! - [`codec`]: the sparse log-quantized gradient codec.
//! - [`ps`]: the parameter-server algorithms and their request messages.
//! - [`presets`]: layouts of well-known models.
//! - [`rng`]: the one seeded random number generator.
//! - [`typed`]: reductions over every element type, each in its own type.

#![warn(unreachable_pub)]

pub mod bytes;
pub mod classify;
/// Sparse log-quantized gradient codec: choose the entries worth sending,
/// pack each into a couple of bytes, and let the master sum workers' frames
/// straight into one dense vector.
pub mod codec;
pub mod control;
pub mod encode;
pub mod format;
pub mod group;
pub mod layout;
pub mod payload;
pub mod presets;
pub mod protocol;
pub mod ps;
pub mod reassembly;
pub mod rng;
pub mod score;
pub mod typed;
pub mod wire;
