//! (pattern, name) text → `FqdnSelector::match_pattern` / `match_name`, checked against the
//! compiled `Matcher`.
//!
//! The input is split at its first NUL byte: before it the pattern, after it the name (both
//! lossily UTF-8). Invariants: never panics; for every selector that parses,
//! `selector.matches(&canonicalize(name))` equals a `Matcher` holding only that selector, and
//! the selector's key re-parses to an equal selector.
#![no_main]

use fqdnd_namemgr::{FqdnSelector, Matcher, SelectorId, canonicalize};
use libfuzzer_sys::fuzz_target;

fn check(selector: &FqdnSelector, reparse: fn(&str) -> Option<FqdnSelector>, name: &str) {
    let canonical = canonicalize(name);
    let direct = selector.matches(&canonical);
    let mut matcher = Matcher::new();
    matcher.insert(selector, SelectorId(7));
    let compiled = matcher.is_match(&canonical);
    assert_eq!(
        direct,
        compiled,
        "selector {:?} ({:?}) on {canonical:?}: FqdnSelector::matches = {direct}, Matcher::is_match = {compiled}",
        selector.key(),
        selector.kind(),
    );
    let ids = matcher.matches(&canonical);
    assert_eq!(
        ids.is_empty(),
        !compiled,
        "Matcher::matches disagrees with is_match"
    );
    // The raw (non-canonical) text too: both promise the same answer for any string.
    assert_eq!(
        selector.matches(name),
        matcher.is_match(name),
        "selector {:?} on raw {name:?}",
        selector.key(),
    );
    let again = reparse(selector.key())
        .unwrap_or_else(|| panic!("key {:?} does not re-parse", selector.key()));
    assert_eq!(again.key(), selector.key(), "key is not stable");
    assert_eq!(
        again.matches(&canonical),
        direct,
        "re-parsed key matches differently"
    );
}

fuzz_target!(|data: &[u8]| {
    let (pattern, name) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b""[..]),
    };
    let pattern = String::from_utf8_lossy(pattern);
    let name = String::from_utf8_lossy(name);
    if let Ok(selector) = FqdnSelector::match_pattern(&pattern) {
        check(&selector, |k| FqdnSelector::match_pattern(k).ok(), &name);
    }
    if let Ok(selector) = FqdnSelector::match_name(&pattern) {
        check(&selector, |k| FqdnSelector::match_name(k).ok(), &name);
    }
});
