//! The per-query DNS verdict: which endpoint or client group a query comes from, and whether
//! its CiliumNetworkPolicy DNS rules and the allow/deny lists let it ask this name.
//!
//! - A client in no endpoint or group is refused: fqdnd is never an open resolver.
//! - A name on a deny list is denied unless an allow list names it too; allow lists never
//!   grant what policy denies.
//! - An endpoint no rule selects (not under egress policy) may ask any name.
//! - Otherwise some egress entry of a rule selecting it must reach the server asked (no
//!   peers, a CIDR containing it, or an endpoint owning it) on port 53 (the DNS service,
//!   whatever port the proxy listens on) with the query's protocol, and either carry no DNS
//!   rules or a `matchName`/`matchPattern` matching the name.
//!
//! Everything is compiled once per (re)load: a query costs a prefix lookup and a few trie
//! walks.

pub mod lists;

use std::net::{IpAddr, SocketAddr};

use fqdnd_config::{Config, Lists};
use fqdnd_ipcache::policy::{DnsRule, Entity, PeerSelector, PortProtocol, Protocol};
use fqdnd_ipcache::{Endpoint, EndpointId};
use fqdnd_namemgr::{FqdnSelector, Matcher, NameLabels, SelectorId};
use ipnet::IpNet;
use prefix_trie::joint::map::JointPrefixMap;

use crate::Error;
use lists::NameList;

const V4_ALL: IpNet = IpNet::V4(ipnet::Ipv4Net::new_assert(
    std::net::Ipv4Addr::UNSPECIFIED,
    0,
));
const V6_ALL: IpNet = IpNet::V6(ipnet::Ipv6Net::new_assert(
    std::net::Ipv6Addr::UNSPECIFIED,
    0,
));

/// The port rules must allow for DNS: the proxy is the DNS service, whatever port it listens
/// on.
const DNS_PORT: u16 = 53;

/// The DNS service a query asked for, as `toPorts` sees it: plain DNS is port 53 over UDP or
/// TCP whatever port the proxy listens on; DNS over TLS is TCP 853, DNS over HTTPS TCP 443
/// (RFC 7858, RFC 8484), so a rule may allow plain DNS and not the encrypted kinds, or the
/// reverse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsService {
    /// DNS over UDP or TCP (port 53).
    Plain(Protocol),
    /// DNS over TLS (TCP port 853).
    Tls,
    /// DNS over HTTPS (TCP port 443).
    Https,
}

impl DnsService {
    /// Every service, for checks that must find any way a client could have asked.
    pub const ALL: [Self; 4] = [
        Self::Plain(Protocol::Udp),
        Self::Plain(Protocol::Tcp),
        Self::Tls,
        Self::Https,
    ];

    /// The protocol and port `toPorts` rules are matched against.
    pub const fn port(self) -> (Protocol, u16) {
        match self {
            Self::Plain(protocol) => (protocol, DNS_PORT),
            Self::Tls => (Protocol::Tcp, 853),
            Self::Https => (Protocol::Tcp, 443),
        }
    }
}

/// What policy says of one query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Answer it; what the answer teaches is learned for `endpoint`.
    Allow {
        /// The endpoint or client group that asked.
        endpoint: EndpointId,
    },
    /// Refuse it (policy or a deny list).
    Deny {
        /// The endpoint or client group that asked (whose rules, or the lists, refused it).
        endpoint: EndpointId,
    },
    /// The client is in no endpoint or client group.
    UnknownClient,
}

/// Which endpoint or client group an address belongs to: the longest prefix containing it.
#[derive(Debug, Default)]
pub struct Clients {
    prefixes: JointPrefixMap<IpNet, EndpointId>,
}

impl Clients {
    /// The addresses of `endpoints`.
    pub fn new<'a>(endpoints: impl IntoIterator<Item = &'a Endpoint>) -> Self {
        let mut prefixes = JointPrefixMap::default();
        for ep in endpoints {
            for addr in &ep.addresses {
                prefixes.insert(addr.trunc(), ep.id);
            }
        }
        Self { prefixes }
    }

    /// The endpoint whose addresses contain `client` (the longest match).
    pub fn lookup(&self, client: IpAddr) -> Option<EndpointId> {
        self.prefixes
            .get_lpm(&IpNet::from(client))
            .map(|(_, id)| *id)
    }
}

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

