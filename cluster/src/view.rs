//! What a node knows of the cluster ([`View`]): the global identities, the other nodes'
//! endpoints and registrations (their own addresses), the shared policy documents and the
//! allocator leader — built from a snapshot and
//! the watch events after it, compared with an older view to say what changed ([`Changes`]),
//! and kept in the state directory so a node restarted while etcd is down starts from it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::keys::{
    CLUSTER_MAX, CLUSTER_MIN, EndpointRecord, IdentityRecord, Key, Layout, NodeRecord,
};
use crate::labels::Labels;
use crate::reject::{RecordKind, Rejections};
use crate::store::{Event, Kv, Revision, Snapshot};

/// The first bytes of a state file, with the format version (2: with the other nodes'
/// registrations).
const MAGIC: &[u8; 8] = b"FQDNDCL2";
/// Version 1 (before the nodes' registrations), still read.
const MAGIC_V1: &[u8; 8] = b"FQDNDCL1";

/// The cluster as one node sees it. Two views are equal when what they hold is (the raw
/// identity keys behind `identities` are not compared).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct View {
    /// The view holds every change up to this revision.
    pub revision: Revision,
    /// Global identities: label set → number.
    pub identities: BTreeMap<Labels, u32>,
    /// The other nodes' endpoints, by key.
    pub endpoints: BTreeMap<String, EndpointRecord>,
    /// Shared policy documents, by name.
    pub policies: BTreeMap<String, String>,
    /// The allocator leader's name.
    pub leader: Option<String>,
    /// The other nodes' registrations, by node name.
    pub nodes: BTreeMap<String, NodeRecord>,
    /// The `identities/id/` keys as read: number → label set (not saved: a view read back
    /// from its file is replaced by a snapshot before any event is applied to it).
    #[serde(skip)]
    ids: BTreeMap<u32, Labels>,
    /// The `identities/labels/` keys as read: label set → number (not saved, as `ids`).
    #[serde(skip)]
    numbers: BTreeMap<Labels, u32>,
}

impl PartialEq for View {
    fn eq(&self, other: &Self) -> bool {
        self.revision == other.revision
            && self.identities == other.identities
            && self.endpoints == other.endpoints
            && self.policies == other.policies
            && self.leader == other.leader
            && self.nodes == other.nodes
    }
}

impl Eq for View {}

/// A state file of version 1: a [`View`] without `nodes` (the compact encoding has no field
/// names, so the old layout is read as its own type).
#[derive(Deserialize)]
struct ViewV1 {
    revision: Revision,
    identities: BTreeMap<Labels, u32>,
    endpoints: BTreeMap<String, EndpointRecord>,
    policies: BTreeMap<String, String>,
    leader: Option<String>,
}

impl From<ViewV1> for View {
    fn from(v: ViewV1) -> Self {
        Self {
            revision: v.revision,
            identities: v.identities,
            endpoints: v.endpoints,
            policies: v.policies,
            leader: v.leader,
            nodes: BTreeMap::new(),
            ids: BTreeMap::new(),
            numbers: BTreeMap::new(),
        }
    }
}

/// What changed between two views, in the order a node applies it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Label sets that lost their global number (or had it changed: then also in `assigned`).
    pub unassigned: Vec<(Labels, u32)>,
    /// Label sets that got a global number.
    pub assigned: Vec<(Labels, u32)>,
    /// Remote endpoints gone (by key).
    pub endpoints_removed: Vec<String>,
    /// Remote endpoints new or changed.
    pub endpoints_upserted: Vec<(String, EndpointRecord)>,
    /// The whole set of shared policy documents, if it changed.
    pub policies: Option<BTreeMap<String, String>>,
    /// Whether the leader changed.
    pub leader: bool,
    /// Other nodes whose registration went (by name).
    pub nodes_removed: Vec<String>,
    /// Other nodes registered, or whose addresses changed.
    pub nodes_upserted: Vec<NodeRecord>,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.unassigned.is_empty()
            && self.assigned.is_empty()
            && self.endpoints_removed.is_empty()
            && self.endpoints_upserted.is_empty()
            && self.policies.is_none()
            && !self.leader
            && self.nodes_removed.is_empty()
            && self.nodes_upserted.is_empty()
    }

    /// Whether the identity table changed.
    pub fn identities_changed(&self) -> bool {
        !self.unassigned.is_empty() || !self.assigned.is_empty()
    }
}

