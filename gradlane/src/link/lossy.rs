//! A round's lossy part, once released: on streams below the lanes, or as
//! datagrams, level 1 first, each level's DSCP mark set once the level
//! before it has left; datagrams the path's shrinking MTU made too large
//! are cut again.

use super::in_flight::{InFlight, Unconfirmed};
use super::lanes::{lane_count, write_lane, LanePiece, RELIABLE_PIECE};
use super::*;

impl LinkSender {
    /// Opens the round's lossy streams, below the important lanes and the
    /// control stream, as many as the important part has lanes (each
    /// stream's flow-control window bounds its rate on a long path, as for
    /// the lanes), and has a writer task per stream hand it its share of
    /// the lossy levels, level 1 first, and finish it. No report follows:
    /// the receiver waits at most the grace period from the last lossy
    /// byte, so a retransmission on these streams can hold up a round only
    /// that long (what comes later is merged into the next round), and the
    /// next round, seeing the loss, sends its lossy levels as datagrams.
    pub(super) async fn start_lossy_streams(
        &self,
        encoded: &EncodedRound,
        report: &mut SendReport,
        flight: &InFlight,
    ) -> Result<Vec<JoinHandle<Result<Option<Unconfirmed>, LinkError>>>, LinkError> {
        let total: u64 = encoded.end.bytes[1..].iter().sum();
        if total == 0 {
            return Ok(Vec::new());
        }
        let count = lane_count(self.lanes, total as usize);
        let mut queues = Vec::with_capacity(count);
        let mut writers = Vec::with_capacity(count);
        for _ in 0..count {
            let stream = self.conn.open_uni().await.map_err(LinkError::from_conn)?;
            let _ = stream.set_priority(LOSSY_STREAM_PRIORITY);
            let (pieces, queue) = mpsc::unbounded_channel();
            queues.push(pieces);
            // Like a lane's writer: the stream is reset, never cut, if the
            // round is abandoned.
            writers.push(tokio::spawn(write_lane(stream, queue, flight.signal())));
        }
        let (mut next, mut group, mut grouped) = (0, Vec::new(), 0);
        for (l, level) in encoded.lossy.iter().enumerate() {
            // The level's pieces may be views of the gradients, not
            // packets: count from the round's end, which the framing
            // matches.
            report.lossy_packets[l] += u64::from(encoded.end.packets[l + 1]);
            report.lossy_bytes[l] += encoded.wire_payload[l + 1];
            for piece in level {
                grouped += piece.len();
                // A lone header belongs with the values after it (see
                // `RoundFramer::finish_shared`); any other piece ends a
                // segment, where a stream's share may end.
                let whole = piece.len() != DATA_HEADER_LEN;
                group.push(piece.clone());
                if whole && grouped >= RELIABLE_PIECE {
                    let _ = queues[next % count].send(LanePiece::Bytes(std::mem::take(&mut group)));
                    (next, grouped) = (next + 1, 0);
                }
            }
        }
        if !group.is_empty() {
            let _ = queues[next % count].send(LanePiece::Bytes(group));
        }
        for q in &queues {
            let _ = q.send(LanePiece::End);
        }
        Ok(writers)
    }

    /// Waits until quinn's datagram queue has `empty` bytes free again, or
    /// at most a second (a path that stalls that long is better served by
    /// the receiver's grace period than by a late report) or until
    /// `deadline`. Returns whether the queue is empty.
    async fn wait_datagrams_sent(
        &self,
        empty: usize,
        deadline: Option<Instant>,
    ) -> Result<bool, LinkError> {
        let second = Instant::now() + Duration::from_secs(1);
        let give_up = deadline.map_or(second, |d| d.min(second));
        // quinn has no event for it: poll at the timer's granularity.
        loop {
            if self.conn.datagram_send_buffer_space() >= empty {
                return Ok(true);
            }
            if Instant::now() >= give_up {
                return Ok(false);
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                e = self.conn.closed() => return Err(LinkError::from_conn(e)),
            }
        }
    }

