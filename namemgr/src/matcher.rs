//! Matching one name against all registered FQDN selectors at once.
//!
//! [`Matcher`] compiles every registered [`FqdnSelector`] into one trie over labels read from
//! the right (TLD first). Each node holds:
//! - literal children in a hash map keyed by the label text,
//! - glob children (labels containing `*`) filed by their literal ends, shared by equal globs,
//! - terminals: selectors whose labels end exactly here,
//! - "multi" terminals: selectors with a leading `**.`, matching when one or more further
//!   labels remain and all of them are non-empty `[-a-zA-Z0-9_]` text.
//!
//! Pure wildcards (`*`, `**.`, …) sit in one list beside the trie.
//!
//! **Cost.** A lookup walks the name's labels once: one hash lookup per label and node, plus
//! glob tests for the glob children of each visited node whose two literal end bytes agree
//! with the label (or that have none). It grows with the depth of the name and with the number
//! of glob labels sharing one trie node *and* one bucket, not with the number of selectors. A leading `**.` costs O(1)
//! per visited node (the name's labels are checked once, up front). Names of up to 16 labels
//! are matched without heap allocation (unless one id is registered with several selectors and
//! more than 16 distinct ids match, when the deduplication list spills to the heap).
//!
//! The answers are exactly those of [`FqdnSelector::matches`] for every input string.

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;

use smallvec::SmallVec;

use crate::pattern::{
    Compiled, FqdnSelector, Glob, GlobBucket, LabelPattern, SplitName, is_class_label,
};

/// A name split into its labels once, to be matched against several [`Matcher`]s.
pub struct NameLabels<'a>(SplitName<'a>);

impl<'a> NameLabels<'a> {
    /// Splits a canonical name (see [`crate::name::canonicalize`]). `None` when it does not
    /// end with a dot: no selector matches such a name.
    #[must_use]
    pub fn new(canonical_name: &'a str) -> Option<Self> {
        SplitName::new(canonical_name).map(Self)
    }
}

/// Caller-chosen identifier of a registered selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SelectorId(pub u32);

/// All registered selectors, compiled into one trie for matching a name against them at once.
///
/// Registrations are `(selector, id)` pairs keyed by the selector's canonical
/// [`key`](FqdnSelector::key): registering the same pair twice is a no-op, and a `matchName`
/// and a `matchPattern` with the same key are the same selector.
#[derive(Debug, Clone, Default)]
pub struct Matcher {
    root: Node,
    /// Pure wildcards.
    all: Vec<Slot>,
    /// Every registered `(selector, id)` pair.
    registered: HashSet<(FqdnSelector, SelectorId)>,
    /// Number of distinct selectors each id is registered with.
    id_uses: HashMap<SelectorId, u32>,
    /// Ids registered with more than one selector: matching must then deduplicate.
    shared_ids: usize,
}

/// An id at one place of the trie, with the number of registrations that put it there.
///
/// Different keys can compile to the same place (`*` and `**.` are both pure wildcards,
/// `a**b` and `a*b` are the same glob), so one id may be placed there more than once.
#[derive(Debug, Clone, Copy)]
struct Slot {
    id: SelectorId,
    count: u32,
}

