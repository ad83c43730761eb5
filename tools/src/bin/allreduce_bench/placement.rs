//! Where this process's ranks are (all on loopback, or one rank of a group
//! across processes) and how they join a fresh group per variant, each
//! rank behind its fault injector. The variants get their groups from here
//! and need not know which of the two placements runs.

use std::net::SocketAddr;
use std::time::Duration;

use common::BoxError;
use futures_util::future::join_all;
use gradlane::{generate_certs, Config, Faults, Group, GroupConfig, Rendezvous};
use gradlane_tools::cli as common;

use crate::Args;

/// Where this process's ranks are and how they meet.
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    /// This process runs ranks `first..first + local` of `world`.
    pub(crate) first: usize,
    pub(crate) local: usize,
    pub(crate) world: usize,
    /// Rank 0's address, the listening IP and the certificate name; unset
    /// on loopback.
    pub(crate) across: Option<Across>,
    pub(crate) cert_dir: std::path::PathBuf,
}

#[derive(Debug, Clone)]
pub(crate) struct Across {
    pub(crate) master: std::net::IpAddr,
    pub(crate) port: u16,
    pub(crate) listen: std::net::IpAddr,
    pub(crate) server_name: Option<String>,
}

impl Placement {
    pub(crate) fn from_args(args: &Args) -> Result<Self, BoxError> {
        let Some(rank) = args.rank else {
            if args.ranks < 2 {
                return Err("--ranks must be at least 2".into());
            }
            let dir = std::env::temp_dir()
                .join(format!("gradlane-allreduce-bench-{}", std::process::id()));
            generate_certs(&dir, &["localhost", "127.0.0.1"])?;
            return Ok(Self {
                first: 0,
                local: args.ranks,
                world: args.ranks,
                across: None,
                cert_dir: dir,
            });
        };
        let world = args.world.ok_or("--rank needs --world (or WORLD_SIZE)")?;
        if world < 2 || rank >= world {
            return Err(format!(
                "rank {rank} of a group of {world}: need 2 or more ranks and rank < world"
            )
            .into());
        }
        let master = args
            .master_addr
            .ok_or("--rank needs --master-addr (or MASTER_ADDR)")?;
        let listen = args
            .listen_ip
            .ok_or("--rank needs --listen-ip (or GRADLANE_RANK_ADDR)")?;
        let cert_dir = args
            .cert_dir
            .clone()
            .ok_or("--rank needs --cert-dir (or GRADLANE_CERT_DIR)")?;
        if args.master_port > u16::MAX - 200 {
            return Err("--master-port leaves no room for the groups' ports".into());
        }
        Ok(Self {
            first: rank,
            local: 1,
            world,
            across: Some(Across {
                master,
                port: args.master_port,
                listen,
                server_name: args.server_name.clone(),
            }),
            cert_dir,
        })
    }

    /// Whether this process prints the table.
    pub(crate) fn reports(&self) -> bool {
        self.first == 0
    }

    pub(crate) fn ranks(&self) -> std::ops::Range<usize> {
        self.first..self.first + self.local
    }
}

/// How a group's ranks send: the delay each adds, the congestion
/// controller, the sockets (the library's default if unset).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transport {
    pub(crate) delay_ms: u64,
    pub(crate) congestion: common::Cc,
    pub(crate) sockets: Option<usize>,
}

/// The group across processes that times the rounds: no delay, one socket.
pub(crate) fn control_transport(args: &Args) -> Transport {
    Transport {
        delay_ms: 0,
        congestion: args.congestion,
        sockets: Some(1),
    }
}

/// This process's ranks of group number `index` (a fresh group per
/// variant), each behind its fault injector: all `world` ranks on
/// loopback, or this process's one rank meeting rank 0 at the master
/// address, port `master_port + index`.
pub(crate) async fn group(
    place: &Placement,
    index: u16,
    loss: f64,
    loss_tolerance: f64,
    seed: u64,
    transport: Transport,
) -> Result<Vec<Group>, BoxError> {
    let Transport {
        delay_ms,
        congestion,
        sockets,
    } = transport;
    let (rendezvous, server_name) = match &place.across {
        None => {
            let root = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?;
            let listen = SocketAddr::new(root.ip(), 0);
            (Rendezvous::Root { root, listen }, None)
        }
        Some(a) => {
            let root = SocketAddr::new(a.master, a.port + index);
            let listen = SocketAddr::new(a.listen, if place.first == 0 { root.port() } else { 0 });
            (Rendezvous::Root { root, listen }, a.server_name.clone())
        }
    };
    let dir = &place.cert_dir;
    let joins = place.ranks().map(|r| {
        let mut c = GroupConfig::new(
            r,
            place.world,
            rendezvous.clone(),
            dir.join("server.pem"),
            dir.join("server.key"),
            dir.join("ca.pem"),
        );
        c.server_name = server_name.clone();
        c.link = Config {
            loss_tolerance,
            congestion: congestion.into(),
            faults: (loss > 0.0 || delay_ms > 0).then(|| Faults {
                delay: Duration::from_millis(delay_ms),
                loss_out: loss,
                seed: seed * 1000 + r as u64,
                ..Faults::default()
            }),
            ..Config::default()
        };
        if let Some(sockets) = sockets {
            c.sockets = sockets;
        }
        Group::join(c)
    });
    let groups: Result<Vec<Group>, _> = join_all(joins).await.into_iter().collect();
    Ok(groups?)
}
