//! Files, directories and documents: splitting, dispatching on `apiVersion`/`kind`, and
//! collecting every error.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::{EGRESS, ccnp, cnp, errs, find, messages, ok, one_err, pos};
use fqdnd_config::{Duplicated, Error, Warning, load, load_str};

fn endpoint(name: &str, id: u16, address: &str) -> String {
    format!(
        "apiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata:\n  name: {name}\nspec:\n  id: {id}\n  addresses: [{address}]\n  labels: {{app: {name}}}\n"
    )
}

/// A fresh directory under the target's temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fqdnd-config-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn many_documents_of_every_kind_in_one_file() {
    let text = format!(
        "{}---\n{}---\n{}---\napiVersion: fqdnd.io/v1\nkind: ClientGroup\nmetadata: {{name: office}}\nspec:\n  id: 3\n  addresses: [192.168.0.0/16]\n---\napiVersion: fqdnd.io/v1\nkind: Settings\n...\n",
        endpoint("a", 1, "10.0.0.1"),
        cnp(EGRESS),
        endpoint("b", 2, "10.0.0.2"),
    );
    let config = ok(&text);
    let names: Vec<&str> = config.endpoints.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "office"]);
    assert_eq!(config.rules.len(), 1);
    assert_eq!(config.sources, [PathBuf::from("test.yaml")]);
}

#[test]
fn kind_may_come_after_spec() {
    let text = "spec:\n  id: 7\n  addresses: [10.0.0.7]\nmetadata: {name: late}\nkind: Endpoint\napiVersion: fqdnd.io/v1\n";
    assert_eq!(ok(text).endpoints[0].name, "late");
    let text = format!(
        "spec:\n  endpointSelector: {{}}\n{EGRESS}metadata: {{name: p}}\nkind: CiliumNetworkPolicy\napiVersion: cilium.io/v2\n"
    );
    assert_eq!(ok(&text).rules.len(), 1);
}

#[test]
fn one_bad_document_does_not_hide_errors_in_the_next() {
    let text = format!(
        "{}---\n{}---\n{}",
        cnp("  egress:\n    - toCIDR: [\"10.0.0.1/8\"]\n"),
        cnp("  egress:\n    - toFQDN: []\n"),
        endpoint("x", 0, "10.0.0.9"),
    );
    let errors = errs(&text);
    let lines: Vec<u64> = errors.iter().map(|e| pos(e).0).collect();
    assert_eq!(lines.len(), 3, "{errors}");
    assert!(
        lines.windows(2).all(|w| w[0] < w[1]),
        "in file order: {errors}"
    );
}

#[test]
fn a_syntax_error_is_located() {
    let text =
        "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata:\n  name: [unclosed\n";
    let e = one_err(text);
    assert!(matches!(e, Error::Syntax { .. }), "{e:?}");
    assert_eq!(e.file(), Path::new("test.yaml"));
    assert!(pos(&e).0 >= 4, "{e}");
}

#[test]
fn a_syntax_error_after_good_documents_keeps_their_errors() {
    let text = format!(
        "{}---\nkey: [oops\n",
        cnp("  egress:\n    - toCIDR: [nope]\n")
    );
    let errors = errs(&text);
    assert_eq!(errors.len(), 2, "{errors}");
    assert!(matches!(errors.as_slice()[0], Error::Invalid { .. }));
    assert!(matches!(errors.as_slice()[1], Error::Syntax { .. }));
}

