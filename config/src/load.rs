//! Reading files and directories, splitting them into YAML documents and dispatching each
//! document on its `apiVersion` and `kind`; then the checks across documents.
//!
//! A document's kind decides the shape of its `spec`, but YAML does not promise that `kind`
//! comes before `spec`. So each file is read in passes over the same text: a first pass reads
//! only `apiVersion` and `kind` of every document, then one pass per family of kinds present
//! (policies, endpoints, settings) reads every document with that family's shape and keeps the
//! results for that family's documents. serde-saphyr's document iterator recovers at the next
//! document after an error, the same way in every pass, so document `i` of one pass is
//! document `i` of another; a document left unread by a pass is still reported, never dropped.

use std::fs;
use std::path::{Path, PathBuf};

use fqdnd_ipcache::policy::Rule;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_saphyr::{Location, Spanned};

use crate::Config;
use crate::cnp::PolicyDoc;
use crate::convert::{self, PolicyKind};
use crate::endpoint::{self, Declared, EndpointDoc, EndpointKind};
use crate::error::{Duplicated, Error, Errors};
use crate::gateway::{self, DaemonDoc, Gateway, Node};
use crate::service::{self, DeclaredService, ServiceDoc};
use crate::settings::{self, Settings, SettingsDoc};
use crate::yaml::{Diag, Text, at, position, sanitize};

/// The `apiVersion` of Cilium's policies.
pub const CILIUM_API_VERSION: &str = "cilium.io/v2";
/// The `apiVersion` of fqdnd's own documents.
pub const FQDND_API_VERSION: &str = "fqdnd.io/v1";

/// Documents read from one file at most; past it the file is refused.
const MAX_DOCUMENTS: usize = 100_000;

/// Loads policy and configuration from files and directories, in the order given.
///
/// A directory contributes its `*.yaml`, `*.yml` and `*.json` files (not those whose name
/// starts with a dot, and not subdirectories), sorted by name. A file given by name is read
/// whatever its extension. Every file may hold any number of documents of any kind.
///
/// # Errors
/// Every problem found, in every file: unreadable paths, empty files and directories, syntax
/// errors, invalid or unsupported fields, unknown kinds, and duplicates across documents. Each
/// document is checked independently, so one bad document does not hide the next.
pub fn load(paths: &[impl AsRef<Path>]) -> Result<Config, Errors> {
    let mut loader = Loader::default();
    let mut files = Vec::new();
    for path in paths {
        expand(path.as_ref(), &mut files, &mut loader.errors);
    }
    for file in files {
        match fs::read(&file) {
            Ok(bytes) => loader.add_file(&file, &bytes),
            Err(source) => loader.errors.push(Error::Io { path: file, source }),
        }
    }
    loader.finish()
}

/// Loads policy and configuration from text; `file` names it in errors and rule origins.
///
/// # Errors
/// As [`load`], for this one text.
pub fn load_str(text: &str, file: &Path) -> Result<Config, Errors> {
    let mut loader = Loader::default();
    loader.add_file(file, text.as_bytes());
    loader.finish()
}

/// Adds `path` to `files`: itself if a file, its configuration files if a directory.
fn expand(path: &Path, files: &mut Vec<PathBuf>, errors: &mut Vec<Error>) {
    let io = |path: &Path, source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) => return errors.push(io(path, e)),
    };
    if !meta.is_dir() {
        return files.push(path.to_path_buf());
    }
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) => return errors.push(io(path, e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                errors.push(io(path, e));
                continue;
            }
        };
        let file = entry.path();
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        let wanted = file.extension().and_then(|e| e.to_str()).is_some_and(|e| {
            ["yaml", "yml", "json"]
                .iter()
                .any(|w| e.eq_ignore_ascii_case(w))
        });
        if hidden || !wanted {
            continue;
        }
        // Follows symbolic links (a Kubernetes ConfigMap volume is made of them).
        match fs::metadata(&file) {
            Ok(m) if m.is_file() => found.push(file),
            Ok(_) => {}
            Err(e) => errors.push(io(&file, e)),
        }
    }
    if found.is_empty() {
        errors.push(Error::EmptyDirectory {
            dir: path.to_path_buf(),
        });
    }
    found.sort();
    files.extend(found);
}

/// What a document is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Policy(PolicyKind),
    Endpoint(EndpointKind),
    Settings,
    Gateway,
    Node,
    Service,
}

