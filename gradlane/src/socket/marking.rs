//! DSCP marks per traffic class (docs/DESIGN.md §2.5): on a network with priority
//! queues, important packets go ahead and lossy level 3 is dropped first.
//!
//! quinn-udp writes the IP TOS byte of every packet it sends from the
//! packet's ECN codepoint alone (an `IP_TOS` control message, which
//! overrides the socket's own `IP_TOS`), so a DSCP can be neither set on
//! the socket nor passed through quinn. [`MarkingSocket`] is the UDP socket
//! under quinn when [`Config::dscp`](crate::Config::dscp) is set: it
//! receives like quinn's own socket (quinn-udp's receive path, GRO) and
//! sends with its own `sendmsg`, writing `dscp << 2 | ecn` into the TOS
//! byte (IPv6: the traffic class), so ECN keeps working.
//!
//! Which DSCP a packet gets is decided per connection, by peer address
//! ([`MarkRegistry`]): quinn builds a connection's packets from frames of
//! every kind and gives the socket only ciphertext, so the class of a packet
//! is the class its link is sending at that moment. A link with marks
//! therefore keeps its classes apart in time: its important part goes
//! first, and the lossy datagrams start only once the peer has confirmed
//! every important chunk (no important byte is left to retransmit in a
//! packet marked lossy), level 1 first, each level's mark set once quinn
//! has put the level before it into packets (see the link's sending half).
//! Between rounds, and while a round's important part is sent, the link's
//! packets (acknowledgements, control messages, the peer's confirmations)
//! carry the important mark. With an injected outgoing delay
//! ([`Faults`](super::faults::Faults)) a packet is marked when it leaves the
//! injector, up to the delay plus jitter after quinn built it.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{ready, Context, Poll};

use quinn::udp::{RecvMeta, Transmit, UdpSocketState};
use quinn::{AsyncUdpSocket, UdpPoller};
use tokio::io::Interest;

use gradlane_core::classify::MAX_LEVELS;

/// The largest DSCP (six bits).
pub(crate) const MAX_DSCP: u8 = 63;

/// The DSCP of each traffic class: the important class and lossy levels
/// 1 to 7.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DscpMarks {
    /// The important class, the control stream, acknowledgements and the
    /// handshake.
    pub important: u8,
    /// Lossy level `l` is marked `lossy[l - 1]`.
    pub lossy: [u8; MAX_LEVELS as usize],
}

impl DscpMarks {
    /// The authors' marks for `levels` lossy levels: TOS 224 (DSCP 56, class
    /// selector 7) for the important class and TOS `(levels - c) * 32`
    /// (class selector `levels - c`) for lossy level `c`, so the last level
    /// is best effort. Levels beyond `levels` are best effort too.
    pub fn authors(levels: u8) -> Self {
        let levels = levels.min(MAX_LEVELS);
        let mut lossy = [0; MAX_LEVELS as usize];
        for (i, mark) in lossy.iter_mut().enumerate().take(levels as usize) {
            // Class selector `levels - c` for level c = i + 1.
            *mark = (levels - 1 - i as u8) * 8;
        }
        Self {
            important: 56,
            lossy,
        }
    }

    /// The mark of class `class`: 0 is important, `1..=7` lossy levels
    /// (anything above 7 is marked as level 7).
    pub fn of_class(&self, class: u8) -> u8 {
        match class {
            0 => self.important,
            l => self.lossy[usize::from(l.min(MAX_LEVELS)) - 1],
        }
    }

    /// The first mark above 63 (six bits), if any.
    pub fn invalid(&self) -> Option<u8> {
        std::iter::once(self.important)
            .chain(self.lossy)
            .find(|&d| d > MAX_DSCP)
    }
}

/// The IP TOS byte (IPv6 traffic class) of a packet with DSCP `dscp` and ECN
/// codepoint bits `ecn`.
pub(crate) fn tos(dscp: u8, ecn: u8) -> u8 {
    (dscp << 2) | (ecn & 0b11)
}

/// The DSCP each connection's packets get, by peer address: one per
/// endpoint, filled by its links.
#[derive(Debug)]
pub(crate) struct MarkRegistry {
    default: u8,
    by_peer: RwLock<HashMap<SocketAddr, Arc<AtomicU8>>>,
}

impl MarkRegistry {
    /// A registry that marks packets to unregistered peers `default`.
    pub(crate) fn new(default: u8) -> Arc<Self> {
        Arc::new(Self {
            default,
            by_peer: RwLock::new(HashMap::new()),
        })
    }

