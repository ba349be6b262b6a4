//! The global identity allocator's algorithm, apart from any store or clock: a view of the
//! identities and of the endpoints that use them, built from a snapshot and the watch events
//! after it, and the plan of what to create and what to collect.
//!
//! - **One identity per label set.** A label set some endpoint uses and that has no identity
//!   gets one number from the cluster range, next-fit from a cursor (a freed number is not
//!   handed out again at once). The transaction that creates it ([`Allocator::create_txn`])
//!   requires that neither the number nor the label set has a key yet, so a stale view or a
//!   deposed leader can never make a duplicate: the transaction fails instead.
//! - **GC.** An identity no endpoint has used for the grace period is deleted by a
//!   transaction ([`Allocator::gc_txn`]) that also requires that no endpoint key of its label
//!   set was created or changed after the revision the view is complete up to — an endpoint
//!   that appeared meanwhile makes it fail.
//! - Both require the leader key to be the one this allocator created (fencing).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::keys::{CLUSTER_MAX, CLUSTER_MIN, EndpointRecord, IdentityRecord, Key, Layout};
use crate::labels::Labels;
use crate::reject::{RecordKind, Rejections};
use crate::store::{Compare, Event, Kv, Op, Revision, Snapshot, Txn};

/// An identity as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    labels: Labels,
    /// The revision of its `identities/id/` key.
    id_revision: Revision,
}

/// What the allocator should do next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Label sets to give an identity, with the number chosen.
    pub create: Vec<(Labels, u32)>,
    /// Identities to delete (unused for the grace period).
    pub collect: Vec<(u32, Labels)>,
}

impl Plan {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.collect.is_empty()
    }
}

/// The allocator's view and its decisions.
#[derive(Debug, Clone)]
pub struct Allocator {
    layout: Layout,
    by_id: BTreeMap<u32, Held>,
    /// From the `identities/labels/` keys: label set → (number, key revision).
    by_labels: HashMap<Labels, (u32, Revision)>,
    /// Endpoints using each label set: (node, endpoint id).
    users: HashMap<Labels, BTreeSet<(String, u16)>>,
    /// Label sets with an identity and no user, since when.
    unused_since: HashMap<Labels, Duration>,
    /// Label sets some endpoint uses that have no valid identity (kept as the view changes,
    /// so a plan costs what it creates, not the number of label sets). An identity is valid
    /// when both its keys parse and name each other.
    unnumbered: BTreeSet<Labels>,
    /// `identities/id/` keys whose value is not a record of their number: the number is
    /// taken (never handed out), the key's revision.
    damaged_ids: BTreeMap<u32, Revision>,
    /// `identities/labels/` keys whose value is not a record of their label set (or names a
    /// number outside the range): the label set is given a number again, by a transaction
    /// that overwrites the key only as it was seen.
    damaged_labels: HashMap<Labels, Revision>,
    /// Records refused as read.
    rejected: Rejections,
    cursor: u32,
    /// The view holds every change up to this revision.
    revision: Revision,
    /// The leader's name, if one holds the key.
    leader: Option<String>,
}

