//! Raw client bytes → the proxy's query path (`fqdnd_dnsproxy::fuzz::query_path`): parse once
//! with hickory-proto, walk the question on the wire, canonical name, a policy verdict from a
//! compiled `Matcher` (as the gateway's DNS rules), and the reply the proxy writes itself or the
//! bytes it forwards (ID rewritten; with 0x20, the name's case randomised).
//!
//! Invariants: never panics; a name is canonical (non-empty, trailing dot, no ASCII capital);
//! the verdict equals the selectors' own `matches` on that name; a reply the proxy writes parses
//! as a response with the client's ID and echoes the question byte for byte; forwarded bytes
//! differ from the client's only in the ID and, with 0x20, the case of the name's letters.
#![no_main]

use std::sync::OnceLock;

use fqdnd_dnsproxy::fuzz::query_path;
use fqdnd_dnsproxy::{QueryInfo, QueryPolicy, Verdict};
use fqdnd_namemgr::{FqdnSelector, Matcher, SelectorId};
use hickory_proto::op::{Message, MessageType};
use libfuzzer_sys::fuzz_target;

const PATTERNS: &[&str] = &["*.example.com", "**.cilium.io", "api.*.github.com", "*"];
const NAMES: &[&str] = &["www.example.net", "_sip._udp.example.org"];

struct Rules {
    selectors: Vec<FqdnSelector>,
    matcher: Matcher,
}

fn rules() -> &'static Rules {
    static RULES: OnceLock<Rules> = OnceLock::new();
    RULES.get_or_init(|| {
        // Without the lone `*`: it would allow everything.
        let mut selectors: Vec<FqdnSelector> = PATTERNS[..3]
            .iter()
            .map(|p| FqdnSelector::match_pattern(p).expect("pattern"))
            .collect();
        selectors.extend(
            NAMES
                .iter()
                .map(|n| FqdnSelector::match_name(n).expect("name")),
        );
        let mut matcher = Matcher::new();
        for (i, s) in selectors.iter().enumerate() {
            matcher.insert(s, SelectorId(i as u32));
        }
        Rules { selectors, matcher }
    })
}

impl QueryPolicy for Rules {
    fn check(&self, query: &QueryInfo<'_>) -> Verdict {
        if self.matcher.is_match(query.name) {
            Verdict::Allow { tag: 1 }
        } else {
            Verdict::Deny { tag: 1 }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let rules = rules();
    for randomize in [false, true] {
        let path = query_path(data, rules, randomize);
        if let Some(name) = &path.name {
            assert!(name.ends_with('.'), "{name:?}");
            assert!(!name.bytes().any(|b| b.is_ascii_uppercase()), "{name:?}");
            let direct = rules.selectors.iter().any(|s| s.matches(name));
            let allowed = matches!(path.verdict, Some(Verdict::Allow { .. }));
            assert_eq!(
                allowed, direct,
                "Matcher and selectors disagree on {name:?}"
            );
            assert_eq!(path.forwarded.is_some(), allowed);
        }
        if let Some(reply) = &path.reply {
            let msg = Message::from_vec(reply).expect("the proxy's own reply parses");
            assert_eq!(msg.metadata.message_type, MessageType::Response);
            assert_eq!(reply[..2], data[..2], "the client's ID");
            if let Some(end) = path.question_end {
                assert_eq!(reply[12..end], data[12..end], "the question, byte for byte");
            }
        }
        if let Some(sent) = &path.forwarded {
            let end = path.question_end.expect("a forwarded query has a question");
            assert_eq!(sent.len(), data.len());
            assert_eq!(sent[..2], [0xab, 0xcd]);
            assert_eq!(sent[2..12], data[2..12]);
            assert_eq!(sent[end - 4..], data[end - 4..], "type, class and the rest");
            for (a, b) in sent[12..end - 4].iter().zip(&data[12..end - 4]) {
                let same = if randomize {
                    a.eq_ignore_ascii_case(b)
                } else {
                    a == b
                };
                assert!(same && (a == b || a.is_ascii_alphabetic()));
            }
        }
    }
});
