//! What loading warns about: configurations that are valid but cannot work as written. Warnings
//! never make loading fail; `fqdnd policy check` prints them.
//!
//! Today there is one: a `toFQDNs` selector that can never learn an address. fqdnd learns the
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
use fqdnd_ipcache::policy::{DnsRule, Operator, PeerSelector, Requirement, Rule};
use fqdnd_namemgr::FqdnSelector;

/// The DNS port: what the proxy serves, whatever port it listens on.
const DNS_PORT: u16 = 53;

/// Something valid that cannot work as written. Displays as
/// `file:line:column: warning: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Warning {
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
            Self::DeadFqdnSelector { file, .. } => file,
        }
    }

    /// The 1-based `(line, column)` the warning points at.
    #[must_use]
    pub fn position(&self) -> (u64, u64) {
        match self {
            Self::DeadFqdnSelector { line, column, .. } => (*line, *column),
        }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
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
    let ours = &rule.endpoint_selector.requirements;
    other
        .endpoint_selector
        .requirements
        .iter()
        .all(|theirs| ours.iter().any(|r| implies(r, theirs)))
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
