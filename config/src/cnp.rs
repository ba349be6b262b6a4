//! The serde shapes of CiliumNetworkPolicy / CiliumClusterwideNetworkPolicy documents, field
//! for field as Cilium's `cilium.io/v2` API spells them.
//!
//! Every struct is a [`crate::yaml::Shape`]: an unknown field (a typo) is an error listing the
//! expected fields, and the rest of the document is still checked. Fields
//! fqdnd does not implement but that would change what a rule allows are still declared, as
//! [`Rejected`], so that their presence is reported by name instead of being ignored (see
//! [`crate::convert`]). Values are kept [`Spanned`] so that validation can point at them.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::Spanned;

use crate::yaml::{Pairs, Scalar, Text, shape};

/// A field that is recognised only to be rejected: its presence is an error naming it.
pub(crate) type Rejected = Option<Spanned<IgnoredAny>>;

/// The fields declared as [`Rejected`], per shape: a field only that shape has, and the
/// shape's rejected fields. Unknown-field errors do not offer rejected fields as alternatives.
const REJECTED_BY_SHAPE: &[(&str, &[&str])] = &[
    ("endpointSelector", &RuleSpec::REJECTED),
    ("toFQDNs", &EgressSpec::REJECTED),
    ("fromEndpoints", &IngressSpec::REJECTED),
    ("except", &CidrRuleSpec::REJECTED),
    ("rules", &PortRuleSpec::REJECTED),
    ("dns", &L7RulesSpec::REJECTED),
];

/// Whether `field`, in a shape whose fields are `expected`, is there only to be rejected.
pub(crate) fn is_rejected(expected: &[&str], field: &str) -> bool {
    REJECTED_BY_SHAPE
        .iter()
        .any(|(marker, rejected)| expected.contains(marker) && rejected.contains(&field))
}

/// Kubernetes `ObjectMeta`. Only `name` and `namespace` mean anything to fqdnd; the other
/// standard fields (as `kubectl get -o yaml` prints them) are accepted and ignored.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct ObjectMeta {
    pub(crate) name: Option<Text>,
    pub(crate) namespace: Option<Text>,
    #[serde(rename = "labels")]
    _labels: Option<IgnoredAny>,
    #[serde(rename = "annotations")]
    _annotations: Option<IgnoredAny>,
    #[serde(rename = "uid")]
    _uid: Option<IgnoredAny>,
    #[serde(rename = "resourceVersion")]
    _resource_version: Option<IgnoredAny>,
    #[serde(rename = "generation")]
    _generation: Option<IgnoredAny>,
    #[serde(rename = "generateName")]
    _generate_name: Option<IgnoredAny>,
    #[serde(rename = "creationTimestamp")]
    _creation_timestamp: Option<IgnoredAny>,
    #[serde(rename = "deletionTimestamp")]
    _deletion_timestamp: Option<IgnoredAny>,
    #[serde(rename = "deletionGracePeriodSeconds")]
    _deletion_grace_period_seconds: Option<IgnoredAny>,
    #[serde(rename = "ownerReferences")]
    _owner_references: Option<IgnoredAny>,
    #[serde(rename = "finalizers")]
    _finalizers: Option<IgnoredAny>,
    #[serde(rename = "managedFields")]
    _managed_fields: Option<IgnoredAny>,
    #[serde(rename = "selfLink")]
    _self_link: Option<IgnoredAny>,
}

/// A whole `CiliumNetworkPolicy` or `CiliumClusterwideNetworkPolicy` document.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct PolicyDoc {
    #[serde(rename = "apiVersion")]
    _api_version: Option<IgnoredAny>,
    #[serde(rename = "kind")]
    _kind: Option<IgnoredAny>,
    pub(crate) metadata: Option<Spanned<ObjectMeta>>,
    /// One rule.
    pub(crate) spec: Option<Spanned<RuleSpec>>,
    /// More rules (both `spec` and `specs` may be given; all apply).
    pub(crate) specs: Option<Vec<Spanned<RuleSpec>>>,
    /// Written by the Cilium operator; meaningless here.
    #[serde(rename = "status")]
    _status: Option<IgnoredAny>,
    /// A free-text description some of Cilium's own examples put here.
    #[serde(rename = "description")]
    _description: Option<IgnoredAny>,
}

