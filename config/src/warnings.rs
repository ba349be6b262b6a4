//! What loading warns about: configurations that are valid but cannot work as written. Warnings
//! never make loading fail; `fqdnd policy check` prints them.
//!
//! Two kinds. An allow entry a deny entry shadows entirely ([`Warning::ShadowedAllow`]): in
//! Cilium a deny wins over every allow, so an `egress`/`ingress` entry whose peers and ports
//! all lie inside one `egressDeny`/`ingressDeny` entry of a rule selecting the same endpoints
//! allows nothing — almost always a mistake (the deny is wider than meant, or the allow is
//! dead). The check is sound, not complete: it compares one deny entry with one allow entry
//! (peers by containment: the same selector, a CIDR inside a CIDR, `world` over CIDRs and
//! FQDNs, `cluster` over endpoints, `all` or no peers over everything; ports by range and
//! protocol), with the endpoints chosen as below. `fqdnd policy explain` tells the same per flow.
//!
//! And a `toFQDNs` selector that can never learn an address. fqdnd learns the
//! IPs of an answer under the name that was asked only (not under the CNAME targets on the way),
//! and it sees only the DNS that the policy lets through its proxy: a query is allowed when an
//! egress entry of a rule selecting the endpoint reaches a DNS server on port 53 (no peers, or
//! CIDR / endpoint peers; an entry whose only peers are FQDNs reaches no DNS server) and either
//! has no DNS rules (every name) or a `matchName` / `matchPattern` matching the name; an
//! endpoint that no default-deny rule selects may ask any name. So a selector is dead when no
//! name it matches can be asked by the endpoints its rule selects: no DNS rule of theirs can
//! match a common name with it ([`FqdnSelector::overlaps`], an exact language intersection).
//!
//! Which endpoints: when the configuration declares endpoints (`Endpoint`, `ClientGroup`), each
//! declared endpoint the rule selects, with every rule selecting that endpoint; the selector
//! is dead only if it is dead for all of them. When the rule selects no declared endpoint (a
//! policy file checked alone), the endpoints are unknown, and this is an approximation: the
//! rules that count are those certain to select every endpoint this rule selects — the same
//! `endpointSelector`, or a weaker one (a subset of its requirements, such as `{}`). A rule
//! that selects only some of them is not considered.
//!
//! Every doubt counts as "alive": a warning is given only when the selector is certainly dead
//! for those endpoints. (Another endpoint's lookups could still teach fqdnd the IPs, which are
//! global; the warning is about these endpoints, whose own lookups never will.)

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use fqdnd_ipcache::Endpoint;
use fqdnd_ipcache::policy::{
    DnsRule, EgressRule, Entity, LabelSelector, Operator, PeerSelector, PortProtocol, Protocol,
    Requirement, Rule,
};
use fqdnd_namemgr::FqdnSelector;
use ipnet::IpNet;

/// The DNS port: what the proxy serves, whatever port it listens on.
const DNS_PORT: u16 = 53;

/// Something valid that cannot work as written, or that may not mean what it seems to.
/// Displays as `file:line:column: warning: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Warning {
    /// A file with no documents: empty, only comments (`# disabled`), or only `---`
    /// separators. It is skipped: a configuration directory may hold a disabled file.
    EmptyFile {
        /// The file.
        file: PathBuf,
    },
    /// A CiliumNetworkPolicy without `metadata.namespace`: as under `kubectl apply` without
    /// `-n`, it is in the `default` namespace and applies there only (its `endpointSelector`,
    /// and its `fromEndpoints`/`toEndpoints` that name no namespace) — to the endpoints
    /// without `spec.namespace` and those of namespace `default`.
    ImplicitNamespace {
        /// The file.
        file: PathBuf,
        /// 1-based line of `metadata.name`.
        line: u64,
        /// 1-based column of `metadata.name`.
        column: u64,
        /// The policy's name.
        name: String,
    },
    /// A `toFQDNs` selector that can never learn an address from the lookups of the endpoints
    /// its rule selects.
    DeadFqdnSelector {
        /// The file.
        file: PathBuf,
        /// 1-based line of the `toFQDNs` entry.
        line: u64,
        /// 1-based column of the `toFQDNs` entry.
        column: u64,
        /// The `matchName` or `matchPattern` as written.
        selector: String,
        /// Why it is dead.
        reason: DeadReason,
    },
    /// An allow entry (`egress[]`, `ingress[]`) that one deny entry of the same direction
    /// denies entirely for every endpoint its rule selects: it allows nothing.
    ShadowedAllow {
        /// The file of the allow entry.
        file: PathBuf,
        /// 1-based line of the allow entry.
        line: u64,
        /// 1-based column of the allow entry.
        column: u64,
        /// `egress` or `ingress`.
        section: &'static str,
        /// The file of the deny entry.
        deny_file: PathBuf,
        /// 1-based line of the deny entry.
        deny_line: u64,
        /// 1-based column of the deny entry.
        deny_column: u64,
    },
}

