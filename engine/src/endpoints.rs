//! Node mode's endpoint registry: the endpoints of the configuration files and those added at
//! run time through the admin API (as a CNI plugin would add them), and the rules that keep
//! two endpoints from claiming one id, name, interface, cgroup or address.
//!
//! An endpoint is attached to the host one of two ways ([`Attachment`]): the host-side
//! interface of a workload with its own network namespace, or the cgroup of host processes
//! (a systemd unit's, or any cgroup v2 directory), whose sockets the node's cgroup programs
//! follow.
//!
//! The files win: an id they declare cannot be added or removed through the API. An endpoint
//! added through the API keeps the `Endpoint` document it came as, so it can be saved and
//! read back after a restart ([`Registry::saved`], [`Registry::parse_saved`]).
//!
//! Containers' attachments (CNI) are endpoints of the API, one per attachment: see
//! [`containers`].

pub mod containers;

use std::collections::BTreeMap;
use std::path::Path;

use fqdnd_config::{Cgroup, Config};
use fqdnd_ipcache::{Endpoint, EndpointId};

use crate::Error;

/// How an endpoint's traffic reaches the node's datapath.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Attachment {
    /// Its host-side interface (a workload in its own network namespace).
    Interface(String),
    /// The cgroup of its host processes.
    Cgroup(Cgroup),
}

impl std::fmt::Display for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Interface(i) => write!(f, "interface {i}"),
            Self::Cgroup(c) => c.fmt(f),
        }
    }
}

impl Attachment {
    /// The attachment `config` gives endpoint `id`, if any.
    pub fn of(config: &Config, id: EndpointId) -> Option<Self> {
        if let Some(i) = config.interfaces.get(&id) {
            return Some(Self::Interface(i.clone()));
        }
        config.cgroups.get(&id).cloned().map(Self::Cgroup)
    }
}

/// An endpoint added through the admin API.
#[derive(Debug, Clone, PartialEq)]
pub struct Added {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// Its interface or cgroup.
    pub attachment: Attachment,
    /// The `Endpoint` document as received (what is saved for restarts).
    pub document: String,
}

impl Added {
    /// Parses one `kind: Endpoint` document (an admin API request body, or a saved one).
    ///
    /// # Errors
    /// The document does not load, is not exactly one `Endpoint`, or has neither an interface
    /// nor a cgroup.
    pub fn parse(document: &str) -> Result<Self, Error> {
        let parsed = fqdnd_config::load_str(document, Path::new("<request>"))
            .map_err(|errors| Error::EndpointDocument { errors })?;
        let [endpoint] = parsed.endpoints.as_slice() else {
            return Err(Error::EndpointCount {
                found: parsed.endpoints.len(),
            });
        };
        let Some(attachment) = Attachment::of(&parsed, endpoint.id) else {
            return Err(Error::NoInterface {
                name: endpoint.name.clone(),
            });
        };
        Ok(Self {
            endpoint: endpoint.clone(),
            attachment,
            document: document.trim().to_owned(),
        })
    }
}

/// The `Endpoint` document of an endpoint given field by field (what `fqdnd endpoint add` and
/// the CNI plugin send): every value a YAML double-quoted scalar, so no name, interface,
/// cgroup or label can change the document's structure. An endpoint of host processes gets
/// no `addresses`.
pub fn document(
    name: &str,
    id: EndpointId,
    attachment: &Attachment,
    addresses: &[std::net::IpAddr],
    labels: &[(String, String)],
) -> String {
    let addresses: Vec<String> = addresses.iter().map(|a| quoted(&a.to_string())).collect();
    let attached = match attachment {
        Attachment::Interface(i) => format!(
            "  interface: {}\n  addresses: [{}]\n",
            quoted(i),
            addresses.join(", ")
        ),
        Attachment::Cgroup(Cgroup::Path(p)) => format!("  cgroup: {}\n", quoted(p)),
        Attachment::Cgroup(Cgroup::Unit(u)) => format!("  unit: {}\n", quoted(u)),
    };
    let mut doc = format!(
        "apiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata:\n  name: {}\nspec:\n  id: {}\n{attached}",
        quoted(name),
        id.0,
    );
    if !labels.is_empty() {
        doc.push_str("  labels:\n");
        for (key, value) in labels {
            doc.push_str(&format!("    {}: {}\n", quoted(key), quoted(value)));
        }
    }
    doc
}

