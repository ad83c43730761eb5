//! `gradlane._native`: gradlane's [`Group`](gradlane::Group) for Python.
//!
//! The pure-Python package `gradlane` (python/gradlane) re-exports what is
//! here; users import `gradlane`, never `gradlane._native`.
//!
//! - `group`: the `Group` class, joining, its exact collectives and close;
//!   `group_differentiated` (buckets, the differentiated allreduce, the
//!   sparse allgather), `group_movement` (typed reductions and data
//!   movement), `group_point_to_point` (send, recv): its other methods.
//! - `buffer`: Python buffers as Rust slices without a copy (the only
//!   unsafe code, with its safety argument).
//! - `errors`: the exception classes and the mapping of Rust errors.
//! - `group_exit`: every open group closed (its messages flushed) as the
//!   process exits; `group_state`: the joined state both it and `group`
//!   hold.
//! - `codec`: the sparse log-quantized codec's frames (encode, decode).
//! - `settings`: the `Settings` class, every knob of a Group, its buckets
//!   and the torch hook, with the library's defaults and checks.
//! - `environment`: every `GRADLANE_*` variable the module reads, checked.
//!
//! Every network call runs on one tokio runtime per process (two worker
//! threads, made at the first call) with the GIL released, so other Python
//! threads run meanwhile. Nothing here panics on bad input from Python:
//! every check is an exception.

// Its macros are the Group's: declared first, so `group` sees them.
#[macro_use]
mod buffer;
mod codec;
mod environment;
mod errors;
mod group;
mod group_arguments;
mod group_differentiated;
mod group_exit;
mod group_movement;
mod group_point_to_point;
mod group_report;
mod group_state;
mod settings;

use errors::CallError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::OnceLock;
use tokio::runtime::Runtime;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The process's runtime and the id of the process that made it.
static RUNTIME: OnceLock<Result<(u32, Runtime), String>> = OnceLock::new();

/// The process's tokio runtime, made at the first call, with
/// [`environment::worker_threads`] threads.
///
/// A fork copies the runtime's memory but not its threads: in a forked
/// child of a process that had already used gradlane the runtime is dead,
/// and using it would hang. That is an error instead.
pub(crate) fn runtime() -> Result<&'static Runtime, CallError> {
    let made = RUNTIME.get_or_init(|| {
        let threads = environment::worker_threads().map_err(|e| e.to_string())?;
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("gradlane")
            .enable_all()
            .build()
            .map(|rt| (std::process::id(), rt))
            .map_err(|e| e.to_string())
    });
    match made {
        Ok((pid, rt)) if *pid == std::process::id() => Ok(rt),
        Ok(_) => Err(CallError::Runtime(
            "gradlane was used before this process was forked, and a fork does not copy \
             its runtime's threads: start ranks with multiprocessing's \"spawn\" or \
             \"forkserver\", or use gradlane only after forking"
                .into(),
        )),
        Err(e) => Err(CallError::Runtime(format!(
            "cannot start gradlane's runtime: {e}"
        ))),
    }
}

/// Makes a fresh CA and a certificate signed by it for a job, valid for
/// every name in `names` (IP addresses or DNS names: those the ranks reach
/// each other by, e.g. "127.0.0.1" on one machine), and writes ca.pem,
/// ca.key, server.pem and server.key into `dir` (created if needed; keys
/// with mode 0600). Existing files are overwritten.
///
/// Give every rank the same directory (`Group(cert_dir=...)` or the
/// environment variable GRADLANE_CERT_DIR); ca.key is needed by nobody
/// after this call.
///
/// Returns a dict of the paths written: "ca_cert", "ca_key",
/// "server_cert", "server_key".
///
/// Raises ValueError for no names or a name that is neither an IP address
/// nor a DNS name, OSError when the files cannot be written.
#[pyfunction]
fn generate_certs<'py>(
    py: Python<'py>,
    dir: PathBuf,
    names: Vec<String>,
) -> PyResult<Bound<'py, PyDict>> {
    // Key generation takes milliseconds: let other threads run meanwhile.
    let files = py
        .detach(|| gradlane::generate_certs(&dir, &names))
        .map_err(errors::certs_error)?;
    paths_dict(py, files)
}

/// Makes a certificate for the job `job` that names the job, not the
/// ranks' addresses (the DNS name "JOB.job.gradlane"), and writes ca.pem,
/// ca.key, server.pem and server.key into `dir` as generate_certs does:
/// for a job whose hosts are known only when it runs. Every rank given
/// the directory checks its peers against ca.pem and the job name instead
/// of their IP; a peer of another CA or job is refused, naming it.
///
/// With `ca_dir`, signs with the CA (ca.pem, ca.key) there instead of a
/// fresh one: ca.pem is copied into `dir`, ca.key is not (the returned
/// "ca_key" is the CA's own).
///
/// Returns the same dict as generate_certs. Raises ValueError for a job
/// name that is not one DNS label (letters, digits, '-'), OSError when a
/// file cannot be read or written.
#[pyfunction]
#[pyo3(signature = (dir, job, ca_dir = None))]
fn generate_job_certs<'py>(
    py: Python<'py>,
    dir: PathBuf,
    job: String,
    ca_dir: Option<PathBuf>,
) -> PyResult<Bound<'py, PyDict>> {
    let files = py
        .detach(|| gradlane::generate_job_certs(&dir, &job, ca_dir.as_deref()))
        .map_err(errors::certs_error)?;
    paths_dict(py, files)
}

/// The paths the certificate makers wrote, as the dict both return.
fn paths_dict(py: Python<'_>, files: gradlane::CertFiles) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("ca_cert", files.ca_cert)?;
    out.set_item("ca_key", files.ca_key)?;
    out.set_item("server_cert", files.server_cert)?;
    out.set_item("server_key", files.server_key)?;
    Ok(out)
}

/// gradlane's warnings to stderr (by default warnings and errors only), so
/// that a user sees at once what a rank refused, say, and not only when a
/// timeout ends. Leaves alone a subscriber the process already has.
fn log_to_stderr() {
    let filter = environment::log_filter();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// The native module of the `gradlane` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    log_to_stderr();
    m.add_function(wrap_pyfunction!(generate_certs, m)?)?;
    m.add_function(wrap_pyfunction!(environment::port_range_from_env, m)?)?;
    m.add_function(wrap_pyfunction!(environment::cert_dir_from_env, m)?)?;
    m.add_function(wrap_pyfunction!(generate_job_certs, m)?)?;
    m.add_class::<group::PyGroup>()?;
    m.add_class::<settings::Settings>()?;
    m.add_function(wrap_pyfunction!(group_exit::close_groups_at_exit, m)?)?;
    m.add_function(wrap_pyfunction!(codec::codec_encode, m)?)?;
    m.add_function(wrap_pyfunction!(codec::codec_decode, m)?)?;
    m.add_function(wrap_pyfunction!(codec::codec_decode_add, m)?)?;
    m.add_function(wrap_pyfunction!(codec::codec_header, m)?)?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
