//! `kind: Gateway`'s `cache` block (and its absence in a `Node`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::path::Path;

use fqdnd_config::AnswerCache;
use fqdnd_config::load_str;

fn gateway(extra: &str) -> String {
    format!(
        "apiVersion: fqdnd.io/v1\nkind: Gateway\nspec:\n  listen: [\"127.0.0.1:5353\"]\n  upstreams: [\"192.0.2.53:53\"]\n{extra}"
    )
}

fn file() -> &'static Path {
    Path::new("/etc/fqdnd/gateway.yaml")
}

fn cache_of(extra: &str) -> Option<AnswerCache> {
    load_str(&gateway(extra), file())
        .unwrap()
        .gateway
        .unwrap()
        .cache
}

#[test]
fn the_cache_is_off_unless_given_and_bounded_as_written() {
    assert_eq!(cache_of(""), None, "off by default");
    assert_eq!(cache_of("  cache: {}\n"), Some(AnswerCache::default()));
    assert_eq!(cache_of("  cache: {enabled: false, size: 5}\n"), None);
    let c = cache_of(
        "  cache:\n    size: 500\n    minTTL: 30s\n    maxTTL: 1h\n    maxNegativeTTL: 5m\n",
    )
    .unwrap();
    assert_eq!(
        c,
        AnswerCache {
            max_entries: 500,
            min_ttl: 30,
            max_ttl: 3600,
            max_negative_ttl: 300,
        }
    );
}

#[test]
fn cache_mistakes_are_located_errors() {
    for (extra, says) in [
        ("  cache: {size: 0}\n", "`cache.size` must be 1"),
        ("  cache: {minTTL: 2h, maxTTL: 1h}\n", "must not exceed"),
        ("  cache: {maxTTL: 1500ms}\n", "whole seconds"),
        ("  cache: {minTTL: soon}\n", "not a duration"),
        ("  cache: {entries: 5}\n", "unknown field `entries`"),
    ] {
        let text = load_str(&gateway(extra), file()).unwrap_err().to_string();
        assert!(text.contains("gateway.yaml:6:"), "{extra}: {text}");
        assert!(text.contains(says), "{extra}: {text}");
    }
}

#[test]
fn a_node_has_no_answer_cache() {
    let text = load_str(
        "apiVersion: fqdnd.io/v1\nkind: Node\nspec:\n  cache: {size: 10}\n",
        file(),
    )
    .unwrap_err()
    .to_string();
    assert!(text.contains("belong to a `kind: Gateway`"), "{text}");
}