/// `text` as a YAML double-quoted scalar.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Where an endpoint was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// In the configuration files.
    Config,
    /// Through the admin API.
    Api,
}

impl Source {
    /// `config` or `api`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::Api => "api",
        }
    }
}

/// The endpoints of the files and of the API.
#[derive(Debug, Clone)]
pub struct Registry {
    /// The configuration files as last loaded without error.
    files: Config,
    /// Endpoints added through the admin API.
    added: BTreeMap<EndpointId, Added>,
}

impl Registry {
    /// A registry of the files' endpoints.
    pub fn new(files: Config) -> Self {
        Self {
            files,
            added: BTreeMap::new(),
        }
    }

    /// The configuration files in force.
    pub fn files(&self) -> &Config {
        &self.files
    }

    /// Replaces the files' configuration; returns the previous one (to put back if applying
    /// the new one fails).
    pub fn replace_files(&mut self, files: Config) -> Config {
        std::mem::replace(&mut self.files, files)
    }

    /// The files' configuration with the endpoints added at run time.
    pub fn merged(&self) -> Config {
        let mut config = self.files.clone();
        for added in self.added.values() {
            config.endpoints.push(added.endpoint.clone());
            match &added.attachment {
                Attachment::Interface(i) => {
                    config.interfaces.insert(added.endpoint.id, i.clone());
                }
                Attachment::Cgroup(c) => {
                    config.cgroups.insert(added.endpoint.id, c.clone());
                }
            }
        }
        config
    }

    /// Where endpoint `id` was declared, if anywhere.
    pub fn source(&self, id: EndpointId) -> Option<Source> {
        if self.added.contains_key(&id) {
            Some(Source::Api)
        } else if self.files.endpoints.iter().any(|e| e.id == id) {
            Some(Source::Config)
        } else {
            None
        }
    }

    /// Whether `new` may be added (or replace the API endpoint with its id): its id is not the
    /// files', and no other endpoint has its name, interface, cgroup or any of its addresses.
    ///
    /// # Errors
    /// The first conflict found.
    pub fn check(&self, new: &Added) -> Result<(), Error> {
        let endpoint = &new.endpoint;
        if self.files.endpoints.iter().any(|e| e.id == endpoint.id) {
            return Err(Error::DeclaredInFiles { id: endpoint.id });
        }
        let files = self
            .files
            .endpoints
            .iter()
            .map(|e| (e, Attachment::of(&self.files, e.id)));
        let api = self
            .added
            .values()
            .filter(|a| a.endpoint.id != endpoint.id)
            .map(|a| (&a.endpoint, Some(a.attachment.clone())));
        for (other, other_attachment) in files.chain(api) {
            if other.name == endpoint.name {
                return Err(Error::NameTaken {
                    name: endpoint.name.clone(),
                    owner: other.id,
                });
            }
            if other_attachment.as_ref() == Some(&new.attachment) {
                return Err(match &new.attachment {
                    Attachment::Interface(interface) => Error::InterfaceTaken {
                        interface: interface.clone(),
                        owner: other.id,
                        owner_name: other.name.clone(),
                    },
                    Attachment::Cgroup(cgroup) => Error::CgroupTaken {
                        cgroup: cgroup.clone(),
                        owner: other.id,
                        owner_name: other.name.clone(),
                    },
                });
            }
            if let Some(address) = endpoint
                .addresses
                .iter()
                .find(|a| other.addresses.contains(a))
            {
                return Err(Error::AddressTaken {
                    address: *address,
                    owner: other.id,
                    owner_name: other.name.clone(),
                });
            }
        }
        Ok(())
    }

