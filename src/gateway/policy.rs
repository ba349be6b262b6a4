//! The gateway's [`QueryPolicy`]: which client group a query comes from, and whether that
//! group's CiliumNetworkPolicy DNS rules and the allow/deny lists let it ask this name.
//!
//! - A client in no group is refused: the gateway is never an open resolver.
//! - A name on a deny list is denied unless an allow list names it too; allow lists never
//!   grant what policy denies.
//! - A group no rule selects (not under egress policy) may ask any name.
//! - Otherwise some egress entry of a rule selecting the group must reach the gateway's
//!   address (no peers, a CIDR containing it, or an endpoint owning it) on port 53 (the DNS
//!   service, whatever port the gateway listens on) with the query's protocol, and either
//!   carry no DNS rules or a `matchName`/`matchPattern` matching the name.
//!
//! Everything is compiled once per (re)load; a query costs a prefix lookup and a few trie
//! walks under a read lock.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};

use anyhow::Result;
use fqdnd_config::{Config, Lists};
use fqdnd_dnsproxy::{QueryInfo, QueryPolicy, Transport, Verdict};
use fqdnd_ipcache::policy::{DnsRule, PeerSelector, PortProtocol, Protocol};
use fqdnd_ipcache::{Endpoint, EndpointId};
use fqdnd_namemgr::{FqdnSelector, Matcher, SelectorId};
use ipnet::IpNet;
use prefix_trie::joint::map::JointPrefixMap;

use super::lists::NameList;
use crate::node::services::{SharedLb, backend_for};

/// The port rules must allow for DNS: the gateway is the DNS service, whatever port it
/// listens on.
const DNS_PORT: u16 = 53;

/// Which servers an egress entry reaches.
#[derive(Debug, Clone)]
enum Servers {
    Any,
    Prefixes(Vec<(IpNet, Vec<IpNet>)>),
}

impl Servers {
    fn contains(&self, addr: IpAddr) -> bool {
        match self {
            Self::Any => true,
            Self::Prefixes(nets) => nets.iter().any(|(net, except)| {
                net.contains(&addr) && !except.iter().any(|e| e.contains(&addr))
            }),
        }
    }
}

/// One way a group may reach DNS.
#[derive(Debug)]
struct Grant {
    servers: Servers,
    /// Empty: every port and protocol.
    ports: Vec<PortProtocol>,
    /// `None`: any name.
    names: Option<Matcher>,
}

impl Grant {
    fn allows(&self, server: SocketAddr, transport: Transport, name: &str) -> bool {
        let port_ok = self.ports.is_empty()
            || self.ports.iter().any(|p| {
                let proto_ok = matches!(
                    (p.protocol, transport),
                    (Protocol::Any, _)
                        | (Protocol::Tcp, Transport::Tcp)
                        | (Protocol::Udp, Transport::Udp)
                );
                proto_ok && (p.port == 0 || (p.port..=p.end_port.max(p.port)).contains(&DNS_PORT))
            });
        port_ok
            && self.servers.contains(server.ip())
            && self.names.as_ref().is_none_or(|m| m.is_match(name))
    }
}

#[derive(Debug, Default)]
struct Group {
    enforcing: bool,
    grants: Vec<Grant>,
}

/// The compiled gateway policy.
#[derive(Debug, Default)]
pub(crate) struct CompiledPolicy {
    clients: JointPrefixMap<IpNet, EndpointId>,
    groups: HashMap<EndpointId, Group>,
    deny: NameList,
    allow: NameList,
}

fn dns_matcher(rules: &[DnsRule]) -> Matcher {
    let mut matcher = Matcher::new();
    for rule in rules {
        let (DnsRule::MatchName(key) | DnsRule::MatchPattern(key)) = rule;
        // Keys were validated by the loader; an invalid one simply matches nothing.
        if let Ok(selector) = FqdnSelector::match_pattern(key) {
            matcher.insert(&selector, SelectorId(0));
        }
    }
    matcher
}

