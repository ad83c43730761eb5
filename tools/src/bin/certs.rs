//! Make a CA and a server certificate for gradlane endpoints.
//!
//! ```text
//! cargo run --bin certs -- --out-dir certs --san localhost --san 10.0.0.2
//! cargo run --bin certs -- --out-dir certs --job train-7
//! ```
//!
//! Give `ca.pem` to clients; `server.pem` + `server.key` to the server. Keep
//! `ca.key` private: it can sign more server certificates.
//!
//! `--job NAME` makes a certificate for a job whose addresses are not known
//! beforehand: it names the job (`NAME.job.gradlane`), not the hosts, and
//! every rank checks its peers against the CA and that name. `--ca DIR`
//! signs it with the CA in DIR instead of a fresh one.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use gradlane::{generate_certs, generate_job_certs, job_server_name};

/// Write ca.pem, ca.key, server.pem and server.key (keys mode 0600).
#[derive(Debug, Parser)]
struct Args {
    /// Directory to write the four files into (created if missing).
    #[arg(long, default_value = "certs")]
    out_dir: PathBuf,
    /// A DNS name or IP address the server certificate is valid for; repeat
    /// for several.
    #[arg(long = "san", default_values = ["localhost", "127.0.0.1", "::1"])]
    sans: Vec<String>,
    /// A certificate for this job instead of for names or addresses: the
    /// job's ranks check each other by it, on any address.
    #[arg(long, conflicts_with = "sans")]
    job: Option<String>,
    /// With --job: sign with the CA (ca.pem, ca.key) in this directory
    /// instead of a fresh one; ca.key is not copied.
    #[arg(long, requires = "job")]
    ca: Option<PathBuf>,
    /// Replace certificates and keys already in the directory (every
    /// certificate the old CA signed stops being trusted by clients given
    /// the new `ca.pem`).
    #[arg(long)]
    force: bool,
}

const FILES: [&str; 4] = ["ca.pem", "ca.key", "server.pem", "server.key"];

fn main() -> ExitCode {
    let args = Args::parse();
    // With --ca the CA's key is not written: the job's directory, handed
    // to every rank, should not hold it.
    let writes = match args.ca {
        Some(_) => &["ca.pem", "server.pem", "server.key"][..],
        None => &FILES[..],
    };
    if let Some(ca) = &args.ca {
        let same = |p: &PathBuf| p.canonicalize().ok();
        if same(ca).is_some() && same(ca) == same(&args.out_dir) {
            eprintln!("certs: --out-dir must be another directory than --ca (it goes to every rank; the CA's key must not)");
            return ExitCode::FAILURE;
        }
    }
    let existing: Vec<String> = writes
        .iter()
        .map(|f| args.out_dir.join(f))
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if !existing.is_empty() && !args.force {
        eprintln!(
            "certs: {} already exist; not replacing them without --force",
            existing.join(", ")
        );
        return ExitCode::FAILURE;
    }
    let (made, valid_for) = match &args.job {
        Some(job) => (
            generate_job_certs(&args.out_dir, job, args.ca.as_deref()),
            format!(
                "the job {:?} ({}), on any address",
                job.to_ascii_lowercase(),
                job_server_name(&job.to_ascii_lowercase())
            ),
        ),
        None => (
            generate_certs(&args.out_dir, &args.sans),
            args.sans.join(", "),
        ),
    };
    match made {
        Ok(files) => {
            println!("server certificate valid for: {valid_for}");
            println!(
                "wrote {}  (CA certificate: give to clients)",
                files.ca_cert.display()
            );
            match &args.ca {
                Some(_) => println!("signed by {}  (CA key, not copied)", files.ca_key.display()),
                None => println!("wrote {}  (CA key: keep private)", files.ca_key.display()),
            }
            println!(
                "wrote {}  (server certificate)",
                files.server_cert.display()
            );
            println!("wrote {}  (server key)", files.server_key.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("certs: {e}");
            ExitCode::FAILURE
        }
    }
}
