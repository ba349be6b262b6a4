//! FQDN selectors (`matchName` / `matchPattern`): validation, the canonical key that identifies
//! a selector, and single-selector matching with exactly Cilium's `pkg/fqdn/matchpattern`
//! semantics.
//!
//! Cilium turns a pattern into an anchored regex; fqdnd compiles it into labels instead, with
//! the same answer for every input string:
//!
//! - The pattern is trimmed and ASCII-lowercased; it may hold only `[-a-z0-9_.*]` and at most
//!   255 characters.
//! - A *pure wildcard* (`*`, `**`, `*.`, `**.`, …: stars, then at most one dot) matches the root
//!   `.` and every name made of one or more non-empty labels of `[-a-zA-Z0-9_]`.
//! - Otherwise a trailing dot is added. A leading `**.` (two or more stars, then a dot) matches
//!   one or more whole non-empty labels of `[-a-zA-Z0-9_]`. Every other run of stars matches
//!   zero or more characters of `[-a-zA-Z0-9_]` inside one label (never a dot). Everything
//!   else is literal. So `*.cilium.io` matches `sub.cilium.io.` (and `.cilium.io.`) but not
//!   `cilium.io.` nor `a.b.cilium.io.`, while `**.cilium.io` matches any depth ≥ 1 below it.
//!
//! Because stars never cross a dot, a compiled pattern is a fixed list of label matchers
//! (right-to-left), optionally preceded by the "one or more labels" prefix.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use smallvec::SmallVec;

mod overlap;

/// Longest pattern or name accepted in a selector, in characters (after trimming, not
/// counting one trailing dot, so that a selector's key — which always has one — parses again).
pub const MAX_PATTERN_LEN: usize = 255;

/// Why a `matchName` or `matchPattern` is rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PatternError {
    /// Nothing but whitespace.
    #[error(
        "empty pattern: expected a DNS name such as 'example.com' or a pattern such as '*.example.com'"
    )]
    Empty,
    /// More than 255 characters after trimming.
    #[error("pattern is {len} characters long: at most 255 are allowed")]
    TooLong {
        /// Length in characters of the trimmed text.
        len: usize,
    },
    /// A character outside `[-a-zA-Z0-9_.*]`.
    #[error(
        "invalid character {ch:?} at position {position}: a name or pattern may contain only \
         letters, digits, '-', '_', '.' and (in a matchPattern) '*'"
    )]
    InvalidCharacter {
        /// The offending character.
        ch: char,
        /// Zero-based character index in the trimmed text.
        position: usize,
    },
    /// A `*` in a `matchName`.
    #[error("'*' is not allowed in a matchName: use matchPattern for wildcards")]
    WildcardInName,
}

/// Which field a selector came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SelectorKind {
    /// `matchName`: one exact name.
    MatchName,
    /// `matchPattern`: a name with `*` wildcards.
    MatchPattern,
}

/// A validated `matchName` or `matchPattern`, compiled for matching.
///
/// Identity is the canonical [`key`](Self::key) alone: a `matchName` and a `matchPattern`
/// with the same canonical text are equal (and hash equally), whatever their
/// [`kind`](Self::kind). Cheap to clone.
#[derive(Clone)]
pub struct FqdnSelector(Arc<Inner>);

struct Inner {
    key: Box<str>,
    kind: SelectorKind,
    compiled: Compiled,
}

/// The compiled form of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Compiled {
    /// A pure wildcard: the root `.` or one or more non-empty labels of `[-a-zA-Z0-9_]`.
    All,
    /// A fixed sequence of labels.
    Labels {
        /// Label matchers from the right (TLD first), one per label of the name.
        labels: Box<[LabelPattern]>,
        /// Leading `**.`: one or more further non-empty labels of `[-a-zA-Z0-9_]` must
        /// precede `labels`.
        multi: bool,
    },
}

/// Matcher for one label (the text between two dots).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum LabelPattern {
    /// Exactly this text (possibly empty: the pattern `a..b` has an empty middle label).
    Literal(Box<str>),
    /// Literal characters and `*` (zero or more characters of `[-a-zA-Z0-9_]`).
    Glob(Glob),
}

