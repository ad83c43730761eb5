//! The batches quinn hands the socket: GSO sends split to fit the kernel's
//! 64 KB limit, GRO receive buffers bounded, and both counted.
//!
//! quinn 0.11 batches up to 10 packets of the path MTU into one GSO send.
//! The kernel refuses a UDP send above 65,507 bytes with `EMSGSIZE`, and
//! quinn-udp swallows `EMSGSIZE` (it expects it only from MTU probes): at
//! an MTU of 8952 every full batch (89 KB) vanished without a trace, quinn
//! counted the packets lost, declared a black hole and fell back to 1200
//! bytes (quinn-rs/quinn#1457, #2199; a fix that splits such sends,
//! quinn-rs/quinn#2653, was not merged). [`BatchingSocket`] splits such a
//! batch into sends that fit, so that one endpoint can carry both
//! Ethernet-sized batches (14 KB, one send) and 64 KB loopback packets
//! (one packet a send) without capping either.
//!
//! quinn sizes its receive buffers as the largest payload times the
//! receive segments the socket reports, times 32 messages per `recvmmsg`:
//! 128 MB for 64 KB payloads and 64 segments. A GRO buffer never exceeds
//! 64 KB, so the segments reported here are capped to what fills that.
//!
//! Whether GSO and GRO are at work is not visible from quinn: the
//! counters ([`BatchingSocket::counts`]) say how many packets left per
//! send and arrived per receive buffer.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use quinn::udp::{RecvMeta, Transmit};
use quinn::AsyncUdpSocket;

use super::layer::{layer_socket, Layer};

/// The largest UDP payload one send may carry on IPv4 (65,535 less the IP
/// and UDP headers); also the bound for a GSO batch as a whole.
pub(crate) const MAX_UDP_SEND: usize = 65_507;

/// The largest buffer GRO coalesces into (the kernel stops a GRO batch
/// before it reaches 64 KB).
const MAX_GRO_BUFFER: usize = 65_535;

/// Segments of `segment` bytes that fit one send (at least 1).
pub(crate) fn segments_per_send(segment: usize) -> usize {
    (MAX_UDP_SEND / segment.max(1)).max(1)
}

/// Receive segments of `max_udp_payload` bytes that cover the largest GRO
/// buffer (at least 1).
fn receive_segments(max_udp_payload: u16) -> usize {
    MAX_GRO_BUFFER.div_ceil(usize::from(max_udp_payload).max(1))
}

/// What the socket sent and received, in batches and in packets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCounts {
    /// Sends handed to the kernel (one system call each, `sendmsg`).
    pub sends: u64,
    /// Packets in them: more than `sends` when GSO batches.
    pub packets_sent: u64,
    /// quinn batches split because they exceeded one send.
    pub batches_split: u64,
    /// Packets of a split batch dropped because the kernel's buffer was
    /// full after its first send (QUIC's loss recovery resends them).
    pub packets_dropped_full: u64,
    /// Receive buffers quinn took from the kernel.
    pub buffers_received: u64,
    /// Packets in them: more than `buffers_received` when GRO coalesces.
    pub packets_received: u64,
}

#[derive(Debug, Default)]
struct Counters {
    sends: AtomicU64,
    packets_sent: AtomicU64,
    batches_split: AtomicU64,
    packets_dropped_full: AtomicU64,
    buffers_received: AtomicU64,
    packets_received: AtomicU64,
}

/// An [`AsyncUdpSocket`] that splits GSO batches to fit one send, bounds
/// the receive segments, and counts both.
pub(crate) struct BatchingSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    receive_segments: usize,
    counters: Counters,
}

impl BatchingSocket {
    /// Wraps `inner` for packets of at most `max_udp_payload` bytes.
    pub(crate) fn new(inner: Arc<dyn AsyncUdpSocket>, max_udp_payload: u16) -> Arc<Self> {
        Arc::new(Self {
            inner,
            receive_segments: receive_segments(max_udp_payload),
            counters: Counters::default(),
        })
    }

