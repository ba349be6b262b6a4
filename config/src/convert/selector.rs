//! Label selectors (`endpointSelector`, `toEndpoints[]`) and the namespace a
//! CiliumNetworkPolicy confines them to.

use fqdnd_ipcache::policy::{LabelSelector, Operator, Requirement};
use serde_saphyr::Spanned;

use crate::cnp::{OperatorSpec, SelectorSpec};
use crate::yaml::{Diag, Text, at, sanitize};

/// The Kubernetes namespace label every pod carries.
pub(crate) const NAMESPACE_KEY: &str = "io.kubernetes.pod.namespace";
/// Cilium's prefix for the labels of a pod's namespace.
const NAMESPACE_LABELS_PREFIX: &str = "io.cilium.k8s.namespace.labels.";

/// The namespace a CiliumNetworkPolicy is confined to.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scope<'a> {
    pub(super) namespace: Option<&'a str>,
}

impl Scope<'_> {
    /// Confines `selector` to the policy's namespace. For the rule's own endpoints this is
    /// unconditional; for `toEndpoints` only when the selector says nothing about namespaces
    /// (so a CiliumNetworkPolicy may name peers in other namespaces explicitly), as in Cilium.
    pub(super) fn confine(self, selector: &mut LabelSelector, peer: bool) {
        let Some(ns) = self.namespace else { return };
        if peer
            && selector
                .requirements
                .iter()
                .any(|r| constrains_namespace(&r.key))
        {
            return;
        }
        selector.requirements.push(Requirement {
            key: format!("k8s:{NAMESPACE_KEY}"),
            operator: Operator::In(vec![ns.to_owned()]),
        });
    }
}

fn constrains_namespace(key: &str) -> bool {
    let bare = match key.split_once(':') {
        Some(("k8s" | "any", rest)) => rest,
        Some(_) => return false,
        None => key,
    };
    bare == NAMESPACE_KEY || bare.starts_with(NAMESPACE_LABELS_PREFIX)
}

/// A label selector. Keys may carry a source (`k8s:app`); `reserved:`, `fqdn:` and `cidr:`
/// keys are refused (they select identities fqdnd derives itself, never endpoint labels).
pub(super) fn selector(spec: &Spanned<SelectorSpec>, diag: &mut Diag<'_>) -> Option<LabelSelector> {
    let before = diag.count();
    let mut requirements = Vec::new();
    for (key, value) in spec.value.match_labels.iter().flat_map(|p| &p.0) {
        if let Some(key) = selector_key(key, diag) {
            requirements.push(Requirement {
                key,
                operator: Operator::In(vec![value.value.clone()]),
            });
        }
    }
    for expr in spec.value.match_expressions.iter().flatten() {
        let e = &expr.value;
        let key = match &e.key {
            Some(k) => selector_key(k, diag),
            None => {
                diag.missing(
                    at(expr),
                    &["key"],
                    "a `matchExpressions` entry needs a `key`",
                );
                None
            }
        };
        let Some(op) = &e.operator else {
            diag.missing(at(expr), &["operator"], "a `matchExpressions` entry needs an `operator` (In, NotIn, Exists or DoesNotExist)");
            continue;
        };
        let values: Vec<String> = e.values.iter().flatten().map(|v| v.value.clone()).collect();
        let operator = match op.value {
            OperatorSpec::In | OperatorSpec::NotIn if values.is_empty() => {
                diag.invalid(
                    at(op),
                    format!("operator {:?} needs a non-empty `values` list", op.value),
                );
                continue;
            }
            OperatorSpec::Exists | OperatorSpec::DoesNotExist if !values.is_empty() => {
                diag.invalid(at(op), format!("operator {:?} takes no `values`", op.value));
                continue;
            }
            OperatorSpec::In => Operator::In(values),
            OperatorSpec::NotIn => Operator::NotIn(values),
            OperatorSpec::Exists => Operator::Exists,
            OperatorSpec::DoesNotExist => Operator::DoesNotExist,
        };
        if let Some(key) = key {
            requirements.push(Requirement { key, operator });
        }
    }
    (diag.count() == before).then_some(LabelSelector { requirements })
}

fn selector_key(key: &Text, diag: &mut Diag<'_>) -> Option<String> {
    let k = key.value.as_str();
    if let Some(("reserved", rest)) = k.split_once(':')
        && !rest.is_empty()
    {
        // `reserved:health`, `reserved:init`, `reserved:host`…: Cilium's own pods and nodes.
        diag.unsupported(
            at(key),
            k,
            format!("selector label {k}"),
            crate::error::Unsupported::KubernetesOnly,
        );
        return None;
    }
    let problem = if k.is_empty() {
        Some("a label key must not be empty".to_owned())
    } else if k.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some(format!("label key {:?} contains whitespace", sanitize(k)))
    } else {
        match k.split_once(':') {
            Some((source, rest)) if source.is_empty() || rest.is_empty() => {
                Some(format!("label key {k:?} must be `key` or `source:key`"))
            }
            Some((source @ ("reserved" | "fqdn" | "cidr"), _)) => Some(format!(
                "label key {k:?}: `{source}:` labels belong to identities Cilium derives itself \
                 (reserved entities, DNS names, CIDRs), which fqdnd does not select by label; \
                 select endpoints by their own labels"
            )),
            _ => None,
        }
    };
    match problem {
        Some(message) => {
            diag.invalid(at(key), message);
            None
        }
        None => Some(k.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_constraints() {
        for key in [
            "io.kubernetes.pod.namespace",
            "k8s:io.kubernetes.pod.namespace",
            "any:io.kubernetes.pod.namespace",
            "k8s:io.cilium.k8s.namespace.labels.team",
        ] {
            assert!(constrains_namespace(key), "{key}");
        }
        for key in [
            "app",
            "container:io.kubernetes.pod.namespace",
            "io.kubernetes.pod.name",
        ] {
            assert!(!constrains_namespace(key), "{key}");
        }
    }

    #[test]
    fn confine_adds_the_namespace() {
        let scope = Scope {
            namespace: Some("shop"),
        };
        let mut own = LabelSelector::default();
        scope.confine(&mut own, false);
        let ns = Requirement {
            key: "k8s:io.kubernetes.pod.namespace".into(),
            operator: Operator::In(vec!["shop".into()]),
        };
        assert_eq!(own.requirements, std::slice::from_ref(&ns));
        let mut peer = LabelSelector {
            requirements: vec![ns.clone()],
        };
        scope.confine(&mut peer, true);
        assert_eq!(
            peer.requirements,
            std::slice::from_ref(&ns),
            "a peer naming a namespace keeps it"
        );
        let mut own = LabelSelector {
            requirements: vec![ns.clone()],
        };
        scope.confine(&mut own, false);
        assert_eq!(
            own.requirements,
            [ns.clone(), ns],
            "the subject is always confined"
        );
        let mut any = LabelSelector::default();
        Scope { namespace: None }.confine(&mut any, true);
        assert!(any.requirements.is_empty());
    }
}
