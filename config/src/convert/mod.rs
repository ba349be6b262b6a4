//! CiliumNetworkPolicy shapes ([`crate::cnp`]) → the policy model ([`fqdnd_ipcache::policy`]),
//! with every check Cilium's API server and agent would make, plus fqdnd's own refusals.
//!
//! Each function reports what it finds to the [`Diag`] and goes on, so that one document yields
//! all its problems; a function returns `None` when its part could not be built.

mod entities;
mod peers;
mod ports;
mod selector;

use fqdnd_ipcache::policy::{EgressRule, PeerSelector, PortRule, Rule};
use serde_saphyr::{Location, Spanned};

use self::entities::{entity, icmp_rule};
pub(crate) use self::peers::parse_cidr;
use self::peers::{cidr_rule, fqdn};
use self::ports::port_rule;
pub(crate) use self::selector::NAMESPACE_KEY;
use self::selector::{Scope, selector};
use crate::cnp::{
    EgressSpec, IcmpRuleSpec, IngressSpec, PolicyDoc, PortRuleSpec, Rejected, RuleSpec,
};
use crate::error::Unsupported;
use crate::warnings::{FqdnAt, RuleAt};
use crate::yaml::{Diag, Text, at, sanitize};

/// The two policy kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PolicyKind {
    /// `CiliumNetworkPolicy`: namespaced.
    Namespaced,
    /// `CiliumClusterwideNetworkPolicy`.
    Clusterwide,
}

impl PolicyKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Namespaced => "CiliumNetworkPolicy",
            Self::Clusterwide => "CiliumClusterwideNetworkPolicy",
        }
    }
}

/// The namespace of a CiliumNetworkPolicy without `metadata.namespace`, as `kubectl apply`
/// without `-n` would put it (and of an Endpoint without `spec.namespace`).
pub(crate) const DEFAULT_NAMESPACE: &str = "default";

/// A converted policy document.
pub(crate) struct Policy {
    /// `namespace/name`, or `name` (a CiliumClusterwideNetworkPolicy, or a
    /// CiliumNetworkPolicy without `metadata.namespace`: it is in [`DEFAULT_NAMESPACE`]).
    pub(crate) name: String,
    /// What makes two policies the same one: kind aside, `namespace/name` (the default
    /// namespace written out) or `name`.
    pub(crate) key: String,
    /// A CiliumNetworkPolicy without `metadata.namespace` (so in [`DEFAULT_NAMESPACE`]).
    pub(crate) implicit_namespace: bool,
    /// Where `metadata.name` is written.
    pub(crate) name_at: Location,
    /// One rule per `spec` / `specs[]` entry, with where its pieces are written.
    pub(crate) rules: Vec<(Rule, RuleAt)>,
}

/// Converts one policy document; `None` if anything in it is wrong (all of it reported).
pub(crate) fn policy(
    doc: &Spanned<PolicyDoc>,
    kind: PolicyKind,
    diag: &mut Diag<'_>,
) -> Option<Policy> {
    let before = diag.count();
    let (name, name_at, namespace) = policy_metadata(doc, kind, diag);

    let specs: Vec<&Spanned<RuleSpec>> = doc
        .value
        .spec
        .iter()
        .chain(doc.value.specs.iter().flatten())
        .collect();
    if specs.is_empty() {
        diag.missing(
            at(doc),
            &["spec", "specs"],
            format!(
                "a {} needs `spec` (one rule) or `specs` (a list of rules)",
                kind.name()
            ),
        );
    }
    let implicit_namespace = kind == PolicyKind::Namespaced && namespace.is_none();
    let qualified = match &namespace {
        Some(ns) => format!("{ns}/{}", name.as_deref().unwrap_or_default()),
        None => name.clone().unwrap_or_default(),
    };
    let key = if implicit_namespace {
        format!("{DEFAULT_NAMESPACE}/{qualified}")
    } else {
        qualified.clone()
    };
    // As Kubernetes: a CiliumNetworkPolicy is always in a namespace, `default` unless it
    // says (a warning says so; it used to apply to every namespace).
    let scope = Scope {
        namespace: match kind {
            PolicyKind::Namespaced => Some(namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)),
            PolicyKind::Clusterwide => None,
        },
    };
    let rules: Vec<(Rule, RuleAt)> = specs
        .into_iter()
        .filter_map(|spec| {
            let line = diag.position(at(spec)).0;
            let origin = format!("{}:{line} {qualified}", diag.file().display());
            rule(spec, origin, scope, diag)
        })
        .collect();
    (diag.count() == before).then_some(Policy {
        name: qualified,
        key,
        implicit_namespace,
        name_at,
        rules,
    })
}

