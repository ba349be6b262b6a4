//! Whether two FQDN selectors can match a common name, decided exactly on their compiled form
//! (a language intersection, not a heuristic), with a name both match as the proof.
//!
//! A compiled selector is a fixed list of label matchers, right to left, optionally preceded by
//! "one or more non-empty labels of `[-a-zA-Z0-9_]`" (leading `**.`), or a pure wildcard (the
//! root, or one or more such labels). Labels are matched independently, so two selectors share
//! a name exactly when they agree on a number of labels and, at each position, their two label
//! matchers share a label:
//!
//! - two literals: equal;
//! - a literal and a glob: the glob matches the literal;
//! - two globs (each `P*…*S`, literal runs between stars): their literal prefixes agree (one
//!   starts the other) and so do their literal suffixes. Then `longer prefix + every middle run
//!   of the first + every middle run of the second + longer suffix` matches both, each glob's
//!   stars absorbing the other's runs; and a common label must start with both prefixes and
//!   end with both suffixes, so the condition is also necessary;
//! - "any non-empty label of the class" (under `**.`, or a pure wildcard) and a literal: the
//!   literal is not empty (literals hold class characters only); and a glob: always (a star can
//!   be one class character).
//!
//! The name found is made of non-empty labels where the selectors allow it (a literal may be
//! empty: `a..b`).

use super::{Compiled, FqdnSelector, Glob, LabelPattern};

/// What one label of a name must be, under one selector.
#[derive(Clone, Copy)]
enum Slot<'a> {
    Pattern(&'a LabelPattern),
    /// Any non-empty label of `[-a-zA-Z0-9_]` (under a leading `**.` or a pure wildcard).
    Class,
}

/// The label shown where any non-empty class label will do.
const FILL: &str = "a";

impl FqdnSelector {
    /// Whether some name matches both `self` and `other` ([`FqdnSelector::matches`]).
    ///
    /// Exact: see [`FqdnSelector::common_name`], of which this is `is_some`.
    #[must_use]
    pub fn overlaps(&self, other: &FqdnSelector) -> bool {
        self.common_name(other).is_some()
    }

    /// A name that both `self` and `other` match, if there is one (`None` means that no string
    /// at all is matched by both).
    ///
    /// The name is canonical (trailing dot) and, wherever the selectors allow, made of
    /// non-empty labels.
    ///
    /// ```
    /// use fqdnd_namemgr::FqdnSelector;
    /// let pattern = |p| FqdnSelector::match_pattern(p).unwrap();
    /// assert_eq!(pattern("*.cdn.net").common_name(&pattern("e*.*.net")).as_deref(), Some("ea.cdn.net."));
    /// assert!(!pattern("*.foo.com").overlaps(&pattern("foo.com")));
    /// assert!(pattern("**.foo.com").overlaps(&pattern("*")));
    /// ```
    #[must_use]
    pub fn common_name(&self, other: &FqdnSelector) -> Option<String> {
        let (a, b) = (self.compiled(), other.compiled());
        let labels = match (a, b) {
            (Compiled::All, Compiled::All) => return Some(format!("{FILL}.")),
            (Compiled::All, Compiled::Labels { labels, multi })
            | (Compiled::Labels { labels, multi }, Compiled::All) => {
                // The root `.` is a single empty label: only the selector `.` matches it.
                if !multi && matches!(&**labels, [LabelPattern::Literal(l)] if l.is_empty()) {
                    return Some(".".to_owned());
                }
                common_labels(labels, *multi, &[], true)?
            }
            (
                Compiled::Labels {
                    labels: a,
                    multi: a_multi,
                },
                Compiled::Labels {
                    labels: b,
                    multi: b_multi,
                },
            ) => common_labels(a, *a_multi, b, *b_multi)?,
        };
        // Labels are right to left.
        let mut name = String::new();
        for label in labels.iter().rev() {
            name.push_str(label);
            name.push('.');
        }
        Some(name)
    }
}

/// The labels (right to left) of a name matched by both `a` (then, with `a_multi`, one or
/// more class labels) and `b` (likewise), if any. A pure wildcard is `&[]` with `multi`.
fn common_labels(
    a: &[LabelPattern],
    a_multi: bool,
    b: &[LabelPattern],
    b_multi: bool,
) -> Option<Vec<String>> {
    let count = match (a_multi, b_multi) {
        (false, false) => (a.len() == b.len()).then_some(a.len())?,
        (true, false) => (b.len() > a.len()).then_some(b.len())?,
        (false, true) => (a.len() > b.len()).then_some(a.len())?,
        (true, true) => a.len().max(b.len()) + 1,
    };
    (0..count)
        .map(|i| common_label(slot(a, i), slot(b, i)))
        .collect()
}

