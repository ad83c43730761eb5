//! What a rank needs to join its group: [`GroupConfig`].

use super::*;

/// What a rank needs to join its group.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// This rank, `0..world`.
    pub rank: usize,
    /// How many ranks the group has (at least 1).
    pub world: usize,
    /// Where the ranks find each other.
    pub rendezvous: Rendezvous,
    /// The certificate chain every rank presents (PEM; `certs` makes one
    /// for a job: give every rank the same files).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The job's CA (PEM): a peer must present a certificate it signed.
    pub ca: PathBuf,
    /// The name a peer's certificate must be valid for. By default the
    /// job's name when `cert` names a job (`certs --job NAME`: any
    /// addresses, known only when the job runs), else the peer's IP
    /// address (make the job's certificate with `--san` for every host's
    /// address, or name them all, say, `localhost` on one machine).
    pub server_name: Option<String>,
    /// The links' settings.
    pub link: Config,
    /// How long forming the mesh may take before a rank that never showed
    /// up is an error naming it.
    pub join_timeout: Duration,
    /// UDP sockets (quinn endpoints) this rank spreads its traffic over,
    /// at least 1 (default [`default_sockets`] of a host to itself: one
    /// per core where it has at least 4, at most 4; else 1; a caller
    /// whose host has several ranks passes their count there). quinn
    /// seals, opens and acknowledges a connection's packets in one task;
    /// with more sockets each pair of ranks gets [`paths_per_peer`]
    /// connections and the exact collectives stripe their messages over
    /// them. Raise it where a fast path leaves cores idle; leave it at 1
    /// on a slow link, where the link binds, not the CPU.
    pub sockets: usize,
    /// Where this rank's sockets that ask for any port (a listen address
    /// with port 0, the further sockets) take theirs: the first free one of
    /// the range, so that a firewall can pass exactly it. `None` (the
    /// default): any free port.
    pub port_range: Option<PortRange>,
    /// What the group does when a rank dies: fail every collective with
    /// an error naming it (the default, as gloo and NCCL do), or go on
    /// with the ranks that are left.
    pub on_rank_failure: OnRankFailure,
    /// How long a rank may be silent before it counts as dead: a rank
    /// that stops answering fails its links at most this long after its
    /// last packet ([`QuicSettings::fail_silent_peer_within`](crate::QuicSettings::fail_silent_peer_within);
    /// a live rank's keep-alives come five times as often). `None` keeps the links' own
    /// [`QuicSettings::max_idle_timeout`](crate::QuicSettings::max_idle_timeout)
    /// (30 s by default). Lower it where a dead rank should be noticed
    /// sooner; a path that loses everything for this long (a partition)
    /// cuts the ranks it separates off as if they had died.
    pub failure_timeout: Option<Duration>,
    /// How long one collective may wait for the other ranks (torch's
    /// process-group `timeout`): past it the collective fails with
    /// [`GroupError::Timeout`] naming the ranks it did not hear from,
    /// though their links are alive (a rank stuck outside the collective,
    /// or that called another one). With [`OnRankFailure::Fail`] the
    /// group is then unusable, and its links are closed so that the
    /// others fail too rather than wait; with `Continue` the silent ranks
    /// are removed, as dead ones are. `None` (the default): no bound but
    /// the failure timeout, which catches a rank that died or froze.
    pub collective_timeout: Option<Duration>,
    /// A fault to test failures with: this rank stops where it would
    /// start forming the mesh of view `Some(epoch)`, after agreeing on it
    /// (every member has its acceptance): it forms no link of that mesh,
    /// and its collective fails, as a rank that dies right there. Its
    /// endpoint stays up, so that what it sent before goes out. `None`
    /// (the default): never.
    pub stop_at_view: Option<u64>,
}

impl GroupConfig {
    /// [`GroupConfig::join_timeout`]'s default.
    pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(60);

    /// A configuration with the default link settings and a
    /// [`DEFAULT_JOIN_TIMEOUT`](Self::DEFAULT_JOIN_TIMEOUT) join timeout.
    pub fn new(
        rank: usize,
        world: usize,
        rendezvous: Rendezvous,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
        ca: impl Into<PathBuf>,
    ) -> Self {
        Self {
            rank,
            world,
            rendezvous,
            cert: cert.into(),
            key: key.into(),
            ca: ca.into(),
            server_name: None,
            link: Config::default(),
            join_timeout: Self::DEFAULT_JOIN_TIMEOUT,
            sockets: default_sockets(1),
            port_range: None,
            on_rank_failure: OnRankFailure::Fail,
            failure_timeout: None,
            collective_timeout: None,
            stop_at_view: None,
        }
    }
}
