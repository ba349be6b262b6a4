//! `kind: Cluster`: cluster mode's document, and its errors with their locations.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use common::{messages, ok};

const HEAD: &str = "apiVersion: fqdnd.io/v1\nkind: Cluster\nspec:\n";

#[test]
fn a_cluster_document_with_every_field() {
    let c = ok(&format!(
        "{HEAD}  endpoints: [\"https://10.0.0.1:2379\", \"https://10.0.0.2:2379\"]\n  tls: {{ca: pki/ca.pem, cert: pki/node.pem, key: pki/node-key.pem}}\n  prefix: /prod/fqdnd/\n  nodeName: node-7\n  leaseTTL: 20s\n  identityGCGrace: 30m\n  gatewayGroup: edge-1\n"
    ))
    .cluster
    .unwrap();
    assert_eq!(c.endpoints.len(), 2);
    assert_eq!(c.prefix, "/prod/fqdnd");
    assert_eq!(c.node_name.as_deref(), Some("node-7"));
    assert_eq!(c.lease_ttl, Duration::from_secs(20));
    assert_eq!(c.identity_gc_grace, Duration::from_secs(1800));
    assert_eq!(c.gateway_group.as_deref(), Some("edge-1"));
    let tls = c.tls.unwrap();
    assert_eq!(tls.ca, Some(PathBuf::from("pki/ca.pem")));
    assert_eq!(tls.key, Some(PathBuf::from("pki/node-key.pem")));
}

#[test]
fn the_defaults() {
    let c = ok(&format!("{HEAD}  endpoints: [\"http://127.0.0.1:2379\"]\n"))
        .cluster
        .unwrap();
    assert_eq!(c.prefix, "/fqdnd");
    assert_eq!(c.node_name, None);
    assert_eq!(c.lease_ttl, Duration::from_secs(15));
    assert_eq!(c.identity_gc_grace, Duration::from_secs(600));
    assert!(c.tls.is_none());
    assert_eq!(c.gateway_group, None);
    assert!(ok(common::EGRESS_POLICY).cluster.is_none());
}

#[test]
fn every_mistake_is_located() {
    let text = format!(
        "{HEAD}  endpoints: [\"127.0.0.1:2379\", \"http://a:1/x\", \"http://ok:1\"]\n  tls: {{cert: c.pem}}\n  prefix: fqdnd\n  nodeName: \"no/slash\"\n  leaseTTL: 1s\n  identityGCGrace: soon\n  endpoint: typo\n  gatewayGroup: \"a b\"\n"
    );
    let m = messages(&text);
    let has = |at: &str, what: &str| {
        assert!(
            m.iter().any(|e| e.starts_with(at) && e.contains(what)),
            "no `{at}…{what}` in {m:#?}"
        );
    };
    has("test.yaml:4:", "not an etcd member URL");
    has("test.yaml:5:", "needs both `cert` and `key`");
    has("test.yaml:5:", "TLS members are `https://`");
    has("test.yaml:6:", "`prefix`");
    has("test.yaml:7:", "`nodeName`");
    has("test.yaml:8:", "`leaseTTL` must be between 2s and 1h");
    has("test.yaml:9:", "`identityGCGrace`");
    has("test.yaml:10:", "endpoint");
    has("test.yaml:11:", "`gatewayGroup`");
}

/// A member URL that cannot be dialled is a configuration error at its place, not a client
/// that starts and stays silent.
#[test]
fn member_urls_need_a_host_and_a_port_of_1_to_65535() {
    for bad in [
        "http://127.0.0.1:notaport",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:0",
        "http://127.0.0.1",
        "http://:2379",
        "http://[::1:2379",
        "http://a b:2379",
        "etcd://127.0.0.1:2379",
    ] {
        let m = messages(&format!("{HEAD}  endpoints:\n    - \"{bad}\"\n"));
        assert!(
            m.iter()
                .any(|e| e.starts_with("test.yaml:5:7:") && e.contains("not an etcd member URL")),
            "{bad}: {m:#?}"
        );
    }
    for good in [
        "http://127.0.0.1:2379",
        "https://etcd-1.example.org:2379",
        "http://[::1]:2379",
        "http://[fd00::10]:2379/",
    ] {
        let config = ok(&format!("{HEAD}  endpoints: [\"{good}\"]\n"));
        assert_eq!(config.cluster.unwrap().endpoints, vec![good.to_owned()]);
    }
}

#[test]
fn no_endpoints_and_a_second_document_are_errors() {
    let m = messages(&format!("{HEAD}  prefix: /x\n"));
    assert!(
        m.iter().any(|e| e.contains("at least one etcd member")),
        "{m:#?}"
    );
    let doc = format!("{HEAD}  endpoints: [\"http://127.0.0.1:2379\"]\n");
    let m = messages(&format!("{doc}---\n{doc}"));
    assert!(
        m.iter()
            .any(|e| e.starts_with("test.yaml:6:1:") && e.contains("`kind: Cluster`")),
        "{m:#?}"
    );
}

