//! What makes a setting invalid: the error every bad setting is, and the
//! UDP payload bounds QUIC allows. Apart from `config`, so that
//! `tuning`, which `config` builds, can report its own refusals without
//! a circle between the two.

use gradlane_core::classify::ClassifyError;
use gradlane_core::format::FormatError;
use std::time::Duration;
use thiserror::Error;

/// The smallest UDP payload QUIC allows (RFC 9000, 14): the MTU floor of
/// any path.
pub const MIN_UDP_PAYLOAD: u16 = 1200;

/// The largest UDP payload there is (IPv6).
pub const MAX_UDP_PAYLOAD: u16 = 65_527;

/// A setting out of its range.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    /// `loss_tolerance`, `levels` or the adaptive ratio's floor is out of
    /// its range: the classifier's own check, which holds each range once.
    #[error(transparent)]
    Classify(#[from] ClassifyError),
    /// `lanes` is 0.
    #[error("lanes must be at least 1")]
    Lanes,
    /// `scoring.alpha` is not in `[0, 1]`.
    #[error("scoring alpha {0} is not in [0, 1]")]
    Alpha(f32),
    /// The UDP payload bounds are outside QUIC's range, or crossed.
    #[error("udp payload bounds {min}..={max} must be ordered and within 1200..=65527")]
    Packets {
        /// The floor asked for.
        min: u16,
        /// The ceiling asked for.
        max: u16,
    },
    /// A window does not fit QUIC's variable-length integer (2^62).
    #[error("{name} {value} is too large for quic")]
    TooLarge {
        /// Which setting.
        name: &'static str,
        /// Its value.
        value: u64,
    },
    /// The idle timeout does not fit QUIC's encoding.
    #[error("max idle timeout {0:?} is too large for quic")]
    IdleTimeout(Duration),
    /// A DSCP mark does not fit six bits.
    #[error("dscp {0} is not in 0..=63")]
    Dscp(u8),
    /// DSCP marks were asked for where gradlane cannot write them.
    #[error("dscp marks need linux")]
    DscpUnsupported,
    /// `receiver.max_open_rounds` is 0.
    #[error("max open rounds must be at least 1")]
    OpenRounds,
    /// `connect_timeout` is zero: a connect could not even start.
    #[error("connect timeout must be more than zero")]
    ConnectTimeout,
    /// The chunk options cannot cut tensors (a block of 0 values).
    #[error("chunking: blocks must hold at least one value")]
    Chunking,
    /// A value format where it cannot go (`log8` for the important part).
    #[error(transparent)]
    Format(#[from] FormatError),
}