impl Allocator {
    /// An empty view of the layout.
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            by_id: BTreeMap::new(),
            by_labels: HashMap::new(),
            users: HashMap::new(),
            unused_since: HashMap::new(),
            unnumbered: BTreeSet::new(),
            damaged_ids: BTreeMap::new(),
            damaged_labels: HashMap::new(),
            rejected: Rejections::default(),
            cursor: CLUSTER_MIN,
            revision: 0,
            leader: None,
        }
    }

    /// Replaces the view with a snapshot of the whole prefix taken at `now`. Identities
    /// without users start their grace period now.
    pub fn load(&mut self, snapshot: &Snapshot, now: Duration) {
        let rejected = std::mem::take(&mut self.rejected);
        *self = Self::new(self.layout.clone());
        self.rejected = rejected;
        for kv in &snapshot.kvs {
            self.put(kv, now);
        }
        let used: Vec<Labels> = self.users.keys().cloned().collect();
        for labels in used {
            self.refresh(&labels);
        }
        self.revision = snapshot.revision;
        let unused: Vec<Labels> = self
            .by_labels
            .keys()
            .filter(|l| self.users.get(*l).is_none_or(BTreeSet::is_empty))
            .cloned()
            .collect();
        for labels in unused {
            self.unused_since.insert(labels, now);
        }
    }

    /// Applies watch events (in revision order) seen at `now`.
    pub fn apply(&mut self, events: &[Event], now: Duration) {
        for event in events {
            match event {
                Event::Put(kv) => self.put(kv, now),
                Event::Delete { key, .. } => self.delete(key, now),
            }
            self.revision = self.revision.max(event.revision());
        }
    }

    fn put(&mut self, kv: &Kv, now: Duration) {
        let key = kv.key.as_str();
        match self.layout.parse(key) {
            Some(Key::IdentityById(id)) => {
                let before = self.by_id.get(&id).map(|h| h.labels.clone());
                match decode(kv).filter(|r| r.id == id) {
                    Some(record) => {
                        self.damaged_ids.remove(&id);
                        let labels = record.labels;
                        if self.users.get(&labels).is_none_or(BTreeSet::is_empty)
                            && self.by_labels.contains_key(&labels)
                        {
                            self.unused_since.entry(labels.clone()).or_insert(now);
                        }
                        self.by_id.insert(
                            id,
                            Held {
                                labels: labels.clone(),
                                id_revision: kv.mod_revision,
                            },
                        );
                        self.refresh(&labels);
                    }
                    None => {
                        self.by_id.remove(&id);
                        self.damaged_ids.insert(id, kv.mod_revision);
                        self.rejected.reject(
                            RecordKind::Identity,
                            key,
                            kv.mod_revision,
                            "the value does not parse or names another number: the number is skipped",
                        );
                    }
                }
                if let Some(before) = before {
                    self.refresh(&before);
                }
            }
            Some(Key::IdentityByLabels(labels)) => {
                match decode(kv)
                    .filter(|r| r.labels == labels && (CLUSTER_MIN..=CLUSTER_MAX).contains(&r.id))
                {
                    Some(record) => {
                        self.damaged_labels.remove(&labels);
                        self.by_labels
                            .insert(labels.clone(), (record.id, kv.mod_revision));
                        if self.users.get(&labels).is_none_or(BTreeSet::is_empty) {
                            self.unused_since.entry(labels.clone()).or_insert(now);
                        }
                    }
                    None => {
                        self.by_labels.remove(&labels);
                        self.unused_since.remove(&labels);
                        self.damaged_labels.insert(labels.clone(), kv.mod_revision);
                        self.rejected.reject(
                            RecordKind::Identity,
                            key,
                            kv.mod_revision,
                            "the value does not parse, names other labels or a number outside 256-65535: the label set is numbered again",
                        );
                    }
                }
                self.refresh(&labels);
            }
            Some(Key::Endpoint { labels, node, id }) => {
                let valid = serde_json::from_slice::<EndpointRecord>(&kv.value)
                    .is_ok_and(|r| r.labels == labels && r.node == node && r.id == id);
                if !valid {
                    self.rejected.reject(
                        RecordKind::Endpoint,
                        key,
                        kv.mod_revision,
                        "the value does not parse or is not the key's endpoint: no identity is made for it",
                    );
                    self.delete(key, now);
                    return;
                }
                self.unused_since.remove(&labels);
                self.users
                    .entry(labels.clone())
                    .or_default()
                    .insert((node, id));
                self.refresh(&labels);
            }
            Some(Key::Cursor) => {
                match std::str::from_utf8(&kv.value)
                    .ok()
                    .and_then(|t| t.trim().parse::<u32>().ok())
                    .filter(|n| (CLUSTER_MIN..=CLUSTER_MAX).contains(n))
                {
                    Some(n) => self.cursor = n,
                    None => self.rejected.reject(
                        RecordKind::Operator,
                        key,
                        kv.mod_revision,
                        "the cursor is not a number of 256-65535",
                    ),
                }
            }
            Some(Key::Leader) => {
                self.leader = Some(String::from_utf8_lossy(&kv.value).into_owned());
            }
            Some(Key::Policy(_) | Key::Node(_)) => {}
            None => self.rejected.reject(
                RecordKind::Key,
                key,
                kv.mod_revision,
                "the key is not part of the layout",
            ),
        }
    }

    /// Whether `labels` has a valid identity: its labels key names a number whose key names
    /// it back.
    fn numbered(&self, labels: &Labels) -> bool {
        self.by_labels
            .get(labels)
            .is_some_and(|(n, _)| self.by_id.get(n).is_some_and(|h| h.labels == *labels))
    }

    /// Puts `labels` in or out of the unnumbered set, as its users and identity say.
    fn refresh(&mut self, labels: &Labels) {
        if self.users.get(labels).is_some_and(|u| !u.is_empty()) && !self.numbered(labels) {
            self.unnumbered.insert(labels.clone());
        } else {
            self.unnumbered.remove(labels);
        }
    }

    fn delete(&mut self, key: &str, now: Duration) {
        match self.layout.parse(key) {
            Some(Key::IdentityById(id)) => {
                self.damaged_ids.remove(&id);
                if let Some(held) = self.by_id.remove(&id) {
                    if !self.by_labels.contains_key(&held.labels) {
                        self.unused_since.remove(&held.labels);
                    }
                    self.refresh(&held.labels);
                }
            }
            Some(Key::IdentityByLabels(labels)) => {
                self.by_labels.remove(&labels);
                self.damaged_labels.remove(&labels);
                self.unused_since.remove(&labels);
                self.refresh(&labels);
            }
            Some(Key::Endpoint { labels, node, id }) => {
                if let Some(users) = self.users.get_mut(&labels) {
                    users.remove(&(node, id));
                    if users.is_empty() {
                        self.users.remove(&labels);
                        if self.by_labels.contains_key(&labels) {
                            self.unused_since.insert(labels.clone(), now);
                        }
                    }
                }
                self.refresh(&labels);
            }
            Some(Key::Leader) => self.leader = None,
            _ => {}
        }
    }

    /// Records identities this allocator just created (the transaction succeeded at
    /// `revision`), so the next plan does not ask for them again before the watch brings
    /// them. The view's completeness revision does not move.
    pub fn created(&mut self, created: &[(Labels, u32)], revision: Revision, now: Duration) {
        for (labels, id) in created {
            self.by_id.insert(
                *id,
                Held {
                    labels: labels.clone(),
                    id_revision: revision,
                },
            );
            self.by_labels.insert(labels.clone(), (*id, revision));
            self.damaged_labels.remove(labels);
            self.unnumbered.remove(labels);
            if self.users.get(labels).is_none_or(BTreeSet::is_empty) {
                self.unused_since.entry(labels.clone()).or_insert(now);
            }
            self.cursor = next_number(*id);
        }
    }

    /// Records an identity this allocator just collected.
    pub fn collected(&mut self, id: u32, labels: &Labels) {
        self.by_id.remove(&id);
        self.by_labels.remove(labels);
        self.unused_since.remove(labels);
        self.refresh(labels);
    }

    /// What to do at `now`: create identities for used label sets without one (at most
    /// `max_create`, [`Allocator::plan_create`]), collect identities unused for `grace`.
    pub fn plan(&self, now: Duration, grace: Duration, max_create: usize) -> Plan {
        let mut collect: Vec<(u32, Labels)> = self
            .unused_since
            .iter()
            .filter(|(_, since)| now.saturating_sub(**since) >= grace)
            .filter(|(labels, _)| self.users.get(*labels).is_none_or(BTreeSet::is_empty))
            .filter_map(|(labels, _)| {
                let (id, _) = self.by_labels.get(labels)?;
                Some((*id, labels.clone()))
            })
            .collect();
        collect.sort();
        Plan {
            create: self.plan_create(max_create),
            collect,
        }
    }

    /// The identities to create: used label sets without one, in label order, at most
    /// `max_create`, each with the next free number from the cursor. Costs what it returns.
    pub fn plan_create(&self, max_create: usize) -> Vec<(Labels, u32)> {
        debug_assert!(
            self.unnumbered.iter().eq(self
                .users
                .iter()
                .filter(|(l, u)| !u.is_empty() && !self.numbered(l))
                .map(|(l, _)| l)
                .collect::<BTreeSet<_>>()),
            "the unnumbered label sets are those in use without an identity"
        );
        let mut create = Vec::new();
        let mut cursor = self.cursor;
        let mut taken = BTreeSet::new();
        for labels in self.unnumbered.iter().take(max_create) {
            let Some(id) = self.next_free(cursor, &taken) else {
                break;
            };
            taken.insert(id);
            cursor = next_number(id);
            create.push((labels.clone(), id));
        }
        create
    }

    /// Whether some used label set has no identity and no number is free for it.
    pub fn exhausted(&self) -> bool {
        let (lo, hi) = (CLUSTER_MIN, CLUSTER_MAX);
        self.by_id.len() + self.damaged_ids.len() >= (hi - lo + 1) as usize
            && !self.unnumbered.is_empty()
    }

    fn next_free(&self, cursor: u32, taken: &BTreeSet<u32>) -> Option<u32> {
        let size = CLUSTER_MAX - CLUSTER_MIN + 1;
        let start = if (CLUSTER_MIN..=CLUSTER_MAX).contains(&cursor) {
            cursor
        } else {
            CLUSTER_MIN
        };
        (0..size)
            .map(|step| CLUSTER_MIN + (start - CLUSTER_MIN + step) % size)
            .find(|n| {
                !self.by_id.contains_key(n)
                    && !self.damaged_ids.contains_key(n)
                    && !taken.contains(n)
            })
    }

    /// The transaction creating `create` (both keys of each, and the cursor), fenced on the
    /// leader key created at `leader_revision`. It fails whole if any number already has a
    /// key, or any label set's key is not as the view saw it: missing, or (a damaged key, or
    /// one naming a number that does not name it back) unchanged since the view read it.
    pub fn create_txn(&self, create: &[(Labels, u32)], leader_revision: Revision) -> Txn {
        let mut txn = Txn {
            compares: vec![Compare::created_at(self.layout.leader(), leader_revision)],
            ops: Vec::new(),
        };
        for (labels, id) in create {
            let id_key = self.layout.identity_by_id(*id);
            let labels_key = self.layout.identity_by_labels(labels);
            txn.compares.push(Compare::missing(id_key.clone()));
            let seen = self
                .by_labels
                .get(labels)
                .map(|(_, revision)| *revision)
                .or_else(|| self.damaged_labels.get(labels).copied());
            txn.compares.push(match seen {
                Some(revision) => Compare::modified_at(labels_key.clone(), revision),
                None => Compare::missing(labels_key.clone()),
            });
            let value = encode(&IdentityRecord {
                id: *id,
                labels: labels.clone(),
            });
            txn.ops.push(Op::Put {
                key: id_key,
                value: value.clone(),
                lease: None,
            });
            txn.ops.push(Op::Put {
                key: labels_key,
                value,
                lease: None,
            });
        }
        if let Some((_, last)) = create.last() {
            txn.ops.push(Op::Put {
                key: self.layout.cursor(),
                value: next_number(*last).to_string().into_bytes(),
                lease: None,
            });
        }
        txn
    }

    /// The transaction deleting identity `id` of `labels`: only if both its keys are as the
    /// view saw them, no endpoint key of the label set changed after the view's revision, and
    /// the leader key is ours. `None` if the view does not hold the identity.
    pub fn gc_txn(&self, id: u32, labels: &Labels, leader_revision: Revision) -> Option<Txn> {
        let held = self.by_id.get(&id).filter(|h| h.labels == *labels)?;
        let (_, labels_revision) = self.by_labels.get(labels).filter(|(n, _)| *n == id)?;
        let id_key = self.layout.identity_by_id(id);
        let labels_key = self.layout.identity_by_labels(labels);
        Some(Txn {
            compares: vec![
                Compare::created_at(self.layout.leader(), leader_revision),
                Compare::modified_at(id_key.clone(), held.id_revision),
                Compare::modified_at(labels_key.clone(), *labels_revision),
                Compare::unchanged_since(self.layout.endpoints_of(labels), self.revision),
            ],
            ops: vec![Op::Delete { key: id_key }, Op::Delete { key: labels_key }],
        })
    }

    /// The revision the view is complete up to.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// Identities in the view.
    pub fn identities(&self) -> usize {
        self.by_id.len()
    }

    /// The number of `labels`, if it has one.
    pub fn identity_of(&self, labels: &Labels) -> Option<u32> {
        self.by_labels.get(labels).map(|(id, _)| *id)
    }

    /// The leader's name, as the view last saw the key.
    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }

    /// Label sets in use.
    pub fn label_sets_in_use(&self) -> usize {
        self.users.len()
    }

    /// Records refused as read.
    pub fn rejections(&self) -> &Rejections {
        &self.rejected
    }

    /// Numbers whose key is damaged (skipped by allocation).
    pub fn damaged_numbers(&self) -> usize {
        self.damaged_ids.len()
    }
}

