//! Shared policy: the CiliumNetworkPolicy documents `fqdnd policy apply` stores in the cluster,
//! one key per policy ([`shared_policies`]), each read back and loaded on its own by every node
//! ([`SharedPolicySet`]: a document that does not load is refused alone).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fqdnd_ipcache::policy::Rule;

use serde::Deserialize;

use crate::documents::documents;
use crate::error::{Error, Errors};
use crate::load::{CILIUM_API_VERSION, load_str};

/// One policy document of a file, as the cluster stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedPolicy {
    /// Its name in the cluster: `cnp/<namespace>/<name>` (`_` without a namespace) or
    /// `ccnp/<name>`.
    pub name: String,
    /// The document's text.
    pub text: String,
    /// The 1-based line it starts on in its file.
    pub line: usize,
}

#[derive(Debug, Default, Deserialize)]
struct Header {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    metadata: Meta,
}

#[derive(Debug, Default, Deserialize)]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
}

/// The policy documents of `text` (the file `file`), each to be stored on its own. The whole
/// text must load without error, and hold nothing but CiliumNetworkPolicy and
/// CiliumClusterwideNetworkPolicy documents: endpoints, settings and daemon documents are
/// each node's own.
///
/// # Errors
/// Every load error, located; a document of another kind, located at its first line.
pub fn shared_policies(text: &str, file: &Path) -> Result<Vec<SharedPolicy>, Errors> {
    split(text, file).map(|(_, policies)| policies)
}

/// The shared policy a node has accepted, document by document.
///
/// Each stored document is loaded on its own, as [`shared_policies`] checks it at `apply`. A
/// document that does not load (or is not a policy) is refused **alone**: every other document
/// applies, and a deletion always takes effect. A refused change to a document that was
/// accepted before leaves its previous version in force, so a broken write never makes a node
/// more open than the last policy it accepted; a document refused with no earlier version is
/// simply absent.
#[derive(Debug, Clone, Default)]
pub struct SharedPolicySet {
    /// Name → the version in force.
    accepted: BTreeMap<String, Accepted>,
    /// Name → the text refused and why (kept so the same text is not loaded and reported
    /// again at every change).
    refused: BTreeMap<String, Refused>,
}

#[derive(Debug, Clone)]
struct Accepted {
    text: String,
    rules: Vec<Rule>,
}

#[derive(Debug, Clone)]
struct Refused {
    text: String,
    errors: Vec<String>,
}

/// What one [`SharedPolicySet::update`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedUpdate {
    /// Documents new or changed, now in force.
    pub applied: Vec<String>,
    /// Documents deleted from the store, no longer in force.
    pub removed: Vec<String>,
    /// Documents newly refused (a text not seen refused before), with why — each error
    /// located at the document's origin.
    pub refused: Vec<(String, Vec<String>)>,
    /// Of the refused, those whose previous version stays in force.
    pub kept_previous: Vec<String>,
}

impl SharedUpdate {
    /// Whether the rules in force changed.
    #[must_use]
    pub fn rules_changed(&self) -> bool {
        !self.applied.is_empty() || !self.removed.is_empty()
    }
}

impl SharedPolicySet {
    /// Brings the set to the documents the store now holds (`name → text`); `origin` names a
    /// document in errors and rule origins (say, `etcd:<key>`).
    pub fn update(
        &mut self,
        documents: &BTreeMap<String, String>,
        origin: impl Fn(&str) -> PathBuf,
    ) -> SharedUpdate {
        let mut update = SharedUpdate::default();
        let gone: Vec<String> = self
            .accepted
            .keys()
            .filter(|name| !documents.contains_key(*name))
            .cloned()
            .collect();
        for name in gone {
            self.accepted.remove(&name);
            update.removed.push(name);
        }
        self.refused.retain(|name, _| documents.contains_key(name));
        for (name, text) in documents {
            if self.accepted.get(name).is_some_and(|a| a.text == *text) {
                self.refused.remove(name);
                continue;
            }
            if self.refused.get(name).is_some_and(|r| r.text == *text) {
                continue;
            }
            match split(text, &origin(name)) {
                Ok((config, _)) => {
                    self.refused.remove(name);
                    self.accepted.insert(
                        name.clone(),
                        Accepted {
                            text: text.clone(),
                            rules: config.rules,
                        },
                    );
                    update.applied.push(name.clone());
                }
                Err(errors) => {
                    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
                    if self.accepted.contains_key(name) {
                        update.kept_previous.push(name.clone());
                    }
                    self.refused.insert(
                        name.clone(),
                        Refused {
                            text: text.clone(),
                            errors: errors.clone(),
                        },
                    );
                    update.refused.push((name.clone(), errors));
                }
            }
        }
        update
    }

    /// The rules in force, document by document in name order.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> + '_ {
        self.accepted.values().flat_map(|a| &a.rules)
    }

    /// The documents in force: `(name, text)`, in name order (what a node persists so that a
    /// restart keeps the versions it accepted).
    pub fn accepted(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.accepted
            .iter()
            .map(|(name, a)| (name.as_str(), a.text.as_str()))
    }

    /// How many documents are in force.
    #[must_use]
    pub fn documents(&self) -> usize {
        self.accepted.len()
    }

    /// The documents refused as the store holds them now, with why.
    pub fn refused(&self) -> impl Iterator<Item = (&str, &[String])> + '_ {
        self.refused
            .iter()
            .map(|(name, r)| (name.as_str(), r.errors.as_slice()))
    }
}

/// `text` loaded, and its documents one by one, each a policy.
fn split(text: &str, file: &Path) -> Result<(crate::Config, Vec<SharedPolicy>), Errors> {
    let config = load_str(text, file)?;
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for document in documents(text).filter(|d| !d.is_blank()) {
        let header: Header = serde_saphyr::from_str::<Option<Header>>(document.text)
            .ok()
            .flatten()
            .unwrap_or_default();
        let name = match (header.api_version.as_str(), header.kind.as_str()) {
            (CILIUM_API_VERSION, "CiliumNetworkPolicy") => format!(
                "cnp/{}/{}",
                header.metadata.namespace.as_deref().unwrap_or("_"),
                header.metadata.name
            ),
            (CILIUM_API_VERSION, "CiliumClusterwideNetworkPolicy") => {
                format!("ccnp/{}", header.metadata.name)
            }
            (_, kind) => {
                errors.push(Error::Invalid {
                    file: file.to_path_buf(),
                    line: document.first_line as u64,
                    column: 1,
                    message: format!(
                        "a `{kind}` document cannot be applied to the cluster: only \
                         CiliumNetworkPolicy and CiliumClusterwideNetworkPolicy documents are \
                         shared (endpoints, settings and daemon documents are each node's own)"
                    ),
                });
                continue;
            }
        };
        out.push(SharedPolicy {
            name,
            text: document.text.to_owned(),
            line: document.first_line,
        });
    }
    if errors.is_empty() {
        Ok((config, out))
    } else {
        Err(Errors::new(errors))
    }
}
