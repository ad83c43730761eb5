//! Seeded fault injection under quinn: a wrapper of [`AsyncUdpSocket`].
//!
//! [`FaultySocket`] sits between quinn and the real UDP socket (hand it to
//! [`quinn::Endpoint::new_with_abstract_socket`]). It drops outgoing and
//! incoming datagrams with a seeded probability and delays outgoing ones, and
//! counts what it did. This host has no `netem`, so this is where delay lives.
//!
//! Loss decisions are a pure function of `(seed, direction, datagram index)`:
//! the n-th datagram that leaves (or arrives at) the socket is dropped or not
//! regardless of timing, so two runs that see the same packet sequence drop
//! the same packets. The index only advances when a datagram is actually
//! handed on (a send that returns `WouldBlock` is retried by quinn with the
//! same packet and must get the same verdict).
//!
//! Granularity: one QUIC datagram. Outgoing [`Transmit`]s may carry several
//! GSO segments (`segment_size`), incoming buffers several GRO datagrams
//! (`stride`); each segment is judged on its own, as a lossy link would.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

use super::layer::{layer_socket, Layer};

mod delay_queue;

use delay_queue::{run_delay_queue, DelayQueue};

/// What to do to the packets passing through an endpoint's socket
/// ([`Config::faults`](crate::Config::faults)).
///
/// The default injects nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// Probability in `[0, 1]` that an outgoing datagram (GSO segment) is dropped.
    pub loss_out: f64,
    /// Probability in `[0, 1]` that an incoming datagram (GRO segment) is dropped.
    pub loss_in: f64,
    /// Fixed delay added to every outgoing datagram.
    pub delay: Duration,
    /// Extra outgoing delay drawn uniformly from `[0, jitter]` per transmit;
    /// packets may be reordered by at most this much.
    pub jitter: Duration,
    /// Seed of the loss and jitter decisions.
    pub seed: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            loss_out: 0.0,
            loss_in: 0.0,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            seed: 0,
        }
    }
}

impl Faults {
    /// The same loss probability `p` in both directions, no delay.
    pub fn symmetric_loss(p: f64, seed: u64) -> Self {
        Self {
            loss_out: p,
            loss_in: p,
            seed,
            ..Self::default()
        }
    }

    /// Whether outgoing packets are held back (delay or jitter set).
    pub fn delays(&self) -> bool {
        !self.delay.is_zero() || !self.jitter.is_zero()
    }
}

/// Why a [`FaultySocket`] could not be made.
#[derive(Debug, thiserror::Error)]
pub enum FaultySocketError {
    /// A loss probability was NaN or outside `[0, 1]`.
    #[error("loss probability {0} is not in [0, 1]")]
    BadLoss(f64),
    /// Delay needs a background task and there is no tokio runtime to run it.
    #[error("delay or jitter needs a tokio runtime")]
    NoRuntime,
}

/// What the fault injector under an endpoint did so far
/// ([`Endpoint::fault_stats`](crate::Endpoint::fault_stats)).
///
/// "Segments" are single datagrams on the wire; "transmits" are the
/// (possibly GSO-batched) sends handed to the inner socket or delay queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Transmits handed on (to the inner socket or the delay queue).
    pub transmits_sent: u64,
    /// Datagrams handed on.
    pub segments_sent: u64,
    /// Outgoing datagrams dropped.
    pub segments_dropped_out: u64,
    /// Incoming datagrams delivered to quinn.
    pub datagrams_received: u64,
    /// Incoming datagrams dropped.
    pub datagrams_dropped_in: u64,
    /// Outgoing datagrams that went through the delay queue.
    pub segments_delayed: u64,
    /// Delayed datagrams the inner socket refused with an error other than
    /// `WouldBlock`: lost, as on a real network, and counted here. quinn's
    /// own UDP socket logs such errors (`ENOBUFS` from a full shaped
    /// queue) and reports success, so behind it these losses show only in
    /// quinn's lost-packet count and the kernel's `SndbufErrors`.
    pub segments_send_failed: u64,
}

