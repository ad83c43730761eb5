use super::*;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::task::Waker;

/// Records what is sent; serves queued receive buffers.
#[derive(Debug, Default)]
struct MockSocket {
    sent: Mutex<Vec<(Vec<u8>, Option<usize>)>>,
    inbox: Mutex<Vec<(Vec<u8>, usize)>>,
    would_block: AtomicU64,
    /// Sends to refuse with another error (a full shaped queue).
    refuse: AtomicU64,
    sent_notify: tokio::sync::Notify,
}

fn addr() -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4433))
}

#[derive(Debug)]
struct ReadyPoller;
impl UdpPoller for ReadyPoller {
    fn poll_writable(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncUdpSocket for MockSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(ReadyPoller)
    }
    fn try_send(&self, t: &Transmit<'_>) -> io::Result<()> {
        if self.would_block.load(Ordering::Relaxed) > 0 {
            self.would_block.fetch_sub(1, Ordering::Relaxed);
            return Err(io::ErrorKind::WouldBlock.into());
        }
        if self.refuse.load(Ordering::Relaxed) > 0 {
            self.refuse.fetch_sub(1, Ordering::Relaxed);
            self.sent_notify.notify_one();
            return Err(io::Error::other("no buffer space available"));
        }
        lock(&self.sent).push((t.contents.to_vec(), t.segment_size));
        self.sent_notify.notify_one();
        Ok(())
    }
    fn poll_recv(
        &self,
        _: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let mut inbox = lock(&self.inbox);
        if inbox.is_empty() {
            return Poll::Pending;
        }
        let n = inbox.len().min(bufs.len());
        for (i, (data, stride)) in inbox.drain(..n).enumerate() {
            bufs[i][..data.len()].copy_from_slice(&data);
            meta[i] = RecvMeta {
                addr: addr(),
                len: data.len(),
                stride,
                ecn: None,
                dst_ip: None,
            };
        }
        Poll::Ready(Ok(n))
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(addr())
    }
    fn max_transmit_segments(&self) -> usize {
        7
    }
    fn max_receive_segments(&self) -> usize {
        5
    }
    fn may_fragment(&self) -> bool {
        false
    }
}

fn transmit(contents: &[u8], segment_size: Option<usize>) -> Transmit<'_> {
    Transmit {
        destination: addr(),
        ecn: None,
        contents,
        segment_size,
        src_ip: None,
    }
}

/// Send `n` one-datagram transmits carrying their index; return the
/// indices that got through.
fn survivors(faults: Faults, n: u32) -> (Vec<u32>, FaultStats) {
    let mock = Arc::new(MockSocket::default());
    let socket = FaultySocket::new(mock.clone(), faults).expect("valid faults");
    for i in 0..n {
        let bytes = i.to_le_bytes();
        socket.try_send(&transmit(&bytes, None)).expect("mock send");
    }
    (sent_tags(&mock), socket.stats())
}

#[test]
fn forwards_socket_capabilities() {
    let socket = FaultySocket::new(Arc::new(MockSocket::default()), Faults::default())
        .expect("valid faults");
    assert_eq!(socket.max_transmit_segments(), 7);
    assert_eq!(socket.max_receive_segments(), 5);
    assert!(!socket.may_fragment());
    assert_eq!(socket.local_addr().expect("addr"), addr());
}

#[test]
fn rejects_bad_probability() {
    for p in [-0.1, 1.5, f64::NAN] {
        let r = FaultySocket::new(
            Arc::new(MockSocket::default()),
            Faults::symmetric_loss(p, 1),
        );
        assert!(matches!(r, Err(FaultySocketError::BadLoss(_))), "{p}");
    }
}

#[test]
fn drop_fraction_is_close_to_p_and_reproducible() {
    let n = 100_000;
    for p in [0.01, 0.2, 0.5] {
        let faults = Faults::symmetric_loss(p, 42);
        let (a, stats) = survivors(faults, n);
        let (b, _) = survivors(faults, n);
        assert_eq!(a, b, "same seed, same packets, same drops");
        let dropped = f64::from(n - a.len() as u32) / f64::from(n);
        assert!((dropped - p).abs() < 0.01, "p {p}: dropped {dropped}");
        assert_eq!(
            stats.segments_dropped_out + stats.segments_sent,
            u64::from(n)
        );
        assert_eq!(stats.segments_sent, a.len() as u64);
        // Order is kept.
        assert!(a.windows(2).all(|w| w[0] < w[1]));
    }
    let (c, _) = survivors(Faults::symmetric_loss(0.2, 43), n);
    let (d, _) = survivors(Faults::symmetric_loss(0.2, 42), n);
    assert_ne!(c, d, "another seed drops other packets");
}

#[test]
fn no_loss_passes_everything() {
    let (sent, stats) = survivors(Faults::default(), 1000);
    assert_eq!(sent, (0..1000).collect::<Vec<_>>());
    assert_eq!(stats.segments_dropped_out, 0);
    assert_eq!(stats.transmits_sent, 1000);
}

