//! `kind: Endpoint` and `kind: ClientGroup` (`apiVersion: fqdnd.io/v1`): the workloads whose
//! egress fqdnd enforces, with the labels policies select them by.
//!
//! ```yaml
//! apiVersion: fqdnd.io/v1
//! kind: Endpoint            # or ClientGroup (addresses may then be CIDRs)
//! metadata:
//!   name: web
//! spec:
//!   id: 1                   # 1-65535, unique across Endpoints and ClientGroups
//!   addresses: [10.0.1.2, fd00::1:2]
//!   namespace: prod         # optional: label k8s:io.kubernetes.pod.namespace=prod
//!   interface: lxc-web      # Endpoint only: its host-side interface (node mode)
//!   labels:
//!     app: web              # source k8s unless written `source:key`
//! ```

use fqdnd_ipcache::{Endpoint, EndpointId, EndpointLabel};
use ipnet::IpNet;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::{Location, Spanned};

use crate::cnp::ObjectMeta;
use crate::convert::{NAMESPACE_KEY, namespace, object_name, parse_cidr};
use crate::yaml::{Diag, Pairs, Scalar, Text, at, int_in_range, sanitize, shape};

/// A whole `Endpoint` or `ClientGroup` document.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct EndpointDoc {
    #[serde(rename = "apiVersion")]
    _api_version: Option<IgnoredAny>,
    #[serde(rename = "kind")]
    _kind: Option<IgnoredAny>,
    metadata: Option<Spanned<ObjectMeta>>,
    spec: Option<Spanned<EndpointSpec>>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
struct EndpointSpec {
    id: Option<Spanned<Scalar>>,
    addresses: Option<Vec<Text>>,
    labels: Option<Pairs<Text, Text>>,
    namespace: Option<Text>,
    interface: Option<Text>,
}

shape!(EndpointDoc, EndpointSpec,);

/// Which of the two kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndpointKind {
    /// Single addresses (host prefixes).
    Endpoint,
    /// Any prefixes.
    ClientGroup,
}

impl EndpointKind {
    fn name(self) -> &'static str {
        match self {
            Self::Endpoint => "Endpoint",
            Self::ClientGroup => "ClientGroup",
        }
    }
}

/// A converted endpoint with where its unique parts are written, for checks across documents.
pub(crate) struct Declared {
    pub(crate) endpoint: Endpoint,
    pub(crate) name_at: Location,
    pub(crate) id_at: Location,
    pub(crate) address_at: Vec<Location>,
    /// The host-side interface, for node mode.
    pub(crate) interface: Option<String>,
}

/// Converts one `Endpoint` / `ClientGroup` document; `None` if anything in it is wrong.
pub(crate) fn endpoint(
    doc: &Spanned<EndpointDoc>,
    kind: EndpointKind,
    diag: &mut Diag<'_>,
) -> Option<Declared> {
    let before = diag.count();
    let (name, name_at) = match &doc.value.metadata {
        Some(meta) => {
            if let Some(ns) = &meta.value.namespace {
                diag.invalid(
                    at(ns),
                    format!(
                        "an {} is not namespaced: write the namespace as `spec.namespace`",
                        kind.name()
                    ),
                );
            }
            (
                object_name(meta.value.name.as_ref(), at(meta), diag),
                meta.value.name.as_ref().map_or(at(meta), at),
            )
        }
        None => {
            diag.missing(
                at(doc),
                &["metadata"],
                format!("an {} needs `metadata` with a `name`", kind.name()),
            );
            (None, at(doc))
        }
    };
    let Some(spec) = &doc.value.spec else {
        diag.missing(
            at(doc),
            &["spec"],
            format!(
                "an {} needs a `spec` with `id` and `addresses`",
                kind.name()
            ),
        );
        return None;
    };
    let s = &spec.value;

    let id = match &s.id {
        Some(id) => {
            int_in_range("id", id, 1, u16::MAX.into(), diag).and_then(|v| u16::try_from(v).ok())
        }
        None => {
            diag.missing(
                at(spec),
                &["id"],
                "`spec.id` is required (1-65535, unique across Endpoints and ClientGroups)",
            );
            None
        }
    };
    let id_at = s.id.as_ref().map_or(at(spec), at);

    let mut addresses = Vec::new();
    let mut address_at = Vec::new();
    match s.addresses.as_deref() {
        None => diag.missing(
            at(spec),
            &["addresses"],
            "`spec.addresses` must list at least one address",
        ),
        Some([]) => diag.invalid(at(spec), "`spec.addresses` must list at least one address"),
        Some(list) => {
            for text in list {
                let Some(net) = parse_cidr(text, "addresses", diag) else {
                    continue;
                };
                if kind == EndpointKind::Endpoint && net.prefix_len() != net.max_prefix_len() {
                    diag.invalid(
                        at(text),
                        format!("an Endpoint's addresses are single IPs, not {net}: declare a ClientGroup for a range"),
                    );
                    continue;
                }
                addresses.push(net);
                address_at.push(at(text));
            }
        }
    }
    check_repeated_addresses(&addresses, &address_at, diag);

    let labels = labels(s, diag);
    let interface = match (&s.interface, kind) {
        (None, _) => None,
        (Some(text), EndpointKind::ClientGroup) => {
            diag.invalid(
                at(text),
                "a ClientGroup has no interface of its own: list the gateway's LAN interfaces \
                 in the Gateway's `enforceInterfaces`",
            );
            None
        }
        (Some(text), EndpointKind::Endpoint) => {
            crate::gateway::interface("spec.interface", text, diag)
        }
    };
    let endpoint = Endpoint {
        id: EndpointId(id?),
        name: name?,
        addresses,
        labels,
    };
    (diag.count() == before).then_some(Declared {
        endpoint,
        name_at,
        id_at,
        address_at,
        interface,
    })
}

