//! CiliumNetworkPolicy shapes ([`crate::cnp`]) → the policy model ([`fqdnd_ipcache::policy`]),
//! with every check Cilium's API server and agent would make, plus fqdnd's own refusals.
//!
//! Each function reports what it finds to the [`Diag`] and goes on, so that one document yields
//! all its problems; a function returns `None` when its part could not be built.

mod peers;
mod ports;
mod selector;

use fqdnd_ipcache::policy::{EgressRule, PeerSelector, PortRule, Rule};
use serde_saphyr::{Location, Spanned};

pub(crate) use self::peers::parse_cidr;
use self::peers::{cidr_rule, fqdn};
use self::ports::port_rule;
pub(crate) use self::selector::NAMESPACE_KEY;
use self::selector::{Scope, selector};
use crate::cnp::{EgressSpec, PolicyDoc, Rejected, RuleSpec};
use crate::warnings::FqdnAt;
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

/// A converted policy document.
pub(crate) struct Policy {
    /// `namespace/name`, or `name`.
    pub(crate) name: String,
    /// Where `metadata.name` is written.
    pub(crate) name_at: Location,
    /// One rule per `spec` / `specs[]` entry, with its `toFQDNs` entries.
    pub(crate) rules: Vec<(Rule, Vec<FqdnAt>)>,
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
    let qualified = match &namespace {
        Some(ns) => format!("{ns}/{}", name.as_deref().unwrap_or_default()),
        None => name.clone().unwrap_or_default(),
    };
    let scope = Scope {
        namespace: namespace.as_deref(),
    };
    let rules: Vec<(Rule, Vec<FqdnAt>)> = specs
        .into_iter()
        .filter_map(|spec| {
            let line = diag.position(at(spec)).0;
            let origin = format!("{}:{line} {qualified}", diag.file().display());
            rule(spec, origin, scope, diag)
        })
        .collect();
    (diag.count() == before).then_some(Policy {
        name: qualified,
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

/// Reports every rejected field that is present. Returns whether there was one.
fn reject<const N: usize>(fields: [(&'static str, &Rejected); N], diag: &mut Diag<'_>) -> bool {
    let mut found = false;
    for (name, value) in fields {
        if let Some(value) = value {
            found = true;
            diag.invalid_field(
                at(value),
                name,
                format!(
                    "`{name}` is not supported by fqdnd: it would change what this rule allows, \
                     and fqdnd will not silently ignore it; remove it or enforce this policy \
                     with Cilium"
                ),
            );
        }
    }
    found
}

/// One rule (`spec` or `specs[]`), with its `toFQDNs` entries.
fn rule(
    spec: &Spanned<RuleSpec>,
    origin: String,
    scope: Scope<'_>,
    diag: &mut Diag<'_>,
) -> Option<(Rule, Vec<FqdnAt>)> {
    let before = diag.count();
    let r = &spec.value;
    let had_rejected = reject(r.rejected(), diag);

    let endpoint_selector = match &r.endpoint_selector {
        Some(sel) => selector(sel, diag).map(|mut s| {
            scope.confine(&mut s, false);
            s
        }),
        None => {
            diag.missing(
                at(spec),
                &["endpointSelector"],
                "a rule needs an `endpointSelector` (use `{}` to select every endpoint)",
            );
            None
        }
    };

    let egress_specs = r.egress.as_deref().unwrap_or_default();
    if egress_specs.is_empty() && !had_rejected {
        diag.missing(
            at(spec),
            &["egress"],
            "a rule needs a non-empty `egress` list: fqdnd enforces egress only, so this rule \
             would do nothing (Cilium also rejects a rule without rules)",
        );
    }
    let mut egress = Vec::new();
    let mut fqdns = Vec::new();
    for (rule, at) in egress_specs
        .iter()
        .filter_map(|e| egress_rule(e, scope, diag))
    {
        egress.push(rule);
        fqdns.extend(at);
    }

    let default_deny_egress = r
        .enable_default_deny
        .as_ref()
        .and_then(|d| d.egress)
        .unwrap_or(true);
    let rule = Rule {
        origin,
        endpoint_selector: endpoint_selector?,
        egress,
        default_deny_egress,
    };
    (diag.count() == before).then_some((rule, fqdns))
}

/// One `egress[]` entry, with its `toFQDNs` entries. `None` when it is wrong, or when it allows
/// nothing (no peers and no ports, such as `- {}`: in Cilium that only enables default deny).
fn egress_rule(
    spec: &Spanned<EgressSpec>,
    scope: Scope<'_>,
    diag: &mut Diag<'_>,
) -> Option<(EgressRule, Vec<FqdnAt>)> {
    let before = diag.count();
    let e = &spec.value;
    reject(e.rejected(), diag);

    let given = |v: Option<usize>| v.unwrap_or(0) > 0;
    let l3: Vec<&str> = [
        ("toFQDNs", given(e.to_fqdns.as_ref().map(Vec::len))),
        ("toCIDR", given(e.to_cidr.as_ref().map(Vec::len))),
        ("toCIDRSet", given(e.to_cidr_set.as_ref().map(Vec::len))),
        ("toEndpoints", given(e.to_endpoints.as_ref().map(Vec::len))),
    ]
    .into_iter()
    .filter_map(|(name, present)| present.then_some(name))
    .collect();
    if let [first, second, ..] = l3.as_slice() {
        diag.invalid(
            at(spec),
            format!(
                "`{first}` cannot be combined with `{second}` in the same egress rule \
                 (Cilium rejects this too): write them as separate `egress` entries"
            ),
        );
    }

    let mut peers = Vec::new();
    let mut fqdns = Vec::new();
    for f in e.to_fqdns.iter().flatten() {
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
        if let Some(peer) = cidr_rule(c, diag) {
            peers.push(peer);
        }
    }
    for s in e.to_endpoints.iter().flatten() {
        if let Some(mut sel) = selector(s, diag) {
            scope.confine(&mut sel, true);
            peers.push(PeerSelector::Endpoints(sel));
        }
    }
    let ports: Vec<PortRule> = e
        .to_ports
        .iter()
        .flatten()
        .filter_map(|p| port_rule(p, diag))
        .collect();

    if diag.count() != before || (peers.is_empty() && ports.is_empty()) {
        return None;
    }
    Some((EgressRule { peers, ports }, fqdns))
}
