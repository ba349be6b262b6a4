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
//!   namespace: prod         # label k8s:io.kubernetes.pod.namespace=prod (default: `default`)
//!   interface: lxc-web      # Endpoint only: its host-side interface (node mode)
//!   labels:
//!     app: web              # source k8s unless written `source:key`
//! ```
//!
//! An Endpoint of host processes (node mode) names their cgroup instead of an interface and
//! has no addresses of its own (host processes share the host's):
//!
//! ```yaml
//! spec:
//!   id: 7
//!   cgroup: /ci/runner      # a cgroup v2 directory, below the hierarchy's root
//!   # or: unit: ci-runner.service  (its cgroup, found through systemd)
//!   labels: {app: ci}
//! ```

use fqdnd_ipcache::{Endpoint, EndpointId, EndpointLabel};
use ipnet::IpNet;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::{Location, Spanned};

use crate::cnp::ObjectMeta;
use crate::convert::{DEFAULT_NAMESPACE, NAMESPACE_KEY, namespace, object_name, parse_cidr};
use crate::yaml::{Diag, Pairs, Scalar, Text, at, int_in_range, sanitize, shape};

/// The cgroup of an Endpoint of host processes: every socket created in it or in a cgroup
/// below it belongs to the endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cgroup {
    /// A cgroup v2 directory below the hierarchy's root: `/` then components joined by `/`
    /// (`/` alone is the root). Never holds `.`, `..` or an empty component.
    Path(String),
    /// A systemd unit (`name.service`, `.scope` or `.slice`): its cgroup, found through
    /// systemd where it runs.
    Unit(String),
}

impl std::fmt::Display for Cgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Path(p) => write!(f, "cgroup {p}"),
            Self::Unit(u) => write!(f, "unit {u}"),
        }
    }
}

impl Cgroup {
    /// Why the root cgroup (`/`) is never an endpoint.
    pub const ROOT_REFUSED: &'static str = "the root cgroup holds every process of the host, \
        fqdnd's own included (its queries to resolvers would be redirected to itself), so it \
        is never an endpoint: name a cgroup below it, such as /ci/runner";

    /// Whether this is the root cgroup (`/`), which is never an endpoint.
    #[must_use]
    pub fn is_root(&self) -> bool {
        matches!(self, Self::Path(p) if p == "/")
    }

    /// A cgroup path as written (`a/b`, `/a/b/`, `/`) in its canonical form (`/a/b`, `/`);
    /// `None` when a component is `.`, `..` or holds a control character. (`/` is a path, but
    /// never an endpoint's: see [`Self::is_root`].)
    pub fn path(text: &str) -> Option<Self> {
        let parts: Vec<&str> = text.split('/').filter(|p| !p.is_empty()).collect();
        let bad = |p: &&str| *p == "." || *p == ".." || p.chars().any(char::is_control);
        if text.trim() != text || text.is_empty() || parts.iter().any(bad) {
            return None;
        }
        Some(Self::Path(format!("/{}", parts.join("/"))))
    }

    /// A systemd unit name that has a cgroup (`.service`, `.scope`, `.slice`); `None`
    /// otherwise (systemd.unit(5): at most 255 characters of `[A-Za-z0-9:_.@\-]`).
    pub fn unit(text: &str) -> Option<Self> {
        let stem = [".service", ".scope", ".slice"]
            .iter()
            .find_map(|s| text.strip_suffix(s))?;
        let ok = !stem.is_empty()
            && text.len() <= 255
            && text.chars().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '.' | '@' | '-' | '\\')
            });
        ok.then(|| Self::Unit(text.to_owned()))
    }
}

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
    cgroup: Option<Text>,
    unit: Option<Text>,
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
    /// The cgroup of host processes, for node mode.
    pub(crate) cgroup: Option<Cgroup>,
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
    let host_processes = kind == EndpointKind::Endpoint && (s.cgroup.is_some() || s.unit.is_some());
    match s.addresses.as_deref() {
        Some([text, ..]) if host_processes => diag.invalid(
            at(text),
            "an Endpoint of host processes (`cgroup` or `unit`) has no addresses of its own: \
             they share the host's; remove `addresses`",
        ),
        None | Some([]) if host_processes => {}
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
    let cgroup = cgroup(s, kind, diag);
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
        cgroup,
    })
}

/// `spec.cgroup` or `spec.unit` of an Endpoint (at most one of them and `interface`).
fn cgroup(s: &EndpointSpec, kind: EndpointKind, diag: &mut Diag<'_>) -> Option<Cgroup> {
    let given: Vec<(&str, &Text)> = [
        ("interface", &s.interface),
        ("cgroup", &s.cgroup),
        ("unit", &s.unit),
    ]
    .into_iter()
    .filter_map(|(name, text)| Some((name, text.as_ref()?)))
    .collect();
    if let [_, (second, text), ..] = given[..] {
        diag.invalid(
            at(text),
            format!(
                "`spec.{second}` with `spec.{}`: an Endpoint is one interface, one cgroup or \
                 one systemd unit",
                given[0].0
            ),
        );
        return None;
    }
    let (field, text) = match (&s.cgroup, &s.unit) {
        (Some(text), _) => ("cgroup", text),
        (None, Some(text)) => ("unit", text),
        (None, None) => return None,
    };
    if kind == EndpointKind::ClientGroup {
        diag.invalid(
            at(text),
            format!("a ClientGroup has no `{field}`: declare an Endpoint for host processes"),
        );
        return None;
    }
    let parsed = if field == "cgroup" {
        Cgroup::path(&text.value)
    } else {
        Cgroup::unit(&text.value)
    };
    if parsed.as_ref().is_some_and(Cgroup::is_root) {
        diag.invalid(
            at(text),
            format!("`spec.cgroup` is `/`: {}", Cgroup::ROOT_REFUSED),
        );
        return None;
    }
    if parsed.is_none() {
        let expected = if field == "cgroup" {
            "a cgroup v2 path below the hierarchy's root (`/a/b`), without `.` or `..`"
        } else {
            "a systemd unit name ending in .service, .scope or .slice"
        };
        diag.invalid(
            at(text),
            format!(
                "`spec.{field}` {:?} is not {expected}",
                sanitize(&text.value)
            ),
        );
    }
    parsed
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

/// `spec.labels` plus `spec.namespace` (`default` when not given), as endpoint labels.
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
    // As a pod created without a namespace: in `default` (where a CiliumNetworkPolicy without
    // `metadata.namespace` applies).
    if !out
        .iter()
        .any(|l| l.source == "k8s" && l.key == NAMESPACE_KEY)
    {
        out.push(EndpointLabel {
            source: "k8s".into(),
            key: NAMESPACE_KEY.into(),
            value: DEFAULT_NAMESPACE.into(),
        });
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
