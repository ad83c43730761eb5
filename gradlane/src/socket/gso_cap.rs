//! A socket wrapper that keeps quinn's GSO batches under the kernel's 64 KB
//! limit, so that jumbo packets work.
//!
//! quinn 0.11 batches up to 10 packets of the path MTU into one GSO send.
//! The kernel refuses a UDP send above 65,507 bytes with `EMSGSIZE`, and
//! quinn-udp swallows `EMSGSIZE` (it expects it only from MTU probes): at
//! an MTU of 8952 every full batch (89 KB) vanished without a trace, quinn
//! counted the packets lost, declared a black hole and fell back to 1200
//! bytes (quinn-rs/quinn#1457, #2199; a fix that splits such sends,
//! quinn-rs/quinn#2653, was not merged). [`GsoCappedSocket`] reports at most
//! `65,507 / max_udp_payload` segments per send to quinn, so no batch it
//! builds can exceed the limit. Everything else is forwarded.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// The largest UDP payload one send may carry on IPv4 (65,535 less the IP
/// and UDP headers); also the bound for a GSO batch as a whole.
pub(crate) const MAX_UDP_SEND: usize = 65_507;

/// The most GSO segments of `max_udp_payload` bytes that fit one send (at
/// least 1).
pub(crate) fn segment_cap(max_udp_payload: u16) -> usize {
    (MAX_UDP_SEND / usize::from(max_udp_payload).max(1)).max(1)
}

/// An [`AsyncUdpSocket`] that caps `max_transmit_segments` so that a batch
/// of packets no larger than `max_udp_payload` fits one send.
pub(crate) struct GsoCappedSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    cap: usize,
}

impl GsoCappedSocket {
    /// Wraps `inner` for packets of at most `max_udp_payload` bytes.
    pub(crate) fn new(inner: Arc<dyn AsyncUdpSocket>, max_udp_payload: u16) -> Arc<Self> {
        Arc::new(Self {
            inner,
            cap: segment_cap(max_udp_payload),
        })
    }
}

impl fmt::Debug for GsoCappedSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GsoCappedSocket")
            .field("cap", &self.cap)
            .finish_non_exhaustive()
    }
}

impl AsyncUdpSocket for GsoCappedSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments().min(self.cap)
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_batch_fits_one_send() {
        for payload in [1200u16, 1452, 6550, 6551, 8952, 16_384, 65_527] {
            let cap = segment_cap(payload);
            assert!(cap >= 1, "{payload}");
            assert!(
                cap == 1 || cap * usize::from(payload) <= MAX_UDP_SEND,
                "{payload}: {cap} segments"
            );
            // One more segment would not fit: the cap is not lower than
            // it must be.
            assert!((cap + 1) * usize::from(payload) > MAX_UDP_SEND, "{payload}");
        }
        // quinn's own batch limit (10) binds below 6551 bytes.
        assert!(segment_cap(6550) >= 10);
        assert_eq!(segment_cap(8952), 7);
    }
}
