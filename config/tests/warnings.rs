//! Warnings: `toFQDNs` selectors that can never learn an address, because no DNS rule of the
//! endpoints their rule selects lets a name they match through the proxy.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use common::{find, ok};
use fqdnd_config::{DeadReason, Warning};

/// A CiliumClusterwideNetworkPolicy `name` selecting `selector`, with the given egress entries.
fn policy(name: &str, selector: &str, egress: &str) -> String {
    format!(
        "---\napiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata:\n  name: {name}\nspec:\n  endpointSelector: {selector}\n  egress:\n{egress}"
    )
}

/// An egress entry allowing DNS to kube-dns for names matching `pattern`.
fn dns(pattern: &str) -> String {
    format!(
        "    - toEndpoints: [{{matchLabels: {{k8s-app: kube-dns}}}}]\n      toPorts:\n        - ports: [{{port: \"53\", protocol: ANY}}]\n          rules:\n            dns: [{{matchPattern: \"{pattern}\"}}]\n"
    )
}

/// An egress entry allowing HTTPS to the FQDN selector `entry` (a flow mapping).
fn https_to(entry: &str) -> String {
    format!("    - toFQDNs: [{entry}]\n      toPorts: [{{ports: [{{port: \"443\"}}]}}]\n")
}

fn endpoint(name: &str, id: u16, labels: &str) -> String {
    format!(
        "---\napiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata:\n  name: {name}\nspec:\n  id: {id}\n  addresses: [10.0.0.{id}]\n  labels: {labels}\n"
    )
}

/// The selectors warned about, as written.
fn dead(text: &str) -> Vec<String> {
    ok(text)
        .warnings
        .iter()
        .map(|w| match w {
            Warning::DeadFqdnSelector { selector, .. } => selector.clone(),
            other => panic!("{other:?}"),
        })
        .collect()
}

#[test]
fn a_pattern_no_dns_rule_lets_through_is_dead() {
    let entries = [
        "{matchPattern: \"*.bar.com\"}",
        "{matchName: foo.com}",
        "{matchName: api.foo.com}",
        "{matchPattern: \"*.foo.com\"}",
        "{matchPattern: \"**.foo.com\"}",
        "{matchPattern: \"a*.FOO.com\"}",
        "{matchPattern: \"*\"}",
    ];
    let egress: String = entries.iter().map(|e| https_to(e)).collect();
    let text = policy(
        "web",
        "{matchLabels: {app: web}}",
        &(dns("*.foo.com") + &egress),
    );
    let config = ok(&text);
    assert_eq!(dead(&text), ["*.bar.com", "foo.com"]);
    let warning = &config.warnings[0];
    assert_eq!(warning.position(), find(&text, entries[0]));
    assert_eq!(warning.file(), std::path::Path::new("test.yaml"));
    let (line, column) = find(&text, entries[0]);
    assert_eq!(
        warning.to_string(),
        format!(
            "test.yaml:{line}:{column}: warning: no DNS rule of the endpoints this rule selects \
             lets a name matching `*.bar.com` through: its IPs are never learned (fqdnd learns \
             an answer's IPs under the asked name only, so a name this selector matches only as \
             a CNAME target does not count)"
        )
    );
    assert!(matches!(
        warning,
        Warning::DeadFqdnSelector {
            reason: DeadReason::NoMatchingDnsRule,
            ..
        }
    ));
}

#[test]
fn a_match_everything_dns_rule_keeps_every_selector_alive() {
    let egress = dns("*") + &https_to("{matchPattern: \"*.bar.com\"}");
    assert!(dead(&policy("web", "{}", &egress)).is_empty());
}

#[test]
fn a_port_53_rule_without_dns_rules_lets_every_name_through() {
    for ports in [
        "[{port: \"53\", protocol: UDP}]",
        "[{port: \"50\", endPort: 60}]",
        "[{port: \"0\"}]",
    ] {
        let egress = format!(
            "    - toCIDR: [10.96.0.10/32]\n      toPorts: [{{ports: {ports}}}]\n{}",
            https_to("{matchName: anything.example}")
        );
        assert!(dead(&policy("web", "{}", &egress)).is_empty(), "{ports}");
    }
    // An entry without ports allows every port, DNS included.
    let egress = format!(
        "    - toCIDR: [10.96.0.10/32]\n{}",
        https_to("{matchName: anything.example}")
    );
    assert!(dead(&policy("web", "{}", &egress)).is_empty());
    // Not port 53: dead, and the message says there is no DNS at all.
    let egress = format!(
        "    - toCIDR: [10.96.0.10/32]\n      toPorts: [{{ports: [{{port: \"5353\"}}]}}]\n{}",
        https_to("{matchName: anything.example}")
    );
    let text = policy("web", "{}", &egress);
    let config = ok(&text);
    assert!(matches!(
        &config.warnings[..],
        [Warning::DeadFqdnSelector {
            reason: DeadReason::NoDns,
            ..
        }]
    ));
    assert!(
        config.warnings[0]
            .to_string()
            .contains("may not send DNS through fqdnd (no egress entry allows port 53)"),
        "{}",
        config.warnings[0]
    );
    // Only FQDN peers: that entry reaches no DNS server.
    let egress = format!(
        "    - toFQDNs: [{{matchName: dns.example}}]\n      toPorts: [{{ports: [{{port: \"53\"}}]}}]\n{}",
        https_to("{matchName: anything.example}")
    );
    assert_eq!(
        dead(&policy("web", "{}", &egress)),
        ["dns.example", "anything.example"]
    );
}

