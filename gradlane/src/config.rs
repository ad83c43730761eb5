//! What a link end can be configured with: a handful of settings to tune,
//! and groups of the rest, whose defaults hold on any path.

pub use crate::config_error::{ConfigError, MAX_UDP_PAYLOAD, MIN_UDP_PAYLOAD};
use crate::congestion::Congestion;
use crate::socket::faults::Faults;
use crate::socket::marking::DscpMarks;
use crate::tuning::Tuning;
pub use crate::tuning::{ETHERNET_UDP_PAYLOAD, JUMBO_UDP_PAYLOAD};
use gradlane_core::classify::{AdaptiveRatio, ClassifyConfig, Ranking};
use gradlane_core::encode::EncoderConfig;
use gradlane_core::format::ClassFormats;
use gradlane_core::layout::{ChunkOptions, Layout};
use gradlane_core::protocol::RoundTiming;
use gradlane_core::reassembly::ReassemblyConfig;
use gradlane_core::score::DEFAULT_ALPHA;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// [`Config::connect_timeout`]'s default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything a link end can be configured with.
///
/// **Tune** the first seven: [`loss_tolerance`](Self::loss_tolerance),
/// [`formats`](Self::formats), [`levels`](Self::levels),
/// [`lanes`](Self::lanes), [`congestion`](Self::congestion),
/// [`packets`](Self::packets), [`dscp`](Self::dscp). **Leave** the groups
/// after them unless their docs
/// describe your case. A sender's settings decide how its rounds are
/// sent; the receiver takes the layout and chunking from the handshake.
///
/// Every setting is checked before a socket is opened
/// ([`Config::validate`]): a bad one is a [`ConfigError`] from
/// [`Endpoint::server`](crate::Endpoint::server) or
/// [`Endpoint::client`](crate::Endpoint::client).
#[derive(Debug, Clone)]
pub struct Config {
    /// Share of each tensor's chunks, the least important by their
    /// smoothed contribution, that travel lossy: lost ones are zero-filled
    /// (and added into the next round if they come late). In `[0, 1]`;
    /// 0 sends everything reliably. Default 0.2. Raise it where loss is
    /// high and the model tolerates it; lower it if accuracy suffers.
    pub loss_tolerance: f64,
    /// What the values of each class look like on the wire (default `f32`
    /// for both: every value exact). Where the link's bytes bind (a slow
    /// or lossy path), `bf16` for the important part halves its bytes at 8
    /// bits of precision (what torch's `bf16_compress_hook` does to every
    /// value), and `log8` for the lossy levels quarters theirs within ±4.9%
    /// of each value; the `gradlane` `Group` can feed back what rounding
    /// took ([`BucketOptions`](crate::BucketOptions)). A value that is not
    /// finite always travels in the important part's format. Leave `f32`
    /// where CPU, not the network, binds (loopback, a fast LAN).
    pub formats: ClassFormats,
    /// Lossy levels that share is graded into, `1..=7` (default 3): level
    /// 1 holds the highest contributions, is sent first and dropped last.
    /// More levels matter only with [`dscp`](Self::dscp) priority queues
    /// or a [`RoundTiming::lossy_deadline`].
    pub levels: u8,
    /// QUIC streams each round's important part is spread over, `1..=255`
    /// (default 4). A lost packet holds up the rest of its stream's
    /// flow-control window for a round trip: on a long lossy path more
    /// lanes keep more data moving. On a short path it makes no difference.
    pub lanes: u8,
    /// The congestion controller (default [`Congestion::CappedBbr`]).
    pub congestion: Congestion,
    /// Packet sizes the path carries (default [`Packets::Route`]: as large
    /// as the interface towards each peer carries, found by MTU discovery).
    /// Set [`Packets::Ethernet`] where a hop beyond the first is narrower
    /// than the interface and swallows larger packets without a word.
    pub packets: Packets,
    /// DSCP marks per class, for networks whose queues serve the important
    /// class first (default none). Linux only.
    pub dscp: Option<DscpMarks>,
    /// Seeded loss, delay and jitter injected under this end's socket, for
    /// tests, demos and benchmarks (default none).
    pub faults: Option<Faults>,
    /// How chunks are cut, scored and ranked.
    pub scoring: Scoring,
    /// When the lossy part is released and how long a receiver waits for
    /// it.
    pub timing: RoundTiming,
    /// What a receiver holds on to.
    pub receiver: ReceiverLimits,
    /// QUIC windows, buffers and timers.
    pub quic: QuicSettings,
    /// On a server: refuse clients whose layout differs from this one
    /// (default: accept any).
    pub expect_layout: Option<Layout>,
    /// On a server: how long a client that completed the QUIC handshake
    /// may take to send its layout before it is closed (default 10 s).
    pub hello_timeout: Duration,
    /// On a client: how long [`Endpoint::connect`](crate::Endpoint::connect)
    /// keeps trying before it gives up with
    /// [`LinkError::ConnectTimeout`](crate::LinkError::ConnectTimeout)
    /// (default [`DEFAULT_CONNECT_TIMEOUT`], 30 s: as long as the default
    /// idle timeout lets a single handshake wait). Under heavy loss a
    /// connect runs several QUIC handshakes within it, the first to
    /// finish being the link. More than zero. A [`Group`](crate::Group)
    /// ignores it: its join timeout bounds its connects.
    pub connect_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            loss_tolerance: ClassifyConfig::default().loss_tolerance,
            formats: ClassFormats::F32,
            levels: 3,
            lanes: 4,
            congestion: Congestion::default(),
            packets: Packets::default(),
            dscp: None,
            faults: None,
            scoring: Scoring::default(),
            timing: RoundTiming::default(),
            receiver: ReceiverLimits::default(),
            quic: QuicSettings::default(),
            expect_layout: None,
            hello_timeout: Duration::from_secs(10),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

/// Which packet sizes a path carries.
///
/// Every packet costs CPU on both ends whatever its size (sealing and
/// opening, a header, a system call's share, an acknowledgement): larger
/// packets are the cheapest way to move more bytes per cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Packets {
    /// Packets start at QUIC's 1200-byte floor and grow, by quinn's MTU
    /// discovery, up to what the interface the kernel routes each peer
    /// through carries (its MTU less the IP and UDP headers): 65,508 bytes
    /// on loopback, 8,972 on a 9000-byte fabric, 1,472 on Ethernet. Each
    /// connection asks the kernel's routing table for its peer. Where the
    /// kernel cannot say (IPv6 beyond loopback), Ethernet's 1,452.
    #[default]
    Route,
    /// Any path: packets start at QUIC's 1200-byte floor and grow, by
    /// quinn's MTU discovery, up to an Ethernet frame (1452-byte UDP
    /// payloads).
    Ethernet,
    /// A path known to carry 9000-byte frames end to end (a datacenter
    /// fabric set up for them, or loopback): every packet 8952 bytes from
    /// the first, which cuts the per-packet CPU cost several times. A path
    /// that does not carry them fails the handshake.
    Jumbo,
    /// UDP payloads from `min` (the size the path is known to carry: the
    /// first packets' size, never gone below) up to `max` (where MTU
    /// discovery stops), both in `1200..=65527`.
    Custom {
        /// The floor.
        min: u16,
        /// The ceiling.
        max: u16,
    },
}

