//! The `tls` block of a `Gateway` document: DNS over TLS and DNS over HTTPS for clients, with
//! the certificate and key they present.
//!
//! ```yaml
//! tls:
//!   certificate: tls/gateway.pem   # PEM: the server's certificate first, then intermediates
//!   key: tls/gateway.key           # PEM private key (PKCS#8, PKCS#1 or SEC1), mode 0600
//!   dot: ["0.0.0.0:853"]           # DNS over TLS (RFC 7858)
//!   doh: ["0.0.0.0:443"]           # DNS over HTTPS (RFC 8484), HTTP/2 and HTTP/1.1
//!   dohPath: /dns-query            # the default
//!   handshakeTimeout: 5s           # a TLS handshake must end within this
//!   idleTimeout: 30s               # a connection with nothing asked this long is closed
//!   maxConnections: 2048           # DoT and DoH connections open at once
//!   maxConnectionsPerClient: 64    # from one client address
//! ```
//!
//! Paths are relative to the file. The files are read by the daemon (at start and on every
//! reload); this crate only parses.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::yaml::{Diag, Text, at, duration, sanitize, shape};

/// The encrypted listeners' settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncryptedDns {
    /// The PEM certificate chain, the server's certificate first.
    pub certificate: PathBuf,
    /// The PEM private key of that certificate.
    pub key: PathBuf,
    /// DNS over TLS listen addresses.
    pub dot: Vec<SocketAddr>,
    /// DNS over HTTPS listen addresses.
    pub doh: Vec<SocketAddr>,
    /// The DoH path.
    pub doh_path: String,
    /// A TLS handshake not finished in this time closes the connection.
    pub handshake_timeout: Duration,
    /// A connection with nothing asked and nothing in flight this long is closed.
    pub idle_timeout: Duration,
    /// DoT and DoH connections open at once.
    pub max_connections: usize,
    /// Of those, from one client address.
    pub max_connections_per_client: usize,
}

/// `tls:` as written.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub(crate) struct TlsSpec {
    certificate: Option<Text>,
    key: Option<Text>,
    dot: Option<Vec<Text>>,
    doh: Option<Vec<Text>>,
    doh_path: Option<Text>,
    handshake_timeout: Option<Text>,
    idle_timeout: Option<Text>,
    max_connections: Option<Spanned<u64>>,
    max_connections_per_client: Option<Spanned<u64>>,
}

shape!(TlsSpec,);

