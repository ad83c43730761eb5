//! Point-to-point messages between two ranks of a group (torch's send,
//! recv, isend, irecv and batch_isend_irecv), beside the collectives.
//!
//! A collective is run by every rank in one order, so its messages share
//! one ordered stream per pair; a send is run by two ranks whenever they
//! choose, and a rank may post a receive, run collectives, and only then
//! need what it receives. So point-to-point messages travel on a stream of
//! their own on each link ([`PointToPointSender`]), and a task per peer
//! reads them into a mailbox keyed by tag as they come: a receive takes
//! the oldest message of its tag from its peer (or from whichever peer
//! has one, for a receive from any source) and never waits for, or holds
//! up, a collective. [`PointToPoint`] is shared (`Arc`): sends and
//! receives run from any task or thread at once, without the `&mut
//! Group` a collective holds.
//!
//! A mailbox holds at most [`MAILBOX_BYTES`] of messages not yet received
//! from its peer; past that its reader stops reading, and QUIC's flow
//! control holds the peer's sends back until a receive takes some. A
//! receive that waits for one tag while the mailbox is full of another's
//! then waits for ever (up to the group's collective timeout), as a
//! program that receives in another order than it sends deadlocks on
//! gloo's bounded buffers too.
//!
//! Messages are between the ranks as they joined. A view change (with
//! [`OnRankFailure::Continue`](super::OnRankFailure)) makes new links and
//! a new `PointToPoint`; what the old one held unreceived is dropped with
//! it.

use super::GroupError;
use crate::link::{LinkError, MessageBody, PointToPointReceiver, PointToPointSender};
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;

/// Bytes of messages a mailbox holds before its reader waits for
/// receives: enough for a pipeline stage's activations several
/// micro-batches ahead.
pub const MAILBOX_BYTES: usize = 256 << 20;

/// The point-to-point messages of one view of a group: a sender and a
/// mailbox per other rank.
pub struct PointToPoint {
    /// This rank, as it joined.
    rank: usize,
    /// By the rank each peer joined as; `None` for this rank and ranks
    /// outside the view.
    peers: Vec<Option<Peer>>,
    /// Woken whenever any mailbox gets a message or a peer fails: what a
    /// receive waits on.
    arrived: Arc<Notify>,
    /// How long a receive may wait (the group's collective timeout).
    timeout: Option<Duration>,
    /// The reader tasks, stopped when this view's point-to-point ends.
    readers: Vec<tokio::task::JoinHandle<()>>,
}

struct Peer {
    sender: PointToPointSender,
    mailbox: Arc<Mailbox>,
}

#[derive(Default)]
struct Mailbox {
    held: Mutex<Held>,
    /// Woken when a receive takes a message: the reader may read on.
    taken: Notify,
}

#[derive(Default)]
struct Held {
    by_tag: HashMap<u64, VecDeque<MessageBody>>,
    bytes: usize,
    /// Why the peer's messages ended (its link failed or closed).
    ended: Option<Ended>,
}

/// How a peer's messages ended.
struct Ended {
    /// The link's error, for the receive that names the peer.
    why: String,
    /// The peer closed its link in order (it is done, not dead): a
    /// receive from any rank waits on for the others.
    in_order: bool,
}