/// This node's own keys (endpoints and registration) found in a snapshot (what an earlier run
/// published).
pub type Own = BTreeMap<String, Kv>;

/// Whether `key` is one node `node` publishes (its endpoints, its registration).
fn is_own(parsed: Option<&Key>, node: &str) -> bool {
    match parsed {
        Some(Key::Endpoint { node: n, .. } | Key::Node(n)) => n == node,
        _ => false,
    }
}

impl View {
    /// The view of a snapshot of the whole prefix, for node `node` (its own endpoints and
    /// registration are returned apart, not in the view). Records that are not well formed
    /// go to `rejected`, each alone.
    pub fn from_snapshot(
        layout: &Layout,
        node: &str,
        snapshot: &Snapshot,
        rejected: &mut Rejections,
    ) -> (Self, Own) {
        let mut view = Self {
            revision: snapshot.revision,
            ..Self::default()
        };
        let mut own = Own::new();
        for kv in &snapshot.kvs {
            if is_own(layout.parse(&kv.key).as_ref(), node) {
                own.insert(kv.key.clone(), kv.clone());
                continue;
            }
            view.put(layout, node, kv, rejected);
        }
        let all: Vec<Labels> = view.numbers.keys().cloned().collect();
        for labels in all {
            view.confirm(&labels);
        }
        (view, own)
    }

    /// Whether `labels`' number is confirmed by both identity keys (the number's key names
    /// the same label set): then it is in `identities`, else not.
    fn confirm(&mut self, labels: &Labels) {
        match self.numbers.get(labels) {
            Some(n) if self.ids.get(n) == Some(labels) => {
                self.identities.insert(labels.clone(), *n);
            }
            _ => {
                self.identities.remove(labels);
            }
        }
    }

    /// Applies watch events; returns what changed (net over the batch: a key created and
    /// deleted in it is no change). Events about node `node`'s own keys (endpoints,
    /// registration) are returned apart: (key, still there). Costs what the batch touches, not the size of the view.
    pub fn apply(
        &mut self,
        layout: &Layout,
        node: &str,
        events: &[Event],
        rejected: &mut Rejections,
    ) -> (Changes, Vec<(String, bool)>) {
        let mut own = Vec::new();
        // What each touched key held before the batch.
        let mut identities: BTreeMap<Labels, Option<u32>> = BTreeMap::new();
        let mut endpoints: BTreeMap<String, Option<EndpointRecord>> = BTreeMap::new();
        let mut nodes: BTreeMap<String, Option<NodeRecord>> = BTreeMap::new();
        let policies_before = self.policies.len();
        let mut policies_touched = false;
        let leader_before = self.leader.clone();
        for event in events {
            let parsed = layout.parse(event.key());
            if is_own(parsed.as_ref(), node) {
                own.push((event.key().to_owned(), matches!(event, Event::Put(_))));
                continue;
            }
            match &parsed {
                Some(Key::IdentityByLabels(labels)) => {
                    identities
                        .entry(labels.clone())
                        .or_insert_with(|| self.identities.get(labels).copied());
                }
                Some(Key::IdentityById(n)) => {
                    // The label sets the number's key named before and after the event.
                    let after = match event {
                        Event::Put(kv) => decode_identity(kv, *n),
                        Event::Delete { .. } => None,
                    };
                    for labels in self.ids.get(n).cloned().into_iter().chain(after) {
                        identities
                            .entry(labels.clone())
                            .or_insert_with(|| self.identities.get(&labels).copied());
                    }
                }
                Some(Key::Endpoint { .. }) => {
                    endpoints
                        .entry(event.key().to_owned())
                        .or_insert_with(|| self.endpoints.get(event.key()).cloned());
                }
                Some(Key::Node(n)) => {
                    nodes
                        .entry(n.clone())
                        .or_insert_with(|| self.nodes.get(n).cloned());
                }
                Some(Key::Policy(_)) => policies_touched = true,
                _ => {}
            }
            match event {
                Event::Put(kv) => self.put(layout, node, kv, rejected),
                Event::Delete { key, .. } => self.delete(layout, key),
            }
            self.revision = self.revision.max(event.revision());
        }
        for labels in identities.keys() {
            self.confirm(labels);
        }
        let mut c = Changes::default();
        for (labels, before) in identities {
            let now = self.identities.get(&labels).copied();
            if before != now {
                if let Some(old) = before {
                    c.unassigned.push((labels.clone(), old));
                }
                if let Some(new) = now {
                    c.assigned.push((labels, new));
                }
            }
        }
        for (key, before) in endpoints {
            match self.endpoints.get(&key) {
                None if before.is_some() => c.endpoints_removed.push(key),
                Some(now) if before.as_ref() != Some(now) => {
                    c.endpoints_upserted.push((key, now.clone()));
                }
                _ => {}
            }
        }
        for (name, before) in nodes {
            match self.nodes.get(&name) {
                None if before.is_some() => c.nodes_removed.push(name),
                Some(now) if before.as_ref() != Some(now) => c.nodes_upserted.push(now.clone()),
                _ => {}
            }
        }
        if policies_touched || policies_before != self.policies.len() {
            c.policies = Some(self.policies.clone());
        }
        c.leader = leader_before != self.leader;
        (c, own)
    }

