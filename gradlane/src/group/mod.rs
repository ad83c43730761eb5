//! A group of N ranks over a full mesh of gradlane links, and the
//! collectives among them.
//!
//! Every pair of ranks shares one QUIC connection (one [`Link`]): the
//! higher rank connects, the lower accepts, and both present the job's
//! certificate (mutual TLS). Collectives run in the same order on every
//! rank, as in any process group; each is numbered, and every message of it
//! carries its number and kind, so a rank that called something else is an
//! error naming that rank, not a hang or a silent mix.
//!
//! - `rendezvous`: forming the mesh from every rank's address, or from rank
//!   0's alone.
//! - `exact`: barrier, broadcast, allgather, allreduce, reduce-scatter, on
//!   the links' exact messages. Every reduction sums in rank order, so
//!   every rank ends with the same bits.
//! - `movement`: gather, scatter, all-to-all, reductions over every
//!   element type (each in its own type), reduce to one rank, and the
//!   monitored barrier.
//! - `sparse`: the sparse allgather with count negotiation.
//! - `paths`: more connections per pair of ranks, over more sockets, so
//!   that a rank's packets are sealed and opened on several cores; the
//!   exact messages are striped over them.
//! - `membership`: what a group does when a rank dies
//!   ([`OnRankFailure`]): the survivors agree on who is left and go on.
//! - `rejoin`: a restarted rank joins the group that went on without it.

mod bounded_return;
mod bucket_options;
mod buckets;
mod deadline;
mod differentiated;
mod exact;
mod group_config;
mod group_error;
mod join_requests;
mod membership;
mod movement;
mod paths;
mod pipelined;
mod point_to_point;
mod port_range;
mod reduce_op;
mod rejoin;
mod rendezvous;
mod shards;
mod sparse;

pub use bucket_options::{BucketOptions, LossRecovery};
pub use buckets::BucketId;
pub use differentiated::AllreduceReport;
pub use group_config::GroupConfig;
pub use group_error::GroupError;
pub use membership::OnRankFailure;
pub use paths::{core_share, default_sockets, paths_per_peer, MAX_SOCKETS};
pub use point_to_point::{PointToPoint, MAILBOX_BYTES};
pub use port_range::{PortRange, PortRangeError};
pub use reduce_op::ReduceOp;
pub use rendezvous::Rendezvous;
pub use sparse::{SparseAllgather, SparsePath, SparseReport, SparseRows};

use group_error::TimedOut;

use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::link::{LinkReceiver, LinkSender};
use bytes::Bytes;
use futures_util::future::try_join_all;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long [`Group::close`] waits for quinn's driver to let go of the
/// group's socket once its connections are gone: it does so as soon as
/// the runtime gets to it, so this bounds a stalled runtime only.
const SOCKET_RELEASE_WAIT: Duration = Duration::from_secs(1);

/// One rank of a group: links to every other rank.
pub struct Group {
    /// This rank's place in the current view (its index in `members`):
    /// the collectives number ranks by it.
    rank: usize,
    /// How many ranks the current view has.
    world: usize,
    /// What this rank was given when it joined, and the members of the
    /// current view by the ranks they joined as.
    membership: membership::Membership,
    /// The sending half of the link to each other rank (`None` at this
    /// rank's own index).
    senders: Vec<Option<LinkSender>>,
    /// The receiving halves, likewise.
    receivers: Vec<Option<LinkReceiver>>,
    endpoint: Endpoint,
    /// Collectives run so far: numbers the next one.
    seq: u64,
    /// The buckets registered for the differentiated allreduce.
    buckets: Vec<buckets::Bucket>,
    /// The next round index on the link to each rank.
    next_round: Vec<u32>,
    /// Each rank's paths beyond the first (empty at this rank's own index
    /// and with one path per peer): the exact messages are striped over
    /// the first path and these.
    stripes: Vec<Vec<paths::Path>>,
    /// The endpoints of those paths (sockets beyond the first).
    extra_endpoints: Vec<Endpoint>,
    /// The collective running now and when its time is up (the group's
    /// `collective_timeout`, or the call's own bound), if it has one.
    running: Option<deadline::Deadline>,
    /// The collective begun and not ended, if any: one still set when the
    /// next begins was cancelled.
    unfinished: Option<&'static str>,
    /// The timeout that made this group unusable
    /// ([`OnRankFailure::Fail`]): every later collective returns it.
    timed_out: Option<TimedOut>,
    /// The current view's point-to-point messages.
    point_to_point: Arc<PointToPoint>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("seq", &self.seq)
            .finish()
    }
}

