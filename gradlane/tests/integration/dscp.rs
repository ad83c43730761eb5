//! DSCP marks on the wire: a link whose endpoints mark packets by class,
//! through a UDP relay that reads the TOS byte of every packet it forwards.
#![cfg(target_os = "linux")]

use crate::common;

use gradlane::generate_certs;
use gradlane::ConfigError;
use gradlane::DscpMarks;
use gradlane::{Config, Endpoint, SetupError};
use gradlane::{Layout, TensorSpec};
use nix::sys::socket::{
    recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags, SockaddrStorage,
};
use std::io::IoSliceMut;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Distinct from one another and from 0, so an unmarked packet shows.
const MARKS: DscpMarks = DscpMarks {
    important: 46,
    lossy: [34, 26, 18, 10, 10, 10, 10],
};

/// A packet the relay forwarded: toward the server or not, DSCP, length.
type Seen = (bool, u8, usize);

/// Forwards UDP between one client and a server, recording what it saw.
struct Relay {
    front: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

fn tos_socket() -> UdpSocket {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
    // A whole test round fits: the relay must not be where packets drop.
    s.set_recv_buffer_size(4 << 20).unwrap();
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let s: UdpSocket = s.into();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    setsockopt(&s, sockopt::IpRecvTos, &true).unwrap();
    s
}

/// One datagram, its sender and its TOS byte; `None` on timeout.
fn recv(socket: &UdpSocket, buf: &mut [u8]) -> Option<(usize, SocketAddr, u8)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!(i32);
    let msg = recvmsg::<SockaddrStorage>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::empty(),
    )
    .ok()?;
    let tos = msg.cmsgs().ok()?.find_map(|c| match c {
        ControlMessageOwned::Ipv4Tos(t) => Some(t),
        _ => None,
    })?;
    let from = msg
        .address?
        .as_sockaddr_in()
        .map(|a| SocketAddr::from(*a))?;
    Some((msg.bytes, from, tos))
}

impl Relay {
    fn start(server: SocketAddr) -> Self {
        let (front, back) = (Arc::new(tos_socket()), Arc::new(tos_socket()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let client = Arc::new(Mutex::new(None::<SocketAddr>));
        let pump = |from: Arc<UdpSocket>, to: Arc<UdpSocket>, toward_server: bool| {
            let (seen, stop, client) = (seen.clone(), stop.clone(), client.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                while !stop.load(Ordering::Relaxed) {
                    let Some((n, src, tos)) = recv(&from, &mut buf) else {
                        continue;
                    };
                    seen.lock().unwrap().push((toward_server, tos >> 2, n));
                    let dest = if toward_server {
                        *client.lock().unwrap() = Some(src);
                        Some(server)
                    } else {
                        *client.lock().unwrap()
                    };
                    if let Some(dest) = dest {
                        let _ = to.send_to(&buf[..n], dest);
                    }
                }
            })
        };
        let threads = vec![
            pump(front.clone(), back.clone(), true),
            pump(back.clone(), front.clone(), false),
        ];
        Self {
            front: front.local_addr().unwrap(),
            seen,
            stop,
            threads,
        }
    }

    fn stop(self) -> Vec<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        Arc::try_unwrap(self.seen).unwrap().into_inner().unwrap()
    }
}

/// Dense tensors only, in whole 1 KiB chunks: a datagram at the 1200-byte
/// floor holds one chunk, and no packet of loopback's 1452 bytes two, so
/// every datagram is a packet of its own.
fn layout() -> Layout {
    Layout::new(vec![
        TensorSpec::dense("fc.weight", [256, 512]),
        TensorSpec::dense("fc.bias", [1024]),
    ])
    .unwrap()
}