/// Where a matcher files a glob label so that a lookup tests only globs that can match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum GlobBucket {
    /// Matching labels end with these two bytes.
    Suffix([u8; 2]),
    /// Matching labels start with these two bytes.
    Prefix([u8; 2]),
    /// No two-byte literal end: tested against every label.
    Any,
}

/// A label with at least one `*`, runs of stars collapsed into one (same language).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Glob {
    /// The normalised text.
    text: Box<str>,
    /// Length of the literal text before the first star.
    prefix: usize,
    /// Length of the literal text after the last star.
    suffix: usize,
}

impl Glob {
    fn new(segment: &str) -> Self {
        let mut text = String::with_capacity(segment.len());
        for c in segment.chars() {
            if !(c == '*' && text.ends_with('*')) {
                text.push(c);
            }
        }
        let prefix = text.find('*').unwrap_or(text.len());
        let suffix = text.len() - text.rfind('*').map_or(0, |i| i + 1);
        Self {
            text: text.into_boxed_str(),
            prefix,
            suffix,
        }
    }

    /// The bucket a matcher files this glob under: two literal bytes every label it matches
    /// must end (or else start) with, or none when its literal ends are shorter than that.
    pub(crate) fn bucket(&self) -> GlobBucket {
        let bytes = self.text.as_bytes();
        if self.suffix >= 2 {
            GlobBucket::Suffix([bytes[bytes.len() - 2], bytes[bytes.len() - 1]])
        } else if self.prefix >= 2 {
            GlobBucket::Prefix([bytes[0], bytes[1]])
        } else {
            GlobBucket::Any
        }
    }

    /// Does this glob match the whole `label`?
    pub(crate) fn is_match(&self, label: &str) -> bool {
        // Literal characters of a pattern are all in the class, so any label matched is made
        // of class characters only: check that first, then match `*` as "anything".
        is_class_label(label) && self.is_match_class_label(label)
    }

    /// [`Self::is_match`] for a label already known to pass [`is_class_label`].
    pub(crate) fn is_match_class_label(&self, label: &str) -> bool {
        let (pat, s) = (self.text.as_bytes(), label.as_bytes());
        if s.len() < self.prefix + self.suffix
            || !s.starts_with(&pat[..self.prefix])
            || !s.ends_with(&pat[pat.len() - self.suffix..])
        {
            return false;
        }
        // What is left of the pattern starts and ends with a star.
        let middle = &pat[self.prefix..pat.len() - self.suffix];
        middle == b"*" || glob_match(middle, &s[self.prefix..s.len() - self.suffix])
    }
}

/// Is every byte of `label` in `[-a-zA-Z0-9_]` (true for the empty label)?
pub(crate) fn is_class_label(label: &str) -> bool {
    label.bytes().all(is_class_byte)
}

/// Classic wildcard matching with backtracking to the last star; `*` matches any run.
fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        match pat.get(p) {
            Some(b'*') => {
                star = Some((p, i));
                p += 1;
            }
            Some(&c) if c == s[i] => {
                p += 1;
                i += 1;
            }
            _ => match star {
                Some((sp, si)) => {
                    p = sp + 1;
                    i = si + 1;
                    star = Some((sp, si + 1));
                }
                None => return false,
            },
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

impl LabelPattern {
    /// Does this matcher accept the whole `label`?
    pub(crate) fn is_match(&self, label: &str) -> bool {
        match self {
            Self::Literal(lit) => **lit == *label,
            Self::Glob(glob) => glob.is_match(label),
        }
    }
}

/// The regex class `[-a-zA-Z0-9_]` used by stars and by the "one or more labels" parts.
pub(crate) fn is_class_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// A name to match, split into labels once.
///
/// `None` from [`SplitName::new`] means the name does not end with a dot, which no selector
/// matches (every compiled regex ends in `[.]$`).
pub(crate) struct SplitName<'a> {
    /// The name without its final dot.
    body: &'a str,
    /// Where each label ends in `body` (at a dot, or at the end), from the left; the root `.`
    /// is one empty label. Offsets, not slices: the split is a quarter of the size to build
    /// and move.
    ends: SmallVec<[u32; 16]>,
    /// How many labels from the left are non-empty and all `[-a-zA-Z0-9_]`.
    pub(crate) valid_prefix: usize,
}