/// Shared live counters of a [`FaultySocket`]; clone it to keep reading
/// after the socket has been handed to quinn.
#[derive(Debug, Clone, Default)]
pub(crate) struct FaultCounters(Arc<CounterCells>);

#[derive(Debug, Default)]
struct CounterCells {
    transmits_sent: AtomicU64,
    segments_sent: AtomicU64,
    segments_dropped_out: AtomicU64,
    datagrams_received: AtomicU64,
    datagrams_dropped_in: AtomicU64,
    segments_delayed: AtomicU64,
    segments_send_failed: AtomicU64,
}

impl FaultCounters {
    /// Read all counters (each read is atomic; the set is not a transaction).
    pub(crate) fn snapshot(&self) -> FaultStats {
        let c = &self.0;
        FaultStats {
            transmits_sent: c.transmits_sent.load(Ordering::Relaxed),
            segments_sent: c.segments_sent.load(Ordering::Relaxed),
            segments_dropped_out: c.segments_dropped_out.load(Ordering::Relaxed),
            datagrams_received: c.datagrams_received.load(Ordering::Relaxed),
            datagrams_dropped_in: c.datagrams_dropped_in.load(Ordering::Relaxed),
            segments_delayed: c.segments_delayed.load(Ordering::Relaxed),
            segments_send_failed: c.segments_send_failed.load(Ordering::Relaxed),
        }
    }
}

fn add(cell: &AtomicU64, n: u64) {
    cell.fetch_add(n, Ordering::Relaxed);
}

// Stream tags keep the out, in and jitter decision sequences independent.
const STREAM_OUT: u64 = 0x6f75_7467_6f69_6e67;
const STREAM_IN: u64 = 0x696e_636f_6d69_6e67;
const STREAM_JITTER: u64 = 0x6a69_7474_6572_2121;

/// The `index`-th output of splitmix64 seeded with `seed`: random access, so a
/// decision never depends on how many other decisions were made before it.
fn splitmix_at(seed: u64, index: u64) -> u64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in `[0, 1)` with 53 bits.
fn unit_at(seed: u64, index: u64) -> f64 {
    (splitmix_at(seed, index) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

fn drops(seed: u64, stream: u64, index: u64, p: f64) -> bool {
    p > 0.0 && unit_at(seed ^ stream, index) < p
}

/// Number of datagrams in a buffer of `len` bytes cut every `stride` bytes.
fn segment_count(len: usize, stride: usize) -> usize {
    if stride == 0 || len <= stride {
        1
    } else {
        len.div_ceil(stride)
    }
}

/// Lock without panicking on poison: the guarded state stays consistent
/// because every critical section here is panic-free.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An [`AsyncUdpSocket`] that injects seeded loss and delay around another one.
pub(crate) struct FaultySocket {
    inner: Arc<dyn AsyncUdpSocket>,
    faults: Faults,
    counters: FaultCounters,
    /// Index of the next outgoing datagram's loss decision. A mutex, not an
    /// atomic, because the decision is only committed once the send went
    /// through, and concurrent senders must not interleave their indices.
    out_index: Mutex<u64>,
    in_index: AtomicU64,
    queue: Option<Arc<DelayQueue>>,
    /// Every datagram is dropped, both ways, while set: a pulled cable.
    severed: AtomicBool,
}

impl fmt::Debug for FaultySocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultySocket")
            .field("inner", &self.inner)
            .field("faults", &self.faults)
            .field("stats", &self.counters.snapshot())
            .finish_non_exhaustive()
    }
}

/// Bytes the delay queue may hold before `try_send` pushes back with
/// `WouldBlock`. Generous (a 10 Gbit/s x 50 ms bandwidth-delay product is
/// 62 MB) so that delay alone does not become a bottleneck.
const DELAY_QUEUE_BYTES: usize = 64 << 20;

