//! Asynchronous training through the parameter server over gradlane links:
//! OrMo against ASGD, synchronous SGD with momentum, and ASGD behind the
//! straggler filter, side by side in one run.
//!
//! ```text
//! cargo run --release --bin ps_train                 # everything on loopback
//! cargo run --release --bin ps_train -- server --help
//! cargo run --release --bin ps_train -- worker --help
//! ```
//!
//! Without a subcommand the example starts, for each algorithm in turn, one
//! server process and K worker processes (itself, with `server` and
//! `worker`) on loopback, with seeded injected loss on every worker's link
//! and per-worker speed skew (worker i computes `skew_i` times slower, 1x to
//! 4x by default, or one `--straggler` among workers spread up to
//! `--slowest`). The model is a small MLP ([`gradlane_tools::mlp`]) on a
//! synthetic classification problem that a linear model cannot solve. The
//! server evaluates the parameters on a held-out set every `--eval-ms` and
//! prints them; this process collects those lines into a loss/accuracy
//! table over time and a summary (updates applied and dropped, each
//! worker's share dropped, staleness, steps and time to target). The
//! straggler filter runs once per `--policies` x `--thresholds`. A worker
//! or server that fails ends the run at once, naming it.
//!
//! Across hosts: run `ps_train server --listen 0.0.0.0:4433 --algo ormo`
//! on one machine and `ps_train worker --connect HOST:4433 --id i` (i from
//! 0 to K-1) on others, with certificates from `cargo run --bin certs`.
//! The server hands every worker the dataset seed and batch size when it
//! joins. Under SSGD a round that does not fill within `--round-timeout`
//! seconds ends the run with a message naming the workers that never
//! joined; a worker stops at `--seconds` whatever it is waiting for.

mod args;
mod error;
mod orchestrate;
mod processes;
mod report;
mod runs;
mod server;
mod settings;
mod tips;
mod welcome;
mod worker;

use gradlane_tools::cli as common;

use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::process::ExitCode;

use args::{AllArgs, ServerArgs, WorkerArgs};

/// Train an MLP through the gradlane parameter server.
///
/// Options before a subcommand belong to the loopback comparison alone: with
/// a subcommand they are refused (not silently dropped), and an option given
/// to the wrong role is refused with a tip naming the role that takes it.
#[derive(Debug, Parser)]
#[command(name = "ps_train", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    #[command(flatten)]
    all: AllArgs,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Serve one algorithm to K workers; prints evaluation lines.
    Server(ServerArgs),
    /// One worker: pull, compute, push until the time is up.
    Worker(WorkerArgs),
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let cli =
        Cli::try_parse_from(&args).unwrap_or_else(|e| tips::with_placement_tip(e, &args).exit());
    match cli.role {
        Some(Role::Server(a)) => common::main_with("ps_train server", a, server::serve),
        Some(Role::Worker(a)) => common::main_with("ps_train worker", a, worker::work),
        None => match orchestrate::orchestrate(cli.all) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ps_train: {}", common::chain(e.as_ref()));
                ExitCode::FAILURE
            }
        },
    }
}
