//! What can go wrong while loading, each problem with the file and position it concerns.
//!
//! Loading never stops at the first problem: [`Errors`] carries every one found, in file order.

use std::fmt;
use std::path::{Path, PathBuf};

use ipnet::IpNet;

/// One problem found while loading policy and configuration files.
///
/// Every variant that points into a file displays as `file:line:column: message`, with 1-based
/// line and column (the column counts characters), so editors and CI logs can jump to it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or directory could not be read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the operating system said (in the message, so not a `source`: a chain
        /// renderer prints it once).
        error: std::io::Error,
    },

    /// The text is not well-formed YAML (or JSON), or is not UTF-8 / UTF-16.
    #[error("{}:{line}:{column}: {message}", file.display())]
    Syntax {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: u64,
        /// 1-based column.
        column: u64,
        /// What is wrong.
        message: String,
    },

    /// Well-formed YAML that is not a valid policy or configuration document: an unknown or
    /// unsupported field, a value of the wrong type or out of range, a bad pattern or CIDR.
    #[error("{}:{line}:{column}: {message}", file.display())]
    Invalid {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: u64,
        /// 1-based column.
        column: u64,
        /// What is wrong, naming the field.
        message: String,
    },

    /// A policy field fqdnd refuses on purpose: it would change what a rule allows, and fqdnd
    /// cannot give it the meaning Cilium gives it (`why` says which kind of reason).
    #[error("{}:{line}:{column}: `{field}` is not supported by fqdnd: {why}", file.display())]
    Unsupported {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: u64,
        /// 1-based column.
        column: u64,
        /// The field (or value, for an entity: `toEntities: kube-apiserver`) as written.
        field: String,
        /// Why it is refused.
        why: Unsupported,
    },

    /// A directory that holds no `*.yaml`, `*.yml` or `*.json` file.
    #[error("{}: no policy or configuration files (*.yaml, *.yml, *.json) in this directory", dir.display())]
    EmptyDirectory {
        /// The directory.
        dir: PathBuf,
    },

    /// A document whose `apiVersion` and `kind` fqdnd does not read.
    #[error(
        "{}:{line}:{column}: unknown document type: apiVersion {api_version:?}, kind {kind:?}; \
         fqdnd reads apiVersion cilium.io/v2 with kind CiliumNetworkPolicy or \
         CiliumClusterwideNetworkPolicy, and apiVersion fqdnd.io/v1 with kind Endpoint, \
         ClientGroup or Settings (one object per document)",
        file.display()
    )]
    UnknownKind {
        /// The file.
        file: PathBuf,
        /// 1-based line of the `kind` value.
        line: u64,
        /// 1-based column of the `kind` value.
        column: u64,
        /// The document's `apiVersion`.
        api_version: String,
        /// The document's `kind`.
        kind: String,
    },

    /// Something declared twice where it must be unique (across all files loaded together).
    #[error(
        "{}:{line}:{column}: {item} is already declared at {}:{first_line}:{first_column}",
        file.display(),
        first_file.display()
    )]
    Duplicate {
        /// The file of the second declaration.
        file: PathBuf,
        /// 1-based line of the second declaration.
        line: u64,
        /// 1-based column of the second declaration.
        column: u64,
        /// What is duplicated.
        item: Duplicated,
        /// The file of the first declaration.
        first_file: PathBuf,
        /// 1-based line of the first declaration.
        first_line: u64,
        /// 1-based column of the first declaration.
        first_column: u64,
    },
}

/// Why a field is refused ([`Error::Unsupported`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unsupported {
    /// It names something only a Kubernetes cluster has (services, the API server, named
    /// container ports, node labels, Cilium's own pods): fqdnd runs without Kubernetes and
    /// has nothing it could select.
    KubernetesOnly,
    /// An L7 rule other than DNS (HTTP, Kafka, a generic L7 parser) or TLS interception:
    /// it needs Cilium's Envoy proxy, which fqdnd does not have.
    L7Proxy,
    /// It needs something outside the cluster's own data: cloud-provider groups, CIDR group
    /// objects, mutual authentication with SPIFFE identities.
    External,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::KubernetesOnly => {
                "it is Kubernetes-only (it names Kubernetes objects or Cilium's pods, which \
                 fqdnd, running without Kubernetes, does not have); remove it or enforce this \
                 policy with Cilium"
            }
            Self::L7Proxy => {
                "it needs Cilium's L7 proxy (Envoy), which fqdnd does not have (fqdnd \
                 enforces L3/L4 and DNS rules); remove it or enforce this policy with Cilium"
            }
            Self::External => {
                "it refers to objects outside the policy that fqdnd cannot read (CIDR groups, \
                 cloud groups, mutual authentication); write the CIDRs out, or enforce this \
                 policy with Cilium"
            }
        })
    }
}