/// The kinds of messages a collective sends, in their tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    Hello = 1,
    Barrier = 2,
    Broadcast = 3,
    Allgather = 4,
    ReduceShard = 5,
    ReducedShard = 6,
    Counts = 7,
    Rows = 8,
    Values = 9,
    RowsAndValues = 10,
    Paths = 11,
    /// A rank's "I have the result" at a collective's end (only with
    /// [`OnRankFailure::Continue`]): no rank returns before every rank
    /// holds the result, so a death leaves every survivor either with it
    /// or without it.
    Done = 12,
    /// A survivor's proposal for the next view.
    ViewProposal = 13,
    /// The coordinator's decision on the next view.
    ViewDecision = 14,
    /// A restarted rank's request to rejoin.
    Join = 15,
    /// Its admission: the view, every rank's address, who joins with it.
    Admit = 16,
    // 20-29: `movement`'s collectives.
    Gather = 20,
    Scatter = 21,
    AllToAll = 22,
    /// A typed reduction's shard to its owner.
    TypedReduceShard = 23,
    /// An owner's reduced shard back to every rank.
    TypedReducedShard = 24,
    /// An owner's reduced shard to the root of a reduce.
    ReducedToRoot = 25,
    /// A rank's arrival at a monitored barrier, to the lowest member.
    MonitoredArrive = 26,
    /// The lowest member's release of the others.
    MonitoredRelease = 27,
    /// A rank's report after a bounded return of the differentiated
    /// allreduce: its shard's lost chunks, the return chunks it missed.
    ReturnReport = 28,
}

fn tag(seq: u64, kind: Kind) -> u64 {
    seq << 8 | kind as u64
}

impl Group {
    /// Joins the group: forms the mesh (see [`Rendezvous`]) and returns
    /// once this rank has a link to every other rank.
    pub async fn join(config: GroupConfig) -> Result<Self, GroupError> {
        rendezvous::join(config).await
    }

    /// This rank: the rank it joined as, whatever views follow.
    pub fn rank(&self) -> usize {
        self.membership.joined_rank
    }

    /// How many ranks the group was formed with ([`members`](Self::members)
    /// says which are left).
    pub fn world(&self) -> usize {
        self.membership.joined_world
    }

    /// Where every rank of the group listens, by the rank it joined as, as
    /// this rank knows it (a replacement's address once it is admitted):
    /// the table a restarted rank may rejoin through
    /// ([`Rendezvous::Addresses`]), any member that answers admitting it.
    pub fn addresses(&self) -> &[SocketAddr] {
        &self.membership.addresses
    }

    /// The endpoint under the links (statistics, faults).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The QUIC connection to `rank`, if it is another rank of the group
    /// (statistics: rtt, losses, congestion window).
    pub fn connection(&self, rank: usize) -> Option<&quinn::Connection> {
        Some(
            self.senders
                .get(self.place_of(rank)?)?
                .as_ref()?
                .connection(),
        )
    }

    /// Bytes sent on every link so far (UDP payload, from quinn's
    /// counters), on every path.
    pub fn bytes_sent(&self) -> u64 {
        let first = self.senders.iter().flatten().map(LinkSender::connection);
        let more = self.stripes.iter().flatten().map(|p| p.sender.connection());
        first.chain(more).map(|c| c.stats().udp_tx.bytes).sum()
    }

    /// The connections to `rank`, one per path (the first is
    /// [`connection`](Self::connection)'s); empty for this rank.
    pub fn path_connections(&self, rank: usize) -> Vec<&quinn::Connection> {
        let first = self.connection(rank);
        let more = self
            .place_of(rank)
            .and_then(|p| self.stripes.get(p))
            .into_iter()
            .flatten();
        first
            .into_iter()
            .chain(more.map(|p| p.sender.connection()))
            .collect()
    }

    /// The current view's point-to-point messages (send and receive
    /// between two ranks, beside the collectives): shared, usable from
    /// any task while collectives run. A view change makes a new one.
    pub fn point_to_point(&self) -> Arc<PointToPoint> {
        self.point_to_point.clone()
    }

