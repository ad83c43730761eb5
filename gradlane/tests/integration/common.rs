//! Helpers shared by the integration tests: certificates, a quick
//! configuration, a connected pair of links, and groups of ranks.

use gradlane::{
    generate_certs, Config, Endpoint, Faults, Group, GroupConfig, Layout, Link, Rendezvous,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A fresh certificate directory for one test (a CA, and a server
/// certificate for localhost and 127.0.0.1). Numbered, because every
/// module's tests share this process and some share a tag.
pub fn cert_dir(tag: &str) -> PathBuf {
    static MADE: AtomicUsize = AtomicUsize::new(0);
    let n = MADE.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("gradlane-test-{tag}-{}-{n}", std::process::id()));
    generate_certs(&dir, &["localhost", "127.0.0.1"]).unwrap();
    dir
}

/// The default configuration with a short idle timeout, so that tests of a
/// vanished peer end quickly.
pub fn quick() -> Config {
    let mut c = Config::default();
    c.quic.max_idle_timeout = Some(Duration::from_secs(3));
    c.quic.keep_alive = Some(Duration::from_millis(500));
    c
}

/// A server endpoint on a free loopback port with the certificate in `dir`.
pub fn server(dir: &Path, config: Config) -> Endpoint {
    Endpoint::server(
        "127.0.0.1:0".parse().unwrap(),
        dir.join("server.pem"),
        dir.join("server.key"),
        config,
    )
    .unwrap()
}

/// A server and a connected client link, with certificates of their own;
/// the client's socket carries `faults`.
pub async fn pair(
    tag: &str,
    layout: &Layout,
    faults: Option<Faults>,
    config: Config,
) -> (Endpoint, Link, Endpoint, Link) {
    pair_in(&cert_dir(tag), layout, faults, config).await
}

/// [`pair`] with the certificates in `dir`.
///
/// At high loss a QUIC handshake can time out (quinn's idle timeout runs
/// during the handshake too) and the server then waits on for the next
/// client: the pair is tried up to five times. What these tests test
/// comes after the handshake.
pub async fn pair_in(
    dir: &Path,
    layout: &Layout,
    faults: Option<Faults>,
    config: Config,
) -> (Endpoint, Link, Endpoint, Link) {
    let server = server(dir, config.clone());
    let addr = server.local_addr().unwrap();
    let client = Endpoint::client(dir.join("ca.pem"), Config { faults, ..config }).unwrap();
    for _ in 0..5 {
        let failed = tokio::sync::Notify::new();
        let accept = async {
            tokio::select! {
                s = server.accept() => s.and_then(Result::ok),
                _ = failed.notified() => None,
            }
        };
        let connect = async {
            let c = client.connect(addr, "localhost", layout).await;
            if c.is_err() {
                failed.notify_one();
            }
            c.ok()
        };
        if let (Some(s), Some(c)) = tokio::join!(accept, connect) {
            return (server, s, client, c);
        }
    }
    panic!("no link in five attempts");
}

/// Whether two slices hold the same values bit for bit.
pub fn bit_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// How many packets the kernel has dropped at the UDP socket bound to
/// `addr` (an IPv4 one), for want of room in its receive buffer: the
/// `drops` column of `/proc/net/udp`. `None` where that cannot be read.
/// On a loaded machine a receiver starved of CPU lets its buffer fill, and
/// what the kernel drops there never reaches quinn, with no loss injected.
pub fn kernel_receive_drops(addr: SocketAddr) -> Option<u64> {
    let SocketAddr::V4(v4) = addr else {
        return None;
    };
    let local = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(v4.ip().octets()),
        v4.port()
    );
    let table = std::fs::read_to_string("/proc/net/udp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&local.as_str()))
            .then(|| fields.last()?.parse().ok())
            .flatten()
    })
}

/// A loopback port free a moment ago, for a rank to listen on.
pub fn free_port() -> SocketAddr {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap()
}

/// A rank's configuration with the certificates in `dir`, `quick()` links,
/// a 20 s join timeout and one socket (one path per peer, whatever the
/// host's cores: the tests of more paths ask for them).
pub fn group_config(dir: &Path, rank: usize, world: usize, rendezvous: Rendezvous) -> GroupConfig {
    let mut c = GroupConfig::new(
        rank,
        world,
        rendezvous,
        dir.join("server.pem"),
        dir.join("server.key"),
        dir.join("ca.pem"),
    );
    c.link = quick();
    c.join_timeout = Duration::from_secs(20);
    c.sockets = 1;
    c
}

/// Rank 0's address as the meeting point; the others listen on any port.
pub fn at_root(root: SocketAddr) -> Rendezvous {
    Rendezvous::Root {
        root,
        listen: "127.0.0.1:0".parse().unwrap(),
    }
}

/// `world` ranks of one group, as tasks of this runtime, meeting at rank
/// 0; `link(rank)` changes each rank's link settings.
pub async fn group_with(
    tag: &str,
    world: usize,
    link: impl Fn(usize, Config) -> Config,
) -> Vec<Group> {
    let dir = cert_dir(tag);
    let root = free_port();
    let joins = (0..world).map(|r| {
        let mut c = group_config(&dir, r, world, at_root(root));
        c.link = link(r, c.link.clone());
        Group::join(c)
    });
    futures_util::future::join_all(joins)
        .await
        .into_iter()
        .map(|g| g.unwrap())
        .collect()
}

/// Every group's allreduce of its buffer at once; each must succeed.
pub async fn allreduce_all<T: gradlane::Element>(
    groups: &mut [Group],
    bufs: &mut [Vec<T>],
    op: gradlane::ReduceOp,
) {
    let calls = groups
        .iter_mut()
        .zip(bufs.iter_mut())
        .map(|(g, b)| g.allreduce(b, op));
    for r in futures_util::future::join_all(calls).await {
        r.unwrap();
    }
}

/// The bytes `g` has sent less those its connections declared lost:
/// quinn's UDP counter counts a packet and its retransmission both, and
/// on a loaded machine loopback drops packets at a full receive buffer.
/// Tests that compare the bytes a collective sends use this.
pub fn bytes_not_lost(g: &Group) -> u64 {
    (0..g.world())
        .flat_map(|r| g.path_connections(r))
        .map(|c| {
            let stats = c.stats();
            stats.udp_tx.bytes - stats.path.lost_bytes
        })
        .sum()
}
