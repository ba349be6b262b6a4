//! Reading files and directories, splitting them into YAML documents and dispatching each
//! document on its `apiVersion` and `kind`; then the checks across documents.
//!
//! A file is decoded (UTF-8, or UTF-8 / UTF-16 with a byte order mark) and split into its
//! documents before anything is parsed ([`crate::documents`]), so that each document is parsed
//! on its own and a syntax error in one cannot hide the errors of the next. A document's kind
//! decides the shape of its `spec`, but YAML does not promise that `kind` comes before `spec`:
//! so a document is read twice, first for its `apiVersion` and `kind` only, then with the
//! shape of its kind. Locations are relative to the document, and [`Diag`] shifts them by the
//! lines before it.

use std::fs;
use std::path::{Path, PathBuf};

use fqdnd_ipcache::policy::Rule;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_saphyr::{Location, Spanned};

use crate::cluster::{self, Cluster, ClusterDoc};
use crate::cnp::PolicyDoc;
use crate::convert::{self, PolicyKind};
use crate::documents::documents;
use crate::endpoint::{self, Declared, EndpointDoc, EndpointKind};
use crate::error::{Duplicated, Error, Errors};
use crate::gateway::{self, DaemonDoc, Gateway, Node};
use crate::service::{self, DeclaredService, ServiceDoc};
use crate::settings::{self, Settings, SettingsDoc};
use crate::warnings::{self, FqdnUse, RuleAt};
use crate::yaml::{Diag, Text, at, collect_unknown_fields, sanitize};
use crate::{Config, Warning};

/// The `apiVersion` of Cilium's policies.
pub const CILIUM_API_VERSION: &str = "cilium.io/v2";
/// The `apiVersion` of fqdnd's own documents.
pub const FQDND_API_VERSION: &str = "fqdnd.io/v1";

/// Documents read from one file at most; past it the rest of the file is refused.
const MAX_DOCUMENTS: usize = 100_000;

/// Loads policy and configuration from files and directories, in the order given.
///
/// A directory contributes its `*.yaml`, `*.yml` and `*.json` files (not those whose name
/// starts with a dot, and not subdirectories), sorted by name. A file given by name is read
/// whatever its extension. Every file may hold any number of documents of any kind.
///
/// # Errors
/// Every problem found, in every file: unreadable paths, directories without configuration
/// files, syntax errors, invalid or unsupported fields, unknown kinds, and duplicates across
/// documents. (A file without documents — empty, or only comments — is not an error: it is
/// skipped with a [`Warning::EmptyFile`].) Each
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
            Err(source) => loader.errors.push(Error::Io {
                path: file,
                error: source,
            }),
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
        error: source,
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
    Cluster,
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
            (FQDND_API_VERSION, "Cluster") => Self::Cluster,
            _ => return None,
        })
    }
}

/// A document's type and nothing else: read first, to know its shape.
#[derive(Debug, Deserialize)]
struct Header {
    #[serde(rename = "apiVersion")]
    api_version: Option<Text>,
    kind: Option<Text>,
}

/// A 1-based `(line, column)` in a file.
type Position = (u64, u64);

/// Where an endpoint's unique parts are written, in its file.
struct EndpointAt {
    name: Position,
    id: Position,
    addresses: Vec<Position>,
}

/// Everything loaded so far, across files.
#[derive(Default)]
struct Loader {
    errors: Vec<Error>,
    /// Warnings about files (an empty one); the warnings about rules are found in `finish`.
    warnings: Vec<Warning>,
    sources: Vec<PathBuf>,
    /// The `Settings` document, once valid.
    settings: Option<Settings>,
    /// Where the first `Settings` document is, valid or not.
    settings_at: Option<(PathBuf, Position)>,
    /// The `Gateway` document, once valid, and where the first one is.
    gateway: Option<Gateway>,
    gateway_at: Option<(PathBuf, Position)>,
    /// The `Node` document, once valid, and where the first one is.
    node: Option<Node>,
    node_at: Option<(PathBuf, Position)>,
    /// The `Cluster` document, once valid, and where the first one is.
    cluster: Option<Cluster>,
    cluster_at: Option<(PathBuf, Position)>,
    endpoints: Vec<(Declared, PathBuf, EndpointAt)>,
    services: Vec<(DeclaredService, PathBuf, Position, Position)>,
    policies: Vec<(PolicyKind, String, PathBuf, Position)>,
    rules: Vec<Rule>,
    /// Every `toFQDNs` selector of `rules`, with where it is written.
    fqdn_uses: Vec<FqdnUse>,
    /// Where each rule's sections are written (parallel to `rules`).
    rules_at: Vec<(PathBuf, RuleAt)>,
}