fn lock(m: &Mutex<Held>) -> MutexGuard<'_, Held> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PointToPoint {
    /// Point-to-point over `links`, one per rank of the view in order
    /// (`None` at this rank's place), whose ranks joined as `members`.
    /// Spawns a reader per peer on the current tokio runtime.
    pub(super) fn new(
        rank: usize,
        world: usize,
        members: &[usize],
        links: Vec<Option<(PointToPointSender, PointToPointReceiver)>>,
        timeout: Option<Duration>,
    ) -> Self {
        let arrived = Arc::new(Notify::new());
        let mut peers: Vec<Option<Peer>> = (0..world).map(|_| None).collect();
        let mut readers = Vec::new();
        for (&joined, link) in members.iter().zip(links) {
            let Some((sender, receiver)) = link else {
                continue;
            };
            let mailbox = Arc::new(Mailbox::default());
            readers.push(tokio::spawn(read_into(
                receiver,
                mailbox.clone(),
                arrived.clone(),
            )));
            if let Some(slot) = peers.get_mut(joined) {
                *slot = Some(Peer { sender, mailbox });
            }
        }
        Self {
            rank,
            peers,
            arrived,
            timeout,
            readers,
        }
    }

    fn peer(&self, op: &str, rank: usize) -> Result<&Peer, GroupError> {
        if rank == self.rank {
            return Err(GroupError::Size(format!(
                "{op}: rank {rank} is this rank; point-to-point is between two ranks"
            )));
        }
        match self.peers.get(rank) {
            Some(Some(peer)) => Ok(peer),
            _ => Err(GroupError::Size(format!(
                "{op}: rank {rank} is not another member of the group (members {:?})",
                self.members()
            ))),
        }
    }

    /// The other ranks this reaches, as they joined.
    pub fn members(&self) -> Vec<usize> {
        let others = self.peers.iter().enumerate();
        let mut all: Vec<usize> = others
            .filter(|(_, p)| p.is_some())
            .map(|(r, _)| r)
            .collect();
        all.push(self.rank);
        all.sort_unstable();
        all
    }

    /// Sends `body` to rank `to` with `tag`: it arrives whole and in order
    /// with this rank's other messages to `to`. Returns once quinn holds
    /// it (not once `to` received it).
    pub async fn send(
        &self,
        to: usize,
        tag: u64,
        body: impl Into<Bytes>,
    ) -> Result<(), GroupError> {
        let peer = self.peer("send", to)?;
        peer.sender
            .send(tag, body.into())
            .await
            .map_err(|source| GroupError::Rank { rank: to, source })
    }

    /// Receives the oldest message with `tag` from rank `from`, or from
    /// whichever rank has one (`None`: the lowest rank first when several
    /// have); returns the rank it came from and the body, as it came
    /// ([`MessageBody::copy_to`] the buffer it is for). Fails when that
    /// rank's link ends; receiving from any rank, when a link fails, or
    /// when every other rank closed its link in order with no message of
    /// `tag` left (one that closed is done, not dead: the others may still
    /// send); past the group's collective timeout.
    pub async fn recv(
        &self,
        from: Option<usize>,
        tag: u64,
    ) -> Result<(usize, MessageBody), GroupError> {
        let sources: Vec<(usize, &Peer)> = match from {
            Some(r) => vec![(r, self.peer("recv", r)?)],
            None => self
                .peers
                .iter()
                .enumerate()
                .filter_map(|(r, p)| Some((r, p.as_ref()?)))
                .collect(),
        };
        if sources.is_empty() {
            return Err(GroupError::Size(
                "recv from any rank of a group of one".into(),
            ));
        }
        let waiting = async {
            loop {
                let arrived = self.arrived.notified();
                tokio::pin!(arrived);
                arrived.as_mut().enable();
                let mut closed_in_order = 0;
                for &(rank, peer) in &sources {
                    let mut held = lock(&peer.mailbox.held);
                    if let Some(body) = held.by_tag.get_mut(&tag).and_then(VecDeque::pop_front) {
                        held.bytes -= body.len();
                        drop(held);
                        peer.mailbox.taken.notify_one();
                        return Ok((rank, body));
                    }
                    match &held.ended {
                        // A rank that sent its last message and closed is
                        // no reason to fail a receive another may satisfy.
                        Some(ended) if ended.in_order && from.is_none() => closed_in_order += 1,
                        Some(ended) => {
                            return Err(GroupError::Rank {
                                rank,
                                source: LinkError::Protocol(format!(
                                    "its point-to-point messages ended: {}",
                                    ended.why
                                )),
                            })
                        }
                        None => {}
                    }
                }
                if closed_in_order == sources.len() {
                    return Err(GroupError::Rank {
                        rank: sources[0].0,
                        source: LinkError::Protocol(format!(
                            "a receive from any rank with tag {tag}: every other rank ({:?}) \
                             closed its link with no such message left",
                            sources.iter().map(|s| s.0).collect::<Vec<_>>()
                        )),
                    });
                }
                arrived.await;
            }
        };
        match self.timeout {
            None => waiting.await,
            Some(t) => tokio::time::timeout(t, waiting).await.unwrap_or_else(|_| {
                Err(GroupError::Timeout {
                    op: "recv",
                    collective: tag,
                    missing: sources.iter().map(|s| s.0).collect(),
                    waited: t,
                })
            }),
        }
    }
}

impl Drop for PointToPoint {
    fn drop(&mut self) {
        for reader in &self.readers {
            reader.abort();
        }
    }
}

/// Reads one peer's point-to-point messages into its mailbox until its
/// link ends, holding off while the mailbox is full.
async fn read_into(
    mut receiver: PointToPointReceiver,
    mailbox: Arc<Mailbox>,
    arrived: Arc<Notify>,
) {
    loop {
        loop {
            let taken = mailbox.taken.notified();
            if lock(&mailbox.held).bytes < MAILBOX_BYTES {
                break;
            }
            taken.await;
        }
        let message = receiver.recv().await;
        let mut held = lock(&mailbox.held);
        match message {
            Ok((tag, body)) => {
                held.bytes += body.len();
                held.by_tag.entry(tag).or_default().push_back(body);
            }
            Err(e) => {
                held.ended = Some(Ended {
                    in_order: matches!(e, LinkError::PeerClosed { .. }),
                    why: e.to_string(),
                })
            }
        }
        let ended = held.ended.is_some();
        drop(held);
        arrived.notify_waiters();
        if ended {
            return;
        }
    }
}