/// `spec` / `specs[]`: one Cilium rule.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub(crate) struct RuleSpec {
    pub(crate) endpoint_selector: Option<Spanned<SelectorSpec>>,
    pub(crate) egress: Option<Vec<Spanned<EgressSpec>>>,
    pub(crate) ingress: Option<Vec<Spanned<IngressSpec>>>,
    pub(crate) egress_deny: Option<Vec<Spanned<EgressSpec>>>,
    pub(crate) ingress_deny: Option<Vec<Spanned<IngressSpec>>>,
    pub(crate) enable_default_deny: Option<DefaultDenySpec>,
    #[serde(rename = "description")]
    _description: Option<IgnoredAny>,
    #[serde(rename = "labels")]
    _labels: Option<IgnoredAny>,
    #[serde(rename = "log")]
    _log: Option<IgnoredAny>,
    pub(crate) node_selector: Rejected,
}

impl RuleSpec {
    const REJECTED: [&str; 1] = ["nodeSelector"];

    pub(crate) fn rejected(&self) -> [(&'static str, &Rejected); 1] {
        zip(Self::REJECTED, [&self.node_selector])
    }
}

/// `enableDefaultDeny`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct DefaultDenySpec {
    /// Whether selecting an endpoint puts its egress into default deny (default true).
    pub(crate) egress: Option<bool>,
    /// The same for ingress.
    pub(crate) ingress: Option<bool>,
}

/// A Kubernetes label selector (`endpointSelector`, `toEndpoints[]`).
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub(crate) struct SelectorSpec {
    pub(crate) match_labels: Option<Pairs<Text, Text>>,
    pub(crate) match_expressions: Option<Vec<Spanned<ExpressionSpec>>>,
}

/// `matchExpressions[]`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct ExpressionSpec {
    pub(crate) key: Option<Text>,
    pub(crate) operator: Option<Spanned<OperatorSpec>>,
    pub(crate) values: Option<Vec<Text>>,
}

/// `matchExpressions[].operator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(crate) enum OperatorSpec {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// `egress[]`: peers × ports.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct EgressSpec {
    #[serde(rename = "toFQDNs")]
    pub(crate) to_fqdns: Option<Vec<Spanned<FqdnSpec>>>,
    #[serde(rename = "toCIDR")]
    pub(crate) to_cidr: Option<Vec<Text>>,
    #[serde(rename = "toCIDRSet")]
    pub(crate) to_cidr_set: Option<Vec<Spanned<CidrRuleSpec>>>,
    #[serde(rename = "toEndpoints")]
    pub(crate) to_endpoints: Option<Vec<Spanned<SelectorSpec>>>,
    #[serde(rename = "toPorts")]
    pub(crate) to_ports: Option<Vec<Spanned<PortRuleSpec>>>,
    #[serde(rename = "toEntities")]
    pub(crate) to_entities: Option<Vec<Text>>,
    #[serde(rename = "icmps")]
    pub(crate) icmps: Option<Vec<Spanned<IcmpRuleSpec>>>,
    #[serde(rename = "toServices")]
    pub(crate) to_services: Rejected,
    #[serde(rename = "toGroups")]
    pub(crate) to_groups: Rejected,
    #[serde(rename = "toRequires")]
    pub(crate) to_requires: Rejected,
    #[serde(rename = "toNodes")]
    pub(crate) to_nodes: Rejected,
    #[serde(rename = "authentication")]
    pub(crate) authentication: Rejected,
}

impl EgressSpec {
    const REJECTED: [&str; 5] = [
        "toServices",
        "toGroups",
        "toRequires",
        "toNodes",
        "authentication",
    ];

