//! The transport shell over real quinn on 127.0.0.1: certificates, tuning and
//! fault injection together.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, Packets, JUMBO_UDP_PAYLOAD};
use crate::socket::faults::{Faults, FaultySocket};
use crate::stack::Stack;
use crate::tls::{self, generate_certs, CertFiles};
use crate::tuning::Tuning;
use tokio::time::timeout;

/// A directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let dir = std::env::temp_dir().join(format!(
            "gradlane-test-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn certs(dir: &Path) -> CertFiles {
    generate_certs(dir, &["localhost", "127.0.0.1"]).expect("generate certs")
}

const LOCAL: &str = "127.0.0.1:0";
const STEP: Duration = Duration::from_secs(20);

struct Pair {
    server: quinn::Endpoint,
    client: quinn::Endpoint,
    server_faults: Option<Arc<FaultySocket>>,
    client_faults: Option<Arc<FaultySocket>>,
    client_config: quinn::ClientConfig,
}

fn pair(
    files: &CertFiles,
    trusted_ca: &Path,
    server_faults: Option<Faults>,
    client_faults: Option<Faults>,
) -> Pair {
    pair_tuned(
        files,
        trusted_ca,
        server_faults,
        client_faults,
        &Tuning::default(),
    )
}

fn pair_tuned(
    files: &CertFiles,
    trusted_ca: &Path,
    server_faults: Option<Faults>,
    client_faults: Option<Faults>,
    tuning: &Tuning,
) -> Pair {
    let local: SocketAddr = LOCAL.parse().expect("addr");
    let server_config =
        tls::server_config(&files.server_cert, &files.server_key).expect("server config");
    let server = Stack::bind(local, Some(server_config), tuning, server_faults).expect("server");
    let client = Stack::bind(local, None, tuning, client_faults).expect("client");
    let client_config = tuning
        .client_config(tls::client_config(trusted_ca).expect("client config"))
        .expect("tuning");
    Pair {
        server: server.quinn,
        client: client.quinn,
        server_faults: server.faults,
        client_faults: client.faults,
        client_config,
    }
}