/// What an [`Error::Duplicate`] is about.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Duplicated {
    /// An endpoint id (`spec.id`), unique across `Endpoint` and `ClientGroup` documents.
    EndpointId(u16),
    /// An endpoint name (`metadata.name`), unique across `Endpoint` and `ClientGroup`.
    EndpointName(String),
    /// An address or prefix claimed by two endpoints: the source address would be ambiguous.
    Address(IpNet),
    /// A second `kind: Settings` document; there may be at most one.
    Settings,
    /// A second `kind: Gateway` document; there may be at most one.
    Gateway,
    /// A second `kind: Node` document; there may be at most one.
    Node,
    /// A second `kind: Cluster` document; there may be at most one.
    Cluster,
    /// Two Endpoints on the same interface.
    Interface(String),
    /// Two Endpoints of the same cgroup or systemd unit (`cgroup /a/b`, `unit x.service`).
    Cgroup(String),
    /// A service name (`metadata.name`), unique across `Service` documents.
    ServiceName(String),
    /// Two services with the same frontend (VIP, port and protocol).
    ServiceFrontend(String),
    /// A second policy of the same kind, namespace and name (Kubernetes would have replaced
    /// the first; applying both would allow more than either).
    Policy {
        /// `CiliumNetworkPolicy` or `CiliumClusterwideNetworkPolicy`.
        kind: &'static str,
        /// `namespace/name`, or `name` without a namespace.
        name: String,
    },
}

impl fmt::Display for Duplicated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EndpointId(id) => write!(f, "endpoint id {id}"),
            Self::EndpointName(name) => write!(f, "endpoint name {name:?}"),
            Self::Address(net) => write!(f, "address {net}"),
            Self::Settings => f.write_str("a `kind: Settings` document (at most one is allowed)"),
            Self::Gateway => f.write_str("a `kind: Gateway` document (at most one is allowed)"),
            Self::Node => f.write_str("a `kind: Node` document (at most one is allowed)"),
            Self::Cluster => f.write_str("a `kind: Cluster` document (at most one is allowed)"),
            Self::Interface(name) => write!(f, "interface {name} (one Endpoint per interface)"),
            Self::Cgroup(what) => write!(f, "{what} (one Endpoint per cgroup)"),
            Self::ServiceName(name) => write!(f, "service name {name:?}"),
            Self::ServiceFrontend(key) => write!(f, "service frontend {key}"),
            Self::Policy { kind, name } => write!(f, "{kind} {name:?}"),
        }
    }
}

impl Error {
    /// The file (or directory) the error concerns.
    #[must_use]
    pub fn file(&self) -> &Path {
        match self {
            Self::Io { path, .. } => path,
            Self::EmptyDirectory { dir } => dir,
            Self::Syntax { file, .. }
            | Self::Invalid { file, .. }
            | Self::Unsupported { file, .. }
            | Self::UnknownKind { file, .. }
            | Self::Duplicate { file, .. } => file,
        }
    }

    /// The 1-based `(line, column)` the error points at, if it points into a file.
    #[must_use]
    pub fn position(&self) -> Option<(u64, u64)> {
        match self {
            Self::Syntax { line, column, .. }
            | Self::Invalid { line, column, .. }
            | Self::Unsupported { line, column, .. }
            | Self::UnknownKind { line, column, .. }
            | Self::Duplicate { line, column, .. } => Some((*line, *column)),
            Self::Io { .. } | Self::EmptyDirectory { .. } => None,
        }
    }
}

/// Every error found by one [`load`](crate::load) or [`load_str`](crate::load_str) call.
///
/// Never empty when returned. Displays one error per line.
#[derive(Debug)]
pub struct Errors(Vec<Error>);

impl Errors {
    pub(crate) fn new(errors: Vec<Error>) -> Self {
        Self(errors)
    }

    /// The errors, in the order found (file by file, top to bottom; checks across documents,
    /// such as duplicate endpoint ids, after the documents they concern).
    #[must_use]
    pub fn as_slice(&self) -> &[Error] {
        &self.0
    }

    /// Iterates over the errors.
    pub fn iter(&self) -> std::slice::Iter<'_, Error> {
        self.0.iter()
    }

    /// How many errors.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none (never, for a value returned by the loader).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The errors as a vector.
    #[must_use]
    pub fn into_vec(self) -> Vec<Error> {
        self.0
    }
}

impl fmt::Display for Errors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Errors {}

impl IntoIterator for Errors {
    type Item = Error;
    type IntoIter = std::vec::IntoIter<Error>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Errors {
    type Item = &'a Error;
    type IntoIter = std::slice::Iter<'a, Error>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}