#[derive(Debug, Clone, Default)]
struct Node {
    literals: hashbrown::HashMap<Box<str>, Node>,
    globs: Globs,
    terminals: Vec<Slot>,
    multi: Vec<Slot>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.literals.is_empty()
            && self.globs.is_empty()
            && self.terminals.is_empty()
            && self.multi.is_empty()
    }

    fn child_mut(&mut self, label: &LabelPattern) -> &mut Node {
        match label {
            LabelPattern::Literal(text) => self.literals.entry(text.clone()).or_default(),
            LabelPattern::Glob(glob) => {
                let bucket = self.globs.bucket_mut(glob.bucket());
                let pos = match bucket.iter().position(|(g, _)| g == glob) {
                    Some(pos) => pos,
                    None => {
                        bucket.push((glob.clone(), Node::default()));
                        bucket.len() - 1
                    }
                };
                &mut bucket[pos].1
            }
        }
    }

    /// Removes `id` from the list at the end of `labels` (`multi` or plain terminals), pruning
    /// nodes left empty. Returns whether it was there.
    fn remove(&mut self, labels: &[LabelPattern], multi: bool, id: SelectorId) -> bool {
        let Some((first, rest)) = labels.split_first() else {
            let list = if multi {
                &mut self.multi
            } else {
                &mut self.terminals
            };
            return remove_slot(list, id);
        };
        match first {
            LabelPattern::Literal(text) => {
                let Some(child) = self.literals.get_mut(&**text) else {
                    return false;
                };
                let removed = child.remove(rest, multi, id);
                if child.is_empty() {
                    self.literals.remove(&**text);
                }
                removed
            }
            LabelPattern::Glob(glob) => {
                let key = glob.bucket();
                let Some(bucket) = self.globs.get_mut(key) else {
                    return false;
                };
                let Some(pos) = bucket.iter().position(|(g, _)| g == glob) else {
                    return false;
                };
                let child = &mut bucket[pos].1;
                let removed = child.remove(rest, multi, id);
                if child.is_empty() {
                    bucket.swap_remove(pos);
                    if bucket.is_empty() {
                        self.globs.remove_bucket(key);
                    }
                }
                removed
            }
        }
    }

    /// Reports the selectors matching `name`, of which `depth` labels (from the right) have
    /// been consumed to reach this node, until `f` breaks.
    fn walk(
        &self,
        name: &SplitName<'_>,
        depth: usize,
        f: &mut impl FnMut(SelectorId) -> ControlFlow<()>,
    ) -> ControlFlow<()> {
        let remaining = name.len() - depth;
        if remaining == 0 {
            return self.terminals.iter().try_for_each(|s| f(s.id));
        }
        if !self.multi.is_empty() && name.multi_covers(remaining) {
            self.multi.iter().try_for_each(|s| f(s.id))?;
        }
        let label = name.label(remaining - 1);
        if let Some(child) = self.literals.get(label) {
            child.walk(name, depth + 1, f)?;
        }
        if !self.globs.is_empty() && is_class_label(label) {
            for (glob, child) in self.globs.candidates(label) {
                if glob.is_match_class_label(label) {
                    child.walk(name, depth + 1, f)?;
                }
            }
        }
        ControlFlow::Continue(())
    }
}

/// The glob-label children of a node, filed by [`GlobBucket`] so that a lookup tests only the
/// globs whose literal ends agree with the label: many `*cdnN.example.io` selectors under one
/// node cost a hash lookup and a few glob tests, not one test each. Globs without a two-byte
/// literal end (`*`, `a*`) are kept apart: a node with only those costs no hash lookup.
#[derive(Debug, Clone, Default)]
struct Globs {
    /// [`GlobBucket::Any`]: tested against every label.
    any: Vec<(Glob, Node)>,
    /// The other buckets.
    affixed: hashbrown::HashMap<GlobBucket, Vec<(Glob, Node)>>,
}

impl Globs {
    fn is_empty(&self) -> bool {
        self.any.is_empty() && self.affixed.is_empty()
    }

    fn bucket_mut(&mut self, key: GlobBucket) -> &mut Vec<(Glob, Node)> {
        match key {
            GlobBucket::Any => &mut self.any,
            key => self.affixed.entry(key).or_default(),
        }
    }

    fn get_mut(&mut self, key: GlobBucket) -> Option<&mut Vec<(Glob, Node)>> {
        match key {
            GlobBucket::Any => Some(&mut self.any),
            key => self.affixed.get_mut(&key),
        }
    }

    /// Forgets the bucket `key`, left empty.
    fn remove_bucket(&mut self, key: GlobBucket) {
        if key != GlobBucket::Any {
            self.affixed.remove(&key);
        }
    }

    /// Every glob child that may match `label` (a superset of those that do).
    fn candidates<'a>(&'a self, label: &str) -> impl Iterator<Item = &'a (Glob, Node)> + 'a {
        let bytes = label.as_bytes();
        let keys = match bytes {
            [a, b, ..] if !self.affixed.is_empty() => [
                Some(GlobBucket::Suffix([
                    bytes[bytes.len() - 2],
                    bytes[bytes.len() - 1],
                ])),
                Some(GlobBucket::Prefix([*a, *b])),
            ],
            _ => [None, None],
        };
        keys.into_iter()
            .flatten()
            .filter_map(|key| self.affixed.get(&key))
            .flatten()
            .chain(&self.any)
    }
}