impl FaultySocket {
    /// Wrap `inner`. Needs a tokio runtime when `faults` delays packets: a
    /// background task sends them when they are due.
    pub(crate) fn new(
        inner: Arc<dyn AsyncUdpSocket>,
        faults: Faults,
    ) -> Result<Arc<Self>, FaultySocketError> {
        Self::with_queue_capacity(inner, faults, DELAY_QUEUE_BYTES)
    }

    fn with_queue_capacity(
        inner: Arc<dyn AsyncUdpSocket>,
        faults: Faults,
        capacity: usize,
    ) -> Result<Arc<Self>, FaultySocketError> {
        for p in [faults.loss_out, faults.loss_in] {
            if !(0.0..=1.0).contains(&p) {
                return Err(FaultySocketError::BadLoss(p));
            }
        }
        let counters = FaultCounters::default();
        let queue = if faults.delays() {
            let handle =
                tokio::runtime::Handle::try_current().map_err(|_| FaultySocketError::NoRuntime)?;
            let queue = Arc::new(DelayQueue::new(faults, capacity));
            handle.spawn(run_delay_queue(
                queue.clone(),
                inner.clone(),
                counters.clone(),
            ));
            Some(queue)
        } else {
            None
        };
        Ok(Arc::new(Self {
            inner,
            faults,
            counters,
            out_index: Mutex::new(0),
            in_index: AtomicU64::new(0),
            queue,
            severed: AtomicBool::new(false),
        }))
    }

    /// Drops every datagram from now on, both ways (`true`), or lets them
    /// through again (`false`).
    pub(crate) fn sever(&self, severed: bool) {
        self.severed.store(severed, Ordering::Relaxed);
    }

    /// Current counter values.
    pub(crate) fn stats(&self) -> FaultStats {
        self.counters.snapshot()
    }

    /// Hand a transmit to the delay queue or straight to the inner socket.
    fn forward(&self, transmit: &Transmit<'_>, segments: u64) -> io::Result<()> {
        match &self.queue {
            Some(queue) => {
                queue.push(transmit)?;
                add(&self.counters.0.segments_delayed, segments);
            }
            None => self.inner.try_send(transmit)?,
        }
        add(&self.counters.0.transmits_sent, 1);
        add(&self.counters.0.segments_sent, segments);
        Ok(())
    }

    /// Drop incoming datagrams in place: survivors are moved to the front of
    /// their buffer (keeping `stride`, so a short last datagram stays last)
    /// and buffers that became empty are squeezed out. Returns the number of
    /// buffers still holding data.
    fn filter_incoming(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
        n: usize,
    ) -> usize {
        let n = n.min(bufs.len()).min(meta.len());
        let mut out = 0;
        for i in 0..n {
            let m = meta[i];
            let len = m.len.min(bufs[i].len());
            let stride = if m.stride == 0 { len.max(1) } else { m.stride };
            let count = segment_count(len, stride) as u64;
            let base = self.in_index.fetch_add(count, Ordering::Relaxed);
            let buf = &mut bufs[i][..len];
            let mut write = 0;
            let mut kept = 0u64;
            for (k, start) in (0..len).step_by(stride).enumerate() {
                let end = (start + stride).min(len);
                if drops(
                    self.faults.seed,
                    STREAM_IN,
                    base + k as u64,
                    self.faults.loss_in,
                ) {
                    continue;
                }
                buf.copy_within(start..end, write);
                write += end - start;
                kept += 1;
            }
            add(&self.counters.0.datagrams_received, kept);
            add(&self.counters.0.datagrams_dropped_in, count - kept);
            meta[i].len = write;
            if write == 0 {
                continue;
            }
            if out != i {
                if bufs[out].len() >= write {
                    let (head, tail) = bufs.split_at_mut(i);
                    head[out][..write].copy_from_slice(&tail[0][..write]);
                    meta[out] = meta[i];
                } else {
                    // Cannot move it (buffers of unequal size; quinn never does
                    // this): leave empty entries, which quinn skips.
                    for m in &mut meta[out..i] {
                        m.len = 0;
                    }
                    out = i;
                }
            }
            out += 1;
        }
        out
    }
}

