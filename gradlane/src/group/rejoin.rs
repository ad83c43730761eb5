//! A restarted rank joins a group that went on without it
//! ([`OnRankFailure::Continue`](super::OnRankFailure)).
//!
//! The new process ([`Group::rejoin`]) connects to a member (rank 0's
//! address under [`Rendezvous::Root`], else the first member of the
//! address table that answers) and asks with a `JoinRequest`. A member
//! takes such connections at the end of its collectives, and announces the
//! ranks waiting at it in its `Done` message, so every member knows the
//! same waiting ranks after the same collective. The group grows only
//! where the members call [`Group::admit`] (a boundary they choose, such as
//! the end of a training step, where the new rank can take part from the
//! next collective on): they form the mesh of a view with it, as after a
//! death. The new rank holds no state of the group's; the members hand it
//! theirs (a broadcast; in Python `gradlane.torch.elastic`).
//!
//! A rank that is still a member, or that comes back with the state of a
//! view it was removed from, is refused with a clear error: it is never
//! merged silently.

use super::group_error::group_error;
use super::join_requests::{lock, refuse, take_requests};
use super::rendezvous::{apply_failure_timeout, dial, form_view, listen_address, open_endpoint};
use super::{tag, Group, GroupConfig, GroupError, Kind, OnRankFailure, Rendezvous};
use crate::endpoint::Endpoint;
use crate::link::Link;
use bytes::Bytes;
use gradlane_core::group::view_keeper::{Action, ViewKeeper};
use gradlane_core::group::{
    admission, AddressTable, GroupMessageError, JoinRequest, Joiners, ViewDecision,
};
use std::net::SocketAddr;
use std::time::Duration;

impl Group {
    /// Joins a group that went on without this rank: a restarted process
    /// with the rank, world and rendezvous of the job (and its
    /// certificates). Returns once the members have admitted it
    /// ([`admit`](Self::admit)), a member of their next view, within the
    /// configuration's join timeout. It holds none of the group's state:
    /// take it from a member (a broadcast) before training.
    pub async fn rejoin(mut config: GroupConfig) -> Result<Self, GroupError> {
        let (rank, world) = (config.rank, config.world);
        if world == 0 || rank >= world {
            return Err(GroupError::Setup(format!(
                "rank {rank} is not in a group of {world}"
            )));
        }
        apply_failure_timeout(&mut config);
        config.on_rank_failure = OnRankFailure::Continue;
        let (listen, contacts): (SocketAddr, Vec<(usize, SocketAddr)>) = match &config.rendezvous {
            Rendezvous::Addresses(addrs) if addrs.len() != world => {
                return Err(GroupError::Setup(format!(
                    "{} addresses for a group of {world}",
                    addrs.len()
                )))
            }
            Rendezvous::Addresses(addrs) => (
                addrs[rank],
                addrs
                    .iter()
                    .copied()
                    .enumerate()
                    .filter(|&(r, _)| r != rank)
                    .collect(),
            ),
            Rendezvous::Root { root, .. } if rank == 0 => (*root, Vec::new()),
            Rendezvous::Root { root, listen } => (*listen, vec![(0, *root)]),
        };
        if contacts.is_empty() {
            return Err(GroupError::Setup(
                "rank 0 rejoins through another member's address: give every rank's \
                 (Rendezvous::Addresses)"
                    .into(),
            ));
        }
        let endpoint = open_endpoint(&config, listen)?;
        let wait = config.join_timeout;
        let admitted = tokio::time::timeout(wait, ask(&config, &endpoint, &contacts));
        let (contact_link, decision, table, joiners) = match admitted.await {
            Ok(answer) => answer?,
            Err(_) => {
                return Err(GroupError::Missing {
                    missing: contacts.iter().map(|c| c.0).collect(),
                    waited: wait,
                    failed: Vec::new(),
                })
            }
        };
        let place = decision
            .members
            .iter()
            .position(|&r| r == rank)
            .ok_or_else(|| GroupError::Setup(format!("admitted to a view without rank {rank}")))?;
        let view_table: Vec<SocketAddr> = decision.members.iter().map(|&r| table[r]).collect();
        let links = form_view(
            &config,
            &endpoint,
            place,
            view_table,
            decision.epoch,
            &decision.members,
            wait,
        )
        .await?
        .whole()
        .map_err(|e| match e {
            GroupError::Missing {
                missing,
                waited,
                failed,
            } => GroupError::Missing {
                missing: missing.iter().map(|&p| decision.members[p]).collect(),
                waited,
                failed,
            },
            e => e,
        })?;
        // The contact kept its end open until its mesh was up; so did this.
        drop(contact_link);
        let keeper = ViewKeeper::admitted(rank, world, &decision, joiners);
        tracing::info!(rank, epoch = decision.epoch, members = ?decision.members, "rejoined");
        let mut group = Group::assemble(place, config, table, keeper, links, endpoint);
        // As the members do once the view's mesh is up (`form_view`).
        let config = group.membership.config.clone();
        group
            .form_paths(&config, tokio::time::Instant::now() + config.join_timeout)
            .await?;
        Ok(group)
    }

