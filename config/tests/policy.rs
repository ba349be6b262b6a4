//! CiliumNetworkPolicy / CiliumClusterwideNetworkPolicy: what is accepted, and how it maps to
//! the policy model.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use common::{EGRESS, ccnp, cnp, cnp_in, errs, find, messages, ok, one_err, pos};
use std::path::Path;

use fqdnd_config::{Error, Warning, load_str};
use fqdnd_ipcache::policy::{
    DnsRule, EgressRule, LabelSelector, Operator, PeerSelector, PortProtocol, PortRule, Protocol,
    Requirement, Rule,
};

fn req(key: &str, operator: Operator) -> Requirement {
    Requirement {
        key: key.into(),
        operator,
    }
}

fn is_in(key: &str, values: &[&str]) -> Requirement {
    req(
        key,
        Operator::In(values.iter().map(|v| (*v).to_owned()).collect()),
    )
}

fn ns(name: &str) -> Requirement {
    is_in("k8s:io.kubernetes.pod.namespace", &[name])
}

fn net(s: &str) -> ipnet::IpNet {
    s.parse().unwrap()
}

fn pp(port: u16, end_port: u16, protocol: Protocol) -> PortProtocol {
    PortProtocol {
        port,
        end_port,
        protocol,
    }
}

fn only_rule(text: &str) -> Rule {
    let mut config = ok(text);
    assert_eq!(config.rules.len(), 1, "{:#?}", config.rules);
    config.rules.remove(0)
}

#[test]
fn every_accepted_field() {
    let text = r#"apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: everything
  namespace: shop
  labels: {team: payments}
  annotations: {note: "free text"}
  uid: 0b2f7c4e-1111-2222-3333-444455556666
  resourceVersion: "42"
  generation: 3
  creationTimestamp: "2024-01-01T00:00:00Z"
spec:
  description: every field fqdnd reads
  labels:
    - key: io.cilium.k8s.policy.derived-from
      value: test
      source: k8s
  enableDefaultDeny:
    egress: false
    ingress: true
  endpointSelector:
    matchLabels:
      app: checkout
      "k8s:tier": web
    matchExpressions:
      - {key: track, operator: In, values: [stable, canary]}
      - {key: debug, operator: NotIn, values: ["true"]}
      - {key: role, operator: Exists}
      - {key: legacy, operator: DoesNotExist}
  egress:
    - toFQDNs:
        - matchName: API.GitHub.com
        - matchPattern: "*.s3.amazonaws.com."
      toPorts:
        - ports:
            - port: "443"
              protocol: TCP
            - port: 8000
              endPort: 8100
              protocol: udp
    - toCIDR:
        - 10.0.0.0/8
        - 192.0.2.1
        - 2001:db8::/32
    - toCIDRSet:
        - cidr: 172.16.0.0/12
          except: [172.16.1.0/24, 172.17.0.0/16]
    - toEndpoints:
        - matchLabels:
            app: db
        - matchLabels:
            "k8s:io.kubernetes.pod.namespace": kube-system
            "k8s:k8s-app": kube-dns
      toPorts:
        - ports:
            - port: "53"
          rules:
            dns:
              - matchName: example.com
              - matchPattern: "**.example.org"
    - toPorts:
        - ports:
            - port: "0"
              protocol: ANY
status:
  conditions: []
"#;
    let rule = only_rule(text);
    let (line, _) = find(text, "description:");
    assert_eq!(rule.origin, format!("test.yaml:{line} shop/everything"));
    assert!(!rule.default_deny_egress);
    assert_eq!(
        rule.endpoint_selector,
        LabelSelector {
            requirements: vec![
                is_in("app", &["checkout"]),
                is_in("k8s:tier", &["web"]),
                is_in("track", &["stable", "canary"]),
                req("debug", Operator::NotIn(vec!["true".into()])),
                req("role", Operator::Exists),
                req("legacy", Operator::DoesNotExist),
                ns("shop"),
            ]
        }
    );
    assert_eq!(
        rule.egress,
        vec![
            EgressRule {
                peers: vec![
                    PeerSelector::Fqdn("api.github.com.".into()),
                    PeerSelector::Fqdn("*.s3.amazonaws.com.".into()),
                ],
                ports: vec![PortRule {
                    ports: vec![pp(443, 443, Protocol::Tcp), pp(8000, 8100, Protocol::Udp)],
                    dns: None,
                }],
            },
            EgressRule {
                peers: vec![
                    PeerSelector::Cidr {
                        cidr: net("10.0.0.0/8"),
                        except: vec![]
                    },
                    PeerSelector::Cidr {
                        cidr: net("192.0.2.1/32"),
                        except: vec![]
                    },
                    PeerSelector::Cidr {
                        cidr: net("2001:db8::/32"),
                        except: vec![]
                    },
                ],
                ports: vec![],
            },
            EgressRule {
                peers: vec![PeerSelector::Cidr {
                    cidr: net("172.16.0.0/12"),
                    except: vec![net("172.16.1.0/24"), net("172.17.0.0/16")],
                }],
                ports: vec![],
            },
            EgressRule {
                peers: vec![
                    PeerSelector::Endpoints(LabelSelector {
                        requirements: vec![is_in("app", &["db"]), ns("shop")],
                    }),
                    PeerSelector::Endpoints(LabelSelector {
                        requirements: vec![ns("kube-system"), is_in("k8s:k8s-app", &["kube-dns"]),],
                    }),
                ],
                ports: vec![PortRule {
                    ports: vec![pp(53, 53, Protocol::Any)],
                    dns: Some(vec![
                        DnsRule::MatchName("example.com.".into()),
                        DnsRule::MatchPattern("**.example.org.".into()),
                    ]),
                }],
            },
            EgressRule {
                peers: vec![],
                ports: vec![PortRule {
                    ports: vec![pp(0, 0, Protocol::Any)],
                    dns: None
                }],
            },
        ]
    );
}

