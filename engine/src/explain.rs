//! Which rule allows or denies a flow: `fqdnd policy explain`, from the policy the engine holds
//! (loaded from files, or the running agent's), without traffic.
//!
//! The peer's identity is what the datapath would look up (the longest prefix of the IpCache
//! holding the address; the world identity of its family when none does). Every rule selecting
//! the endpoint is read in the flow's direction, and each section whose peers select that
//! identity and whose ports hold the packet is reported. The verdict follows Cilium: a
//! matching deny drops; else a matching allow passes; else the direction's default deny (or
//! its absence) decides. It is checked against the entries the datapath holds for the
//! endpoint ([`fqdnd_ipcache::verdict`]), and a disagreement is reported, not hidden.

use std::net::IpAddr;

use fqdnd_ipcache::policy::{Direction, EgressRule, Entity, Operator, PeerSelector, Protocol};
use fqdnd_ipcache::{EndpointId, Identity, IpCache, PolicyKey};
use serde::{Deserialize, Serialize};

/// The flow to explain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// The endpoint (or client group) whose policy decides.
    pub endpoint: EndpointId,
    /// Egress: the endpoint sends to `peer`; ingress: `peer` sends to the endpoint.
    pub direction: Direction,
    /// The other end.
    pub peer: IpAddr,
    /// TCP, UDP, ICMP or ICMPv6; `Any` with port 0: "every protocol" (only rules without ports
    /// match).
    pub protocol: Protocol,
    /// The destination port (ICMP: the type).
    pub port: u16,
}

/// One section that matches the flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Match {
    /// Where the rule came from (`file:line name`).
    pub origin: String,
    /// `egress`, `ingress`, `egressDeny` or `ingressDeny`, and the section's index in it.
    pub section: String,
    /// Whether it denies.
    pub deny: bool,
    /// The peer that selects the flow's peer, as written (`any` for a section without peers).
    pub peer: String,
    /// The ports of the section that hold the packet (`any` without ports).
    pub ports: String,
}

/// The flow as an [`Explanation`] tells it (the admin API's JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowView {
    /// The endpoint (or client group) id.
    pub endpoint: u16,
    /// `egress` or `ingress`.
    pub direction: String,
    /// The other end.
    pub peer: IpAddr,
    /// `TCP`, `UDP`, `ICMP`, `ICMPv6`, or `ANY` (every protocol).
    pub protocol: String,
    /// The destination port, or the ICMP type.
    pub port: u16,
}

impl From<Flow> for FlowView {
    fn from(f: Flow) -> Self {
        Self {
            endpoint: f.endpoint.0,
            direction: f.direction.name().to_owned(),
            peer: f.peer,
            protocol: f.protocol.name().to_owned(),
            port: f.port,
        }
    }
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// The flow.
    pub flow: FlowView,
    /// The peer's identity, and its labels.
    pub identity: u32,
    /// `reserved:world-ipv4`, endpoint labels, `cidr:`/`fqdn:` labels…
    pub labels: String,
    /// Whether the endpoint is known.
    pub known_endpoint: bool,
    /// Whether the direction is in default deny for the endpoint.
    pub default_deny: bool,
    /// Every matching section, denies first.
    pub matches: Vec<Match>,
    /// The verdict by the rules.
    pub allowed: bool,
    /// Why, in one sentence.
    pub reason: String,
    /// The datapath's verdict from the entries it holds (the same unless something is wrong).
    pub datapath_allowed: bool,
}

fn peer_text(peer: &PeerSelector) -> String {
    match peer {
        PeerSelector::Fqdn(key) => format!("toFQDNs {key}"),
        PeerSelector::Cidr { cidr, except } if except.is_empty() => format!("CIDR {cidr}"),
        PeerSelector::Cidr { cidr, except } => {
            let except: Vec<String> = except.iter().map(ToString::to_string).collect();
            format!("CIDR {cidr} except {}", except.join(", "))
        }
        PeerSelector::Endpoints(sel) if sel.requirements.is_empty() => "every endpoint".to_owned(),
        PeerSelector::Endpoints(sel) => {
            // Kubernetes' selector syntax: `app=b,tier in (x, y),!legacy`.
            let reqs: Vec<String> = sel
                .requirements
                .iter()
                .map(|r| match &r.operator {
                    Operator::In(v) if v.len() == 1 => format!("{}={}", r.key, v[0]),
                    Operator::In(v) => format!("{} in ({})", r.key, v.join(", ")),
                    Operator::NotIn(v) => format!("{} notin ({})", r.key, v.join(", ")),
                    Operator::Exists => r.key.clone(),
                    Operator::DoesNotExist => format!("!{}", r.key),
                })
                .collect();
            format!("endpoints {}", reqs.join(","))
        }
        PeerSelector::Entity(e) => format!("entity {}", e.name()),
    }
}