/// A file without documents (`# disabled`) is skipped with a warning, not an error: a
/// configuration directory with a disabled file is normal, and the daemons start (and
/// reload) with the other files.
#[test]
fn empty_files_are_skipped_with_a_warning() {
    for text in [
        "",
        "\n\n",
        "# only a comment\n# and another\n",
        "# disabled\n",
        "---",
        "---\n",
        "---\n---\n...\n",
        "~\n",
        "---\nnull\n",
    ] {
        let config = load_str(text, Path::new("test.yaml")).unwrap();
        assert_eq!(
            config.warnings,
            vec![Warning::EmptyFile {
                file: PathBuf::from("test.yaml")
            }],
            "{text:?}"
        );
        assert_eq!(
            config.warnings[0].to_string(),
            "test.yaml:1:1: warning: no policy or configuration documents (the file is empty \
             or holds only comments): skipped"
        );
    }
    // In a directory, next to a policy: the policy loads.
    let dir = temp_dir("disabled");
    fs::write(dir.join("a-disabled.yaml"), "# disabled\n").unwrap();
    fs::write(dir.join("b.yaml"), endpoint("web", 1, "10.0.0.1")).unwrap();
    let config = load(&[&dir]).unwrap();
    assert_eq!(config.endpoints.len(), 1);
    assert!(
        matches!(&config.warnings[..], [Warning::EmptyFile { file }] if *file == dir.join("a-disabled.yaml")),
        "{:?}",
        config.warnings
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn empty_documents_between_others_are_skipped() {
    let text = format!("---\n---\n{}---\n---\n", cnp(EGRESS));
    assert_eq!(ok(&text).rules.len(), 1);
}

#[test]
fn unknown_kinds_and_api_versions() {
    let cases = [
        (
            "apiVersion: cilium.io/v1\nkind: CiliumNetworkPolicy\n",
            "cilium.io/v1",
            "CiliumNetworkPolicy",
        ),
        (
            "apiVersion: cilium.io/v2\nkind: CiliumEnvoyConfig\n",
            "cilium.io/v2",
            "CiliumEnvoyConfig",
        ),
        (
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n",
            "networking.k8s.io/v1",
            "NetworkPolicy",
        ),
        (
            "apiVersion: fqdnd.io/v1\nkind: CiliumNetworkPolicy\n",
            "fqdnd.io/v1",
            "CiliumNetworkPolicy",
        ),
        ("apiVersion: v1\nkind: List\nitems: []\n", "v1", "List"),
        (
            "apiVersion: fqdnd.io/v1\nkind: endpoint\n",
            "fqdnd.io/v1",
            "endpoint",
        ),
    ];
    for (text, api, kind) in cases {
        let e = one_err(text);
        match &e {
            Error::UnknownKind {
                api_version,
                kind: k,
                line,
                column,
                ..
            } => {
                assert_eq!((api_version.as_str(), k.as_str()), (api, kind));
                assert_eq!((*line, *column), (2, 7));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            e.to_string()
                .contains("fqdnd reads apiVersion cilium.io/v2"),
            "{e}"
        );
    }
}

#[test]
fn documents_need_api_version_and_kind() {
    let e = one_err("kind: CiliumNetworkPolicy\nmetadata: {name: x}\n");
    assert!(e.to_string().contains("no `apiVersion`"), "{e}");
    let e = one_err("apiVersion: cilium.io/v2\nmetadata: {name: x}\n");
    assert!(e.to_string().contains("no `kind`"), "{e}");
    for text in ["just a string\n", "- a\n- list\n", "42\n"] {
        let e = one_err(text);
        assert!(
            e.to_string().contains("expected a mapping"),
            "{text:?}: {e}"
        );
        assert_eq!(pos(&e), (1, 1));
    }
    let e = one_err("apiVersion: cilium.io/v2\nkind: [CiliumNetworkPolicy]\n");
    assert_eq!(pos(&e), (2, 7), "{e}");
}

#[test]
fn display_is_file_line_column_message() {
    let text = cnp("  egress:\n    - toCIDR: [nope]\n");
    let e = one_err(&text);
    let (line, column) = find(&text, "nope");
    assert_eq!(
        e.to_string(),
        format!("test.yaml:{line}:{column}: `toCIDR` \"nope\" is not an IP address or a CIDR")
    );
    match e {
        Error::Invalid {
            file,
            line: l,
            column: c,
            message,
        } => {
            assert_eq!(
                (file.as_path(), l, c),
                (Path::new("test.yaml"), line, column)
            );
            assert!(message.starts_with("`toCIDR`"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn errors_display_one_per_line() {
    let text = format!(
        "{}---\n{}",
        cnp("  egress:\n    - toCIDR: [a]\n"),
        cnp("  egress:\n    - toCIDR: [b]\n")
    );
    let errors = errs(&text);
    assert_eq!(errors.to_string().lines().count(), 2);
    assert_eq!(errors.len(), 2);
    assert!(!errors.is_empty());
    assert_eq!(errors.iter().count(), (&errors).into_iter().count());
}

#[test]
fn control_characters_in_values_are_escaped_in_messages() {
    let text = cnp("  egress:\n    - toCIDR: [\"bad\\u001b[31m\\nline\"]\n");
    let message = one_err(&text).to_string();
    assert!(!message.chars().any(char::is_control), "{message:?}");
}

#[test]
fn duplicate_settings_are_errors_across_files() {
    let dir = temp_dir("settings");
    fs::write(
        dir.join("a.yaml"),
        "apiVersion: fqdnd.io/v1\nkind: Settings\n",
    )
    .unwrap();
    fs::write(
        dir.join("b.yaml"),
        "# second\napiVersion: fqdnd.io/v1\nkind: Settings\nspec: {gcInterval: 5m}\n",
    )
    .unwrap();
    let errors = load(&[&dir]).unwrap_err().into_vec();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    match &errors[0] {
        Error::Duplicate {
            file,
            line,
            item: Duplicated::Settings,
            first_file,
            first_line,
            ..
        } => {
            assert_eq!((file, *line), (&dir.join("b.yaml"), 2));
            assert_eq!((first_file, *first_line), (&dir.join("a.yaml"), 1));
        }
        other => panic!("{other:?}"),
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_directory_loads_its_config_files_sorted_by_name() {
    let dir = temp_dir("dir");
    fs::write(dir.join("20-policy.yml"), cnp(EGRESS)).unwrap();
    fs::write(
        dir.join("10-endpoints.yaml"),
        endpoint("web", 1, "10.0.0.1"),
    )
    .unwrap();
    fs::write(
        dir.join("30-more.json"),
        r#"{"apiVersion": "fqdnd.io/v1", "kind": "Endpoint", "metadata": {"name": "json"}, "spec": {"id": 2, "addresses": ["10.0.0.2"]}}"#,
    )
    .unwrap();
    fs::write(dir.join("README.md"), "not yaml: [").unwrap();
    fs::write(dir.join(".hidden.yaml"), "not yaml: [").unwrap();
    fs::create_dir(dir.join("nested.yaml")).unwrap();
    fs::create_dir(dir.join("sub")).unwrap();
    fs::write(dir.join("sub").join("x.yaml"), "not yaml: [").unwrap();

    let config = load(&[&dir]).unwrap();
    assert_eq!(
        config.sources,
        [
            dir.join("10-endpoints.yaml"),
            dir.join("20-policy.yml"),
            dir.join("30-more.json")
        ]
    );
    let names: Vec<&str> = config.endpoints.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["web", "json"]);
    assert_eq!(
        config.rules[0].origin,
        format!("{}:6 p", dir.join("20-policy.yml").display())
    );

    // Files and directories may be mixed; the order given is kept.
    let extra = dir.join("sub").join("x.yaml");
    fs::write(&extra, ccnp(EGRESS)).unwrap();
    let config = load(&[extra.clone(), dir.clone()]).unwrap();
    assert_eq!(config.sources[0], extra);
    assert_eq!(config.sources.len(), 4);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn io_problems_and_empty_directories_are_errors() {
    let dir = temp_dir("io");
    let missing = dir.join("missing.yaml");
    let empty_dir = dir.join("empty");
    fs::create_dir(&empty_dir).unwrap();
    let errors = load(&[&missing, &empty_dir]).unwrap_err().into_vec();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(matches!(&errors[0], Error::Io { path, .. } if *path == missing));
    assert!(matches!(&errors[1], Error::EmptyDirectory { dir } if *dir == empty_dir));
    assert_eq!(errors[0].position(), None);
    // The OS's reason is in the message, once: it is not also the error's source (a chain
    // renderer would print it twice).
    assert_eq!(
        errors[0].to_string(),
        format!(
            "{}: No such file or directory (os error 2)",
            missing.display()
        )
    );
    assert!(std::error::Error::source(&errors[0]).is_none());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn files_may_be_utf16_or_carry_a_bom() {
    let text = cnp(EGRESS);
    let dir = temp_dir("bom");
    let mut utf8 = vec![0xEF, 0xBB, 0xBF];
    utf8.extend_from_slice(text.as_bytes());
    fs::write(dir.join("a.yaml"), utf8).unwrap();
    let mut utf16 = vec![0xFF, 0xFE];
    for unit in ccnp(EGRESS).encode_utf16() {
        utf16.extend_from_slice(&unit.to_le_bytes());
    }
    fs::write(dir.join("b.yaml"), utf16).unwrap();
    fs::write(dir.join("c.yaml"), b"apiVersion: \xff\xfe\xfd\n").unwrap();
    let errors = load(&[&dir]).unwrap_err().into_vec();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        matches!(&errors[0], Error::Syntax { file, .. } if *file == dir.join("c.yaml")),
        "{errors:?}"
    );
    fs::remove_file(dir.join("c.yaml")).unwrap();
    assert_eq!(load(&[&dir]).unwrap().rules.len(), 2);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn load_str_names_the_source() {
    let config = load_str(&cnp(EGRESS), Path::new("inline/policy.yaml")).unwrap();
    assert_eq!(config.sources, [PathBuf::from("inline/policy.yaml")]);
    assert_eq!(config.rules[0].origin, "inline/policy.yaml:6 p");
}

#[test]
fn nothing_to_load_gives_the_defaults() {
    let config = load(&[] as &[&Path]).unwrap();
    assert!(config.rules.is_empty() && config.endpoints.is_empty() && config.sources.is_empty());
    assert_eq!(config.settings, fqdnd_config::Settings::default());
}

#[test]
fn yaml_anchors_and_merges_work() {
    let text = r#"apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: anchors}
spec:
  endpointSelector: &web {matchLabels: {app: web}}
  egress:
    - toEndpoints: [*web]
      toPorts: &https [{ports: [{port: "443", protocol: TCP}]}]
    - toFQDNs: [{matchName: a.example}]
      toPorts: *https
"#;
    let rule = ok(text).rules.remove(0);
    assert_eq!(rule.egress.len(), 2);
    assert_eq!(rule.egress[0].ports, rule.egress[1].ports);
}

#[test]
fn an_error_in_an_alias_points_at_its_use() {
    let text = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: x}\nx-bad: &bad \"10.0.0.1/8\"\n";
    // An unknown top-level field (and the missing `spec`); check the alias case inside a
    // valid shape.
    let errors = messages(text);
    assert!(
        errors.iter().any(|e| e.contains("unknown field `x-bad`")),
        "{errors:?}"
    );
    let text = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: &n x}\nspec:\n  endpointSelector: {}\n  egress:\n    - toCIDR: [*n]\n";
    let e = one_err(text);
    assert_eq!(pos(&e), find(text, "*n"), "{e}");
}

/// Three documents: an unknown field, a syntax (indentation) error, a rejected field.
fn three_bad_documents() -> [String; 3] {
    let unknown = cnp("  egress:\n    - toFQDNs: [{matchName: a.example}]\n      toPortz: []\n")
        .replace("name: p", "name: p1");
    let syntax = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata:\n  name: p2\n   namespace: x\nspec: {}\n".to_owned();
    let rejected = cnp(&format!("  nodeSelector: {{}}\n{EGRESS}")).replace("name: p", "name: p3");
    [unknown, syntax, rejected]
}

/// The errors of `text`: (line, column, kind of error, message).
fn located(text: &str) -> Vec<(u64, u64, &'static str, String)> {
    errs(text)
        .into_iter()
        .map(|e| {
            let kind = match &e {
                Error::Syntax { .. } => "syntax",
                _ => "invalid",
            };
            let (line, column) = pos(&e);
            (line, column, kind, e.to_string())
        })
        .collect()
}

#[test]
fn a_syntax_error_does_not_hide_the_errors_of_later_documents() {
    let [unknown, syntax, rejected] = three_bad_documents();
    for order in [
        [&unknown, &syntax, &rejected],
        [&syntax, &unknown, &rejected],
        [&rejected, &syntax, &unknown],
    ] {
        let text = format!("{}---\n{}---\n{}", order[0], order[1], order[2]);
        let errors = located(&text);
        assert_eq!(errors.len(), 3, "{errors:#?}");
        let at = |needle: &str| find(&text, needle);
        let by_needle = |needle: &str| {
            let (line, column) = at(needle);
            errors
                .iter()
                .find(|(l, c, ..)| (*l, *c) == (line, column))
                .unwrap_or_else(|| panic!("no error at {needle:?} ({line}:{column}): {errors:#?}"))
        };
        assert!(by_needle("toPortz").3.contains("unknown field `toPortz`"));
        assert!(
            by_needle("nodeSelector")
                .3
                .contains("`nodeSelector` is not supported")
        );
        // The indentation error is reported on its line, where the parser finds it.
        let (line, _) = at("   namespace");
        let syntax_error = errors.iter().find(|e| e.2 == "syntax").unwrap();
        assert_eq!(syntax_error.0, line, "{errors:#?}");
        // In file order.
        assert!(errors.windows(2).all(|w| w[0].0 < w[1].0), "{errors:#?}");
    }
}

#[test]
fn later_documents_keep_their_lines_with_crlf_line_ends() {
    let [unknown, syntax, rejected] = three_bad_documents();
    let text = format!("{syntax}---\n{unknown}---\n{rejected}");
    let crlf = text.replace('\n', "\r\n");
    let lines = |text: &str| -> Vec<(u64, u64)> {
        located(text).iter().map(|(l, c, ..)| (*l, *c)).collect()
    };
    assert_eq!(lines(&crlf), lines(&text));
    assert_eq!(lines(&text).len(), 3);
}

#[test]
fn an_end_marker_and_a_leading_marker() {
    let text = format!(
        "---\n{}...\n# between\n---\n{}",
        cnp(EGRESS).replace("name: p", "name: p1"),
        cnp("  egress:\n    - toCIDR: [nope]\n").replace("name: p", "name: p2"),
    );
    let e = one_err(&text);
    assert_eq!(pos(&e), find(&text, "nope"), "{e}");
    // After `...`, a document needs no `---`.
    let text = format!(
        "{}...\n{}",
        cnp(EGRESS).replace("name: p", "name: p1"),
        cnp("  egress:\n    - toCIDR: [nope]\n").replace("name: p", "name: p2"),
    );
    let e = one_err(&text);
    assert_eq!(pos(&e), find(&text, "nope"), "{e}");
}

#[test]
fn a_marker_inside_a_block_scalar_or_a_quoted_string_does_not_split() {
    for description in [
        "  description: |\n    first\n    ---\n    second\n",
        "  description: \"first\n    ---\n    second\"\n",
        "  description: 'first\n    ---\n    second'\n",
    ] {
        let text = cnp(&format!("{description}  nodeSelector: {{}}\n{EGRESS}"));
        let e = one_err(&text);
        assert_eq!(pos(&e), find(&text, "nodeSelector"), "{description:?}: {e}");
        let ok_text = cnp(&format!("{description}{EGRESS}"));
        assert_eq!(ok(&ok_text).rules.len(), 1, "{description:?}");
    }
}

#[test]
fn an_unknown_field_does_not_stop_the_rest_of_its_document() {
    let text = cnp(
        "  egress:\n    - toFQDN: [{matchName: a.example}]\n    - toCIDR: [nope]\n      toPortz: []\n    - toCIDRSet: [{cidr: 10.0.0.0/8, exept: []}]\n",
    );
    let errors = located(&text);
    let expected = [
        (find(&text, "toFQDN:"), "unknown field `toFQDN`"),
        (find(&text, "nope"), "is not an IP address"),
        (find(&text, "toPortz"), "unknown field `toPortz`"),
        (find(&text, "exept"), "unknown field `exept`"),
    ];
    assert_eq!(errors.len(), expected.len(), "{errors:#?}");
    for ((at, message), error) in expected.iter().zip(&errors) {
        assert_eq!((error.0, error.1), *at, "{errors:#?}");
        assert!(error.3.contains(message), "{errors:#?}");
    }
}

#[test]
fn a_missing_field_is_reported_unless_an_unknown_one_is_its_typo() {
    // `endpointSelectr` is the missing `endpointSelector`: one error.
    let text = cnp(&format!("  endpointSelectr: {{}}\n{EGRESS}"));
    assert!(
        one_err(&text)
            .to_string()
            .contains("unknown field `endpointSelectr`")
    );
    // `colour` is not `egress`: both are reported.
    let text = cnp("  colour: blue\n");
    let errors = messages(&text);
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(errors.iter().any(|e| e.contains("unknown field `colour`")));
    assert!(
        errors
            .iter()
            .any(|e| e.contains("needs a non-empty `egress`, `ingress`"))
    );
    // A typo in one rule does not excuse another rule's missing field.
    let text = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: p}\nspecs:\n  - endpointSelectr: {}\n    egress: [{toFQDNs: [{matchName: a.example}]}]\n  - egress: [{toFQDNs: [{matchName: b.example}]}]\n";
    let errors = messages(text);
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("unknown field `endpointSelectr`")),
        "{errors:#?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("needs an `endpointSelector`")),
        "{errors:#?}"
    );
}

#[test]
fn an_unknown_field_in_an_aliased_mapping_is_reported_once() {
    let text = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: p}\nspec:\n  endpointSelector: {}\n  egress:\n    - toPorts: &ports [{ports: [{port: \"443\"}], colour: blue}]\n    - toPorts: *ports\n";
    let e = one_err(text);
    assert_eq!(pos(&e), find(text, "colour"), "{e}");
}

#[test]
fn the_document_splitter_is_public() {
    let text = "a: 1\n---\nb: 2\n";
    let docs: Vec<fqdnd_config::Document<'_>> = fqdnd_config::documents(text).collect();
    assert_eq!(docs.len(), 2);
    assert_eq!((docs[1].text, docs[1].first_line), ("---\nb: 2\n", 2));
}
