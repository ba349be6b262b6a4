//! Whatever the input, loading returns `Ok` or located errors; it never panics.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::path::Path;

use fqdnd_config::{EXAMPLE_POLICY, Errors, load, load_str};
use proptest::prelude::*;

/// Checks the result's invariants: errors are never empty and point inside the text.
fn check(text: &str, result: Result<fqdnd_config::Config, Errors>) {
    if let Err(errors) = result {
        assert!(!errors.is_empty());
        // Lines as YAML counts them: `\n`, `\r\n` and a lone `\r` each end one.
        let breaks =
            text.matches('\n').count() + text.matches('\r').count() - text.matches("\r\n").count();
        let lines = breaks as u64 + 1;
        for e in &errors {
            let _ = e.to_string();
            if let Some((line, column)) = e.position() {
                assert!(line >= 1 && column >= 1, "{e}");
                assert!(line <= lines.max(1) + 1, "{e} (text has {lines} lines)");
            }
        }
    }
}

fn run(text: &str) {
    check(text, load_str(text, Path::new("fuzz.yaml")));
}

/// Pieces of policy-shaped YAML, glued at random.
fn token() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "apiVersion: ",
        "kind: ",
        "cilium.io/v2",
        "fqdnd.io/v1",
        "CiliumNetworkPolicy",
        "CiliumClusterwideNetworkPolicy",
        "Endpoint",
        "ClientGroup",
        "Settings",
        "metadata:",
        "name: ",
        "namespace: ",
        "spec:",
        "specs:",
        "endpointSelector:",
        "matchLabels:",
        "matchExpressions:",
        "key: ",
        "operator: ",
        "In",
        "Exists",
        "values:",
        "egress:",
        "toFQDNs:",
        "matchName: ",
        "matchPattern: ",
        "toCIDR:",
        "toCIDRSet:",
        "cidr: ",
        "except:",
        "toEndpoints:",
        "toPorts:",
        "ports:",
        "port: ",
        "endPort: ",
        "protocol: ",
        "TCP",
        "UDP",
        "SCTP",
        "rules:",
        "dns:",
        "http:",
        "ingress:",
        "enableDefaultDeny:",
        "id: ",
        "addresses:",
        "labels:",
        "dns:",
        "minTTL: ",
        "gcInterval: ",
        "100ms",
        "*",
        "**.",
        "*.example.com",
        "a..b",
        "10.0.0.0/8",
        "10.0.0.1/8",
        "::/0",
        "53",
        "\"53\"",
        "-1",
        "70000",
        "0",
        "1.5",
        "true",
        "~",
        "null",
        "\n",
        "\n  ",
        "\n    ",
        "\n- ",
        "- ",
        "  ",
        ": ",
        "[",
        "]",
        "{",
        "}",
        ", ",
        "\"",
        "'",
        "&a ",
        "*a",
        "<<: ",
        "---\n",
        "...\n",
        "# c\n",
        "!tag ",
        "|\n  ",
        ">\n  ",
        "%YAML 1.2\n",
        "\t",
        "\u{feff}",
        "é",
        "\u{0}",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text(text in ".{0,400}") {
        run(&text);
    }

    #[test]
    fn arbitrary_bytes_as_text(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        run(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn yaml_ish_text(tokens in prop::collection::vec(token(), 0..120)) {
        run(&tokens.concat());
    }

    #[test]
    fn mutated_example(
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0usize..12, token()), 1..6)
    ) {
        let mut text = EXAMPLE_POLICY.to_owned();
        for (at, delete, insert) in edits {
            let mut start = at.index(text.len() + 1);
            while !text.is_char_boundary(start) {
                start -= 1;
            }
            let mut end = (start + delete).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            text.replace_range(start..end, insert);
        }
        run(&text);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Raw bytes through the file loader (which also decodes UTF-16 and BOMs).
    #[test]
    fn arbitrary_file_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let path = std::env::temp_dir().join(format!("fqdnd-config-fuzz-{}.yaml", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let result = load(&[&path]);
        let _ = std::fs::remove_file(&path);
        check(&String::from_utf8_lossy(&bytes), result);
    }
}

#[test]
fn deep_nesting_is_refused_not_overflowed() {
    for open in ["[", "{", "- ", "a:\n "] {
        let text = format!(
            "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nspec: {}",
            open.repeat(50_000)
        );
        run(&text);
    }
}

#[test]
fn alias_bombs_are_refused() {
    // Anchors defined in the ignored `status`, replayed into the ignored `metadata.labels`:
    // 10^12 nodes if expanded naively.
    let mut text = String::from(
        "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nstatus:\n  x0: &a0 [a, a, a, a, a, a, a, a, a, a]\n",
    );
    for i in 1..12 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        text.push_str(&format!("  x{i}: &a{i} [{refs}]\n"));
    }
    text.push_str("metadata: {name: x, labels: *a11}\n");
    let errors = load_str(&text, Path::new("bomb.yaml")).unwrap_err();
    assert!(errors.to_string().contains("bomb.yaml:"), "{errors}");
}

/// Found by `arbitrary_text`: lone carriage returns are line breaks to YAML, so error lines
/// count them too.
#[test]
fn lone_carriage_returns_count_as_lines() {
    let text = "\r\r\r¡";
    check(text, load_str(text, Path::new("cr.yaml")));
}
