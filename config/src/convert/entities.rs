//! `toEntities` / `fromEntities` and `icmps`.

use fqdnd_ipcache::policy::{Entity, PortProtocol, PortRule, Protocol};
use serde_saphyr::Spanned;

use crate::cnp::{IcmpFieldSpec, IcmpRuleSpec};
use crate::error::Unsupported;
use crate::yaml::{Diag, Scalar, Text, at, sanitize};

/// Cilium's entities that mean something only inside Kubernetes.
const KUBERNETES_ONLY: &[&str] = &["kube-apiserver", "ingress", "health", "init", "unmanaged"];

/// One entity name.
pub(super) fn entity(text: &Text, field: &str, diag: &mut Diag<'_>) -> Option<Entity> {
    let s = text.value.as_str();
    let entity = match s {
        "world" => Entity::World,
        "world-ipv4" => Entity::WorldIpv4,
        "world-ipv6" => Entity::WorldIpv6,
        "all" => Entity::All,
        "host" => Entity::Host,
        "cluster" => Entity::Cluster,
        "remote-node" => Entity::RemoteNode,
        _ if KUBERNETES_ONLY.contains(&s) => {
            diag.unsupported(
                at(text),
                field,
                format!("{field}: {s}"),
                Unsupported::KubernetesOnly,
            );
            return None;
        }
        _ => {
            diag.invalid(
                at(text),
                format!(
                    "unknown entity {:?} in `{field}`: expected world, world-ipv4, world-ipv6, \
                     all, host, cluster or remote-node",
                    sanitize(s)
                ),
            );
            return None;
        }
    };
    Some(entity)
}

/// Cilium's ICMP (IPv4) type names.
const ICMP_V4: &[(&str, u8)] = &[
    ("EchoReply", 0),
    ("DestinationUnreachable", 3),
    ("Redirect", 5),
    ("Echo", 8),
    ("EchoRequest", 8),
    ("RouterAdvertisement", 9),
    ("RouterSelection", 10),
    ("TimeExceeded", 11),
    ("ParameterProblem", 12),
    ("Timestamp", 13),
    ("TimestampReply", 14),
    ("Photuris", 40),
    ("ExtendedEchoRequest", 42),
    ("ExtendedEchoReply", 43),
];

/// Cilium's ICMPv6 type names.
const ICMP_V6: &[(&str, u8)] = &[
    ("DestinationUnreachable", 1),
    ("PacketTooBig", 2),
    ("TimeExceeded", 3),
    ("ParameterProblem", 4),
    ("EchoRequest", 128),
    ("EchoReply", 129),
    ("MulticastListenerQuery", 130),
    ("MulticastListenerReport", 131),
    ("MulticastListenerDone", 132),
    ("RouterSolicitation", 133),
    ("RouterAdvertisement", 134),
    ("NeighborSolicitation", 135),
    ("NeighborAdvertisement", 136),
    ("RedirectMessage", 137),
    ("RouterRenumbering", 138),
    ("ICMPNodeInformationQuery", 139),
    ("ICMPNodeInformationResponse", 140),
    ("InverseNeighborDiscoverySolicitation", 141),
    ("InverseNeighborDiscoveryAdvertisement", 142),
    ("HomeAgentAddressDiscoveryRequest", 144),
    ("HomeAgentAddressDiscoveryReply", 145),
    ("MobilePrefixSolicitation", 146),
    ("MobilePrefixAdvertisement", 147),
    ("DuplicateAddressRequestCodeSuffix", 157),
    ("DuplicateAddressConfirmationCodeSuffix", 158),
    ("ExtendedEchoRequest", 160),
    ("ExtendedEchoReply", 161),
];

/// An ICMP type by number (0-255) or by Cilium's name for the family.
pub(crate) fn icmp_type(family: Protocol, value: &Scalar) -> Result<u8, String> {
    let names = if family == Protocol::Icmpv6 {
        ICMP_V6
    } else {
        ICMP_V4
    };
    let family_name = if family == Protocol::Icmpv6 {
        "IPv6"
    } else {
        "IPv4"
    };
    match value {
        Scalar::Int(n) => {
            u8::try_from(*n).map_err(|_| format!("ICMP type {n} is out of range: types are 0-255"))
        }
        Scalar::Str(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s
            .parse::<u8>()
            .map_err(|_| format!("ICMP type {s} is out of range: types are 0-255")),
        Scalar::Str(s) => names
            .iter()
            .find(|(name, _)| name == s)
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let known: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
                format!(
                    "unknown ICMP type name {:?} for family {family_name}: expected a number or \
                     one of {}",
                    sanitize(s),
                    known.join(", ")
                )
            }),
        other @ Scalar::Other(_) => Err(format!(
            "an ICMP type must be a number or a name, not {other}"
        )),
    }
}

/// One `icmps[]` entry: its fields become ICMP "ports" (the type) of one port rule.
pub(super) fn icmp_rule(spec: &Spanned<IcmpRuleSpec>, diag: &mut Diag<'_>) -> Option<PortRule> {
    let before = diag.count();
    let fields = spec.value.fields.as_deref().unwrap_or_default();
    if fields.is_empty() {
        diag.missing(
            at(spec),
            &["fields"],
            "an `icmps` entry needs a non-empty `fields` list",
        );
        return None;
    }
    if fields.len() > 40 {
        diag.invalid(
            at(spec),
            "an `icmps` entry may list at most 40 fields (as in Cilium)",
        );
    }
    let ports: Vec<PortProtocol> = fields.iter().filter_map(|f| icmp_field(f, diag)).collect();
    (diag.count() == before).then_some(PortRule { ports, dns: None })
}

fn icmp_field(spec: &Spanned<IcmpFieldSpec>, diag: &mut Diag<'_>) -> Option<PortProtocol> {
    let f = &spec.value;
    let protocol = match f.family.as_ref().map(|t| t.value.as_str()) {
        None | Some("IPv4") => Protocol::Icmp,
        Some("IPv6") => Protocol::Icmpv6,
        Some(other) => {
            if let Some(t) = &f.family {
                diag.invalid(
                    at(t),
                    format!(
                        "unknown ICMP `family` {:?}: expected IPv4 or IPv6",
                        sanitize(other)
                    ),
                );
            }
            return None;
        }
    };
    let Some(value) = &f.icmp_type else {
        diag.missing(at(spec), &["type"], "an `icmps` field needs a `type`");
        return None;
    };
    match icmp_type(protocol, &value.value) {
        Ok(t) => Some(PortProtocol {
            port: u16::from(t),
            end_port: u16::from(t),
            protocol,
        }),
        Err(message) => {
            diag.invalid(at(value), message);
            None
        }
    }
}