/// Each lossy level's datagrams leave marked with that level's DSCP, and
/// everything else, both ways, with the important one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_class_leaves_with_its_own_mark() {
    let dir = std::env::temp_dir().join(format!("gradlane-dscp-{}", std::process::id()));
    generate_certs(&dir, &["localhost"]).unwrap();
    // Ethernet-sized packets: a larger one would carry several datagrams.
    let config = Config {
        dscp: Some(MARKS),
        packets: gradlane::Packets::Ethernet,
        ..Config::default()
    };
    let server = common::server(&dir, config.clone());
    let relay = Relay::start(server.local_addr().unwrap());
    let client = Endpoint::client(dir.join("ca.pem"), config).unwrap();
    let layout = layout();
    let (s, c) = tokio::join!(
        server.accept(),
        client.connect(relay.front, "localhost", &layout)
    );
    let (mut s, mut c) = (s.unwrap().unwrap(), c.unwrap());

    let mut important = 0u64;
    let mut datagrams = [0u64; 3];
    for r in 0..3u32 {
        let grads = gradlane::presets::gradients(&layout, 7 + u64::from(r));
        let (report, round) =
            tokio::join!(c.sender().send_round(r, &grads), s.receiver().recv_round());
        let (report, round) = (report.unwrap(), round.unwrap());
        // Marks class packets by time: the lossy part goes as datagrams,
        // even on this lossless path.
        assert!(!report.lossy_on_stream);
        let stats = &round.stats;
        assert_eq!(stats.classes[0].received_bytes, report.important_bytes);
        for l in 1..=3 {
            assert_eq!(stats.classes[l].zero_filled_bytes, 0, "round {r} level {l}");
            datagrams[l - 1] += report.lossy_packets[l - 1];
        }
        important += report.important_bytes;
    }
    c.close_now();
    let sent = client.marked_counts().unwrap();
    let server_sent = server.marked_counts().unwrap();
    let seen = relay.stop();

    let count = |toward: bool, dscp: u8| {
        let it = seen.iter().filter(|&&(t, d, _)| t == toward && d == dscp);
        it.fold((0u64, 0u64), |(p, b), &(_, _, n)| (p + 1, b + n as u64))
    };
    // Only the configured marks, and every class present.
    let known = [46, 34, 26, 18];
    for &(toward, dscp, _) in &seen {
        assert!(known.contains(&dscp), "dscp {dscp} toward server {toward}");
    }
    assert!(datagrams.iter().all(|&d| d > 0), "{datagrams:?}");
    for (l, &d) in datagrams.iter().enumerate() {
        let dscp = MARKS.lossy[l];
        let (packets, _) = count(true, dscp);
        // One datagram per packet (see `layout`): each level's datagrams
        // in packets carrying its mark, on the wire and in the socket's
        // count. The mark moves on once quinn's datagram queue is empty,
        // which is when the last datagrams are packed, not sent: on a
        // loaded host one or two of them leave under the next mark.
        assert!(
            packets + 2 >= d,
            "level {}: {packets} packets for {d} datagrams",
            l + 1
        );
        assert!(sent.packets[usize::from(dscp)] + 2 >= d);
        // A packet with that mark is a datagram of that level (or, now
        // and then, an acknowledgement sent meanwhile).
        assert!(
            packets <= d + d / 10 + 8,
            "level {}: {packets} packets",
            l + 1
        );
    }
    let (_, important_wire) = count(true, MARKS.important);
    assert!(
        important_wire >= important,
        "{important_wire} < {important}"
    );
    // The receiving end sends no round: everything it sends is important.
    let to_client: Vec<_> = seen.iter().filter(|s| !s.0).collect();
    assert!(!to_client.is_empty());
    assert!(to_client.iter().all(|s| s.1 == MARKS.important));
    assert_eq!(
        server_sent.packets.iter().sum::<u64>(),
        server_sent.packets[usize::from(MARKS.important)]
    );
    assert_eq!(sent.send_errors + server_sent.send_errors, 0);
}

#[tokio::test]
async fn a_mark_above_six_bits_is_refused() {
    let config = Config {
        dscp: Some(DscpMarks {
            important: 64,
            ..MARKS
        }),
        ..Config::default()
    };
    let dir = std::env::temp_dir().join(format!("gradlane-dscp-bad-{}", std::process::id()));
    generate_certs(&dir, &["localhost"]).unwrap();
    let err = Endpoint::client(dir.join("ca.pem"), config).unwrap_err();
    assert!(
        matches!(err, SetupError::Config(ConfigError::Dscp(64))),
        "{err}"
    );
    assert!(err.to_string().contains("dscp 64"), "{err}");
}