/// The ports of `section` that hold (protocol, port), rendered; `None` if none does.
fn ports_matching(section: &EgressRule, protocol: Protocol, port: u16) -> Option<String> {
    if section.ports.is_empty() {
        return Some("any".to_owned());
    }
    let held: Vec<String> = section
        .ports
        .iter()
        .flat_map(|p| &p.ports)
        .filter(|p| {
            let key = PolicyKey {
                protocol: p.protocol,
                port: p.port,
                end_port: if p.protocol.is_icmp() {
                    p.port
                } else {
                    p.end_port
                },
                ..PolicyKey::ALLOW_ALL
            };
            key.matches_port(protocol, port)
        })
        .map(|p| match (p.protocol.is_icmp(), p.port, p.end_port) {
            (true, t, _) => format!("{} type {t}", p.protocol.name()),
            (false, 0, _) => format!("{}/*", p.protocol.name()),
            (false, a, b) if a == b || b == 0 => format!("{}/{a}", p.protocol.name()),
            (false, a, b) => format!("{}/{a}-{b}", p.protocol.name()),
        })
        .collect();
    (!held.is_empty()).then(|| held.join(", "))
}

/// One endpoint (or client group) and the rules selecting it, for listings (the dashboard's
/// Policy page).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointPolicy {
    /// Its id.
    pub endpoint: u16,
    /// Its name.
    pub name: String,
    /// Its labels, `source:key=value`.
    pub labels: Vec<String>,
    /// Every section of every rule selecting it, in rule order.
    pub sections: Vec<Section>,
}

/// One section of a rule, rendered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Section {
    /// Where the rule came from.
    pub origin: String,
    /// `egress[0]`, `ingressDeny[1]`…
    pub section: String,
    /// Whether it denies.
    pub deny: bool,
    /// Its peers as written (`any` without peers).
    pub peers: Vec<String>,
    /// Its ports (`any` without ports).
    pub ports: String,
}

/// Every endpoint of `ipcache` with the sections of the rules selecting it.
pub fn policies<D>(ipcache: &IpCache<D>) -> Vec<EndpointPolicy> {
    ipcache
        .endpoints()
        .values()
        .map(|ep| {
            let mut sections = Vec::new();
            for rule in ipcache
                .rules()
                .iter()
                .filter(|r| r.endpoint_selector.matches(ep.labels.iter()))
            {
                let parts = [
                    ("egress", false, &rule.egress),
                    ("egressDeny", true, &rule.egress_deny),
                    ("ingress", false, &rule.ingress),
                    ("ingressDeny", true, &rule.ingress_deny),
                ];
                for (name, deny, list) in parts {
                    for (i, section) in list.iter().enumerate() {
                        sections.push(Section {
                            origin: rule.origin.clone(),
                            section: format!("{name}[{i}]"),
                            deny,
                            peers: if section.peers.is_empty() {
                                vec!["any".to_owned()]
                            } else {
                                section.peers.iter().map(peer_text).collect()
                            },
                            ports: ports_text(section),
                        });
                    }
                }
            }
            EndpointPolicy {
                endpoint: ep.id.0,
                name: ep.name.clone(),
                labels: ep
                    .labels
                    .iter()
                    .map(|l| format!("{}:{}={}", l.source, l.key, l.value))
                    .collect(),
                sections,
            }
        })
        .collect()
}

/// Every port of `section`, rendered (`any` without ports).
fn ports_text(section: &EgressRule) -> String {
    if section.ports.is_empty() {
        return "any".to_owned();
    }
    let all: Vec<String> = section
        .ports
        .iter()
        .flat_map(|p| &p.ports)
        .map(|p| match (p.protocol.is_icmp(), p.port, p.end_port) {
            (true, t, _) => format!("{} type {t}", p.protocol.name()),
            (false, 0, _) => format!("{}/*", p.protocol.name()),
            (false, a, b) if a == b || b == 0 => format!("{}/{a}", p.protocol.name()),
            (false, a, b) => format!("{}/{a}-{b}", p.protocol.name()),
        })
        .collect();
    all.join(", ")
}

