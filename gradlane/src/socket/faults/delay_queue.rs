//! The delay queue: outgoing transmits held back until they are due
//! (a delay and a seeded jitter), then sent by a background task.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use quinn::udp::{EcnCodepoint, Transmit};
use quinn::AsyncUdpSocket;
use tokio::time::Instant;

use super::{add, lock, segment_count, unit_at, FaultCounters, Faults, STREAM_JITTER};

/// One held-back transmit.
#[derive(Debug)]
struct Delayed {
    due: Instant,
    seq: u64,
    destination: SocketAddr,
    ecn: Option<EcnCodepoint>,
    src_ip: Option<IpAddr>,
    segment_size: Option<usize>,
    contents: Vec<u8>,
}

impl PartialEq for Delayed {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Delayed {
    /// Due time first, then arrival order: without jitter, due times are
    /// non-decreasing in arrival order, so the queue is FIFO and never
    /// reorders; with jitter, reordering is bounded by the jitter.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(other.due, other.seq))
    }
}

#[derive(Debug, Default)]
struct DelayState {
    heap: BinaryHeap<Reverse<Delayed>>,
    bytes: usize,
    next_seq: u64,
    writers: Vec<Waker>,
    closed: bool,
}

#[derive(Debug)]
pub(super) struct DelayQueue {
    state: Mutex<DelayState>,
    wake_sender: tokio::sync::Notify,
    capacity: usize,
    faults: Faults,
}

impl DelayQueue {
    pub(super) fn new(faults: Faults, capacity: usize) -> Self {
        Self {
            state: Mutex::new(DelayState::default()),
            wake_sender: tokio::sync::Notify::new(),
            capacity,
            faults,
        }
    }

    pub(super) fn push(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        let mut state = lock(&self.state);
        // Full means "at or over capacity", the same test poll_room uses, so
        // a ready poller is never followed by a WouldBlock (no busy loop).
        if state.bytes >= self.capacity {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        let jitter = self
            .faults
            .jitter
            .mul_f64(unit_at(self.faults.seed ^ STREAM_JITTER, seq));
        state.bytes += transmit.contents.len();
        state.heap.push(Reverse(Delayed {
            due: Instant::now() + self.faults.delay + jitter,
            seq,
            destination: transmit.destination,
            ecn: transmit.ecn,
            src_ip: transmit.src_ip,
            segment_size: transmit.segment_size,
            contents: transmit.contents.to_vec(),
        }));
        drop(state);
        self.wake_sender.notify_one();
        Ok(())
    }

    pub(super) fn poll_room(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = lock(&self.state);
        if state.bytes < self.capacity || state.closed {
            return Poll::Ready(Ok(()));
        }
        if !state.writers.iter().any(|w| w.will_wake(cx.waker())) {
            state.writers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    pub(super) fn close(&self) {
        let writers = {
            let mut state = lock(&self.state);
            state.closed = true;
            state.heap.clear();
            state.bytes = 0;
            std::mem::take(&mut state.writers)
        };
        writers.into_iter().for_each(Waker::wake);
        self.wake_sender.notify_one();
    }

    /// The next transmit if it is due, else when the next one will be due.
    fn pop_due(&self, now: Instant) -> Result<Delayed, Option<Instant>> {
        let mut state = lock(&self.state);
        match state.heap.peek() {
            Some(Reverse(next)) if next.due <= now => {}
            Some(Reverse(next)) => return Err(Some(next.due)),
            None => return Err(None),
        }
        let Some(Reverse(item)) = state.heap.pop() else {
            return Err(None);
        };
        state.bytes -= item.contents.len();
        let writers = std::mem::take(&mut state.writers);
        drop(state);
        writers.into_iter().for_each(Waker::wake);
        Ok(item)
    }

    fn is_closed(&self) -> bool {
        lock(&self.state).closed
    }
}

/// Background sender: sends held-back transmits when they are due.
pub(super) async fn run_delay_queue(
    queue: Arc<DelayQueue>,
    inner: Arc<dyn AsyncUdpSocket>,
    counters: FaultCounters,
) {
    let mut poller = inner.clone().create_io_poller();
    while !queue.is_closed() {
        match queue.pop_due(Instant::now()) {
            Ok(item) => {
                let transmit = Transmit {
                    destination: item.destination,
                    ecn: item.ecn,
                    contents: &item.contents,
                    segment_size: item.segment_size,
                    src_ip: item.src_ip,
                };
                loop {
                    match inner.try_send(&transmit) {
                        Ok(()) => break,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            let ready =
                                std::future::poll_fn(|cx| poller.as_mut().poll_writable(cx)).await;
                            if let Err(e) = ready {
                                tracing::warn!("delayed send: socket not writable: {e}");
                                break;
                            }
                        }
                        Err(e) => {
                            // Like a real network: a failed send is a lost
                            // packet (every segment of a GSO batch).
                            tracing::debug!("delayed send failed: {e}");
                            let stride = item.segment_size.unwrap_or(item.contents.len());
                            let lost = segment_count(item.contents.len(), stride) as u64;
                            add(&counters.0.segments_send_failed, lost);
                            break;
                        }
                    }
                }
            }
            Err(None) => queue.wake_sender.notified().await,
            Err(Some(due)) => {
                // A later push may be due earlier (jitter), so wake on pushes too.
                tokio::select! {
                    _ = tokio::time::sleep_until(due) => {}
                    _ = queue.wake_sender.notified() => {}
                }
            }
        }
    }
}
