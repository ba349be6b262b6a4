//! `kind: Cluster` (`apiVersion: fqdnd.io/v1`): cluster mode for `fqdnd node`, the enforcing
//! gateway and `fqdnd operator` — where etcd is and how this member of the cluster is named.
//! At most one across all files; paths are relative to the file that names them.
//!
//! ```yaml
//! apiVersion: fqdnd.io/v1
//! kind: Cluster
//! spec:
//!   endpoints: ["http://10.0.0.10:2379", "http://10.0.0.11:2379", "http://10.0.0.12:2379"]
//!   tls: {ca: etcd-ca.pem, cert: node.pem, key: node-key.pem}   # https:// endpoints
//!   auth: {user: node-1, passwordFile: etcd-password}            # etcd with authentication on
//!   prefix: /fqdnd            # every key under it (default /fqdnd)
//!   nodeName: node-1          # default: the host name
//!   leaseTTL: 15s             # a dead node's endpoints (and a dead allocator's leadership) last this long
//!   identityGCGrace: 10m      # operator: an identity unused this long is collected
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::Spanned;

use crate::cnp::ObjectMeta;
use crate::yaml::{Diag, Text, at, duration, sanitize, shape};

/// TLS material for the etcd client (PEM files).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterTls {
    /// The CA that signed the etcd members' certificates.
    pub ca: Option<PathBuf>,
    /// The client certificate.
    pub cert: Option<PathBuf>,
    /// Its key.
    pub key: Option<PathBuf>,
}

/// An etcd user (`auth`): its name, and the file holding its password (read when the client
/// connects, so a rotated password is taken at the next start or reload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterAuth {
    /// The etcd user.
    pub user: String,
    /// The file holding its password (one line; a trailing newline is not part of it).
    pub password_file: PathBuf,
}

/// Cluster mode's settings (`kind: Cluster`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// etcd member URLs (`http://` or `https://`).
    pub endpoints: Vec<String>,
    /// TLS, for `https://` members.
    pub tls: Option<ClusterTls>,
    /// The etcd user to authenticate as, if the members have authentication on.
    pub auth: Option<ClusterAuth>,
    /// The key prefix (starts with `/`, no trailing `/`).
    pub prefix: String,
    /// This node's (or allocator's) name; `None`: the host name.
    pub node_name: Option<String>,
    /// The lease TTL of a node's endpoints and of the allocator's leadership.
    pub lease_ttl: Duration,
    /// How long an identity must be unused before the allocator collects it.
    pub identity_gc_grace: Duration,
    /// `fqdnd gateway`: the HA gateway group whose members share what their DNS answers
    /// taught (docs/ha-gateway.md); `None`: nothing is shared.
    pub gateway_group: Option<String>,
}

impl Default for Cluster {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            tls: None,
            auth: None,
            prefix: "/fqdnd".to_owned(),
            node_name: None,
            lease_ttl: Duration::from_secs(15),
            identity_gc_grace: Duration::from_secs(600),
            gateway_group: None,
        }
    }
}

/// A whole `Cluster` document.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct ClusterDoc {
    #[serde(rename = "apiVersion")]
    _api_version: Option<IgnoredAny>,
    #[serde(rename = "kind")]
    _kind: Option<IgnoredAny>,
    #[serde(rename = "metadata")]
    _metadata: Option<ObjectMeta>,
    spec: Option<Spanned<ClusterSpec>>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