impl Loader {
    fn add_file(&mut self, file: &Path, bytes: &[u8]) {
        self.sources.push(file.to_path_buf());
        let text = match decode(bytes) {
            Ok(text) => text,
            Err((line, column, message)) => {
                self.errors.push(Error::Syntax {
                    file: file.to_path_buf(),
                    line,
                    column,
                    message,
                });
                return;
            }
        };
        let mut diag = Diag::new(file);
        let mut read = 0;
        for document in documents(&text) {
            diag.enter(&document);
            if read == MAX_DOCUMENTS {
                diag.invalid(
                    Location::UNKNOWN,
                    format!(
                        "more than {MAX_DOCUMENTS} documents in one file: this one and the \
                         rest of the file are not read"
                    ),
                );
                break;
            }
            if !document.is_blank() && self.add_document(document.text, &mut diag) {
                read += 1;
            }
        }
        if read == 0 && diag.count() == 0 {
            self.warnings.push(Warning::EmptyFile {
                file: file.to_path_buf(),
            });
            return;
        }
        let mut errors = diag.into_errors();
        errors.sort_by_key(Error::position);
        self.errors.extend(errors);
    }

    /// Reads one document: its header, then its shape. Returns whether it is a document at
    /// all (not empty, not a lone `null`).
    fn add_document(&mut self, text: &str, diag: &mut Diag<'_>) -> bool {
        let header =
            match serde_saphyr::from_str_with_options::<Option<Spanned<Header>>>(text, options()) {
                Ok(Some(header)) => header,
                Ok(None) => return false,
                Err(e) => {
                    diag.yaml(&e, Location::UNKNOWN);
                    return true;
                }
            };
        let Some(kind) = classify(&header, diag) else {
            return true;
        };
        match kind {
            Kind::Policy(kind) => {
                if let Some(doc) = read::<PolicyDoc>(text, at(&header), diag) {
                    self.add_policy(&doc, kind, diag);
                }
            }
            Kind::Endpoint(kind) => {
                if let Some(doc) = read::<EndpointDoc>(text, at(&header), diag) {
                    self.add_endpoint(&doc, kind, diag);
                }
            }
            Kind::Settings => {
                if let Some(doc) = read::<SettingsDoc>(text, at(&header), diag) {
                    self.add_settings(&doc, diag);
                }
            }
            Kind::Service => {
                if let Some(doc) = read::<ServiceDoc>(text, at(&header), diag) {
                    self.add_service(&doc, diag);
                }
            }
            Kind::Cluster => {
                if let Some(doc) = read::<ClusterDoc>(text, at(&header), diag) {
                    self.add_cluster(&doc, diag);
                }
            }
            Kind::Gateway | Kind::Node => {
                if let Some(doc) = read::<DaemonDoc>(text, at(&header), diag) {
                    if kind == Kind::Node {
                        self.add_node(&doc, diag);
                    } else {
                        self.add_gateway(&doc, diag);
                    }
                }
            }
        }
        true
    }

