//! The base of the socket layers: a layer names the socket under it and
//! writes only the calls it changes; [`layer_socket!`] makes it quinn's
//! [`AsyncUdpSocket`], forwarding every other call.
//!
//! Why forward everything by default: quinn's defaults for the socket's
//! capabilities (one segment per send and per receive, may fragment) would
//! silently turn off GSO, GRO and MTU discovery in a layer that forgot one.

use std::io::{self, IoSliceMut};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// A wrapper of another [`AsyncUdpSocket`]. Each provided method is the
/// `AsyncUdpSocket` call of its doc, forwarded to [`inner`](Self::inner);
/// a layer overrides those it changes. (The names differ from quinn's so
/// that a call on a layer never has two traits to choose from.)
pub(crate) trait Layer: Send + Sync + std::fmt::Debug + 'static {
    /// The socket under this layer.
    fn inner(&self) -> &Arc<dyn AsyncUdpSocket>;

    /// [`AsyncUdpSocket::create_io_poller`].
    fn io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner().clone().create_io_poller()
    }

    /// [`AsyncUdpSocket::try_send`].
    fn send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        self.inner().try_send(transmit)
    }

    /// What this layer makes of the datagram buffers the inner socket just
    /// received (`bufs` and `meta` hold those only): how many, moved to the
    /// front, to hand up, or `None` to drop them all and receive again.
    fn received(&self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> Option<usize> {
        let _ = bufs;
        Some(meta.len())
    }

    /// [`AsyncUdpSocket::poll_recv`], each batch through
    /// [`received`](Self::received).
    fn recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        loop {
            let n = ready!(self.inner().poll_recv(cx, bufs, meta))?;
            let n = n.min(bufs.len()).min(meta.len());
            if let Some(kept) = self.received(&mut bufs[..n], &mut meta[..n]) {
                return Poll::Ready(Ok(kept));
            }
            // Everything was dropped: poll again, so that we either return
            // data or the inner socket registers the waker with Pending.
        }
    }

    /// [`AsyncUdpSocket::max_receive_segments`].
    fn receive_segments(&self) -> usize {
        self.inner().max_receive_segments()
    }
}

/// Implements [`AsyncUdpSocket`] for a [`Layer`]: the layer's calls, and
/// the inner socket's address, send segments and fragmentation. (A macro,
/// not a blanket impl: quinn's trait cannot be implemented for every `T`
/// here.)
macro_rules! layer_socket {
    ($layer:ty) => {
        impl ::quinn::AsyncUdpSocket for $layer {
            fn create_io_poller(
                self: ::std::sync::Arc<Self>,
            ) -> ::std::pin::Pin<Box<dyn ::quinn::UdpPoller>> {
                $crate::socket::layer::Layer::io_poller(self)
            }

            fn try_send(&self, transmit: &::quinn::udp::Transmit<'_>) -> ::std::io::Result<()> {
                $crate::socket::layer::Layer::send(self, transmit)
            }

            fn poll_recv(
                &self,
                cx: &mut ::std::task::Context<'_>,
                bufs: &mut [::std::io::IoSliceMut<'_>],
                meta: &mut [::quinn::udp::RecvMeta],
            ) -> ::std::task::Poll<::std::io::Result<usize>> {
                $crate::socket::layer::Layer::recv(self, cx, bufs, meta)
            }

            fn local_addr(&self) -> ::std::io::Result<::std::net::SocketAddr> {
                $crate::socket::layer::Layer::inner(self).local_addr()
            }

            fn max_transmit_segments(&self) -> usize {
                $crate::socket::layer::Layer::inner(self).max_transmit_segments()
            }

            fn max_receive_segments(&self) -> usize {
                $crate::socket::layer::Layer::receive_segments(self)
            }

            fn may_fragment(&self) -> bool {
                $crate::socket::layer::Layer::inner(self).may_fragment()
            }
        }
    };
}

pub(crate) use layer_socket;