impl Drop for FaultySocket {
    fn drop(&mut self) {
        if let Some(queue) = &self.queue {
            queue.close();
        }
    }
}

impl Layer for FaultySocket {
    fn inner(&self) -> &Arc<dyn AsyncUdpSocket> {
        &self.inner
    }

    fn io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        let poller = match &self.queue {
            // With delay, try_send only ever waits for room in the queue.
            Some(queue) => FaultyPoller::Queue(queue.clone()),
            None => FaultyPoller::Inner(self.inner.clone().create_io_poller()),
        };
        Box::pin(poller)
    }

    fn send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        let len = transmit.contents.len();
        let stride = transmit.segment_size.unwrap_or(len);
        let count = segment_count(len, stride);
        if self.severed.load(Ordering::Relaxed) {
            add(&self.counters.0.segments_dropped_out, count as u64);
            return Ok(());
        }
        if self.faults.loss_out <= 0.0 {
            return self.forward(transmit, count as u64);
        }
        let mut index = lock(&self.out_index);
        let base = *index;
        let seed = self.faults.seed;
        let p = self.faults.loss_out;
        let dropped = (0..count as u64)
            .filter(|k| drops(seed, STREAM_OUT, base + k, p))
            .count();
        if dropped == 0 {
            self.forward(transmit, count as u64)?;
        } else if dropped < count {
            // Re-pack the survivors into one GSO batch: every segment but the
            // last is `stride` long and order is kept, so a short last segment
            // is still last and `segment_size` stays valid.
            let mut contents = Vec::with_capacity(len);
            for (k, start) in (0..len).step_by(stride.max(1)).enumerate() {
                if !drops(seed, STREAM_OUT, base + k as u64, p) {
                    contents
                        .extend_from_slice(&transmit.contents[start..(start + stride).min(len)]);
                }
            }
            let survivors = count - dropped;
            let repacked = Transmit {
                destination: transmit.destination,
                ecn: transmit.ecn,
                contents: &contents,
                segment_size: if survivors > 1 {
                    transmit.segment_size
                } else {
                    None
                },
                src_ip: transmit.src_ip,
            };
            self.forward(&repacked, survivors as u64)?;
        }
        // Commit the decisions only now: a WouldBlock above returned early and
        // quinn will offer the same packets again.
        *index = base + count as u64;
        add(&self.counters.0.segments_dropped_out, dropped as u64);
        Ok(())
    }

    fn received(&self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> Option<usize> {
        let severed = self.severed.load(Ordering::Relaxed);
        if severed || self.faults.loss_in <= 0.0 {
            let count: usize = meta.iter().map(|m| segment_count(m.len, m.stride)).sum();
            if severed {
                add(&self.counters.0.datagrams_dropped_in, count as u64);
                return None;
            }
            add(&self.counters.0.datagrams_received, count as u64);
            return Some(meta.len());
        }
        let kept = self.filter_incoming(bufs, meta, meta.len());
        (kept > 0).then_some(kept)
    }
}

layer_socket!(FaultySocket);

/// Write-readiness for a [`FaultySocket`]: the inner socket's, or room in the
/// delay queue when packets are delayed.
#[derive(Debug)]
enum FaultyPoller {
    Inner(Pin<Box<dyn UdpPoller>>),
    Queue(Arc<DelayQueue>),
}

impl UdpPoller for FaultyPoller {
    fn poll_writable(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            FaultyPoller::Inner(inner) => inner.as_mut().poll_writable(cx),
            FaultyPoller::Queue(queue) => queue.poll_room(cx),
        }
    }
}

#[cfg(test)]
mod tests;
