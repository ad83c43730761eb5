//! Certificates: quinn server/client configs from PEM files, and a small CA
//! to make those files.
//!
//! Peers authenticate servers against a CA certificate the operator hands
//! out (made by [`generate_certs`] or any other CA). There is deliberately no
//! way to skip certificate verification: a gradient stream accepted from an
//! unauthenticated peer could be silently poisoned.
//!
//! A job's certificate may name the job instead of every host's address
//! (see [`generate_job_certs`]): it carries the DNS name
//! `NAME`[`JOB_NAME_SUFFIX`], and peers that present it check each other
//! against the CA and that name, whatever their addresses.
//!
//! rustls runs with the ring provider and TLS 1.3 only (QUIC requires 1.3),
//! AES-128-GCM preferred (see `provider`);
//! both sides offer the ALPN [`ALPN`].

use std::fs;
use std::io::{self, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use quinn::crypto::rustls::{NoInitialCipherSuite, QuicClientConfig, QuicServerConfig};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};

mod generate;

pub use generate::{generate_certs, generate_job_certs, CertFiles, GenerateCertsError};

/// The ALPN protocol id both sides negotiate.
pub(crate) const ALPN: &[u8] = b"gradlane/1";

/// What a job's certificate is valid for after its job name: the job
/// `train-7` is the DNS name `train-7.job.gradlane`. A DNS name, not an
/// extension of gradlane's own, so that any CA can issue one and rustls
/// checks it as it checks every name; `gradlane` is not a public suffix,
/// and a job's CA is the only one its ranks trust, so no other
/// certificate can carry it.
pub const JOB_NAME_SUFFIX: &str = ".job.gradlane";

/// The DNS name a job's certificate carries for `job`.
pub fn job_server_name(job: &str) -> String {
    format!("{job}{JOB_NAME_SUFFIX}")
}

/// Why a peer's certificate was refused: said to the rank that refused it
/// (a group's error names the peer), never a silent drop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerCertError {
    /// The certificate is not signed by this job's CA.
    #[error("unknown CA: its certificate is not signed by this job's ca.pem")]
    UnknownCa,
    /// The certificate is signed by the job's CA but names another job.
    #[error("wrong job name {got:?}, expected {expected:?}")]
    WrongJob {
        /// The job its certificate names.
        got: String,
        /// This rank's job.
        expected: String,
    },
    /// The certificate is signed by the job's CA but names no job (a
    /// per-address certificate).
    #[error("its certificate names no job, expected {expected:?}")]
    NoJob {
        /// This rank's job.
        expected: String,
    },
}

/// The last certificate a client configuration refused, for the caller
/// whose connect failed (rustls and quinn carry only its text).
pub(crate) type Refusal = Arc<Mutex<Option<PeerCertError>>>;

/// The job names in a certificate (DER): its DNS names that end in
/// [`JOB_NAME_SUFFIX`], without it. Empty if it cannot be parsed.
fn job_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok(cert) = webpki::EndEntityCert::try_from(cert) else {
        return Vec::new();
    };
    cert.valid_dns_names()
        .filter_map(|n| n.strip_suffix(JOB_NAME_SUFFIX))
        .map(str::to_ascii_lowercase)
        .collect()
}

/// The job the certificate chain in `cert_path` is for: its leaf's first
/// job name, or `None` for a certificate that names addresses or hosts.
/// What makes an endpoint check its peers by job (see
/// [`Endpoint::peer`](crate::Endpoint::peer)); reading the certificate,
/// not a file beside it, so the two can never disagree.
pub fn cert_job_name(cert_path: &Path) -> Result<Option<String>, PemError> {
    let chain = load_certs(cert_path)?;
    Ok(job_names(&chain[0]).into_iter().next())
}

/// What refuses `cert` for the name it should have had, if that name is
/// a job's: the job it names instead, or none.
fn job_refusal(cert: &CertificateDer<'_>, expected: &str) -> PeerCertError {
    let expected = expected.to_string();
    match job_names(cert).into_iter().next() {
        Some(got) => PeerCertError::WrongJob { got, expected },
        None => PeerCertError::NoJob { expected },
    }
}

/// A refusal as rustls carries it. The peer learns only the TLS alert
/// rustls sends for it, so each kind has its own: unknown_ca for a
/// certificate of another CA, access_denied for another job's
/// ([`HandshakeFailure`](crate::HandshakeFailure) reads them back). The
/// words stay on this side: in the connecting rank's refusal slot.
fn refused(why: PeerCertError) -> rustls::Error {
    rustls::Error::InvalidCertificate(match why {
        PeerCertError::UnknownCa => CertificateError::UnknownIssuer,
        PeerCertError::WrongJob { .. } | PeerCertError::NoJob { .. } => {
            CertificateError::ApplicationVerificationFailure
        }
    })
}

/// The signature checks both verifiers leave to the webpki verifier they
/// wrap (`self.inner`): only the certificate's names are theirs to judge.
macro_rules! inner_signatures {
    () => {
        inner_signatures!(@signature verify_tls12_signature);
        inner_signatures!(@signature verify_tls13_signature);

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.inner.supported_verify_schemes()
        }
    };
    (@signature $check:ident) => {
        fn $check(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.$check(message, cert, dss)
        }
    };
}

