//! What gradlane's command-line programs share, and the research code
//! they run: not part of the gradlane library.
//!
//! - [`cli`]: start-up, error printing, address resolution, flags.
//! - [`cpu`]: this process's CPU time, for CPU seconds per GB moved.
//! - [`gradients`]: synthetic gradients of chosen distributions (codec).
//! - [`local_certs`]: certificates for a benchmark with both ends on this
//!   host.
//! - [`mlp`]: a small MLP and datasets for the parameter-server experiments.
//! - [`sim`]: an event-driven simulation of a parameter server and K
//!   workers, and the least-squares problem it trains.

pub mod cli;
pub mod cpu;
pub mod gradients;
pub mod local_certs;
pub mod mlp;
pub mod sim;