/// The identity the datapath gives `addr`: the longest prefix of the IpCache holding it.
pub fn identity_of<D>(ipcache: &IpCache<D>, addr: IpAddr) -> Identity {
    ipcache
        .prefixes()
        .filter_map(|(net, id, _)| id.filter(|_| net.contains(&addr)).map(|id| (net, id)))
        .max_by_key(|(net, _)| net.prefix_len())
        .map_or(Identity::world(addr.is_ipv4()), |(_, id)| id)
}

/// Explains `flow` from what `ipcache` holds.
pub fn explain<D>(ipcache: &IpCache<D>, flow: Flow) -> Explanation {
    let identity = identity_of(ipcache, flow.peer);
    let labels = ipcache.canonical_labels_of(identity).unwrap_or_else(|| {
        if identity == Identity::WORLD_IPV4 {
            "reserved:world-ipv4".to_owned()
        } else if identity == Identity::WORLD_IPV6 {
            "reserved:world-ipv6".to_owned()
        } else {
            String::new()
        }
    });
    let endpoint = ipcache.endpoints().get(&flow.endpoint);
    let mut matches = Vec::new();
    let mut default_deny = false;
    if let Some(ep) = endpoint {
        for rule in ipcache
            .rules()
            .iter()
            .filter(|r| r.endpoint_selector.matches(ep.labels.iter()))
        {
            let (allows, denies, dd) = rule.direction(flow.direction);
            default_deny |= dd;
            let names = match flow.direction {
                Direction::Egress => ["egress", "egressDeny"],
                Direction::Ingress => ["ingress", "ingressDeny"],
            };
            for (sections, deny, name) in [(denies, true, names[1]), (allows, false, names[0])] {
                for (i, section) in sections.iter().enumerate() {
                    let Some(ports) = ports_matching(section, flow.protocol, flow.port) else {
                        continue;
                    };
                    let peer = if section.peers.is_empty() {
                        Some("any".to_owned())
                    } else {
                        section
                            .peers
                            .iter()
                            .find(|p| {
                                **p == PeerSelector::Entity(Entity::All)
                                    || ipcache.selected(p).contains(&identity)
                            })
                            .map(peer_text)
                    };
                    if let Some(peer) = peer {
                        matches.push(Match {
                            origin: rule.origin.clone(),
                            section: format!("{name}[{i}]"),
                            deny,
                            peer,
                            ports,
                        });
                    }
                }
            }
        }
    }
    matches.sort_by_key(|m| !m.deny);
    let (allowed, reason) = if endpoint.is_none() {
        (false, format!("endpoint {} is not known", flow.endpoint))
    } else if let Some(m) = matches.iter().find(|m| m.deny) {
        let shadowed = matches.iter().filter(|m| !m.deny).count();
        let extra = if shadowed > 0 {
            format!(" (it shadows {shadowed} matching allow(s))")
        } else {
            String::new()
        };
        (
            false,
            format!("denied by {} {}{extra}", m.origin, m.section),
        )
    } else if let Some(m) = matches.first() {
        (true, format!("allowed by {} {}", m.origin, m.section))
    } else if default_deny {
        (
            false,
            format!(
                "no rule allows it and the endpoint's {} is in default deny",
                flow.direction.name()
            ),
        )
    } else {
        (
            true,
            format!(
                "no rule puts the endpoint's {} in default deny",
                flow.direction.name()
            ),
        )
    };
    let keys = ipcache
        .endpoint_policy_dir(flow.endpoint, flow.direction)
        .unwrap_or_default();
    let datapath_allowed = fqdnd_ipcache::verdict(
        keys.iter(),
        flow.direction,
        identity,
        flow.protocol,
        flow.port,
    )
    .is_some_and(|k| !k.deny);
    Explanation {
        flow: flow.into(),
        identity: identity.0,
        labels,
        known_endpoint: endpoint.is_some(),
        default_deny,
        matches,
        allowed,
        reason,
        datapath_allowed,
    }
}

