//! The loopback comparison's child processes: reading their output on
//! threads, watching them so a failed one ends the run at once, and
//! killing any still running when the run ends early.

use std::io::Read;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::error::TrainError;

/// The server's stdout lines, read on a thread so the orchestrator can
/// watch the workers while it waits for them; the channel closes when the
/// server closes its stdout.
pub(crate) fn forward_lines(
    lines: impl Iterator<Item = std::io::Result<String>> + Send + 'static,
) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// A worker's whole stdout, read on a thread so its pipe never fills.
pub(crate) fn collect_output(
    out: Option<std::process::ChildStdout>,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut o) = out {
            let _ = o.read_to_string(&mut s);
        }
        s
    })
}

/// Worker `i`'s `pushes=` and `dropped=` from its output.
pub(crate) fn worker_counts(out: &str, i: usize) -> Option<(u64, u64)> {
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("worker {i} pushes=")))?;
    let pushes = field(line, "pushes").parse().ok()?;
    let dropped = field(line, "dropped").parse().ok()?;
    Some((pushes, dropped))
}

/// Hands the server's lines to `on_line` until the server closes its
/// stdout, and meanwhile watches the workers: one that exits with an error
/// ends the run at once, naming it (the caller's guards then stop the
/// rest). Then waits for the server and reports its failure, if any.
pub(crate) fn supervise(
    run: &str,
    server: &mut Guard,
    lines: mpsc::Receiver<String>,
    workers: &mut [Guard],
    mut on_line: impl FnMut(&str),
) -> Result<(), TrainError> {
    let started = Instant::now();
    let worker_failed = |workers: &mut [Guard]| -> Option<TrainError> {
        workers
            .iter_mut()
            .enumerate()
            .find_map(|(index, w)| match w.0.try_wait() {
                Ok(Some(status)) if !status.success() => Some(TrainError::WorkerFailed {
                    run: run.to_string(),
                    index,
                    status,
                    after: started.elapsed().as_secs_f64(),
                }),
                _ => None,
            })
    };
    loop {
        match lines.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => on_line(&line),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if let Some(e) = worker_failed(workers) {
            return Err(e);
        }
    }
    let status = server
        .0
        .wait()
        .map_err(|e| TrainError::Invalid(format!("{run}: cannot wait for the server: {e}")))?;
    // A server that failed took its workers' links with it: it is the
    // cause, whatever they report.
    if !status.success() {
        return Err(TrainError::ServerFailed {
            run: run.to_string(),
            status,
        });
    }
    for w in workers.iter_mut() {
        let _ = w.0.wait();
    }
    match worker_failed(workers) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Kills a child process that is still running when dropped (an error
/// path), so no server outlives the example.
pub(crate) struct Guard(pub(crate) Child);

impl Guard {
    pub(crate) fn spawn(command: &mut Command) -> std::io::Result<Self> {
        command.spawn().map(Guard)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub(crate) fn field<'a>(done: &'a str, key: &str) -> &'a str {
    done.split(' ')
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or("-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::TrainError;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    fn sh(script: &str, stdout: Stdio) -> Guard {
        Guard::spawn(Command::new("sh").arg("-c").arg(script).stdout(stdout)).unwrap()
    }

    /// A worker that dies is reported while the server still runs: the
    /// server here would print nothing and close its stdout only when
    /// killed, so `supervise` returning at all means it did not wait for it.
    #[test]
    fn a_dead_worker_ends_the_run_at_once() {
        let mut server = sh("exec sleep 600", Stdio::piped());
        let lines = BufReader::new(server.0.stdout.take().unwrap()).lines();
        let mut workers = vec![
            sh("exec sleep 600", Stdio::null()),
            sh("exit 3", Stdio::null()),
        ];
        let mut seen = Vec::new();
        let e = supervise(
            "asgd",
            &mut server,
            forward_lines(lines),
            &mut workers,
            |l| seen.push(l.to_string()),
        )
        .unwrap_err();
        match &e {
            TrainError::WorkerFailed {
                run, index, status, ..
            } => {
                assert_eq!((run.as_str(), *index), ("asgd", 1));
                assert_eq!(status.code(), Some(3));
            }
            other => panic!("expected a failed worker, got {other:?}"),
        }
        assert!(e.to_string().starts_with("asgd: worker 1 failed"), "{e}");
        assert!(seen.is_empty());
        // The guards stop the server and the other worker.
        drop(workers);
        drop(server);
    }

    /// The server's lines reach the caller; a server that fails is named
    /// once its output ends, even if its workers fail with it.
    #[test]
    fn server_lines_are_passed_on_and_its_failure_named() {
        let mut server = sh(
            "echo eval 0.1 2 0.5 0.8; echo done applied=2; exit 4",
            Stdio::piped(),
        );
        let lines = BufReader::new(server.0.stdout.take().unwrap()).lines();
        let mut workers = vec![sh("exit 0", Stdio::null())];
        let mut seen = Vec::new();
        let e = supervise(
            "ssgd",
            &mut server,
            forward_lines(lines),
            &mut workers,
            |l| seen.push(l.to_string()),
        )
        .unwrap_err();
        assert!(matches!(e, TrainError::ServerFailed { .. }), "{e:?}");
        assert_eq!(seen, ["eval 0.1 2 0.5 0.8", "done applied=2"]);

        let mut server = sh("echo done applied=0", Stdio::piped());
        let lines = BufReader::new(server.0.stdout.take().unwrap()).lines();
        let mut workers = vec![sh("exit 0", Stdio::null())];
        supervise(
            "asgd",
            &mut server,
            forward_lines(lines),
            &mut workers,
            |_| {},
        )
        .unwrap();
    }
}