    /// Applies [`Changes`] made elsewhere to this view (the identities, endpoints, nodes and
    /// policies; not the revision or the leader's name).
    pub fn absorb(&mut self, changes: &Changes) {
        for (labels, _) in &changes.unassigned {
            self.identities.remove(labels);
        }
        for (labels, id) in &changes.assigned {
            self.identities.insert(labels.clone(), *id);
        }
        for key in &changes.endpoints_removed {
            self.endpoints.remove(key);
        }
        for (key, record) in &changes.endpoints_upserted {
            self.endpoints.insert(key.clone(), record.clone());
        }
        for name in &changes.nodes_removed {
            self.nodes.remove(name);
        }
        for record in &changes.nodes_upserted {
            self.nodes.insert(record.node.clone(), record.clone());
        }
        if let Some(policies) = &changes.policies {
            self.policies.clone_from(policies);
        }
    }

    /// Reads one key into the view (identities are confirmed by the caller); a record that
    /// is not well formed is refused alone.
    fn put(&mut self, layout: &Layout, node: &str, kv: &Kv, rejected: &mut Rejections) {
        let mut refuse =
            |kind, reason: &str| rejected.reject(kind, &kv.key, kv.mod_revision, reason);
        match layout.parse(&kv.key) {
            Some(Key::IdentityByLabels(labels)) => match decode::<IdentityRecord>(&kv.value) {
                Ok(record) if record.labels != labels => {
                    self.numbers.remove(&labels);
                    refuse(RecordKind::Identity, "the value's labels are not the key's");
                }
                Ok(record) if !(CLUSTER_MIN..=CLUSTER_MAX).contains(&record.id) => {
                    self.numbers.remove(&labels);
                    refuse(RecordKind::Identity, "the number is outside 256-65535");
                }
                Ok(record) => {
                    self.numbers.insert(labels, record.id);
                }
                Err(reason) => {
                    self.numbers.remove(&labels);
                    refuse(RecordKind::Identity, &reason);
                }
            },
            Some(Key::IdentityById(n)) => match decode_identity(kv, n) {
                Some(labels) => {
                    self.ids.insert(n, labels);
                }
                None => {
                    self.ids.remove(&n);
                    refuse(
                        RecordKind::Identity,
                        "the value does not parse or names another number",
                    );
                }
            },
            Some(Key::Endpoint {
                labels,
                node: n,
                id,
                ..
            }) if n != node => match decode::<EndpointRecord>(&kv.value) {
                Ok(record) if record.labels == labels && record.node == n && record.id == id => {
                    match check_addresses(&record.ips) {
                        Ok(()) => {
                            self.endpoints.insert(kv.key.clone(), record);
                        }
                        Err(reason) => {
                            self.endpoints.remove(&kv.key);
                            refuse(RecordKind::Endpoint, &reason);
                        }
                    }
                }
                Ok(_) => {
                    self.endpoints.remove(&kv.key);
                    refuse(
                        RecordKind::Endpoint,
                        "the value's labels, node or id are not the key's",
                    );
                }
                Err(reason) => {
                    self.endpoints.remove(&kv.key);
                    refuse(RecordKind::Endpoint, &reason);
                }
            },
            Some(Key::Node(n)) if n != node => match decode::<NodeRecord>(&kv.value) {
                Ok(record) if record.node == n => match check_addresses(&record.ips) {
                    Ok(()) => {
                        self.nodes.insert(n, record);
                    }
                    Err(reason) => {
                        self.nodes.remove(&n);
                        refuse(RecordKind::Node, &reason);
                    }
                },
                Ok(_) => {
                    self.nodes.remove(&n);
                    refuse(RecordKind::Node, "the value's node is not the key's");
                }
                Err(reason) => {
                    self.nodes.remove(&n);
                    refuse(RecordKind::Node, &reason);
                }
            },
            Some(Key::Policy(name)) => match String::from_utf8(kv.value.clone()) {
                Ok(text) => {
                    self.policies.insert(name, text);
                }
                Err(_) => {
                    // Absent rather than the previous text: the daemon keeps the version it
                    // accepted last in force.
                    self.policies.remove(&name);
                    refuse(RecordKind::Policy, "the document is not UTF-8");
                }
            },
            Some(Key::Leader) => match std::str::from_utf8(&kv.value) {
                Ok(name) if crate::keys::valid_name(name) => self.leader = Some(name.to_owned()),
                _ => {
                    self.leader = None;
                    refuse(
                        RecordKind::Operator,
                        "the leader's name is not a valid name",
                    );
                }
            },
            Some(Key::Cursor | Key::Endpoint { .. } | Key::Node(_)) => {}
            None => refuse(RecordKind::Key, "the key is not part of the layout"),
        }
    }