/// `metadata`: the name (required) and, for a CiliumNetworkPolicy, the namespace.
fn policy_metadata(
    doc: &Spanned<PolicyDoc>,
    kind: PolicyKind,
    diag: &mut Diag<'_>,
) -> (Option<String>, Location, Option<String>) {
    let Some(meta) = &doc.value.metadata else {
        diag.missing(
            at(doc),
            &["metadata"],
            format!("a {} needs `metadata` with a `name`", kind.name()),
        );
        return (None, at(doc), None);
    };
    let name = object_name(meta.value.name.as_ref(), at(meta), diag);
    let name_at = meta.value.name.as_ref().map_or(at(meta), at);
    let namespace = match (&meta.value.namespace, kind) {
        (None, _) => None,
        (Some(ns), PolicyKind::Namespaced) => namespace(ns, "metadata.namespace", diag),
        (Some(ns), PolicyKind::Clusterwide) => {
            diag.invalid(
                at(ns),
                "a CiliumClusterwideNetworkPolicy has no namespace: remove `metadata.namespace`, \
                 or use a CiliumNetworkPolicy to apply only inside one namespace",
            );
            None
        }
    };
    (name, name_at, namespace)
}

/// `metadata.name`: required, non-empty.
pub(crate) fn object_name(
    name: Option<&Text>,
    parent: Location,
    diag: &mut Diag<'_>,
) -> Option<String> {
    match name {
        None => {
            diag.missing(parent, &["name"], "`metadata.name` is required");
            None
        }
        Some(n) if n.value.trim().is_empty() || n.value.chars().any(char::is_control) => {
            diag.invalid(
                at(n),
                "`metadata.name` must be a non-empty name without control characters",
            );
            None
        }
        Some(n) => Some(n.value.clone()),
    }
}

/// A namespace name: a DNS-1123 label, as Kubernetes requires.
pub(crate) fn namespace(ns: &Text, field: &str, diag: &mut Diag<'_>) -> Option<String> {
    let s = ns.value.as_str();
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Some(s.to_owned())
    } else {
        diag.invalid(
            at(ns),
            format!(
                "`{field}` {:?} is not a Kubernetes namespace name (1-63 lowercase letters, \
                 digits and '-', starting and ending with a letter or digit)",
                sanitize(s)
            ),
        );
        None
    }
}

/// Why a rejected field is refused; `None` for the deprecated `toRequires`/`fromRequires`.
fn why(field: &str) -> Option<Unsupported> {
    match field {
        "toServices" | "toNodes" | "fromNodes" | "nodeSelector" => {
            Some(Unsupported::KubernetesOnly)
        }
        "toGroups" | "fromGroups" | "authentication" | "cidrGroupRef" | "cidrGroupSelector" => {
            Some(Unsupported::External)
        }
        "toRequires" | "fromRequires" => None,
        _ => Some(Unsupported::L7Proxy),
    }
}