impl Packets {
    /// `(min, max)` UDP payload. For [`Packets::Route`] the largest any
    /// route may carry; each connection's ceiling is its route's.
    pub fn bounds(&self) -> (u16, u16) {
        match *self {
            Packets::Route => (MIN_UDP_PAYLOAD, MAX_UDP_PAYLOAD),
            Packets::Ethernet => (MIN_UDP_PAYLOAD, ETHERNET_UDP_PAYLOAD),
            Packets::Jumbo => (JUMBO_UDP_PAYLOAD, JUMBO_UDP_PAYLOAD),
            Packets::Custom { min, max } => (min, max),
        }
    }
}

/// How chunks are cut, scored and ranked. The defaults are the published
/// design's; change them for experiments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scoring {
    /// How tensors are cut into chunks (one chunk per convolution kernel,
    /// blocks of 256 values elsewhere). The client's travels in the
    /// handshake and holds for both directions.
    pub chunking: ChunkOptions,
    /// Smoothing of each chunk's contribution over rounds, in `[0, 1]`
    /// (default 0.3): higher remembers longer.
    pub alpha: f32,
    /// Rank chunks within each tensor (default) or across the round.
    /// Global ranking lets a tensor with large gradients take all the
    /// reliable share.
    pub ranking: Ranking,
    /// Grow the reliable share as the training loss falls (report it with
    /// [`LinkSender::report_loss`](crate::LinkSender::report_loss)); default off.
    pub adaptive: Option<AdaptiveRatio>,
    /// Send the first round entirely reliably (the authors' warm-up, while
    /// no contribution is known yet); default off.
    pub first_round_all_important: bool,
    /// Rank at random with this seed instead of by contribution: an
    /// ablation, never for training.
    pub random_ranking: Option<u64>,
}

