//! A message's question section, parsed once: [`Question`] is the proof that a message's first
//! question lies within its bytes, and the only way to reach the question's name and bytes.
//! Nothing else in the crate handles question offsets, so the code that rewrites a name's case
//! or copies a question into a reply cannot be handed an offset nobody checked.

use crate::wire::{HEADER_LEN, qdcount};

/// The bounds of a message's first question: its name starts right after the header, and
/// QTYPE and QCLASS end at [`Question::end`]. Made only by [`Question::parse`], which walks
/// the name's labels on the wire; as small as the offset it holds.
///
/// A `Question` describes the message it was parsed from. Its methods take that message
/// again; the message may have been changed since in its ID or in the case of its name (the
/// only rewrites the proxy makes), never shortened before the question's end: a shorter one
/// panics (a bug, not bad input).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Question {
    /// Where the question ends (after QTYPE and QCLASS); at most `raw.len()`, at least
    /// `HEADER_LEN + 5`.
    end: usize,
}

impl Question {
    /// Walks the first question's name from offset 12. `None` if the message has no question,
    /// the name is compressed (a question name comes first in the message, so it never needs
    /// to be), longer than 255 bytes, or the question runs past the end.
    pub(crate) fn parse(raw: &[u8]) -> Option<Self> {
        if qdcount(raw) == 0 {
            return None;
        }
        let mut pos = HEADER_LEN;
        loop {
            let len = usize::from(*raw.get(pos)?);
            if len == 0 {
                pos += 1;
                break;
            }
            if len > 63 {
                return None;
            }
            pos += 1 + len;
            if pos - HEADER_LEN > 255 {
                return None;
            }
        }
        let end = pos + 4;
        (end <= raw.len()).then_some(Self { end })
    }

    /// Where the question ends: the length of the message's header and question.
    pub(crate) fn end(self) -> usize {
        self.end
    }

    /// The question section: the name's wire form, QTYPE and QCLASS.
    pub(crate) fn bytes(self, raw: &[u8]) -> &[u8] {
        &raw[HEADER_LEN..self.end]
    }

    /// The name's wire form (its labels, the root label included).
    pub(crate) fn name(self, raw: &[u8]) -> &[u8] {
        &raw[HEADER_LEN..self.end - 4]
    }

    /// The name's wire form, to rewrite the case of its letters in place.
    pub(crate) fn name_mut(self, raw: &mut [u8]) -> &mut [u8] {
        &mut raw[HEADER_LEN..self.end - 4]
    }

    /// QTYPE.
    pub(crate) fn qtype(self, raw: &[u8]) -> u16 {
        u16::from_be_bytes([raw[self.end - 4], raw[self.end - 3]])
    }

    /// QCLASS.
    pub(crate) fn qclass(self, raw: &[u8]) -> u16 {
        u16::from_be_bytes([raw[self.end - 2], raw[self.end - 1]])
    }

    /// The answer cache's key for this question of `raw` (the query or its answer).
    pub(crate) fn cache_key<'a>(
        self,
        raw: &[u8],
        name: &'a str,
        flags: u8,
        tag: u64,
    ) -> crate::cache::KeyRef<'a> {
        crate::cache::KeyRef {
            name,
            qtype: self.qtype(raw),
            qclass: self.qclass(raw),
            flags,
            tag,
        }
    }

    /// Whether this question of `raw` and `other`'s of `other_raw` are the same: the name
    /// compared ASCII-case-insensitively (RFC 4343), QTYPE and QCLASS exactly.
    pub(crate) fn same(self, raw: &[u8], other: Self, other_raw: &[u8]) -> bool {
        if self.end != other.end {
            return false;
        }
        let (a, b) = (self.bytes(raw), other.bytes(other_raw));
        let split = a.len() - 4;
        // The same bytes, the common case (one `memcmp`); else the name's case folded (label
        // length bytes are below 64, so folding never changes them).
        a == b || (a[..split].eq_ignore_ascii_case(&b[..split]) && a[split..] == b[split..])
    }

    /// Appends the name in canonical form: lowercase, labels joined by dots, with a trailing
    /// dot (`.` for the root). Bytes that are not printable ASCII, and `.` or `\` inside a
    /// label, are escaped as `\DDD` / `\.` / `\\` so that distinct names stay distinct.
    pub(crate) fn canonical_name(self, raw: &[u8], out: &mut String) {
        let name = self.name(raw);
        let mut pos = 0;
        while let Some(&len) = name.get(pos) {
            let len = usize::from(len);
            if len == 0 {
                break;
            }
            fqdnd_dnswire::push_label(out, &name[pos + 1..pos + 1 + len]);
            pos += 1 + len;
        }
        if out.is_empty() {
            out.push('.');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &[u8], qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        q.extend_from_slice(name);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&1u16.to_be_bytes());
        q
    }

    fn canonical(raw: &[u8]) -> String {
        let mut name = String::new();
        Question::parse(raw).unwrap().canonical_name(raw, &mut name);
        name
    }

    #[test]
    fn question_walk_and_canonical_name() {
        let q = query(b"\x03WwW\x07Example\x03COM\x00", 1);
        let question = Question::parse(&q).unwrap();
        assert_eq!(question.end(), q.len());
        assert_eq!(question.qtype(&q), 1);
        assert_eq!(question.name(&q), b"\x03WwW\x07Example\x03COM\x00");
        assert_eq!(question.bytes(&q), &q[HEADER_LEN..]);
        assert_eq!(canonical(&q), "www.example.com.");
        assert_eq!(canonical(&query(b"\x00", 2)), ".");
        assert_eq!(canonical(&query(b"\x03a.\x01\x00", 1)), "a\\.\\001.");
    }

    #[test]
    fn compressed_long_or_short_questions_are_rejected() {
        let mut q = query(b"\xc0\x0c", 1);
        assert_eq!(Question::parse(&q), None);
        q = query(b"\x03www\x00", 1);
        q.truncate(q.len() - 1);
        assert_eq!(Question::parse(&q), None);
        let mut none = query(b"\x00", 1);
        none[5] = 0;
        assert_eq!(Question::parse(&none), None);
        // 5 labels of 63 bytes: 320 bytes of name.
        let long: Vec<u8> = (0..5)
            .flat_map(|_| std::iter::once(63).chain([b'a'; 63]))
            .chain([0])
            .collect();
        assert_eq!(Question::parse(&query(&long, 1)), None);
        // Every header shorter than 12 bytes.
        for n in 0..HEADER_LEN {
            assert_eq!(Question::parse(&query(b"\x00", 1)[..n]), None);
        }
    }

    #[test]
    fn same_question_folds_case_of_the_name_only() {
        let a = query(b"\x03WWW\x00", 0x41);
        let b = query(b"\x03www\x00", 0x41);
        let c = query(b"\x03www\x00", 0x61);
        let d = query(b"\x04wwww\x00", 0x41);
        let [qa, qb, qc, qd] = [&a, &b, &c, &d].map(|m| Question::parse(m).unwrap());
        assert!(qa.same(&a, qa, &a), "the very bytes");
        assert!(qa.same(&a, qb, &b));
        assert!(!qa.same(&a, qc, &c));
        assert!(!qb.same(&b, qd, &d), "another length");
    }
}
