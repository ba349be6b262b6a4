//! YAML document splitting → `fqdnd_config::documents`, which every policy and configuration
//! file goes through before any document is parsed.
//!
//! Invariants: never panics; nothing is lost or reordered (the documents, joined, are the
//! input); every document is non-empty, starts where the previous one ended, at the start of a
//! line, and its `first_line` is one more than the line breaks (`\n`, `\r\n`, lone `\r`)
//! before it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Files are decoded to text before they are split.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let breaks =
        |s: &str| s.matches('\n').count() + s.matches('\r').count() - s.matches("\r\n").count();
    let mut offset = 0;
    let mut lines_before = 0;
    for doc in fqdnd_config::documents(text) {
        assert!(!doc.text.is_empty(), "empty document at {offset}");
        assert_eq!(doc.offset, offset);
        assert_eq!(text.get(offset..offset + doc.text.len()), Some(doc.text));
        // A document starts a line: never between the `\r` and `\n` of one line break.
        assert!(
            !(text[..offset].ends_with('\r') && doc.text.starts_with('\n')),
            "split inside a CRLF at {offset}"
        );
        assert!(
            offset == 0 || text[..offset].ends_with(['\n', '\r']),
            "split mid-line at {offset}"
        );
        assert_eq!(doc.first_line, lines_before + 1);
        let _ = doc.is_blank();
        lines_before += breaks(doc.text);
        offset += doc.text.len();
    }
    assert_eq!(offset, text.len(), "text lost after the last document");
});