/// Places `id` in `list` once more.
fn insert_slot(list: &mut Vec<Slot>, id: SelectorId) {
    match list.iter_mut().find(|s| s.id == id) {
        Some(slot) => slot.count += 1,
        None => list.push(Slot { id, count: 1 }),
    }
}

/// Takes one placement of `id` out of `list`; returns whether there was one.
fn remove_slot(list: &mut Vec<Slot>, id: SelectorId) -> bool {
    let Some(pos) = list.iter().position(|s| s.id == id) else {
        return false;
    };
    list[pos].count -= 1;
    if list[pos].count == 0 {
        list.swap_remove(pos);
        if list.is_empty() {
            *list = Vec::new();
        }
    }
    true
}

impl Matcher {
    /// An empty matcher.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `selector` under `id`. Returns `false` if this pair was already registered
    /// (nothing changes).
    ///
    /// One id may be registered with several selectors; [`for_each_match`](Self::for_each_match)
    /// still reports it once per call.
    pub fn insert(&mut self, selector: &FqdnSelector, id: SelectorId) -> bool {
        if !self.registered.insert((selector.clone(), id)) {
            return false;
        }
        match selector.compiled() {
            Compiled::All => insert_slot(&mut self.all, id),
            Compiled::Labels { labels, multi } => {
                let node = labels
                    .iter()
                    .fold(&mut self.root, |node, label| node.child_mut(label));
                let list = if *multi {
                    &mut node.multi
                } else {
                    &mut node.terminals
                };
                insert_slot(list, id);
            }
        }
        let uses = self.id_uses.entry(id).or_insert(0);
        *uses += 1;
        if *uses == 2 {
            self.shared_ids += 1;
        }
        true
    }

    /// Unregisters `selector` under `id`, pruning trie nodes left empty. Returns whether the
    /// pair was registered.
    pub fn remove(&mut self, selector: &FqdnSelector, id: SelectorId) -> bool {
        if !self.registered.remove(&(selector.clone(), id)) {
            return false;
        }
        let placed = match selector.compiled() {
            Compiled::All => remove_slot(&mut self.all, id),
            Compiled::Labels { labels, multi } => self.root.remove(labels, *multi, id),
        };
        debug_assert!(
            placed,
            "registered selector {selector} missing from the trie"
        );
        if let Some(uses) = self.id_uses.get_mut(&id) {
            *uses -= 1;
            match *uses {
                0 => {
                    self.id_uses.remove(&id);
                }
                1 => self.shared_ids -= 1,
                _ => {}
            }
        }
        true
    }

    /// Calls `f` once for each id with a selector matching `canonical_name` (see
    /// [`crate::name::canonicalize`]), in no particular order.
    ///
    /// Gives the same answers as [`FqdnSelector::matches`] for any string, canonical or not.
    pub fn for_each_match(&self, canonical_name: &str, mut f: impl FnMut(SelectorId)) {
        let Some(name) = SplitName::new(canonical_name) else {
            return;
        };
        // Neither closure breaks: the whole report runs.
        if self.shared_ids == 0 {
            let _ = self.report(&name, &mut |id| {
                f(id);
                ControlFlow::Continue(())
            });
        } else {
            let mut seen: SmallVec<[SelectorId; 16]> = SmallVec::new();
            let _ = self.report(&name, &mut |id| {
                if !seen.contains(&id) {
                    seen.push(id);
                    f(id);
                }
                ControlFlow::Continue(())
            });
        }
    }

    /// Reports the ids matching `name` (pure wildcards first, then the trie) until `f` breaks.
    fn report(
        &self,
        name: &SplitName<'_>,
        f: &mut impl FnMut(SelectorId) -> ControlFlow<()>,
    ) -> ControlFlow<()> {
        if !self.all.is_empty() && name.matches_all() {
            self.all.iter().try_for_each(|s| f(s.id))?;
        }
        self.root.walk(name, 0, f)
    }