impl CompiledPolicy {
    /// Compiles the policy of a loaded configuration and its lists.
    pub(crate) fn compile(config: &Config, lists: &Lists) -> Result<Self> {
        let mut policy = Self::default();
        for ep in &config.endpoints {
            for addr in &ep.addresses {
                policy.clients.insert(addr.trunc(), ep.id);
            }
            policy.groups.insert(ep.id, Self::group(config, ep));
        }
        for path in &lists.deny {
            for skipped in policy.deny.add_file(path)? {
                tracing::warn!(list = %path.display(), line = skipped.line, reason = skipped.reason, "deny-list line skipped");
            }
        }
        for path in &lists.allow {
            for skipped in policy.allow.add_file(path)? {
                tracing::warn!(list = %path.display(), line = skipped.line, reason = skipped.reason, "allow-list line skipped");
            }
        }
        for skipped in policy.deny.add_text(&lists.deny_names.join("\n")) {
            tracing::warn!(
                entry = skipped.line,
                reason = skipped.reason,
                "inline deny entry skipped"
            );
        }
        for skipped in policy.allow.add_text(&lists.allow_names.join("\n")) {
            tracing::warn!(
                entry = skipped.line,
                reason = skipped.reason,
                "inline allow entry skipped"
            );
        }
        Ok(policy)
    }

    fn group(config: &Config, ep: &Endpoint) -> Group {
        let mut group = Group::default();
        for rule in config
            .rules
            .iter()
            .filter(|r| r.endpoint_selector.matches(ep.labels.iter()))
        {
            group.enforcing |= rule.default_deny_egress;
            for egress in &rule.egress {
                let servers = Self::servers(config, &egress.peers);
                let Some(servers) = servers else { continue };
                if egress.ports.is_empty() {
                    group.grants.push(Grant {
                        servers,
                        ports: Vec::new(),
                        names: None,
                    });
                    continue;
                }
                for port_rule in &egress.ports {
                    group.grants.push(Grant {
                        servers: servers.clone(),
                        ports: port_rule.ports.clone(),
                        names: port_rule.dns.as_deref().map(dns_matcher),
                    });
                }
            }
        }
        group
    }

    /// The servers an egress entry's peers reach; `None` when they can reach no DNS server
    /// (only FQDN peers).
    fn servers(config: &Config, peers: &[PeerSelector]) -> Option<Servers> {
        if peers.is_empty() {
            return Some(Servers::Any);
        }
        let mut nets = Vec::new();
        for peer in peers {
            match peer {
                PeerSelector::Cidr { cidr, except } => nets.push((*cidr, except.clone())),
                PeerSelector::Endpoints(selector) => {
                    for ep in config
                        .endpoints
                        .iter()
                        .filter(|e| selector.matches(e.labels.iter()))
                    {
                        nets.extend(ep.addresses.iter().map(|a| (*a, Vec::new())));
                    }
                }
                PeerSelector::Fqdn(_) => {}
            }
        }
        (!nets.is_empty()).then_some(Servers::Prefixes(nets))
    }

    fn verdict(&self, query: &QueryInfo<'_>) -> Verdict {
        let Some((_, &endpoint)) = self.clients.get_lpm(&IpNet::from(query.client.ip())) else {
            return Verdict::UnknownClient;
        };
        if self.deny.contains(query.name) && !self.allow.contains(query.name) {
            return Verdict::Deny;
        }
        let Some(group) = self.groups.get(&endpoint) else {
            return Verdict::UnknownClient;
        };
        let allowed = !group.enforcing
            || group
                .grants
                .iter()
                .any(|g| g.allows(query.server, query.transport, query.name));
        if allowed {
            Verdict::Allow {
                tag: u64::from(endpoint.0),
            }
        } else {
            Verdict::Deny
        }
    }

    /// Deny and allow list sizes, for status.
    pub(crate) fn list_sizes(&self) -> (usize, usize) {
        (self.deny.len(), self.allow.len())
    }
}

/// The policy the proxy consults, swapped whole on reload.
#[derive(Debug, Default)]
pub(crate) struct GatewayPolicy {
    current: RwLock<Arc<CompiledPolicy>>,
    /// Node mode: queries to a service VIP go to one of its backends.
    services: Option<SharedLb>,
}

impl GatewayPolicy {
    /// A policy whose queries to a service's VIP are forwarded to its backends.
    pub(crate) fn with_services(services: SharedLb) -> Self {
        Self {
            services: Some(services),
            ..Self::default()
        }
    }

    /// Installs a newly compiled policy.
    pub(crate) fn replace(&self, policy: CompiledPolicy) {
        if let Ok(mut current) = self.current.write() {
            *current = Arc::new(policy);
        }
    }

    /// The policy in force.
    pub(crate) fn current(&self) -> Arc<CompiledPolicy> {
        self.current
            .read()
            .map(|p| Arc::clone(&p))
            .unwrap_or_default()
    }
}

impl QueryPolicy for GatewayPolicy {
    fn check(&self, query: &QueryInfo<'_>) -> Verdict {
        match self.current.read() {
            Ok(policy) => policy.verdict(query),
            Err(_) => Verdict::Deny,
        }
    }