impl Default for Scoring {
    fn default() -> Self {
        let c = ClassifyConfig::default();
        Self {
            chunking: ChunkOptions::default(),
            alpha: DEFAULT_ALPHA,
            ranking: c.ranking,
            adaptive: c.adaptive,
            first_round_all_important: c.first_round_all_important,
            random_ranking: c.random_ranking,
        }
    }
}

/// What a receiver holds on to. The defaults fit models up to a few
/// hundred MB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverLimits {
    /// Rounds buffered at once (default 3); each holds a full copy of the
    /// model. Raise it only if senders run several rounds ahead.
    pub max_open_rounds: usize,
    /// Bytes of late lossy data kept to be added into the next round
    /// (default 64 MiB); what is over is dropped and counted.
    pub late_buffer_bytes: usize,
    /// How many delivered rounds still take late data (default 4).
    pub late_window: u32,
}

impl Default for ReceiverLimits {
    fn default() -> Self {
        let r = ReassemblyConfig::default();
        Self {
            max_open_rounds: r.max_open_rounds,
            late_buffer_bytes: r.late_buffer_bytes,
            late_window: r.late_window,
        }
    }
}

/// QUIC windows, buffers and timers. The defaults carry about 10 Gbit/s
/// at a millisecond of round trip and 1 Gbit/s at tens of milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuicSettings {
    /// Receive window per stream (default 4 MiB). quinn closes a connection
    /// whose stream has more than 1024 gaps, which a larger window reaches
    /// at high loss: raise [`Config::lanes`] instead on long lossy paths.
    pub stream_receive_window: u64,
    /// Receive window of the connection (default 64 MiB).
    pub receive_window: u64,
    /// Bytes quinn buffers for sending across all streams (default 64 MiB).
    pub send_window: u64,
    /// Bytes of received datagrams held before quinn drops the oldest
    /// (default 32 MiB: a round's lossy part, which a busy receiver may
    /// fall behind by).
    pub datagram_receive_buffer: usize,
    /// Bytes of outgoing datagrams quinn queues (default 1 MiB); the link
    /// waits for room rather than let quinn drop the oldest.
    pub datagram_send_buffer: usize,
    /// Keep-alive interval (default 5 s): rounds can be far apart.
    pub keep_alive: Option<Duration>,
    /// Close a link after this long without a packet from the peer
    /// (default 30 s); `None` never does, and a vanished peer then hangs
    /// its link's calls.
    pub max_idle_timeout: Option<Duration>,
    /// UDP socket buffers requested from the kernel (default 4 MiB; the
    /// kernel caps it at `net.core.rmem_max` and says so in the log).
    pub socket_buffer: usize,
}

