//! Allow/deny list text → `fqdnd_engine::dns::lists::NameList::add_text` (hosts files, plain
//! names, `*.` wildcards, AdBlock `||name^` lines: files an operator downloads from elsewhere).
//!
//! Invariants: never panics; every skipped line number is a line of the input; a line that is
//! one plain name (no wildcard, hosts address or AdBlock syntax) and was not skipped makes the
//! list contain that name, canonicalised, and every name one label below it.
#![no_main]

use fqdnd_engine::dns::lists::NameList;
use fqdnd_namemgr::canonicalize;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut list = NameList::default();
    let skipped = list.add_text(&text);
    let lines = text.lines().count();
    for s in &skipped {
        assert!(
            (1..=lines).contains(&s.line),
            "skipped line {} of {lines}",
            s.line
        );
    }
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or_default().trim();
        let plain = !line.is_empty()
            && !line.contains(char::is_whitespace)
            && !line.starts_with(['!', '[', '|', '*', '@'])
            && line.parse::<std::net::IpAddr>().is_err();
        if !plain || skipped.iter().any(|s| s.line == n + 1) {
            continue;
        }
        let name = canonicalize(line);
        assert!(list.contains(&name), "{line:?} accepted but {name:?} not on the list");
        let below = format!("x.{name}");
        if below.len() <= 254 {
            assert!(list.contains(&below), "{line:?} accepted but {below:?} not on the list");
        }
    }
});