    fn delete(&mut self, layout: &Layout, key: &str) {
        match layout.parse(key) {
            Some(Key::IdentityByLabels(labels)) => {
                self.numbers.remove(&labels);
            }
            Some(Key::IdentityById(n)) => {
                self.ids.remove(&n);
            }
            Some(Key::Endpoint { .. }) => {
                self.endpoints.remove(key);
            }
            Some(Key::Node(name)) => {
                self.nodes.remove(&name);
            }
            Some(Key::Policy(name)) => {
                self.policies.remove(&name);
            }
            Some(Key::Leader) => self.leader = None,
            _ => {}
        }
    }

    /// What changes from `self` to `new`.
    pub fn diff(&self, new: &View) -> Changes {
        let mut c = Changes::default();
        for (labels, id) in &self.identities {
            if new.identities.get(labels) != Some(id) {
                c.unassigned.push((labels.clone(), *id));
            }
        }
        for (labels, id) in &new.identities {
            if self.identities.get(labels) != Some(id) {
                c.assigned.push((labels.clone(), *id));
            }
        }
        for key in self.endpoints.keys() {
            if !new.endpoints.contains_key(key) {
                c.endpoints_removed.push(key.clone());
            }
        }
        for (key, record) in &new.endpoints {
            if self.endpoints.get(key) != Some(record) {
                c.endpoints_upserted.push((key.clone(), record.clone()));
            }
        }
        for name in self.nodes.keys() {
            if !new.nodes.contains_key(name) {
                c.nodes_removed.push(name.clone());
            }
        }
        for (name, record) in &new.nodes {
            if self.nodes.get(name) != Some(record) {
                c.nodes_upserted.push(record.clone());
            }
        }
        if self.policies != new.policies {
            c.policies = Some(new.policies.clone());
        }
        c.leader = self.leader != new.leader;
        c
    }

