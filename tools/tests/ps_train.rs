//! `ps_train` as a new user runs it: separate processes, flags, messages.
//!
//! Every wait here is for a process to end; the limit on it is a safety net
//! that turns a hang into a failure, not a measurement.

use gradlane::generate_certs;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_ps_train");

/// Long enough for a loaded 2-core machine; a hang ends here.
const LIMIT: Duration = Duration::from_secs(120);

fn cert_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gradlane-pstrain-{tag}-{}", std::process::id()));
    generate_certs(&dir, &["localhost"]).unwrap();
    dir
}

/// A child process, killed if the test ends before it does, with its
/// output read on threads so its pipes never fill.
struct Proc {
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

fn read_all<R: Read + Send + 'static>(r: Option<R>) -> Option<JoinHandle<String>> {
    r.map(|mut r| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    })
}

impl Proc {
    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(EXE)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = read_all::<ChildStderr>(child.stderr.take());
        Self {
            stdout: None,
            stderr,
            child,
        }
        .reading_stdout()
    }

    fn reading_stdout(mut self) -> Self {
        self.stdout = read_all::<ChildStdout>(self.child.stdout.take());
        self
    }

    /// Waits for the process to end (at most [`LIMIT`]); its status, stdout
    /// and stderr.
    fn finish(mut self) -> (ExitStatus, String, String) {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                start.elapsed() < LIMIT,
                "{EXE} still running after {LIMIT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = self.stdout.take().map(|h| h.join().unwrap());
        let err = self.stderr.take().map(|h| h.join().unwrap());
        (status, out.unwrap_or_default(), err.unwrap_or_default())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A `ps_train server` on a free loopback port; returns it (its stdout
/// after the `listening` line is read on a thread) and its address.
fn server(dir: &std::path::Path, args: &[&str]) -> (Proc, String) {
    let cert = dir.join("server.pem");
    let key = dir.join("server.key");
    let mut child = Command::new(EXE)
        .arg("server")
        .args(["--listen", "127.0.0.1:0", "--eval-ms", "50"])
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr = first
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("server said {first:?}"))
        .to_string();
    let stdout = Some(std::thread::spawn(move || {
        lines.map_while(Result::ok).collect::<Vec<_>>().join("\n")
    }));
    let stderr = read_all(child.stderr.take());
    (
        Proc {
            child,
            stdout,
            stderr,
        },
        addr,
    )
}

fn worker(dir: &std::path::Path, addr: &str, args: &[&str]) -> Proc {
    let ca = dir.join("ca.pem");
    let mut all = vec!["worker", "--connect", addr, "--ca", ca.to_str().unwrap()];
    all.extend_from_slice(args);
    Proc::spawn(&all)
}

/// SSGD with two of its three workers: the server gives up on the round,
/// naming the worker that never joined, and the workers learn why.
#[test]
fn a_synchronous_round_short_of_a_worker_names_it() {
    let dir = cert_dir("ssgd-short");
    let (server, addr) = server(
        &dir,
        &[
            "--algo",
            "ssgd",
            "--workers",
            "3",
            // Long enough for both workers to join on a loaded host (a
            // worker that comes after the server gave up meets a closed
            // port, not the reason); the round never fills anyway.
            "--round-timeout",
            "5",
            "--max-seconds",
            "100",
        ],
    );
    let workers: Vec<Proc> = (0..2)
        .map(|i| worker(&dir, &addr, &["--id", &i.to_string(), "--seconds", "100"]))
        .collect();
    let (status, _, err) = server.finish();
    assert!(!status.success());
    assert!(
        err.contains("waits for worker 2 of --workers 3, never joined"),
        "{err}"
    );
    assert!(err.contains("joined: "), "{err}");
    for w in workers {
        let (status, _, err) = w.finish();
        assert!(!status.success());
        assert!(err.contains("never joined"), "{err}");
    }
}

/// A worker whose push the server holds (a synchronous round that will
/// never fill) stops at `--seconds` and says so, instead of hanging.
#[test]
fn a_worker_stops_at_its_seconds_while_the_server_holds_its_push() {
    let dir = cert_dir("seconds");
    let (server, addr) = server(
        &dir,
        &["--algo", "ssgd", "--workers", "3", "--round-timeout", "600"],
    );
    let (status, out, err) = worker(&dir, &addr, &["--id", "0", "--seconds", "1"]).finish();
    assert!(!status.success());
    assert!(
        err.contains("--seconds 1 ran out before the server answered a push"),
        "{err}"
    );
    assert!(out.contains("worker 0 pushes=0 dropped=0"), "{out}");
    drop(server);
}

/// A worker takes the dataset seed from the server: started without
/// `--seed` against a server on seed 11, it trains on the server's data
/// (one worker, no loss: the run is deterministic, and the same worker on
/// its own seed's data ended near 0.28 accuracy). Told to expect another
/// seed, it refuses.
#[test]
fn workers_take_the_dataset_seed_from_the_server() {
    let dir = cert_dir("seed");
    let args = ["--algo", "asgd", "--workers", "1", "--seed", "11"];
    let (first, addr) = server(&dir, &args);
    let (status, out, err) = worker(
        &dir,
        &addr,
        &["--id", "0", "--steps", "300", "--compute-ms", "0"],
    )
    .finish();
    assert!(status.success(), "{err}");
    assert!(
        out.contains("dataset seed 11, batch 32, from the server"),
        "{out}"
    );
    assert!(out.contains("worker 0 pushes=300"), "{out}");
    let (status, out, err) = first.finish();
    assert!(status.success(), "{err}");
    let last = out
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("eval "))
        .expect("evaluations");
    let fields: Vec<&str> = last.split(' ').collect();
    assert_eq!(fields[1], "300", "{last}");
    let accuracy: f64 = fields[3].parse().unwrap();
    assert!(accuracy >= 0.9, "accuracy {accuracy} after 300 steps");

    let (second, addr) = server(&dir, &args);
    let (status, _, err) = worker(&dir, &addr, &["--id", "0", "--seed", "7"]).finish();
    assert!(!status.success());
    assert!(
        err.contains("--seed 7 differs from the server's dataset seed 11"),
        "{err}"
    );
    drop(second);
}