    /// The DSCP of a packet to `peer` now.
    pub(crate) fn dscp_for(&self, peer: &SocketAddr) -> u8 {
        let peers = self.by_peer.read().unwrap_or_else(PoisonError::into_inner);
        match peers.get(peer) {
            Some(cell) => cell.load(Ordering::Relaxed),
            None => self.default,
        }
    }

    /// Marks packets to `peer` by the class its link sends, starting with
    /// the important class, until the returned handle is dropped.
    pub(crate) fn register(self: &Arc<Self>, peer: SocketAddr, marks: DscpMarks) -> ConnectionMark {
        let cell = Arc::new(AtomicU8::new(marks.important));
        self.by_peer
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(peer, cell.clone());
        ConnectionMark {
            cell,
            registry: self.clone(),
            peer,
            marks,
        }
    }
}

/// Sets the class one connection's packets are marked with.
#[derive(Debug)]
pub(crate) struct ConnectionMark {
    cell: Arc<AtomicU8>,
    registry: Arc<MarkRegistry>,
    peer: SocketAddr,
    marks: DscpMarks,
}

impl ConnectionMark {
    /// Marks the connection's packets from now on as class `class` (0 is
    /// important, `1..=7` lossy levels).
    pub(crate) fn set_class(&self, class: u8) {
        self.cell
            .store(self.marks.of_class(class), Ordering::Relaxed);
    }

    /// The DSCP the connection's packets get now.
    #[cfg(test)]
    pub(crate) fn current(&self) -> u8 {
        self.cell.load(Ordering::Relaxed)
    }
}

impl Drop for ConnectionMark {
    fn drop(&mut self) {
        let mut peers = self
            .registry
            .by_peer
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        // A later link to the same peer address may have taken the entry.
        if peers
            .get(&self.peer)
            .is_some_and(|c| Arc::ptr_eq(c, &self.cell))
        {
            peers.remove(&self.peer);
        }
    }
}

/// Packets an endpoint's marking socket handed to the kernel, by DSCP
/// ([`Endpoint::marked_counts`](crate::Endpoint::marked_counts)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkedCounts {
    /// `packets[d]`: UDP datagrams (GSO segments counted one by one) sent
    /// with DSCP `d`.
    pub packets: [u64; 64],
    /// `bytes[d]`: their UDP payload bytes.
    pub bytes: [u64; 64],
    /// Sends the kernel refused other than for a full buffer (quinn's own
    /// socket drops them too: QUIC recovers them as losses).
    pub send_errors: u64,
}

#[cfg(target_os = "linux")]
/// A UDP socket for quinn that writes each packet's DSCP (see the module
/// documentation).
pub(crate) struct MarkingSocket {
    io: tokio::net::UdpSocket,
    state: UdpSocketState,
    registry: Arc<MarkRegistry>,
    /// GSO segments per send: quinn-udp's count, 1 once the kernel refused
    /// a GSO send.
    max_segments: AtomicUsize,
    packets: [AtomicU64; 64],
    bytes: [AtomicU64; 64],
    send_errors: AtomicU64,
}

#[cfg(target_os = "linux")]
impl MarkingSocket {
    /// Takes over `socket` (quinn-udp sets it up as for quinn's own socket:
    /// non-blocking, TOS and packet info on receive, GRO); packets are
    /// marked as `registry` says. Call within a tokio runtime.
    pub(crate) fn new(
        socket: std::net::UdpSocket,
        registry: Arc<MarkRegistry>,
    ) -> io::Result<Arc<Self>> {
        let state = UdpSocketState::new((&socket).into())?;
        let max_segments = AtomicUsize::new(state.max_gso_segments());
        Ok(Arc::new(Self {
            io: tokio::net::UdpSocket::from_std(socket)?,
            state,
            registry,
            max_segments,
            packets: std::array::from_fn(|_| AtomicU64::new(0)),
            bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            send_errors: AtomicU64::new(0),
        }))
    }

    /// What was sent so far, by DSCP.
    pub(crate) fn counts(&self) -> MarkedCounts {
        MarkedCounts {
            packets: std::array::from_fn(|d| self.packets[d].load(Ordering::Relaxed)),
            bytes: std::array::from_fn(|d| self.bytes[d].load(Ordering::Relaxed)),
            send_errors: self.send_errors.load(Ordering::Relaxed),
        }
    }