impl Pair {
    /// Connect; returns (client side, server side).
    async fn connect(
        &self,
    ) -> Result<(quinn::Connection, quinn::Connection), quinn::ConnectionError> {
        let addr = self.server.local_addr().expect("server addr");
        let connecting = self
            .client
            .connect_with(self.client_config.clone(), addr, "localhost")
            .expect("connect call");
        let server = self.server.clone();
        let accept = tokio::spawn(async move {
            let incoming = server.accept().await?;
            incoming.await.ok()
        });
        let client = timeout(STEP, connecting)
            .await
            .expect("handshake timed out")?;
        let server = timeout(STEP, accept)
            .await
            .expect("accept timed out")
            .expect("accept task")
            .expect("server side of the connection");
        Ok((client, server))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_ca_connects_and_exchanges_stream_and_datagram() {
    let dir = TempDir::new("ok");
    let files = certs(&dir.0);
    let pair = pair(&files, &files.ca_cert, None, None);
    let (client, server) = pair.connect().await.expect("handshake");
    assert_eq!(
        client
            .handshake_data()
            .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
            .and_then(|d| d.protocol),
        Some(tls::ALPN.to_vec())
    );

    // Stream: request, echo with a prefix.
    let echo = tokio::spawn(async move {
        let (mut send, mut recv) = server.accept_bi().await.expect("accept_bi");
        let msg = recv.read_to_end(1 << 20).await.expect("read request");
        send.write_all(b"echo:").await.expect("write");
        send.write_all(&msg).await.expect("write");
        send.finish().expect("finish");
        let dgram = server.read_datagram().await.expect("datagram");
        server.send_datagram(dgram).expect("send datagram");
        // Keep the connection open until the client has read everything.
        server.closed().await;
    });
    let (mut send, mut recv) = client.open_bi().await.expect("open_bi");
    send.write_all(b"hello gradlane").await.expect("write");
    send.finish().expect("finish");
    let reply = timeout(STEP, recv.read_to_end(1 << 20))
        .await
        .expect("reply timed out")
        .expect("read reply");
    assert_eq!(reply, b"echo:hello gradlane");

    assert!(client.max_datagram_size().is_some(), "datagrams negotiated");
    client
        .send_datagram(bytes::Bytes::from_static(b"dgram"))
        .expect("send datagram");
    let back = timeout(STEP, client.read_datagram())
        .await
        .expect("datagram timed out")
        .expect("read datagram");
    assert_eq!(&back[..], b"dgram");
    client.close(0u32.into(), b"done");
    timeout(STEP, echo)
        .await
        .expect("server task")
        .expect("join");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_fails_with_certificate_error() {
    let dir = TempDir::new("wrongca");
    let files = certs(&dir.0.join("real"));
    let other = certs(&dir.0.join("other"));
    let pair = pair(&files, &other.ca_cert, None, None);
    let err = pair.connect().await.expect_err("must not trust another CA");
    let text = err.to_string();
    match &err {
        quinn::ConnectionError::TransportError(e) => {
            // TLS alerts travel as QUIC CRYPTO_ERROR codes 0x100..=0x1ff.
            let code = u64::from(e.code);
            assert!((0x100..0x200).contains(&code), "crypto error, got {e:?}");
        }
        other => panic!("expected a TLS transport error, got {other:?}"),
    }
    assert!(
        text.contains("invalid peer certificate") && text.contains("UnknownIssuer"),
        "{text}"
    );
}

#[test]
fn tls_errors_name_the_file() {
    let dir = TempDir::new("errors");
    let missing = dir.0.join("nope.pem");
    let err = tls::client_config(&missing).expect_err("missing");
    assert_eq!(
        err.to_string(),
        format!("missing file {}", missing.display())
    );

    let empty = dir.0.join("empty.pem");
    std::fs::write(&empty, "not pem at all\n").expect("write");
    let err = tls::client_config(&empty).expect_err("no cert");
    assert_eq!(
        err.to_string(),
        format!("no certificate in {}", empty.display())
    );

    let files = certs(&dir.0);
    let err = tls::server_config(&files.server_cert, &files.server_cert).expect_err("no key");
    assert_eq!(
        err.to_string(),
        format!("no private key in {}", files.server_cert.display())
    );
    // A key that does not match the certificate.
    let err = tls::server_config(&files.server_cert, &files.ca_key).expect_err("mismatch");
    assert!(
        err.to_string().starts_with("bad certificate or key in"),
        "{err}"
    );

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for key in [&files.ca_key, &files.server_key] {
            let mode = std::fs::metadata(key).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", key.display());
        }
    }
    assert!(generate_certs(&dir.0, &["bad name!"]).is_err());
    assert!(tls::generate_certs::<&str>(&dir.0, &[]).is_err());
}

/// Write `data` on a fresh uni stream and read it back on the other side.
async fn transfer(from: &quinn::Connection, to: &quinn::Connection, data: Arc<Vec<u8>>) -> Vec<u8> {
    let to = to.clone();
    let reader = tokio::spawn(async move {
        let mut recv = to.accept_uni().await.expect("accept_uni");
        recv.read_to_end(usize::MAX).await.expect("read_to_end")
    });
    let mut send = from.open_uni().await.expect("open_uni");
    send.write_all(&data).await.expect("write_all");
    send.finish().expect("finish");
    reader.await.expect("reader task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliable_transfer_survives_twenty_percent_loss() {
    let dir = TempDir::new("loss");
    let files = certs(&dir.0);
    let pair = pair(
        &files,
        &files.ca_cert,
        Some(Faults::symmetric_loss(0.2, 1)),
        Some(Faults::symmetric_loss(0.2, 2)),
    );
    let (client, server) = timeout(Duration::from_secs(60), pair.connect())
        .await
        .expect("handshake under loss timed out")
        .expect("handshake under loss");
    let data: Arc<Vec<u8>> = Arc::new(
        (0..1_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect(),
    );
    let got = timeout(
        Duration::from_secs(120),
        transfer(&client, &server, data.clone()),
    )
    .await
    .expect("transfer under loss timed out");
    assert!(got == *data, "bit-exact");
    for side in [&pair.client_faults, &pair.server_faults] {
        let stats = side.as_ref().expect("faulty socket").stats();
        eprintln!("{stats:?}");
        assert!(stats.segments_dropped_out > 0, "{stats:?}");
        assert!(stats.datagrams_dropped_in > 0, "{stats:?}");
        let out = stats.segments_dropped_out as f64
            / (stats.segments_dropped_out + stats.segments_sent) as f64;
        assert!((0.1..0.3).contains(&out), "drop fraction {out}: {stats:?}");
    }
    assert!(client.stats().path.lost_packets > 0);
    // GSO survives the wrapper: where the kernel offers it, the sender's
    // transmits carry several datagrams each.
    let sender = pair.client_faults.as_ref().expect("faulty socket");
    if quinn::AsyncUdpSocket::max_transmit_segments(&**sender) > 1 {
        let stats = sender.stats();
        assert!(stats.segments_sent > stats.transmits_sent, "{stats:?}");
    }
}

/// Smoothed RTT after a few stream round trips.
async fn rtt_after_ping_pong(pair: &Pair) -> Duration {
    let (client, server) = pair.connect().await.expect("handshake");
    let echo = tokio::spawn(async move {
        while let Ok((mut send, mut recv)) = server.accept_bi().await {
            let msg = recv.read_to_end(1024).await.expect("read");
            send.write_all(&msg).await.expect("write");
            send.finish().expect("finish");
        }
    });
    for _ in 0..10 {
        let (mut send, mut recv) = client.open_bi().await.expect("open_bi");
        send.write_all(b"ping").await.expect("write");
        send.finish().expect("finish");
        let pong = timeout(STEP, recv.read_to_end(1024))
            .await
            .expect("pong timed out")
            .expect("pong");
        assert_eq!(pong, b"ping");
    }
    let rtt = client.rtt();
    client.close(0u32.into(), b"done");
    let _ = timeout(STEP, echo).await;
    rtt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_raises_rtt() {
    let dir = TempDir::new("delay");
    let files = certs(&dir.0);
    let plain = rtt_after_ping_pong(&pair(&files, &files.ca_cert, None, None)).await;
    let delay = Duration::from_millis(20);
    let faults = Faults {
        delay,
        ..Faults::default()
    };
    let delayed_pair = pair(&files, &files.ca_cert, None, Some(faults));
    let delayed = rtt_after_ping_pong(&delayed_pair).await;
    let stats = delayed_pair.client_faults.as_ref().expect("faulty").stats();
    eprintln!("rtt without delay {plain:?}, with {delay:?} delay {delayed:?}; {stats:?}");
    assert!(stats.segments_delayed > 0);
    // Every client packet waits 20 ms, so every RTT sample does: a hard floor.
    // The ceiling allows for a loaded 2-core machine.
    assert!(
        delayed >= delay && delayed < plain + delay * 5,
        "rtt with {delay:?} delay: {delayed:?} (without: {plain:?})"
    );
    assert!(delayed > plain, "plain {plain:?}, delayed {delayed:?}");
}

/// Jumbo packets on loopback (MTU 65536), three ways of getting them: MTU
/// discovery up to 8952 bytes from the 1200-byte floor, a path known to
/// carry them (`Tuning::jumbo`), and discovery up to what loopback carries
/// (64 KB packets, one per send). The bulk of a transfer travels in packets
/// that size, with nothing lost. quinn batches 10 packets per GSO send, 89
/// KB at 8952 bytes, which the kernel refuses and quinn-udp drops without a
/// word: without `BatchingSocket` discovery lost packets, declared a black
/// hole and fell back to 1200-byte packets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jumbo_packets_cross_loopback_without_loss() {
    let dir = TempDir::new("jumbo");
    let files = certs(&dir.0);
    let discovered = Tuning {
        max_udp_payload: JUMBO_UDP_PAYLOAD,
        route_ceiling: false,
        ..Tuning::default()
    };
    let lo = "127.0.0.1:9".parse().expect("addr");
    let loopback = Tuning {
        max_udp_payload: Tuning::default().mtu_ceiling(Some(lo)),
        route_ceiling: false,
        ..Tuning::default()
    };
    assert!(loopback.max_udp_payload > 60_000, "{loopback:?}");
    for tuning in [discovered, jumbo(), loopback] {
        // No faults injected: the wrappers are there for their counters.
        let pair = pair_tuned(
            &files,
            &files.ca_cert,
            Some(Faults::default()),
            Some(Faults::default()),
            &tuning,
        );
        let (client, server) = pair.connect().await.expect("handshake");
        let data: Arc<Vec<u8>> = Arc::new((0..32_000_000u32).map(|i| (i % 251) as u8).collect());
        for _ in 0..2 {
            let got = timeout(STEP, transfer(&client, &server, data.clone()))
                .await
                .expect("transfer timed out");
            assert!(got == *data, "bit-exact");
        }
        let stats = client.stats();
        eprintln!("{tuning:?}: {:?} {:?}", stats.path, stats.udp_tx);
        assert_eq!(stats.path.black_holes_detected, 0, "{:?}", stats.path);
        assert_eq!(stats.path.lost_packets, 0, "{:?}", stats.path);
        assert_eq!(stats.path.current_mtu, tuning.max_udp_payload);
        let mean = stats.udp_tx.bytes / stats.udp_tx.datagrams.max(1);
        assert!(mean > 4000, "mean packet {mean} bytes: {:?}", stats.udp_tx);
        // And the packets still leave in GSO batches, where the kernel
        // offers them and more than one fits a send.
        let sender = pair.client_faults.as_ref().expect("faulty socket");
        let batches = tuning.max_udp_payload < 30_000;
        if batches && quinn::AsyncUdpSocket::max_transmit_segments(&**sender) > 1 {
            let stats = sender.stats();
            assert!(stats.segments_sent > stats.transmits_sent, "{stats:?}");
        }
    }
}

fn jumbo() -> Tuning {
    Config {
        packets: Packets::Jumbo,
        ..Config::default()
    }
    .tuning()
}
