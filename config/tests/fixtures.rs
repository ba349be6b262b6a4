//! Real-world-style policies, and the embedded example.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::path::{Path, PathBuf};

use fqdnd_config::RejectCode;
use fqdnd_config::{EXAMPLE_POLICY, Error, Settings, load, load_str};
use fqdnd_ipcache::policy::{DnsRule, PeerSelector, PortProtocol, Protocol};
use fqdnd_ipcache::{EndpointId, EndpointLabel};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn the_example_loads() {
    let config = load_str(EXAMPLE_POLICY, Path::new("policy.yaml")).unwrap();
    assert_eq!(
        config.settings,
        Settings {
            reject_response_code: RejectCode::Refused,
            ..Settings::default()
        }
    );

    let web = &config.endpoints[0];
    assert_eq!((web.id, web.name.as_str()), (EndpointId(1), "web"));
    let addresses: Vec<String> = web.addresses.iter().map(ToString::to_string).collect();
    assert_eq!(addresses, ["10.0.1.2/32", "fd00::1:2/128"]);
    // Without `spec.namespace`: in `default`, as a pod created without one.
    assert_eq!(
        web.labels,
        [
            EndpointLabel {
                source: "k8s".into(),
                key: "app".into(),
                value: "web".into()
            },
            EndpointLabel {
                source: "k8s".into(),
                key: "io.kubernetes.pod.namespace".into(),
                value: "default".into()
            }
        ]
    );
    let batch = &config.endpoints[1];
    assert_eq!((batch.id, batch.name.as_str()), (EndpointId(2), "batch"));
    assert_eq!(batch.addresses, ["10.0.2.2/32".parse().unwrap()]);

    let names: Vec<&str> = config
        .rules
        .iter()
        .map(|r| r.origin.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "default/web-dns",
            "default/web-egress",
            "default/batch-egress"
        ]
    );
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);

    let dns = &config.rules[0].egress[0];
    assert_eq!(
        dns.peers,
        [PeerSelector::Cidr {
            cidr: "10.0.0.10/32".parse().unwrap(),
            except: vec![]
        }]
    );
    assert_eq!(
        dns.ports[0].ports,
        [PortProtocol {
            port: 53,
            end_port: 53,
            protocol: Protocol::Any
        }]
    );
    assert_eq!(
        dns.ports[0].dns,
        Some(vec![DnsRule::MatchPattern("*".into())])
    );

    let web_egress = &config.rules[1].egress[0];
    assert_eq!(
        web_egress.peers,
        [
            PeerSelector::Fqdn("api.github.com.".into()),
            PeerSelector::Fqdn("*.s3.amazonaws.com.".into())
        ]
    );
    assert_eq!(web_egress.ports[0].ports[0].protocol, Protocol::Tcp);

    let batch_egress = &config.rules[2].egress;
    assert_eq!(
        batch_egress[0].peers,
        [PeerSelector::Fqdn("**.example.com.".into())]
    );
    assert_eq!(batch_egress[0].ports[0].ports[0].port, 443);
    assert_eq!(
        batch_egress[1].peers,
        [PeerSelector::Cidr {
            cidr: "192.0.2.0/24".parse().unwrap(),
            except: vec!["192.0.2.128/25".parse().unwrap()]
        }]
    );
}

#[test]
fn the_example_file_on_disk_is_the_embedded_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/policy.yaml");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), EXAMPLE_POLICY);
    assert_eq!(load(&[&path]).unwrap().rules.len(), 3);
}

#[test]
fn the_to_fqdns_guide_policy() {
    let path = fixture("to-fqdns.yaml");
    let config = load(&[&path]).unwrap();
    let rule = &config.rules[0];
    assert_eq!(
        rule.origin,
        format!("{}:10 default/mediabot-fqdn", path.display())
    );
    assert_eq!(
        rule.endpoint_selector.requirements.len(),
        3,
        "org, class and the namespace"
    );
    assert_eq!(
        rule.egress[0].peers,
        [PeerSelector::Fqdn("api.github.com.".into())]
    );
    assert!(rule.egress[0].ports.is_empty());
    let PeerSelector::Endpoints(kube_dns) = &rule.egress[1].peers[0] else {
        panic!()
    };
    assert_eq!(
        kube_dns.requirements.len(),
        2,
        "kube-system is named, so not scoped to default"
    );
    assert_eq!(
        rule.egress[1].ports[0].dns,
        Some(vec![DnsRule::MatchPattern("*".into())])
    );
}

#[test]
fn a_kubectl_export() {
    let config = load(&[fixture("kubectl-export.yaml")]).unwrap();
    let rule = &config.rules[0];
    assert!(
        rule.origin.ends_with(" payments/payments-egress"),
        "{}",
        rule.origin
    );
    assert_eq!(rule.egress.len(), 3);
    assert_eq!(
        rule.egress[0].ports[0].ports,
        [
            PortProtocol {
                port: 53,
                end_port: 53,
                protocol: Protocol::Udp
            },
            PortProtocol {
                port: 53,
                end_port: 53,
                protocol: Protocol::Tcp
            }
        ]
    );
}

#[test]
fn an_l7_http_policy_is_refused_by_field() {
    let path = fixture("l7-http.yaml");
    let errors = load(&[&path]).unwrap_err().into_vec();
    let found: Vec<(u64, String, fqdnd_config::Unsupported)> = errors
        .iter()
        .map(|e| match e {
            Error::Unsupported {
                file,
                line,
                field,
                why,
                ..
            } => {
                assert_eq!(file, &path);
                (*line, field.clone(), *why)
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        found,
        [
            (19, "http".to_owned(), fqdnd_config::Unsupported::L7Proxy),
            (
                25,
                "toEntities: kube-apiserver".to_owned(),
                fqdnd_config::Unsupported::KubernetesOnly
            )
        ]
    );
}

#[test]
fn all_fixtures_and_the_example_load_together_but_for_the_refused_one() {
    let paths = [
        fixture("to-fqdns.yaml"),
        fixture("kubectl-export.yaml"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/policy.yaml"),
    ];
    let config = load(&paths).unwrap();
    assert_eq!(config.rules.len(), 5);
    assert_eq!(config.sources, paths);
}