fn check_repeated_addresses(addresses: &[IpNet], address_at: &[Location], diag: &mut Diag<'_>) {
    for (i, net) in addresses.iter().enumerate() {
        if addresses[..i].contains(net)
            && let Some(loc) = address_at.get(i)
        {
            diag.invalid(*loc, format!("address {net} is listed twice"));
        }
    }
}

/// `spec.labels` plus `spec.namespace`, as endpoint labels.
fn labels(s: &EndpointSpec, diag: &mut Diag<'_>) -> Vec<EndpointLabel> {
    let mut out: Vec<EndpointLabel> = Vec::new();
    let mut add = |label: EndpointLabel, loc: Location, diag: &mut Diag<'_>| {
        if out
            .iter()
            .any(|l| l.source == label.source && l.key == label.key)
        {
            diag.invalid(
                loc,
                format!("label {}:{} is given twice", label.source, label.key),
            );
        } else {
            out.push(label);
        }
    };
    if let Some(ns_text) = &s.namespace
        && let Some(ns) = namespace(ns_text, "spec.namespace", diag)
    {
        let label = EndpointLabel {
            source: "k8s".into(),
            key: NAMESPACE_KEY.into(),
            value: ns,
        };
        add(label, at(ns_text), diag);
    }
    for (key, value) in s.labels.iter().flat_map(|p| &p.0) {
        if let Some(label) = label(key, value, diag) {
            add(label, at(key), diag);
        }
    }
    out
}

/// One `labels` entry: `key` or `source:key` → value.
fn label(key: &Text, value: &Text, diag: &mut Diag<'_>) -> Option<EndpointLabel> {
    let k = key.value.as_str();
    let (source, name) = k.split_once(':').unwrap_or(("k8s", k));
    let problem = if name.is_empty() || source.is_empty() {
        Some(format!(
            "label key {:?} must be `key` or `source:key`",
            sanitize(k)
        ))
    } else if k.chars().any(|c| c.is_whitespace() || c.is_control()) || name.contains(':') {
        Some(format!(
            "label key {:?} contains whitespace or a second ':'",
            sanitize(k)
        ))
    } else if matches!(source, "any" | "reserved" | "fqdn" | "cidr") {
        Some(format!(
            "label source `{source}:` is not allowed on an endpoint: `reserved:`, `fqdn:` and \
             `cidr:` labels are derived by fqdnd (an endpoint carrying one could be selected \
             as if it were that identity), and `any:` only exists in selectors"
        ))
    } else if value.value.chars().any(char::is_control) {
        diag.invalid(
            at(value),
            format!(
                "label value {:?} contains control characters",
                sanitize(&value.value)
            ),
        );
        return None;
    } else {
        None
    };
    if let Some(message) = problem {
        diag.invalid(at(key), message);
        return None;
    }
    Some(EndpointLabel {
        source: source.to_owned(),
        key: name.to_owned(),
        value: value.value.clone(),
    })
}
