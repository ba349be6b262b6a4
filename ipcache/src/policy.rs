//! The policy model ipcache resolves: rules that select endpoints by label and allow egress to
//! peers (FQDN selectors, CIDRs, other endpoints) on ports.
//!
//! These are plain values. `fqdnd-config` builds them from CiliumNetworkPolicy YAML and has
//! already validated them; ipcache trusts their shape but never panics on their content.

use ipnet::IpNet;

use crate::endpoint::EndpointLabel;

/// One rule: the endpoints it applies to and what they may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Where the rule came from, for logs and listings (`file:line` or a policy name).
    pub origin: String,
    /// The endpoints the rule applies to.
    pub endpoint_selector: LabelSelector,
    /// What the selected endpoints may reach. Every rule is an egress rule: selecting an
    /// endpoint puts it under egress policy (default deny) unless `default_deny_egress` is
    /// false, even when this list is empty (CiliumNetworkPolicy `egress: [{}]`).
    pub egress: Vec<EgressRule>,
    /// Whether selecting an endpoint puts it into egress default deny
    /// (CiliumNetworkPolicy `enableDefaultDeny.egress`, true unless set to false).
    pub default_deny_egress: bool,
}

/// One egress section: peers × ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRule {
    /// The destinations. Empty means every destination (an L4-only rule).
    pub peers: Vec<PeerSelector>,
    /// The ports. Empty means every port and protocol.
    pub ports: Vec<PortRule>,
}

/// A destination selector.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeerSelector {
    /// `toFQDNs`: the identities carrying the label `fqdn:<key>`. The key is the canonical
    /// selector text (lowercase; a trailing dot unless the pattern is a lone wildcard).
    Fqdn(String),
    /// `toCIDR` / `toCIDRSet`: identities whose CIDR label lies inside `cidr` and inside none of
    /// `except`. A zero-length prefix also selects the world identities.
    Cidr {
        /// The allowed block (host bits cleared).
        cidr: IpNet,
        /// Blocks carved out of it (host bits cleared, each inside `cidr`).
        except: Vec<IpNet>,
    },
    /// `toEndpoints`: endpoint identities whose labels satisfy the selector.
    Endpoints(LabelSelector),
}

/// `toPorts[]`: ports and, optionally, DNS rules for the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRule {
    /// The ports. Never empty (a `toPorts` entry without ports is rejected by the loader).
    pub ports: Vec<PortProtocol>,
    /// `rules.dns[]`: the names the endpoint may query through these peers and ports.
    /// `None` when the entry has no DNS rules (no DNS interception asked for).
    pub dns: Option<Vec<DnsRule>>,
}

/// A port range and protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortProtocol {
    /// First port; 0 means every port.
    pub port: u16,
    /// Last port (inclusive); equal to `port` for a single port.
    pub end_port: u16,
    /// The L4 protocol.
    pub protocol: Protocol,
}

/// L4 protocol of a port rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP only.
    Tcp,
    /// UDP only.
    Udp,
    /// TCP and UDP.
    Any,
}

/// One `rules.dns[]` entry, as canonical selector text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DnsRule {
    /// `matchName`, lowercased with a trailing dot.
    MatchName(String),
    /// `matchPattern`, lowercased with a trailing dot unless a lone wildcard.
    MatchPattern(String),
}

/// A Kubernetes-style label selector over endpoint labels.
///
/// A key may carry a source prefix (`k8s:app`); without one, or with `any:`, it matches a
/// label of that key from any source. An empty selector matches every endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelSelector {
    /// Every requirement must hold.
    pub requirements: Vec<Requirement>,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Requirement {
    /// Label key, optionally `source:key`.
    pub key: String,
    /// How the key's value is tested.
    pub operator: Operator,
}

/// The operator of a requirement (`matchLabels` entries become `In` with one value).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operator {
    /// The label exists and its value is one of these.
    In(Vec<String>),
    /// The label is absent, or its value is none of these.
    NotIn(Vec<String>),
    /// The label exists.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl LabelSelector {
    /// Whether endpoint labels satisfy every requirement.
    pub fn matches<'a>(&self, labels: impl Iterator<Item = &'a EndpointLabel> + Clone) -> bool {
        self.requirements.iter().all(|r| r.matches(labels.clone()))
    }
}

impl Requirement {
    /// Whether endpoint labels satisfy this requirement.
    pub fn matches<'a>(&self, labels: impl Iterator<Item = &'a EndpointLabel> + Clone) -> bool {
        let (source, key) = match self.key.split_once(':') {
            Some((source, key)) if source != "any" => (Some(source), key),
            Some((_, key)) => (None, key),
            None => (None, self.key.as_str()),
        };
        let mut values = labels
            .filter(|l| l.key == key && source.is_none_or(|s| s == l.source))
            .map(|l| l.value.as_str());
        match &self.operator {
            Operator::In(set) => values.any(|v| set.iter().any(|s| s == v)),
            Operator::NotIn(set) => !values.any(|v| set.iter().any(|s| s == v)),
            Operator::Exists => values.next().is_some(),
            Operator::DoesNotExist => values.next().is_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(source: &str, key: &str, value: &str) -> EndpointLabel {
        EndpointLabel {
            source: source.into(),
            key: key.into(),
            value: value.into(),
        }
    }

    fn req(key: &str, operator: Operator) -> Requirement {
        Requirement {
            key: key.into(),
            operator,
        }
    }

    #[test]
    fn requirements_follow_kubernetes_semantics() {
        let labels = [label("k8s", "app", "web"), label("k8s", "tier", "front")];
        let l = || labels.iter();
        assert!(req("app", Operator::In(vec!["web".into()])).matches(l()));
        assert!(req("k8s:app", Operator::In(vec!["web".into()])).matches(l()));
        assert!(req("any:app", Operator::In(vec!["web".into()])).matches(l()));
        assert!(!req("other:app", Operator::In(vec!["web".into()])).matches(l()));
        assert!(!req("app", Operator::NotIn(vec!["web".into()])).matches(l()));
        assert!(req("missing", Operator::NotIn(vec!["x".into()])).matches(l()));
        assert!(req("tier", Operator::Exists).matches(l()));
        assert!(req("missing", Operator::DoesNotExist).matches(l()));
        assert!(!req("tier", Operator::DoesNotExist).matches(l()));
        assert!(LabelSelector::default().matches(l()));
    }
}
