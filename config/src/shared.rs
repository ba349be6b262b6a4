//! Shared policy: the CiliumNetworkPolicy documents `fqdnd policy apply` stores in the cluster,
//! one key per policy ([`shared_policies`]), each read back and loaded on its own by every node
//! ([`shared_rules`]).

use std::path::Path;

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

/// The rules of the shared policy documents as a node reads them back: `(origin, text)` for
/// each (the origin — say, the key it is stored under — locates its errors). Each document is
/// loaded on its own, as [`shared_policies`] checks it at `apply`: a document that does not
/// load, or is not a policy, is refused.
///
/// # Errors
/// Every document's errors; then no rule is returned, so a node never applies half a change.
pub fn shared_rules<'a>(
    documents: impl IntoIterator<Item = (&'a Path, &'a str)>,
) -> Result<Vec<Rule>, Errors> {
    let mut rules = Vec::new();
    let mut errors = Vec::new();
    for (origin, text) in documents {
        match split(text, origin) {
            Ok((config, _)) => rules.extend(config.rules),
            Err(e) => errors.extend(e),
        }
    }
    if errors.is_empty() {
        Ok(rules)
    } else {
        Err(Errors::new(errors))
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
