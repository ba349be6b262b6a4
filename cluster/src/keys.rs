//! The etcd key layout, under one prefix (default `/fqdnd`):
//!
//! | key | value | written by | lease |
//! |---|---|---|---|
//! | `<p>/identities/id/<NNNNN>` | [`IdentityRecord`] (number and labels) | the allocator leader | none |
//! | `<p>/identities/labels/<labels>` | [`IdentityRecord`] | the allocator leader, in the same transaction | none |
//! | `<p>/endpoints/<labels>/<node>/<id>` | [`EndpointRecord`] | the node owning the endpoint | the node's |
//! | `<p>/nodes/<node>` | [`NodeRecord`] (the node's own addresses) | the node | the node's |
//! | `<p>/policies/<name>` | one CiliumNetworkPolicy document (YAML) | `fqdnd policy apply` | none |
//! | `<p>/operator/leader` | the leading allocator's name | the leader | the leader's |
//! | `<p>/operator/next` | the allocator's next-fit cursor (decimal) | the allocator leader | none |
//!
//! `<labels>` is [`Labels::key`](crate::Labels::key) (injective, no `/`), so every endpoint of
//! one label set lies under one key prefix: the allocator's GC checks in the same transaction
//! as the delete that no endpoint of the set appeared since it last looked. Identity numbers
//! are zero-padded so keys sort by number.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::labels::Labels;

/// First number of the cluster identity range.
pub const CLUSTER_MIN: u32 = 256;
/// Last number of the cluster identity range.
pub const CLUSTER_MAX: u32 = 65_535;

/// The value under both identity keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityRecord {
    /// The global identity number (256–65535).
    pub id: u32,
    /// The label set it stands for.
    pub labels: Labels,
}

/// One endpoint a node publishes: where it runs, what it is, and its global identity once
/// the allocator created one (a temporary identity never leaves its node: `None` until then).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointRecord {
    /// The node that runs it.
    pub node: String,
    /// Its id on that node.
    pub id: u16,
    /// Its name on that node (listings).
    #[serde(default)]
    pub name: String,
    /// Its labels (what `toEndpoints` selects).
    pub labels: Labels,
    /// Its addresses (host addresses; a gateway's client groups publish none).
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// Its global identity, once known to the node.
    #[serde(default)]
    pub identity: Option<u32>,
}

impl EndpointRecord {
    /// An endpoint of `node` with `labels` and no address nor identity yet.
    pub fn new(node: &str, id: u16, labels: Labels) -> Self {
        Self {
            node: node.to_owned(),
            id,
            name: String::new(),
            labels,
            ips: Vec::new(),
            identity: None,
        }
    }

    /// The value stored under its key (JSON).
    pub fn to_value(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A node's registration: its own addresses (those it gives the host identity), which the
/// other nodes give the remote-node identity. Fields added later carry `#[serde(default)]`, so
/// an older node's record still reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node's name.
    pub node: String,
    /// Its own addresses (none for a gateway).
    #[serde(default)]
    pub ips: Vec<IpAddr>,
}

/// Where everything lives under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    prefix: String,
}

/// A key of the layout, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// `identities/id/<n>`.
    IdentityById(u32),
    /// `identities/labels/<labels>`.
    IdentityByLabels(Labels),
    /// `endpoints/<labels>/<node>/<id>`.
    Endpoint {
        /// The endpoint's labels.
        labels: Labels,
        /// Its node.
        node: String,
        /// Its id on the node.
        id: u16,
    },
    /// `nodes/<node>`.
    Node(String),
    /// `policies/<name>`.
    Policy(String),
    /// `operator/leader`.
    Leader,
    /// `operator/next`.
    Cursor,
}

impl Layout {
    /// The layout under `prefix` (a trailing `/` is dropped; `/fqdnd` if empty).
    pub fn new(prefix: &str) -> Self {
        let trimmed = prefix.trim_end_matches('/');
        let prefix = if trimmed.is_empty() {
            "/fqdnd".to_owned()
        } else {
            trimmed.to_owned()
        };
        Self { prefix }
    }

    /// The prefix, without a trailing `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Everything: `<p>/`.
    pub fn root(&self) -> String {
        format!("{}/", self.prefix)
    }

    /// `<p>/identities/`.
    pub fn identities(&self) -> String {
        format!("{}/identities/", self.prefix)
    }

    /// `<p>/identities/id/<n>`.
    pub fn identity_by_id(&self, id: u32) -> String {
        format!("{}/identities/id/{id:05}", self.prefix)
    }

    /// `<p>/identities/labels/<labels>`.
    pub fn identity_by_labels(&self, labels: &Labels) -> String {
        format!("{}/identities/labels/{}", self.prefix, labels.key())
    }

    /// `<p>/endpoints/`.
    pub fn endpoints(&self) -> String {
        format!("{}/endpoints/", self.prefix)
    }

    /// `<p>/endpoints/<labels>/`: every endpoint of one label set.
    pub fn endpoints_of(&self, labels: &Labels) -> String {
        format!("{}/endpoints/{}/", self.prefix, labels.key())
    }