#[test]
fn specs_list_and_spec_together_give_one_rule_each_with_its_own_origin() {
    let text = r#"apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata:
  name: many
spec:
  endpointSelector: {matchLabels: {app: a}}
  egress: [{toFQDNs: [{matchName: a.example}]}]
specs:
  - endpointSelector: {matchLabels: {app: b}}
    egress: [{toFQDNs: [{matchName: b.example}]}]
  - endpointSelector: {matchLabels: {app: c}}
    egress: [{toFQDNs: [{matchName: c.example}]}]
"#;
    let config = ok(text);
    let origins: Vec<&str> = config.rules.iter().map(|r| r.origin.as_str()).collect();
    assert_eq!(
        origins,
        ["test.yaml:6 many", "test.yaml:9 many", "test.yaml:11 many"]
    );
    let apps: Vec<&Requirement> = config
        .rules
        .iter()
        .map(|r| &r.endpoint_selector.requirements[0])
        .collect();
    assert_eq!(
        apps,
        [
            &is_in("app", &["a"]),
            &is_in("app", &["b"]),
            &is_in("app", &["c"])
        ]
    );
}

#[test]
fn default_deny_follows_enable_default_deny_egress() {
    assert!(only_rule(&cnp(EGRESS)).default_deny_egress);
    let on = format!("  enableDefaultDeny: {{egress: true}}\n{EGRESS}");
    assert!(only_rule(&cnp(&on)).default_deny_egress);
    let off = format!("  enableDefaultDeny: {{egress: false, ingress: false}}\n{EGRESS}");
    assert!(!only_rule(&cnp(&off)).default_deny_egress);
    // Ingress default deny alone is accepted and changes nothing for egress.
    let ingress_only = format!("  enableDefaultDeny: {{ingress: false}}\n{EGRESS}");
    assert!(only_rule(&cnp(&ingress_only)).default_deny_egress);
}

#[test]
fn an_empty_egress_entry_only_enables_default_deny() {
    // `- {}` allows nothing in Cilium: it must not become "every destination, every port".
    let rule = only_rule(&cnp("  egress:\n    - {}\n"));
    assert!(rule.default_deny_egress);
    assert!(rule.egress.is_empty());
    // Empty peer lists are as good as absent.
    let rule = only_rule(&cnp("  egress:\n    - toFQDNs: []\n      toCIDR: []\n"));
    assert!(rule.egress.is_empty());
}