    /// Adds `new` after [`Registry::check`]; returns the API endpoint it replaced.
    ///
    /// # Errors
    /// As [`Registry::check`]; nothing changes.
    pub fn add(&mut self, new: Added) -> Result<Option<Added>, Error> {
        self.check(&new)?;
        Ok(self.added.insert(new.endpoint.id, new))
    }

    /// Puts back what [`Registry::add`] replaced (`previous`), or removes `id` when it replaced
    /// nothing: the undo of a change that could not be applied.
    pub fn undo_add(&mut self, id: EndpointId, previous: Option<Added>) {
        match previous {
            Some(p) => self.added.insert(id, p),
            None => self.added.remove(&id),
        };
    }

    /// Removes an endpoint added through the API.
    ///
    /// # Errors
    /// `id` is declared in the files, or was never added.
    pub fn remove(&mut self, id: EndpointId) -> Result<Added, Error> {
        if let Some(removed) = self.added.remove(&id) {
            return Ok(removed);
        }
        if self.files.endpoints.iter().any(|e| e.id == id) {
            return Err(Error::DeclaredInFiles { id });
        }
        Err(Error::NoEndpoint { id })
    }

    /// The lowest endpoint id at or above `from` that no endpoint has.
    pub fn free_id(&self, from: u16) -> Option<EndpointId> {
        let used: std::collections::BTreeSet<u16> = self
            .files
            .endpoints
            .iter()
            .map(|e| e.id.0)
            .chain(self.added.keys().map(|id| id.0))
            .collect();
        (from.max(1)..=u16::MAX)
            .find(|id| !used.contains(id))
            .map(EndpointId)
    }

    /// The endpoint added through the API under `name`, if any.
    pub fn added_named(&self, name: &str) -> Option<&Added> {
        self.added.values().find(|a| a.endpoint.name == name)
    }

    /// Puts back an endpoint [`Registry::remove`] took out.
    pub fn undo_remove(&mut self, removed: Added) {
        self.added.insert(removed.endpoint.id, removed);
    }

    /// The endpoints added through the API.
    pub fn added(&self) -> impl Iterator<Item = &Added> {
        self.added.values()
    }

    /// The API endpoints as one multi-document YAML text (what is saved for restarts).
    pub fn saved(&self) -> String {
        let documents: Vec<&str> = self.added.values().map(|a| a.document.as_str()).collect();
        documents.join("\n---\n") + "\n"
    }

    /// Reads back a text written by [`Registry::saved`]: each document on its own (split by
    /// the configuration's YAML document splitter), so one that no longer loads does not keep
    /// the others out.
    pub fn parse_saved(text: &str) -> Vec<Result<Added, Error>> {
        fqdnd_config::documents(text)
            .filter(|d| !d.is_blank())
            .map(|d| Added::parse(d.text))
            .collect()
    }

    /// Adds an endpoint read back from the saved text (checked like any other).
    ///
    /// # Errors
    /// As [`Registry::check`].
    pub fn restore(&mut self, added: Added) -> Result<(), Error> {
        self.add(added).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILES: &str = r#"
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: web}
spec: {id: 100, interface: veth-web, addresses: ["10.0.0.1/32"], labels: {app: web}}
"#;

    fn registry() -> Registry {
        Registry::new(fqdnd_config::load_str(FILES, Path::new("files.yaml")).unwrap())
    }

    fn doc(id: u16, name: &str, interface: &str, address: &str) -> Added {
        Added::parse(&format!(
            "apiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata: {{name: {name}}}\n\
             spec: {{id: {id}, interface: {interface}, addresses: [\"{address}\"], labels: {{app: {name}}}}}\n"
        ))
        .unwrap()
    }