    /// Admits the ranks waiting to rejoin, if any: every member calls it at
    /// the same point (the end of a training step, say), and the group
    /// grows there. Returns the ranks admitted (empty, at no cost on the
    /// network, where none waits, and always with
    /// [`OnRankFailure::Fail`]). The new ranks hold none of the group's
    /// state: hand it to them next ([`joined`](Self::joined) says who).
    pub async fn admit(&mut self) -> Result<Vec<usize>, GroupError> {
        let policy = self.membership.policy;
        let begun = self.membership.keeper.admit(policy);
        if !begun.map_err(|e| group_error(e, None))? {
            return Ok(Vec::new());
        }
        let mut stands = None;
        let result = loop {
            let event = match self.membership.keeper.poll() {
                Some(Action::Admitted(joined)) => break Ok(joined),
                Some(action) => match self.carry_view_action(action, &mut stands).await {
                    Ok(Some(event)) => event,
                    Ok(None) => continue,
                    Err(e) => break Err(e),
                },
                None => {
                    break Err(GroupError::Setup(
                        "the view keeper asked nothing in an admission".into(),
                    ))
                }
            };
            self.membership.keeper.handle(event);
        };
        self.membership.admitting.clear();
        let joined = result?;
        tracing::info!(
            rank = self.membership.joined_rank,
            epoch = self.epoch(),
            ?joined,
            "the group grew"
        );
        Ok(joined)
    }

    /// Tells each rank `decision` admits that waits at this member its
    /// view, every rank's address and who else it admits; their links stay
    /// open until the new view's mesh is up.
    pub(super) async fn send_admissions(
        &mut self,
        decision: &ViewDecision,
        joiners: &[(usize, SocketAddr)],
    ) {
        for &(r, addr) in joiners {
            self.membership.addresses[r] = addr;
        }
        let table = AddressTable(self.membership.addresses.clone()).encode();
        let admitted = Joiners(joiners.to_vec()).encode();
        let waiting: Vec<(Link, JoinRequest)> = {
            let mut w = lock(&self.membership.waiting);
            let (mine, rest) = w
                .drain(..)
                .partition(|(_, req)| joiners.iter().any(|j| j.0 == req.rank));
            *w = rest;
            mine
        };
        let t = tag(decision.epoch, Kind::Admit);
        for (mut link, req) in waiting {
            let sender = link.sender();
            for body in [decision.encode(), table.clone(), admitted.clone()] {
                if let Err(e) = sender.send_message(t, Bytes::from(body)).await {
                    tracing::info!(rank = req.rank, %e, "the admission did not go out");
                }
            }
            self.membership.admitting.push(link);
        }
    }

    /// The ranks the last [`admit`](Self::admit) (or, on a rank that
    /// rejoined, its admission) brought in.
    pub fn joined(&self) -> &[usize] {
        self.membership.keeper.joined()
    }