impl<'a> SplitName<'a> {
    pub(crate) fn new(name: &'a str) -> Option<Self> {
        let body = name.strip_suffix('.')?;
        // One pass over the bytes: the labels, and how many from the left are valid.
        let mut ends: SmallVec<[u32; 16]> = SmallVec::new();
        let mut valid_prefix = 0;
        let mut all_valid = true;
        let mut label_valid = true;
        let mut start = 0;
        let mut end_label = |start: usize, end: usize, label_valid: bool| {
            all_valid &= label_valid && start < end;
            valid_prefix += usize::from(all_valid);
            ends.push(u32::try_from(end).ok()?);
            Some(())
        };
        for (i, &b) in body.as_bytes().iter().enumerate() {
            if b == b'.' {
                end_label(start, i, label_valid)?;
                start = i + 1;
                label_valid = true;
            } else {
                label_valid &= is_class_byte(b);
            }
        }
        end_label(start, body.len(), label_valid)?;
        Some(Self {
            body,
            ends,
            valid_prefix,
        })
    }

    /// Number of labels.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Label `i` from the left (empty past the last).
    pub(crate) fn label(&self, i: usize) -> &'a str {
        let start = match i.checked_sub(1) {
            Some(before) => self
                .ends
                .get(before)
                .map_or(usize::MAX, |&e| e as usize + 1),
            None => 0,
        };
        let end = self.ends.get(i).map_or(0, |&e| e as usize);
        self.body.get(start..end).unwrap_or_default()
    }

    /// Is this the root name `.`?
    pub(crate) fn is_root(&self) -> bool {
        self.len() == 1 && self.body.is_empty()
    }

    /// Does a pure wildcard match this name?
    pub(crate) fn matches_all(&self) -> bool {
        self.is_root() || self.valid_prefix == self.len()
    }

    /// Can the `remaining` leftmost labels be covered by a leading `**.`?
    pub(crate) fn multi_covers(&self, remaining: usize) -> bool {
        remaining >= 1 && remaining <= self.valid_prefix
    }
}

impl FqdnSelector {
    /// A `matchName`: trimmed, lowercased, with a trailing dot added; `*` is rejected.
    ///
    /// # Errors
    /// [`PatternError::Empty`], [`PatternError::TooLong`], [`PatternError::WildcardInName`] or
    /// [`PatternError::InvalidCharacter`] (whichever comes first, length before characters).
    pub fn match_name(name: &str) -> Result<Self, PatternError> {
        let text = validate(name, SelectorKind::MatchName)?;
        let key = sanitize(text);
        let compiled = compile_labels(&key, false);
        Ok(Self::from_parts(key, SelectorKind::MatchName, compiled))
    }

    /// A `matchPattern`: trimmed, lowercased, sanitised (trailing dot added unless it is a pure
    /// wildcard or already ends with a dot) and compiled.
    ///
    /// # Errors
    /// [`PatternError::Empty`], [`PatternError::TooLong`] or
    /// [`PatternError::InvalidCharacter`] (length before characters).
    pub fn match_pattern(pattern: &str) -> Result<Self, PatternError> {
        let text = validate(pattern, SelectorKind::MatchPattern)?;
        if is_pure_wildcard(&text) {
            return Ok(Self::from_parts(
                text,
                SelectorKind::MatchPattern,
                Compiled::All,
            ));
        }
        let key = sanitize(text);
        let stars = key.bytes().take_while(|&b| b == b'*').count();
        let compiled = if stars >= 2 && key.as_bytes().get(stars) == Some(&b'.') {
            compile_labels(&key[stars + 1..], true)
        } else {
            compile_labels(&key, false)
        };
        Ok(Self::from_parts(key, SelectorKind::MatchPattern, compiled))
    }

    fn from_parts(key: String, kind: SelectorKind, compiled: Compiled) -> Self {
        Self(Arc::new(Inner {
            key: key.into_boxed_str(),
            kind,
            compiled,
        }))
    }

    /// The canonical text: lowercase, with a trailing dot unless a pure wildcard (`*`, `*.`,
    /// `**`, …, kept as written). Identifies the selector (`fqdn:<key>` labels).
    #[must_use]
    pub fn key(&self) -> &str {
        &self.0.key
    }