    /// Waits until quinn's datagram queue holds at most `most` bytes
    /// (`empty` being its free space when empty), or `deadline`.
    async fn wait_queue_below(
        &self,
        empty: usize,
        most: usize,
        deadline: Option<Instant>,
    ) -> Result<(), LinkError> {
        // quinn has no event for it: poll at the timer's granularity.
        loop {
            let space = self.conn.datagram_send_buffer_space();
            if space + most >= empty || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(());
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                e = self.conn.closed() => return Err(LinkError::from_conn(e)),
            }
        }
    }

    /// Queues the lossy levels' datagrams, level 1 first; what is not
    /// queued by `deadline` is dropped and counted.
    pub(super) async fn send_lossy(
        &self,
        encoded: &EncodedRound,
        deadline: Option<Instant>,
        report: &mut SendReport,
        queue: LossyQueue,
    ) -> Result<(), LinkError> {
        let empty = queue.empty;
        let mut queued = false;
        for (l, datagrams) in encoded.lossy.iter().enumerate() {
            if let Some(mark) = self.mark.as_ref().filter(|_| !datagrams.is_empty()) {
                // The socket marks what quinn sends now: let quinn put the
                // level before into packets before marking the next.
                if queued {
                    self.wait_datagrams_sent(empty, deadline).await?;
                }
                mark.set_class(l as u8 + 1);
                queued = true;
            }
            for (i, d) in datagrams.iter().enumerate() {
                if queue.shallow {
                    // Whatever is in quinn's queue at the deadline still
                    // goes out, after it: keep the queue short.
                    self.wait_queue_below(empty, SHALLOW_QUEUE, deadline)
                        .await?;
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    // Everything not yet queued, this level and below, is dropped.
                    report.lossy_dropped[l] += (datagrams.len() - i) as u64;
                    for (k, rest) in encoded.lossy.iter().enumerate().skip(l + 1) {
                        report.lossy_dropped[k] += rest.len() as u64;
                    }
                    return Ok(());
                }
                match self.conn.send_datagram_wait(d.clone()).await {
                    Ok(()) => {
                        report.lossy_packets[l] += 1;
                        report.lossy_bytes[l] += payload_bytes(d);
                    }
                    // MTU black-hole detection may lower the limit below a
                    // datagram framed a moment ago: cut it for the new one.
                    Err(quinn::SendDatagramError::TooLarge) => {
                        self.send_reframed(d, l, report).await?
                    }
                    Err(quinn::SendDatagramError::ConnectionLost(e)) => {
                        return Err(LinkError::from_conn(e))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Sends a datagram that became too large as several smaller ones;
    /// counts it dropped if even that is impossible.
    async fn send_reframed(
        &self,
        d: &Bytes,
        level: usize,
        report: &mut SendReport,
    ) -> Result<(), LinkError> {
        let pieces = match self.conn.max_datagram_size() {
            Some(max) => {
                // The datagram says which layout's encoder can cut it.
                let layout = gradlane_core::wire::layout_of(d).unwrap_or(0) as usize;
                match self.encoders.get(layout) {
                    Some(encoder) => encoder.reframe(d, max).unwrap_or_default(),
                    None => Vec::new(),
                }
            }
            None => Vec::new(),
        };
        if pieces.is_empty() {
            report.lossy_dropped[level] += 1;
            return Ok(());
        }
        report.lossy_reframed[level] += 1;
        for p in pieces {
            match self.conn.send_datagram_wait(p.clone()).await {
                Ok(()) => {
                    report.lossy_packets[level] += 1;
                    report.lossy_bytes[level] += payload_bytes(&p);
                }
                Err(quinn::SendDatagramError::TooLarge) => report.lossy_dropped[level] += 1,
                Err(quinn::SendDatagramError::ConnectionLost(e)) => {
                    return Err(LinkError::from_conn(e))
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// The most datagram bytes a round with a deadline keeps queued in quinn:
/// what a 1 Gbit/s path sends in about two timer ticks, so a fast path
/// still runs full, while what is left at the deadline leaves in a few
/// milliseconds even at 100 Mbit/s.
const SHALLOW_QUEUE: usize = 256 * 1024;

/// quinn's datagram queue as a round's lossy part uses it.
#[derive(Debug, Clone, Copy)]
pub(super) struct LossyQueue {
    /// The queue's free space when the lossy part started (empty, or
    /// with what an older round left).
    pub(super) empty: usize,
    /// Keep at most [`SHALLOW_QUEUE`] bytes in it (a round with a
    /// deadline).
    pub(super) shallow: bool,
}

/// Puts a connection's marks back to the important class when dropped.
pub(super) struct ClassGuard<'a>(pub(super) Option<&'a ConnectionMark>);

impl Drop for ClassGuard<'_> {
    fn drop(&mut self) {
        if let Some(mark) = self.0 {
            mark.set_class(gradlane_core::classify::IMPORTANT);
        }
    }
}

/// The datagram payload a round's lossy part is framed for (see
/// [`DatagramSize`]).
/// `floor` is the MTU quinn never falls below (its `min_mtu`).
pub(super) fn lossy_datagram_limit(
    conn: &Connection,
    size: DatagramSize,
    floor: u16,
) -> Option<usize> {
    let max = conn.max_datagram_size()?;
    Some(match size {
        DatagramSize::MtuFloor => limit_at_floor(max, conn.stats().path.current_mtu, floor),
        DatagramSize::Path => max,
    })
}

/// The datagram payload whose packets fit the MTU floor `floor`, from the
/// path's datagram limit `max` at path MTU `mtu`. quinn's limit is the MTU
/// less a fixed worst-case overhead, so taking off the MTU's rise above the
/// floor is exact; when the peer's own limit is the smaller one this errs
/// on the small side. Never below what the encoder needs: then the path's
/// limit is used as it is.
fn limit_at_floor(max: usize, mtu: u16, floor: u16) -> usize {
    let rise = mtu.saturating_sub(floor) as usize;
    match max.saturating_sub(rise) {
        floor if floor >= gradlane_core::encode::MIN_DATAGRAM => floor,
        _ => max,
    }
}

/// Payload bytes of a datagram framed by this crate.
fn payload_bytes(d: &Bytes) -> u64 {
    let headers = wire::decode_all(d).count() * DATA_HEADER_LEN;
    (d.len() - headers.min(d.len())) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_datagrams_fit_the_mtu_floor() {
        // quinn 0.11 on loopback: 1162 at the 1200-byte floor, 1414 at 1452.
        assert_eq!(limit_at_floor(1162, 1200, 1200), 1162);
        assert_eq!(limit_at_floor(1414, 1452, 1200), 1162);
        // A known jumbo path: the floor is the path's size.
        assert_eq!(limit_at_floor(8914, 8952, 8952), 8914);
        // Discovery above a raised floor takes off only the rise above it.
        assert_eq!(limit_at_floor(8914, 8952, 4000), 3962);
        // A peer's smaller limit: the result errs on the small side.
        assert_eq!(limit_at_floor(600, 1452, 1200), 348);
        // Never below what the encoder can frame: the path's limit as is.
        let tiny = gradlane_core::encode::MIN_DATAGRAM + 10;
        assert_eq!(limit_at_floor(tiny, 1452, 1200), tiny);
        // An MTU under the floor (the peer accepts less than our floor)
        // takes nothing off.
        assert_eq!(limit_at_floor(1000, 1100, 1200), 1000);
        assert_eq!(limit_at_floor(1414, 1452, 8952), 1414);
    }
}
