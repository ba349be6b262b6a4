//! Matching one name against all registered FQDN selectors at once.
//!
//! [`Matcher`] compiles every registered [`FqdnSelector`] into one trie over labels read from
//! the right (TLD first). Each node holds:
//! - literal children in a hash map keyed by the label text,
//! - glob children (labels containing `*`) in a small vec, shared by equal globs,
//! - terminals: selectors whose labels end exactly here,
//! - "multi" terminals: selectors with a leading `**.`, matching when one or more further
//!   labels remain and all of them are non-empty `[-a-zA-Z0-9_]` text.
//!
//! Pure wildcards (`*`, `**.`, …) sit in one list beside the trie.
//!
//! **Cost.** A lookup walks the name's labels once: one hash lookup per label and node, plus one
//! glob test per glob child of each visited node. It grows with the depth of the name and with
//! the number of distinct glob labels sharing one trie node (e.g. many `*foo.example.com`
//! patterns under `example.com`), not with the number of selectors. Names of up to 16 labels
//! are matched without heap allocation.
//!
//! The answers are exactly those of [`FqdnSelector::matches`] for every input string.

use std::collections::HashMap;

use smallvec::SmallVec;

use crate::pattern::{Compiled, FqdnSelector, Glob, LabelPattern, SplitName};

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
    all: Vec<SelectorId>,
    /// Number of `(selector, id)` pairs registered.
    len: usize,
    /// Number of distinct selectors each id is registered with.
    id_uses: HashMap<SelectorId, u32>,
    /// Ids registered with more than one selector: matching must then deduplicate.
    shared_ids: usize,
}

#[derive(Debug, Clone, Default)]
struct Node {
    literals: HashMap<Box<str>, Node>,
    globs: Vec<(Glob, Node)>,
    terminals: Vec<SelectorId>,
    multi: Vec<SelectorId>,
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
                let pos = match self.globs.iter().position(|(g, _)| g == glob) {
                    Some(pos) => pos,
                    None => {
                        self.globs.push((glob.clone(), Node::default()));
                        self.globs.len() - 1
                    }
                };
                &mut self.globs[pos].1
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
            return remove_id(list, id);
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
                let Some(pos) = self.globs.iter().position(|(g, _)| g == glob) else {
                    return false;
                };
                let child = &mut self.globs[pos].1;
                let removed = child.remove(rest, multi, id);
                if child.is_empty() {
                    self.globs.swap_remove(pos);
                }
                removed
            }
        }
    }

    /// Reports the selectors matching `name`, of which `depth` labels (from the right) have
    /// been consumed to reach this node.
    fn walk(&self, name: &SplitName<'_>, depth: usize, f: &mut impl FnMut(SelectorId)) {
        let n = name.labels.len();
        let remaining = n - depth;
        if remaining == 0 {
            self.terminals.iter().copied().for_each(&mut *f);
            return;
        }
        if !self.multi.is_empty() && name.multi_covers(remaining) {
            self.multi.iter().copied().for_each(&mut *f);
        }
        let label = name.labels[remaining - 1];
        if let Some(child) = self.literals.get(label) {
            child.walk(name, depth + 1, f);
        }
        for (glob, child) in &self.globs {
            if glob.is_match(label) {
                child.walk(name, depth + 1, f);
            }
        }
    }
}

/// Pushes `id` unless present; returns whether it was added.
fn insert_id(list: &mut Vec<SelectorId>, id: SelectorId) -> bool {
    if list.contains(&id) {
        false
    } else {
        list.push(id);
        true
    }
}

/// Removes `id` if present; returns whether it was there.
fn remove_id(list: &mut Vec<SelectorId>, id: SelectorId) -> bool {
    match list.iter().position(|&x| x == id) {
        Some(pos) => {
            list.swap_remove(pos);
            if list.is_empty() {
                *list = Vec::new();
            }
            true
        }
        None => false,
    }
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
        let added = match selector.compiled() {
            Compiled::All => insert_id(&mut self.all, id),
            Compiled::Labels { labels, multi } => {
                let node = labels
                    .iter()
                    .fold(&mut self.root, |node, label| node.child_mut(label));
                let list = if *multi {
                    &mut node.multi
                } else {
                    &mut node.terminals
                };
                insert_id(list, id)
            }
        };
        if added {
            self.len += 1;
            let uses = self.id_uses.entry(id).or_insert(0);
            *uses += 1;
            if *uses == 2 {
                self.shared_ids += 1;
            }
        }
        added
    }

    /// Unregisters `selector` under `id`, pruning trie nodes left empty. Returns whether the
    /// pair was registered.
    pub fn remove(&mut self, selector: &FqdnSelector, id: SelectorId) -> bool {
        let removed = match selector.compiled() {
            Compiled::All => remove_id(&mut self.all, id),
            Compiled::Labels { labels, multi } => self.root.remove(labels, *multi, id),
        };
        if removed {
            self.len -= 1;
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
        }
        removed
    }

    /// Calls `f` once for each id with a selector matching `canonical_name` (see
    /// [`crate::name::canonicalize`]), in no particular order.
    ///
    /// Gives the same answers as [`FqdnSelector::matches`] for any string, canonical or not.
    pub fn for_each_match(&self, canonical_name: &str, mut f: impl FnMut(SelectorId)) {
        let Some(name) = SplitName::new(canonical_name) else {
            return;
        };
        if self.shared_ids == 0 {
            self.report(&name, &mut f);
        } else {
            let mut seen: SmallVec<[SelectorId; 16]> = SmallVec::new();
            self.report(&name, &mut |id| {
                if !seen.contains(&id) {
                    seen.push(id);
                    f(id);
                }
            });
        }
    }

    fn report(&self, name: &SplitName<'_>, f: &mut impl FnMut(SelectorId)) {
        if !self.all.is_empty() && name.matches_all() {
            self.all.iter().copied().for_each(&mut *f);
        }
        self.root.walk(name, 0, f);
    }

    /// Does any registered selector match `canonical_name`?
    #[must_use]
    pub fn is_match(&self, canonical_name: &str) -> bool {
        let mut any = false;
        self.for_each_match(canonical_name, |_| any = true);
        any
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
        self.len == 0
    }

    /// Number of registered `(selector, id)` pairs.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }
}
