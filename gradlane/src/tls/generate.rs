//! A small CA: a fresh or an existing CA signs a certificate for a set
//! of addresses and names ([`generate_certs`]) or for a job
//! ([`generate_job_certs`]), written with its CA as PEM files.

use std::fs;
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::job_server_name;

/// Why certificates could not be generated and written.
#[derive(Debug, thiserror::Error)]
pub enum GenerateCertsError {
    /// A subject alt name is neither an IP address nor a valid DNS name.
    #[error("bad subject alt name {0:?}: not an ip address or dns name")]
    BadName(String),
    /// No subject alt names were given: the server cert would match nothing.
    #[error("no subject alt names given")]
    NoNames,
    /// A job name is not one DNS label.
    #[error(
        "bad job name {0:?}: use ASCII letters, digits and '-' (at most 63, \
         not starting or ending with '-')"
    )]
    BadJobName(String),
    /// The existing CA to sign with could not be read.
    #[error("cannot read the CA's {path}: {source}")]
    ReadCa {
        /// The file (`ca.pem` or `ca.key`).
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Key generation or signing failed.
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// The output directory could not be created.
    #[error("cannot create directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// An output file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
}

/// The files written by [`generate_certs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// CA certificate (give it to clients).
    pub ca_cert: PathBuf,
    /// CA private key (keep it; needed only to sign more server certs).
    pub ca_key: PathBuf,
    /// Server certificate, signed by the CA.
    pub server_cert: PathBuf,
    /// Server private key.
    pub server_key: PathBuf,
}

/// Make a fresh CA and a server certificate signed by it, valid for
/// `subject_alt_names` (each an IP address or a DNS name), and write
/// `ca.pem`, `ca.key`, `server.pem`, `server.key` into `dir` (created if
/// needed; keys are written with mode 0600 on Unix). Existing files are
/// overwritten.
pub fn generate_certs<S: AsRef<str>>(
    dir: &Path,
    subject_alt_names: &[S],
) -> Result<CertFiles, GenerateCertsError> {
    use rcgen::SanType;

    if subject_alt_names.is_empty() {
        return Err(GenerateCertsError::NoNames);
    }
    let mut sans = Vec::with_capacity(subject_alt_names.len());
    for name in subject_alt_names {
        let name = name.as_ref().trim();
        let san = match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => {
                // rcgen takes any ASCII; check with the same rules the client
                // will apply to the name it connects to.
                let bad = || GenerateCertsError::BadName(name.to_string());
                rustls::pki_types::DnsName::try_from(name).map_err(|_| bad())?;
                SanType::DnsName(name.to_string().try_into().map_err(|_| bad())?)
            }
        };
        sans.push(san);
    }
    write_certs(dir, sans, None)
}

/// Make a certificate for the job `job` and write `ca.pem`, `ca.key`,
/// `server.pem`, `server.key` into `dir` as [`generate_certs`] does. The
/// certificate names the job ([`job_server_name`]), no address: every rank
/// of the job presents it and checks its peers against the CA and the job
/// name, so it can be made before the job's hosts are known.
///
/// With `ca_dir`, the certificate is signed by the CA whose `ca.pem` and
/// `ca.key` are there (one CA for many jobs; the job name keeps them
/// apart): `ca.pem` is copied into `dir` and `ca.key` stays where it is
/// (the returned `ca_key` points at it). Without, a fresh CA is made.
///
/// A job name is one DNS label: ASCII letters, digits and `-`, at most 63,
/// not starting or ending with `-`; letters are taken in lower case.
pub fn generate_job_certs(
    dir: &Path,
    job: &str,
    ca_dir: Option<&Path>,
) -> Result<CertFiles, GenerateCertsError> {
    let job = check_job_name(job)?;
    let name = job_server_name(&job);
    let san = rcgen::SanType::DnsName(
        name.try_into()
            .map_err(|_| GenerateCertsError::BadJobName(job.clone()))?,
    );
    write_certs(dir, vec![san], ca_dir)
}