    /// `<p>/endpoints/<labels>/<node>/<id>`.
    pub fn endpoint(&self, labels: &Labels, node: &str, id: u16) -> String {
        format!("{}{node}/{id}", self.endpoints_of(labels))
    }

    /// `<p>/nodes/`.
    pub fn nodes(&self) -> String {
        format!("{}/nodes/", self.prefix)
    }

    /// `<p>/nodes/<node>`: the node's registration.
    pub fn node(&self, node: &str) -> String {
        format!("{}/nodes/{node}", self.prefix)
    }

    /// `<p>/policies/`.
    pub fn policies(&self) -> String {
        format!("{}/policies/", self.prefix)
    }

    /// `<p>/policies/<name>`.
    pub fn policy(&self, name: &str) -> String {
        format!("{}/policies/{name}", self.prefix)
    }

    /// `<p>/operator/leader`.
    pub fn leader(&self) -> String {
        format!("{}/operator/leader", self.prefix)
    }

    /// `<p>/operator/next`.
    pub fn cursor(&self) -> String {
        format!("{}/operator/next", self.prefix)
    }

    /// What `key` is, if it belongs to the layout.
    pub fn parse(&self, key: &str) -> Option<Key> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix('/')?;
        let (kind, rest) = rest.split_once('/')?;
        match kind {
            "identities" => {
                let (sub, rest) = rest.split_once('/')?;
                match sub {
                    "id" => {
                        let n: u32 = rest.parse().ok()?;
                        (rest.len() == 5 && (CLUSTER_MIN..=CLUSTER_MAX).contains(&n))
                            .then_some(Key::IdentityById(n))
                    }
                    "labels" => Labels::from_key(rest).map(Key::IdentityByLabels),
                    _ => None,
                }
            }
            "endpoints" => {
                let mut parts = rest.split('/');
                let (labels, node, id) = (parts.next()?, parts.next()?, parts.next()?);
                if parts.next().is_some() || !valid_name(node) {
                    return None;
                }
                Some(Key::Endpoint {
                    labels: Labels::from_key(labels)?,
                    node: node.to_owned(),
                    id: id.parse().ok()?,
                })
            }
            "nodes" => valid_name(rest).then(|| Key::Node(rest.to_owned())),
            "policies" => valid_policy_name(rest).then(|| Key::Policy(rest.to_owned())),
            "operator" => match rest {
                "leader" => Some(Key::Leader),
                "next" => Some(Key::Cursor),
                _ => None,
            },
            _ => None,
        }
    }
}

/// Whether `name` can be a node (or allocator) name: 1–63 of `A-Z a-z 0-9 . _ -`.
pub fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Whether `name` can name a shared policy: `/`-separated parts of `A-Z a-z 0-9 . _ -`
/// (e.g. `cnp/default/web`), at most 253 bytes.
pub fn valid_policy_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
        })
}

/// The first key after every key that starts with `prefix` (etcd's range end of a prefix).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: the range runs to the end of the keyspace.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::Label;

    fn web() -> Labels {
        Labels::from(vec![Label {
            source: "k8s".into(),
            key: "app".into(),
            value: "web".into(),
        }])
    }

    #[test]
    fn every_key_parses_back() {
        let l = Layout::new("/fqdnd/");
        assert_eq!(l.prefix(), "/fqdnd");
        assert_eq!(l.identity_by_id(256), "/fqdnd/identities/id/00256");
        assert_eq!(
            l.parse(&l.identity_by_id(256)),
            Some(Key::IdentityById(256))
        );
        assert_eq!(
            l.parse(&l.identity_by_labels(&web())),
            Some(Key::IdentityByLabels(web()))
        );
        assert_eq!(
            l.parse(&l.endpoint(&web(), "node-1", 7)),
            Some(Key::Endpoint {
                labels: web(),
                node: "node-1".into(),
                id: 7
            })
        );
        assert!(
            l.endpoint(&web(), "node-1", 7)
                .starts_with(&l.endpoints_of(&web()))
        );
        assert_eq!(
            l.parse(&l.policy("cnp/default/web")),
            Some(Key::Policy("cnp/default/web".into()))
        );
        assert_eq!(l.parse(&l.node("node-1")), Some(Key::Node("node-1".into())));
        assert_eq!(l.parse(&l.leader()), Some(Key::Leader));
        assert_eq!(l.parse(&l.cursor()), Some(Key::Cursor));
    }

    #[test]
    fn foreign_and_malformed_keys_are_not_the_layouts() {
        let l = Layout::new("/fqdnd");
        for key in [
            "/other/identities/id/00256",
            "/fqdndx/identities/id/00256",
            "/fqdnd/identities/id/256",
            "/fqdnd/identities/id/00255",
            "/fqdnd/identities/id/99999",
            "/fqdnd/endpoints/k8s:app=web/node-1",
            "/fqdnd/endpoints/k8s:app=web/node-1/x",
            "/fqdnd/endpoints/k8s:app=web/no de/1",
            "/fqdnd/policies/../x",
            "/fqdnd/nodes/a/b",
            "/fqdnd/nodes/",
            "/fqdnd/operator/other",
        ] {
            assert_eq!(l.parse(key), None, "{key}");
        }
    }

    #[test]
    fn the_prefix_end_is_the_first_key_after_the_prefix() {
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }
}