    /// Does any registered selector match `canonical_name`? Stops at the first that does.
    #[must_use]
    pub fn is_match(&self, canonical_name: &str) -> bool {
        let Some(name) = SplitName::new(canonical_name) else {
            return false;
        };
        self.any(&name)
    }

    /// [`Matcher::is_match`] for a name split once for several matchers (a query checked
    /// against a deny list and its client's DNS rules).
    #[must_use]
    pub fn is_match_labels(&self, name: &NameLabels<'_>) -> bool {
        self.any(&name.0)
    }

    /// Whether some id matches: the report, broken at the first.
    fn any(&self, name: &SplitName<'_>) -> bool {
        self.report(name, &mut |_| ControlFlow::Break(()))
            .is_break()
    }

    /// Ids matching `canonical_name`, sorted, each once.
    #[must_use]
    pub fn matches(&self, canonical_name: &str) -> Vec<SelectorId> {
        let mut ids = Vec::new();
        self.for_each_match(canonical_name, |id| ids.push(id));
        ids.sort_unstable();
        ids
    }

    /// Is nothing registered?
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.registered.is_empty()
    }

    /// Number of registered `(selector, id)` pairs.
    #[must_use]
    pub fn len(&self) -> usize {
        self.registered.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::canonicalize;
    use crate::pattern::tests::{
        cilium_regex, fills_strategy, instantiate, name_strategy, pattern_strategy,
    };
    use proptest::prelude::*;
    use regex::Regex;
    use std::collections::{BTreeSet, HashMap as StdHashMap};

    fn pat(p: &str) -> FqdnSelector {
        FqdnSelector::match_pattern(p).unwrap()
    }

    fn ids(m: &Matcher, name: &str) -> Vec<u32> {
        let mut out = Vec::new();
        m.for_each_match(name, |SelectorId(id)| out.push(id));
        out.sort_unstable();
        out
    }

    fn sample() -> Matcher {
        let mut m = Matcher::new();
        for (id, p) in [
            (1, "www.cilium.io"),
            (2, "*.cilium.io"),
            (3, "**.cilium.io"),
            (4, "*cilium.io"),
            (5, "*"),
            (6, "api-*.cilium.io"),
            (7, "*.*.cilium.io"),
            (8, "cilium.io"),
            (9, "a..b"),
            (10, "."),
        ] {
            assert!(m.insert(&pat(p), SelectorId(id)));
        }
        m
    }

    #[test]
    fn matches_like_single_selectors() {
        let m = sample();
        assert_eq!(m.len(), 10);
        assert_eq!(ids(&m, "www.cilium.io."), [1, 2, 3, 5]);
        assert_eq!(ids(&m, "api-v1.cilium.io."), [2, 3, 5, 6]);
        assert_eq!(ids(&m, "a.b.cilium.io."), [3, 5, 7]);
        assert_eq!(ids(&m, "cilium.io."), [4, 5, 8]);
        assert_eq!(ids(&m, "xcilium.io."), [4, 5]);
        assert_eq!(ids(&m, ".cilium.io."), [2]);
        assert_eq!(ids(&m, "a..b."), [9]);
        assert_eq!(ids(&m, "."), [5, 10]);
        assert_eq!(ids(&m, "www.cilium.io"), Vec::<u32>::new());
        assert_eq!(ids(&m, "bucket.cilium.io.evil.com."), [5]);
        assert_eq!(ids(&m, "a b.cilium.io."), Vec::<u32>::new());
        assert_eq!(
            m.matches(&canonicalize("WWW.Cilium.IO")),
            ids_of(&[1, 2, 3, 5])
        );
        assert!(m.is_match("anything."));
        assert!(!m.is_match("ü."));
    }

    fn ids_of(v: &[u32]) -> Vec<SelectorId> {
        v.iter().copied().map(SelectorId).collect()
    }

    #[test]
    fn each_id_once_even_when_shared() {
        let mut m = Matcher::new();
        // Same key through matchName and matchPattern: one registration.
        assert!(m.insert(&FqdnSelector::match_name("a.com").unwrap(), SelectorId(1)));
        assert!(!m.insert(&pat("A.com."), SelectorId(1)));
        assert_eq!(m.len(), 1);
        // Several selectors at one node, and one id under several selectors.
        assert!(m.insert(&pat("a.com"), SelectorId(2)));
        assert!(m.insert(&pat("*.com"), SelectorId(1)));
        assert!(m.insert(&pat("**.com"), SelectorId(1)));
        assert!(m.insert(&pat("*"), SelectorId(1)));
        assert!(m.insert(&pat("a*.com"), SelectorId(1)));
        assert!(m.insert(&pat("*a.com"), SelectorId(3)));
        assert_eq!(m.len(), 7);
        let mut seen = Vec::new();
        m.for_each_match("a.com.", |id| seen.push(id));
        seen.sort_unstable();
        assert_eq!(seen, ids_of(&[1, 2, 3]));
        // Once the sharing is gone, no deduplication is needed and still none is repeated.
        for p in ["*.com", "**.com", "*", "a*.com"] {
            assert!(m.remove(&pat(p), SelectorId(1)));
        }
        assert_eq!(m.shared_ids, 0);
        assert_eq!(ids(&m, "a.com."), [1, 2, 3]);
    }

    #[test]
    fn distinct_keys_compiling_to_one_place() {
        // Pure wildcards, equal globs and equal `**.` prefixes share a trie slot.
        let groups: [&[&str]; 4] = [
            &["*", "**", "*.", "**."],
            &["a**b.com", "a*b.com"],
            &["**.x", "***.x"],
            &["*.**.x", "*.*.x"],
        ];
        for group in groups {
            let mut m = Matcher::new();
            let sels: Vec<_> = group.iter().map(|p| pat(p)).collect();
            for s in &sels {
                assert!(m.insert(s, SelectorId(7)), "{s}");
                assert!(m.insert(s, SelectorId(8)), "{s}");
            }
            assert_eq!(m.len(), 2 * sels.len());
            let probe = match group[0] {
                "a**b.com" => "ab.com.",
                "**.x" => "y.x.",
                "*.**.x" => "y.z.x.",
                _ => "a.a-b.com.",
            };
            for (i, s) in sels.iter().enumerate() {
                assert_eq!(ids(&m, probe), [7, 8], "{group:?} after removing {i}");
                assert!(m.remove(s, SelectorId(7)));
                assert!(!m.remove(s, SelectorId(7)));
            }
            assert_eq!(ids(&m, probe), [8]);
            for s in &sels {
                assert!(m.remove(s, SelectorId(8)));
            }
            assert!(m.is_empty() && m.root.is_empty() && m.all.is_empty());
        }
    }

    #[test]
    fn remove_prunes_and_reports() {
        let mut m = sample();
        assert!(!m.remove(&pat("www.cilium.io"), SelectorId(99)));
        assert!(!m.remove(&pat("nothere.cilium.io"), SelectorId(1)));
        assert!(!m.remove(&pat("*x.cilium.io"), SelectorId(6)));
        assert!(!m.remove(&pat("**.cilium.io"), SelectorId(2)));
        assert_eq!(m.len(), 10);
        // matchName and matchPattern with the same key are the same selector.
        assert!(m.remove(
            &FqdnSelector::match_name("WWW.cilium.io").unwrap(),
            SelectorId(1)
        ));
        assert!(!m.remove(&pat("www.cilium.io"), SelectorId(1)));
        assert_eq!(ids(&m, "www.cilium.io."), [2, 3, 5]);
        assert!(m.remove(&pat("*"), SelectorId(5)));
        assert_eq!(ids(&m, "www.cilium.io."), [2, 3]);
        // Removing one glob keeps the other glob at the same node.
        assert!(m.remove(&pat("*.cilium.io"), SelectorId(2)));
        assert_eq!(ids(&m, "api-x.cilium.io."), [3, 6]);
        for (id, p) in [
            (3, "**.cilium.io"),
            (4, "*cilium.io"),
            (6, "api-*.cilium.io"),
            (7, "*.*.cilium.io"),
            (8, "cilium.io"),
            (9, "a..b"),
            (10, "."),
        ] {
            assert!(m.remove(&pat(p), SelectorId(id)), "{p}");
        }
        assert!(m.is_empty());
        assert_eq!(m.len(), 0);
        assert!(m.root.is_empty());
        assert!(m.all.is_empty());
        assert!(m.id_uses.is_empty());
        assert!(m.registered.is_empty());
        assert_eq!(ids(&m, "www.cilium.io."), Vec::<u32>::new());
    }

    #[test]
    fn deep_names_and_many_selectors() {
        let mut m = Matcher::new();
        for i in 0..2000 {
            m.insert(&pat(&format!("host{i}.example.com")), SelectorId(i));
            m.insert(
                &pat(&format!("*.svc{i}.cluster.local")),
                SelectorId(10_000 + i),
            );
        }
        m.insert(&pat("**.local"), SelectorId(50_000));
        assert_eq!(ids(&m, "host42.example.com."), [42]);
        assert_eq!(ids(&m, "db.svc7.cluster.local."), [10_007, 50_000]);
        let deep = format!("{}svc7.cluster.local.", "a.".repeat(40));
        assert_eq!(ids(&m, &deep), [50_000]);
        let huge = format!("{}.", "a.".repeat(10_000));
        assert_eq!(ids(&m, &huge), Vec::<u32>::new());
    }

    /// One registration in the model: the original pattern text, its regex and its id.
    struct Reg {
        text: String,
        re: Regex,
        id: u32,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn matcher_agrees_with_cilium_regex(
            regs in proptest::collection::vec((pattern_strategy(), 0u32..12), 1..40),
            removals in proptest::collection::vec(any::<bool>(), 40),
            names in proptest::collection::vec(name_strategy(), 1..12),
            fills in proptest::collection::vec(fills_strategy(), 8),
            dots in proptest::collection::vec(any::<bool>(), 8),
        ) {
            let mut m = Matcher::new();
            // Model: registered (key, id) pairs, with the regex of the first text for the key.
            let mut model: StdHashMap<(String, u32), Reg> = StdHashMap::new();
            for (text, id) in &regs {
                let Ok(sel) = FqdnSelector::match_pattern(text) else { continue };
                let fresh = !model.contains_key(&(sel.key().to_owned(), *id));
                prop_assert_eq!(m.insert(&sel, SelectorId(*id)), fresh);
                model.entry((sel.key().to_owned(), *id)).or_insert_with(|| Reg {
                    text: text.clone(),
                    re: cilium_regex(text),
                    id: *id,
                });
                prop_assert_eq!(m.len(), model.len());
            }
            for ((text, id), remove) in regs.iter().zip(&removals) {
                if !remove {
                    continue;
                }
                let Ok(sel) = FqdnSelector::match_pattern(text) else { continue };
                let present = model.remove(&(sel.key().to_owned(), *id)).is_some();
                prop_assert_eq!(m.remove(&sel, SelectorId(*id)), present);
                prop_assert_eq!(m.len(), model.len());
            }
            // Names: random ones, plus near misses built from registered patterns.
            let mut all_names = names.clone();
            for ((reg, fill), dot) in model.values().zip(&fills).zip(&dots) {
                all_names.push(instantiate(&reg.text, fill, *dot));
            }
            for name in &all_names {
                for name in [name.clone(), canonicalize(name).into_owned()] {
                    let mut got = Vec::new();
                    m.for_each_match(&name, |SelectorId(id)| got.push(id));
                    let got_set: BTreeSet<u32> = got.iter().copied().collect();
                    prop_assert_eq!(got.len(), got_set.len(), "duplicate ids for {:?}: {:?}", name, got);
                    let want: BTreeSet<u32> =
                        model.values().filter(|r| r.re.is_match(&name)).map(|r| r.id).collect();
                    prop_assert_eq!(&got_set, &want, "name {:?}", name);
                    // The short-circuiting walk answers as the full one.
                    prop_assert_eq!(m.is_match(&name), !want.is_empty(), "is_match {:?}", name);
                }
            }
            // Remove everything left: the trie is pruned to nothing.
            for reg in model.values() {
                prop_assert!(m.remove(&pat(&reg.text), SelectorId(reg.id)));
            }
            prop_assert!(m.is_empty());
            prop_assert!(m.root.is_empty());
            prop_assert!(m.all.is_empty());
            prop_assert!(m.id_uses.is_empty());
            prop_assert_eq!(m.shared_ids, 0);
        }
    }
}