#[test]
fn full_loss_drops_everything_and_reports_success() {
    let (sent, stats) = survivors(Faults::symmetric_loss(1.0, 7), 100);
    assert!(sent.is_empty());
    assert_eq!(stats.segments_dropped_out, 100);
}

/// A GSO transmit of 10 segments of 100 bytes plus a short 37-byte one:
/// survivors are re-packed in order with the same segment size.
#[test]
fn drops_per_gso_segment() {
    let seg = 100;
    let mut contents = Vec::new();
    for k in 0..11u8 {
        let len = if k == 10 { 37 } else { seg };
        contents.extend(std::iter::repeat_n(k, len));
    }
    let mut partial_seen = false;
    for seed in 0..20 {
        let mock = Arc::new(MockSocket::default());
        let socket = FaultySocket::new(
            mock.clone(),
            Faults {
                loss_out: 0.4,
                seed,
                ..Faults::default()
            },
        )
        .expect("valid faults");
        socket
            .try_send(&transmit(&contents, Some(seg)))
            .expect("mock send");
        let stats = socket.stats();
        assert_eq!(stats.segments_sent + stats.segments_dropped_out, 11);
        let sent = lock(&mock.sent).clone();
        if stats.segments_sent == 0 {
            assert!(sent.is_empty());
            continue;
        }
        assert_eq!(sent.len(), 1, "survivors go out as one transmit");
        let (bytes, size) = &sent[0];
        // Each surviving segment is intact and in order.
        let tags: Vec<u8> = bytes.chunks(seg).map(|c| c[0]).collect();
        for (chunk, tag) in bytes.chunks(seg).zip(&tags) {
            assert!(chunk.iter().all(|b| b == tag));
            assert_eq!(chunk.len(), if *tag == 10 { 37 } else { seg });
        }
        assert!(tags.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(tags.len() as u64, stats.segments_sent);
        if tags.len() > 1 {
            assert_eq!(*size, Some(seg));
        } else {
            assert_eq!(*size, None);
        }
        partial_seen |= stats.segments_dropped_out > 0 && stats.segments_sent > 1;
    }
    assert!(partial_seen, "some seed dropped part of a batch");
}

/// A send that returns WouldBlock does not consume loss decisions: quinn
/// retries the same packet and it gets the same verdict.
#[test]
fn would_block_does_not_advance_decisions() {
    let faults = Faults::symmetric_loss(0.3, 9);
    let (plain, _) = survivors(faults, 200);
    let mock = Arc::new(MockSocket::default());
    let socket = FaultySocket::new(mock.clone(), faults).expect("valid faults");
    for i in 0..200u32 {
        let bytes = i.to_le_bytes();
        mock.would_block.store(1, Ordering::Relaxed);
        loop {
            match socket.try_send(&transmit(&bytes, None)) {
                Ok(()) => break,
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
            }
        }
    }
    assert_eq!(plain, sent_tags(&mock));
}

/// Feed 4 GRO buffers of 6 datagrams (the last one short) through a
/// lossy socket; return the tags of the datagrams that came through.
fn gro_survivors(seed: u64) -> (Vec<u8>, FaultStats) {
    let stride = 10;
    let mut inbox = Vec::new();
    for b in 0..4u8 {
        let mut data = Vec::new();
        for k in 0..6u8 {
            let len = if k == 5 { 4 } else { stride };
            data.extend(std::iter::repeat_n(b * 16 + k, len));
        }
        inbox.push((data, stride));
    }
    let mock = Arc::new(MockSocket::default());
    *lock(&mock.inbox) = inbox;
    let faults = Faults {
        loss_in: 0.5,
        seed,
        ..Faults::default()
    };
    let socket = FaultySocket::new(mock, faults).expect("valid faults");
    let mut storage = vec![[0u8; 64]; 4];
    let mut bufs: Vec<IoSliceMut<'_>> = storage
        .iter_mut()
        .map(|b| IoSliceMut::new(&mut b[..]))
        .collect();
    let mut meta = [RecvMeta::default(); 4];
    let n = match socket.poll_recv(
        &mut Context::from_waker(Waker::noop()),
        &mut bufs,
        &mut meta,
    ) {
        Poll::Ready(Ok(n)) => n,
        Poll::Ready(Err(e)) => panic!("mock recv failed: {e}"),
        // Everything dropped, and the mock has nothing more.
        Poll::Pending => 0,
    };
    let mut seen = Vec::new();
    for (buf, m) in bufs.iter().zip(&meta).take(n) {
        assert!(m.len > 0, "empty buffers are squeezed out");
        assert_eq!(m.stride, stride);
        for d in buf[..m.len].chunks(stride) {
            let tag = d[0];
            assert!(d.iter().all(|&x| x == tag), "datagram intact");
            assert_eq!(d.len(), if tag % 16 == 5 { 4 } else { stride });
            seen.push(tag);
        }
    }
    (seen, socket.stats())
}

/// GRO buffers: dropped datagrams are squeezed out of each buffer and
/// empty buffers out of the batch.
#[test]
fn drops_per_gro_datagram() {
    let mut partial = false;
    for seed in 0..10 {
        let (seen, stats) = gro_survivors(seed);
        assert_eq!(stats.datagrams_received + stats.datagrams_dropped_in, 24);
        assert_eq!(seen.len() as u64, stats.datagrams_received);
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "order kept: {seen:?}");
        assert_eq!(gro_survivors(seed).0, seen, "reproducible");
        partial |= stats.datagrams_dropped_in > 0 && stats.datagrams_received > 0;
    }
    assert!(partial);
}