    fn count(&self, dscp: u8, transmit: &Transmit<'_>) {
        let len = transmit.contents.len();
        let segments = match transmit.segment_size {
            Some(s) if s > 0 => len.div_ceil(s),
            _ => 1,
        };
        let d = usize::from(dscp & MAX_DSCP);
        self.packets[d].fetch_add(segments as u64, Ordering::Relaxed);
        self.bytes[d].fetch_add(len as u64, Ordering::Relaxed);
    }
}

#[cfg(target_os = "linux")]
impl fmt::Debug for MarkingSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MarkingSocket")
            .field("local", &self.io.local_addr().ok())
            .finish_non_exhaustive()
    }
}

#[cfg(target_os = "linux")]
/// Tells quinn when the socket can take another send.
#[derive(Debug)]
struct WritablePoller(Arc<MarkingSocket>);

#[cfg(target_os = "linux")]
impl UdpPoller for WritablePoller {
    fn poll_writable(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.io.poll_send_ready(cx)
    }
}

#[cfg(target_os = "linux")]
impl AsyncUdpSocket for MarkingSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(WritablePoller(self))
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        let dscp = self.registry.dscp_for(&transmit.destination);
        let ecn = transmit.ecn.map_or(0, |e| e as u8);
        let result = self.io.try_io(Interest::WRITABLE, || {
            send_marked(&self.io, transmit, tos(dscp, ecn))
        });
        match result {
            Ok(()) => {
                self.count(dscp, transmit);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(e),
            Err(e) => {
                // As quinn-udp does: a GSO send the device refuses turns
                // GSO off; any other refusal is a lost packet to QUIC, not
                // a reason to close every connection of the endpoint.
                if transmit.segment_size.is_some()
                    && matches!(e.raw_os_error(), Some(nix::libc::EIO | nix::libc::EINVAL))
                {
                    self.max_segments.store(1, Ordering::Relaxed);
                }
                self.send_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%e, dest = %transmit.destination, "marked send failed");
                Ok(())
            }
        }
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        // quinn's own socket, verbatim: quinn-udp reads with GRO and ECN.
        loop {
            ready!(self.io.poll_recv_ready(cx))?;
            if let Ok(n) = self.io.try_io(Interest::READABLE, || {
                self.state.recv((&self.io).into(), bufs, meta)
            }) {
                return Poll::Ready(Ok(n));
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.max_segments
            .load(Ordering::Relaxed)
            .min(self.state.max_gso_segments())
    }

    fn max_receive_segments(&self) -> usize {
        self.state.gro_segments()
    }

    fn may_fragment(&self) -> bool {
        self.state.may_fragment()
    }
}