/// Reports every rejected field that is present. Returns whether there was one.
fn reject<const N: usize>(fields: [(&'static str, &Rejected); N], diag: &mut Diag<'_>) -> bool {
    let mut found = false;
    for (name, value) in fields {
        if let Some(value) = value {
            found = true;
            match why(name) {
                Some(why) => diag.unsupported(at(value), name, name, why),
                None => diag.invalid_field(
                    at(value),
                    name,
                    format!(
                        "`{name}` is not supported by fqdnd: it is deprecated in Cilium, and it \
                         would change what this rule allows; select the peers directly"
                    ),
                ),
            }
        }
    }
    found
}

/// The sections of a rule, converted.
#[derive(Default)]
struct Sections {
    egress: Vec<EgressRule>,
    ingress: Vec<EgressRule>,
    egress_deny: Vec<EgressRule>,
    ingress_deny: Vec<EgressRule>,
    at: RuleAt,
}

/// One rule (`spec` or `specs[]`), with where its pieces are written.
fn rule(
    spec: &Spanned<RuleSpec>,
    origin: String,
    scope: Scope<'_>,
    diag: &mut Diag<'_>,
) -> Option<(Rule, RuleAt)> {
    let before = diag.count();
    let r = &spec.value;
    let had_rejected = reject(r.rejected(), diag);

    let endpoint_selector = match &r.endpoint_selector {
        Some(sel) => selector(sel, diag).map(|mut s| {
            scope.confine(&mut s, false);
            s
        }),
        // A host policy (`nodeSelector`) is refused already.
        None if r.node_selector.is_some() => None,
        None => {
            diag.missing(
                at(spec),
                &["endpointSelector"],
                "a rule needs an `endpointSelector` (use `{}` to select every endpoint)",
            );
            None
        }
    };

    let present = |v: Option<usize>| v.is_some_and(|n| n > 0);
    let has_egress =
        present(r.egress.as_ref().map(Vec::len)) || present(r.egress_deny.as_ref().map(Vec::len));
    let has_ingress =
        present(r.ingress.as_ref().map(Vec::len)) || present(r.ingress_deny.as_ref().map(Vec::len));
    // Cilium: "If omitted or empty, this rule does not apply at egress" (and ingress): an empty
    // list is accepted and does nothing; a rule with none of the four is refused.
    let none = r.egress.is_none()
        && r.ingress.is_none()
        && r.egress_deny.is_none()
        && r.ingress_deny.is_none();
    if none && !had_rejected {
        diag.missing(
            at(spec),
            &["egress", "ingress", "egressDeny", "ingressDeny"],
            "a rule needs a non-empty `egress`, `ingress`, `egressDeny` or `ingressDeny` list: \
             this rule would do nothing (Cilium also rejects a rule without rules)",
        );
    }
    let mut sections = Sections::default();
    for e in r.egress.iter().flatten() {
        if let Some((rule, fqdns)) = egress_rule(e, scope, false, diag) {
            sections.egress.push(rule);
            sections.at.egress.push(diag.position(at(e)));
            sections.at.fqdns.extend(fqdns);
        }
    }
    for e in r.egress_deny.iter().flatten() {
        if let Some((rule, _)) = egress_rule(e, scope, true, diag) {
            sections.egress_deny.push(rule);
            sections.at.egress_deny.push(diag.position(at(e)));
        }
    }
    for i in r.ingress.iter().flatten() {
        if let Some(rule) = ingress_rule(i, scope, false, diag) {
            sections.ingress.push(rule);
            sections.at.ingress.push(diag.position(at(i)));
        }
    }
    for i in r.ingress_deny.iter().flatten() {
        if let Some(rule) = ingress_rule(i, scope, true, diag) {
            sections.ingress_deny.push(rule);
            sections.at.ingress_deny.push(diag.position(at(i)));
        }
    }

    // Cilium: "If not specified, the default is true for each traffic direction that has
    // rules, and false otherwise."
    let default_deny = r.enable_default_deny.as_ref();
    let default_deny_egress = has_egress && default_deny.and_then(|d| d.egress).unwrap_or(true);
    let default_deny_ingress = has_ingress && default_deny.and_then(|d| d.ingress).unwrap_or(true);
    let rule = Rule {
        origin,
        endpoint_selector: endpoint_selector?,
        egress: sections.egress,
        default_deny_egress,
        ingress: sections.ingress,
        egress_deny: sections.egress_deny,
        ingress_deny: sections.ingress_deny,
        default_deny_ingress,
    };
    (diag.count() == before).then_some((rule, sections.at))
}

/// Reports a combination of two L3 selectors in one section (Cilium rejects it).
fn exclusive_l3(present: &[(&str, Option<usize>)], section: Location, diag: &mut Diag<'_>) {
    let l3: Vec<&str> = present
        .iter()
        .filter_map(|(name, n)| n.is_some_and(|n| n > 0).then_some(*name))
        .collect();
    if let [first, second, ..] = l3.as_slice() {
        diag.invalid(
            section,
            format!(
                "`{first}` cannot be combined with `{second}` in the same rule (Cilium rejects \
                 this too): write them as separate entries"
            ),
        );
    }
}

/// `icmps` and `toPorts` are exclusive in one section (Cilium: "the ICMPs block may only be
/// present without ToPorts").
fn ports_and_icmps(
    ports: Option<&Vec<Spanned<PortRuleSpec>>>,
    icmps: Option<&Vec<Spanned<IcmpRuleSpec>>>,
    section: Location,
    deny: bool,
    dns_allowed: bool,
    diag: &mut Diag<'_>,
) -> Vec<PortRule> {
    if ports.is_some_and(|p| !p.is_empty()) && icmps.is_some_and(|i| !i.is_empty()) {
        diag.invalid(
            section,
            "`icmps` cannot be combined with `toPorts` in the same rule (Cilium rejects this \
             too): write them as separate entries",
        );
    }
    let mut out: Vec<PortRule> = ports
        .into_iter()
        .flatten()
        .filter_map(|p| port_rule(p, deny, dns_allowed, diag))
        .collect();
    out.extend(
        icmps
            .into_iter()
            .flatten()
            .filter_map(|i| icmp_rule(i, diag)),
    );
    out
}

/// One `egress[]` (or `egressDeny[]`) entry, with its `toFQDNs` entries. `None` when it is
/// wrong, or when it allows nothing (no peers and no ports, such as `- {}`: in Cilium that
/// only enables default deny).
fn egress_rule(
    spec: &Spanned<EgressSpec>,
    scope: Scope<'_>,
    deny: bool,
    diag: &mut Diag<'_>,
) -> Option<(EgressRule, Vec<FqdnAt>)> {
    let before = diag.count();
    let e = &spec.value;
    reject(e.rejected(), diag);

    exclusive_l3(
        &[
            ("toFQDNs", e.to_fqdns.as_ref().map(Vec::len)),
            ("toCIDR", e.to_cidr.as_ref().map(Vec::len)),
            ("toCIDRSet", e.to_cidr_set.as_ref().map(Vec::len)),
            ("toEndpoints", e.to_endpoints.as_ref().map(Vec::len)),
            ("toEntities", e.to_entities.as_ref().map(Vec::len)),
        ],
        at(spec),
        diag,
    );

    let mut peers = Vec::new();
    let mut fqdns = Vec::new();
    if deny && let Some(f) = e.to_fqdns.as_ref().and_then(|f| f.first()) {
        diag.invalid_field(
            at(f),
            "toFQDNs",
            "`toFQDNs` is not allowed in `egressDeny` (Cilium does not allow it either): deny \
             the addresses with `toCIDR`/`toCIDRSet`, or leave the names out of the allows",
        );
    }
    for f in e.to_fqdns.iter().flatten().filter(|_| !deny) {
        if let Some(selector) = fqdn(f, "toFQDNs", diag) {
            peers.push(PeerSelector::Fqdn(selector.key().to_owned()));
            let written = f
                .value
                .match_name
                .as_ref()
                .or(f.value.match_pattern.as_ref());
            fqdns.push(FqdnAt {
                written: written.map_or_else(String::new, |t| sanitize(t.value.trim())),
                selector,
                at: diag.position(at(f)),
            });
        }
    }
    for c in e.to_cidr.iter().flatten() {
        if let Some(cidr) = parse_cidr(c, "toCIDR", diag) {
            peers.push(PeerSelector::Cidr {
                cidr,
                except: Vec::new(),
            });
        }
    }
    for c in e.to_cidr_set.iter().flatten() {
        if let Some(peer) = cidr_rule(c, "toCIDRSet", diag) {
            peers.push(peer);
        }
    }
    for s in e.to_endpoints.iter().flatten() {
        if let Some(mut sel) = selector(s, diag) {
            scope.confine(&mut sel, true);
            peers.push(PeerSelector::Endpoints(sel));
        }
    }
    for text in e.to_entities.iter().flatten() {
        if let Some(entity) = entity(text, "toEntities", diag) {
            peers.push(PeerSelector::Entity(entity));
        }
    }
    let ports = ports_and_icmps(
        e.to_ports.as_ref(),
        e.icmps.as_ref(),
        at(spec),
        deny,
        true,
        diag,
    );

    if diag.count() != before || (peers.is_empty() && ports.is_empty()) {
        return None;
    }
    Some((EgressRule { peers, ports }, fqdns))
}

/// One `ingress[]` (or `ingressDeny[]`) entry: sources × ports. `None` when it is wrong or
/// allows nothing (`- {}`, which only enables default deny).
fn ingress_rule(
    spec: &Spanned<IngressSpec>,
    scope: Scope<'_>,
    deny: bool,
    diag: &mut Diag<'_>,
) -> Option<EgressRule> {
    let before = diag.count();
    let i = &spec.value;
    reject(i.rejected(), diag);
    exclusive_l3(
        &[
            ("fromCIDR", i.from_cidr.as_ref().map(Vec::len)),
            ("fromCIDRSet", i.from_cidr_set.as_ref().map(Vec::len)),
            ("fromEndpoints", i.from_endpoints.as_ref().map(Vec::len)),
            ("fromEntities", i.from_entities.as_ref().map(Vec::len)),
        ],
        at(spec),
        diag,
    );
    let mut peers = Vec::new();
    for c in i.from_cidr.iter().flatten() {
        if let Some(cidr) = parse_cidr(c, "fromCIDR", diag) {
            peers.push(PeerSelector::Cidr {
                cidr,
                except: Vec::new(),
            });
        }
    }
    for c in i.from_cidr_set.iter().flatten() {
        if let Some(peer) = cidr_rule(c, "fromCIDRSet", diag) {
            peers.push(peer);
        }
    }
    for s in i.from_endpoints.iter().flatten() {
        if let Some(mut sel) = selector(s, diag) {
            scope.confine(&mut sel, true);
            peers.push(PeerSelector::Endpoints(sel));
        }
    }
    for text in i.from_entities.iter().flatten() {
        if let Some(entity) = entity(text, "fromEntities", diag) {
            peers.push(PeerSelector::Entity(entity));
        }
    }
    let ports = ports_and_icmps(
        i.to_ports.as_ref(),
        i.icmps.as_ref(),
        at(spec),
        deny,
        false,
        diag,
    );
    if diag.count() != before || (peers.is_empty() && ports.is_empty()) {
        return None;
    }
    Some(EgressRule { peers, ports })
}
