//! Warnings: `toFQDNs` selectors that can never learn an address, because no DNS rule of the
//! endpoints their rule selects lets a name they match through the proxy; and allow entries a
//! deny entry shadows entirely.

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
        .filter_map(|w| match w {
            Warning::DeadFqdnSelector { selector, .. } => Some(selector.clone()),
            _ => None,
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

// ---- allow entries a deny shadows ----

/// The allow entries warned about as shadowed: `(line, column, deny line)`.
fn shadowed(text: &str) -> Vec<(u64, u64, u64)> {
    ok(text)
        .warnings
        .iter()
        .filter_map(|w| match w {
            Warning::ShadowedAllow {
                line,
                column,
                deny_line,
                ..
            } => Some((*line, *column, *deny_line)),
            _ => None,
        })
        .collect()
}

/// A rule `name` selecting `selector`, with `body` (lines at the indentation of `spec`).
fn rule(name: &str, selector: &str, body: &str) -> String {
    format!(
        "---\napiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata:\n  name: {name}\nspec:\n  endpointSelector: {selector}\n{body}"
    )
}

/// https://docs.cilium.io/en/latest/security/policy/deny/ — "Deny policies take precedence
/// over allow policies": an allow every packet of which a deny matches allows nothing, and
/// `fqdnd policy check` says so at the allow, naming the deny.
#[test]
fn an_allow_inside_a_deny_is_reported_at_the_allow() {
    let text = rule(
        "web",
        "{}",
        "  egress:\n  - toCIDR: [192.0.2.0/24]\n    toPorts: [{ports: [{port: \"443\", protocol: TCP}]}]\n  - toEntities: [world]\n  egressDeny:\n  - toCIDR: [192.0.2.0/23]\n",
    );
    let allow = find(&text, "toCIDR: [192.0.2.0/24]");
    let deny = find(&text, "toCIDR: [192.0.2.0/23]");
    // The `world` allow is only partly denied: no warning for it.
    assert_eq!(shadowed(&text), [(allow.0, allow.1, deny.0)]);
    let w = ok(&text).warnings.remove(0);
    let message = w.to_string();
    assert!(
        message.contains("this `egress` entry allows nothing")
            && message.contains(&format!("test.yaml:{}:{}", deny.0, deny.1)),
        "{message}"
    );
}

#[test]
fn peers_shadow_by_containment() {
    let cases = [
        // (allow, deny, shadowed)
        (
            "toFQDNs: [{matchName: a.example}]",
            "toEntities: [world]",
            true,
        ),
        (
            "toFQDNs: [{matchName: a.example}]",
            "toCIDR: [0.0.0.0/0]",
            false,
        ),
        ("toCIDR: [10.1.0.0/16]", "toEntities: [world-ipv4]", true),
        ("toCIDR: [10.1.0.0/16]", "toEntities: [world-ipv6]", false),
        (
            "toCIDR: [10.1.0.0/16]",
            "toCIDRSet: [{cidr: 10.0.0.0/8, except: [10.1.2.0/24]}]",
            false,
        ),
        (
            "toCIDRSet: [{cidr: 10.1.0.0/16, except: [10.1.2.0/24]}]",
            "toCIDRSet: [{cidr: 10.0.0.0/8, except: [10.1.2.0/24]}]",
            true,
        ),
        (
            "toCIDR: [10.1.0.0/16]",
            "toCIDRSet: [{cidr: 10.0.0.0/8, except: [10.9.0.0/16]}]",
            true,
        ),
        (
            "toEndpoints: [{matchLabels: {app: b}}]",
            "toEntities: [cluster]",
            true,
        ),
        (
            "toEndpoints: [{matchLabels: {app: b, tier: x}}]",
            "toEndpoints: [{matchLabels: {app: b}}]",
            true,
        ),
        (
            "toEndpoints: [{matchLabels: {app: b}}]",
            "toEndpoints: [{matchLabels: {app: b, tier: x}}]",
            false,
        ),
        ("toEntities: [host]", "toEntities: [cluster]", true),
        ("toEntities: [world]", "toEntities: [all]", true),
        ("toEntities: [world]", "toEntities: [cluster]", false),
        (
            "toPorts: [{ports: [{port: \"80\"}]}]",
            "toEntities: [world]",
            false,
        ),
    ];
    for (allow, deny, want) in cases {
        let text = rule(
            "r",
            "{}",
            &format!("  egress:\n  - {allow}\n  egressDeny:\n  - {deny}\n"),
        );
        assert_eq!(
            shadowed(&text).len(),
            usize::from(want),
            "allow {allow}, deny {deny}"
        );
    }
}

#[test]
fn ports_shadow_by_range_and_protocol() {
    let ports = |p: &str| format!("toCIDR: [10.0.0.0/8]\n    toPorts: [{{ports: [{p}]}}]");
    let cases = [
        ("{port: \"80\", protocol: TCP}", "{port: \"80\"}", true),
        ("{port: \"80\"}", "{port: \"80\", protocol: TCP}", false),
        (
            "{port: \"80\", endPort: 81, protocol: TCP}",
            "{port: \"80\", protocol: TCP}",
            false,
        ),
        (
            "{port: \"80\", endPort: 81, protocol: TCP}",
            "{port: \"1\", endPort: 1024, protocol: ANY}",
            true,
        ),
        (
            "{port: \"80\", protocol: UDP}",
            "{port: \"0\", protocol: ANY}",
            true,
        ),
    ];
    for (allow, deny, want) in cases {
        let text = rule(
            "r",
            "{}",
            &format!(
                "  egress:\n  - {}\n  egressDeny:\n  - {}\n",
                ports(allow),
                ports(deny)
            ),
        );
        assert_eq!(
            shadowed(&text).len(),
            usize::from(want),
            "allow {allow}, deny {deny}"
        );
    }
    // ICMP types by number; a deny of every port of TCP/UDP does not cover ICMP.
    let text = rule(
        "r",
        "{}",
        "  ingress:\n  - fromEntities: [world]\n    icmps: [{fields: [{type: 8}]}]\n  ingressDeny:\n  - fromEntities: [world]\n    icmps: [{fields: [{type: EchoRequest}]}]\n",
    );
    assert_eq!(shadowed(&text).len(), 1);
    let text = rule(
        "r",
        "{}",
        "  ingress:\n  - fromEntities: [world]\n    icmps: [{fields: [{type: 8}]}]\n  ingressDeny:\n  - fromEntities: [world]\n    toPorts: [{ports: [{port: \"0\", protocol: TCP}]}]\n",
    );
    assert!(shadowed(&text).is_empty());
}

/// A deny shadows an allow only for endpoints both rules select: the declared ones, or (none
/// declared) those the deny's rule certainly selects.
#[test]
fn a_deny_of_other_endpoints_shadows_nothing() {
    let allow = rule(
        "allow",
        "{matchLabels: {tier: front}}",
        "  ingress:\n  - fromEntities: [world]\n",
    );
    let deny = |selector: &str| {
        rule(
            "deny",
            selector,
            "  ingressDeny:\n  - fromEntities: [world]\n",
        )
    };
    assert_eq!(shadowed(&format!("{allow}{}", deny("{}"))).len(), 1);
    assert!(shadowed(&format!("{allow}{}", deny("{matchLabels: {app: a}}"))).is_empty());
    let endpoints = format!(
        "{}{}",
        endpoint("a", 1, "{app: a, tier: front}"),
        endpoint("b", 2, "{app: b, tier: front}")
    );
    // a and b are the front; a deny for a alone leaves b's allow.
    assert!(
        shadowed(&format!(
            "{allow}{}{endpoints}",
            deny("{matchLabels: {app: a}}")
        ))
        .is_empty()
    );
    assert_eq!(
        shadowed(&format!(
            "{allow}{}{endpoints}",
            deny("{matchExpressions: [{key: app, operator: In, values: [a, b]}]}")
        ))
        .len(),
        1
    );
    // Directions do not mix: an egress deny shadows no ingress allow.
    let text = format!(
        "{allow}{}",
        rule("deny", "{}", "  egressDeny:\n  - toEntities: [world]\n")
    );
    assert!(shadowed(&text).is_empty());
}