/// Why a `toFQDNs` selector is dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadReason {
    /// The endpoints may not send DNS through the proxy at all: no egress entry of a rule
    /// selecting them allows port 53 to a DNS server, and they are under default deny.
    NoDns,
    /// They may, but no DNS rule of theirs matches a name the selector matches.
    NoMatchingDnsRule,
}

impl Warning {
    /// The file the warning concerns.
    #[must_use]
    pub fn file(&self) -> &Path {
        match self {
            Self::EmptyFile { file }
            | Self::ImplicitNamespace { file, .. }
            | Self::DeadFqdnSelector { file, .. }
            | Self::ShadowedAllow { file, .. } => file,
        }
    }

    /// The 1-based `(line, column)` the warning points at.
    #[must_use]
    pub fn position(&self) -> (u64, u64) {
        match self {
            Self::EmptyFile { .. } => (1, 1),
            Self::ImplicitNamespace { line, column, .. }
            | Self::DeadFqdnSelector { line, column, .. }
            | Self::ShadowedAllow { line, column, .. } => (*line, *column),
        }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyFile { file } => write!(
                f,
                "{}:1:1: warning: no policy or configuration documents (the file is empty or \
                 holds only comments): skipped",
                file.display()
            ),
            Self::ImplicitNamespace {
                file,
                line,
                column,
                name,
            } => write!(
                f,
                "{}:{line}:{column}: warning: CiliumNetworkPolicy {name:?} has no \
                 `metadata.namespace`: like `kubectl apply` without `-n`, fqdnd puts it in the \
                 `default` namespace, where it selects only endpoints of that namespace (and \
                 those without `spec.namespace`, which are in `default`), peers included; write \
                 `metadata.namespace`, or make it a CiliumClusterwideNetworkPolicy to select \
                 endpoints of every namespace",
                file.display()
            ),
            Self::DeadFqdnSelector {
                file,
                line,
                column,
                selector,
                reason,
            } => {
                write!(f, "{}:{line}:{column}: warning: ", file.display())?;
                match reason {
                    DeadReason::NoDns => write!(
                        f,
                        "the endpoints this rule selects may not send DNS through fqdnd (no \
                         egress entry allows port 53), so no name matching `{selector}` is ever \
                         looked up: its IPs are never learned"
                    ),
                    DeadReason::NoMatchingDnsRule => write!(
                        f,
                        "no DNS rule of the endpoints this rule selects lets a name matching \
                         `{selector}` through: its IPs are never learned (fqdnd learns an \
                         answer's IPs under the asked name only, so a name this selector \
                         matches only as a CNAME target does not count)"
                    ),
                }
            }
            Self::ShadowedAllow {
                file,
                line,
                column,
                section,
                deny_file,
                deny_line,
                deny_column,
            } => write!(
                f,
                "{}:{line}:{column}: warning: this `{section}` entry allows nothing: the \
                 `{section}Deny` entry at {}:{deny_line}:{deny_column} denies every peer and \
                 port it allows, for every endpoint both select, and a deny wins over any \
                 allow (as in Cilium); `fqdnd policy explain` shows it per flow",
                file.display(),
                deny_file.display()
            ),
        }
    }
}

/// A `toFQDNs` entry, as the policy conversion records it.
#[derive(Debug, Clone)]
pub(crate) struct FqdnAt {
    pub(crate) selector: FqdnSelector,
    /// The `matchName` / `matchPattern` as written (sanitised).
    pub(crate) written: String,
    /// Its `(line, column)` in its file.
    pub(crate) at: (u64, u64),
}