impl Default for QuicSettings {
    fn default() -> Self {
        Self {
            stream_receive_window: 4 * MIB,
            receive_window: 64 * MIB,
            send_window: 64 * MIB,
            datagram_receive_buffer: 32 * MIB as usize,
            datagram_send_buffer: MIB as usize,
            keep_alive: Some(Duration::from_secs(5)),
            max_idle_timeout: Some(Duration::from_secs(30)),
            socket_buffer: 4 * MIB as usize,
        }
    }
}

impl QuicSettings {
    /// Sets the idle timeout and keep-alives so that a peer that stops
    /// answering fails the link at most `t` after its last packet, and a
    /// live peer never does: four keep-alives fit in the idle timeout.
    ///
    /// QUIC restarts its idle timer at the first ack-eliciting packet sent
    /// after a receipt (RFC 9000, 10.1), and a link that only waits for
    /// its peer sends one at its next keep-alive: the timeout is `t` less
    /// one keep-alive interval.
    pub fn fail_silent_peer_within(&mut self, t: Duration) {
        self.keep_alive = Some(t / 5);
        self.max_idle_timeout = Some(t - t / 5);
    }
}

impl Config {
    /// Checks every setting; what [`Endpoint`](crate::Endpoint) does
    /// before it opens a socket.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.encoder().classify.validate()?;
        self.formats.validate()?;
        if self.lanes == 0 {
            return Err(ConfigError::Lanes);
        }
        if !(0.0..=1.0).contains(&self.scoring.alpha) {
            return Err(ConfigError::Alpha(self.scoring.alpha));
        }
        if self.scoring.chunking.block_values == 0 {
            return Err(ConfigError::Chunking);
        }
        if self.receiver.max_open_rounds == 0 {
            return Err(ConfigError::OpenRounds);
        }
        if self.connect_timeout.is_zero() {
            return Err(ConfigError::ConnectTimeout);
        }
        let (min, max) = self.packets.bounds();
        if !(MIN_UDP_PAYLOAD <= min && min <= max && max <= MAX_UDP_PAYLOAD) {
            return Err(ConfigError::Packets { min, max });
        }
        if let Some(bad) = self.dscp.and_then(|m| m.invalid()) {
            return Err(ConfigError::Dscp(bad));
        }
        if self.dscp.is_some() && !cfg!(target_os = "linux") {
            return Err(ConfigError::DscpUnsupported);
        }
        self.tuning().transport_config()?;
        Ok(())
    }

    /// The core encoder's settings for the rounds this end sends.
    pub(crate) fn encoder(&self) -> EncoderConfig {
        EncoderConfig {
            chunking: self.scoring.chunking,
            alpha: self.scoring.alpha,
            classify: ClassifyConfig {
                loss_tolerance: self.loss_tolerance,
                levels: self.levels,
                ranking: self.scoring.ranking,
                adaptive: self.scoring.adaptive,
                first_round_all_important: self.scoring.first_round_all_important,
                random_ranking: self.scoring.random_ranking,
            },
            layout_id: 0,
            formats: self.formats,
        }
    }

    /// The core reassembler's settings for rounds chunked with `chunking`
    /// (the handshake's).
    pub(crate) fn reassembly(&self, chunking: ChunkOptions) -> ReassemblyConfig {
        ReassemblyConfig {
            chunking,
            max_open_rounds: self.receiver.max_open_rounds,
            late_buffer_bytes: self.receiver.late_buffer_bytes,
            late_window: self.receiver.late_window,
            layout_id: 0,
        }
    }

    /// The transport settings of this end's endpoint.
    pub(crate) fn tuning(&self) -> Tuning {
        let q = self.quic;
        let (min_udp_payload, max_udp_payload) = self.packets.bounds();
        Tuning {
            stream_receive_window: q.stream_receive_window,
            receive_window: q.receive_window,
            send_window: q.send_window,
            datagram_receive_buffer: q.datagram_receive_buffer,
            datagram_send_buffer: q.datagram_send_buffer,
            keep_alive: q.keep_alive,
            max_idle_timeout: q.max_idle_timeout,
            congestion: self.congestion,
            socket_buffer: q.socket_buffer,
            min_udp_payload,
            max_udp_payload,
            route_ceiling: self.packets == Packets::Route,
            dscp: self.dscp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use gradlane_core::classify::ClassifyError;

    #[test]
    fn the_default_is_valid_and_the_published_design() {
        let c = Config::default();
        c.validate().unwrap();
        let e = c.encoder();
        assert_eq!(e.classify.loss_tolerance, 0.2);
        assert_eq!(e.classify.levels, 3);
        assert_eq!(e.alpha, 0.3);
        assert_eq!(c.tuning().congestion, Congestion::CappedBbr);
    }

    #[test]
    fn every_bad_setting_is_its_own_error() {
        let bad = |f: fn(&mut Config)| {
            let mut c = Config::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        let classify = |e| ConfigError::Classify(e);
        assert_eq!(
            bad(|c| c.loss_tolerance = 1.5),
            classify(ClassifyError::LossTolerance(1.5))
        );
        assert_eq!(
            bad(|c| c.loss_tolerance = 1.5).to_string(),
            "loss_tolerance 1.5 is not in [0, 1]"
        );
        assert!(matches!(
            bad(|c| c.loss_tolerance = f64::NAN),
            ConfigError::Classify(ClassifyError::LossTolerance(_))
        ));
        assert_eq!(bad(|c| c.levels = 0), classify(ClassifyError::Levels(0)));
        assert_eq!(bad(|c| c.levels = 8), classify(ClassifyError::Levels(8)));
        assert_eq!(
            bad(|c| c.scoring.adaptive = Some(AdaptiveRatio { ratio_min: 2.0 })),
            classify(ClassifyError::RatioMin(2.0))
        );
        assert_eq!(bad(|c| c.lanes = 0), ConfigError::Lanes);
        assert_eq!(
            bad(|c| c.formats.important = gradlane_core::format::ValueFormat::Log8),
            ConfigError::Format(gradlane_core::format::FormatError::LossyOnly)
        );
        assert_eq!(bad(|c| c.scoring.alpha = -0.1), ConfigError::Alpha(-0.1));
        assert_eq!(
            bad(|c| c.scoring.chunking.block_values = 0),
            ConfigError::Chunking
        );
        assert_eq!(
            bad(|c| c.receiver.max_open_rounds = 0),
            ConfigError::OpenRounds
        );
        assert_eq!(
            bad(|c| c.connect_timeout = Duration::ZERO),
            ConfigError::ConnectTimeout
        );
        assert_eq!(
            bad(|c| c.packets = Packets::Custom {
                min: 1199,
                max: 1452
            }),
            ConfigError::Packets {
                min: 1199,
                max: 1452
            }
        );
        assert_eq!(
            bad(|c| c.packets = Packets::Custom {
                min: 9000,
                max: 8952
            }),
            ConfigError::Packets {
                min: 9000,
                max: 8952
            }
        );
        assert!(matches!(
            bad(|c| c.quic.stream_receive_window = u64::MAX),
            ConfigError::TooLarge { .. }
        ));
        assert!(matches!(
            bad(|c| c.quic.max_idle_timeout = Some(Duration::from_secs(u64::MAX / 2))),
            ConfigError::IdleTimeout(_)
        ));
        let mut marks = DscpMarks::authors(3);
        marks.important = 64;
        let mut c = Config {
            dscp: Some(marks),
            ..Config::default()
        };
        assert_eq!(c.validate().unwrap_err(), ConfigError::Dscp(64));
        c.dscp = None;
        c.packets = Packets::Jumbo;
        c.validate().unwrap();
    }
}
