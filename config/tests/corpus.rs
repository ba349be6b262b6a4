//! Real-world policies: every file of `tests/corpus/real/` (CiliumNetworkPolicies from public
//! repositories, provenance and licence in its SOURCES.tsv) and `tests/corpus/cilium/`
//! (Cilium's own published examples, Apache-2.0) either loads, or is refused only with
//! [`Error::Unsupported`] errors — each naming the field and why fqdnd refuses it (a
//! Kubernetes-only feature, an L7 proxy rule, an external object) — never with a generic
//! "not supported" or a parse error for something Cilium accepts.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fqdnd_config::{Error, Unsupported, load};

fn files(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "json"))
        .collect();
    out.sort();
    out
}

/// What the corpus gave: loaded files, and refused files by the reasons of their errors.
#[derive(Default, Debug)]
struct Tally {
    loaded: Vec<String>,
    refused: BTreeMap<String, Vec<String>>,
    other: Vec<String>,
}

fn tally(dir: &str) -> Tally {
    let mut t = Tally::default();
    for path in files(dir) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        match load(&[&path]) {
            Ok(_) => t.loaded.push(name),
            Err(errors) => {
                for e in &errors {
                    match e {
                        Error::Unsupported { field, why, .. } => {
                            let reason = match why {
                                Unsupported::KubernetesOnly => "kubernetes-only",
                                Unsupported::L7Proxy => "l7-proxy",
                                Unsupported::External => "external",
                                _ => "other",
                            };
                            t.refused
                                .entry(format!("{reason}: {}", field.split(':').next().unwrap()))
                                .or_default()
                                .push(name.clone());
                        }
                        other => t.other.push(format!("{other}")),
                    }
                }
            }
        }
    }
    t
}

fn report(dir: &str, t: &Tally) {
    let refused: std::collections::BTreeSet<&String> = t.refused.values().flatten().collect();
    println!(
        "{dir}: {} files, {} load, {} refused",
        files(dir).len(),
        t.loaded.len(),
        refused.len()
    );
    for (reason, names) in &t.refused {
        println!("  {reason}: {}", names.len());
    }
}

#[test]
fn real_world_policies_load_or_are_refused_for_a_stated_reason() {
    let t = tally("tests/corpus/real");
    report("tests/corpus/real", &t);
    assert!(
        t.other.is_empty(),
        "errors other than a refusal with a reason:\n{}",
        t.other.join("\n")
    );
    assert_eq!(
        files("tests/corpus/real").len(),
        59,
        "the corpus has 59 policies"
    );
    // Every refusal says why, in the error's text too.
    for path in files("tests/corpus/real") {
        if let Err(errors) = load(&[&path]) {
            for e in &errors {
                let text = e.to_string();
                assert!(text.contains("is not supported by fqdnd: it "), "{text}");
            }
        }
    }
    // 10 loaded before ingress, deny rules, entities and icmps; now 37, the other 22 are
    // refused only for what fqdnd refuses by design.
    assert_eq!(t.loaded.len(), 37, "{t:#?}");
}

#[test]
fn cilium_examples_load_or_are_refused_for_a_stated_reason() {
    let t = tally("tests/corpus/cilium");
    report("tests/corpus/cilium", &t);
    // Cilium decodes its documents leniently (Go: unknown fields ignored, field names in any
    // case), and some of its examples rely on it or are refused by Cilium itself: a rule whose
    // only section is null, a lowercase `in` operator, a label mis-indented out of
    // `matchLabels` (an unknown field to fqdnd, dropped silently by Cilium), the deprecated
    // `fromRequires`. fqdnd refuses those with an error at the spot; they are listed, not
    // hidden.
    for o in &t.other {
        println!("  not a refusal: {o}");
    }
    let expected_other = [
        "egress-default-deny",
        "or-statement",
        "requires",
        "l3_l4_combined",
    ];
    for o in &t.other {
        assert!(
            expected_other.iter().any(|x| o.contains(x)),
            "an unexpected error: {o}"
        );
    }
    assert_eq!((t.loaded.len(), t.other.len()), (17, 4), "{t:#?}");
    for name in [
        "l3__egress-deny__egress-deny.yaml",
        "l3__entities__from_world_deny.yaml",
        "l4__icmp.yaml",
        "l3__entities__world.yaml",
        "l3__simple__l3.yaml",
        "l3__entities__nodes.yaml",
        "l4__init.yaml",
    ] {
        assert!(
            t.loaded.iter().any(|l| l == name),
            "{name} should load: {t:#?}"
        );
    }
}