    #[test]
    fn an_endpoint_with_its_own_id_name_interface_and_address_is_added() {
        let mut r = registry();
        assert_eq!(
            r.add(doc(101, "db", "veth-db", "10.0.0.2/32")).unwrap(),
            None
        );
        assert_eq!(r.source(EndpointId(101)), Some(Source::Api));
        assert_eq!(r.source(EndpointId(100)), Some(Source::Config));
        assert_eq!(r.merged().endpoints.len(), 2);
        assert_eq!(r.merged().interfaces[&EndpointId(101)], "veth-db");
        // A cgroup endpoint: no addresses, its cgroup in the merged configuration.
        let runner = Added::parse(&document(
            "runner",
            EndpointId(102),
            &Attachment::Cgroup(Cgroup::Path("/ci/runner".into())),
            &[],
            &[("app".into(), "ci".into())],
        ))
        .unwrap();
        assert!(runner.endpoint.addresses.is_empty());
        r.add(runner).unwrap();
        assert_eq!(
            r.merged().cgroups[&EndpointId(102)],
            Cgroup::Path("/ci/runner".into())
        );
        assert!(!r.merged().interfaces.contains_key(&EndpointId(102)));
    }

    #[test]
    fn an_id_of_the_files_cannot_be_added_or_removed() {
        let mut r = registry();
        assert!(matches!(
            r.add(doc(100, "other", "veth-x", "10.0.0.9/32")),
            Err(Error::DeclaredInFiles {
                id: EndpointId(100)
            })
        ));
        assert!(matches!(
            r.remove(EndpointId(100)),
            Err(Error::DeclaredInFiles {
                id: EndpointId(100)
            })
        ));
        assert!(matches!(
            r.remove(EndpointId(7)),
            Err(Error::NoEndpoint { id: EndpointId(7) })
        ));
    }

    #[test]
    fn a_name_interface_or_address_of_another_endpoint_is_refused() {
        let mut r = registry();
        r.add(doc(101, "db", "veth-db", "10.0.0.2/32")).unwrap();
        let name = r.add(doc(102, "web", "veth-x", "10.0.0.3/32"));
        assert!(
            matches!(name, Err(Error::NameTaken { ref name, owner: EndpointId(100) }) if name == "web")
        );
        let api_name = r.add(doc(102, "db", "veth-x", "10.0.0.3/32"));
        assert!(matches!(
            api_name,
            Err(Error::NameTaken {
                owner: EndpointId(101),
                ..
            })
        ));
        let interface = r.add(doc(102, "cache", "veth-web", "10.0.0.3/32"));
        assert!(
            matches!(interface, Err(Error::InterfaceTaken { ref interface, owner: EndpointId(100), .. }) if interface == "veth-web")
        );
        let address = r.add(doc(102, "cache", "veth-cache", "10.0.0.2/32"));
        assert!(matches!(
            address,
            Err(Error::AddressTaken {
                owner: EndpointId(101),
                ..
            })
        ));
        assert_eq!(r.added().count(), 1, "a refused endpoint changes nothing");
        // Two endpoints of one cgroup (or unit): refused; another cgroup is fine.
        let unit = |id, name: &str, unit: &str| {
            Added::parse(&document(
                name,
                EndpointId(id),
                &Attachment::Cgroup(Cgroup::Unit(unit.into())),
                &[],
                &[],
            ))
            .unwrap()
        };
        r.add(unit(110, "web-unit", "web.service")).unwrap();
        assert!(matches!(
            r.add(unit(111, "web-again", "web.service")),
            Err(Error::CgroupTaken {
                owner: EndpointId(110),
                ..
            })
        ));
        r.add(unit(111, "db-unit", "db.service")).unwrap();
    }

    #[test]
    fn an_api_endpoint_may_be_replaced_under_its_id_and_the_change_undone() {
        let mut r = registry();
        let first = doc(101, "db", "veth-db", "10.0.0.2/32");
        r.add(first.clone()).unwrap();
        // Same id: its own name, interface and address are not conflicts.
        let previous = r.add(doc(101, "db", "veth-db", "10.0.0.2/32")).unwrap();
        assert_eq!(previous.as_ref(), Some(&first));
        r.undo_add(EndpointId(101), previous);
        assert_eq!(r.added().next(), Some(&first));
        let removed = r.remove(EndpointId(101)).unwrap();
        assert_eq!(r.added().count(), 0);
        r.undo_remove(removed);
        assert_eq!(r.added().count(), 1);
    }