    fn forward_to(
        &self,
        client: SocketAddr,
        server: SocketAddr,
        transport: Transport,
    ) -> Option<SocketAddr> {
        backend_for(self.services.as_ref()?, client, server, transport)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use hickory_proto::rr::RecordType;

    const CONFIG: &str = r#"
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: lan}
spec: {id: 10, addresses: ["10.1.0.0/16"], labels: {zone: lan}}
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: guests}
spec: {id: 11, addresses: ["10.2.0.0/16"], labels: {zone: guests}}
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: lab}
spec: {id: 12, addresses: ["10.3.0.0/16"], labels: {zone: lab}}
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: lan-dns}
spec:
  endpointSelector: {matchLabels: {zone: lan}}
  egress:
  - toCIDR: ["10.0.0.53/32"]
    toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules:
        dns: [{matchPattern: "*.example.com"}, {matchName: "api.github.com"}]
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: guests-dns}
spec:
  endpointSelector: {matchLabels: {zone: guests}}
  egress:
  - toPorts:
    - ports: [{port: "53", protocol: UDP}]
      rules:
        dns: [{matchPattern: "*"}]
"#;

    fn query<'a>(client: &str, server: &str, name: &'a str, transport: Transport) -> QueryInfo<'a> {
        QueryInfo {
            client: format!("{client}:40000").parse().unwrap(),
            server: server.parse().unwrap(),
            name,
            qtype: RecordType::A,
            transport,
        }
    }

    fn compiled(lists: &Lists) -> CompiledPolicy {
        let config = fqdnd_config::load_str(CONFIG, Path::new("gw.yaml")).unwrap();
        CompiledPolicy::compile(&config, lists).unwrap()
    }

    #[test]
    fn groups_rules_and_servers_decide() {
        let p = compiled(&Lists::default());
        let udp = Transport::Udp;
        let lan = |name| p.verdict(&query("10.1.2.3", "10.0.0.53:53", name, udp));
        assert_eq!(lan("www.example.com."), Verdict::Allow { tag: 10 });
        assert_eq!(lan("api.github.com."), Verdict::Allow { tag: 10 });
        assert_eq!(lan("example.com."), Verdict::Deny);
        assert_eq!(lan("evil.test."), Verdict::Deny);
        // The rule reaches 10.0.0.53 only.
        assert_eq!(
            p.verdict(&query("10.1.2.3", "10.0.0.54:53", "www.example.com.", udp)),
            Verdict::Deny
        );
        // Guests: any name, UDP only.
        assert_eq!(
            p.verdict(&query("10.2.0.9", "10.0.0.53:53", "anything.test.", udp)),
            Verdict::Allow { tag: 11 }
        );
        assert_eq!(
            p.verdict(&query(
                "10.2.0.9",
                "10.0.0.53:53",
                "anything.test.",
                Transport::Tcp
            )),
            Verdict::Deny
        );
        // No rule selects the lab: not under policy.
        assert_eq!(
            p.verdict(&query("10.3.0.9", "10.0.0.53:53", "anything.test.", udp)),
            Verdict::Allow { tag: 12 }
        );
        // Not a client: never an open resolver.
        assert_eq!(
            p.verdict(&query("192.0.2.1", "10.0.0.53:53", "www.example.com.", udp)),
            Verdict::UnknownClient
        );
    }

    #[test]
    fn deny_lists_block_and_allow_lists_make_exceptions() {
        let lists = Lists {
            deny_names: vec!["ads.example.com".into(), "||tracker.test^".into()],
            allow_names: vec!["good.ads.example.com".into()],
            ..Lists::default()
        };
        let p = compiled(&lists);
        let guest = |name| p.verdict(&query("10.2.0.9", "10.0.0.53:53", name, Transport::Udp));
        assert_eq!(guest("x.ads.example.com."), Verdict::Deny);
        assert_eq!(guest("pixel.tracker.test."), Verdict::Deny);
        assert_eq!(guest("good.ads.example.com."), Verdict::Allow { tag: 11 });
        // An allow list grants nothing policy denies: lan may ask *.example.com only.
        let lan = |name| p.verdict(&query("10.1.2.3", "10.0.0.53:53", name, Transport::Udp));
        assert_eq!(lan("good.ads.example.com."), Verdict::Deny);
        assert_eq!(lan("www.example.com."), Verdict::Allow { tag: 10 });
        assert_eq!(
            p.verdict(&query(
                "10.1.2.3",
                "10.0.0.53:53",
                "other.test.",
                Transport::Udp
            )),
            Verdict::Deny
        );
    }
}
