//! What is refused, with a message naming the field and the position of the offending value.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use common::{EGRESS, cnp, find, one_err, pos};
use fqdnd_config::Error;

/// Asserts `text` has exactly one error, an `Invalid` at the first occurrence of `at`, whose
/// message contains `expected`.
#[track_caller]
fn invalid_at(text: &str, at: &str, expected: &str) {
    let e = one_err(text);
    assert!(matches!(e, Error::Invalid { .. }), "{e:?}");
    assert_eq!(pos(&e), find(text, at), "{e}");
    assert!(
        e.to_string().contains(expected),
        "expected {expected:?} in: {e}"
    );
}

#[test]
fn every_unsupported_field_is_rejected_by_name_at_its_key() {
    // A block sequence below the key, as usually written.
    let mut texts = vec![(
        "nodeSelector",
        cnp(&format!("  nodeSelector:\n  - {{marker: 1}}\n{EGRESS}")),
    )];
    for field in [
        "toServices",
        "toGroups",
        "toRequires",
        "toNodes",
        "authentication",
    ] {
        let body = format!("  egress:\n    - toCIDR: [10.0.0.0/8]\n      {field}: [marker]\n");
        texts.push((field, cnp(&body)));
    }
    for field in [
        "originatingTLS",
        "terminatingTLS",
        "serverNames",
        "listener",
    ] {
        let body = format!(
            "  egress:\n    - toPorts:\n        - ports: [{{port: \"443\"}}]\n          {field}: [marker]\n"
        );
        texts.push((field, cnp(&body)));
    }
    for field in ["http", "kafka", "l7proto", "l7"] {
        let body = format!(
            "  egress:\n    - toPorts:\n        - ports: [{{port: \"80\"}}]\n          rules:\n            {field}:\n            # a comment\n              - marker\n"
        );
        texts.push((field, cnp(&body)));
    }
    for field in ["cidrGroupRef", "cidrGroupSelector"] {
        let body = format!("  egress:\n    - toCIDRSet:\n        - {{\"{field}\": [marker]}}\n");
        texts.push((field, cnp(&body)));
    }
    for (field, text) in texts {
        let e = one_err(&text);
        if field == "toRequires" {
            assert!(matches!(e, Error::Invalid { .. }), "{e:?}");
        } else {
            assert!(
                matches!(&e, Error::Unsupported { field: f, .. } if f == field),
                "{e:?}"
            );
        }
        let quoted = format!("\"{field}\"");
        let at = if text.contains(&quoted) {
            find(&text, &quoted)
        } else {
            find(&text, &format!("{field}:"))
        };
        assert_eq!(pos(&e), at, "{field}: {e}");
        assert!(
            e.to_string()
                .contains(&format!("`{field}` is not supported by fqdnd")),
            "{e}"
        );
    }
}

#[test]
fn rejection_message_says_why() {
    let text = cnp(&format!(
        "{EGRESS}      toServices: [{{k8sService: {{serviceName: x}}}}]\n"
    ));
    let e = one_err(&text);
    assert!(
        e.to_string()
            .contains("`toServices` is not supported by fqdnd: it is Kubernetes-only"),
        "{e}"
    );
}

#[test]
fn even_an_empty_rejected_field_is_rejected() {
    let text = cnp(&format!("  nodeSelector: {{}}\n{EGRESS}"));
    let e = one_err(&text);
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    assert_eq!(pos(&e), find(&text, "nodeSelector"));
    assert!(
        e.to_string().contains("`nodeSelector` is not supported"),
        "{e}"
    );
}

#[test]
fn a_typo_lists_the_expected_fields_but_not_the_rejected_ones() {
    let text = cnp("  egress:\n    - toFQDN:\n        - matchName: example.com\n");
    let e = one_err(&text);
    assert_eq!(pos(&e), find(&text, "toFQDN:"));
    let message = e.to_string();
    assert!(
        message.ends_with(
            "unknown field `toFQDN`: expected one of `toFQDNs`, `toCIDR`, `toCIDRSet`, `toEndpoints`, `toPorts`, `toEntities`, `icmps`"
        ),
        "{message}"
    );

    let text = cnp(&format!("  endpointSelectr: {{}}\n{EGRESS}"));
    let message = one_err(&text).to_string();
    assert!(
        message.contains("unknown field `endpointSelectr`"),
        "{message}"
    );
    for expected in [
        "`endpointSelector`",
        "`egress`",
        "`enableDefaultDeny`",
        "`description`",
    ] {
        assert!(message.contains(expected), "{message}");
    }
    assert!(message.contains("`ingress`"), "{message}");
    assert!(!message.contains("nodeSelector"), "{message}");

    for (typo, line) in [("matchLabel", "    matchLabel: {}\n"), ("matchNames", "")] {
        let text = if line.is_empty() {
            cnp("  egress:\n    - toFQDNs: [{matchNames: x.com}]\n")
        } else {
            cnp(&format!("  endpointSelector:\n{line}{EGRESS}"))
        };
        assert!(
            one_err(&text)
                .to_string()
                .contains(&format!("unknown field `{typo}`"))
        );
    }
    let text = cnp(&format!("  enableDefaultDeny: {{egres: false}}\n{EGRESS}"));
    assert!(
        one_err(&text)
            .to_string()
            .contains("expected one of `egress`, `ingress`")
    );
    let text = cnp(&format!("{EGRESS}  sepc: 1\n")).replace("  sepc", "sepc");
    assert!(one_err(&text).to_string().contains("unknown field `sepc`: expected one of `apiVersion`, `kind`, `metadata`, `spec`, `specs`, `status`"));
}