    fn add_policy(&mut self, doc: &Spanned<PolicyDoc>, kind: PolicyKind, diag: &mut Diag<'_>) {
        let Some(policy) = convert::policy(doc, kind, diag) else {
            return;
        };
        let file = diag.file();
        let name_at = diag.position(policy.name_at);
        if let Some((_, _, first_file, first_at)) = self
            .policies
            .iter()
            .find(|(k, key, ..)| *k == kind && *key == policy.key)
        {
            let item = Duplicated::Policy {
                kind: kind.name(),
                name: policy.name,
            };
            diag.push(duplicate(item, file, name_at, first_file, *first_at));
            return;
        }
        if policy.implicit_namespace {
            self.warnings.push(Warning::ImplicitNamespace {
                file: file.to_path_buf(),
                line: name_at.0,
                column: name_at.1,
                name: policy.name.clone(),
            });
        }
        self.policies
            .push((kind, policy.key, file.to_path_buf(), name_at));
        for (rule, mut at) in policy.rules {
            let index = self.rules.len();
            self.fqdn_uses
                .extend(std::mem::take(&mut at.fqdns).into_iter().map(|at| FqdnUse {
                    rule: index,
                    file: file.to_path_buf(),
                    at,
                }));
            self.rules.push(rule);
            self.rules_at.push((file.to_path_buf(), at));
        }
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
        let new_at = EndpointAt {
            name: diag.position(new.name_at),
            id: diag.position(new.id_at),
            addresses: new.address_at.iter().map(|&a| diag.position(a)).collect(),
        };
        let before = diag.count();
        for (old, old_file, old_at) in &self.endpoints {
            if old.endpoint.id == new.endpoint.id {
                let item = Duplicated::EndpointId(new.endpoint.id.0);
                diag.push(duplicate(item, file, new_at.id, old_file, old_at.id));
            }
            if let (Some(a), Some(b)) = (&old.interface, &new.interface)
                && a == b
            {
                let item = Duplicated::Interface(a.clone());
                diag.push(duplicate(item, file, new_at.name, old_file, old_at.name));
            }
            if let (Some(a), Some(b)) = (&old.cgroup, &new.cgroup)
                && a == b
            {
                let item = Duplicated::Cgroup(a.to_string());
                diag.push(duplicate(item, file, new_at.name, old_file, old_at.name));
            }
            if old.endpoint.name == new.endpoint.name {
                let item = Duplicated::EndpointName(new.endpoint.name.clone());
                diag.push(duplicate(item, file, new_at.name, old_file, old_at.name));
            }
            for (net, net_at) in new.endpoint.addresses.iter().zip(&new_at.addresses) {
                if let Some(i) = old.endpoint.addresses.iter().position(|a| a == net) {
                    let first_at = old_at.addresses.get(i).copied().unwrap_or(old_at.id);
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
            self.endpoints.push((new, file.to_path_buf(), new_at));
        }
    }

    fn add_settings(&mut self, doc: &Spanned<SettingsDoc>, diag: &mut Diag<'_>) {
        let file = diag.file();
        let doc_at = diag.position(at(doc));
        if let Some((first_file, first_at)) = &self.settings_at {
            diag.push(duplicate(
                Duplicated::Settings,
                file,
                doc_at,
                first_file,
                *first_at,
            ));
            return;
        }
        self.settings_at = Some((file.to_path_buf(), doc_at));
        self.settings = settings::settings(&doc.value, diag);
    }

    fn add_service(&mut self, doc: &Spanned<ServiceDoc>, diag: &mut Diag<'_>) {
        let Some(new) = service::service(doc, diag) else {
            return;
        };
        let file = diag.file();
        let name_at = diag.position(new.name_at);
        let frontend_at = diag.position(new.frontend_at);
        for (old, old_file, old_name_at, old_frontend_at) in &self.services {
            let (item, at_new, at_old) = if old.service.name == new.service.name {
                (
                    Duplicated::ServiceName(new.service.name.clone()),
                    name_at,
                    *old_name_at,
                )
            } else if old.service.key == new.service.key {
                (
                    Duplicated::ServiceFrontend(new.service.key.to_string()),
                    frontend_at,
                    *old_frontend_at,
                )
            } else {
                continue;
            };
            diag.push(duplicate(item, file, at_new, old_file, at_old));
            return;
        }
        self.services
            .push((new, file.to_path_buf(), name_at, frontend_at));
    }

    fn add_node(&mut self, doc: &Spanned<DaemonDoc>, diag: &mut Diag<'_>) {
        let file = diag.file();
        let doc_at = diag.position(at(doc));
        if let Some((first_file, first_at)) = &self.node_at {
            diag.push(duplicate(
                Duplicated::Node,
                file,
                doc_at,
                first_file,
                *first_at,
            ));
            return;
        }
        self.node_at = Some((file.to_path_buf(), doc_at));
        self.node = gateway::node(doc, diag);
    }

    fn add_cluster(&mut self, doc: &Spanned<ClusterDoc>, diag: &mut Diag<'_>) {
        let file = diag.file();
        let doc_at = diag.position(at(doc));
        if let Some((first_file, first_at)) = &self.cluster_at {
            diag.push(duplicate(
                Duplicated::Cluster,
                file,
                doc_at,
                first_file,
                *first_at,
            ));
            return;
        }
        self.cluster_at = Some((file.to_path_buf(), doc_at));
        self.cluster = cluster::cluster(doc, diag);
    }

    fn add_gateway(&mut self, doc: &Spanned<DaemonDoc>, diag: &mut Diag<'_>) {
        let file = diag.file();
        let doc_at = diag.position(at(doc));
        if let Some((first_file, first_at)) = &self.gateway_at {
            diag.push(duplicate(
                Duplicated::Gateway,
                file,
                doc_at,
                first_file,
                *first_at,
            ));
            return;
        }
        self.gateway_at = Some((file.to_path_buf(), doc_at));
        self.gateway = gateway::gateway(doc, diag);
    }

    fn finish(self) -> Result<Config, Errors> {
        if !self.errors.is_empty() {
            return Err(Errors::new(self.errors));
        }
        let interfaces = self
            .endpoints
            .iter()
            .filter_map(|(d, ..)| Some((d.endpoint.id, d.interface.clone()?)))
            .collect();
        let cgroups = self
            .endpoints
            .iter()
            .filter_map(|(d, ..)| Some((d.endpoint.id, d.cgroup.clone()?)))
            .collect();
        let endpoints: Vec<_> = self
            .endpoints
            .into_iter()
            .map(|(d, ..)| d.endpoint)
            .collect();
        let mut warnings = self.warnings;
        warnings.extend(warnings::dead_fqdn_selectors(
            &self.rules,
            &endpoints,
            &self.fqdn_uses,
        ));
        warnings.extend(warnings::shadowed_allows(
            &self.rules,
            &endpoints,
            &self.rules_at,
        ));
        Ok(Config {
            settings: self.settings.unwrap_or_default(),
            endpoints,
            rules: self.rules,
            services: self.services.into_iter().map(|(d, ..)| d.service).collect(),
            gateway: self.gateway,
            node: self.node,
            cluster: self.cluster,
            interfaces,
            cgroups,
            sources: self.sources,
            warnings,
        })
    }
}

fn duplicate(
    item: Duplicated,
    file: &Path,
    (line, column): Position,
    first_file: &Path,
    (first_line, first_column): Position,
) -> Error {
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

/// The options of every read: serde-saphyr's defaults (its budget bounds what one document
/// may cost), without the source snippets fqdnd's messages do not show.
fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        with_snippet: false,
    }
}

/// The text of a file: UTF-8, or UTF-8 / UTF-16 (LE or BE) after a byte order mark, the
/// encodings YAML allows (and serde-saphyr reads). Otherwise the `(line, column)` of the first
/// byte that is not text, and a message.
fn decode(bytes: &[u8]) -> Result<String, (u64, u64, String)> {
    let utf16 = |rest: &[u8], from: fn([u8; 2]) -> u16| {
        let units = rest.chunks(2).map(|pair| match *pair {
            [a, b] => from([a, b]),
            // An odd byte at the end: not UTF-16.
            _ => 0xD800,
        });
        char::decode_utf16(units)
            .collect::<Result<String, _>>()
            .map_err(|_| (1, 1, "the file is not valid UTF-16 text".to_owned()))
    };
    match bytes {
        [0xEF, 0xBB, 0xBF, rest @ ..] => utf8(rest),
        [0xFF, 0xFE, rest @ ..] => utf16(rest, u16::from_le_bytes),
        [0xFE, 0xFF, rest @ ..] => utf16(rest, u16::from_be_bytes),
        _ => utf8(bytes),
    }
}

fn utf8(bytes: &[u8]) -> Result<String, (u64, u64, String)> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Ok(text.to_owned()),
        Err(e) => {
            let valid = &bytes[..e.valid_up_to()];
            let line_start = valid
                .iter()
                .rposition(|&b| b == b'\n' || b == b'\r')
                .map_or(0, |i| i + 1);
            let breaks = valid.iter().filter(|&&b| b == b'\n' || b == b'\r').count()
                - valid.windows(2).filter(|w| *w == b"\r\n").count();
            let line = 1 + breaks;
            let column = 1 + String::from_utf8_lossy(&valid[line_start..])
                .chars()
                .count();
            Err((
                line as u64,
                column as u64,
                format!(
                    "the file is not UTF-8 text (byte {} is not valid UTF-8); save it as UTF-8",
                    e.valid_up_to() + 1
                ),
            ))
        }
    }
}

/// Reads a document with the shape `T`, reporting what is wrong: every unknown field (the read
/// goes on after one), and the first other error, which ends the read.
fn read<T: DeserializeOwned>(
    text: &str,
    doc_at: Location,
    diag: &mut Diag<'_>,
) -> Option<Spanned<T>> {
    let (result, unknown) = collect_unknown_fields(|| {
        serde_saphyr::from_str_with_options::<Spanned<T>>(text, options())
    });
    diag.unknown_fields(unknown);
    match result {
        Ok(doc) => Some(doc),
        Err(e) => {
            diag.yaml(&e, doc_at);
            None
        }
    }
}

/// The kind of a document from its header, or its error reported.
fn classify(header: &Spanned<Header>, diag: &mut Diag<'_>) -> Option<Kind> {
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
        return None;
    };
    match Kind::of(&api_version.value, &kind.value) {
        Some(kind) => Some(kind),
        None => {
            let (line, column) = diag.position(at(kind));
            diag.push(Error::UnknownKind {
                file: diag.file().to_path_buf(),
                line,
                column,
                api_version: sanitize(&api_version.value),
                kind: sanitize(&kind.value),
            });
            None
        }
    }
}