/// A worker given `--workers`, as a user who started the server with it
/// writes by habit, checks it against the server's K: the same number
/// trains, another is refused with both numbers.
#[test]
fn a_worker_checks_its_workers_against_the_servers() {
    let dir = cert_dir("workers");
    let (server, addr) = server(&dir, &["--algo", "asgd", "--workers", "2"]);
    let (status, _, err) = worker(&dir, &addr, &["--id", "0", "--workers", "3"]).finish();
    assert!(!status.success());
    assert!(
        err.contains("--workers 3 differs from the server's --workers 2"),
        "{err}"
    );
    let short = ["--workers", "2", "--steps", "5", "--compute-ms", "0"];
    for id in ["0", "1"] {
        let (status, out, err) =
            worker(&dir, &addr, &[&["--id", id][..], &short].concat()).finish();
        assert!(status.success(), "{err}");
        assert!(out.contains(&format!("worker {id} pushes=5")), "{out}");
    }
    let (status, out, err) = server.finish();
    assert!(status.success(), "{err}");
    // The refused worker said hello and never trained: the server counts
    // the two that did, so it waited for worker 1 instead of stopping
    // once worker 0 had left.
    assert!(out.contains("joined=2 left=2"), "{out}");
}

/// A flag given to a role that does not take it is refused, with a tip
/// naming the role that does; a flag before the subcommand is refused, not
/// dropped, with a tip to put it after.
#[test]
fn a_misplaced_flag_is_refused_with_where_it_goes() {
    for (args, says) in [
        (
            &["worker", "--batch", "64"][..],
            "--batch is an option of `ps_train` without a subcommand (the loopback comparison) \
             and of `ps_train server`, not of `ps_train worker`",
        ),
        (
            &["server", "--algo", "ormo", "--id", "1"][..],
            "--id is an option of `ps_train worker`, not of `ps_train server`",
        ),
        (
            &["--workers", "3", "server", "--algo", "ormo"][..],
            "put --workers after `server`",
        ),
        (
            &["--algos", "ormo", "worker"][..],
            "--algos is an option of `ps_train` without a subcommand (the loopback comparison) \
             only; `ps_train worker` does not take it",
        ),
    ] {
        let (status, out, err) = Proc::spawn(args).finish();
        assert_eq!(status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?} started: {out}");
    }
}

/// The all-in-one mode checks its flags before it starts anything: no
/// certificates, no server line, an error naming the flag, a failing exit.
#[test]
fn the_all_in_one_mode_refuses_bad_flags_before_starting() {
    for (args, says) in [
        (&["--loss", "1.5"][..], "1.5 is not in [0, 1]"),
        (&["--thresholds", "0.9,1.5"][..], "--thresholds: 1.5"),
        (&["--lr", "0"][..], "learning rate 0"),
        (
            &["--workers", "3", "--skew", "1,2"][..],
            "--skew has 2 values",
        ),
        (&["--straggler", "0"][..], "--straggler 0"),
    ] {
        let mut all = vec!["--seconds", "1"];
        all.extend_from_slice(args);
        let (status, out, err) = Proc::spawn(&all).finish();
        assert!(!status.success(), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!out.contains("ps_train: MLP"), "{args:?} started: {out}");
    }
}
