//! What a node knows of the cluster ([`View`]): the global identities, the other nodes'
//! endpoints and registrations (their own addresses), the shared policy documents and the
//! allocator leader — built from a snapshot and
//! the watch events after it, compared with an older view to say what changed ([`Changes`]),
//! and kept in the state directory so a node restarted while etcd is down starts from it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::keys::{EndpointRecord, IdentityRecord, Key, Layout, NodeRecord};
use crate::labels::Labels;
use crate::store::{Event, Kv, Revision, Snapshot};

/// The first bytes of a state file, with the format version (2: with the other nodes'
/// registrations).
const MAGIC: &[u8; 8] = b"FQDNDCL2";
/// Version 1 (before the nodes' registrations), still read.
const MAGIC_V1: &[u8; 8] = b"FQDNDCL1";

/// The cluster as one node sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
}

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
    /// registration are returned apart, not in the view).
    pub fn from_snapshot(layout: &Layout, node: &str, snapshot: &Snapshot) -> (Self, Own) {
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
            view.put(layout, node, kv);
        }
        (view, own)
    }

    /// Applies watch events; returns what changed (net over the batch: a key created and
    /// deleted in it is no change). Events about node `node`'s own keys (endpoints,
    /// registration) are returned apart: (key, still there). Costs what the batch touches, not the size of the view.
    pub fn apply(
        &mut self,
        layout: &Layout,
        node: &str,
        events: &[Event],
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
                Event::Put(kv) => self.put(layout, node, kv),
                Event::Delete { key, .. } => self.delete(layout, key),
            }
            self.revision = self.revision.max(event.revision());
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

    fn put(&mut self, layout: &Layout, node: &str, kv: &Kv) {
        match layout.parse(&kv.key) {
            Some(Key::IdentityByLabels(labels)) => {
                match serde_json::from_slice::<IdentityRecord>(&kv.value) {
                    Ok(record) if record.labels == labels => {
                        self.identities.insert(labels, record.id);
                    }
                    _ => {
                        tracing::warn!(key = %kv.key, "an identity value that does not parse is ignored");
                    }
                }
            }
            Some(Key::Endpoint {
                labels,
                node: n,
                id,
                ..
            }) if n != node => match serde_json::from_slice::<EndpointRecord>(&kv.value) {
                Ok(record) if record.labels == labels && record.node == n && record.id == id => {
                    self.endpoints.insert(kv.key.clone(), record);
                }
                _ => {
                    tracing::warn!(key = %kv.key, "an endpoint value that does not match its key is ignored");
                }
            },
            Some(Key::Node(n)) if n != node => {
                match serde_json::from_slice::<NodeRecord>(&kv.value) {
                    Ok(record) if record.node == n => {
                        self.nodes.insert(n, record);
                    }
                    _ => {
                        tracing::warn!(key = %kv.key, "a node registration that does not match its key is ignored");
                    }
                }
            }
            Some(Key::Policy(name)) => match String::from_utf8(kv.value.clone()) {
                Ok(text) => {
                    self.policies.insert(name, text);
                }
                Err(_) => tracing::warn!(key = %kv.key, "a policy that is not UTF-8 is ignored"),
            },
            Some(Key::Leader) => {
                self.leader = Some(String::from_utf8_lossy(&kv.value).into_owned());
            }
            _ => {}
        }
    }

    fn delete(&mut self, layout: &Layout, key: &str) {
        match layout.parse(key) {
            Some(Key::IdentityByLabels(labels)) => {
                self.identities.remove(&labels);
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
            Err(source) => {
                return Err(Error::State {
                    op: "reading",
                    path: path.to_path_buf(),
                    source,
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
            source: std::io::Error::other(e.to_string()),
        })
    }
}

/// Writes `bytes` (from [`View::encode`]) to `path` atomically: a temporary file, synced, then
/// renamed; mode 0600.
///
/// # Errors
/// The file cannot be written.
pub(crate) fn write_state(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let state = |op, source| Error::State {
        op,
        path: path.to_path_buf(),
        source,
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
            kvs: vec![id(300, "web"), ep("a"), ep("b")],
            revision: 10,
        };
        let (mut view, own) = View::from_snapshot(&l, "a", &snapshot);
        assert_eq!(own.len(), 1);
        assert_eq!(view.endpoints.len(), 1);
        let (changes, own) = view.apply(
            &l,
            "a",
            &[
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
        let (changes, _) = view.apply(
            &l,
            "a",
            &[
                Event::Put(ep("b2")),
                Event::Delete {
                    key: l.endpoint(&labels("web"), "b2", 1),
                    revision: 14,
                },
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
        let (mut view, own) = View::from_snapshot(&l, "a", &snapshot);
        assert_eq!(own.keys().collect::<Vec<_>>(), vec![&l.node("a")]);
        assert_eq!(view.nodes.keys().collect::<Vec<_>>(), vec!["b"]);
        let mut mirror = view.clone();
        let (changes, own) = view.apply(
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
        let (changes, _) = view.apply(
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
}