    /// Whether this came from `matchName` or `matchPattern`.
    #[must_use]
    pub fn kind(&self) -> SelectorKind {
        self.0.kind
    }

    /// Is this a pure wildcard, matching every well-formed name?
    #[must_use]
    pub fn is_match_all(&self) -> bool {
        self.0.compiled == Compiled::All
    }

    /// Does this selector match `canonical_name` (see [`crate::name::canonicalize`])?
    ///
    /// Gives the answer of Cilium's anchored regex for any string, canonical or not, including
    /// names with empty labels or characters no DNS name has.
    #[must_use]
    pub fn matches(&self, canonical_name: &str) -> bool {
        match SplitName::new(canonical_name) {
            Some(name) => self.matches_split(&name),
            None => false,
        }
    }

    fn matches_split(&self, name: &SplitName<'_>) -> bool {
        match &self.0.compiled {
            Compiled::All => name.matches_all(),
            Compiled::Labels { labels, multi } => {
                let n = name.len();
                let m = labels.len();
                if *multi {
                    if n <= m || !name.multi_covers(n - m) {
                        return false;
                    }
                } else if n != m {
                    return false;
                }
                labels
                    .iter()
                    .zip((0..n).rev())
                    .all(|(pat, i)| pat.is_match(name.label(i)))
            }
        }
    }

    pub(crate) fn compiled(&self) -> &Compiled {
        &self.0.compiled
    }
}

/// Trim, lowercase and check length and characters.
fn validate(input: &str, kind: SelectorKind) -> Result<String, PatternError> {
    let text = input.trim();
    if text.is_empty() {
        return Err(PatternError::Empty);
    }
    let len = text.chars().count();
    if len - usize::from(text.ends_with('.') && len > 1) > MAX_PATTERN_LEN {
        return Err(PatternError::TooLong { len });
    }
    for (position, ch) in text.chars().enumerate() {
        match ch {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => {}
            '*' if kind == SelectorKind::MatchPattern => {}
            '*' => return Err(PatternError::WildcardInName),
            _ => return Err(PatternError::InvalidCharacter { ch, position }),
        }
    }
    Ok(text.to_ascii_lowercase())
}

/// One or more `*`, then at most one `.`.
fn is_pure_wildcard(text: &str) -> bool {
    let rest = text.trim_start_matches('*');
    rest.len() < text.len() && (rest.is_empty() || rest == ".")
}

/// Add the trailing dot.
fn sanitize(mut text: String) -> String {
    if !text.ends_with('.') {
        text.push('.');
    }
    text
}

/// `text` ends with a dot; its labels become matchers, right to left.
fn compile_labels(text: &str, multi: bool) -> Compiled {
    let body = text.strip_suffix('.').unwrap_or(text);
    let labels = body
        .rsplit('.')
        .map(|seg| {
            if seg.contains('*') {
                LabelPattern::Glob(Glob::new(seg))
            } else {
                LabelPattern::Literal(seg.into())
            }
        })
        .collect();
    Compiled::Labels { labels, multi }
}

impl PartialEq for FqdnSelector {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for FqdnSelector {}

impl Hash for FqdnSelector {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.key.hash(state);
    }
}

impl PartialOrd for FqdnSelector {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for FqdnSelector {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.key.cmp(&other.0.key)
    }
}

impl fmt::Display for FqdnSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.key)
    }
}

