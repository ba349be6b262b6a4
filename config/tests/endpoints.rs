//! `kind: Endpoint` and `kind: ClientGroup`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use common::{errs, find, ok, one_err, pos};
use fqdnd_config::{Duplicated, Error};
use fqdnd_ipcache::{EndpointId, EndpointLabel};

fn doc(kind: &str, name: &str, spec: &str) -> String {
    format!("apiVersion: fqdnd.io/v1\nkind: {kind}\nmetadata:\n  name: {name}\nspec:\n{spec}")
}

fn label(source: &str, key: &str, value: &str) -> EndpointLabel {
    EndpointLabel {
        source: source.into(),
        key: key.into(),
        value: value.into(),
    }
}

#[test]
fn an_endpoint_with_every_field() {
    let text = doc(
        "Endpoint",
        "web",
        "  id: 7\n  addresses: [10.0.1.2, \"fd00::1:2\", 10.0.1.3/32]\n  namespace: shop\n  labels:\n    app: web\n    \"container:role\": front\n    empty: \"\"\n",
    );
    let config = ok(&text);
    let e = &config.endpoints[0];
    assert_eq!(e.id, EndpointId(7));
    assert_eq!(e.name, "web");
    let addresses: Vec<String> = e.addresses.iter().map(ToString::to_string).collect();
    assert_eq!(addresses, ["10.0.1.2/32", "fd00::1:2/128", "10.0.1.3/32"]);
    assert_eq!(
        e.labels,
        [
            label("k8s", "io.kubernetes.pod.namespace", "shop"),
            label("k8s", "app", "web"),
            label("container", "role", "front"),
            label("k8s", "empty", ""),
        ]
    );
}

#[test]
fn a_client_group_takes_cidrs() {
    let text = doc(
        "ClientGroup",
        "office",
        "  id: 100\n  addresses: [192.168.0.0/16, 10.9.9.9, \"2001:db8:1::/48\"]\n",
    );
    let addresses: Vec<String> = ok(&text).endpoints[0]
        .addresses
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        addresses,
        ["192.168.0.0/16", "10.9.9.9/32", "2001:db8:1::/48"]
    );
}

#[test]
fn endpoint_errors_are_located() {
    let cases = [
        (
            "Endpoint",
            "  id: 1\n  addresses: [10.0.0.0/24]\n",
            "10.0.0.0/24",
            "single IPs",
        ),
        (
            "ClientGroup",
            "  id: 1\n  addresses: [10.0.0.1/24]\n",
            "10.0.0.1/24",
            "write it as 10.0.0.0/24",
        ),
        (
            "Endpoint",
            "  id: 1\n  addresses: [web.example]\n",
            "web.example",
            "not an IP address",
        ),
        (
            "Endpoint",
            "  id: 0\n  addresses: [10.0.0.1]\n",
            "0\n",
            "`id` must be a whole number from 1 to 65535, not 0",
        ),
        (
            "Endpoint",
            "  id: 65536\n  addresses: [10.0.0.1]\n",
            "65536",
            "not 65536",
        ),
        (
            "Endpoint",
            "  id: \"3\"\n  addresses: [10.0.0.1]\n",
            "\"3\"",
            "not \"3\"",
        ),
        (
            "Endpoint",
            "  id: 1\n  addresses: []\n",
            "id",
            "at least one address",
        ),
        (
            "Endpoint",
            "  addresses: [10.0.0.1]\n",
            "addresses",
            "`spec.id` is required",
        ),
        (
            "Endpoint",
            "  id: 1\n  addresses: [10.0.0.1, 10.0.0.1]\n",
            "10.0.0.1]",
            "listed twice",
        ),
        (
            "Endpoint",
            "  id: 1\n  addresses: [10.0.0.1]\n  namespace: Shop\n",
            "Shop",
            "spec.namespace",
        ),
        (
            "Endpoint",
            "  id: 1\n  addresses: [10.0.0.1]\n  labels: {\"reserved:host\": \"\"}\n",
            "\"reserved:host\"",
            "not allowed on an endpoint",
        ),
        (
            "Endpoint",
            "  id: 1\n  addresses: [10.0.0.1]\n  labels: {\"fqdn:api.example.com.\": \"\"}\n",
            "\"fqdn:",
            "not allowed",
        ),
        (
            "Endpoint",
            "  id: 1\n  addresses: [10.0.0.1]\n  labels: {\"cidr:10.0.0.0/8\": \"\"}\n",
            "\"cidr:",
            "not allowed",
        ),
        (
            "Endpoint",
            "  id: 1\n  addresses: [10.0.0.1]\n  labels: {\"any:app\": x}\n",
            "\"any:app\"",
            "not allowed",
        ),
        (
            "Endpoint",
            "  id: 1\n  addresses: [10.0.0.1]\n  labels: {\":app\": x}\n",
            "\":app\"",
            "`key` or `source:key`",
        ),
        (
            "Endpoint",
            "  id: 1\n  addresses: [10.0.0.1]\n  labels: {\"a b\": x}\n",
            "\"a b\"",
            "whitespace",
        ),
        (
            "Endpoint",
            "  id: 1\n  addresses: [10.0.0.1]\n  labels: {app: x, \"k8s:app\": y}\n",
            "\"k8s:app\"",
            "label k8s:app is given twice",
        ),
        (
            "Endpoint",
            "  id: 1\n  addresses: [10.0.0.1]\n  namespace: a\n  labels: {\"io.kubernetes.pod.namespace\": b}\n",
            "\"io.kubernetes",
            "given twice",
        ),
        (
            "Endpoint",
            "  id: 1\n  adresses: [10.0.0.1]\n",
            "adresses",
            "unknown field `adresses`: expected one of `id`, `addresses`, `labels`, `namespace`",
        ),
    ];
    for (kind, spec, at, expected) in cases {
        let text = doc(kind, "x", spec);
        let e = one_err(&text);
        assert!(matches!(e, Error::Invalid { .. }), "{spec}: {e:?}");
        assert_eq!(pos(&e), find(&text, at), "{spec}: {e}");
        assert!(
            e.to_string().contains(expected),
            "{spec}: expected {expected:?} in {e}"
        );
    }
}