    /// Makes the point-to-point messages of the links of the current
    /// view (at the join and at each view change).
    fn open_point_to_point(&mut self, members: &[usize]) {
        let links = self
            .senders
            .iter()
            .zip(self.receivers.iter_mut())
            .map(|(s, r)| {
                Some((
                    s.as_ref()?.point_to_point(),
                    r.as_mut()?.take_point_to_point()?,
                ))
            })
            .collect();
        self.point_to_point = Arc::new(PointToPoint::new(
            self.membership.joined_rank,
            self.membership.addresses.len(),
            members,
            links,
            self.membership.config.collective_timeout,
        ));
    }

    /// The endpoints this rank's paths run on: the first (the one it
    /// joined with) and one per further socket.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        std::iter::once(&self.endpoint).chain(&self.extra_endpoints)
    }

    /// Closes every link in order (each waits for its peer, at most
    /// [`CLOSE_WAIT`](crate::CLOSE_WAIT)), waits for the endpoint to be
    /// idle, and returns once its socket is released: the same rank can
    /// join a new group on the same address at once.
    pub async fn close(self) {
        let first = self.senders.iter().flatten();
        let more = self.stripes.iter().flatten().map(|p| &p.sender);
        let closing = first.chain(more).map(|l| l.close());
        let _ = futures_util::future::join_all(closing).await;
        drop(self.senders);
        drop(self.receivers);
        drop(self.stripes);
        // The point-to-point streams hold their connections, and a
        // connection holds the endpoint's socket: it goes before the wait
        // below, not at the end of this call.
        drop(self.point_to_point);
        for extra in &self.extra_endpoints {
            extra.wait_idle().await;
        }
        drop(self.extra_endpoints);
        self.endpoint.wait_idle().await;
        let local = self.endpoint.local_addr();
        drop(self.endpoint);
        // The links' tasks and quinn's driver let go of the socket as the
        // runtime gets to them, not within this call: wait until the
        // address can be bound again (at most a second).
        if let Ok(addr) = local {
            let until = tokio::time::Instant::now() + SOCKET_RELEASE_WAIT;
            loop {
                match std::net::UdpSocket::bind(addr) {
                    Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                        if tokio::time::Instant::now() >= until {
                            tracing::warn!(%addr, "closed group's socket still bound");
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await
                    }
                    _ => break,
                }
            }
        }
    }

    /// Numbers the next collective.
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Sends `out[r]` to each rank `r` that has one and receives a message
    /// from each rank in `from`, all at once; returns what came, by rank.
    /// Every message has `tag`; another tag is an [`GroupError::OutOfStep`].
    /// A large message to a rank with several paths is striped over them
    /// ([`paths::send_striped`]).
    async fn exchange(
        &mut self,
        tag: u64,
        mut out: Vec<Option<Bytes>>,
        from: &[bool],
    ) -> Result<Vec<Option<Bytes>>, GroupError> {
        out.resize(self.world, None);
        // Which ranks this exchange is done with, for a timeout to name
        // the others.
        let heard: Vec<AtomicBool> = (0..self.world).map(|_| AtomicBool::new(false)).collect();
        let heard_ref = &heard;
        let halves = self
            .senders
            .iter_mut()
            .zip(self.receivers.iter_mut())
            .zip(self.stripes.iter_mut());
        let work = halves.enumerate().zip(out).filter_map(
            |((rank, ((sender, receiver), stripes)), body)| {
                let (sender, receiver) = (sender.as_mut()?, receiver.as_mut()?);
                let receive = from.get(rank).copied().unwrap_or(false);
                Some(async move {
                    let failed = |source| GroupError::Rank { rank, source };
                    let (mut senders, mut receivers) = paths::halves(stripes);
                    if let Some(body) = body {
                        paths::send_striped(sender, &mut senders, tag, body)
                            .await
                            .map_err(failed)?;
                    }
                    if !receive {
                        heard_ref[rank].store(true, Ordering::Relaxed);
                        return Ok::<_, GroupError>((rank, None));
                    }
                    let body = paths::recv_striped(rank, receiver, &mut receivers, tag).await?;
                    heard_ref[rank].store(true, Ordering::Relaxed);
                    Ok((rank, Some(body)))
                })
            },
        );
        let deadline = self.running.map(|d| d.at);
        let waits = self.membership.policy.exchange_waits_for_every_peer();
        let ended = join_peers(waits, deadline, work).await;
        let mut got = vec![None; self.world];
        for (rank, body) in self.peers_ended(tag, &heard, ended)? {
            got[rank] = body;
        }
        Ok(got)
    }

    /// What [`join_peers`] says, as the collective's result: past the
    /// deadline, the timeout naming the ranks not `heard`; a failure, the
    /// first (every one noted for the agreement where the group goes on).
    fn peers_ended<R>(
        &mut self,
        tag: u64,
        heard: &[AtomicBool],
        ended: PeersEnded<R>,
    ) -> Result<Vec<R>, GroupError> {
        match ended {
            PeersEnded::Done(done) => Ok(done),
            PeersEnded::PastDeadline => Err(self.silent_past_deadline(tag, heard)),
            PeersEnded::Failed(first, more) => {
                if self.membership.policy.recovers() {
                    for e in std::iter::once(&first).chain(&more) {
                        self.note_failure(e);
                    }
                }
                Err(first)
            }
        }
    }

    /// Sends `body` to every other rank and receives one message from
    /// each: the collectives' all-to-all step when every rank sends the
    /// same bytes.
    async fn exchange_with_all(
        &mut self,
        tag: u64,
        body: &Bytes,
    ) -> Result<Vec<Option<Bytes>>, GroupError> {
        let out = self.to_others(body);
        let from = self.others();
        self.exchange(tag, out, &from).await
    }

    /// `body` for every other rank, nothing for this one: what
    /// [`exchange`](Self::exchange) sends when every rank gets the same.
    fn to_others(&self, body: &Bytes) -> Vec<Option<Bytes>> {
        self.others()
            .iter()
            .map(|&o| o.then(|| body.clone()))
            .collect()
    }

    /// Whether each rank is another rank (all but this one).
    fn others(&self) -> Vec<bool> {
        (0..self.world).map(|r| r != self.rank).collect()
    }
}