/// What label `i` (from the right) must be under `labels`, past which a class label.
fn slot(labels: &[LabelPattern], i: usize) -> Slot<'_> {
    labels.get(i).map_or(Slot::Class, Slot::Pattern)
}

/// A label both slots accept, if any.
fn common_label(a: Slot<'_>, b: Slot<'_>) -> Option<String> {
    use LabelPattern::{Glob as G, Literal as L};
    match (a, b) {
        (Slot::Class, Slot::Class) => Some(FILL.to_owned()),
        (Slot::Class, Slot::Pattern(p)) | (Slot::Pattern(p), Slot::Class) => match p {
            L(lit) => (!lit.is_empty()).then(|| lit.to_string()),
            G(glob) => Some(glob_label(glob, glob)),
        },
        (Slot::Pattern(L(x)), Slot::Pattern(L(y))) => (x == y).then(|| x.to_string()),
        (Slot::Pattern(L(lit)), Slot::Pattern(G(glob)))
        | (Slot::Pattern(G(glob)), Slot::Pattern(L(lit))) => {
            glob.is_match(lit).then(|| lit.to_string())
        }
        (Slot::Pattern(G(x)), Slot::Pattern(G(y))) => {
            let (xp, yp) = (x.literal_prefix(), y.literal_prefix());
            let (xs, ys) = (x.literal_suffix(), y.literal_suffix());
            let prefixes_agree = xp.starts_with(yp) || yp.starts_with(xp);
            let suffixes_agree = xs.ends_with(ys) || ys.ends_with(xs);
            (prefixes_agree && suffixes_agree).then(|| glob_label(x, y))
        }
    }
}

/// For two globs whose literal prefixes agree and whose literal suffixes agree, a non-empty
/// label both match: the longer prefix, the middle runs of `x`, one class character, the
/// middle runs of `y`, the longer suffix. Each glob's stars absorb what the other adds (`x`
/// may be `y`: its runs then appear twice, which it matches too).
fn glob_label(x: &Glob, y: &Glob) -> String {
    let (xp, yp) = (x.literal_prefix(), y.literal_prefix());
    let (xs, ys) = (x.literal_suffix(), y.literal_suffix());
    let mut label = String::from(if xp.len() >= yp.len() { xp } else { yp });
    for middle in x.middles() {
        label.push_str(middle);
    }
    label.push_str(FILL);
    for middle in y.middles() {
        label.push_str(middle);
    }
    label.push_str(if xs.len() >= ys.len() { xs } else { ys });
    label
}

impl Glob {
    /// The literal text before the first star.
    fn literal_prefix(&self) -> &str {
        &self.text[..self.prefix]
    }

    /// The literal text after the last star.
    fn literal_suffix(&self) -> &str {
        &self.text[self.text.len() - self.suffix..]
    }

    /// The literal runs between stars (none with a single star).
    fn middles(&self) -> Vec<&str> {
        let parts: Vec<&str> = self.text.split('*').collect();
        parts
            .get(1..parts.len().saturating_sub(1))
            .unwrap_or_default()
            .to_vec()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use proptest::prelude::*;

    use super::*;
    use crate::pattern::tests::pattern_strategy;

    fn pat(p: &str) -> FqdnSelector {
        FqdnSelector::match_pattern(p).unwrap()
    }

    /// Every string over `{a, b, .}` of up to 8 characters, then a dot: 9841 names, with the
    /// root, empty labels and every shape of up to 8 labels.
    fn universe() -> &'static [String] {
        static NAMES: OnceLock<Vec<String>> = OnceLock::new();
        NAMES.get_or_init(|| {
            let mut names = vec![String::new()];
            let mut last = vec![String::new()];
            for _ in 0..8 {
                last = last
                    .iter()
                    .flat_map(|s| ['a', 'b', '.'].map(|c| format!("{s}{c}")))
                    .collect();
                names.extend(last.iter().cloned());
            }
            names.into_iter().map(|n| n + ".").collect()
        })
    }

    /// Which names of the universe `selector` matches, as a bit set.
    fn matched(selector: &FqdnSelector) -> Vec<u64> {
        let mut bits = vec![0; universe().len().div_ceil(64)];
        for (i, name) in universe().iter().enumerate() {
            if selector.matches(name) {
                bits[i / 64] |= 1 << (i % 64);
            }
        }
        bits
    }

