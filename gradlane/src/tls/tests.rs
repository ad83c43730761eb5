use super::generate::check_job_name;
use super::*;

/// A TLS 1.3 handshake between gradlane's own client and server
/// configurations, in memory: what they negotiate.
#[test]
fn gradlane_ends_negotiate_aes_128_gcm() {
    let dir = std::env::temp_dir().join(format!("gradlane-tls-suite-{}", std::process::id()));
    let files = generate_certs(&dir, &["localhost"]).unwrap();
    let server = server_tls(&files.server_cert, &files.server_key).unwrap();
    let client = client_tls(&files.ca_cert).unwrap();
    let _ = fs::remove_dir_all(&dir);
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut c = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
    let mut s = rustls::ServerConnection::new(Arc::new(server)).unwrap();
    let mut flights = 0;
    while c.is_handshaking() || s.is_handshaking() {
        flights += 1;
        assert!(flights < 10, "the handshake does not finish");
        let mut wire = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut wire).unwrap();
        }
        s.read_tls(&mut &wire[..]).unwrap();
        s.process_new_packets().unwrap();
        wire.clear();
        while s.wants_write() {
            s.write_tls(&mut wire).unwrap();
        }
        c.read_tls(&mut &wire[..]).unwrap();
        c.process_new_packets().unwrap();
    }
    let suite = |x: Option<rustls::SupportedCipherSuite>| x.map(|s| s.suite());
    let want = Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    assert_eq!(suite(c.negotiated_cipher_suite()), want);
    assert_eq!(suite(s.negotiated_cipher_suite()), want);
}

#[test]
fn job_names_are_one_dns_label_in_lower_case() {
    assert_eq!(check_job_name("Train-7").unwrap(), "train-7");
    for bad in ["", "-a", "a-", "a.b", "a b", "ä", &"x".repeat(64)] {
        assert!(
            matches!(check_job_name(bad), Err(GenerateCertsError::BadJobName(_))),
            "{bad:?}"
        );
    }
}

/// A job's certificate names the job and is found to; a per-address
/// one names none; a second job signed by the first's CA shares its
/// ca.pem and leaves its key where it was.
#[test]
fn job_certificates_name_their_job_and_can_share_a_ca() {
    let base = std::env::temp_dir().join(format!("gradlane-tls-job-{}", std::process::id()));
    let (a, b, ip) = (base.join("a"), base.join("b"), base.join("ip"));
    let files = generate_job_certs(&a, "job-a", None).unwrap();
    assert_eq!(
        cert_job_name(&files.server_cert).unwrap().as_deref(),
        Some("job-a")
    );
    let second = generate_job_certs(&b, "job-b", Some(&a)).unwrap();
    assert_eq!(
        cert_job_name(&second.server_cert).unwrap().as_deref(),
        Some("job-b")
    );
    assert_eq!(second.ca_key, a.join("ca.key"));
    assert!(!b.join("ca.key").exists());
    assert_eq!(
        fs::read(&second.ca_cert).unwrap(),
        fs::read(&files.ca_cert).unwrap()
    );
    let per_ip = generate_certs(&ip, &["127.0.0.1", "localhost"]).unwrap();
    assert_eq!(cert_job_name(&per_ip.server_cert).unwrap(), None);
    // Each key matches its certificate.
    for cert in [&files.server_cert, &second.server_cert] {
        let key = cert.with_extension("key");
        server_tls(cert, &key).unwrap();
    }
    let missing = generate_job_certs(&b, "job-c", Some(&ip.join("none")));
    assert!(
        matches!(missing, Err(GenerateCertsError::ReadCa { .. })),
        "{missing:?}"
    );
    let _ = fs::remove_dir_all(&base);
}
