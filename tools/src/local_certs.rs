//! The certificates a benchmark that runs both ends on this host uses.

use std::path::PathBuf;

use gradlane::{generate_certs, CertFiles, GenerateCertsError};

/// A CA and a `localhost` certificate in a fresh folder of the system's
/// temporary directory, named after `tool` and this process (so that two
/// runs never share one). The caller removes the folder when done.
pub fn localhost_certs(tool: &str) -> Result<(PathBuf, CertFiles), GenerateCertsError> {
    let dir = std::env::temp_dir().join(format!("gradlane-{tool}-{}", std::process::id()));
    let files = generate_certs(&dir, &["localhost"])?;
    Ok((dir, files))
}