struct ClusterSpec {
    endpoints: Option<Vec<Text>>,
    tls: Option<Spanned<TlsSpec>>,
    auth: Option<Spanned<AuthSpec>>,
    prefix: Option<Text>,
    node_name: Option<Text>,
    #[serde(rename = "leaseTTL")]
    lease_ttl: Option<Text>,
    #[serde(rename = "identityGCGrace")]
    identity_gc_grace: Option<Text>,
    gateway_group: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
struct TlsSpec {
    ca: Option<Text>,
    cert: Option<Text>,
    key: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
struct AuthSpec {
    user: Option<Text>,
    password_file: Option<Text>,
}

shape!(ClusterDoc, ClusterSpec, TlsSpec, AuthSpec,);

/// Whether `name` can name a node: 1–63 of `A-Z a-z 0-9 . _ -` (it is part of etcd keys).
pub fn valid_node_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Whether `url` is an etcd member URL: `http://` or `https://`, then a host (a name, an IPv4
/// address or an IPv6 address in brackets) and a port of 1–65535; nothing after it.
fn member_url(url: &str) -> Result<(), &'static str> {
    let hostport = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or("the scheme must be http:// or https://")?;
    let hostport = hostport.strip_suffix('/').unwrap_or(hostport);
    if hostport.contains('/') {
        return Err("a member URL has no path");
    }
    let (host, port) = match hostport.strip_prefix('[') {
        Some(rest) => {
            let (v6, port) = rest
                .split_once("]:")
                .ok_or("no port after the IPv6 address")?;
            v6.parse::<std::net::Ipv6Addr>()
                .map_err(|_| "the address in brackets is not IPv6")?;
            (v6, port)
        }
        None => hostport.rsplit_once(':').ok_or("no port")?,
    };
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b':');
    if !host_ok {
        return Err("the host is not a name or an address");
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err("the port is not a number of 1-65535"),
    }
}

/// Converts the `Cluster` document; `None` if anything in it is wrong.
pub(crate) fn cluster(doc: &Spanned<ClusterDoc>, diag: &mut Diag<'_>) -> Option<Cluster> {
    let before = diag.count();
    let mut c = Cluster::default();
    let base: PathBuf = diag
        .file()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let Some(spec) = &doc.value.spec else {
        diag.missing(
            at(doc),
            &["spec"],
            "a `Cluster` needs a `spec` with the etcd `endpoints`",
        );
        return None;
    };
    let spec_at = at(spec);
    let spec = &spec.value;
    for text in spec.endpoints.iter().flatten() {
        let url = text.value.trim();
        match member_url(url) {
            Ok(()) => c.endpoints.push(url.to_owned()),
            Err(why) => diag.invalid(
                at(text),
                format!(
                    "`endpoints`: {:?} is not an etcd member URL ({why}): write `http://HOST:PORT` or `https://HOST:PORT`",
                    sanitize(url)
                ),
            ),
        }
    }
    if spec.endpoints.as_ref().is_none_or(Vec::is_empty) {
        diag.missing(
            spec_at,
            &["endpoints"],
            "a `Cluster` needs at least one etcd member in `endpoints`",
        );
    }
    if let Some(tls) = &spec.tls {
        let t = &tls.value;
        let relative = |text: &Option<Text>| text.as_ref().map(|t| base.join(t.value.trim()));
        let files = ClusterTls {
            ca: relative(&t.ca),
            cert: relative(&t.cert),
            key: relative(&t.key),
        };
        if files.cert.is_some() != files.key.is_some() {
            diag.invalid(
                at(tls),
                "`tls`: a client certificate needs both `cert` and `key`",
            );
        }
        if c.endpoints.iter().any(|e| e.starts_with("http://")) {
            diag.invalid(
                at(tls),
                "`tls` is set but an endpoint is `http://`: TLS members are `https://`",
            );
        }
        c.tls = Some(files);
    }
    if let Some(auth) = &spec.auth {
        let a = &auth.value;
        let user = a.user.as_ref().map(|t| t.value.trim().to_owned());
        let file = a.password_file.as_ref().map(|t| base.join(t.value.trim()));
        match (user, file) {
            (Some(user), Some(password_file)) if !user.is_empty() => {
                c.auth = Some(ClusterAuth {
                    user,
                    password_file,
                });
            }
            _ => diag.invalid(
                at(auth),
                "`auth` needs `user` (an etcd user) and `passwordFile` (a file holding its password)",
            ),
        }
    }
    if let Some(text) = &spec.prefix {
        let p = text.value.trim().trim_end_matches('/');
        let ok = p.starts_with('/')
            && p.len() > 1
            && p[1..].split('/').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
            });
        if ok {
            c.prefix = p.to_owned();
        } else {
            diag.invalid(
                at(text),
                format!(
                    "`prefix` {:?}: write a key path such as `/fqdnd` (parts of A-Z a-z 0-9 . _ -)",
                    sanitize(&text.value)
                ),
            );
        }
    }
    if let Some(text) = &spec.node_name {
        let name = text.value.trim();
        if valid_node_name(name) {
            c.node_name = Some(name.to_owned());
        } else {
            diag.invalid(
                at(text),
                format!(
                    "`nodeName` {:?}: 1-63 characters of A-Z a-z 0-9 . _ -",
                    sanitize(name)
                ),
            );
        }
    }
    if let Some(text) = &spec.lease_ttl
        && let Some(d) = duration("leaseTTL", text, diag)
    {
        if d < Duration::from_secs(2) || d > Duration::from_secs(3600) {
            diag.invalid(at(text), "`leaseTTL` must be between 2s and 1h");
        } else {
            c.lease_ttl = Duration::from_secs(d.as_secs());
        }
    }
    if let Some(text) = &spec.identity_gc_grace
        && let Some(d) = duration("identityGCGrace", text, diag)
    {
        if d < Duration::from_secs(1) {
            diag.invalid(at(text), "`identityGCGrace` must be at least 1s");
        } else {
            c.identity_gc_grace = d;
        }
    }
    if let Some(text) = &spec.gateway_group {
        let name = text.value.trim();
        if valid_node_name(name) {
            c.gateway_group = Some(name.to_owned());
        } else {
            diag.invalid(
                at(text),
                format!(
                    "`gatewayGroup` {:?}: 1-63 characters of A-Z a-z 0-9 . _ -",
                    sanitize(name)
                ),
            );
        }
    }
    (diag.count() == before).then_some(c)
}