#[test]
fn an_l4_only_entry_allows_every_destination_on_its_ports() {
    let rule = only_rule(&cnp(
        "  egress:\n    - toPorts:\n        - ports: [{port: \"80\", protocol: TCP}]\n",
    ));
    assert_eq!(
        rule.egress,
        [EgressRule {
            peers: vec![],
            ports: vec![PortRule {
                ports: vec![pp(80, 80, Protocol::Tcp)],
                dns: None
            }],
        }]
    );
}

#[test]
fn an_empty_dns_list_asks_for_no_interception() {
    let body = "  egress:\n    - toPorts:\n        - ports: [{port: \"53\"}]\n          rules:\n            dns: []\n";
    let rule = only_rule(&cnp(body));
    assert_eq!(rule.egress[0].ports[0].dns, None);
    let body =
        "  egress:\n    - toPorts:\n        - ports: [{port: \"53\"}]\n          rules: {}\n";
    assert_eq!(only_rule(&cnp(body)).egress[0].ports[0].dns, None);
}

#[test]
fn patterns_are_stored_by_their_canonical_key() {
    let body = "  egress:\n    - toFQDNs:\n        - matchPattern: \"*\"\n        - matchPattern: \"**.\"\n        - matchPattern: \"Sub.*.Example.COM\"\n        - matchName: \"example.com.\"\n";
    let peers = only_rule(&cnp(body)).egress.remove(0).peers;
    let keys: Vec<String> = peers
        .into_iter()
        .map(|p| match p {
            PeerSelector::Fqdn(k) => k,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(keys, ["*", "**.", "sub.*.example.com.", "example.com."]);
}

#[test]
fn cidr_forms() {
    let body = "  egress:\n    - toCIDR: [\"0.0.0.0/0\", \"::/0\", \"fd00::1\", \"10.1.2.3/32\"]\n";
    let peers = only_rule(&cnp(body)).egress.remove(0).peers;
    let cidrs: Vec<String> = peers
        .iter()
        .map(|p| match p {
            PeerSelector::Cidr { cidr, except } if except.is_empty() => cidr.to_string(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(cidrs, ["0.0.0.0/0", "::/0", "fd00::1/128", "10.1.2.3/32"]);
}

#[test]
fn namespaced_policy_scopes_its_endpoints_and_peers() {
    let body = r#"  endpointSelector:
    matchLabels: {app: web}
  egress:
    - toEndpoints:
        - {}
        - matchLabels: {app: db}
        - matchLabels: {"io.kubernetes.pod.namespace": other}
        - matchLabels: {"any:io.kubernetes.pod.namespace": other}
        - matchExpressions:
            - {key: "k8s:io.kubernetes.pod.namespace", operator: NotIn, values: [kube-system]}
        - matchLabels: {"k8s:io.cilium.k8s.namespace.labels.team": blue}
"#;
    let rule = only_rule(&cnp_in("shop", body));
    assert_eq!(
        rule.endpoint_selector.requirements,
        [is_in("app", &["web"]), ns("shop")]
    );
    let peers: Vec<Vec<Requirement>> = rule.egress[0]
        .peers
        .iter()
        .map(|p| match p {
            PeerSelector::Endpoints(sel) => sel.requirements.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        peers,
        [
            vec![ns("shop")],
            vec![is_in("app", &["db"]), ns("shop")],
            vec![is_in("io.kubernetes.pod.namespace", &["other"])],
            vec![is_in("any:io.kubernetes.pod.namespace", &["other"])],
            vec![req(
                "k8s:io.kubernetes.pod.namespace",
                Operator::NotIn(vec!["kube-system".into()])
            )],
            vec![is_in("k8s:io.cilium.k8s.namespace.labels.team", &["blue"])],
        ]
    );
}

#[test]
fn the_endpoint_selector_is_scoped_even_when_it_names_a_namespace() {
    let body = format!(
        "  endpointSelector:\n    matchLabels: {{\"k8s:io.kubernetes.pod.namespace\": other}}\n{EGRESS}"
    );
    let rule = only_rule(&cnp_in("shop", &body));
    assert_eq!(
        rule.endpoint_selector.requirements,
        [ns("other"), ns("shop")],
        "a CiliumNetworkPolicy never reaches outside its namespace"
    );
}

#[test]
fn a_clusterwide_policy_is_not_scoped() {
    let body = "  egress:\n    - toEndpoints: [{matchLabels: {app: db}}]\n";
    let config = load_str(&ccnp(body), Path::new("test.yaml")).unwrap();
    let rule = &config.rules[0];
    assert!(rule.endpoint_selector.requirements.is_empty());
    assert_eq!(
        rule.egress[0].peers,
        [PeerSelector::Endpoints(LabelSelector {
            requirements: vec![is_in("app", &["db"])]
        })]
    );
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

/// A CiliumNetworkPolicy without `metadata.namespace` is in `default`, as `kubectl apply`
/// without `-n` puts it: its endpoints and its peers are scoped to `default` (it used to
/// apply to every namespace, silently), with a warning at `metadata.name`. The same policy
/// written with `namespace: default` is the same one (a duplicate).
#[test]
fn a_policy_without_a_namespace_is_in_default_with_a_warning() {
    let body = "  egress:\n    - toEndpoints: [{matchLabels: {app: db}}]\n";
    let text = cnp(body);
    let config = load_str(&text, Path::new("test.yaml")).unwrap();
    let rule = &config.rules[0];
    assert_eq!(rule.endpoint_selector.requirements, [ns("default")]);
    assert_eq!(
        rule.egress[0].peers,
        [PeerSelector::Endpoints(LabelSelector {
            requirements: vec![is_in("app", &["db"]), ns("default")]
        })]
    );
    let (line, name_column) = find(&text, "name: p");
    let column = name_column + 6;
    assert_eq!(
        config.warnings,
        [Warning::ImplicitNamespace {
            file: "test.yaml".into(),
            line,
            column,
            name: "p".into(),
        }]
    );
    let warning = config.warnings[0].to_string();
    assert!(
        warning.starts_with(&format!("test.yaml:{line}:{column}: warning: CiliumNetworkPolicy \"p\" has no `metadata.namespace`")),
        "{warning}"
    );
    assert!(warning.contains("`default` namespace"), "{warning}");

    let both = format!("{text}---\n{}", cnp_in("default", body));
    let e = one_err(&both);
    assert!(
        e.to_string()
            .contains("CiliumNetworkPolicy \"default/p\" is already declared"),
        "{e}"
    );
}

#[test]
fn clusterwide_policy_with_a_namespace_is_an_error() {
    let text = ccnp(EGRESS).replace("  name: p\n", "  name: p\n  namespace: shop\n");
    let e = one_err(&text);
    assert_eq!(pos(&e), find(&text, "shop"));
    assert!(e.to_string().contains("no namespace"), "{e}");
}

#[test]
fn bad_namespace_names_are_errors() {
    for bad in ["Shop", "-shop", "sh op", "\"\""] {
        let e = one_err(&cnp_in(bad, EGRESS));
        assert!(e.to_string().contains("metadata.namespace"), "{e}");
    }
}

#[test]
fn rule_origin_names_the_file_line_and_policy() {
    let text = format!("# leading comment\n\n{}", cnp_in("shop", EGRESS));
    let rule = only_rule(&text);
    // The line where the rule's fields start.
    assert_eq!(rule.origin, "test.yaml:9 shop/p");
}

#[test]
fn json_documents_are_read_too() {
    let text = r#"{"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
 "metadata": {"name": "j"},
 "spec": {"endpointSelector": {"matchLabels": {"app": "x"}},
          "egress": [{"toFQDNs": [{"matchName": "example.com"}],
                      "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}]}]}}"#;
    let rule = only_rule(text);
    assert_eq!(
        rule.egress[0].peers,
        [PeerSelector::Fqdn("example.com.".into())]
    );
}

#[test]
fn a_policy_with_only_rejected_sections_reports_them_and_nothing_else() {
    let text = cnp("  nodeSelector: {}\n");
    let e = one_err(&text);
    assert!(
        e.to_string().contains("`nodeSelector` is not supported"),
        "{e}"
    );
}

#[test]
fn a_rule_without_egress_is_an_error() {
    for body in ["", "  egress:\n"] {
        let e = one_err(&cnp(body));
        assert!(
            e.to_string()
                .contains("non-empty `egress`, `ingress`, `egressDeny` or `ingressDeny`"),
            "{body:?}: {e}"
        );
    }
}

#[test]
fn a_rule_needs_an_endpoint_selector() {
    let text = format!(
        "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata:\n  name: p\nspec:\n  description: x\n{EGRESS}"
    );
    let e = one_err(&text);
    assert_eq!(pos(&e), find(&text, "description"));
    assert!(e.to_string().contains("needs an `endpointSelector`"), "{e}");
}

#[test]
fn a_policy_needs_metadata_name_and_a_spec() {
    let no_meta = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nspec:\n  endpointSelector: {}\n  egress: [{}]\n";
    assert!(one_err(no_meta).to_string().contains("needs `metadata`"));
    let no_name = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata:\n  namespace: a\nspec:\n  endpointSelector: {}\n  egress: [{}]\n";
    assert!(
        one_err(no_name)
            .to_string()
            .contains("`metadata.name` is required")
    );
    let no_spec = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata:\n  name: p\n";
    assert!(one_err(no_spec).to_string().contains("needs `spec`"));
    let empty_specs =
        "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata:\n  name: p\nspecs: []\n";
    assert!(one_err(empty_specs).to_string().contains("needs `spec`"));
}

#[test]
fn duplicate_policy_names_are_errors_per_kind_and_namespace() {
    let a = cnp_in("shop", EGRESS);
    let text = format!("{a}---\n{a}");
    let e = one_err(&text);
    let second_name_line = a.lines().count() as u64 + 1 + 4;
    match &e {
        Error::Duplicate {
            line,
            first_line,
            item,
            ..
        } => {
            assert_eq!((*line, *first_line), (second_name_line, 4));
            assert_eq!(
                *item,
                fqdnd_config::Duplicated::Policy {
                    kind: "CiliumNetworkPolicy",
                    name: "shop/p".into()
                }
            );
        }
        other => panic!("{other:?}"),
    }
    // Same name, different namespace or kind: fine.
    let text = format!("{a}---\n{}---\n{}", cnp_in("other", EGRESS), ccnp(EGRESS));
    assert_eq!(ok(&text).rules.len(), 3);
}

#[test]
fn label_selector_errors() {
    let cases = [
        ("{matchLabels: {\"\": x}}", "must not be empty"),
        ("{matchLabels: {\"k8s:\": x}}", "`key` or `source:key`"),
        (
            "{matchLabels: {\"reserved:host\": \"\"}}",
            "`selector label reserved:host` is not supported by fqdnd: it is Kubernetes-only",
        ),
        (
            "{matchLabels: {\"fqdn:example.com.\": \"\"}}",
            "`fqdn:` labels",
        ),
        (
            "{matchExpressions: [{key: a, operator: In}]}",
            "needs a non-empty `values`",
        ),
        (
            "{matchExpressions: [{key: a, operator: Exists, values: [x]}]}",
            "takes no `values`",
        ),
        ("{matchExpressions: [{key: a}]}", "needs an `operator`"),
        ("{matchExpressions: [{operator: Exists}]}", "needs a `key`"),
        (
            "{matchExpressions: [{key: a, operator: Gt, values: [\"1\"]}]}",
            "unknown variant",
        ),
    ];
    for (selector, expected) in cases {
        let text = cnp(&format!("  endpointSelector: {selector}\n{EGRESS}"));
        let e = one_err(&text);
        assert!(e.to_string().contains(expected), "{selector}: {e}");
        assert_eq!(pos(&e).0, 6, "{selector}: {e}");
    }
}

#[test]
fn errors_in_many_places_of_one_document_are_all_reported() {
    let body = r#"  endpointSelector: {matchLabels: {"cidr:10.0.0.0/8": ""}}
  egress:
    - toFQDNs: [{matchName: "a..b"}]
    - toCIDR: ["10.0.0.1/8"]
    - toPorts: [{ports: [{port: "http"}]}]
"#;
    let all = messages(&cnp(body));
    assert_eq!(all.len(), 4, "{all:#?}");
}

#[test]
fn two_rule_errors_do_not_hide_the_next_document() {
    let bad = cnp("  egress:\n    - toCIDR: [nope]\n");
    let text = format!("{bad}---\n{}", ccnp(EGRESS));
    let errors = errs(&text);
    assert_eq!(errors.len(), 1, "{errors}");
    let text = format!(
        "{bad}---\n{}",
        ccnp("  egress:\n    - toCIDR: [\"1.2.3.4/8\"]\n")
    );
    assert_eq!(errs(&text).len(), 2);
}