#[cfg(target_os = "linux")]
/// One `sendmsg` of `transmit` with TOS byte `tos`, GSO segments and the
/// source address quinn chose, like quinn-udp's but with the whole TOS
/// byte. A would-block or interrupted send is returned as such.
fn send_marked(io: &tokio::net::UdpSocket, transmit: &Transmit<'_>, tos: u8) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrStorage};
    use std::os::fd::AsRawFd;

    let dest = transmit.destination;
    let to_v4 = match dest.ip() {
        IpAddr::V4(_) => true,
        IpAddr::V6(a) => a.to_ipv4_mapped().is_some(),
    };
    let tclass = i32::from(tos);
    let segment = transmit
        .segment_size
        .filter(|&s| s < transmit.contents.len())
        .map(|s| s as u16);
    let v4_info;
    let v6_info;
    let mut cmsgs = Vec::with_capacity(3);
    cmsgs.push(if to_v4 {
        ControlMessage::Ipv4Tos(&tos)
    } else {
        ControlMessage::Ipv6TClass(&tclass)
    });
    if let Some(s) = &segment {
        cmsgs.push(ControlMessage::UdpGsoSegments(s));
    }
    match transmit.src_ip {
        Some(IpAddr::V4(ip)) => {
            v4_info = nix::libc::in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: nix::libc::in_addr {
                    s_addr: u32::from_ne_bytes(ip.octets()),
                },
                ipi_addr: nix::libc::in_addr { s_addr: 0 },
            };
            cmsgs.push(ControlMessage::Ipv4PacketInfo(&v4_info));
        }
        Some(IpAddr::V6(ip)) => {
            v6_info = nix::libc::in6_pktinfo {
                ipi6_addr: nix::libc::in6_addr {
                    s6_addr: ip.octets(),
                },
                ipi6_ifindex: 0,
            };
            cmsgs.push(ControlMessage::Ipv6PacketInfo(&v6_info));
        }
        None => {}
    }
    let addr = SockaddrStorage::from(dest);
    let iov = [io::IoSlice::new(transmit.contents)];
    loop {
        match sendmsg(io.as_raw_fd(), &iov, &cmsgs, MsgFlags::empty(), Some(&addr)) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use nix::sys::socket::{
        recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags, SockaddrStorage,
    };
    use quinn::udp::EcnCodepoint;
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    #[test]
    fn the_authors_marks() {
        let m = DscpMarks::authors(3);
        // TOS 224 important; TOS 64, 32, 0 for levels 1, 2, 3.
        assert_eq!(tos(m.of_class(0), 0), 224);
        assert_eq!(
            [1, 2, 3].map(|c| tos(m.of_class(c), 0)),
            [64, 32, 0],
            "{m:?}"
        );
        let seven = DscpMarks::authors(7);
        assert_eq!(tos(seven.of_class(1), 0), 192);
        assert_eq!(tos(seven.of_class(7), 0), 0);
        assert_eq!(seven.invalid(), None);
        let bad = DscpMarks { important: 64, ..m };
        assert_eq!(bad.invalid(), Some(64));
        // ECN bits pass through under any DSCP.
        assert_eq!(tos(46, EcnCodepoint::Ect0 as u8), 46 << 2 | 0b10);
    }

    /// Reads one datagram and its TOS byte from a socket with IP_RECVTOS.
    fn recv_tos(socket: &std::net::UdpSocket) -> (usize, u8) {
        let mut buf = [0u8; 2048];
        let mut iov = [IoSliceMut::new(&mut buf)];
        let mut space = nix::cmsg_space!(i32);
        let msg = recvmsg::<SockaddrStorage>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::empty(),
        )
        .expect("recvmsg");
        let tos = msg
            .cmsgs()
            .expect("cmsgs")
            .find_map(|c| match c {
                ControlMessageOwned::Ipv4Tos(t) => Some(t),
                _ => None,
            })
            .expect("no tos received");
        (msg.bytes, tos)
    }

    #[tokio::test]
    async fn packets_leave_with_their_peers_mark_and_their_ecn() {
        let receiver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        receiver
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        setsockopt(&receiver, sockopt::IpRecvTos, &true).unwrap();
        let other = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        other
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        setsockopt(&other, sockopt::IpRecvTos, &true).unwrap();
        let peer = receiver.local_addr().unwrap();

        let registry = MarkRegistry::new(56);
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let marking = MarkingSocket::new(socket, registry.clone()).unwrap();
        let mark = registry.register(peer, DscpMarks::authors(3));
        mark.set_class(1);
        assert_eq!(mark.current(), 16);

        // A GSO batch of two 100-byte segments with ECT(0), marked level 1.
        let contents = [7u8; 200];
        marking.io.writable().await.unwrap();
        marking
            .try_send(&Transmit {
                destination: peer,
                ecn: Some(EcnCodepoint::Ect0),
                contents: &contents,
                segment_size: Some(100),
                src_ip: None,
            })
            .unwrap();
        // Level 3, no ECN.
        mark.set_class(3);
        marking.io.writable().await.unwrap();
        marking
            .try_send(&Transmit {
                destination: peer,
                ecn: None,
                contents: &contents[..50],
                segment_size: None,
                src_ip: None,
            })
            .unwrap();
        // An unregistered peer gets the registry's default.
        marking.io.writable().await.unwrap();
        marking
            .try_send(&Transmit {
                destination: other.local_addr().unwrap(),
                ecn: Some(EcnCodepoint::Ce),
                contents: &contents[..10],
                segment_size: None,
                src_ip: None,
            })
            .unwrap();

        assert_eq!(recv_tos(&receiver), (100, 64 | 0b10));
        assert_eq!(recv_tos(&receiver), (100, 64 | 0b10));
        assert_eq!(recv_tos(&receiver), (50, 0));
        assert_eq!(recv_tos(&other), (10, 224 | 0b11));

        let counts = marking.counts();
        assert_eq!(counts.packets[16], 2);
        assert_eq!(counts.bytes[16], 200);
        assert_eq!(counts.packets[0], 1);
        assert_eq!(counts.packets[56], 1);
        assert_eq!(counts.send_errors, 0);

        // Dropping the handle unregisters the peer: back to the default.
        drop(mark);
        assert_eq!(registry.dscp_for(&peer), 56);
    }
}