    pub(crate) fn rejected(&self) -> [(&'static str, &Rejected); 5] {
        let values = [
            &self.to_services,
            &self.to_groups,
            &self.to_requires,
            &self.to_nodes,
            &self.authentication,
        ];
        zip(Self::REJECTED, values)
    }
}

/// `ingress[]` / `ingressDeny[]`: sources × ports.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct IngressSpec {
    #[serde(rename = "fromEndpoints")]
    pub(crate) from_endpoints: Option<Vec<Spanned<SelectorSpec>>>,
    #[serde(rename = "fromCIDR")]
    pub(crate) from_cidr: Option<Vec<Text>>,
    #[serde(rename = "fromCIDRSet")]
    pub(crate) from_cidr_set: Option<Vec<Spanned<CidrRuleSpec>>>,
    #[serde(rename = "fromEntities")]
    pub(crate) from_entities: Option<Vec<Text>>,
    #[serde(rename = "toPorts")]
    pub(crate) to_ports: Option<Vec<Spanned<PortRuleSpec>>>,
    #[serde(rename = "icmps")]
    pub(crate) icmps: Option<Vec<Spanned<IcmpRuleSpec>>>,
    #[serde(rename = "fromRequires")]
    pub(crate) from_requires: Rejected,
    #[serde(rename = "fromNodes")]
    pub(crate) from_nodes: Rejected,
    #[serde(rename = "fromGroups")]
    pub(crate) from_groups: Rejected,
    #[serde(rename = "authentication")]
    pub(crate) authentication: Rejected,
}

impl IngressSpec {
    const REJECTED: [&str; 4] = ["fromRequires", "fromNodes", "fromGroups", "authentication"];

    pub(crate) fn rejected(&self) -> [(&'static str, &Rejected); 4] {
        let values = [
            &self.from_requires,
            &self.from_nodes,
            &self.from_groups,
            &self.authentication,
        ];
        zip(Self::REJECTED, values)
    }
}

/// `icmps[]`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct IcmpRuleSpec {
    pub(crate) fields: Option<Vec<Spanned<IcmpFieldSpec>>>,
}

/// `icmps[].fields[]`: a family (IPv4 by default) and a type, by number or by Cilium's name.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct IcmpFieldSpec {
    pub(crate) family: Option<Text>,
    #[serde(rename = "type")]
    pub(crate) icmp_type: Option<Spanned<Scalar>>,
}

/// `toFQDNs[]` and `rules.dns[]`: exactly one of `matchName` and `matchPattern`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub(crate) struct FqdnSpec {
    pub(crate) match_name: Option<Text>,
    pub(crate) match_pattern: Option<Text>,
}

/// `toCIDRSet[]`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub(crate) struct CidrRuleSpec {
    pub(crate) cidr: Option<Text>,
    pub(crate) except: Option<Vec<Text>>,
    pub(crate) cidr_group_ref: Rejected,
    pub(crate) cidr_group_selector: Rejected,
}

impl CidrRuleSpec {
    const REJECTED: [&str; 2] = ["cidrGroupRef", "cidrGroupSelector"];

    pub(crate) fn rejected(&self) -> [(&'static str, &Rejected); 2] {
        zip(
            Self::REJECTED,
            [&self.cidr_group_ref, &self.cidr_group_selector],
        )
    }
}

/// `toPorts[]`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct PortRuleSpec {
    pub(crate) ports: Option<Vec<Spanned<PortProtocolSpec>>>,
    pub(crate) rules: Option<Spanned<L7RulesSpec>>,
    #[serde(rename = "originatingTLS")]
    pub(crate) originating_tls: Rejected,
    #[serde(rename = "terminatingTLS")]
    pub(crate) terminating_tls: Rejected,
    #[serde(rename = "serverNames")]
    pub(crate) server_names: Rejected,
    #[serde(rename = "listener")]
    pub(crate) listener: Rejected,
}

impl PortRuleSpec {
    const REJECTED: [&str; 4] = [
        "originatingTLS",
        "terminatingTLS",
        "serverNames",
        "listener",
    ];

    pub(crate) fn rejected(&self) -> [(&'static str, &Rejected); 4] {
        let values = [
            &self.originating_tls,
            &self.terminating_tls,
            &self.server_names,
            &self.listener,
        ];
        zip(Self::REJECTED, values)
    }
}

/// `toPorts[].ports[]`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub(crate) struct PortProtocolSpec {
    pub(crate) port: Option<Spanned<Scalar>>,
    pub(crate) end_port: Option<Spanned<Scalar>>,
    pub(crate) protocol: Option<Text>,
}