    /// Reads a view written by [`View::save`] (or by a version-1 node, without the other
    /// nodes' registrations); `None` if there is no file.
    ///
    /// # Errors
    /// The file cannot be read or is not a state file of a known version.
    pub fn load(path: &Path) -> Result<Option<Self>, Error> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(Error::State {
                    op: "reading",
                    path: path.to_path_buf(),
                    error,
                });
            }
        };
        let format = |reason: &str| Error::StateFormat {
            path: path.to_path_buf(),
            reason: reason.to_owned(),
        };
        if let Some(body) = bytes.strip_prefix(MAGIC_V1.as_slice()) {
            return postcard::from_bytes::<ViewV1>(body)
                .map(|v| Some(v.into()))
                .map_err(|e| format(&e.to_string()));
        }
        let body = bytes
            .strip_prefix(MAGIC.as_slice())
            .ok_or_else(|| format("no header"))?;
        postcard::from_bytes(body)
            .map(Some)
            .map_err(|e| format(&e.to_string()))
    }

    /// Writes the view to `path` atomically (a temporary file, synced, then renamed), mode
    /// 0600.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        write_state(path, &self.encode(path)?)
    }

    /// The bytes [`View::save`] writes (`path` names the file in errors).
    ///
    /// # Errors
    /// The view cannot be encoded.
    pub fn encode(&self, path: &Path) -> Result<Vec<u8>, Error> {
        postcard::to_extend(self, MAGIC.to_vec()).map_err(|e| Error::State {
            op: "encoding",
            path: path.to_path_buf(),
            error: std::io::Error::other(e.to_string()),
        })
    }
}

/// The most addresses one endpoint or node record may carry.
pub const MAX_RECORD_ADDRESSES: usize = 256;

/// A value of the layout, decoded; why not, if it does not decode.
fn decode<T: serde::de::DeserializeOwned>(value: &[u8]) -> Result<T, String> {
    serde_json::from_slice(value).map_err(|e| format!("the value does not parse: {e}"))
}

/// The label set an `identities/id/<n>` value names, if it parses and names `n`.
fn decode_identity(kv: &Kv, n: u32) -> Option<Labels> {
    decode::<IdentityRecord>(&kv.value)
        .ok()
        .filter(|r| r.id == n)
        .map(|r| r.labels)
}

/// Whether the addresses of an endpoint or node record can be a workload's or a node's: at
/// most [`MAX_RECORD_ADDRESSES`], none unspecified, loopback, multicast or broadcast.
fn check_addresses(ips: &[IpAddr]) -> Result<(), String> {
    if ips.len() > MAX_RECORD_ADDRESSES {
        return Err(format!(
            "{} addresses (at most {MAX_RECORD_ADDRESSES})",
            ips.len()
        ));
    }
    let bad = |ip: &IpAddr| {
        ip.is_unspecified()
            || ip.is_loopback()
            || ip.is_multicast()
            || matches!(ip, IpAddr::V4(v4) if v4.is_broadcast())
    };
    match ips.iter().find(|ip| bad(ip)) {
        Some(ip) => Err(format!("{ip} cannot be a workload's or a node's address")),
        None => Ok(()),
    }
}