/// The server check a rank's client makes: webpki's (the chain to the CA,
/// the name), with its refusals explained (an unknown CA, a wrong job) and
/// remembered for the caller.
#[derive(Debug)]
struct ExplainingServerVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    refusal: Refusal,
}

impl ServerCertVerifier for ExplainingServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let result = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        let job = match server_name {
            ServerName::DnsName(name) => name.as_ref().strip_suffix(JOB_NAME_SUFFIX),
            _ => None,
        };
        let why = match (result, job) {
            (Ok(verified), _) => return Ok(verified),
            (Err(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)), _) => {
                PeerCertError::UnknownCa
            }
            (
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )),
                Some(job),
            ) => job_refusal(end_entity, job),
            (Err(e), _) => return Err(e),
        };
        if let Ok(mut slot) = self.refusal.lock() {
            *slot = Some(why.clone());
        }
        Err(refused(why))
    }

    inner_signatures!();
}

/// The client check a job's rank makes when it accepts: webpki's chain to
/// the CA (which checks no name: clients have none to check against),
/// then the job name, the same rule the connecting side applies.
#[derive(Debug)]
struct JobClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    job: String,
}

impl ClientCertVerifier for JobClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = match self
            .inner
            .verify_client_cert(end_entity, intermediates, now)
        {
            Err(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)) => {
                return Err(refused(PeerCertError::UnknownCa))
            }
            other => other?,
        };
        let name = ServerName::try_from(job_server_name(&self.job))
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        let valid = webpki::EndEntityCert::try_from(end_entity)
            .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok());
        match valid {
            true => Ok(verified),
            false => Err(refused(job_refusal(end_entity, &self.job))),
        }
    }

    inner_signatures!();
}

/// Why a PEM file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// The file does not exist.
    #[error("missing file {0}")]
    Missing(PathBuf),
    /// The file exists but could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The file is not valid PEM.
    #[error("bad pem in {path}: {source}")]
    BadPem {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        source: io::Error,
    },
    /// The file holds no `CERTIFICATE` block.
    #[error("no certificate in {0}")]
    NoCertificate(PathBuf),
    /// The file holds no private key block.
    #[error("no private key in {0}")]
    NoKey(PathBuf),
}

/// Why a server configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ServerConfigError {
    /// Loading the certificate chain or key failed.
    #[error(transparent)]
    Pem(#[from] PemError),
    /// rustls rejected the chain or key (e.g. they do not match).
    #[error("bad certificate or key in {cert} / {key}: {source}")]
    BadCertificate {
        /// The certificate chain file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason.
        source: rustls::Error,
    },
    /// The TLS setup could not be built for QUIC.
    #[error("tls setup: {0}")]
    Tls(#[from] rustls::Error),
    /// The crypto provider lacks QUIC's initial cipher suite.
    #[error("tls setup: {0}")]
    Quic(#[from] NoInitialCipherSuite),
    /// The CA that client certificates must be signed by (mutual TLS).
    #[error("client ca: {0}")]
    Ca(#[source] Box<ClientConfigError>),
}

/// Why a client configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientConfigError {
    /// Loading the CA certificate failed.
    #[error(transparent)]
    Pem(#[from] PemError),
    /// A certificate in the CA file is not a usable trust anchor.
    #[error("bad certificate in {path}: {source}")]
    BadCertificate {
        /// The CA file.
        path: PathBuf,
        /// rustls's reason.
        source: rustls::Error,
    },
    /// The TLS setup could not be built for QUIC.
    #[error("tls setup: {0}")]
    Tls(#[from] rustls::Error),
    /// The crypto provider lacks QUIC's initial cipher suite.
    #[error("tls setup: {0}")]
    Quic(#[from] NoInitialCipherSuite),
}

fn open_pem(path: &Path) -> Result<BufReader<fs::File>, PemError> {
    match fs::File::open(path) {
        Ok(f) => Ok(BufReader::new(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(PemError::Missing(path.into())),
        Err(source) => Err(PemError::Read {
            path: path.into(),
            source,
        }),
    }
}

/// Load every certificate in a PEM file, in order (leaf first for a chain).
pub(crate) fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let mut reader = open_pem(path)?;
    let certs = rustls_pemfile::certs(&mut reader)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| PemError::BadPem {
            path: path.into(),
            source,
        })?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate(path.into()));
    }
    Ok(certs)
}

/// Load the first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub(crate) fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    let mut reader = open_pem(path)?;
    rustls_pemfile::private_key(&mut reader)
        .map_err(|source| PemError::BadPem {
            path: path.into(),
            source,
        })?
        .ok_or_else(|| PemError::NoKey(path.into()))
}

/// ring's provider with the TLS 1.3 suites in gradlane's order:
/// AES-128-GCM first. The packet protection of every QUIC packet is the
/// largest single cost of a bulk transfer (about a fifth of all CPU in a
/// loopback round under AES-256-GCM, ring's first choice), and AES-128-GCM
/// seals 1.4 kB packets 12-17% faster on the target hosts, which makes
/// loopback rounds a few percent faster. Both ends build their configs
/// here, and a rustls server
/// follows the client's order, so this is what a link negotiates;
/// AES-256-GCM and ChaCha20-Poly1305 stay on offer for other peers.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite::{
        TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    Arc::new(rustls::crypto::CryptoProvider {
        cipher_suites: vec![
            TLS13_AES_128_GCM_SHA256,
            TLS13_AES_256_GCM_SHA384,
            TLS13_CHACHA20_POLY1305_SHA256,
        ],
        ..rustls::crypto::ring::default_provider()
    })
}

/// A quinn server configuration presenting the chain in `cert_path` (leaf
/// first) with the key in `key_path`. Transport parameters are quinn's
/// defaults; set them with `ServerConfig::transport_config`.
pub(crate) fn server_config(
    cert_path: &Path,
    key_path: &Path,
) -> Result<quinn::ServerConfig, ServerConfigError> {
    let quic = QuicServerConfig::try_from(server_tls(cert_path, key_path)?)?;
    Ok(quinn::ServerConfig::with_crypto(Arc::new(quic)))
}

/// A quinn server configuration like [`server_config`] that also requires
/// every client to present a certificate signed by the CA in `ca_path`
/// (mutual TLS, between the ranks of a group), and, for a `job`, one that
/// names that job.
pub(crate) fn mutual_server_config(
    cert_path: &Path,
    key_path: &Path,
    ca_path: &Path,
    job: Option<&str>,
) -> Result<quinn::ServerConfig, ServerConfigError> {
    let roots = Arc::new(ca_roots(ca_path).map_err(|e| ServerConfigError::Ca(Box::new(e)))?);
    let mut verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| ServerConfigError::Tls(rustls::Error::General(e.to_string())))?;
    if let Some(job) = job {
        verifier = Arc::new(JobClientVerifier {
            inner: verifier,
            job: job.to_string(),
        });
    }
    let tls = tls_server(cert_path, key_path, Some(verifier))?;
    let quic = QuicServerConfig::try_from(tls)?;
    Ok(quinn::ServerConfig::with_crypto(Arc::new(quic)))
}