impl fmt::Debug for FqdnSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = match self.0.kind {
            SelectorKind::MatchName => "matchName",
            SelectorKind::MatchPattern => "matchPattern",
        };
        write!(f, "FqdnSelector({field}: {:?})", &*self.0.key)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::name::canonicalize;
    use proptest::prelude::*;
    use regex::Regex;

    /// Cilium's anchored regex for `pattern`, built exactly as `pkg/fqdn/matchpattern` does
    /// (independently of the compiled form under test).
    pub(crate) fn cilium_regex(pattern: &str) -> Regex {
        const CLASS: &str = "[-a-zA-Z0-9_]";
        let p = pattern.trim().to_lowercase();
        let stars = p.chars().take_while(|&c| c == '*').count();
        let pure = stars >= 1 && (p.len() == stars || (p.len() == stars + 1 && p.ends_with('.')));
        if pure {
            return Regex::new(&format!("(^({CLASS}+[.])+$)|(^[.]$)")).unwrap();
        }
        let p = if p.ends_with('.') { p } else { format!("{p}.") };
        let mut re = String::from("^");
        let mut rest = p.as_str();
        if stars >= 2 && rest[stars..].starts_with('.') {
            re.push_str(&format!("({CLASS}+([.]{CLASS}+){{0,}})[.]"));
            rest = &rest[stars + 1..];
        }
        for c in rest.chars() {
            match c {
                '*' => {
                    re.push_str(CLASS);
                    re.push('*');
                }
                '.' => re.push_str("[.]"),
                c => re.push_str(&regex::escape(&c.to_string())),
            }
        }
        re.push('$');
        Regex::new(&re).unwrap()
    }

    fn pat(p: &str) -> FqdnSelector {
        FqdnSelector::match_pattern(p).unwrap()
    }

    /// Checks `pattern` against `yes` and `no` names (given canonical), and the oracle agrees.
    fn check(pattern: &str, yes: &[&str], no: &[&str]) {
        let sel = pat(pattern);
        let re = cilium_regex(pattern);
        for name in yes {
            assert!(sel.matches(name), "{pattern:?} should match {name:?}");
            assert!(
                re.is_match(name),
                "oracle: {pattern:?} should match {name:?}"
            );
        }
        for name in no {
            assert!(!sel.matches(name), "{pattern:?} should not match {name:?}");
            assert!(
                !re.is_match(name),
                "oracle: {pattern:?} should not match {name:?}"
            );
        }
    }

    #[test]
    fn single_star_label() {
        check(
            "*.cilium.io",
            &[
                "sub.cilium.io.",
                ".cilium.io.",
                "a-b_c.cilium.io.",
                "A.cilium.io.",
            ],
            &[
                "cilium.io.",
                "a.b.cilium.io.",
                "sub.cilium.io",
                "a b.cilium.io.",
                "ü.cilium.io.",
                "x.cilium.iox.",
            ],
        );
    }

    #[test]
    fn star_inside_label_never_crosses_a_dot() {
        check(
            "*cilium.io",
            &["cilium.io.", "xcilium.io.", "x-y_zcilium.io."],
            &["www.cilium.io.", ".cilium.io.", "xcilium.io"],
        );
        check(
            "a*b*c.com",
            &["abc.com.", "a-b-c.com.", "abbbc.com.", "axxbyyc.com."],
            &["ab.com.", "a.b.c.com.", "acb.com.", "abcd.com."],
        );
    }

    #[test]
    fn leading_double_star_is_one_or_more_labels() {
        check(
            "**.cilium.io",
            &["a.cilium.io.", "a.b.cilium.io.", "a-1.b_2.c.cilium.io."],
            &[
                "cilium.io.",
                ".cilium.io.",
                "a..cilium.io.",
                "a b.cilium.io.",
                "..cilium.io.",
            ],
        );
        check("***.x", &["a.x.", "a.b.x."], &["x.", ".x."]);
        let sel = pat("***.x");
        assert_eq!(sel.key(), "***.x.");
    }

    #[test]
    fn double_star_not_followed_by_dot_is_a_plain_star() {
        check("**x.y", &["x.y.", "abx.y."], &["a.x.y.", "a.bx.y."]);
        // `**` in the middle is one label, like `*`.
        check(
            "*.**.cilium.io",
            &["a.b.cilium.io.", "..cilium.io."],
            &["a.cilium.io.", "a.b.c.cilium.io."],
        );
        for name in [
            "a.b.cilium.io.",
            "a.cilium.io.",
            "a.b.c.cilium.io.",
            "..cilium.io.",
        ] {
            assert_eq!(
                pat("*.**.cilium.io").matches(name),
                pat("*.*.cilium.io").matches(name)
            );
        }
        check("a.**", &["a.b.", "a.."], &["a.b.c.", "a."]);
    }

    #[test]
    fn pure_wildcards_match_every_well_formed_name() {
        for p in ["*", "**", "***", "*.", "**.", " *\t", "***."] {
            let sel = pat(p);
            assert!(sel.is_match_all(), "{p:?}");
            check(
                p,
                &[".", "a.", "www.cilium.io.", "a-b.c_d.", "A.b."],
                &["", "a", "a..b.", "..", ".a.", "a b.", "ü.", "a.b"],
            );
        }
        assert_eq!(pat("*").key(), "*");
        assert_eq!(pat("**.").key(), "**.");
        assert_eq!(pat("*.").key(), "*.");
        // Two dots is not a pure wildcard: `*..` is one possibly-empty label then an empty one.
        let sel = pat("*..");
        assert!(!sel.is_match_all());
        check("*..", &["a..", ".."], &["a.", "a.b.", "."]);
        check("**..", &["a..", "a.b.."], &["..", "a."]);
    }

    #[test]
    fn root_and_empty_labels() {
        check(".", &["."], &["a.", "..", ""]);
        assert_eq!(pat(".").key(), ".");
        check("a..b", &["a..b."], &["a.b.", "a...b."]);
        assert_eq!(pat("a..b").key(), "a..b.");
        check(".a", &[".a."], &["a."]);
    }

    #[test]
    fn suffix_attacks_do_not_match() {
        check(
            "*.s3.amazonaws.com",
            &["bucket.s3.amazonaws.com."],
            &[
                "bucket.s3.amazonaws.com.evil.com.",
                "s3.amazonaws.com.",
                "evils3.amazonaws.com.",
                "bucket.s3.amazonaws.comx.",
            ],
        );
        check(
            "cilium.io",
            &["cilium.io."],
            &["www.cilium.io.", "cilium.io.evil.", "xcilium.io."],
        );
    }

    #[test]
    fn case_and_trailing_dot_normalisation() {
        let a = pat("*.CILIUM.Io");
        assert_eq!(a.key(), "*.cilium.io.");
        assert!(a.matches("www.cilium.io."));
        // Literals compare exactly: a non-canonical name is not lowercased by `matches`.
        assert!(!a.matches("www.CILIUM.io."));
        assert!(a.matches(&canonicalize("WWW.CILIUM.IO")));
        // ... but `*` accepts uppercase, as the regex class does.
        assert!(a.matches("WWW.cilium.io."));
        assert_eq!(pat("cilium.io.").key(), "cilium.io.");
        assert_eq!(pat("  cilium.io  ").key(), "cilium.io.");
        assert_eq!(pat("cilium.io").key(), pat("cilium.io.").key());
        assert_eq!(a.to_string(), "*.cilium.io.");
        assert_eq!(
            format!("{a:?}"),
            "FqdnSelector(matchPattern: \"*.cilium.io.\")"
        );
    }

    #[test]
    fn match_name_is_literal_and_equal_to_same_pattern() {
        let n = FqdnSelector::match_name(" WWW.Cilium.IO ").unwrap();
        assert_eq!(n.key(), "www.cilium.io.");
        assert_eq!(n.kind(), SelectorKind::MatchName);
        assert!(n.matches("www.cilium.io."));
        assert!(!n.matches("www.cilium.io"));
        assert!(!n.matches("wwwxcilium.io."));
        let p = pat("www.cilium.io.");
        assert_eq!(p.kind(), SelectorKind::MatchPattern);
        assert_eq!(n, p);
        let set: std::collections::HashSet<_> = [n.clone(), p].into_iter().collect();
        assert_eq!(set.len(), 1);
        assert_eq!(FqdnSelector::match_name(".").unwrap().key(), ".");
        assert!(FqdnSelector::match_name("a..b").unwrap().matches("a..b."));
        assert_eq!(
            FqdnSelector::match_name("*.cilium.io"),
            Err(PatternError::WildcardInName)
        );
        assert_eq!(
            FqdnSelector::match_name("a b"),
            Err(PatternError::InvalidCharacter {
                ch: ' ',
                position: 1
            })
        );
    }

    #[test]
    fn validation_errors() {
        assert_eq!(FqdnSelector::match_pattern(""), Err(PatternError::Empty));
        assert_eq!(
            FqdnSelector::match_pattern(" \t\n"),
            Err(PatternError::Empty)
        );
        assert_eq!(FqdnSelector::match_name(""), Err(PatternError::Empty));
        let err = FqdnSelector::match_pattern("  abc!.com").unwrap_err();
        assert_eq!(
            err,
            PatternError::InvalidCharacter {
                ch: '!',
                position: 3
            }
        );
        assert_eq!(
            err.to_string(),
            "invalid character '!' at position 3: a name or pattern may contain only letters, \
             digits, '-', '_', '.' and (in a matchPattern) '*'"
        );
        for (p, ch) in [
            ("a[b]", '['),
            ("a+", '+'),
            ("a,b", ','),
            ("ü.com", 'ü'),
            ("a b", ' '),
            ("a/b", '/'),
        ] {
            assert!(
                matches!(FqdnSelector::match_pattern(p), Err(PatternError::InvalidCharacter { ch: c, .. }) if c == ch),
                "{p:?}"
            );
        }
        let max = "a".repeat(255);
        assert_eq!(pat(&max).key().len(), 256);
        assert_eq!(pat(&format!("  {max}\n")).key().len(), 256);
        assert_eq!(
            FqdnSelector::match_pattern(&"a".repeat(256)),
            Err(PatternError::TooLong { len: 256 })
        );
        // A trailing dot does not count: the key of a 255-character name parses again.
        assert!(FqdnSelector::match_name(&format!("{}.", "a".repeat(255))).is_ok());
        assert_eq!(
            FqdnSelector::match_name(&format!("{}.", "a".repeat(256))),
            Err(PatternError::TooLong { len: 257 })
        );
        // Length is counted in characters.
        assert_eq!(
            FqdnSelector::match_pattern(&"ü".repeat(200)),
            Err(PatternError::InvalidCharacter {
                ch: 'ü',
                position: 0
            })
        );
        assert!(PatternError::Empty.to_string().contains("expected"));
        assert!(
            PatternError::WildcardInName
                .to_string()
                .contains("matchPattern")
        );
    }

    #[test]
    fn names_without_trailing_dot_never_match() {
        for p in ["*", "cilium.io", "*.io", "**.io", "."] {
            let sel = pat(p);
            for name in ["", "cilium.io", "a.cilium.io", "io"] {
                assert!(!sel.matches(name), "{p:?} {name:?}");
            }
        }
    }

    #[test]
    fn glob_matching_backtracks() {
        check(
            "*a*a*b",
            &["aab.", "xaxaxb.", "aaaab.", "abab."],
            &["ab.", "aaba.", "baa."],
        );
        check("a*", &["a.", "abc.", "a-."], &["ba.", "."]);
        check("*-", &["-.", "a-."], &["a.", "-a."]);
        // Prefix and suffix may not overlap.
        check(
            "ab*ba",
            &["abba.", "ab-ba.", "abababa."],
            &["aba.", "ab.", "ba."],
        );
        check("a*b*a", &["aba.", "abba.", "a-b-a."], &["ab.", "aa."]);
    }

    /// Patterns over `{a, b, -, _, ., *}`, sometimes with a leading `**.` or similar, random
    /// case and surrounding whitespace.
    pub(crate) fn pattern_strategy() -> impl Strategy<Value = String> {
        (
            prop_oneof![
                4 => Just(""),
                2 => Just("**."),
                1 => Just("***."),
                1 => Just("*."),
                1 => Just("**"),
            ],
            "[ab._*-]{0,6}",
            any::<bool>(),
            prop_oneof![4 => Just(""), 1 => Just(" "), 1 => Just("\t")],
        )
            .prop_map(|(prefix, body, upper, ws)| {
                let p = format!("{prefix}{body}");
                let p = if upper { p.to_uppercase() } else { p };
                format!("{ws}{p}{ws}")
            })
    }

    /// Names over `{a, b, -, _, ., X, ' '}` (sometimes `ü`), raw or built from short labels.
    pub(crate) fn name_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            "[ab._X -]{0,10}",
            "[ab.ü]{0,5}",
            proptest::collection::vec("[ab]{0,2}|X|-|_|[ab][ab][ab]", 0..6).prop_map(|labels| {
                let mut s = labels.join(".");
                s.push('.');
                s
            }),
        ]
    }

    /// A name made from `pattern` by replacing each `*` with one of `fills` (which may hold
    /// dots), so that many generated names match or nearly match.
    pub(crate) fn instantiate(pattern: &str, fills: &[String], dot: bool) -> String {
        let mut fills = fills.iter().cycle();
        let mut name = String::new();
        for c in pattern.trim().chars() {
            if c == '*' {
                name.push_str(fills.next().map_or("", String::as_str));
            } else {
                name.push(c);
            }
        }
        if dot && !name.ends_with('.') {
            name.push('.');
        }
        name
    }

    /// Pieces a star may be replaced with.
    pub(crate) fn fills_strategy() -> impl Strategy<Value = Vec<String>> {
        proptest::collection::vec("[ab_-]{0,2}|[ab]\\.[ab]|X|\\.|", 0..6)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn matches_agrees_with_cilium_regex_on_near_misses(
            p in pattern_strategy(),
            fills in fills_strategy(),
            dot in any::<bool>(),
        ) {
            let Ok(sel) = FqdnSelector::match_pattern(&p) else { return Ok(()) };
            let re = cilium_regex(&p);
            let name = instantiate(&p, &fills, dot);
            let canonical = canonicalize(&name);
            prop_assert_eq!(sel.matches(&canonical), re.is_match(&canonical),
                "pattern {:?} name {:?}", p, canonical);
            prop_assert_eq!(sel.matches(&name), re.is_match(&name),
                "pattern {:?} raw name {:?}", p, name);
        }

        #[test]
        fn matches_agrees_with_cilium_regex(p in pattern_strategy(), name in name_strategy()) {
            let Ok(sel) = FqdnSelector::match_pattern(&p) else {
                prop_assert!(p.trim().is_empty());
                prop_assert_eq!(FqdnSelector::match_pattern(&p), Err(PatternError::Empty));
                return Ok(());
            };
            let re = cilium_regex(&p);
            let canonical = canonicalize(&name);
            prop_assert_eq!(sel.matches(&canonical), re.is_match(&canonical),
                "pattern {:?} name {:?}", p, canonical);
            // Any string, canonical or not, gets the regex's answer.
            prop_assert_eq!(sel.matches(&name), re.is_match(&name),
                "pattern {:?} raw name {:?}", p, name);
            // The key is a fixed point and means the same thing.
            let again = FqdnSelector::match_pattern(sel.key()).unwrap();
            prop_assert_eq!(again.key(), sel.key());
            prop_assert_eq!(again.matches(&canonical), sel.matches(&canonical));
            // Without stars, matchName and matchPattern are the same selector.
            if !p.contains('*') {
                let n = FqdnSelector::match_name(&p).unwrap();
                prop_assert_eq!(&n, &sel);
                prop_assert_eq!(n.matches(&canonical), sel.matches(&canonical));
            }
        }

        #[test]
        fn arbitrary_input_never_panics(p in "\\PC{0,20}|[ -~]{0,300}", name in "\\PC{0,20}") {
            if let Ok(sel) = FqdnSelector::match_pattern(&p) {
                let _ = sel.matches(&name);
                let _ = sel.matches(&canonicalize(&name));
            }
            let _ = FqdnSelector::match_name(&p);
        }
    }
}

#[cfg(test)]
mod key_round_trip {
    use super::*;

    /// Found by the `fqdn_pattern` fuzz target: a 255-character pattern was accepted, but its
    /// key (with the trailing dot, 256 characters) did not parse again.
    #[test]
    fn the_longest_accepted_pattern_has_a_key_that_parses_again() {
        let longest = "a".repeat(MAX_PATTERN_LEN);
        for selector in [
            FqdnSelector::match_pattern(&longest),
            FqdnSelector::match_name(&longest),
        ] {
            let selector = selector.unwrap();
            assert_eq!(
                FqdnSelector::match_pattern(selector.key()).unwrap().key(),
                selector.key()
            );
        }
        assert!(FqdnSelector::match_pattern(&"a".repeat(MAX_PATTERN_LEN + 1)).is_err());
        assert!(
            FqdnSelector::match_pattern(&format!("{}..", "a".repeat(MAX_PATTERN_LEN))).is_err()
        );
    }
}