#[test]
fn bad_patterns_point_at_the_pattern() {
    let cases = [
        (
            "matchName",
            "\"*.example.com\"",
            "'*' is not allowed in a matchName",
        ),
        ("matchName", "\"exa mple.com\"", "invalid character"),
        ("matchName", "\".example.com\"", "starts with a dot"),
        ("matchPattern", "\"*..example.com\"", "two dots in a row"),
        ("matchPattern", "\"a.b/c\"", "invalid character '/'"),
        ("matchPattern", "\"\"", "empty pattern"),
        (
            "matchName",
            "\" example.com\"",
            "leading or trailing whitespace",
        ),
        ("matchName", "\".\"", "starts with a dot"),
    ];
    for (field, value, expected) in cases {
        let text = cnp(&format!(
            "  egress:\n    - toFQDNs:\n        - {field}: {value}\n"
        ));
        invalid_at(&text, value, expected);
        let text = cnp(&format!(
            "  egress:\n    - toPorts:\n        - ports: [{{port: \"53\"}}]\n          rules:\n            dns:\n              - {field}: {value}\n"
        ));
        invalid_at(&text, value, expected);
    }
    let long = format!("{}.com", "a".repeat(260));
    let text = cnp(&format!(
        "  egress:\n    - toFQDNs: [{{matchName: {long}}}]\n"
    ));
    invalid_at(&text, &long, "at most 255");
}

#[test]
fn a_selector_takes_exactly_one_of_name_and_pattern() {
    let text =
        cnp("  egress:\n    - toFQDNs:\n        - {matchName: a.com, matchPattern: \"*.a.com\"}\n");
    invalid_at(&text, "{matchName", "not both");
    let text = cnp("  egress:\n    - toFQDNs:\n        - {}\n");
    let e = one_err(&text);
    let (line, column) = find(&text, "- {}");
    assert_eq!(pos(&e), (line, column + 2));
    assert!(
        e.to_string()
            .contains("needs `matchName` or `matchPattern`"),
        "{e}"
    );
}

#[test]
fn bad_cidrs_point_at_the_cidr() {
    let cases = [
        (
            "toCIDR: [\"10.0.0.1/8\"]",
            "\"10.0.0.1/8\"",
            "has host bits set: write it as 10.0.0.0/8",
        ),
        (
            "toCIDR: [\"2001:db8::1/32\"]",
            "\"2001:db8",
            "write it as 2001:db8::/32",
        ),
        (
            "toCIDR: [\"10.0.0.0/33\"]",
            "\"10.0.0.0/33\"",
            "is not a CIDR",
        ),
        (
            "toCIDR: [example.com]",
            "example.com",
            "is not an IP address or a CIDR",
        ),
        (
            "toCIDRSet: [{cidr: 10.0.0.0/8, except: [11.0.0.0/16]}]",
            "11.0.0.0",
            "is not inside the `cidr` 10.0.0.0/8",
        ),
        (
            "toCIDRSet: [{cidr: 10.0.0.0/16, except: [10.0.0.0/8]}]",
            "10.0.0.0/8]",
            "is not inside",
        ),
        (
            "toCIDRSet: [{cidr: 10.0.0.0/8, except: [\"fd00::/8\"]}]",
            "\"fd00",
            "is not inside",
        ),
        (
            "toCIDRSet: [{cidr: 10.0.0.0/8, except: [10.1.2.3/16]}]",
            "10.1.2.3",
            "write it as 10.1.0.0/16",
        ),
        (
            "toCIDRSet: [{except: [10.1.0.0/16]}]",
            "{except",
            "needs a `cidr`",
        ),
    ];
    for (entry, at, expected) in cases {
        let text = cnp(&format!("  egress:\n    - {entry}\n"));
        invalid_at(&text, at, expected);
    }
}

