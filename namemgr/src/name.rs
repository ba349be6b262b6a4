//! DNS names as fqdnd stores them: canonical text (ASCII-lowercase, trailing dot) and the
//! validation a name must pass before it may enter the DNS cache.
//!
//! Two levels live here:
//! - [`canonicalize`] only normalises (lowercase + trailing dot) and never fails; it is what
//!   matching ([`crate::pattern`], [`crate::matcher`]) expects as input.
//! - [`DnsName::parse`] also validates: only names made of real labels (1..=63 bytes of
//!   `[-a-z0-9_]`) and at most 255 bytes on the wire are stored.

use std::borrow::{Borrow, Cow};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Longest name on the wire (RFC 1035 §2.3.4): label bytes + one length byte per label + the
/// root's zero byte.
pub const MAX_WIRE_LEN: usize = 255;

/// Longest label (RFC 1035 §2.3.4).
pub const MAX_LABEL_LEN: usize = 63;

/// Canonical text of a name: ASCII-lowercased, with a trailing dot added if missing
/// (`""` becomes the root `"."`). Nothing is validated; non-ASCII characters are kept as they are.
///
/// Borrows when the name is already canonical.
#[must_use]
pub fn canonicalize(name: &str) -> Cow<'_, str> {
    let has_upper = name.bytes().any(|b| b.is_ascii_uppercase());
    let has_dot = name.ends_with('.');
    if !has_upper && has_dot {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 1);
    out.push_str(name);
    out.make_ascii_lowercase();
    if !has_dot {
        out.push('.');
    }
    Cow::Owned(out)
}

/// Why a name cannot be stored (see [`DnsName::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is the root `.` (or empty): fqdnd stores no answers for the root.
    #[error(
        "the root name '.' cannot be stored: expected at least one label such as 'example.com'"
    )]
    Root,
    /// The name is longer than 255 bytes on the wire.
    #[error("name is {len} bytes long on the wire: at most 255 are allowed")]
    TooLong {
        /// Wire length of the canonical name: its text length (with the trailing dot) + 1.
        len: usize,
    },
    /// Two dots in a row, or a leading dot.
    #[error(
        "empty label (two dots in a row or a leading dot): every label needs 1 to 63 characters"
    )]
    EmptyLabel,
    /// A label longer than 63 bytes.
    #[error("label is {label_len} bytes long: a label may be at most 63")]
    LabelTooLong {
        /// Length of the offending label in bytes.
        label_len: usize,
    },
    /// A character other than letters, digits, `-` and `_` inside a label.
    #[error(
        "invalid character {ch:?}: a name may contain only letters, digits, '-' and '_' between dots"
    )]
    InvalidCharacter {
        /// The first offending character (as written, before lowercasing).
        ch: char,
    },
}

/// A validated DNS name in canonical form (lowercase, trailing dot), cheap to clone.
///
/// Ordering, equality and hashing are those of the canonical text, so a `HashMap<DnsName, _>`
/// can be queried with a canonical `&str`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DnsName(Arc<str>);

impl DnsName {
    /// Canonicalises `name` and checks that it is a name fqdnd may store: not the root, every
    /// label 1..=63 bytes of `[-a-z0-9_]` (after lowercasing), at most 255 bytes on the wire.
    ///
    /// # Errors
    /// The first problem found, checked in this order: [`NameError::Root`],
    /// [`NameError::TooLong`], then label by label from the left [`NameError::EmptyLabel`],
    /// [`NameError::LabelTooLong`], [`NameError::InvalidCharacter`].
    pub fn parse(name: &str) -> Result<Self, NameError> {
        Self::canonical(name).map(|text| Self(Arc::from(text.as_ref())))
    }

    /// The checks of [`DnsName::parse`], giving the canonical text: `name` itself, without
    /// an allocation, when it is canonical already (as the proxy hands names over).
    ///
    /// # Errors
    /// As [`DnsName::parse`].
    pub fn canonical(name: &str) -> Result<Cow<'_, str>, NameError> {
        let body = name.strip_suffix('.').unwrap_or(name);
        if body.is_empty() {
            return Err(NameError::Root);
        }
        // Canonical text is `body` + '.', the wire form one byte more.
        let wire_len = body.len() + 2;
        if wire_len > MAX_WIRE_LEN {
            return Err(NameError::TooLong { len: wire_len });
        }
        // One pass over the bytes for the names that pass (all but hostile ones); a name
        // that does not is walked again label by label, for the first problem in order.
        if !labels_are_valid(body.as_bytes()) {
            return Err(first_label_problem(body));
        }
        Ok(canonicalize(name))
    }

    /// The canonical text, e.g. `"www.example.com."`.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shared canonical text.
    #[must_use]
    pub fn as_arc(&self) -> &Arc<str> {
        &self.0
    }

    /// Number of labels (`"www.example.com."` has 3).
    #[must_use]
    pub fn label_count(&self) -> usize {
        // A stored name has no empty labels, so every dot ends one label.
        self.0.bytes().filter(|&b| b == b'.').count()
    }
}

/// Characters allowed inside a stored label, in either case (`[-a-zA-Z0-9_]`).
fn is_label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// Whether every label of `body` (a name without its trailing dot) is 1 to 63 bytes of
/// [`is_label_char`] characters.
fn labels_are_valid(body: &[u8]) -> bool {
    let mut len = 0;
    for &b in body {
        if b == b'.' {
            if len == 0 {
                return false;
            }
            len = 0;
        } else if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            len += 1;
            if len > MAX_LABEL_LEN {
                return false;
            }
        } else {
            return false;
        }
    }
    len > 0
}