/// How the work with every peer of one step of a collective ended.
enum PeersEnded<R> {
    /// Every peer's work succeeded: their results, in the work's order.
    Done(Vec<R>),
    /// The deadline passed first.
    PastDeadline,
    /// The first failure, and the others (none where the first ends it).
    Failed(GroupError, Vec<GroupError>),
}

/// Runs the work with every peer at once, at most until `deadline`. With
/// `wait_for_every_peer` no peer's work is cut short by another's failure,
/// so that no message is left half written on a link the survivors keep
/// for their agreement, and every peer's failure is seen; otherwise the
/// first failure ends it.
async fn join_peers<R, F>(
    wait_for_every_peer: bool,
    deadline: Option<tokio::time::Instant>,
    work: impl IntoIterator<Item = F>,
) -> PeersEnded<R>
where
    F: std::future::Future<Output = Result<R, GroupError>>,
{
    if !wait_for_every_peer {
        return match within(deadline, try_join_all(work)).await {
            None => PeersEnded::PastDeadline,
            Some(Ok(done)) => PeersEnded::Done(done),
            Some(Err(e)) => PeersEnded::Failed(e, Vec::new()),
        };
    }
    let Some(results) = within(deadline, futures_util::future::join_all(work)).await else {
        return PeersEnded::PastDeadline;
    };
    let mut done = Vec::with_capacity(results.len());
    let mut failed = Vec::new();
    for result in results {
        match result {
            Ok(r) => done.push(r),
            Err(e) => failed.push(e),
        }
    }
    let mut failed = failed.into_iter();
    match failed.next() {
        None => PeersEnded::Done(done),
        Some(first) => PeersEnded::Failed(first, failed.collect()),
    }
}

/// `work`'s output, or `None` once `deadline` (if any) has passed.
async fn within<F: std::future::Future>(
    deadline: Option<tokio::time::Instant>,
    work: F,
) -> Option<F::Output> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, work).await.ok(),
        None => Some(work.await),
    }
}

/// A tag as "collective N, kind K", for errors.
fn describe(tag: u64) -> String {
    format!("#{} ({})", tag >> 8, tag & 0xff)
}

/// The name the certificate of the rank at `addr` must be valid for: the
/// configured one, else the job's (a job's certificate names no address),
/// else its IP address.
fn server_name(config: &GroupConfig, endpoint: &Endpoint, addr: SocketAddr) -> String {
    config
        .server_name
        .clone()
        .or_else(|| endpoint.job().map(crate::tls::job_server_name))
        .unwrap_or_else(|| addr.ip().to_string())
}