/// The `tls` block; `None` when it is wrong (reported at its place).
pub(crate) fn encrypted(
    spec: &Spanned<TlsSpec>,
    base: &Path,
    diag: &mut Diag<'_>,
) -> Option<EncryptedDns> {
    let t = &spec.value;
    let before = diag.count();
    let mut file = |field: &str, text: &Option<Text>, what: &str| match text {
        Some(text) if !text.value.trim().is_empty() => Some(base.join(text.value.trim())),
        Some(text) => {
            diag.invalid(at(text), format!("`tls.{field}` is empty: name {what}"));
            None
        }
        None => {
            diag.missing(at(spec), &[field], format!("`tls` needs `{field}`: {what}"));
            None
        }
    };
    let certificate = file("certificate", &t.certificate, "the PEM certificate chain");
    let key = file("key", &t.key, "the PEM private key");
    let mut addrs = |field: &str, list: &Option<Vec<Text>>| -> Vec<SocketAddr> {
        list.iter()
            .flatten()
            .filter_map(|text| match text.value.trim().parse::<SocketAddr>() {
                Ok(addr) => Some(addr),
                Err(_) => {
                    diag.invalid(
                        at(text),
                        format!(
                            "`tls.{field}` {:?} is not an address with a port: write \
                             `0.0.0.0:853` or `[::]:443`",
                            sanitize(&text.value)
                        ),
                    );
                    None
                }
            })
            .collect()
    };
    let dot = addrs("dot", &t.dot);
    let doh = addrs("doh", &t.doh);
    let doh_path = match &t.doh_path {
        None => "/dns-query".to_owned(),
        Some(text) => {
            let path = text.value.trim();
            if !path.starts_with('/') || path.contains(['?', '#', ' ']) {
                diag.invalid(
                    at(text),
                    format!(
                        "`tls.dohPath` {:?} is not a path: write `/dns-query`",
                        sanitize(path)
                    ),
                );
            }
            path.to_owned()
        }
    };
    let mut timeout = |field: &str, text: &Option<Text>, default: Duration| match text {
        None => default,
        Some(text) => match duration(field, text, diag) {
            Some(d) if d >= Duration::from_millis(100) && d <= Duration::from_secs(3600) => d,
            Some(_) => {
                diag.invalid(at(text), format!("`{field}` must be between 100ms and 1h"));
                default
            }
            None => default,
        },
    };
    let handshake_timeout = timeout(
        "tls.handshakeTimeout",
        &t.handshake_timeout,
        Duration::from_secs(5),
    );
    let idle_timeout = timeout("tls.idleTimeout", &t.idle_timeout, Duration::from_secs(30));
    let mut count = |field: &str, n: &Option<Spanned<u64>>, default: usize| match n {
        None => default,
        Some(n) => match usize::try_from(n.value) {
            Ok(v) if (1..=1_000_000).contains(&v) => v,
            _ => {
                diag.invalid(at(n), format!("`{field}` must be 1 to 1000000"));
                default
            }
        },
    };
    let max_connections = count("tls.maxConnections", &t.max_connections, 2048);
    let max_connections_per_client = count(
        "tls.maxConnectionsPerClient",
        &t.max_connections_per_client,
        64,
    );
    if diag.count() == before && dot.is_empty() && doh.is_empty() {
        diag.invalid(
            at(spec),
            "`tls` needs at least one `dot` or `doh` address to serve on",
        );
    }
    match (certificate, key) {
        (Some(certificate), Some(key)) if diag.count() == before => Some(EncryptedDns {
            certificate,
            key,
            dot,
            doh,
            doh_path,
            handshake_timeout,
            idle_timeout,
            max_connections,
            max_connections_per_client,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use crate::load_str;

    fn gateway(tls: &str) -> Result<crate::Gateway, String> {
        let text = format!(
            "apiVersion: fqdnd.io/v1\nkind: Gateway\nspec:\n  listen: [\"127.0.0.1:53\"]\n  \
             upstreams: [\"192.0.2.1:53\"]\n  tls:\n{tls}"
        );
        load_str(&text, "/etc/fqdnd/gw.yaml".as_ref())
            .map(|c| c.gateway.unwrap())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_block_reads_with_its_defaults_and_paths_relative_to_the_file() {
        let g = gateway(
            "    certificate: tls/gw.pem\n    key: tls/gw.key\n    dot: [\"0.0.0.0:853\"]\n",
        )
        .unwrap();
        let t = g.tls.unwrap();
        assert_eq!(t.certificate, std::path::Path::new("/etc/fqdnd/tls/gw.pem"));
        assert_eq!(t.key, std::path::Path::new("/etc/fqdnd/tls/gw.key"));
        assert_eq!(t.dot, vec!["0.0.0.0:853".parse().unwrap()]);
        assert!(t.doh.is_empty());
        assert_eq!(t.doh_path, "/dns-query");
        assert_eq!(t.handshake_timeout, std::time::Duration::from_secs(5));
        assert_eq!(t.idle_timeout, std::time::Duration::from_secs(30));
        assert_eq!(
            (t.max_connections, t.max_connections_per_client),
            (2048, 64)
        );
    }

    #[test]
    fn mistakes_are_named_at_their_place() {
        let e = gateway("    key: k\n    dot: [\"0.0.0.0:853\"]\n").unwrap_err();
        assert!(e.contains("`tls` needs `certificate`"), "{e}");
        let e = gateway("    certificate: c\n    key: k\n").unwrap_err();
        assert!(e.contains("at least one `dot` or `doh`"), "{e}");
        let e = gateway("    certificate: c\n    key: k\n    doh: [\"443\"]\n").unwrap_err();
        assert!(e.contains("`tls.doh` \"443\" is not an address"), "{e}");
        assert!(e.contains("gw.yaml:"), "{e}");
        let e =
            gateway("    certificate: c\n    key: k\n    doh: [\"[::]:443\"]\n    dohPath: dns\n")
                .unwrap_err();
        assert!(e.contains("`tls.dohPath`"), "{e}");
        let e = gateway(
            "    certificate: c\n    key: k\n    dot: [\"[::]:853\"]\n    maxConnections: 0\n",
        )
        .unwrap_err();
        assert!(
            e.contains("`tls.maxConnections` must be 1 to 1000000"),
            "{e}"
        );
        let e = gateway("    certificate: c\n    key: k\n    dot: [\"[::]:853\"]\n    port: 1\n")
            .unwrap_err();
        assert!(e.contains("port"), "{e}");
    }
}