    /// What this member says in its `Done`: the ranks waiting at it (after
    /// refusing those that cannot rejoin).
    pub(super) fn waiting_announcement(&mut self) -> Bytes {
        take_requests(&self.endpoint, &self.membership.waiting);
        let members = self.members().to_vec();
        let world = self.membership.joined_world;
        let mut w = lock(&self.membership.waiting);
        w.retain(
            |(link, req)| match admission::screen(req, &members, world) {
                Ok(()) => true,
                Err(why) => {
                    let why = why.to_string();
                    tracing::warn!(rank = req.rank, %why, "refused a rank asking to rejoin");
                    refuse(link, &why);
                    false
                }
            },
        );
        let mut ranks: Vec<(usize, SocketAddr)> =
            w.iter().map(|(_, r)| (r.rank, r.listen)).collect();
        ranks.sort_unstable_by_key(|r| r.0);
        ranks.dedup_by_key(|r| r.0);
        Bytes::from(Joiners(ranks).encode())
    }
}

/// Asks the first contact that answers to admit this rank, and waits for
/// the admission: the view, every rank's address, and the ranks admitted
/// with it.
async fn ask(
    config: &GroupConfig,
    endpoint: &Endpoint,
    contacts: &[(usize, SocketAddr)],
) -> Result<(Link, ViewDecision, Vec<SocketAddr>, Vec<usize>), GroupError> {
    let world = config.world;
    let mut round = 0u32;
    loop {
        for &(contact, addr) in contacts {
            let attempt = tokio::time::timeout(
                Duration::from_secs(4) * (round + 1),
                dial(config, endpoint, contact, addr),
            );
            let mut link = match attempt.await {
                Ok(Ok(link)) => link,
                Ok(Err(e @ GroupError::Refused { .. })) => return Err(e),
                Ok(Err(e)) => {
                    tracing::info!(contact, %e, "no member there; trying the next");
                    continue;
                }
                Err(_) => continue,
            };
            let request = JoinRequest {
                rank: config.rank,
                world,
                listen: listen_address(endpoint, &link, addr)?,
                member_of: None,
            };
            link.sender()
                .send_message(tag(0, Kind::Join), request.encode().into())
                .await
                .map_err(|source| GroupError::Rank {
                    rank: contact,
                    source,
                })?;
            tracing::info!(
                rank = config.rank,
                contact,
                "asked to rejoin; waiting for the members to admit it"
            );
            let decision = match admission_message(&mut link, contact).await {
                Ok(body) => ViewDecision::decode(&body, world).map_err(out_of_step(contact))?,
                // Refused (a member with this rank, a world of another
                // size): the contact says why, and no other will differ.
                Err(GroupError::Rank {
                    source: crate::link::LinkError::Rejected { reason, .. },
                    ..
                }) => {
                    return Err(GroupError::Removed {
                        rank: config.rank,
                        epoch: 0,
                        why: format!("rank {contact} refused it: {reason}"),
                    })
                }
                // The contact went away (or took this connection for
                // something else while forming a view): ask again.
                Err(e) => {
                    tracing::info!(contact, %e, "no admission; asking again");
                    continue;
                }
            };
            let body = admission_message(&mut link, contact).await?;
            let table = AddressTable::decode(&body, world)
                .map_err(out_of_step(contact))?
                .0;
            let body = admission_message(&mut link, contact).await?;
            let joiners = Joiners::decode(&body, world).map_err(out_of_step(contact))?;
            let joiners = joiners.0.into_iter().map(|j| j.0).collect();
            return Ok((link, decision, table, joiners));
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The next message of a rank's admission from `contact`.
async fn admission_message(link: &mut Link, contact: usize) -> Result<Bytes, GroupError> {
    let (t, body) = link
        .receiver()
        .recv_message()
        .await
        .map_err(|source| GroupError::Rank {
            rank: contact,
            source,
        })?;
    match t & 0xff == Kind::Admit as u64 {
        true => Ok(body),
        false => Err(GroupError::OutOfStep {
            rank: contact,
            what: "a message other than its admission".into(),
        }),
    }
}

fn out_of_step(contact: usize) -> impl Fn(GroupMessageError) -> GroupError {
    move |e| GroupError::OutOfStep {
        rank: contact,
        what: e.to_string(),
    }
}