impl Kind {
    fn of(api_version: &str, kind: &str) -> Option<Self> {
        Some(match (api_version, kind) {
            (CILIUM_API_VERSION, "CiliumNetworkPolicy") => Self::Policy(PolicyKind::Namespaced),
            (CILIUM_API_VERSION, "CiliumClusterwideNetworkPolicy") => {
                Self::Policy(PolicyKind::Clusterwide)
            }
            (FQDND_API_VERSION, "Endpoint") => Self::Endpoint(EndpointKind::Endpoint),
            (FQDND_API_VERSION, "ClientGroup") => Self::Endpoint(EndpointKind::ClientGroup),
            (FQDND_API_VERSION, "Settings") => Self::Settings,
            (FQDND_API_VERSION, "Gateway") => Self::Gateway,
            (FQDND_API_VERSION, "Node") => Self::Node,
            (FQDND_API_VERSION, "Service") => Self::Service,
            _ => return None,
        })
    }
}

/// The first pass's view of a document: its type and nothing else.
#[derive(Debug, Deserialize)]
struct Header {
    #[serde(rename = "apiVersion")]
    api_version: Option<Text>,
    kind: Option<Text>,
}

/// One document of a file, after the first pass.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// Already reported as wrong; later passes skip it.
    Reported,
    /// To be read by the pass for its kind; `read` records that it was.
    Pending {
        kind: Kind,
        at: Location,
        read: bool,
    },
}

/// Everything loaded so far, across files.
#[derive(Default)]
struct Loader {
    errors: Vec<Error>,
    sources: Vec<PathBuf>,
    /// The `Settings` document, once valid.
    settings: Option<Settings>,
    /// Where the first `Settings` document is, valid or not.
    settings_at: Option<(PathBuf, Location)>,
    /// The `Gateway` document, once valid, and where the first one is.
    gateway: Option<Gateway>,
    gateway_at: Option<(PathBuf, Location)>,
    /// The `Node` document, once valid, and where the first one is.
    node: Option<Node>,
    node_at: Option<(PathBuf, Location)>,
    endpoints: Vec<(Declared, PathBuf)>,
    services: Vec<(DeclaredService, PathBuf)>,
    policies: Vec<(PolicyKind, String, PathBuf, Location)>,
    rules: Vec<Rule>,
}

impl Loader {
    fn add_file(&mut self, file: &Path, bytes: &[u8]) {
        self.sources.push(file.to_path_buf());
        let mut diag = Diag::new(file, bytes);
        let mut slots = headers(bytes, &mut diag);
        if slots.is_empty() && diag.count() == 0 {
            self.errors.push(Error::EmptyFile {
                file: file.to_path_buf(),
            });
            return;
        }
        let is_policy: fn(Kind) -> bool = |k| matches!(k, Kind::Policy(_));
        let is_endpoint: fn(Kind) -> bool = |k| matches!(k, Kind::Endpoint(_));
        let is_settings: fn(Kind) -> bool = |k| k == Kind::Settings;
        pass::<PolicyDoc>(
            bytes,
            &mut slots,
            &mut diag,
            is_policy,
            |kind, doc, diag| {
                if let Kind::Policy(kind) = kind {
                    self.add_policy(&doc, kind, diag);
                }
            },
        );
        pass::<EndpointDoc>(
            bytes,
            &mut slots,
            &mut diag,
            is_endpoint,
            |kind, doc, diag| {
                if let Kind::Endpoint(kind) = kind {
                    self.add_endpoint(&doc, kind, diag);
                }
            },
        );
        pass::<SettingsDoc>(bytes, &mut slots, &mut diag, is_settings, |_, doc, diag| {
            self.add_settings(&doc, diag);
        });
        let is_service: fn(Kind) -> bool = |k| k == Kind::Service;
        pass::<ServiceDoc>(bytes, &mut slots, &mut diag, is_service, |_, doc, diag| {
            self.add_service(&doc, diag);
        });
        let is_daemon: fn(Kind) -> bool = |k| matches!(k, Kind::Gateway | Kind::Node);
        pass::<DaemonDoc>(
            bytes,
            &mut slots,
            &mut diag,
            is_daemon,
            |kind, doc, diag| {
                if kind == Kind::Node {
                    self.add_node(&doc, diag);
                } else {
                    self.add_gateway(&doc, diag);
                }
            },
        );
        for slot in &slots {
            if let Slot::Pending {
                at, read: false, ..
            } = slot
            {
                diag.invalid(
                    *at,
                    "this document could not be read (after an error in an earlier document)",
                );
            }
        }
        let mut errors = diag.into_errors();
        errors.sort_by_key(Error::position);
        self.errors.extend(errors);
    }