/// `toPorts[].rules`: only `dns` is implemented.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct L7RulesSpec {
    pub(crate) dns: Option<Vec<Spanned<FqdnSpec>>>,
    /// Cilium decodes field names case-insensitively; its examples write `HTTP`.
    #[serde(alias = "HTTP")]
    pub(crate) http: Rejected,
    pub(crate) kafka: Rejected,
    #[serde(rename = "l7proto")]
    pub(crate) l7proto: Rejected,
    pub(crate) l7: Rejected,
}

shape!(
    ObjectMeta,
    PolicyDoc,
    RuleSpec,
    DefaultDenySpec,
    SelectorSpec,
    ExpressionSpec,
    EgressSpec,
    IngressSpec,
    IcmpRuleSpec,
    IcmpFieldSpec,
    FqdnSpec,
    CidrRuleSpec,
    PortRuleSpec,
    PortProtocolSpec,
    L7RulesSpec,
);

impl L7RulesSpec {
    const REJECTED: [&str; 4] = ["http", "kafka", "l7proto", "l7"];

    pub(crate) fn rejected(&self) -> [(&'static str, &Rejected); 4] {
        zip(
            Self::REJECTED,
            [&self.http, &self.kafka, &self.l7proto, &self.l7],
        )
    }
}

fn zip<'a, const N: usize>(
    names: [&'static str; N],
    values: [&'a Rejected; N],
) -> [(&'static str, &'a Rejected); N] {
    let mut values = values.into_iter();
    names.map(|name| (name, values.next().unwrap_or(&None)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name a shape lists as rejected is one of its fields: present in YAML, it lands in
    /// the `Rejected` slot of that name (not in an unknown-field error, not in another slot).
    #[test]
    fn rejected_names_are_the_fields_they_claim() {
        fn present<T: serde::de::DeserializeOwned>(
            yaml: &str,
            rejected: impl Fn(&T) -> Vec<(&'static str, bool)>,
            name: &str,
        ) {
            let value: T = serde_saphyr::from_str(yaml).unwrap();
            let found: Vec<&str> = rejected(&value)
                .into_iter()
                .filter_map(|(n, present)| present.then_some(n))
                .collect();
            assert_eq!(found, [name], "{yaml}");
        }
        fn flags<const N: usize>(r: [(&'static str, &Rejected); N]) -> Vec<(&'static str, bool)> {
            r.into_iter().map(|(n, v)| (n, v.is_some())).collect()
        }
        for name in RuleSpec::REJECTED {
            present::<RuleSpec>(&format!("{name}: [x]"), |r| flags(r.rejected()), name);
        }
        for name in EgressSpec::REJECTED {
            present::<EgressSpec>(&format!("{name}: [x]"), |r| flags(r.rejected()), name);
        }
        for name in IngressSpec::REJECTED {
            present::<IngressSpec>(&format!("{name}: [x]"), |r| flags(r.rejected()), name);
        }
        for name in CidrRuleSpec::REJECTED {
            present::<CidrRuleSpec>(&format!("{name}: [x]"), |r| flags(r.rejected()), name);
        }
        for name in PortRuleSpec::REJECTED {
            present::<PortRuleSpec>(&format!("{name}: [x]"), |r| flags(r.rejected()), name);
        }
        for name in L7RulesSpec::REJECTED {
            present::<L7RulesSpec>(&format!("{name}: [x]"), |r| flags(r.rejected()), name);
        }
    }

    #[test]
    fn rejected_only_within_its_shape() {
        let rule = ["endpointSelector", "egress", "ingress", "nodeSelector"];
        assert!(is_rejected(&rule, "nodeSelector"));
        assert!(!is_rejected(&rule, "ingress"));
        let default_deny = ["egress", "ingress"];
        assert!(!is_rejected(&default_deny, "ingress"));
        let ports = ["ports", "rules", "listener"];
        assert!(is_rejected(&ports, "listener"));
        assert!(!is_rejected(&ports, "ports"));
    }
}