    /// The counts so far.
    pub(crate) fn counts(&self) -> BatchCounts {
        let c = &self.counters;
        BatchCounts {
            sends: c.sends.load(Relaxed),
            packets_sent: c.packets_sent.load(Relaxed),
            batches_split: c.batches_split.load(Relaxed),
            packets_dropped_full: c.packets_dropped_full.load(Relaxed),
            buffers_received: c.buffers_received.load(Relaxed),
            packets_received: c.packets_received.load(Relaxed),
        }
    }

    fn send_one(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        self.inner.try_send(transmit)?;
        let packets = match transmit.segment_size {
            Some(s) => transmit.contents.len().div_ceil(s.max(1)),
            None => 1,
        };
        self.counters.sends.fetch_add(1, Relaxed);
        self.counters
            .packets_sent
            .fetch_add(packets as u64, Relaxed);
        Ok(())
    }
}

impl fmt::Debug for BatchingSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchingSocket")
            .field("receive_segments", &self.receive_segments)
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

impl Layer for BatchingSocket {
    fn inner(&self) -> &Arc<dyn AsyncUdpSocket> {
        &self.inner
    }

    fn send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        let segment = match transmit.segment_size {
            Some(s) if transmit.contents.len() > MAX_UDP_SEND => s,
            _ => return self.send_one(transmit),
        };
        self.counters.batches_split.fetch_add(1, Relaxed);
        let per_send = segments_per_send(segment) * segment;
        let mut parts = transmit.contents.chunks(per_send).peekable();
        let mut first = true;
        while let Some(part) = parts.next() {
            let piece = Transmit {
                destination: transmit.destination,
                ecn: transmit.ecn,
                contents: part,
                segment_size: (part.len() > segment).then_some(segment),
                src_ip: transmit.src_ip,
            };
            match self.send_one(&piece) {
                Ok(()) => first = false,
                // Nothing left yet: quinn waits for room and retries it all.
                Err(e) if first => return Err(e),
                // Part of the batch left: the rest is lost as if a queue
                // had dropped it (retrying all would send the first part
                // twice), and QUIC resends it.
                Err(_) => {
                    let rest = part.len() + parts.map(<[u8]>::len).sum::<usize>();
                    let dropped = rest.div_ceil(segment) as u64;
                    self.counters
                        .packets_dropped_full
                        .fetch_add(dropped, Relaxed);
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn received(&self, _: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> Option<usize> {
        let packets: usize = meta
            .iter()
            .map(|m| m.len.div_ceil(m.stride.max(1)).max(1))
            .sum();
        self.counters
            .buffers_received
            .fetch_add(meta.len() as u64, Relaxed);
        self.counters
            .packets_received
            .fetch_add(packets as u64, Relaxed);
        Some(meta.len())
    }

    fn receive_segments(&self) -> usize {
        self.inner.max_receive_segments().min(self.receive_segments)
    }
}

layer_socket!(BatchingSocket);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_fits_the_kernels_limit_and_receive_buffers_cover_gro() {
        for segment in [1200usize, 1452, 6550, 6551, 8952, 16_384, 65_507] {
            let n = segments_per_send(segment);
            assert!(n >= 1, "{segment}");
            assert!(n * segment <= MAX_UDP_SEND, "{segment}: {n} segments");
            // One more segment would not fit: no send is smaller than it
            // must be.
            assert!((n + 1) * segment > MAX_UDP_SEND, "{segment}");
        }
        assert_eq!(segments_per_send(8952), 7);
        for payload in [1200u16, 1452, 8952, 65_527] {
            let n = receive_segments(payload);
            assert!(n * usize::from(payload) >= MAX_GRO_BUFFER, "{payload}");
            assert!((n - 1) * usize::from(payload) < MAX_GRO_BUFFER, "{payload}");
        }
        // 64 KB payloads: quinn's buffers stay at 2 x 64 KB a message.
        assert_eq!(receive_segments(65_527), 2);
    }
}