    #[test]
    fn documents_without_one_endpoint_or_an_interface_are_refused() {
        assert!(matches!(
            Added::parse(FILES.replace("interface: veth-web, ", "").as_str()),
            Err(Error::NoInterface { .. })
        ));
        let two = format!(
            "{FILES}---\n{}",
            FILES
                .replace("100", "101")
                .replace("web", "db")
                .replace("0.1/", "0.2/")
        );
        assert!(matches!(
            Added::parse(&two),
            Err(Error::EndpointCount { found: 2 })
        ));
        assert!(matches!(
            Added::parse("kind: [oops"),
            Err(Error::EndpointDocument { .. })
        ));
    }

    #[test]
    fn a_document_built_from_fields_loads_whatever_the_text_in_them() {
        let labels = vec![
            ("app".to_owned(), "we\"b: {x}".to_owned()),
            ("cni:name".to_owned(), "a\\b".to_owned()),
        ];
        let text = document(
            "c-1\"]",
            EndpointId(40000),
            &Attachment::Interface("veth1".into()),
            &["10.0.0.9".parse().unwrap(), "fd00::9".parse().unwrap()],
            &labels,
        );
        let added = Added::parse(&text).unwrap();
        assert_eq!(added.endpoint.name, "c-1\"]");
        assert_eq!(added.endpoint.id, EndpointId(40000));
        assert_eq!(added.attachment, Attachment::Interface("veth1".into()));
        assert_eq!(added.endpoint.addresses.len(), 2);
        let value = |key: &str| {
            added
                .endpoint
                .labels
                .iter()
                .find(|l| l.key == key)
                .map(|l| (l.source.clone(), l.value.clone()))
        };
        assert_eq!(
            value("app"),
            Some(("k8s".to_owned(), "we\"b: {x}".to_owned()))
        );
        assert_eq!(value("name"), Some(("cni".to_owned(), "a\\b".to_owned())));
        // A control character stays a control character: the loader refuses it.
        let newline = vec![("app".to_owned(), "a\nb".to_owned())];
        let text = document(
            "x",
            EndpointId(1),
            &Attachment::Interface("veth1".into()),
            &[],
            &newline,
        );
        assert!(matches!(
            Added::parse(&text),
            Err(Error::EndpointDocument { .. })
        ));
    }

    #[test]
    fn free_ids_skip_every_endpoints_ids() {
        let mut r = registry();
        assert_eq!(r.free_id(100), Some(EndpointId(101)));
        r.add(doc(101, "db", "veth-db", "10.0.0.2/32")).unwrap();
        assert_eq!(r.free_id(100), Some(EndpointId(102)));
        assert_eq!(r.free_id(0), Some(EndpointId(1)));
        assert_eq!(
            r.added_named("db").map(|a| a.endpoint.id),
            Some(EndpointId(101))
        );
    }

    #[test]
    fn the_saved_text_reads_back_document_by_document() {
        let mut r = registry();
        r.add(doc(101, "db", "veth-db", "10.0.0.2/32")).unwrap();
        r.add(doc(102, "cache", "veth-cache", "10.0.0.3/32"))
            .unwrap();
        let mut text = r.saved();
        // A document with a `---` inside a block scalar stays whole.
        text.push_str("---\nkind: Broken\nnote: |\n  ---\n  not a document marker\n");
        let read = Registry::parse_saved(&text);
        assert_eq!(read.len(), 3);
        assert!(read[2].is_err(), "a broken document is reported on its own");
        let mut again = registry();
        for added in read.into_iter().flatten() {
            again.restore(added).unwrap();
        }
        assert_eq!(again.merged().endpoints, r.merged().endpoints);
    }
}