/// One way an endpoint may reach DNS.
#[derive(Debug)]
struct Grant {
    servers: Servers,
    /// Empty: every port and protocol.
    ports: Vec<PortProtocol>,
    /// `None`: any name.
    names: Option<Matcher>,
}

impl Grant {
    fn allows(
        &self,
        server: SocketAddr,
        service: DnsService,
        name: Option<&NameLabels<'_>>,
    ) -> bool {
        let (protocol, port) = service.port();
        let port_ok = self.ports.is_empty()
            || self.ports.iter().any(|p| {
                let proto_ok = p.protocol == Protocol::Any || p.protocol == protocol;
                proto_ok && (p.port == 0 || (p.port..=p.end_port.max(p.port)).contains(&port))
            });
        port_ok
            && self.servers.contains(server.ip())
            && self
                .names
                .as_ref()
                .is_none_or(|m| name.is_some_and(|name| m.is_match_labels(name)))
    }
}

#[derive(Debug, Default)]
struct Group {
    enforcing: bool,
    grants: Vec<Grant>,
    /// `egressDeny` entries reaching DNS servers: a query they match is denied whatever the
    /// grants say (the datapath redirects DNS before its policy lookup, so the proxy applies
    /// them).
    denies: Vec<Grant>,
}

/// The compiled DNS policy of a configuration.
#[derive(Debug, Default)]
pub struct DnsPolicy {
    clients: Clients,
    /// Looked up on every query: foldhash (hashbrown's default), not std's SipHash.
    groups: hashbrown::HashMap<EndpointId, Group>,
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

impl DnsPolicy {
    /// Compiles the DNS policy of `config`'s endpoints and rules with `lists`. List lines
    /// that are not DNS rules are logged and skipped.
    ///
    /// # Errors
    /// A list file cannot be read.
    pub fn compile(config: &Config, lists: &Lists) -> Result<Self, Error> {
        let mut policy = Self {
            clients: Clients::new(&config.endpoints),
            ..Self::default()
        };
        for ep in &config.endpoints {
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
            for (sections, deny) in [(&rule.egress, false), (&rule.egress_deny, true)] {
                let out = if deny {
                    &mut group.denies
                } else {
                    &mut group.grants
                };
                for egress in sections {
                    let Some(servers) = Self::servers(config, &egress.peers) else {
                        continue;
                    };
                    if egress.ports.is_empty() {
                        out.push(Grant {
                            servers,
                            ports: Vec::new(),
                            names: None,
                        });
                        continue;
                    }
                    for port_rule in &egress.ports {
                        out.push(Grant {
                            servers: servers.clone(),
                            ports: port_rule.ports.clone(),
                            names: port_rule.dns.as_deref().map(dns_matcher),
                        });
                    }
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
                PeerSelector::Entity(Entity::All) => return Some(Servers::Any),
                PeerSelector::Entity(Entity::World | Entity::WorldIpv4 | Entity::WorldIpv6) => {
                    // Addresses outside the endpoints: the whole family minus the endpoints'.
                    let own: Vec<IpNet> = config
                        .endpoints
                        .iter()
                        .flat_map(|e| e.addresses.iter().copied())
                        .collect();
                    let families: &[IpNet] = match peer {
                        PeerSelector::Entity(Entity::WorldIpv4) => &[V4_ALL],
                        PeerSelector::Entity(Entity::WorldIpv6) => &[V6_ALL],
                        _ => &[V4_ALL, V6_ALL],
                    };
                    for family in families {
                        let except = own
                            .iter()
                            .filter(|a| family.contains(*a))
                            .copied()
                            .collect();
                        nets.push((*family, except));
                    }
                }
                PeerSelector::Entity(Entity::Cluster) => {
                    for ep in &config.endpoints {
                        nets.extend(ep.addresses.iter().map(|a| (*a, Vec::new())));
                    }
                }
                // The host and remote nodes are no DNS server fqdnd knows the addresses of.
                PeerSelector::Entity(Entity::Host | Entity::RemoteNode) | PeerSelector::Fqdn(_) => {
                }
            }
        }
        (!nets.is_empty()).then_some(Servers::Prefixes(nets))
    }

    /// May `client` ask `server` for the canonical `name` over `service`?
    pub fn verdict(
        &self,
        client: IpAddr,
        server: SocketAddr,
        service: DnsService,
        name: &str,
    ) -> Verdict {
        let Some(endpoint) = self.clients.lookup(client) else {
            return Verdict::UnknownClient;
        };
        self.endpoint_verdict(endpoint, server, service, name)
    }

    /// May `endpoint` ask `server` for the canonical `name` over `protocol`? For a query whose
    /// endpoint is known without its source address: a host process's, which the cgroup
    /// socket programs name (host processes share the host's addresses). An endpoint the
    /// policy does not know is [`Verdict::UnknownClient`].
    pub fn endpoint_verdict(
        &self,
        endpoint: EndpointId,
        server: SocketAddr,
        service: DnsService,
        name: &str,
    ) -> Verdict {
        // Split once for the lists and every matcher below (`None`: no selector matches it).
        let labels = NameLabels::new(name);
        let labels = labels.as_ref();
        if self.deny.contains_labels(labels) && !self.allow.contains_labels(labels) {
            return Verdict::Deny { endpoint };
        }
        let Some(group) = self.groups.get(&endpoint) else {
            return Verdict::UnknownClient;
        };
        if group
            .denies
            .iter()
            .any(|g| g.allows(server, service, labels))
        {
            return Verdict::Deny { endpoint };
        }
        let allowed = !group.enforcing
            || group
                .grants
                .iter()
                .any(|g| g.allows(server, service, labels));
        if allowed {
            Verdict::Allow { endpoint }
        } else {
            Verdict::Deny { endpoint }
        }
    }

    /// May `endpoint` ask one of `servers` (this gateway's listen addresses) for the canonical
    /// `name`, by any DNS service (UDP, TCP, DoT, DoH)? For an answer learned elsewhere (a peer of an HA gateway group,
    /// docs/ha-gateway.md): it is taken in only if this policy would have let the endpoint ask
    /// this gateway for the name — lists, deny sections and grants alike.
    pub fn endpoint_may_ask(
        &self,
        endpoint: EndpointId,
        servers: &[SocketAddr],
        name: &str,
    ) -> bool {
        servers.iter().any(|server| {
            DnsService::ALL.into_iter().any(|service| {
                matches!(
                    self.endpoint_verdict(endpoint, *server, service, name),
                    Verdict::Allow { .. }
                )
            })
        })
    }

    /// The endpoint or client group `client` belongs to.
    pub fn endpoint_of(&self, client: IpAddr) -> Option<EndpointId> {
        self.clients.lookup(client)
    }

    /// Deny and allow list sizes (patterns compiled), for status.
    pub fn list_sizes(&self) -> (usize, usize) {
        (self.deny.len(), self.allow.len())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

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

    fn compiled(lists: &Lists) -> DnsPolicy {
        let config = fqdnd_config::load_str(CONFIG, Path::new("gw.yaml")).unwrap();
        DnsPolicy::compile(&config, lists).unwrap()
    }

    fn ask(p: &DnsPolicy, client: &str, server: &str, name: &str, service: DnsService) -> Verdict {
        p.verdict(
            client.parse().unwrap(),
            server.parse().unwrap(),
            service,
            name,
        )
    }

    fn allow(id: u16) -> Verdict {
        Verdict::Allow {
            endpoint: EndpointId(id),
        }
    }

    fn deny(id: u16) -> Verdict {
        Verdict::Deny {
            endpoint: EndpointId(id),
        }
    }

    #[test]
    fn groups_rules_and_servers_decide() {
        let p = compiled(&Lists::default());
        let udp = DnsService::Plain(Protocol::Udp);
        let lan = |name| ask(&p, "10.1.2.3", "10.0.0.53:53", name, udp);
        assert_eq!(lan("www.example.com."), allow(10));
        assert_eq!(lan("api.github.com."), allow(10));
        assert_eq!(lan("example.com."), deny(10));
        assert_eq!(lan("evil.test."), deny(10));
        // The rule reaches 10.0.0.53 only.
        assert_eq!(
            ask(&p, "10.1.2.3", "10.0.0.54:53", "www.example.com.", udp),
            deny(10)
        );
        // Guests: any name, UDP only.
        assert_eq!(
            ask(&p, "10.2.0.9", "10.0.0.53:53", "anything.test.", udp),
            allow(11)
        );
        assert_eq!(
            ask(
                &p,
                "10.2.0.9",
                "10.0.0.53:53",
                "anything.test.",
                DnsService::Plain(Protocol::Tcp)
            ),
            deny(11)
        );
        // DoT and DoH are TCP 853 and 443: the guests' rule (UDP 53) does not cover them, the
        // lab's (no rule: not under policy) lets them through.
        for service in [DnsService::Tls, DnsService::Https] {
            assert_eq!(
                ask(&p, "10.2.0.9", "10.0.0.53:853", "anything.test.", service),
                deny(11)
            );
        }
        // No rule selects the lab: not under policy.
        assert_eq!(
            ask(&p, "10.3.0.9", "10.0.0.53:53", "anything.test.", udp),
            allow(12)
        );
        // Not a client: never an open resolver.
        assert_eq!(
            ask(&p, "192.0.2.1", "10.0.0.53:53", "www.example.com.", udp),
            Verdict::UnknownClient
        );
        assert_eq!(
            p.endpoint_of("10.2.255.1".parse().unwrap()),
            Some(EndpointId(11))
        );
        // By endpoint (a host process's query, named by the socket programs): the same
        // rules, whatever the source address; an endpoint the policy lacks is unknown.
        let server = "10.0.0.53:53".parse().unwrap();
        assert_eq!(
            p.endpoint_verdict(EndpointId(10), server, udp, "www.example.com."),
            allow(10)
        );
        assert_eq!(
            p.endpoint_verdict(EndpointId(10), server, udp, "evil.test."),
            deny(10)
        );
        assert_eq!(
            p.endpoint_verdict(EndpointId(99), server, udp, "www.example.com."),
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
        let guest = |name| {
            ask(
                &p,
                "10.2.0.9",
                "10.0.0.53:53",
                name,
                DnsService::Plain(Protocol::Udp),
            )
        };
        assert_eq!(guest("x.ads.example.com."), deny(11));
        assert_eq!(guest("pixel.tracker.test."), deny(11));
        assert_eq!(guest("good.ads.example.com."), allow(11));
        // An allow list grants nothing policy denies: lan may ask *.example.com only.
        let lan = |name| {
            ask(
                &p,
                "10.1.2.3",
                "10.0.0.53:53",
                name,
                DnsService::Plain(Protocol::Udp),
            )
        };
        assert_eq!(lan("good.ads.example.com."), deny(10));
        assert_eq!(lan("www.example.com."), allow(10));
        assert_eq!(lan("other.test."), deny(10));
        assert_eq!(p.list_sizes(), (4, 2), "a subtree entry is two patterns");
    }

    /// An answer a peer gateway learned is taken in only for a name the group may ask this
    /// gateway (its listen addresses), over either transport; an unknown group takes nothing.
    #[test]
    fn a_peers_answer_needs_a_name_the_group_may_ask_here() {
        let p = compiled(&Lists::default());
        let here: Vec<SocketAddr> = vec!["10.0.0.53:53".parse().unwrap()];
        let elsewhere: Vec<SocketAddr> = vec!["10.0.0.54:53".parse().unwrap()];
        assert!(p.endpoint_may_ask(EndpointId(10), &here, "www.example.com."));
        assert!(p.endpoint_may_ask(EndpointId(10), &here, "api.github.com."));
        assert!(!p.endpoint_may_ask(EndpointId(10), &here, "evil.test."));
        // lan's rule reaches 10.0.0.53 only.
        assert!(!p.endpoint_may_ask(EndpointId(10), &elsewhere, "www.example.com."));
        // Guests over UDP only: enough.
        assert!(p.endpoint_may_ask(EndpointId(11), &elsewhere, "anything.test."));
        // Not under policy: as for its own queries, anything.
        assert!(p.endpoint_may_ask(EndpointId(12), &here, "anything.test."));
        assert!(!p.endpoint_may_ask(EndpointId(99), &here, "www.example.com."));
        assert!(!p.endpoint_may_ask(EndpointId(10), &[], "www.example.com."));
        // A deny section reaching this gateway refuses what a grant allows.
        let config = fqdnd_config::load_str(
            r#"
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: lan}
spec: {id: 10, addresses: ["10.1.0.0/16"], labels: {zone: lan}}
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: lan}
spec:
  endpointSelector: {matchLabels: {zone: lan}}
  egress:
  - toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules:
        dns: [{matchPattern: "*"}]
  egressDeny:
  - toCIDR: ["10.0.0.53/32"]
    toPorts:
    - ports: [{port: "53", protocol: ANY}]
"#,
            Path::new("deny.yaml"),
        )
        .unwrap();
        let p = DnsPolicy::compile(&config, &Lists::default()).unwrap();
        assert!(!p.endpoint_may_ask(EndpointId(10), &here, "www.example.com."));
        assert!(p.endpoint_may_ask(EndpointId(10), &elsewhere, "www.example.com."));
    }
}