#[test]
fn a_dns_rule_for_other_endpoints_does_not_count() {
    let text = format!(
        "{}{}",
        policy("web", "{matchLabels: {app: web}}", &dns("*")),
        policy(
            "db",
            "{matchLabels: {app: db}}",
            &https_to("{matchName: backup.example}")
        ),
    );
    assert_eq!(dead(&text), ["backup.example"]);
    // With the endpoints declared, each is evaluated with the rules that select it.
    let with_endpoints = format!(
        "{text}{}{}",
        endpoint("web", 1, "{app: web}"),
        endpoint("db", 2, "{app: db}")
    );
    assert_eq!(dead(&with_endpoints), ["backup.example"]);
    // An endpoint that both rules select may ask: alive.
    let text = format!(
        "{}{}{}",
        policy("web", "{matchLabels: {tier: front}}", &dns("*")),
        policy(
            "db",
            "{matchLabels: {app: db}}",
            &https_to("{matchName: backup.example}")
        ),
        endpoint("db", 2, "{app: db, tier: front}")
    );
    assert!(dead(&text).is_empty());
}

#[test]
fn a_rule_selecting_every_endpoint_counts_for_all() {
    // A policy file checked alone: a `{}` rule (or any weaker selector) certainly selects the
    // endpoints of every other rule.
    let text = format!(
        "{}{}",
        policy("dns", "{}", &dns("*.example")),
        policy(
            "web",
            "{matchLabels: {app: web, tier: front}}",
            &(https_to("{matchName: api.example}") + &https_to("{matchName: api.other}"))
        ),
    );
    assert_eq!(dead(&text), ["api.other"]);
    let text = format!(
        "{}{}",
        policy("dns", "{matchLabels: {app: web}}", &dns("*.example")),
        policy(
            "web",
            "{matchLabels: {app: web, tier: front}}",
            &https_to("{matchName: api.example}")
        ),
    );
    assert!(dead(&text).is_empty());
}

#[test]
fn a_cname_target_is_not_the_asked_name() {
    // The endpoint asks www.example.com, a CNAME to edge.cdn.example.net: fqdnd learns the
    // addresses under www.example.com only, so a selector for the CDN learns nothing.
    let egress = dns("www.example.com") + &https_to("{matchPattern: \"*.cdn.example.net\"}");
    let text = policy("web", "{}", &egress);
    let config = ok(&text);
    assert_eq!(dead(&text), ["*.cdn.example.net"]);
    assert!(config.warnings[0].to_string().contains("CNAME target"));
}

#[test]
fn without_default_deny_every_name_may_be_asked() {
    let text = format!(
        "{}  enableDefaultDeny: {{egress: false}}\n",
        policy("web", "{}", &https_to("{matchName: api.example}"))
    );
    assert!(dead(&text).is_empty());
}

#[test]
fn per_declared_endpoint_a_selector_is_alive_if_one_of_them_may_ask() {
    let text = format!(
        "{}{}{}{}{}",
        policy(
            "front",
            "{matchLabels: {tier: front}}",
            &https_to("{matchName: api.example}")
        ),
        policy(
            "only-b",
            "{matchLabels: {app: b}}",
            &https_to("{matchName: b.example}")
        ),
        policy("dns-a", "{matchLabels: {app: a}}", &dns("*.example")),
        endpoint("a", 1, "{app: a, tier: front}"),
        endpoint("b", 2, "{app: b, tier: front}"),
    );
    // `front` selects a (which may ask) and b (which may not): alive. `only-b`: dead.
    assert_eq!(dead(&text), ["b.example"]);
}

#[test]
fn the_example_and_the_guide_have_no_dead_selectors() {
    let config = ok(fqdnd_config::EXAMPLE_POLICY);
    assert!(config.warnings.is_empty(), "{:#?}", config.warnings);
    let guide = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/to-fqdns.yaml");
    let config = fqdnd_config::load(&[guide]).unwrap();
    assert!(config.warnings.is_empty(), "{:#?}", config.warnings);
}