#[tokio::test]
async fn delay_holds_packets_and_keeps_order() {
    let mock = Arc::new(MockSocket::default());
    let delay = Duration::from_millis(30);
    let socket = FaultySocket::new(
        mock.clone(),
        Faults {
            delay,
            ..Faults::default()
        },
    )
    .expect("valid faults");
    let start = std::time::Instant::now();
    for i in 0..50u32 {
        let bytes = i.to_le_bytes();
        socket.try_send(&transmit(&bytes, None)).expect("queued");
    }
    assert!(
        lock(&mock.sent).is_empty(),
        "nothing leaves before the delay"
    );
    assert_eq!(socket.stats().segments_delayed, 50);
    wait_sent(&mock, 50).await;
    assert!(start.elapsed() >= delay);
    assert_eq!(sent_tags(&mock), (0..50).collect::<Vec<_>>());
}

fn sent_tags(mock: &MockSocket) -> Vec<u32> {
    lock(&mock.sent)
        .iter()
        .map(|(b, _)| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

async fn wait_sent(mock: &MockSocket, n: usize) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while lock(&mock.sent).len() < n {
            mock.sent_notify.notified().await;
        }
    })
    .await
    .expect("delayed packets are sent");
}

#[tokio::test]
async fn jitter_reorders_but_delivers_everything() {
    let mock = Arc::new(MockSocket::default());
    let faults = Faults {
        delay: Duration::from_millis(2),
        jitter: Duration::from_millis(20),
        seed: 5,
        ..Faults::default()
    };
    let socket = FaultySocket::new(mock.clone(), faults).expect("valid faults");
    for i in 0..100u32 {
        socket
            .try_send(&transmit(&i.to_le_bytes(), None))
            .expect("queued");
    }
    wait_sent(&mock, 100).await;
    let order = sent_tags(&mock);
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..100).collect::<Vec<_>>());
    assert_ne!(order, sorted, "20 ms of jitter reorders a burst");
}

/// A full delay queue pushes back with WouldBlock, and the poller wakes
/// the sender once the queue drains.
#[tokio::test]
async fn full_delay_queue_pushes_back() {
    let mock = Arc::new(MockSocket::default());
    let faults = Faults {
        delay: Duration::from_millis(20),
        ..Faults::default()
    };
    let socket =
        FaultySocket::with_queue_capacity(mock.clone(), faults, 1000).expect("valid faults");
    let packet = [7u8; 100];
    for _ in 0..10 {
        socket.try_send(&transmit(&packet, None)).expect("room");
    }
    let err = socket
        .try_send(&transmit(&packet, None))
        .expect_err("queue is full");
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    let mut poller = socket.clone().create_io_poller();
    assert!(poller
        .as_mut()
        .poll_writable(&mut Context::from_waker(Waker::noop()))
        .is_pending());
    tokio::time::timeout(
        Duration::from_secs(5),
        std::future::poll_fn(|cx| poller.as_mut().poll_writable(cx)),
    )
    .await
    .expect("woken when the queue drains")
    .expect("writable");
    socket
        .try_send(&transmit(&packet, None))
        .expect("room again");
    wait_sent(&mock, 11).await;
    assert_eq!(socket.stats().segments_delayed, 11);
}

/// A delayed send the system refuses is a lost packet, counted with
/// every segment of its GSO batch; the queue goes on with the next.
#[tokio::test]
async fn a_refused_delayed_send_is_counted() {
    let mock = Arc::new(MockSocket::default());
    mock.refuse.store(1, Ordering::Relaxed);
    let faults = Faults {
        delay: Duration::from_millis(1),
        ..Faults::default()
    };
    let socket = FaultySocket::new(mock.clone(), faults).expect("valid faults");
    let batch = [1u8; 250];
    socket
        .try_send(&transmit(&batch, Some(100)))
        .expect("queued");
    socket
        .try_send(&transmit(&[2u8; 80], None))
        .expect("queued");
    wait_sent(&mock, 1).await;
    let stats = socket.stats();
    assert_eq!(stats.segments_send_failed, 3);
    assert_eq!(stats.segments_sent, 4);
    assert_eq!(lock(&mock.sent)[0].0, vec![2u8; 80]);
}

#[test]
fn delay_without_runtime_is_an_error() {
    let r = FaultySocket::new(
        Arc::new(MockSocket::default()),
        Faults {
            delay: Duration::from_millis(1),
            ..Faults::default()
        },
    );
    assert!(matches!(r, Err(FaultySocketError::NoRuntime)));
}