#[test]
fn endpoint_documents_need_metadata_and_spec() {
    let e =
        one_err("apiVersion: fqdnd.io/v1\nkind: Endpoint\nspec: {id: 1, addresses: [10.0.0.1]}\n");
    assert!(e.to_string().contains("needs `metadata`"), "{e}");
    let e = one_err("apiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata: {name: x}\n");
    assert!(e.to_string().contains("needs a `spec`"), "{e}");
    let e = one_err(
        "apiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata: {name: x, namespace: y}\nspec: {id: 1, addresses: [10.0.0.1]}\n",
    );
    assert!(
        e.to_string()
            .contains("write the namespace as `spec.namespace`"),
        "{e}"
    );
}

#[test]
fn ids_names_and_addresses_are_unique_across_both_kinds() {
    let text = format!(
        "{}---\n{}---\n{}",
        doc("Endpoint", "a", "  id: 1\n  addresses: [10.0.0.1]\n"),
        doc("ClientGroup", "b", "  id: 1\n  addresses: [10.0.0.0/24]\n"),
        doc("ClientGroup", "a", "  id: 2\n  addresses: [10.0.0.1/32]\n"),
    );
    let errors = errs(&text).into_vec();
    let items: Vec<(Duplicated, u64, u64)> = errors
        .iter()
        .map(|e| match e {
            Error::Duplicate {
                item,
                line,
                first_line,
                ..
            } => (item.clone(), *line, *first_line),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        items,
        [
            (Duplicated::EndpointId(1), 14, 6),
            (Duplicated::EndpointName("a".into()), 20, 4),
            (Duplicated::Address("10.0.0.1/32".parse().unwrap()), 23, 7),
        ]
    );
    assert!(
        errors[0]
            .to_string()
            .ends_with("endpoint id 1 is already declared at test.yaml:6:7"),
        "{}",
        errors[0]
    );
}

#[test]
fn overlapping_client_groups_are_fine() {
    let text = format!(
        "{}---\n{}",
        doc("ClientGroup", "all", "  id: 1\n  addresses: [10.0.0.0/8]\n"),
        doc("Endpoint", "one", "  id: 2\n  addresses: [10.1.2.3]\n"),
    );
    assert_eq!(ok(&text).endpoints.len(), 2);
}
