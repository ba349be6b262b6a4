//! Text → `DnsName::parse`.
//!
//! Invariants: never panics; an accepted name is canonical (lowercase, trailing dot, not the
//! root, at most 255 bytes on the wire) and parsing its canonical text gives the same name.
#![no_main]

use fqdnd_namemgr::{DnsName, canonicalize};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(name) = DnsName::parse(&text) else {
        return;
    };
    let canonical = name.as_str();
    assert!(
        canonical.ends_with('.'),
        "{canonical:?} has no trailing dot"
    );
    assert_ne!(canonical, ".", "the root was accepted");
    // Wire length is the text length (with its trailing dot) + 1, at most 255.
    assert!(canonical.len() < 255, "{canonical:?} is too long");
    assert!(
        !canonical.bytes().any(|b| b.is_ascii_uppercase()),
        "{canonical:?} is not lowercase"
    );
    assert_eq!(
        canonical,
        canonicalize(&text),
        "as_str is not canonicalize(input)"
    );
    let again = DnsName::parse(canonical).unwrap_or_else(|e| {
        panic!("canonical form {canonical:?} of {text:?} does not re-parse: {e}")
    });
    assert_eq!(again, name, "re-parsing {canonical:?} changed the name");
    assert_eq!(again.as_str(), canonical);
});