/// Writes `bytes` (from [`View::encode`]) to `path` atomically: a temporary file, synced, then
/// renamed; mode 0600.
///
/// # Errors
/// The file cannot be written.
pub(crate) fn write_state(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let state = |op, error| Error::State {
        op,
        path: path.to_path_buf(),
        error,
    };
    let tmp = path.with_extension("tmp");
    let mut file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| state("creating", e))?
    };
    file.write_all(bytes).map_err(|e| state("writing", e))?;
    file.sync_all().map_err(|e| state("syncing", e))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(|e| state("renaming", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::Label;

    fn labels(app: &str) -> Labels {
        Labels::from(vec![Label {
            source: "k8s".into(),
            key: "app".into(),
            value: app.into(),
        }])
    }

    impl View {
        /// `apply`, with rejections that are not looked at.
        fn apply_counting(
            &mut self,
            layout: &Layout,
            node: &str,
            events: &[Event],
        ) -> (Changes, Vec<(String, bool)>) {
            self.apply(layout, node, events, &mut Rejections::default())
        }
    }

    fn kv(key: String, value: Vec<u8>, rev: Revision) -> Kv {
        Kv {
            key,
            value,
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            lease: 0,
        }
    }

    #[test]
    fn own_endpoints_stay_apart_and_a_renumbering_is_unassign_then_assign() {
        let l = Layout::new("/c");
        let id = |n: u32, a: &str| {
            kv(
                l.identity_by_labels(&labels(a)),
                serde_json::to_vec(&IdentityRecord {
                    id: n,
                    labels: labels(a),
                })
                .unwrap(),
                n.into(),
            )
        };
        // The number's own key, naming the label set back.
        let num = |n: u32, a: &str| {
            kv(
                l.identity_by_id(n),
                serde_json::to_vec(&IdentityRecord {
                    id: n,
                    labels: labels(a),
                })
                .unwrap(),
                n.into(),
            )
        };
        let ep = |node: &str| {
            let record = EndpointRecord {
                node: node.into(),
                id: 1,
                name: "x".into(),
                labels: labels("web"),
                ips: vec!["10.0.0.1".parse().unwrap()],
                identity: None,
            };
            kv(
                l.endpoint(&labels("web"), node, 1),
                serde_json::to_vec(&record).unwrap(),
                9,
            )
        };
        let snapshot = Snapshot {
            kvs: vec![num(300, "web"), id(300, "web"), ep("a"), ep("b")],
            revision: 10,
        };
        let (mut view, own) = View::from_snapshot(&l, "a", &snapshot, &mut Rejections::default());
        assert_eq!(own.len(), 1);
        assert_eq!(view.endpoints.len(), 1);
        let (changes, own) = view.apply_counting(
            &l,
            "a",
            &[
                Event::Delete {
                    key: l.identity_by_id(300),
                    revision: 11,
                },
                Event::Put(num(301, "web")),
                Event::Put(id(301, "web")),
                Event::Delete {
                    key: l.endpoint(&labels("web"), "a", 1),
                    revision: 12,
                },
            ],
        );
        assert_eq!(changes.unassigned, vec![(labels("web"), 300)]);
        assert_eq!(changes.assigned, vec![(labels("web"), 301)]);
        assert_eq!(own, vec![(l.endpoint(&labels("web"), "a", 1), false)]);
        // Within one batch, created then deleted is no change; applied elsewhere, the changes
        // give the same view.
        let mut mirror = view.clone();
        let (changes, _) = view.apply_counting(
            &l,
            "a",
            &[
                Event::Put(ep("b2")),
                Event::Delete {
                    key: l.endpoint(&labels("web"), "b2", 1),
                    revision: 14,
                },
                Event::Put(num(302, "db")),
                Event::Put(id(302, "db")),
            ],
        );
        assert!(changes.endpoints_upserted.is_empty() && changes.endpoints_removed.is_empty());
        assert_eq!(changes.assigned, vec![(labels("db"), 302)]);
        mirror.absorb(&changes);
        assert_eq!(mirror.identities, view.identities);
        assert_eq!(mirror.endpoints, view.endpoints);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.state");
        assert_eq!(View::load(&path).unwrap(), None);
        view.save(&path).unwrap();
        assert_eq!(View::load(&path).unwrap(), Some(view));
        std::fs::write(&path, b"garbage").unwrap();
        assert!(matches!(View::load(&path), Err(Error::StateFormat { .. })));
    }

    /// A label without a value (`k8s:canary`) survives the state file: the compact encoding
    /// has no field names, so no field may be left out of it.
    #[test]
    fn a_label_without_a_value_is_saved_and_read_back() {
        let bare = Labels::from(vec![
            Label {
                source: "k8s".into(),
                key: "canary".into(),
                value: String::new(),
            },
            Label {
                source: "k8s".into(),
                key: "app".into(),
                value: "web".into(),
            },
        ]);
        let mut view = View::default();
        view.identities.insert(bare.clone(), 300);
        view.identities.insert(labels("db"), 301);
        view.endpoints.insert(
            "/c/endpoints/x/b/1".into(),
            EndpointRecord {
                node: "b".into(),
                id: 1,
                name: "x".into(),
                labels: bare,
                ips: vec!["10.0.0.1".parse().unwrap()],
                identity: Some(300),
            },
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.state");
        view.save(&path).unwrap();
        assert_eq!(View::load(&path).unwrap(), Some(view));
    }

    /// Other nodes' registrations are in the view (not this node's own: it is returned apart
    /// with its endpoints), their changes and removal come out as changes.
    #[test]
    fn registrations_of_other_nodes_are_in_the_view_and_this_nodes_apart() {
        let l = Layout::new("/c");
        let reg = |node: &str, ip: &str, rev: Revision| {
            kv(
                l.node(node),
                serde_json::to_vec(&NodeRecord {
                    node: node.into(),
                    ips: vec![ip.parse().unwrap()],
                })
                .unwrap(),
                rev,
            )
        };
        let snapshot = Snapshot {
            kvs: vec![reg("a", "192.0.2.1", 3), reg("b", "192.0.2.2", 4)],
            revision: 5,
        };
        let (mut view, own) = View::from_snapshot(&l, "a", &snapshot, &mut Rejections::default());
        assert_eq!(own.keys().collect::<Vec<_>>(), vec![&l.node("a")]);
        assert_eq!(view.nodes.keys().collect::<Vec<_>>(), vec!["b"]);
        let mut mirror = view.clone();
        let (changes, own) = view.apply_counting(
            &l,
            "a",
            &[
                Event::Put(reg("b", "192.0.2.3", 6)),
                Event::Put(reg("c", "192.0.2.4", 7)),
                Event::Delete {
                    key: l.node("a"),
                    revision: 8,
                },
            ],
        );
        assert_eq!(own, vec![(l.node("a"), false)]);
        assert_eq!(
            changes
                .nodes_upserted
                .iter()
                .map(|r| r.node.as_str())
                .collect::<Vec<_>>(),
            vec!["b", "c"]
        );
        mirror.absorb(&changes);
        assert_eq!(mirror.nodes, view.nodes);
        // A registration whose key and value disagree is ignored.
        let mut forged = reg("d", "192.0.2.5", 9);
        forged.key = l.node("e");
        let (changes, _) = view.apply_counting(
            &l,
            "a",
            &[
                Event::Put(forged),
                Event::Delete {
                    key: l.node("b"),
                    revision: 10,
                },
            ],
        );
        assert_eq!(changes.nodes_removed, vec!["b".to_owned()]);
        assert!(changes.nodes_upserted.is_empty());
        assert_eq!(View::default().diff(&view).nodes_upserted.len(), 1);
    }

    /// A state file of version 1 (before registrations) still reads, without nodes.
    #[test]
    fn a_version_1_state_file_still_reads() {
        #[derive(Serialize)]
        struct V1<'a> {
            revision: Revision,
            identities: &'a BTreeMap<Labels, u32>,
            endpoints: &'a BTreeMap<String, EndpointRecord>,
            policies: &'a BTreeMap<String, String>,
            leader: Option<String>,
        }
        let mut view = View {
            revision: 42,
            leader: Some("op".into()),
            ..View::default()
        };
        view.identities.insert(labels("web"), 300);
        view.policies.insert("p".into(), "text".into());
        let bytes = postcard::to_extend(
            &V1 {
                revision: view.revision,
                identities: &view.identities,
                endpoints: &view.endpoints,
                policies: &view.policies,
                leader: view.leader.clone(),
            },
            MAGIC_V1.to_vec(),
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.state");
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(View::load(&path).unwrap(), Some(view.clone()));
        // Written again, it is version 2, with the nodes.
        view.nodes.insert(
            "b".into(),
            NodeRecord {
                node: "b".into(),
                ips: vec!["192.0.2.1".parse().unwrap()],
            },
        );
        view.save(&path).unwrap();
        assert!(std::fs::read(&path).unwrap().starts_with(MAGIC));
        assert_eq!(View::load(&path).unwrap(), Some(view));
    }

    /// Every record is checked alone: an identity is applied only when both its keys parse,
    /// are in range and name each other; an endpoint or registration only when its value is
    /// its key's; anything else is refused and counted by kind, and the rest still applies.
    #[test]
    fn each_record_is_validated_alone_and_refusals_are_counted() {
        let l = Layout::new("/c");
        let record = |n: u32, a: &str| {
            serde_json::to_vec(&IdentityRecord {
                id: n,
                labels: labels(a),
            })
            .unwrap()
        };
        let endpoint = |node: &str, ip: &str| EndpointRecord {
            node: node.into(),
            id: 1,
            name: "x".into(),
            labels: labels("web"),
            ips: vec![ip.parse().unwrap()],
            identity: None,
        };
        let ep_kv = |node: &str, r: &EndpointRecord| {
            kv(
                l.endpoint(&labels("web"), node, 1),
                serde_json::to_vec(r).unwrap(),
                9,
            )
        };
        let snapshot = Snapshot {
            kvs: vec![
                // web: both keys agree.
                kv(l.identity_by_id(300), record(300, "web"), 2),
                kv(l.identity_by_labels(&labels("web")), record(300, "web"), 2),
                // db: its labels key names a number outside the range.
                kv(l.identity_by_labels(&labels("db")), record(70_000, "db"), 3),
                // evil: its labels key names web's number (a forged record).
                kv(
                    l.identity_by_labels(&labels("evil")),
                    record(300, "evil"),
                    4,
                ),
                // api: its number's key does not parse.
                kv(l.identity_by_id(301), b"\xff\x00garbage".to_vec(), 5),
                kv(l.identity_by_labels(&labels("api")), record(301, "api"), 5),
                ep_kv("b", &endpoint("b", "10.0.0.2")),
                ep_kv("c", &endpoint("c", "0.0.0.0")),
                ep_kv("d", &endpoint("e", "10.0.0.4")),
                kv(l.endpoint(&labels("web"), "f", 1), b"{}".to_vec(), 9),
                kv(l.node("g"), b"[1,2".to_vec(), 9),
                kv("/c/identities/id/99999".into(), record(300, "web"), 9),
                kv(l.leader(), b"no such/name".to_vec(), 9),
            ],
            revision: 10,
        };
        let mut rejected = Rejections::default();
        let (view, _) = View::from_snapshot(&l, "a", &snapshot, &mut rejected);
        assert_eq!(
            view.identities.iter().collect::<Vec<_>>(),
            vec![(&labels("web"), &300)]
        );
        assert_eq!(view.endpoints.len(), 1, "{:?}", view.endpoints);
        assert!(view.nodes.is_empty() && view.leader.is_none());
        let counts = rejected.counts();
        assert_eq!(counts[&RecordKind::Identity], 2, "{counts:?}");
        assert_eq!(counts[&RecordKind::Endpoint], 3, "{counts:?}");
        assert_eq!(counts[&RecordKind::Node], 1);
        assert_eq!(counts[&RecordKind::Key], 1);
        assert_eq!(counts[&RecordKind::Operator], 1);
        // The same snapshot read again (a resync) counts nothing new.
        let _ = View::from_snapshot(&l, "a", &snapshot, &mut rejected);
        assert_eq!(rejected.total(), 8);
        // api's number key repaired: api is applied; web's number key overwritten with
        // another label set: web loses its number (and evil never gets it).
        let mut view = view;
        let (changes, _) = view.apply(
            &l,
            "a",
            &[
                Event::Put(kv(l.identity_by_id(301), record(301, "api"), 11)),
                Event::Put(kv(l.identity_by_id(300), record(300, "other"), 12)),
            ],
            &mut rejected,
        );
        assert_eq!(changes.assigned, vec![(labels("api"), 301)]);
        assert_eq!(changes.unassigned, vec![(labels("web"), 300)]);
        assert_eq!(
            view.identities.iter().collect::<Vec<_>>(),
            vec![(&labels("api"), &301)]
        );
    }
}