fn next_number(id: u32) -> u32 {
    if id >= CLUSTER_MAX {
        CLUSTER_MIN
    } else {
        id + 1
    }
}

fn encode(record: &IdentityRecord) -> Vec<u8> {
    serde_json::to_vec(record).unwrap_or_default()
}

fn decode(kv: &Kv) -> Option<IdentityRecord> {
    serde_json::from_slice(&kv.value).ok()
}

/// The identities of a snapshot as a table, checking the store's invariants: every number's
/// two keys agree, and no label set has two numbers. Returns number → labels, or what is
/// wrong. (Tests and `fqdnd` diagnostics.)
pub fn check_identities(layout: &Layout, kvs: &[Kv]) -> Result<BTreeMap<u32, Labels>, String> {
    let mut by_id: BTreeMap<u32, Labels> = BTreeMap::new();
    let mut by_labels: BTreeMap<Labels, u32> = BTreeMap::new();
    for kv in kvs {
        match layout.parse(&kv.key) {
            Some(Key::IdentityById(id)) => {
                let record =
                    decode(kv).ok_or_else(|| format!("{}: value does not parse", kv.key))?;
                if record.id != id {
                    return Err(format!("{}: holds number {}", kv.key, record.id));
                }
                by_id.insert(id, record.labels);
            }
            Some(Key::IdentityByLabels(labels)) => {
                let record =
                    decode(kv).ok_or_else(|| format!("{}: value does not parse", kv.key))?;
                if record.labels != labels {
                    return Err(format!("{}: holds other labels", kv.key));
                }
                by_labels.insert(labels, record.id);
            }
            _ => {}
        }
    }
    let mut seen: HashMap<&Labels, u32> = HashMap::new();
    for (id, labels) in &by_id {
        if let Some(other) = seen.insert(labels, *id) {
            return Err(format!("duplicate: {labels} has {other} and {id}"));
        }
        if by_labels.get(labels) != Some(id) {
            return Err(format!("{id} ({labels}) has no matching labels key"));
        }
    }
    if by_labels.len() != by_id.len() {
        return Err(format!(
            "{} labels keys for {} numbers",
            by_labels.len(),
            by_id.len()
        ));
    }
    Ok(by_id)
}