impl std::fmt::Display for Explanation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let f_ = &self.flow;
        let (from, to) = if f_.direction == Direction::Ingress.name() {
            (f_.peer.to_string(), format!("endpoint {}", f_.endpoint))
        } else {
            (format!("endpoint {}", f_.endpoint), f_.peer.to_string())
        };
        let what = if f_.protocol.starts_with("ICMP") {
            format!("{} type {}", f_.protocol, f_.port)
        } else if f_.protocol == Protocol::Any.name() {
            "every protocol".to_owned()
        } else {
            format!("{}/{}", f_.protocol, f_.port)
        };
        writeln!(
            f,
            "{} {from} -> {to} {what}: {}",
            f_.direction,
            if self.allowed { "ALLOWED" } else { "DENIED" }
        )?;
        writeln!(f, "  peer identity {} ({})", self.identity, self.labels)?;
        writeln!(f, "  {}", self.reason)?;
        for m in &self.matches {
            writeln!(
                f,
                "  {} {} {}: {} on {}",
                if m.deny { "deny " } else { "allow" },
                m.origin,
                m.section,
                m.peer,
                m.ports
            )?;
        }
        if self.datapath_allowed != self.allowed {
            writeln!(
                f,
                "  WARNING: the datapath's entries {} it",
                if self.datapath_allowed {
                    "allow"
                } else {
                    "deny"
                }
            )?;
        }
        Ok(())
    }
}

/// Parses `ADDR[:PORT/PROTO]` (`[v6]:PORT/PROTO` for IPv6 with a port): PROTO is tcp, udp,
/// icmp or icmpv6 (PORT is then the type). Without a port: every protocol.
///
/// # Errors
/// A message saying what is wrong.
pub fn parse_target(text: &str) -> Result<(IpAddr, Protocol, u16), String> {
    if let Ok(addr) = text.parse::<IpAddr>() {
        return Ok((addr, Protocol::Any, 0));
    }
    let (host, rest) = if let Some(stripped) = text.strip_prefix('[') {
        stripped
            .split_once("]:")
            .ok_or_else(|| format!("{text:?}: expected [IPv6]:PORT/PROTO"))?
    } else {
        text.rsplit_once(':')
            .ok_or_else(|| format!("{text:?}: expected ADDR or ADDR:PORT/PROTO"))?
    };
    let addr: IpAddr = host
        .parse()
        .map_err(|_| format!("{host:?} is not an IP address"))?;
    let (port, proto) = rest.split_once('/').unwrap_or((rest, "tcp"));
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{port:?} is not a port number"))?;
    let protocol = parse_protocol(proto)?;
    check_port(addr, protocol, port)?;
    Ok((addr, protocol, port))
}

/// A protocol by name, any case: tcp, udp, icmp, icmpv6, or any (every protocol, port 0).
///
/// # Errors
/// A message saying what is wrong.
pub fn parse_protocol(text: &str) -> Result<Protocol, String> {
    Ok(match text.to_ascii_lowercase().as_str() {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "icmp" => Protocol::Icmp,
        "icmpv6" => Protocol::Icmpv6,
        "any" => Protocol::Any,
        other => {
            return Err(format!(
                "unknown protocol {:?}: tcp, udp, icmp or icmpv6",
                other.escape_debug().to_string()
            ));
        }
    })
}

/// Whether `port` fits `protocol` and `peer`'s family: an ICMP type is 0-255 and of the
/// peer's family (`icmp` for IPv4, `icmpv6` for IPv6); `any` means every protocol, port 0.
///
/// # Errors
/// A message saying what is wrong.
pub fn check_port(peer: IpAddr, protocol: Protocol, port: u16) -> Result<(), String> {
    match protocol {
        Protocol::Icmp | Protocol::Icmpv6 if port > 255 => {
            Err(format!("ICMP type {port} is out of range (0-255)"))
        }
        Protocol::Icmp if peer.is_ipv6() => Err(format!("{peer} is IPv6: its ICMP is icmpv6")),
        Protocol::Icmpv6 if peer.is_ipv4() => Err(format!("{peer} is IPv4: icmpv6 is IPv6's ICMP")),
        Protocol::Any if port != 0 => Err(
            "`any` protocol means every protocol: give no port (ADDR alone), or tcp/udp".to_owned(),
        ),
        _ => Ok(()),
    }
}