    fn add_policy(&mut self, doc: &Spanned<PolicyDoc>, kind: PolicyKind, diag: &mut Diag<'_>) {
        let Some(policy) = convert::policy(doc, kind, diag) else {
            return;
        };
        let file = diag.file();
        if let Some((_, _, first_file, first_at)) = self
            .policies
            .iter()
            .find(|(k, name, ..)| *k == kind && *name == policy.name)
        {
            let item = Duplicated::Policy {
                kind: kind.name(),
                name: policy.name,
            };
            diag.push(duplicate(item, file, policy.name_at, first_file, *first_at));
            return;
        }
        self.policies
            .push((kind, policy.name, file.to_path_buf(), policy.name_at));
        self.rules.extend(policy.rules);
    }

    fn add_endpoint(
        &mut self,
        doc: &Spanned<EndpointDoc>,
        kind: EndpointKind,
        diag: &mut Diag<'_>,
    ) {
        let Some(new) = endpoint::endpoint(doc, kind, diag) else {
            return;
        };
        let file = diag.file();
        let before = diag.count();
        for (old, old_file) in &self.endpoints {
            if old.endpoint.id == new.endpoint.id {
                let item = Duplicated::EndpointId(new.endpoint.id.0);
                diag.push(duplicate(item, file, new.id_at, old_file, old.id_at));
            }
            if let (Some(a), Some(b)) = (&old.interface, &new.interface)
                && a == b
            {
                let item = Duplicated::Interface(a.clone());
                diag.push(duplicate(item, file, new.name_at, old_file, old.name_at));
            }
            if old.endpoint.name == new.endpoint.name {
                let item = Duplicated::EndpointName(new.endpoint.name.clone());
                diag.push(duplicate(item, file, new.name_at, old_file, old.name_at));
            }
            for (net, net_at) in new.endpoint.addresses.iter().zip(&new.address_at) {
                if let Some(i) = old.endpoint.addresses.iter().position(|a| a == net) {
                    let first_at = old.address_at.get(i).copied().unwrap_or(old.id_at);
                    diag.push(duplicate(
                        Duplicated::Address(*net),
                        file,
                        *net_at,
                        old_file,
                        first_at,
                    ));
                }
            }
        }
        if diag.count() == before {
            self.endpoints.push((new, file.to_path_buf()));
        }
    }

    fn add_settings(&mut self, doc: &Spanned<SettingsDoc>, diag: &mut Diag<'_>) {
        let file = diag.file();
        if let Some((first_file, first_at)) = &self.settings_at {
            diag.push(duplicate(
                Duplicated::Settings,
                file,
                at(doc),
                first_file,
                *first_at,
            ));
            return;
        }
        self.settings_at = Some((file.to_path_buf(), at(doc)));
        self.settings = settings::settings(&doc.value, diag);
    }

    fn add_service(&mut self, doc: &Spanned<ServiceDoc>, diag: &mut Diag<'_>) {
        let Some(new) = service::service(doc, diag) else {
            return;
        };
        let file = diag.file();
        for (old, old_file) in &self.services {
            let (item, at_new, at_old) = if old.service.name == new.service.name {
                (
                    Duplicated::ServiceName(new.service.name.clone()),
                    new.name_at,
                    old.name_at,
                )
            } else if old.service.key == new.service.key {
                (
                    Duplicated::ServiceFrontend(new.service.key.to_string()),
                    new.frontend_at,
                    old.frontend_at,
                )
            } else {
                continue;
            };
            diag.push(duplicate(item, file, at_new, old_file, at_old));
            return;
        }
        self.services.push((new, file.to_path_buf()));
    }

    fn add_node(&mut self, doc: &Spanned<DaemonDoc>, diag: &mut Diag<'_>) {
        let file = diag.file();
        if let Some((first_file, first_at)) = &self.node_at {
            diag.push(duplicate(
                Duplicated::Node,
                file,
                at(doc),
                first_file,
                *first_at,
            ));
            return;
        }
        self.node_at = Some((file.to_path_buf(), at(doc)));
        self.node = gateway::node(doc, diag);
    }