/// Where a rule's pieces are written: its `toFQDNs` entries, and the `(line, column)` of each
/// section entry, parallel to the rule's lists.
#[derive(Debug, Clone, Default)]
pub(crate) struct RuleAt {
    pub(crate) fqdns: Vec<FqdnAt>,
    pub(crate) egress: Vec<(u64, u64)>,
    pub(crate) ingress: Vec<(u64, u64)>,
    pub(crate) egress_deny: Vec<(u64, u64)>,
    pub(crate) ingress_deny: Vec<(u64, u64)>,
}

/// A `toFQDNs` entry of a loaded rule.
#[derive(Debug, Clone)]
pub(crate) struct FqdnUse {
    /// Index of its rule in `Config::rules`.
    pub(crate) rule: usize,
    pub(crate) file: PathBuf,
    pub(crate) at: FqdnAt,
}

/// The names some endpoints may ask through the proxy.
#[derive(Debug, Clone)]
enum Asked {
    /// Every name.
    Any,
    /// Names matching one of these (none: no DNS at all).
    Matching(Vec<FqdnSelector>),
}

impl Asked {
    /// What the endpoints selected by every rule of `rules` — and by no other — may ask.
    fn of<'a>(rules: impl IntoIterator<Item = &'a Rule>) -> Self {
        let mut enforcing = false;
        let mut names = Vec::new();
        for rule in rules {
            enforcing |= rule.default_deny_egress;
            for egress in &rule.egress {
                let reaches_dns = egress.peers.is_empty()
                    || egress
                        .peers
                        .iter()
                        .any(|p| !matches!(p, PeerSelector::Fqdn(_)));
                if !reaches_dns {
                    continue;
                }
                if egress.ports.is_empty() {
                    return Self::Any;
                }
                for port_rule in &egress.ports {
                    let covers_dns = port_rule.ports.iter().any(|p| {
                        p.port == 0 || (p.port..=p.end_port.max(p.port)).contains(&DNS_PORT)
                    });
                    if !covers_dns {
                        continue;
                    }
                    let Some(dns) = &port_rule.dns else {
                        return Self::Any;
                    };
                    for rule in dns {
                        let (DnsRule::MatchName(key) | DnsRule::MatchPattern(key)) = rule;
                        match FqdnSelector::match_pattern(key) {
                            Ok(selector) => names.push(selector),
                            // Validated when loaded; if not, assume the worst: anything.
                            Err(_) => return Self::Any,
                        }
                    }
                }
            }
        }
        if enforcing {
            Self::Matching(names)
        } else {
            Self::Any
        }
    }

    /// Why `selector` is dead for these endpoints, or `None` if some name it matches may be
    /// asked.
    fn dead(&self, selector: &FqdnSelector) -> Option<DeadReason> {
        match self {
            Self::Any => None,
            Self::Matching(names) if names.is_empty() => Some(DeadReason::NoDns),
            Self::Matching(names) => (!names.iter().any(|n| n.overlaps(selector)))
                .then_some(DeadReason::NoMatchingDnsRule),
        }
    }
}

/// Every `toFQDNs` selector of `uses` that is dead (see the module documentation).
pub(crate) fn dead_fqdn_selectors(
    rules: &[Rule],
    endpoints: &[Endpoint],
    uses: &[FqdnUse],
) -> Vec<Warning> {
    // Endpoints selected by the same rules may ask the same names: one `Asked` per set.
    let mut asked_by_rules: HashMap<Vec<usize>, Asked> = HashMap::new();
    let selecting: Vec<Vec<usize>> = endpoints
        .iter()
        .map(|e| {
            (0..rules.len())
                .filter(|&i| rules[i].endpoint_selector.matches(e.labels.iter()))
                .collect()
        })
        .collect();
    let mut warnings = Vec::new();
    for use_ in uses {
        let Some(rule) = rules.get(use_.rule) else {
            continue;
        };
        let mut audiences: Vec<Vec<usize>> = selecting
            .iter()
            .filter(|rules| rules.contains(&use_.rule))
            .cloned()
            .collect();
        if audiences.is_empty() {
            audiences.push(
                (0..rules.len())
                    .filter(|&i| selects_all_of(&rules[i], rule))
                    .collect(),
            );
        }
        audiences.sort();
        audiences.dedup();
        let mut reason = Some(DeadReason::NoDns);
        for audience in audiences {
            let asked = asked_by_rules
                .entry(audience)
                .or_insert_with_key(|audience| Asked::of(audience.iter().map(|&i| &rules[i])));
            match asked.dead(&use_.at.selector) {
                None => {
                    reason = None;
                    break;
                }
                Some(DeadReason::NoDns) => {}
                Some(r) => reason = Some(r),
            }
        }
        if let Some(reason) = reason {
            let (line, column) = use_.at.at;
            warnings.push(Warning::DeadFqdnSelector {
                file: use_.file.clone(),
                line,
                column,
                selector: use_.at.written.clone(),
                reason,
            });
        }
    }
    warnings
}

