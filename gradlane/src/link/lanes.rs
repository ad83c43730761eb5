//! A round's lanes: the important part framed piece by piece while one
//! writer task per stream hands each piece to quinn, so that sending
//! overlaps framing. The lossy part's streams use the same writers.

use super::in_flight::Unconfirmed;
use super::*;
use tokio::sync::watch;

/// Important pieces handed to quinn at a time: small enough that the first
/// leaves within a fraction of a millisecond of framing, large enough that
/// the per-piece cost (a channel message, a `write_chunk`) is negligible.
pub(super) const RELIABLE_PIECE: usize = 512 << 10;

/// Lanes a round's `reliable_len` important bytes are spread over: as many
/// as asked, but not more than about as many pieces as there are (pieces
/// may run a segment over their size, so the last lane can still end up
/// empty: a stream the receiver reads to its end and drops).
pub(super) fn lane_count(asked: u8, reliable_len: usize) -> usize {
    (asked.max(1) as usize).min(reliable_len.div_ceil(RELIABLE_PIECE).max(1))
}

/// What a lane's writer is handed.
pub(super) enum LanePiece {
    /// The next pieces of this lane's stream, in order.
    Bytes(Vec<Bytes>),
    /// Every piece was handed over: finish the stream.
    End,
}

/// Frames the important segments piece by piece into the lanes' queues in
/// turn (as views of `shared`, where given and long enough), ends the
/// lanes, then frames the lossy part (as views too, where given, if it
/// goes `on_stream`).
pub(super) async fn frame_pipelined<G: AsRef<[f32]>>(
    mut framer: RoundFramer,
    grads: &[G],
    shared: Option<&[Bytes]>,
    on_stream: bool,
    lanes: &[mpsc::UnboundedSender<LanePiece>],
) -> Result<EncodedRound, LinkError> {
    let finish = |framer: RoundFramer| match shared {
        Some(tensors) if on_stream => framer.finish_shared(tensors),
        _ => framer.finish(grads),
    };
    let mut next = 0;
    let mut feed = |framer: &mut RoundFramer| -> Result<bool, LinkError> {
        let pieces = match shared {
            Some(tensors) => framer.next_reliable_shared(tensors, RELIABLE_PIECE)?,
            None => framer
                .next_reliable(grads, RELIABLE_PIECE)?
                .map(|b| vec![b]),
        };
        match pieces {
            // A closed queue means the writer failed; its error is reported.
            Some(piece) => {
                let lane = &lanes[next % lanes.len()];
                next += 1;
                Ok(lane.send(LanePiece::Bytes(piece)).is_ok())
            }
            // Every piece is handed over: the writers finish their streams.
            // (Stopped early, the queues are dropped instead: the writers
            // reset their streams.)
            None => {
                for lane in lanes {
                    let _ = lane.send(LanePiece::End);
                }
                Ok(false)
            }
        }
    };
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(|| {
            while feed(&mut framer)? {}
            Ok(finish(framer)?)
        }),
        // One thread for everything: let the writer and quinn's driver run
        // between pieces.
        _ => {
            while feed(&mut framer)? {
                tokio::task::yield_now().await;
            }
            Ok(finish(framer)?)
        }
    }
}

/// The writer of one lane of a round's important part (or of its lossy
/// stream): writes the pieces as they come, finishes the stream at
/// [`LanePiece::End`] and hands it back (quinn may still hold its data;
/// see [`Unconfirmed`]). If the round is
/// abandoned first (`send_round` dropped or failed: the queue closes or
/// `abandoned` fires), the stream is reset instead, so the peer never
/// mistakes a cut stream for a whole one and quinn stops sending it.
/// (Dropping a quinn `SendStream` would finish it, cut or not: this task
/// is signalled, never aborted.)
pub(super) async fn write_lane(
    mut stream: SendStream,
    mut pieces: mpsc::UnboundedReceiver<LanePiece>,
    mut abandoned: watch::Receiver<()>,
) -> Result<Option<Unconfirmed>, LinkError> {
    let reset = |stream: &mut SendStream| {
        let _ = stream.reset(VarInt::from_u32(codes::ROUND_ABANDONED));
    };
    loop {
        let piece = tokio::select! {
            biased;
            _ = abandoned.changed() => None,
            piece = pieces.recv() => piece,
        };
        match piece {
            Some(LanePiece::Bytes(mut pieces)) => tokio::select! {
                biased;
                _ = abandoned.changed() => {
                    reset(&mut stream);
                    return Ok(None);
                }
                written = stream.write_all_chunks(&mut pieces) => written?,
            },
            Some(LanePiece::End) => {
                let _ = stream.finish();
                return Ok(Some(Unconfirmed::new(stream)));
            }
            None => {
                reset(&mut stream);
                return Ok(None);
            }
        }
    }
}