    fn add_gateway(&mut self, doc: &Spanned<DaemonDoc>, diag: &mut Diag<'_>) {
        let file = diag.file();
        if let Some((first_file, first_at)) = &self.gateway_at {
            diag.push(duplicate(
                Duplicated::Gateway,
                file,
                at(doc),
                first_file,
                *first_at,
            ));
            return;
        }
        self.gateway_at = Some((file.to_path_buf(), at(doc)));
        self.gateway = gateway::gateway(doc, diag);
    }

    fn finish(self) -> Result<Config, Errors> {
        if !self.errors.is_empty() {
            return Err(Errors::new(self.errors));
        }
        let interfaces = self
            .endpoints
            .iter()
            .filter_map(|(d, _)| Some((d.endpoint.id, d.interface.clone()?)))
            .collect();
        Ok(Config {
            settings: self.settings.unwrap_or_default(),
            endpoints: self
                .endpoints
                .into_iter()
                .map(|(d, _)| d.endpoint)
                .collect(),
            rules: self.rules,
            services: self.services.into_iter().map(|(d, _)| d.service).collect(),
            gateway: self.gateway,
            node: self.node,
            interfaces,
            sources: self.sources,
        })
    }
}

fn duplicate(
    item: Duplicated,
    file: &Path,
    at: Location,
    first_file: &Path,
    first_at: Location,
) -> Error {
    let (line, column) = position(at);
    let (first_line, first_column) = position(first_at);
    Error::Duplicate {
        file: file.to_path_buf(),
        line,
        column,
        item,
        first_file: first_file.to_path_buf(),
        first_line,
        first_column,
    }
}

/// The first pass: every document's kind, or its error reported.
fn headers(bytes: &[u8], diag: &mut Diag<'_>) -> Vec<Slot> {
    let mut reader = bytes;
    let mut slots = Vec::new();
    for result in serde_saphyr::read::<_, Spanned<Header>>(&mut reader) {
        if slots.len() == MAX_DOCUMENTS {
            diag.invalid(
                Location::UNKNOWN,
                format!("more than {MAX_DOCUMENTS} documents in one file"),
            );
            break;
        }
        let slot = match result {
            Ok(header) => classify(&header, diag),
            Err(e) => {
                diag.yaml(&e, Location::UNKNOWN);
                Slot::Reported
            }
        };
        slots.push(slot);
    }
    slots
}

fn classify(header: &Spanned<Header>, diag: &mut Diag<'_>) -> Slot {
    let (Some(api_version), Some(kind)) = (&header.value.api_version, &header.value.kind) else {
        let missing = if header.value.api_version.is_none() {
            "apiVersion"
        } else {
            "kind"
        };
        diag.invalid(
            at(header),
            format!(
                "document has no `{missing}`: each document is one object with `apiVersion` and \
                 `kind` (such as `apiVersion: cilium.io/v2`, `kind: CiliumNetworkPolicy`)"
            ),
        );
        return Slot::Reported;
    };
    match Kind::of(&api_version.value, &kind.value) {
        Some(k) => Slot::Pending {
            kind: k,
            at: at(header),
            read: false,
        },
        None => {
            let (line, column) = position(at(kind));
            diag.push(Error::UnknownKind {
                file: diag.file().to_path_buf(),
                line,
                column,
                api_version: sanitize(&api_version.value),
                kind: sanitize(&kind.value),
            });
            Slot::Reported
        }
    }
}

/// A later pass, for one family of kinds: reads every document as `T` and hands those of the
/// family whose slot is pending to `accept`. Skipped when no document is of the family.
fn pass<T: DeserializeOwned>(
    bytes: &[u8],
    slots: &mut [Slot],
    diag: &mut Diag<'_>,
    family: fn(Kind) -> bool,
    mut accept: impl FnMut(Kind, Spanned<T>, &mut Diag<'_>),
) {
    let wanted =
        |slot: &Slot| matches!(slot, Slot::Pending { kind, read: false, .. } if family(*kind));
    if !slots.iter().any(wanted) {
        return;
    }
    let mut reader = bytes;
    let results = serde_saphyr::read::<_, Spanned<T>>(&mut reader);
    for (slot, result) in slots.iter_mut().zip(results) {
        if !wanted(slot) {
            continue;
        }
        let Slot::Pending { kind, at, read } = slot else {
            continue;
        };
        *read = true;
        match result {
            Ok(doc) => accept(*kind, doc, diag),
            Err(e) => diag.yaml(&e, *at),
        }
    }
}