/// The first problem of `body`'s labels, from the left: an empty label, one too long, a
/// character not allowed. For a `body` [`labels_are_valid`] refused.
fn first_label_problem(body: &str) -> NameError {
    for label in body.split('.') {
        if label.is_empty() {
            return NameError::EmptyLabel;
        }
        if label.len() > MAX_LABEL_LEN {
            return NameError::LabelTooLong {
                label_len: label.len(),
            };
        }
        if let Some(ch) = label.chars().find(|&c| !is_label_char(c)) {
            return NameError::InvalidCharacter { ch };
        }
    }
    // Unreachable for a refused body; an empty label is the closest description.
    NameError::EmptyLabel
}

impl fmt::Display for DnsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for DnsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DnsName({:?})", &*self.0)
    }
}

impl FromStr for DnsName {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl AsRef<str> for DnsName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for DnsName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<DnsName> for Arc<str> {
    fn from(name: DnsName) -> Self {
        name.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn canonicalize_lowercases_and_adds_dot() {
        assert_eq!(canonicalize("WWW.Example.COM"), "www.example.com.");
        assert_eq!(canonicalize("www.example.com."), "www.example.com.");
        assert!(matches!(canonicalize("a.b."), Cow::Borrowed(_)));
        assert_eq!(canonicalize(""), ".");
        assert_eq!(canonicalize("."), ".");
        // No validation: odd characters and empty labels are kept.
        assert_eq!(canonicalize("A..B"), "a..b.");
        assert_eq!(canonicalize("Ü b"), "Ü b.");
    }

    #[test]
    fn parse_accepts_and_canonicalises() {
        let n = DnsName::parse("WWW.Cilium.IO").unwrap();
        assert_eq!(n.as_str(), "www.cilium.io.");
        assert_eq!(n.to_string(), "www.cilium.io.");
        assert_eq!(n.label_count(), 3);
        assert_eq!(n, DnsName::parse("www.cilium.io.").unwrap());
        assert_eq!(&**n.as_arc(), "www.cilium.io.");
        assert_eq!(
            "_srv-1.a_b.x".parse::<DnsName>().unwrap().as_str(),
            "_srv-1.a_b.x."
        );
        let set: HashSet<DnsName> = [n.clone()].into_iter().collect();
        assert!(set.contains("www.cilium.io."));
    }

    #[test]
    fn parse_rejects_root_and_empty_labels() {
        assert_eq!(DnsName::parse(""), Err(NameError::Root));
        assert_eq!(DnsName::parse("."), Err(NameError::Root));
        assert_eq!(DnsName::parse("a..b"), Err(NameError::EmptyLabel));
        assert_eq!(DnsName::parse(".a"), Err(NameError::EmptyLabel));
        assert_eq!(DnsName::parse("a.."), Err(NameError::EmptyLabel));
    }

    #[test]
    fn parse_rejects_bad_characters() {
        assert_eq!(
            DnsName::parse("a b.com"),
            Err(NameError::InvalidCharacter { ch: ' ' })
        );
        assert_eq!(
            DnsName::parse("ü.com"),
            Err(NameError::InvalidCharacter { ch: 'ü' })
        );
        assert_eq!(
            DnsName::parse("*.com"),
            Err(NameError::InvalidCharacter { ch: '*' })
        );
        let msg = DnsName::parse("a!b").unwrap_err().to_string();
        assert!(
            msg.contains("'!'") && msg.contains("letters, digits"),
            "{msg}"
        );
    }

    #[test]
    fn label_length_limit() {
        let ok = "a".repeat(63);
        assert!(DnsName::parse(&format!("{ok}.com")).is_ok());
        let long = "a".repeat(64);
        assert_eq!(
            DnsName::parse(&format!("{long}.com")),
            Err(NameError::LabelTooLong { label_len: 64 })
        );
    }

    proptest::proptest! {
        /// The one-pass check accepts exactly the bodies whose labels, walked one by one,
        /// show no problem.
        #[test]
        fn the_fast_label_check_agrees_with_the_label_walk(
            body in "([a-zZ0-9_ü*. -]|a{60,64}){0,12}",
        ) {
            let walk = body.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= MAX_LABEL_LEN
                    && label.chars().all(is_label_char)
            });
            proptest::prop_assert_eq!(labels_are_valid(body.as_bytes()), walk);
        }
    }

    #[test]
    fn wire_length_limit() {
        // 4 labels of 63 bytes = 252 + 4 length bytes + root = 257: too long.
        let l = "a".repeat(63);
        let name = format!("{l}.{l}.{l}.{l}");
        assert_eq!(DnsName::parse(&name), Err(NameError::TooLong { len: 257 }));
        // 3×63 + 61 = 250 label bytes + 4 + 1 = 255: the longest allowed.
        let max = format!("{l}.{l}.{l}.{}", "b".repeat(61));
        let n = DnsName::parse(&max).unwrap();
        assert_eq!(n.as_str().len() + 1, 255);
        let over = format!("{l}.{l}.{l}.{}", "b".repeat(62));
        assert_eq!(DnsName::parse(&over), Err(NameError::TooLong { len: 256 }));
        // Trailing dot or not: the same wire length.
        assert_eq!(
            DnsName::parse(&format!("{over}.")),
            Err(NameError::TooLong { len: 256 })
        );
    }
}
