//! A certificate authority for the encrypted-DNS tests: made in-process with rcgen, written as
//! PEM files that real clients and servers (kdig, dnsperf, Unbound, dnsdist, fqdnd) read.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};

/// A test CA: its certificate is written to `ca.pem` in the directory it was made in.
pub(crate) struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate (PEM), for clients to trust.
    pub(crate) cert: PathBuf,
}

/// A server certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub(crate) struct Issued {
    /// The certificate chain (the leaf only: the CA is the clients' trust anchor).
    pub(crate) cert: PathBuf,
    /// The private key (PKCS#8), mode 0600.
    pub(crate) key: PathBuf,
}

impl TestCa {
    /// A new CA whose certificate is `dir/ca.pem`.
    pub(crate) fn new(dir: &Path) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "fqdnd test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let issuer = CertifiedIssuer::self_signed(params, key).unwrap();
        let cert = dir.join("ca.pem");
        std::fs::write(&cert, issuer.pem()).unwrap();
        Self { issuer, cert }
    }

    /// A server certificate for `names` and `ips`, valid now, written as `dir/<stem>.pem` and
    /// `dir/<stem>.key`.
    pub(crate) fn issue(&self, dir: &Path, stem: &str, names: &[&str], ips: &[IpAddr]) -> Issued {
        self.issue_with(dir, stem, names, ips, |_| {})
    }

    /// The same, expired since 2020.
    pub(crate) fn issue_expired(&self, dir: &Path, stem: &str, names: &[&str]) -> Issued {
        self.issue_with(dir, stem, names, &[], |p| {
            p.not_before = rcgen::date_time_ymd(2019, 1, 1);
            p.not_after = rcgen::date_time_ymd(2020, 1, 1);
        })
    }

    fn issue_with(
        &self,
        dir: &Path,
        stem: &str,
        names: &[&str],
        ips: &[IpAddr],
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> Issued {
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params
            .distinguished_name
            .push(DnType::CommonName, names.first().copied().unwrap_or(stem));
        adjust(&mut params);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let issued = Issued {
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}.key")),
        };
        std::fs::write(&issued.cert, cert.pem()).unwrap();
        write_private(&issued.key, &key.serialize_pem());
        issued
    }
}

/// Writes `text` to `path` readable by its owner only.
fn write_private(path: &Path, text: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    file.write_all(text.as_bytes()).unwrap();
}