    /// Checks `common_name` against brute force: a name it gives is matched by both; when it
    /// gives none, no name of the universe is matched by both.
    fn check(a: &FqdnSelector, b: &FqdnSelector, in_a: &[u64], in_b: &[u64]) {
        let common = a.common_name(b);
        match &common {
            Some(name) => {
                assert!(
                    a.matches(name),
                    "{a:?} {b:?}: {name:?} not matched by the first"
                );
                assert!(
                    b.matches(name),
                    "{a:?} {b:?}: {name:?} not matched by the second"
                );
            }
            None => {
                let both = in_a
                    .iter()
                    .zip(in_b)
                    .enumerate()
                    .find(|(_, (x, y))| *x & *y != 0);
                if let Some((word, (x, y))) = both {
                    let i = word * 64 + (x & y).trailing_zeros() as usize;
                    panic!(
                        "{a:?} {b:?}: no common name found, but both match {:?}",
                        universe()[i]
                    );
                }
            }
        }
        assert_eq!(
            common.is_some(),
            b.overlaps(a),
            "{a:?} {b:?}: not symmetric"
        );
    }

    #[test]
    fn examples() {
        let common = |a: &str, b: &str| pat(a).common_name(&pat(b));
        assert_eq!(common("*.foo.com", "foo.com"), None);
        assert_eq!(
            common("*.foo.com", "**.foo.com").as_deref(),
            Some("a.foo.com.")
        );
        assert_eq!(common("*.foo.com", "a.b.foo.com"), None);
        assert_eq!(
            common("**.foo.com", "a.b.foo.com").as_deref(),
            Some("a.b.foo.com.")
        );
        assert_eq!(common("**.foo.com", "foo.com"), None);
        assert_eq!(common("ab*", "*ba").as_deref(), Some("ababa."));
        assert_eq!(common("ab*.x", "b*.x"), None);
        assert_eq!(common("*a", "*b"), None);
        assert_eq!(common("a*b*c", "*c*b*").as_deref(), Some("abacbc."));
        assert_eq!(common("*", ".").as_deref(), Some("."));
        assert_eq!(common("*", "a..b"), None);
        assert_eq!(common("*", "**").as_deref(), Some("a."));
        assert_eq!(common("*", "**.*..b"), None);
        assert_eq!(common("a..b", "a.*.b").as_deref(), Some("a..b."));
        assert_eq!(common("**.a", "**.b"), None);
        assert_eq!(common("**.a", "**.*.*.a").as_deref(), Some("a.a.a.a."));
        // A matchName is a pattern without stars.
        let name = FqdnSelector::match_name("api.example.com").unwrap();
        assert!(name.overlaps(&pat("*.example.com")));
        assert!(!name.overlaps(&pat("*.api.example.com")));
    }

    /// Every pair of patterns of up to 4 characters over `{a, b, ., *}` (which includes `**.`
    /// prefixes and pure wildcards), against every name of the universe.
    #[test]
    fn exhaustive_against_brute_force() {
        let mut patterns = Vec::new();
        let mut last = vec![String::new()];
        for _ in 0..4 {
            last = last
                .iter()
                .flat_map(|s| ['a', 'b', '.', '*'].map(|c| format!("{s}{c}")))
                .collect();
            patterns.extend(last.iter().cloned());
        }
        let compiled: Vec<(FqdnSelector, Vec<u64>)> = patterns
            .iter()
            .map(|p| {
                let s = pat(p);
                let m = matched(&s);
                (s, m)
            })
            .collect();
        for (a, in_a) in &compiled {
            assert!(a.overlaps(a), "{a:?} matches something");
            for (b, in_b) in &compiled {
                check(a, b, in_a, in_b);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn common_names_against_brute_force(
            a in "(\\*\\*\\.|\\*\\.)?[ab.*]{0,6}",
            b in "(\\*\\*\\.|\\*\\.)?[ab.*]{0,6}",
        ) {
            let (Ok(a), Ok(b)) = (FqdnSelector::match_pattern(&a), FqdnSelector::match_pattern(&b))
            else {
                return Ok(());
            };
            check(&a, &b, &matched(&a), &matched(&b));
        }

        /// Any pattern, any case and class character: a common name given is matched by both.
        #[test]
        fn common_names_are_matched_by_both(a in pattern_strategy(), b in pattern_strategy()) {
            let (Ok(a), Ok(b)) = (FqdnSelector::match_pattern(&a), FqdnSelector::match_pattern(&b))
            else {
                return Ok(());
            };
            if let Some(name) = a.common_name(&b) {
                prop_assert!(a.matches(&name) && b.matches(&name), "{:?} {:?} {:?}", a, b, name);
            }
            prop_assert_eq!(a.overlaps(&b), b.overlaps(&a));
            prop_assert!(a.overlaps(&a));
        }
    }
}