#[test]
fn bad_ports_point_at_the_port() {
    let cases = [
        ("{port: 70000}", "70000", "`port` 70000 is out of range"),
        ("{port: \"-1\"}", "\"-1\"", "is not a port number"),
        ("{port: -1}", "-1", "out of range"),
        ("{port: \"\"}", "\"\"", "is not a port number"),
        (
            "{port: 1.5}",
            "1.5",
            "must be a port number (0-65535), not a fractional number",
        ),
        ("{port: [80]}", "[80]", "not a list"),
        ("{port: true}", "true", "not a boolean"),
        (
            "{port: 80, endPort: 79}",
            "79",
            "`endPort` 79 is below `port` 80",
        ),
        (
            "{port: 80, endPort: 65536}",
            "65536",
            "`endPort` 65536 is out of range",
        ),
        (
            "{port: \"0\", endPort: 100}",
            "100",
            "`endPort` needs a specific `port`",
        ),
        (
            "{port: 80, protocol: SCTP}",
            "SCTP",
            "`protocol` SCTP is not supported by fqdnd",
        ),
        ("{port: 80, protocol: ICMP}", "ICMP", "not supported"),
        ("{port: 80, protocol: QUIC}", "QUIC", "unknown `protocol`"),
        ("{protocol: TCP}", "{protocol", "needs a `port`"),
    ];
    for (port, at, expected) in cases {
        let text = cnp(&format!(
            "  egress:\n    - toPorts:\n        - ports:\n            - {port}\n"
        ));
        invalid_at(&text, at, expected);
    }
    // Named ports name a Kubernetes container's ports: Kubernetes-only.
    for (port, at) in [
        ("{port: http}", "http"),
        ("{port: \"https\", protocol: TCP}", "\"https\""),
    ] {
        let text = cnp(&format!(
            "  egress:\n    - toPorts:\n        - ports:\n            - {port}\n"
        ));
        let e = one_err(&text);
        assert!(
            matches!(
                e,
                Error::Unsupported {
                    why: fqdnd_config::Unsupported::KubernetesOnly,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(pos(&e), find(&text, &format!("port: {at}")), "{e}");
        assert!(
            e.to_string()
                .contains("(a named port)` is not supported by fqdnd: it is Kubernetes-only"),
            "{e}"
        );
    }
}

#[test]
fn dns_rules_need_a_specific_single_port() {
    let rules = "          rules:\n            dns: [{matchPattern: \"*\"}]\n";
    let text = cnp(&format!(
        "  egress:\n    - toPorts:\n        - ports: [{{port: \"0\"}}]\n{rules}"
    ));
    invalid_at(&text, "{port", "not port 0");
    let text = cnp(&format!(
        "  egress:\n    - toPorts:\n        - ports: [{{port: 53, endPort: 54}}]\n{rules}"
    ));
    invalid_at(&text, "{port", "do not support port ranges");
}

#[test]
fn a_ports_entry_needs_ports() {
    let text = cnp(
        "  egress:\n    - toPorts:\n        - rules:\n            dns: [{matchPattern: \"*\"}]\n",
    );
    invalid_at(&text, "rules:", "non-empty `ports` list");
    let text = cnp("  egress:\n    - toPorts:\n        - ports: []\n");
    invalid_at(&text, "ports: []", "non-empty `ports` list");
    let many: Vec<String> = (1..=41).map(|p| format!("{{port: {p}}}")).collect();
    let text = cnp(&format!(
        "  egress:\n    - toPorts:\n        - ports: [{}]\n",
        many.join(", ")
    ));
    invalid_at(&text, "ports: [", "at most 40 ports");
}

#[test]
fn fqdn_peers_cannot_share_an_egress_entry_with_other_l3_peers() {
    for other in [
        "toCIDR: [10.0.0.0/8]",
        "toCIDRSet: [{cidr: 10.0.0.0/8}]",
        "toEndpoints: [{}]",
    ] {
        let text = cnp(&format!(
            "  egress:\n    - toFQDNs: [{{matchName: a.com}}]\n      {other}\n"
        ));
        let name = other.split(':').next().unwrap();
        invalid_at(
            &text,
            "toFQDNs",
            &format!("`toFQDNs` cannot be combined with `{name}`"),
        );
    }
    // As in Cilium, any two kinds of L3 peer are refused together.
    let text = cnp("  egress:\n    - toCIDR: [10.0.0.0/8]\n      toEndpoints: [{}]\n");
    invalid_at(
        &text,
        "toCIDR",
        "`toCIDR` cannot be combined with `toEndpoints`",
    );
}

#[test]
fn wrong_types_are_located() {
    let text = cnp("  egress:\n    - toFQDNs: example.com\n");
    let e = one_err(&text);
    assert_eq!(pos(&e), find(&text, "example.com"));
    let text = cnp(&format!("  enableDefaultDeny: {{egress: maybe}}\n{EGRESS}"));
    let e = one_err(&text);
    assert_eq!(pos(&e), find(&text, "maybe"));
}

#[test]
fn duplicate_keys_are_errors() {
    let text = cnp(&format!("{EGRESS}  egress: []\n"));
    let e = one_err(&text);
    assert!(e.to_string().contains("duplicate mapping key"), "{e}");
}