/// Whether `other` certainly selects every endpoint `rule` selects: each of its requirements
/// follows from one of `rule`'s.
fn selects_all_of(other: &Rule, rule: &Rule) -> bool {
    selector_covers(&other.endpoint_selector, &rule.endpoint_selector)
}

/// Whether every endpoint `narrow` selects is certainly selected by `wide`.
fn selector_covers(wide: &LabelSelector, narrow: &LabelSelector) -> bool {
    wide.requirements
        .iter()
        .all(|theirs| narrow.requirements.iter().any(|r| implies(r, theirs)))
}

/// Every allow entry that one deny entry shadows entirely (see the module documentation).
pub(crate) fn shadowed_allows(
    rules: &[Rule],
    endpoints: &[Endpoint],
    rules_at: &[(PathBuf, RuleAt)],
) -> Vec<Warning> {
    let mut warnings = Vec::new();
    // Whether `deny_rule` applies wherever `allow_rule` does: to each declared endpoint the
    // allow's rule selects, or (none declared) certainly to every endpoint it selects.
    let applies = |deny_rule: &Rule, allow_rule: &Rule| {
        let declared: Vec<&Endpoint> = endpoints
            .iter()
            .filter(|e| allow_rule.endpoint_selector.matches(e.labels.iter()))
            .collect();
        if declared.is_empty() {
            selects_all_of(deny_rule, allow_rule)
        } else {
            declared
                .iter()
                .all(|e| deny_rule.endpoint_selector.matches(e.labels.iter()))
        }
    };
    for (rule, (file, at)) in rules.iter().zip(rules_at) {
        let directions = [
            ("egress", &rule.egress, &at.egress),
            ("ingress", &rule.ingress, &at.ingress),
        ];
        for (section, allows, allows_at) in directions {
            for (allow, &(line, column)) in allows.iter().zip(allows_at) {
                let shadow = rules
                    .iter()
                    .zip(rules_at)
                    .find_map(|(other, (deny_file, at))| {
                        let (denies, denies_at) = if section == "egress" {
                            (&other.egress_deny, &at.egress_deny)
                        } else {
                            (&other.ingress_deny, &at.ingress_deny)
                        };
                        if denies.is_empty() || !applies(other, rule) {
                            return None;
                        }
                        denies
                            .iter()
                            .zip(denies_at)
                            .find(|(deny, _)| section_covers(deny, allow))
                            .map(|(_, &deny_at)| (deny_file.clone(), deny_at))
                    });
                if let Some((deny_file, (deny_line, deny_column))) = shadow {
                    warnings.push(Warning::ShadowedAllow {
                        file: file.clone(),
                        line,
                        column,
                        section,
                        deny_file,
                        deny_line,
                        deny_column,
                    });
                }
            }
        }
    }
    warnings
}

/// Whether every (peer, port) `allow` allows, `deny` denies.
fn section_covers(deny: &EgressRule, allow: &EgressRule) -> bool {
    let every_peer =
        |r: &EgressRule| r.peers.is_empty() || r.peers.contains(&PeerSelector::Entity(Entity::All));
    let peers = every_peer(deny)
        || (!allow.peers.is_empty()
            && allow
                .peers
                .iter()
                .all(|a| deny.peers.iter().any(|d| peer_covers(d, a))));
    let deny_ports: Vec<&PortProtocol> = deny.ports.iter().flat_map(|p| &p.ports).collect();
    let every_port = |ports: &[&PortProtocol]| {
        ports.is_empty()
            || ports
                .iter()
                .any(|p| p.protocol == Protocol::Any && p.port == 0)
    };
    let ports = every_port(&deny_ports)
        || (!allow.ports.is_empty()
            && allow
                .ports
                .iter()
                .flat_map(|p| &p.ports)
                .all(|a| deny_ports.iter().any(|d| port_covers(d, a))));
    peers && ports
}

