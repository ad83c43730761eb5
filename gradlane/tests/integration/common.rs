//! Helpers shared by the integration tests: certificates, a quick
//! configuration, a connected pair of links, groups of ranks, and the
//! values and local references the collectives are checked against.

use gradlane::{
    generate_certs, BucketId, BucketOptions, Config, Element, Endpoint, Faults, Group, GroupConfig,
    Layout, Link, LossyCarrier, Rendezvous, TensorSpec,
};
use gradlane_core::rng::SplitMix64;
use std::net::SocketAddr;
use std::ops::Range;
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
/// 0; `change(rank, config)` changes each rank's configuration first.
pub async fn group_configured(
    tag: &str,
    world: usize,
    change: impl Fn(usize, GroupConfig) -> GroupConfig,
) -> Vec<Group> {
    let dir = cert_dir(tag);
    let root = free_port();
    join_ranks((0..world).map(|r| change(r, group_config(&dir, r, world, at_root(root))))).await
}

/// [`group_configured`] changing only the link settings: `link(rank)`.
pub async fn group_with(
    tag: &str,
    world: usize,
    link: impl Fn(usize, Config) -> Config,
) -> Vec<Group> {
    group_configured(tag, world, |r, c| GroupConfig {
        link: link(r, c.link.clone()),
        ..c
    })
    .await
}

/// A rank of each configuration, all joining at once; each must join.
pub async fn join_ranks(configs: impl IntoIterator<Item = GroupConfig>) -> Vec<Group> {
    futures_util::future::join_all(configs.into_iter().map(Group::join))
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

/// One differentiated allreduce of bucket `id` on every rank, each of its
/// input: the buffers after it and the reports.
pub async fn differentiated<T: Element>(
    groups: &mut [Group],
    id: BucketId,
    inputs: &[Vec<T>],
    op: gradlane::ReduceOp,
) -> (Vec<Vec<T>>, Vec<gradlane::AllreduceReport>) {
    let mut bufs = inputs.to_vec();
    let calls = groups
        .iter_mut()
        .zip(bufs.iter_mut())
        .map(|(g, b)| g.allreduce_differentiated(id, b, op));
    let reports = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    (bufs, reports)
}

/// `layout` registered on every rank with `options`: its id, the same on
/// every rank.
pub async fn register_all(
    groups: &mut [Group],
    layout: &Layout,
    options: BucketOptions,
) -> BucketId {
    let calls = groups
        .iter_mut()
        .map(|g| g.register_bucket_with(layout, options));
    let ids: Vec<BucketId> = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert!(ids.iter().all(|&i| i == ids[0]), "bucket ids {ids:?}");
    ids[0]
}

/// A bucket like a small CNN's: conv kernels, biases, a linear layer.
pub fn bucket() -> Layout {
    Layout::new(vec![
        TensorSpec::conv2d("conv1.weight", [32, 16, 3, 3]),
        TensorSpec::dense("conv1.bias", [32]),
        TensorSpec::conv2d("conv2.weight", [64, 32, 3, 3]),
        TensorSpec::dense("fc.weight", [10, 4096]),
        TensorSpec::dense("fc.bias", [10]),
    ])
    .unwrap()
}

/// Whether value `i` is in one of `ranges`.
pub fn inside(ranges: &[Range<usize>], i: usize) -> bool {
    ranges.iter().any(|r| r.contains(&i))
}

/// Each rank drops a share `p` of what it sends, its draws seeded with
/// `seed` plus its rank, so every packet between two ranks meets loss `p`
/// once (dropping on receipt too would make it 1-(1-p)^2). At 20% loss
/// handshakes and retransmissions back off for seconds: these links allow
/// 15 s of silence, not quick()'s 3 s. The lossy part always rides
/// datagrams: the adaptive carrier would put a round on streams (and lose
/// nothing) until quinn has declared a loss. Packets stay Ethernet-sized:
/// [`bucket`] (256 KB) fills only a few 64 KB packets, and the seeded draws
/// must meet many packets.
pub fn lossy(p: f64, seed: u64) -> impl Fn(usize, Config) -> Config {
    move |rank, mut c| {
        c.packets = gradlane::Packets::Ethernet;
        c.quic.max_idle_timeout = Some(Duration::from_secs(15));
        if p > 0.0 {
            c.timing.lossy_carrier = LossyCarrier::Datagrams;
        }
        c.faults = (p > 0.0).then(|| Faults {
            loss_out: p,
            seed: seed + rank as u64,
            ..Faults::default()
        });
        c
    }
}

/// Deterministic values from `seed`, with fractions and signs so that the
/// order of a sum shows in its bits.
pub fn values_from(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|_| (rng.next_f64() as f32 - 0.5) * 1000.0)
        .collect()
}

/// Each value's bits, to compare buffers bit for bit.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The sum element by element in rank order from the first rank's value,
/// as the owner of a shard adds.
pub fn reference_sum<P: AsRef<[f32]>>(parts: &[P]) -> Vec<f32> {
    let mut acc = parts[0].as_ref().to_vec();
    for p in &parts[1..] {
        acc.iter_mut().zip(p.as_ref()).for_each(|(a, v)| *a += v);
    }
    acc
}

/// The sum element by element in rank order from 0.0: the bits of
/// [`reference_sum`] but where the first rank's value is -0.0, which
/// 0.0 + -0.0 makes +0.0.
pub fn reference_sum_from_zero(parts: &[Vec<f32>]) -> Vec<f32> {
    let n = parts[0].len();
    (0..n)
        .map(|i| parts.iter().fold(0f32, |acc, p| acc + p[i]))
        .collect()
}

/// Asserts two buffers hold the same bits, naming the first differences.
#[track_caller]
pub fn same_bits<T: Element>(a: &[T], b: &[T], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let diff: Vec<(usize, T, T)> = (0..a.len())
        .filter(|&i| bytemuck::bytes_of(&a[i]) != bytemuck::bytes_of(&b[i]))
        .map(|i| (i, a[i], b[i]))
        .collect();
    assert!(
        diff.is_empty(),
        "{what}: {} of {} values differ, first {:?}",
        diff.len(),
        a.len(),
        &diff[..diff.len().min(5)]
    );
}

/// A barrier on every group at once; each must pass it.
pub async fn barrier_all(groups: &mut [Group]) {
    let barriers = groups.iter_mut().map(|g| g.barrier());
    for r in futures_util::future::join_all(barriers).await {
        r.unwrap();
    }
}