/// The rustls side of [`server_config`].
fn server_tls(
    cert_path: &Path,
    key_path: &Path,
) -> Result<rustls::ServerConfig, ServerConfigError> {
    tls_server(cert_path, key_path, None)
}

fn tls_server(
    cert_path: &Path,
    key_path: &Path,
    clients: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> Result<rustls::ServerConfig, ServerConfigError> {
    let chain = load_certs(cert_path)?;
    let key = load_key(key_path)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let builder = match clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut tls = builder.with_single_cert(chain, key).map_err(|source| {
        ServerConfigError::BadCertificate {
            cert: cert_path.into(),
            key: key_path.into(),
            source,
        }
    })?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok(tls)
}

/// A quinn client configuration that trusts exactly the CA certificates in
/// `ca_path` (not the system roots).
pub(crate) fn client_config(ca_path: &Path) -> Result<quinn::ClientConfig, ClientConfigError> {
    let quic = QuicClientConfig::try_from(client_tls(ca_path)?)?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

/// A quinn client configuration like [`client_config`] that presents the
/// chain in `cert_path` with the key in `key_path` when the server asks
/// (mutual TLS). A server certificate it refuses for an unknown CA or a
/// wrong job is explained in its error and left in `refusal`.
pub(crate) fn mutual_client_config(
    ca_path: &Path,
    cert_path: &Path,
    key_path: &Path,
    refusal: Refusal,
) -> Result<quinn::ClientConfig, ClientConfigError> {
    let chain = load_certs(cert_path)?;
    let key = load_key(key_path)?;
    let roots = Arc::new(ca_roots(ca_path)?);
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| ClientConfigError::Tls(rustls::Error::General(e.to_string())))?;
    let verifier = Arc::new(ExplainingServerVerifier { inner, refusal });
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut tls = builder
        .with_client_auth_cert(chain, key)
        .map_err(|source| ClientConfigError::BadCertificate {
            path: cert_path.into(),
            source,
        })?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = QuicClientConfig::try_from(tls)?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

/// The CA certificates in `ca_path` as the only trust anchors.
fn ca_roots(ca_path: &Path) -> Result<rustls::RootCertStore, ClientConfigError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(ca_path)? {
        roots
            .add(cert)
            .map_err(|source| ClientConfigError::BadCertificate {
                path: ca_path.into(),
                source,
            })?;
    }
    Ok(roots)
}

fn client_builder(
    ca_path: &Path,
) -> Result<
    rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>,
    ClientConfigError,
> {
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(ca_roots(ca_path)?))
}

/// The rustls side of [`client_config`].
fn client_tls(ca_path: &Path) -> Result<rustls::ClientConfig, ClientConfigError> {
    let mut tls = client_builder(ca_path)?.with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok(tls)
}

#[cfg(test)]
mod tests;
