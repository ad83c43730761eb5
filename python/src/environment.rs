//! Every `GRADLANE_*` variable the native module reads, each read and
//! checked here only (those it shares with the command-line tools, in
//! [`gradlane::environment`]); a bad value is a ValueError naming the
//! variable. The torch backend's own variables (the failure policy,
//! addresses, asynchrony) are read in `gradlane/torch/_environment.py`,
//! which asks this module for the port range and the certificates, so
//! that each has one check.

use crate::errors::CallError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::path::PathBuf;

/// The certificate directory when the Group is given no `cert_dir`.
pub(crate) const CERT_DIR_ENV: &str = "GRADLANE_CERT_DIR";

/// A group's sockets when the constructor is not told.
pub(crate) const SOCKETS_ENV: &str = "GRADLANE_SOCKETS";

/// The UDP ports every socket of a rank takes, for a firewall.
pub(crate) const PORT_RANGE_ENV: &str = "GRADLANE_PORT_RANGE";

/// What gradlane logs to stderr (tracing's `EnvFilter` syntax: `info`,
/// `gradlane=debug`, `off`).
pub(crate) const LOG_ENV: &str = "GRADLANE_LOG";

/// The files every rank needs in its certificate directory.
const CERT_FILES: [&str; 3] = ["ca.pem", "server.pem", "server.key"];

/// How to make them, for the errors that find them missing.
const MAKE_CERTS: &str = "gradlane.generate_job_certs(dir, job) or `certs --job JOB` makes \
     them for any address, gradlane.generate_certs(dir, [hosts]) for those hosts; every rank \
     uses the same files";

/// A group's certificate directory: `asked`, else `GRADLANE_CERT_DIR`
/// ([`env_cert_dir`]).
pub(crate) fn cert_dir(asked: Option<PathBuf>) -> Result<PathBuf, CallError> {
    match asked {
        Some(d) => Ok(d),
        None => env_cert_dir().map_err(CallError::Value),
    }
}

/// `GRADLANE_CERT_DIR`, once it names a directory with the three files;
/// else what is wrong, and how to make them.
fn env_cert_dir() -> Result<PathBuf, String> {
    let Some(dir) = std::env::var_os(CERT_DIR_ENV).filter(|d| !d.is_empty()) else {
        return Err(format!(
            "set {CERT_DIR_ENV} to a directory with ca.pem, server.pem and server.key \
             ({MAKE_CERTS})"
        ));
    };
    let dir = PathBuf::from(dir);
    let missing: Vec<&str> = CERT_FILES
        .into_iter()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    match missing.is_empty() {
        true => Ok(dir),
        false => Err(format!(
            "{CERT_DIR_ENV} {:?} has no {} ({MAKE_CERTS})",
            dir.display().to_string(),
            missing.join(", ")
        )),
    }
}

/// `GRADLANE_CERT_DIR`, checked as a Group checks it when given no
/// `cert_dir`: set, and holding ca.pem, server.pem and server.key; else
/// a ValueError saying what is missing and how to make it.
#[pyfunction]
pub(crate) fn cert_dir_from_env() -> PyResult<String> {
    let dir = env_cert_dir().map_err(PyValueError::new_err)?;
    Ok(dir.to_string_lossy().into_owned())
}

/// `text` as a port range, or a ValueError naming where it came `from`.
pub(crate) fn port_range(text: &str, from: &str) -> PyResult<gradlane::PortRange> {
    text.parse()
        .map_err(|e: gradlane::PortRangeError| PyValueError::new_err(format!("{from}: {e}")))
}

/// A group's port range: `asked`, else `GRADLANE_PORT_RANGE`, else none
/// (any free port).
pub(crate) fn group_port_range(asked: Option<&str>) -> PyResult<Option<gradlane::PortRange>> {
    match asked {
        Some(text) => port_range(text, "port_range").map(Some),
        None => match std::env::var(PORT_RANGE_ENV) {
            Ok(text) if !text.trim().is_empty() => port_range(&text, PORT_RANGE_ENV).map(Some),
            _ => Ok(None),
        },
    }
}

/// `n` as a socket count, or a ValueError naming where it came `from`.
pub(crate) fn socket_count(n: i64, from: &str) -> PyResult<usize> {
    match usize::try_from(n) {
        Ok(n) if (1..=gradlane::MAX_SOCKETS).contains(&n) => Ok(n),
        _ => Err(PyValueError::new_err(format!(
            "{from} {n} is not a socket count in 1..={}",
            gradlane::MAX_SOCKETS
        ))),
    }
}

/// A group's sockets: `asked`, else `GRADLANE_SOCKETS`, else the
/// library's default ([`gradlane::default_sockets`]).
pub(crate) fn group_sockets(asked: Option<i64>) -> PyResult<usize> {
    if let Some(n) = asked {
        return socket_count(n, "sockets");
    }
    if let Ok(text) = std::env::var(SOCKETS_ENV) {
        let n = text.trim().parse::<i64>().map_err(|_| {
            PyValueError::new_err(format!("{SOCKETS_ENV}={text:?} is not a socket count"))
        })?;
        return socket_count(n, SOCKETS_ENV);
    }
    Ok(gradlane::default_sockets(
        gradlane::environment::local_world_size(),
    ))
}

/// The runtime's worker threads: `GRADLANE_THREADS`, else, for a rank
/// with at least 4 cores to itself ([`gradlane::core_share`]: torchrun's
/// `LOCAL_WORLD_SIZE` ranks share the host), twice its share, at most 8
/// (its tasks wait on the network more than they compute); else 2.
/// quinn's drivers, the links' tasks and the sealing and opening of
/// packets run there, the collective itself on the calling thread.
pub(crate) fn worker_threads() -> Result<usize, CallError> {
    let asked = gradlane::environment::threads().map_err(|e| CallError::Value(e.to_string()))?;
    if let Some(n) = asked {
        return Ok(n);
    }
    Ok(
        match gradlane::core_share(gradlane::environment::local_world_size()) {
            share if share >= 4 => (2 * share).min(8),
            _ => 2,
        },
    )
}

/// What to log to stderr: `GRADLANE_LOG`, else warnings and errors. A
/// filter tracing cannot parse is reported once on stderr, not ignored.
pub(crate) fn log_filter() -> tracing_subscriber::EnvFilter {
    match std::env::var(LOG_ENV) {
        Ok(text) if !text.trim().is_empty() => tracing_subscriber::EnvFilter::try_new(&text)
            .unwrap_or_else(|e| {
                eprintln!(
                    "gradlane: {LOG_ENV}={text:?} is not a log filter ({e}); logging warnings"
                );
                tracing_subscriber::EnvFilter::new("warn")
            }),
        _ => tracing_subscriber::EnvFilter::new("warn"),
    }
}

/// `GRADLANE_PORT_RANGE` as `(lo, hi)`, or None where unset; a ValueError
/// naming it where it is not a range. The torch backend asks here, so the
/// range is parsed once, as the Group parses it.
#[pyfunction]
pub(crate) fn port_range_from_env() -> PyResult<Option<(u16, u16)>> {
    let range = group_port_range(None)?;
    Ok(range.map(|r| (r.lo(), r.hi())))
}
