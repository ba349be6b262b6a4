//! `toPorts[]`: ports, protocols and the DNS rules the proxy enforces on them.

use fqdnd_ipcache::policy::{DnsRule, PortProtocol, PortRule, Protocol};
use serde_saphyr::{Location, Spanned};

use super::peers::fqdn;
use super::reject;
use crate::cnp::{PortProtocolSpec, PortRuleSpec};
use crate::error::Unsupported;
use crate::yaml::{Diag, Scalar, Text, at, sanitize};

/// Cilium rejects a `toPorts` entry with more ports than this.
const MAX_PORTS: usize = 40;

/// One `toPorts[]` entry; in a deny section (`deny`) it may hold no `rules`, and DNS rules
/// only in egress (`dns_allowed`).
pub(super) fn port_rule(
    spec: &Spanned<PortRuleSpec>,
    deny: bool,
    dns_allowed: bool,
    diag: &mut Diag<'_>,
) -> Option<PortRule> {
    let before = diag.count();
    let p = &spec.value;
    reject(p.rejected(), diag);

    let port_specs = p.ports.as_deref().unwrap_or_default();
    if p.ports.is_none() {
        diag.missing(
            at(spec),
            &["ports"],
            "a `toPorts` entry needs a non-empty `ports` list",
        );
    } else if port_specs.is_empty() {
        diag.invalid(at(spec), "a `toPorts` entry needs a non-empty `ports` list");
    } else if port_specs.len() > MAX_PORTS {
        diag.invalid(
            at(spec),
            format!("a `toPorts` entry may list at most {MAX_PORTS} ports (as in Cilium)"),
        );
    }
    let ports: Vec<(PortProtocol, Location)> = port_specs
        .iter()
        .filter_map(|pp| port(pp, diag).map(|port| (port, at(pp))))
        .collect();

    let mut dns = None;
    if let (true, Some(rules)) = (deny, &p.rules) {
        diag.invalid_field(
            at(rules),
            "rules",
            "a deny rule's `toPorts` takes no `rules` (Cilium's deny rules are L3/L4 only)",
        );
    } else if let Some(rules) = &p.rules {
        reject(rules.value.rejected(), diag);
        if let (false, Some(first)) = (
            dns_allowed,
            rules.value.dns.as_ref().and_then(|d| d.first()),
        ) {
            diag.invalid_field(
                at(first),
                "dns",
                "DNS rules apply to egress only (the endpoint's own queries): remove `rules.dns` \
                 from this ingress rule",
            );
        }
        let specs = rules.value.dns.as_deref().unwrap_or_default();
        if !specs.is_empty() {
            for (pp, pp_at) in &ports {
                if pp.port == 0 {
                    diag.invalid(
                        *pp_at,
                        "DNS rules need a specific port (such as 53), not port 0 (all ports)",
                    );
                } else if pp.end_port != pp.port {
                    diag.invalid(*pp_at, "DNS rules do not support port ranges (`endPort`)");
                }
            }
            let rules: Vec<DnsRule> = specs
                .iter()
                .filter_map(|f| {
                    let sel = fqdn(f, "rules.dns", diag)?;
                    let key = sel.key().to_owned();
                    Some(if f.value.match_name.is_some() {
                        DnsRule::MatchName(key)
                    } else {
                        DnsRule::MatchPattern(key)
                    })
                })
                .collect();
            dns = Some(rules);
        }
    }
    (diag.count() == before).then(|| PortRule {
        ports: ports.into_iter().map(|(p, _)| p).collect(),
        dns,
    })
}

/// One `toPorts[].ports[]` entry.
fn port(spec: &Spanned<PortProtocolSpec>, diag: &mut Diag<'_>) -> Option<PortProtocol> {
    let before = diag.count();
    let p = &spec.value;
    let port = match &p.port {
        Some(v) => port_number(v, "port", diag),
        None => {
            diag.missing(
                at(spec),
                &["port"],
                "a `ports` entry needs a `port` (\"0\" means every port)",
            );
            None
        }
    };
    let end_port = p
        .end_port
        .as_ref()
        .and_then(|v| port_number(v, "endPort", diag).map(|n| (n, at(v))));
    let protocol = match &p.protocol {
        None => Some(Protocol::Any),
        Some(text) => protocol(text, diag),
    };
    let port = port?;
    let end_port = match end_port {
        None => port,
        Some((_, end_at)) if port == 0 => {
            diag.invalid(
                end_at,
                "`endPort` needs a specific `port`: port 0 already means every port",
            );
            return None;
        }
        Some((end, end_at)) if end < port => {
            diag.invalid(end_at, format!("`endPort` {end} is below `port` {port}"));
            return None;
        }
        Some((end, _)) => end,
    };
    (diag.count() == before).then_some(PortProtocol {
        port,
        end_port,
        protocol: protocol?,
    })
}

fn port_number(value: &Spanned<Scalar>, field: &str, diag: &mut Diag<'_>) -> Option<u16> {
    let n = match &value.value {
        Scalar::Int(n) => *n,
        Scalar::Str(s)
            if !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit()) =>
        {
            s.parse::<i128>().unwrap_or(i128::MAX)
        }
        Scalar::Str(s)
            if s.bytes().any(|b| b.is_ascii_alphabetic())
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') =>
        {
            diag.unsupported(
                at(value),
                field,
                format!("{field}: {} (a named port)", sanitize(s)),
                Unsupported::KubernetesOnly,
            );
            return None;
        }
        Scalar::Str(s) => {
            diag.invalid(
                at(value),
                format!("`{field}` {:?} is not a port number (0-65535)", sanitize(s)),
            );
            return None;
        }
        other @ Scalar::Other(_) => {
            diag.invalid(
                at(value),
                format!("`{field}` must be a port number (0-65535), not {other}"),
            );
            return None;
        }
    };
    match u16::try_from(n) {
        Ok(port) => Some(port),
        Err(_) => {
            diag.invalid(
                at(value),
                format!("`{field}` {n} is out of range: ports are 0-65535"),
            );
            None
        }
    }
}

fn protocol(text: &Text, diag: &mut Diag<'_>) -> Option<Protocol> {
    let s = text.value.as_str();
    match s.to_ascii_uppercase().as_str() {
        "TCP" => Some(Protocol::Tcp),
        "UDP" => Some(Protocol::Udp),
        "ANY" => Some(Protocol::Any),
        "SCTP" | "ICMP" | "ICMPV6" | "VRRP" | "IGMP" => {
            diag.invalid(
                at(text),
                format!(
                    "`protocol` {s} is not supported by fqdnd: use TCP, UDP or ANY (TCP and UDP)"
                ),
            );
            None
        }
        _ => {
            diag.invalid(
                at(text),
                format!(
                    "unknown `protocol` {:?}: expected TCP, UDP or ANY",
                    sanitize(s)
                ),
            );
            None
        }
    }
}