#[test]
fn shared_policies_are_the_files_policy_documents_each_on_its_own() {
    let text = format!(
        "{}---\napiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {{name: all}}\nspec:\n  endpointSelector: {{}}\n  egress: [{{toEndpoints: [{{matchLabels: {{app: db}}}}]}}]\n",
        common::cnp_in("prod", common::EGRESS)
    );
    let shared = fqdnd_config::shared_policies(&text, std::path::Path::new("p.yaml")).unwrap();
    let names: Vec<&str> = shared.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["cnp/prod/p", "ccnp/all"]);
    assert_eq!(shared[1].line, 11);
    // Each document loads on its own, as a node reads it back.
    for p in &shared {
        assert_eq!(ok(&p.text).rules.len(), 1);
    }
    // A broken policy is refused with its location; so is a document of another kind.
    let broken = common::cnp("  egress:\n    - toFQDNs:\n        - matchNam: x\n");
    let errors =
        fqdnd_config::shared_policies(&broken, std::path::Path::new("p.yaml")).unwrap_err();
    assert!(
        errors
            .iter()
            .next()
            .unwrap()
            .to_string()
            .starts_with("p.yaml:9:"),
        "{errors}"
    );
    let endpoint = format!(
        "{}---\napiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata: {{name: a}}\nspec: {{id: 1, addresses: [10.0.0.1]}}\n",
        common::EGRESS_POLICY
    );
    let errors = fqdnd_config::shared_policies(&endpoint, std::path::Path::new("p.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        errors.starts_with("p.yaml:10:1:") && errors.contains("`Endpoint`"),
        "{errors}"
    );
}

fn origin(name: &str) -> PathBuf {
    PathBuf::from(format!("etcd:/p/policies/{name}"))
}

#[test]
fn shared_documents_load_one_by_one_and_a_broken_one_is_refused_alone() {
    let text = format!(
        "{}---\napiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {{name: all}}\nspec:\n  endpointSelector: {{}}\n  egress: [{{toEndpoints: [{{matchLabels: {{app: db}}}}]}}]\n",
        common::cnp_in("prod", common::EGRESS)
    );
    let shared = fqdnd_config::shared_policies(&text, std::path::Path::new("p.yaml")).unwrap();
    let mut docs: BTreeMap<String, String> = shared
        .iter()
        .map(|p| (p.name.clone(), p.text.clone()))
        .collect();
    let mut set = fqdnd_config::SharedPolicySet::default();
    let update = set.update(&docs, origin);
    assert_eq!(
        update.applied,
        vec!["ccnp/all".to_owned(), "cnp/prod/p".to_owned()]
    );
    assert!(update.rules_changed() && update.refused.is_empty());
    // What the whole file holds, document by document; each rule located at its key.
    let rules: Vec<_> = set.rules().collect();
    let whole = ok(&text).rules;
    assert_eq!(rules.len(), whole.len());
    assert!(rules[0].origin.starts_with("etcd:/p/policies/ccnp/all:"));
    assert!(rules[1].origin.starts_with("etcd:/p/policies/cnp/prod/p:"));
    assert_eq!(rules[1].egress, whole[0].egress);
    // One broken document (written to the store by something other than `policy apply`) is
    // refused alone, its error naming its key; the others stay in force.
    docs.insert("ccnp/broken".into(), "this: [is not".into());
    let update = set.update(&docs, origin);
    assert!(!update.rules_changed());
    assert_eq!(update.refused.len(), 1);
    assert!(
        update.refused[0].1[0].starts_with("etcd:/p/policies/ccnp/broken:"),
        "{:?}",
        update.refused
    );
    assert_eq!(set.documents(), 2);
    assert_eq!(set.rules().count(), 2);
    // The same broken text is not loaded or reported again.
    assert_eq!(
        set.update(&docs, origin),
        fqdnd_config::SharedUpdate::default()
    );
    // A deletion takes effect whatever the broken document holds.
    docs.remove("ccnp/all");
    let update = set.update(&docs, origin);
    assert_eq!(update.removed, vec!["ccnp/all".to_owned()]);
    assert_eq!(set.rules().count(), 1);
    // A broken new version of an accepted document leaves the previous version in force.
    let good = docs["cnp/prod/p"].clone();
    docs.insert("cnp/prod/p".into(), "spec: [oops".into());
    let update = set.update(&docs, origin);
    assert_eq!(update.kept_previous, vec!["cnp/prod/p".to_owned()]);
    assert_eq!(
        set.accepted().collect::<Vec<_>>(),
        vec![("cnp/prod/p", good.as_str())]
    );
    assert_eq!(set.refused().count(), 2);
    // Repaired, it applies; the refusal is gone.
    docs.insert("cnp/prod/p".into(), good);
    docs.remove("ccnp/broken");
    assert!(set.update(&docs, origin).applied.is_empty());
    assert_eq!(set.refused().count(), 0);
    // A document that is not a policy is not shared, even if it loads.
    let endpoint = "apiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata: {name: a}\nspec: {id: 1, addresses: [10.0.0.1]}\n";
    docs.insert("ep".into(), endpoint.into());
    let update = set.update(&docs, origin);
    assert!(update.refused[0].1[0].contains("`Endpoint`"), "{update:?}");
    assert_eq!(set.documents(), 1);
}
