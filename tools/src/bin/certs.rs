//! Make a CA and a server certificate for gradlane endpoints.
//!
//! ```text
//! cargo run --bin certs -- --out-dir certs --san localhost --san 10.0.0.2
//! ```
//!
//! Give `ca.pem` to clients; `server.pem` + `server.key` to the server. Keep
//! `ca.key` private: it can sign more server certificates.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use gradlane::generate_certs;

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
    /// Replace certificates and keys already in the directory (every
    /// certificate the old CA signed stops being trusted by clients given
    /// the new `ca.pem`).
    #[arg(long)]
    force: bool,
}

const FILES: [&str; 4] = ["ca.pem", "ca.key", "server.pem", "server.key"];

fn main() -> ExitCode {
    let args = Args::parse();
    let existing: Vec<String> = FILES
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
    match generate_certs(&args.out_dir, &args.sans) {
        Ok(files) => {
            println!("server certificate valid for: {}", args.sans.join(", "));
            println!(
                "wrote {}  (CA certificate: give to clients)",
                files.ca_cert.display()
            );
            println!("wrote {}  (CA key: keep private)", files.ca_key.display());
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