/// Whether peer selector `d` selects everything `a` selects (sound, not complete).
fn peer_covers(d: &PeerSelector, a: &PeerSelector) -> bool {
    use PeerSelector::{Cidr, Endpoints, Fqdn};
    let v4 = |net: &IpNet| matches!(net, IpNet::V4(_));
    match (d, a) {
        _ if d == a => true,
        (PeerSelector::Entity(Entity::All), _) => true,
        (PeerSelector::Entity(Entity::World), Cidr { .. } | Fqdn(_)) => true,
        (
            PeerSelector::Entity(Entity::World),
            PeerSelector::Entity(Entity::WorldIpv4 | Entity::WorldIpv6),
        ) => true,
        (PeerSelector::Entity(Entity::WorldIpv4), Cidr { cidr, .. }) => v4(cidr),
        (PeerSelector::Entity(Entity::WorldIpv6), Cidr { cidr, .. }) => !v4(cidr),
        (
            PeerSelector::Entity(Entity::Cluster),
            Endpoints(_) | PeerSelector::Entity(Entity::Host | Entity::RemoteNode),
        ) => true,
        (Endpoints(wide), Endpoints(narrow)) => selector_covers(wide, narrow),
        (
            Cidr { cidr, except },
            Cidr {
                cidr: inner,
                except: carved,
            },
        ) => {
            cidr.contains(inner)
                && except.iter().all(|e| {
                    !(e.contains(inner) || inner.contains(e))
                        || carved.iter().any(|c| c.contains(e))
                })
        }
        _ => false,
    }
}

/// Whether port `d` holds every packet port `a` does.
fn port_covers(d: &PortProtocol, a: &PortProtocol) -> bool {
    if d.protocol == Protocol::Any && d.port == 0 {
        return true;
    }
    let protocol = d.protocol == a.protocol
        || (d.protocol == Protocol::Any && matches!(a.protocol, Protocol::Tcp | Protocol::Udp));
    if !protocol {
        return false;
    }
    if a.protocol.is_icmp() {
        return d.port == a.port;
    }
    let range = |p: &PortProtocol| {
        if p.port == 0 {
            (0, u16::MAX)
        } else {
            (p.port, p.end_port.max(p.port))
        }
    };
    let ((dl, dh), (al, ah)) = (range(d), range(a));
    dl <= al && ah <= dh
}

/// Whether requirement `a` holding means `b` holds (same key; sound, not complete).
fn implies(a: &Requirement, b: &Requirement) -> bool {
    let subset = |x: &[String], y: &[String]| x.iter().all(|v| y.contains(v));
    a.key == b.key
        && match (&a.operator, &b.operator) {
            (Operator::In(x), Operator::In(y)) => subset(x, y),
            (Operator::NotIn(x), Operator::NotIn(y)) => subset(y, x),
            (Operator::In(_) | Operator::Exists, Operator::Exists)
            | (Operator::DoesNotExist, Operator::DoesNotExist | Operator::NotIn(_)) => true,
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(key: &str, operator: Operator) -> Requirement {
        Requirement {
            key: key.into(),
            operator,
        }
    }

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    #[test]
    fn implication_between_requirements() {
        let r#in = |v: &[&str]| req("app", Operator::In(strings(v)));
        let not_in = |v: &[&str]| req("app", Operator::NotIn(strings(v)));
        assert!(implies(&r#in(&["a"]), &r#in(&["a", "b"])));
        assert!(!implies(&r#in(&["a", "b"]), &r#in(&["a"])));
        assert!(implies(&r#in(&["b", "a"]), &r#in(&["a", "b"])));
        assert!(implies(&not_in(&["a", "b"]), &not_in(&["a"])));
        assert!(!implies(&not_in(&["a"]), &not_in(&["a", "b"])));
        assert!(implies(&r#in(&["a"]), &req("app", Operator::Exists)));
        assert!(implies(
            &req("app", Operator::DoesNotExist),
            &not_in(&["a"])
        ));
        assert!(!implies(&r#in(&["a"]), &req("k8s:app", Operator::Exists)));
        assert!(!implies(&req("app", Operator::Exists), &r#in(&["a"])));
    }
}
