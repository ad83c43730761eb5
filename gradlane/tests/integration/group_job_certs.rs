//! Groups whose certificate names the job, not the ranks' addresses
//! (`certs --job`): a group forms on addresses the certificate does not
//! name, and a rank of another CA or another job is refused with an error
//! that names it and says why, with no link (so no message) to it.

use crate::common;

use common::{at_root, free_port, group_config};
use gradlane::{
    cert_job_name, generate_job_certs, job_server_name, Group, GroupError, HandshakeFailure,
    PeerCertError, ReduceOp, Refuser,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A fresh directory for one test's certificates.
fn dir(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gradlane-test-job-{tag}-{}", std::process::id()))
}

/// A job's certificate with a fresh CA, or signed by the CA in `ca`.
fn job_certs(tag: &str, job: &str, ca: Option<&Path>) -> PathBuf {
    let d = dir(tag);
    generate_job_certs(&d, job, ca).unwrap();
    d
}

/// Rank `rank` of a group of two meeting at `root`, with the certificates
/// in `dir` and a short join timeout (the refused rank never joins).
fn rank(dir: &Path, rank: usize, root: SocketAddr) -> gradlane::GroupConfig {
    let mut c = group_config(dir, rank, 2, at_root(root));
    c.join_timeout = Duration::from_secs(3);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_certificate_forms_a_group_on_addresses_it_does_not_name() {
    let dir = job_certs("formed", "Train-7", None);
    // The certificate names the job alone (in lower case): no address.
    assert_eq!(
        cert_job_name(&dir.join("server.pem")).unwrap().as_deref(),
        Some("train-7")
    );
    let world = 3;
    let root = free_port();
    let joins = (0..world).map(|r| Group::join(group_config(&dir, r, world, at_root(root))));
    let mut groups: Vec<Group> = futures_util::future::join_all(joins)
        .await
        .into_iter()
        .map(|g| g.expect("a job's ranks on 127.0.0.1 join"))
        .collect();
    assert_eq!(groups[0].endpoint().job(), Some("train-7"));
    let sums = futures_util::future::join_all(groups.iter_mut().map(|g| async move {
        let mut v = vec![g.rank() as f32 + 1.0; 5];
        g.allreduce(&mut v, ReduceOp::Sum).await.unwrap();
        v
    }))
    .await;
    assert!(sums.iter().all(|v| v == &vec![6.0; 5]), "{sums:?}");
    futures_util::future::join_all(groups.into_iter().map(|g| g.close())).await;
}

/// The message and the failed handshakes of a join error that must
/// name rank 1, and only it, as missing.
fn missing_rank_1(e: GroupError) -> (String, Vec<(SocketAddr, HandshakeFailure)>) {
    let text = e.to_string();
    let GroupError::Missing {
        missing, failed, ..
    } = e
    else {
        panic!("not a missing rank: {text}")
    };
    assert_eq!(missing, vec![1], "{text}");
    (text, failed)
}

/// Rank 0 listens with `bad`'s certificate; rank 1, with `good`'s,
/// connects to it and refuses it: rank 1's error names rank 0, its
/// address and why, and rank 0 never gets a link to rank 1, and its join
/// error says why rank 1 parted (the handshake failure it saw).
async fn refused_by_the_connecting_rank(
    good: &Path,
    bad: &Path,
) -> (PeerCertError, HandshakeFailure) {
    let root = free_port();
    let (g0, g1) = tokio::join!(
        Group::join(rank(bad, 0, root)),
        Group::join(rank(good, 1, root))
    );
    let seen_by_root = match g0 {
        Err(e @ GroupError::Missing { .. }) => {
            let (text, failed) = missing_rank_1(e);
            let (addr, why) = failed.first().cloned().unwrap_or_else(|| panic!("{text}"));
            assert!(addr.ip().is_loopback(), "{text}");
            assert!(text.contains(&why.to_string()), "{text}");
            why
        }
        other => panic!("rank 0 formed a link with the refused rank: {other:?}"),
    };
    match g1 {
        Err(e @ GroupError::Refused { rank: 0, addr, .. }) if addr == root => {
            let text = e.to_string();
            assert!(
                text.starts_with(&format!("rank 0 at {root} refused: ")),
                "{text}"
            );
            let GroupError::Refused { reason, .. } = e else {
                unreachable!()
            };
            (reason, seen_by_root)
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_of_another_ca_is_refused_naming_it() {
    let good = job_certs("ca-good", "train-7", None);
    // The same job name, another CA.
    let bad = job_certs("ca-bad", "train-7", None);
    let (reason, seen_by_root) = refused_by_the_connecting_rank(&good, &bad).await;
    assert_eq!(reason, PeerCertError::UnknownCa);
    assert!(reason.to_string().contains("unknown CA"), "{reason}");
    assert_eq!(
        seen_by_root,
        HandshakeFailure::WrongCa { by: Refuser::Peer }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_of_another_job_is_refused_naming_it() {
    let good = job_certs("job-good", "train-7", None);
    // The same CA, another job.
    let bad = job_certs("job-bad", "train-8", Some(&good));
    let (reason, seen_by_root) = refused_by_the_connecting_rank(&good, &bad).await;
    assert_eq!(
        seen_by_root,
        HandshakeFailure::WrongJob { by: Refuser::Peer }
    );
    assert_eq!(
        reason,
        PeerCertError::WrongJob {
            got: "train-8".into(),
            expected: "train-7".into()
        }
    );
    assert_eq!(
        reason.to_string(),
        r#"wrong job name "train-8", expected "train-7""#
    );
}

/// The accepting side checks too: a rank of another job that claims this
/// job's name for the server it reaches (so its own check passes) is
/// refused by the rank it connects to, which says who and why when it
/// gives up waiting; no hello, no link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_accepting_rank_refuses_another_jobs_certificate() {
    let good = job_certs("accept-good", "train-7", None);
    let bad = job_certs("accept-bad", "train-8", Some(&good));
    let root = free_port();
    let mut impostor = rank(&bad, 1, root);
    impostor.server_name = Some(job_server_name("train-7"));
    let (g0, g1) = tokio::join!(Group::join(rank(&good, 0, root)), Group::join(impostor));
    assert!(g1.is_err(), "the refused rank joined: {g1:?}");
    match g0 {
        Err(e @ GroupError::Missing { .. }) => {
            let (text, failed) = missing_rank_1(e);
            assert!(!failed.is_empty(), "{text}");
            assert!(
                failed[0].0.ip().is_loopback() && failed[0].0.port() != root.port(),
                "{text}"
            );
            assert_eq!(
                failed[0].1,
                HandshakeFailure::WrongJob {
                    by: Refuser::ThisRank
                },
                "{text}"
            );
            assert!(text.contains("wrong job name: "), "{text}");
        }
        other => panic!("{other:?}"),
    }
}
