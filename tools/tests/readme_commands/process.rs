//! A child process for the README check: its stdout and stderr read line by
//! line on threads, waits that end on an event (a line, the exit) or at a
//! deadline, and a kill when it is dropped still running, so that no
//! server outlives a failed check.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How often a wait looks at the child's exit status between lines.
const EXIT_CHECK: Duration = Duration::from_millis(20);
/// How long output may still come after the exit (a grandchild holding
/// the pipes does not hold up the check for longer).
const DRAIN: Duration = Duration::from_secs(5);
/// Lines of output a failure quotes.
const TAIL_LINES: usize = 15;

/// A running command and everything it printed so far.
pub struct Running {
    child: Child,
    lines: Receiver<String>,
    output: Vec<String>,
    exited: Option<std::process::ExitStatus>,
}

impl Running {
    /// Starts `command` with its output piped.
    pub fn spawn(command: &mut Command) -> Result<Self, String> {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", command.get_program()))?;
        let (tx, lines) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            forward(out, tx.clone());
        }
        if let Some(err) = child.stderr.take() {
            forward(err, tx);
        }
        Ok(Self {
            child,
            lines,
            output: Vec::new(),
            exited: None,
        })
    }

    /// Waits for a line (stdout or stderr) for which `find` returns
    /// something, and returns that; an error if the process ends first or
    /// the deadline passes.
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        limit: Duration,
        find: impl Fn(&str) -> Option<T>,
    ) -> Result<T, String> {
        let deadline = Instant::now() + limit;
        let mut seen = self.output.len();
        loop {
            if let Some(found) = self.output[seen..].iter().find_map(|l| find(l)) {
                return Ok(found);
            }
            seen = self.output.len();
            if self.exited.is_some() {
                return Err(format!("ended before {what}"));
            }
            if Instant::now() >= deadline {
                return Err(format!("no {what} within {limit:?}"));
            }
            self.pump(deadline);
        }
    }

    /// Waits for the process to end, within `limit`; an error if it failed
    /// or had to be killed.
    pub fn finish(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        while self.exited.is_none() {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                return Err(format!("still running after {limit:?}; killed"));
            }
            self.pump(deadline);
        }
        // The rest of the output, which may trail the exit.
        let drained = Instant::now() + DRAIN;
        while let Ok(line) = self
            .lines
            .recv_timeout(drained.saturating_duration_since(Instant::now()))
        {
            self.output.push(line);
        }
        match self.exited {
            Some(status) if status.success() => Ok(()),
            Some(status) => Err(format!("failed ({status})")),
            None => Err("its exit status was lost".to_string()),
        }
    }

    /// Takes the output that came within one exit check (or until the
    /// deadline), and notes the exit.
    fn pump(&mut self, deadline: Instant) {
        let wait = EXIT_CHECK.min(deadline.saturating_duration_since(Instant::now()));
        match self.lines.recv_timeout(wait) {
            Ok(line) => {
                self.output.push(line);
                while let Ok(line) = self.lines.try_recv() {
                    self.output.push(line);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            // Both pipes closed: the exit follows; wait for it by the
            // deadline all the same.
            Err(RecvTimeoutError::Disconnected) => {
                std::thread::park_timeout(wait);
            }
        }
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
    }

    /// Everything it printed, stdout and stderr interleaved as they came.
    pub fn output_text(&self) -> String {
        self.output.join("\n")
    }

    /// The last lines of its output, indented, for a failure message.
    pub fn tail(&self) -> String {
        let from = self.output.len().saturating_sub(TAIL_LINES);
        self.output[from..]
            .iter()
            .map(|l| format!("      | {l}\n"))
            .collect()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends each line of `pipe` to `tx` from a thread of its own.
fn forward(pipe: impl Read + Send + 'static, tx: mpsc::Sender<String>) {
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
}
