//! The policy model ipcache resolves: rules that select endpoints by label and allow egress to
//! peers (FQDN selectors, CIDRs, other endpoints) on ports.
//!
//! These are plain values. `fqdnd-config` builds them from CiliumNetworkPolicy YAML and has
//! already validated them; ipcache trusts their shape but never panics on their content.

use ipnet::IpNet;

use crate::endpoint::EndpointLabel;

/// One rule: the endpoints it applies to, what they may reach and what may reach them.
///
/// `Default` is a rule that selects every endpoint and does nothing: build rules with
/// `..Rule::default()` so that new sections do not break every constructor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    /// (CiliumNetworkPolicy: true when the rule has `egress` or `egressDeny` and
    /// `enableDefaultDeny.egress` is not false).
    pub default_deny_egress: bool,
    /// `ingress[]`: what may reach the selected endpoints (peers are sources).
    pub ingress: Vec<EgressRule>,
    /// `egressDeny[]`: destinations denied whatever the allows say.
    pub egress_deny: Vec<EgressRule>,
    /// `ingressDeny[]`: sources denied whatever the allows say.
    pub ingress_deny: Vec<EgressRule>,
    /// Whether selecting an endpoint puts it into ingress default deny (true when the rule
    /// has `ingress` or `ingressDeny` and `enableDefaultDeny.ingress` is not false).
    pub default_deny_ingress: bool,
}

impl Rule {
    /// The sections of one direction: allows, denies, default deny.
    pub fn direction(&self, dir: Direction) -> (&[EgressRule], &[EgressRule], bool) {
        match dir {
            Direction::Egress => (&self.egress, &self.egress_deny, self.default_deny_egress),
            Direction::Ingress => (&self.ingress, &self.ingress_deny, self.default_deny_ingress),
        }
    }

    /// Every peer selector of every section, in both directions.
    pub fn peers(&self) -> impl Iterator<Item = &PeerSelector> + '_ {
        self.egress
            .iter()
            .chain(&self.ingress)
            .chain(&self.egress_deny)
            .chain(&self.ingress_deny)
            .flat_map(|r| &r.peers)
    }
}

/// The direction of traffic relative to the selected endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// Traffic the endpoint sends: peers are destinations.
    #[default]
    Egress,
    /// Traffic towards the endpoint: peers are sources.
    Ingress,
}

impl Direction {
    /// Both directions.
    pub const BOTH: [Direction; 2] = [Direction::Egress, Direction::Ingress];

    /// `egress` or `ingress`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Egress => "egress",
            Self::Ingress => "ingress",
        }
    }
}

/// One section (`egress[]`, `ingress[]`, `egressDeny[]`, `ingressDeny[]`): peers × ports.
/// For ingress the peers are sources.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressRule {
    /// The peers. Empty means every peer (an L4-only rule).
    pub peers: Vec<PeerSelector>,
    /// The ports (and `icmps`, as ICMP ports). Empty means every port and protocol.
    pub ports: Vec<PortRule>,
}

/// Cilium's entities that mean something outside Kubernetes (`toEntities`, `fromEntities`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Entity {
    /// Everything outside the node's endpoints: unknown addresses, CIDR and FQDN identities.
    World,
    /// The IPv4 part of `world`.
    WorldIpv4,
    /// The IPv6 part of `world`.
    WorldIpv6,
    /// Every peer.
    All,
    /// The local host (reserved identity 1).
    Host,
    /// Every endpoint identity, the host and remote nodes.
    Cluster,
    /// Other nodes of the cluster (reserved identity 6).
    RemoteNode,
}

impl Entity {
    /// Cilium's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::World => "world",
            Self::WorldIpv4 => "world-ipv4",
            Self::WorldIpv6 => "world-ipv6",
            Self::All => "all",
            Self::Host => "host",
            Self::Cluster => "cluster",
            Self::RemoteNode => "remote-node",
        }
    }
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
    /// `toEntities` / `fromEntities`.
    Entity(Entity),
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

/// A port range and protocol. For [`Protocol::Icmp`] and [`Protocol::Icmpv6`] the "port" is
/// the ICMP type, always exact (`port == end_port`; type 0 is echo reply, not "every type").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortProtocol {
    /// First port; 0 means every port (TCP, UDP).
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
    /// TCP and UDP; with port 0, every protocol (ICMP included).
    Any,
    /// ICMP (IPv4): the port is the ICMP type (`icmps`).
    Icmp,
    /// ICMPv6: the port is the ICMPv6 type (`icmps` with `family: IPv6`).
    Icmpv6,
}

impl Protocol {
    /// Whether the port is an ICMP type.
    pub fn is_icmp(self) -> bool {
        matches!(self, Self::Icmp | Self::Icmpv6)
    }

    /// The name used in listings.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Any => "ANY",
            Self::Icmp => "ICMP",
            Self::Icmpv6 => "ICMPv6",
        }
    }
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
