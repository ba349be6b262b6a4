//! The engine's one error type.

use std::net::IpAddr;
use std::path::PathBuf;

use fqdnd_ipcache::EndpointId;
use ipnet::IpNet;

/// Why an engine operation failed. Each variant names what was being done; the cause, when
/// there is one, is the [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The IpCache refused the endpoints (or client groups).
    #[error("installing endpoints")]
    Endpoints(#[source] fqdnd_ipcache::Error),
    /// The IpCache refused the policy.
    #[error("installing policy")]
    Policy(#[source] fqdnd_ipcache::Error),
    /// The policy holds an FQDN selector the NameManager does not accept.
    #[error("policy holds an FQDN selector the NameManager rejects")]
    Selector(#[source] fqdnd_namemgr::PatternError),
    /// The NameManager refused a change (an invalid name, a circuit breaker, the IpCache
    /// below it).
    #[error(transparent)]
    Names(#[from] fqdnd_namemgr::Error),
    /// The datapath refused a batch. For a policy or endpoint change the engine is back on the
    /// previous policy (`rolled_back`); for an answer, the batch is retried with the next one.
    #[error("the datapath refused the change{}", if *rolled_back { " (rolled back: the previous policy stays in force)" } else { "" })]
    Datapath {
        /// Whether the engine went back to the state before the change.
        rolled_back: bool,
        /// The datapath's error.
        #[source]
        source: fqdnd_ipcache::Error,
    },
    /// Cluster mode: the IpCache refused part of a cluster update (a number still standing
    /// for another label set); the rest was applied.
    #[error("applying the cluster's identities and endpoints")]
    Cluster(#[source] fqdnd_ipcache::Error),
    /// The rollback after a refused change was refused too: the datapath may differ from the
    /// engine until the next successful change.
    #[error("the datapath refused the change and then its rollback")]
    RollbackFailed {
        /// Why the change was refused.
        change: fqdnd_ipcache::Error,
        /// Why the rollback was refused.
        #[source]
        rollback: fqdnd_ipcache::Error,
    },
    /// An allow or deny list could not be read.
    #[error("reading list {}", path.display())]
    List {
        /// The list file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The state directory could not be restored (or its journal written).
    #[error("state directory {}", dir.display())]
    State {
        /// The state directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: fqdnd_checkpoint::Error,
    },
    /// The state directory holds more answers than a restore can index (4 GiB of names or
    /// 4 billion addresses).
    #[error("state directory {}: its answers outgrow 4 GiB of names or 4 billion addresses", dir.display())]
    RestoreTooLarge {
        /// The directory.
        dir: PathBuf,
    },
    /// A record could not be queued to the journal, or was not made durable.
    #[error("journal")]
    Journal(#[source] fqdnd_checkpoint::Error),
    /// An endpoint document did not load.
    #[error("{errors}")]
    EndpointDocument {
        /// Every problem, one per line, located in the document.
        errors: fqdnd_config::Errors,
    },
    /// An endpoint request did not hold exactly one `kind: Endpoint` document.
    #[error("the request must hold exactly one `kind: Endpoint` document (it has {found})")]
    EndpointCount {
        /// How many it holds.
        found: usize,
    },
    /// An endpoint added at run time has neither an interface nor a cgroup.
    #[error("endpoint {name} has no `spec.interface`, `spec.cgroup` or `spec.unit`")]
    NoInterface {
        /// The endpoint's name.
        name: String,
    },
    /// The id of an endpoint added at run time belongs to one declared in the files.
    #[error("endpoint id {id} is declared in the configuration files; change it there")]
    DeclaredInFiles {
        /// The id.
        id: EndpointId,
    },
    /// Another endpoint has this name.
    #[error("endpoint name {name} is taken by id {owner}")]
    NameTaken {
        /// The name.
        name: String,
        /// The endpoint that has it.
        owner: EndpointId,
    },
    /// Another endpoint is on this interface.
    #[error("interface {interface} belongs to endpoint {owner_name} ({owner})")]
    InterfaceTaken {
        /// The interface.
        interface: String,
        /// The endpoint on it.
        owner: EndpointId,
        /// Its name.
        owner_name: String,
    },
    /// Another endpoint is of this cgroup (or systemd unit).
    #[error("{cgroup} belongs to endpoint {owner_name} ({owner})")]
    CgroupTaken {
        /// The cgroup or unit.
        cgroup: fqdnd_config::Cgroup,
        /// The endpoint of it.
        owner: EndpointId,
        /// Its name.
        owner_name: String,
    },
    /// Another endpoint has this address.
    #[error("address {address} belongs to endpoint {owner_name} ({owner})")]
    AddressTaken {
        /// The address.
        address: IpNet,
        /// The endpoint that has it.
        owner: EndpointId,
        /// Its name.
        owner_name: String,
    },
    /// A CNI container id that is not one.
    #[error("container id {id:?} is not a CNI container id (letters, digits, `_`, `.`, `-`)")]
    ContainerId {
        /// The id given.
        id: String,
    },
    /// A container's interface name (`CNI_IFNAME`) that is not one.
    #[error(
        "interface name {name:?} is not a container interface name (1 to 15 letters, digits, \
         `_`, `.`, `-`)"
    )]
    ContainerInterface {
        /// The name given.
        name: String,
    },
    /// Every endpoint id from `from` up is taken.
    #[error("no endpoint id from {from} up is free")]
    NoFreeEndpointId {
        /// Where the search started.
        from: u16,
    },
    /// No endpoint with this id was added at run time.
    #[error("no endpoint {id}")]
    NoEndpoint {
        /// The id.
        id: EndpointId,
    },
    /// An address of an answer was not learned; the answer must not be released as allowed.
    #[error(
        "{missing} of the answer's {total} addresses were not learned (circuit breaker, IP cap \
         or full datapath map)"
    )]
    NotLearned {
        /// Addresses not learned.
        missing: usize,
        /// Addresses in the answer.
        total: usize,
    },
    /// The answer's records are not a valid chain from the question.
    #[error(transparent)]
    Answer(#[from] fqdnd_namemgr::AnswerError),
    /// A client address belongs to no endpoint or client group.
    #[error("{client} is in no endpoint or client group")]
    UnknownClient {
        /// The address.
        client: IpAddr,
    },
}

/// `error` and its sources, `: `-separated, for logs and replies.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
