//! The gateway's certificate and key for DoT and DoH, read from their PEM files at start and on
//! every reload. A pair that cannot serve is refused with the reason, before any client sees
//! it: unreadable or not PEM, no certificate, a key of a kind ring cannot sign with, a key
//! that is not the certificate's, a certificate not valid yet or expired. The key file being
//! readable by its group or by others is warned about (it is the gateway's identity).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fqdnd_config::EncryptedDns;
use fqdnd_dnsproxy::{EncryptedConfig, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use crate::{Result, bail};

/// Reads and checks the pair `config` names, `now` being the wall time since the Unix epoch.
pub fn load_pair(config: &EncryptedDns, now: Duration) -> Result<CertifiedKey> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&config.certificate)
        .and_then(Iterator::collect)
        .map_err(|e| pem_error(&config.certificate, "certificate", &e))?;
    let Some(leaf) = chain.first() else {
        bail!(
            "the TLS certificate file {} holds no certificate (expected PEM `-----BEGIN CERTIFICATE-----`)",
            config.certificate.display()
        );
    };
    check_validity(leaf, &config.certificate, now)?;
    warn_if_readable(&config.key);
    let key = PrivateKeyDer::from_pem_file(&config.key)
        .map_err(|e| pem_error(&config.key, "private key", &e))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| {
        crate::Error::Refused(format!(
            "the TLS key {} is not a key fqdnd can sign with (RSA, ECDSA P-256/P-384 or Ed25519): {e}",
            config.key.display()
        ))
    })?;
    let pair = CertifiedKey::new(chain, signing);
    if pair.keys_match().is_err() {
        bail!(
            "the TLS key {} is not the key of the certificate {}: give the pair that belongs together",
            config.key.display(),
            config.certificate.display()
        );
    }
    Ok(pair)
}

/// The proxy's encrypted listeners from the `tls` block, presenting `certificates`.
pub fn listeners(config: &EncryptedDns, certificates: Arc<TlsCertificates>) -> EncryptedConfig {
    EncryptedConfig {
        listen_dot: config.dot.clone(),
        listen_doh: config.doh.clone(),
        doh_path: config.doh_path.clone(),
        handshake_timeout: config.handshake_timeout,
        idle_timeout: config.idle_timeout,
        max_connections: config.max_connections,
        max_connections_per_client: config.max_connections_per_client,
        ..EncryptedConfig::new(certificates)
    }
}

fn pem_error(path: &Path, what: &str, e: &rustls::pki_types::pem::Error) -> crate::Error {
    use rustls::pki_types::pem::Error as Pem;
    let why = match e {
        Pem::Io(io) => format!("cannot be read: {io}"),
        Pem::NoItemsFound => format!("holds no PEM {what}"),
        other => format!("is not valid PEM ({other:?})"),
    };
    crate::Error::Refused(format!("the TLS {what} file {} {why}", path.display()))
}

/// Refuses a certificate outside its validity period at `now`.
fn check_validity(leaf: &CertificateDer<'_>, path: &Path, now: Duration) -> Result<()> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).map_err(|e| {
        crate::Error::Refused(format!(
            "the TLS certificate in {} does not parse as X.509: {e}",
            path.display()
        ))
    })?;
    let validity = cert.validity();
    let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    if now > validity.not_after.timestamp() {
        bail!(
            "the TLS certificate in {} expired on {}: renew it",
            path.display(),
            validity.not_after
        );
    }
    if now < validity.not_before.timestamp() {
        bail!(
            "the TLS certificate in {} is not valid before {} (is the clock right?)",
            path.display(),
            validity.not_before
        );
    }
    Ok(())
}

/// Warns when the key file is readable by its group or by others.
fn warn_if_readable(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o044 != 0
    {
        tracing::warn!(file = %path.display(), mode = format_args!("{:o}", meta.permissions().mode() & 0o7777), "the TLS key file is readable by its group or by everyone: make it readable by its owner only (chmod 600)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Files {
        dir: tempfile::TempDir,
    }

    impl Files {
        fn new() -> Self {
            Self {
                dir: tempfile::tempdir().unwrap(),
            }
        }

        /// Writes a certificate for dns.test (changed by `adjust`) and its key.
        fn pair(
            &self,
            stem: &str,
            adjust: impl FnOnce(&mut rcgen::CertificateParams),
        ) -> EncryptedDns {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(vec!["dns.test".to_owned()]).unwrap();
            adjust(&mut params);
            let cert = params.self_signed(&key).unwrap();
            let certificate = self.dir.path().join(format!("{stem}.pem"));
            let key_path = self.dir.path().join(format!("{stem}.key"));
            std::fs::write(&certificate, cert.pem()).unwrap();
            std::fs::write(&key_path, key.serialize_pem()).unwrap();
            EncryptedDns {
                certificate,
                key: key_path,
                dot: vec![],
                doh: vec![],
                doh_path: "/dns-query".to_owned(),
                handshake_timeout: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(30),
                max_connections: 1,
                max_connections_per_client: 1,
            }
        }
    }

    /// 2026-11-29.
    const NOW: Duration = Duration::from_secs(1_795_910_400);

    #[test]
    fn a_good_pair_loads() {
        let f = Files::new();
        let pair = load_pair(&f.pair("good", |_| {}), NOW).unwrap();
        assert_eq!(pair.cert.len(), 1);
    }

    #[test]
    fn an_expired_or_early_certificate_is_refused_with_its_date() {
        let f = Files::new();
        let expired = f.pair("old", |p| {
            p.not_before = rcgen::date_time_ymd(2019, 1, 1);
            p.not_after = rcgen::date_time_ymd(2020, 1, 1);
        });
        let e = load_pair(&expired, NOW).unwrap_err().to_string();
        assert!(e.contains("expired on") && e.contains("2020"), "{e}");
        let early = f.pair("early", |p| p.not_before = rcgen::date_time_ymd(2030, 1, 1));
        let e = load_pair(&early, NOW).unwrap_err().to_string();
        assert!(e.contains("not valid before"), "{e}");
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let f = Files::new();
        let a = f.pair("a", |_| {});
        let b = f.pair("b", |_| {});
        let mixed = EncryptedDns {
            key: b.key.clone(),
            ..a
        };
        let e = load_pair(&mixed, NOW).unwrap_err().to_string();
        assert!(e.contains("is not the key of the certificate"), "{e}");
    }

    #[test]
    fn missing_or_empty_files_are_named() {
        let f = Files::new();
        let good = f.pair("good", |_| {});
        let missing = EncryptedDns {
            certificate: f.dir.path().join("nope.pem"),
            ..good.clone()
        };
        let e = load_pair(&missing, NOW).unwrap_err().to_string();
        assert!(e.contains("nope.pem cannot be read"), "{e}");
        std::fs::write(&good.key, "not a key\n").unwrap();
        let e = load_pair(&good, NOW).unwrap_err().to_string();
        assert!(e.contains("holds no PEM private key"), "{e}");
    }
}
