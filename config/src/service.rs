//! `kind: Service` (`apiVersion: fqdnd.io/v1`): a virtual IP and port whose new flows the
//! node's datapath spreads over backends (the LB v2 maps), and whose DNS queries the proxy
//! forwards to one of them.
//!
//! ```yaml
//! apiVersion: fqdnd.io/v1
//! kind: Service
//! metadata:
//!   name: cluster-dns
//! spec:
//!   frontend: 10.96.0.10:53     # VIP:port (IPv6: "[fd00::10]:53")
//!   protocol: UDP               # TCP (default) or UDP: TCP and UDP on one port are distinct
//!   backends: ["10.0.1.5:53", "10.0.2.5:53"]
//! ```

use std::net::SocketAddr;

use fqdnd_lb::{Protocol, ServiceKey};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::{Location, Spanned};

use crate::cnp::ObjectMeta;
use crate::convert::object_name;
use crate::yaml::{Diag, Text, at, shape};

/// A service as configured.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Service {
    /// `metadata.name`: unique across services.
    pub name: String,
    /// The VIP, port and protocol.
    pub key: ServiceKey,
    /// The backends, in the order written.
    pub backends: Vec<SocketAddr>,
}

/// A whole `Service` document.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct ServiceDoc {
    #[serde(rename = "apiVersion")]
    _api_version: Option<IgnoredAny>,
    #[serde(rename = "kind")]
    _kind: Option<IgnoredAny>,
    metadata: Option<Spanned<ObjectMeta>>,
    spec: Option<Spanned<ServiceSpec>>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
struct ServiceSpec {
    frontend: Option<Text>,
    protocol: Option<Text>,
    backends: Option<Vec<Text>>,
}

shape!(ServiceDoc, ServiceSpec,);

/// A converted service and where its name is written.
pub(crate) struct DeclaredService {
    pub(crate) service: Service,
    pub(crate) name_at: Location,
    pub(crate) frontend_at: Location,
}

fn socket_addr(text: &Text, what: &str, diag: &mut Diag<'_>) -> Option<SocketAddr> {
    match text.value.trim().parse::<SocketAddr>() {
        Ok(a) if !a.ip().is_unspecified() && a.port() != 0 => Some(a),
        Ok(_) => {
            diag.invalid(
                at(text),
                format!("{what} must be a unicast address with a port other than 0"),
            );
            None
        }
        Err(_) => {
            diag.invalid(
                at(text),
                format!(
                    "{what} {:?} is not ADDRESS:PORT (IPv6: [ADDRESS]:PORT)",
                    text.value
                ),
            );
            None
        }
    }
}

/// Converts one `Service` document; `None` if anything in it is wrong.
pub(crate) fn service(doc: &Spanned<ServiceDoc>, diag: &mut Diag<'_>) -> Option<DeclaredService> {
    let before = diag.count();
    let (name, name_at) = match &doc.value.metadata {
        Some(meta) => (
            object_name(meta.value.name.as_ref(), at(meta), diag),
            meta.value.name.as_ref().map_or(at(meta), at),
        ),
        None => {
            diag.missing(
                at(doc),
                &["metadata"],
                "a Service needs `metadata` with a `name`",
            );
            (None, at(doc))
        }
    };
    let Some(spec) = &doc.value.spec else {
        diag.missing(
            at(doc),
            &["spec"],
            "a Service needs a `spec` with `frontend` and `backends`",
        );
        return None;
    };
    let s = &spec.value;
    let frontend = match &s.frontend {
        Some(f) => socket_addr(f, "`spec.frontend`", diag),
        None => {
            diag.missing(
                at(spec),
                &["frontend"],
                "`spec.frontend` (VIP:PORT) is required",
            );
            None
        }
    };
    let frontend_at = s.frontend.as_ref().map_or(at(spec), at);
    let proto = match &s.protocol {
        None => Some(Protocol::Tcp),
        Some(p) => match p.value.parse::<Protocol>() {
            Ok(p) => Some(p),
            Err(e) => {
                diag.invalid(at(p), format!("`spec.protocol`: {e}"));
                None
            }
        },
    };
    let mut backends = Vec::new();
    for b in s.backends.iter().flatten() {
        if let Some(addr) = socket_addr(b, "a backend", diag) {
            if let Some(f) = frontend
                && f.is_ipv4() != addr.is_ipv4()
            {
                diag.invalid(at(b), "a backend must be of the frontend's address family");
            } else if backends.contains(&addr) {
                diag.invalid(at(b), format!("backend {addr} is listed twice"));
            } else {
                backends.push(addr);
            }
        }
    }
    if diag.count() != before {
        return None;
    }
    let (name, frontend, proto) = (name?, frontend?, proto?);
    Some(DeclaredService {
        service: Service {
            name,
            key: ServiceKey {
                vip: frontend.ip(),
                port: frontend.port(),
                proto,
            },
            backends,
        },
        name_at,
        frontend_at,
    })
}