/// A job name as [`generate_job_certs`] takes it, in lower case.
pub(super) fn check_job_name(job: &str) -> Result<String, GenerateCertsError> {
    let ok = !job.is_empty()
        && job.len() <= 63
        && job.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !job.starts_with('-')
        && !job.ends_with('-');
    match ok {
        true => Ok(job.to_ascii_lowercase()),
        false => Err(GenerateCertsError::BadJobName(job.to_string())),
    }
}

/// Reads a file of an existing CA.
fn read_ca_file(path: &Path) -> Result<String, GenerateCertsError> {
    fs::read_to_string(path).map_err(|source| GenerateCertsError::ReadCa {
        path: path.into(),
        source,
    })
}

/// Writes a server certificate for `sans`, signed by the CA in `ca_dir`
/// or by a fresh one, with its CA, into `dir`.
fn write_certs(
    dir: &Path,
    sans: Vec<rcgen::SanType>,
    ca_dir: Option<&Path>,
) -> Result<CertFiles, GenerateCertsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };

    let (ca_pem, ca_key_pem, issuer) = match ca_dir {
        Some(ca_dir) => {
            let ca_pem = read_ca_file(&ca_dir.join("ca.pem"))?;
            let ca_key = KeyPair::from_pem(&read_ca_file(&ca_dir.join("ca.key"))?)?;
            let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)?;
            (ca_pem, None, issuer)
        }
        None => {
            let ca_key = KeyPair::generate()?;
            let mut ca_params = CertificateParams::default();
            ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
            // A name unique to this CA: verifiers find issuers by name, and
            // two CAs both called "gradlane CA" turn "unknown issuer" into a
            // confusing "bad signature".
            let tag = {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                ca_key.public_key_raw().hash(&mut h);
                h.finish()
            };
            ca_params
                .distinguished_name
                .push(DnType::CommonName, format!("gradlane CA {tag:016x}"));
            ca_params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let ca_cert = ca_params.self_signed(&ca_key)?;
            let ca_key_pem = ca_key.serialize_pem();
            (
                ca_cert.pem(),
                Some(ca_key_pem),
                Issuer::new(ca_params, ca_key),
            )
        }
    };

    let mut server_params = CertificateParams::default();
    server_params.subject_alt_names = sans;
    server_params
        .distinguished_name
        .push(DnType::CommonName, "gradlane server");
    server_params.use_authority_key_identifier_extension = true;
    server_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Also a client certificate: the ranks of a group present it to each
    // other (mutual TLS).
    server_params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let server_key = KeyPair::generate()?;
    let server_cert = server_params.signed_by(&server_key, &issuer)?;

    fs::create_dir_all(dir).map_err(|source| GenerateCertsError::CreateDir {
        path: dir.into(),
        source,
    })?;
    let files = CertFiles {
        ca_cert: dir.join("ca.pem"),
        ca_key: match ca_dir {
            Some(ca_dir) => ca_dir.join("ca.key"),
            None => dir.join("ca.key"),
        },
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server.key"),
    };
    write_file(&files.ca_cert, ca_pem.as_bytes(), false)?;
    if let Some(ca_key_pem) = ca_key_pem {
        write_file(&files.ca_key, ca_key_pem.as_bytes(), true)?;
    }
    write_file(&files.server_cert, server_cert.pem().as_bytes(), false)?;
    write_file(
        &files.server_key,
        server_key.serialize_pem().as_bytes(),
        true,
    )?;
    Ok(files)
}

/// Write `contents` to `path`; secrets get mode 0600 from creation on, so the
/// key is never readable by others, even briefly.
fn write_file(path: &Path, contents: &[u8], secret: bool) -> Result<(), GenerateCertsError> {
    let err = |source| GenerateCertsError::Write {
        path: path.into(),
        source,
    };
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        options.mode(0o600);
        // `mode` applies only when the file is created; tighten an old one too.
        if path.exists() {
            fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(err)?;
        }
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path).map_err(err)?;
    file.write_all(contents).map_err(err)?;
    file.sync_all().map_err(err)
}
