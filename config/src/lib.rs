//! fqdnd's policy language and daemon configuration, read from YAML (or JSON).
//!
//! **What this crate owns.** Loading and validating everything fqdnd is told:
//!
//! - Cilium's own policies, `apiVersion: cilium.io/v2`, `kind: CiliumNetworkPolicy` or
//!   `CiliumClusterwideNetworkPolicy`, accepted as they are written for Cilium and turned into
//!   the policy model of [`fqdnd_ipcache::policy`] (one [`Rule`] per `spec` / `specs[]`);
//! - fqdnd's own declarations, `apiVersion: fqdnd.io/v1`: `kind: Endpoint` and
//!   `kind: ClientGroup` (the workloads enforced, as [`Endpoint`]s), `kind: Settings` (the
//!   engine's tunables, as [`Settings`], with Cilium's defaults), `kind: Gateway` /
//!   `kind: Node` (how the daemon runs, as [`Gateway`] / [`Node`]), `kind: Service`
//!   (a VIP the node load-balances, as [`Service`]) and `kind: Cluster` (cluster mode: where
//!   etcd is, as [`Cluster`]).
//!
//! Any number of documents of any kind may share a file (`---` between them). A file is split
//! into its documents before it is parsed ([`documents`]), and each document is checked on its
//! own: a syntax error in one does not hide the errors of the next. Every problem is reported
//! with its `file:line:column`, and loading goes on after one (an unknown field too, within its
//! document) so that a single run shows them all ([`Errors`]). A configuration that loads but
//! cannot work as written, such as a `toFQDNs` selector whose names the DNS rules never let
//! through, comes with [`Warning`]s.
//!
//! **What it must never do.**
//!
//! - Never ignore a field that changes what a policy allows: fields fqdnd does not implement
//!   (`ingress`, `toServices`, `toEntities`, `rules.http`, …) are errors naming the field, and
//!   unknown fields (typos) are errors listing the expected ones.
//! - No global configuration: [`load`] returns a [`Config`] value and the caller passes it on.
//! - No I/O outside [`load`] (which only reads the paths it is given); [`load_str`] and
//!   everything else is pure.
//! - Never panic, whatever the input.
//!
//! ```
//! let config = fqdnd_config::load_str(fqdnd_config::EXAMPLE_POLICY, "policy.yaml".as_ref())
//!     .expect("the example is valid");
//! assert_eq!(config.endpoints.len(), 2);
//! ```

#![forbid(unsafe_code)]

mod cluster;
mod cnp;
mod convert;
mod dashboard;
mod dns;
mod documents;
mod encrypted;
mod endpoint;
mod error;
mod gateway;
mod load;
mod service;
mod settings;
mod shared;
mod upstream;
mod warnings;
mod yaml;

use std::path::PathBuf;

use fqdnd_ipcache::Endpoint;
use fqdnd_ipcache::policy::Rule;

pub use cluster::{Cluster, ClusterAuth, ClusterTls, valid_node_name};
pub use dashboard::{DEFAULT_DASHBOARD_ADDRESS, Dashboard};
pub use dns::{
    AnswerCache, HoldFallback, RateLimitAction, RejectCode, TruncatedAction, UpstreamTimeoutAction,
};
pub use documents::{Document, Documents, documents};
pub use encrypted::EncryptedDns;
pub use endpoint::Cgroup;
pub use error::{Duplicated, Error, Errors, Unsupported};
pub use gateway::{
    Conntrack, DEFAULT_DNS_PROXY_PORT, DEFAULT_GATEWAY_ADMIN_SOCKET, DEFAULT_NODE_ADMIN_SOCKET,
    DEFAULT_NODE_ENDPOINTS_ROOT, DEFAULT_UPSTREAM_CA, Daemon, Gateway, Lists,
    MAX_CONNTRACK_LIFETIME, MapSizes, Node, RateLimit, StaticZone, ZoneSource, ZoneUpstreams,
    default_endpoints_file,
};
pub use load::{CILIUM_API_VERSION, FQDND_API_VERSION, load, load_str};
pub use service::Service;
pub use settings::{MAX_PROXY_RESPONSE_DELAY, MIN_GC_INTERVAL, Settings};
pub use shared::{SharedPolicy, SharedPolicySet, SharedUpdate, shared_policies};
pub use upstream::{DOH_PATH, DOH_PORT, DOT_PORT, Upstream, UpstreamProtocol};
pub use warnings::{DeadReason, Warning};

/// A realistic policy file: Settings, two Endpoints and CiliumNetworkPolicies for DNS
/// interception, FQDN egress and a CIDR set. Loads without error.
pub const EXAMPLE_POLICY: &str = include_str!("../examples/policy.yaml");

/// Everything loaded: settings, endpoints and policy rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The `Settings` document, or the defaults if there was none.
    pub settings: Settings,
    /// Every `Endpoint` and `ClientGroup`, in the order read.
    pub endpoints: Vec<Endpoint>,
    /// One rule per `spec` / `specs[]` of every policy, in the order read.
    pub rules: Vec<Rule>,
    /// Every `Service` (node mode: the load balancer's services), in the order read.
    pub services: Vec<Service>,
    /// The `Gateway` document, if any (`fqdnd gateway` needs one).
    pub gateway: Option<Gateway>,
    /// The `Node` document, if any (`fqdnd node` uses its defaults without one).
    pub node: Option<Node>,
    /// The `Cluster` document, if any: cluster mode for `fqdnd node`, the enforcing gateway
    /// and `fqdnd operator`.
    pub cluster: Option<Cluster>,
    /// The host-side interface of each Endpoint that names one (node mode).
    pub interfaces: std::collections::BTreeMap<fqdnd_ipcache::EndpointId, String>,
    /// The cgroup of each Endpoint of host processes (node mode).
    pub cgroups: std::collections::BTreeMap<fqdnd_ipcache::EndpointId, Cgroup>,
    /// The files read, in order (a directory contributes its files).
    pub sources: Vec<PathBuf>,
    /// What is valid but cannot work as written (`fqdnd policy check` prints them), in the
    /// order of the rules.
    pub warnings: Vec<Warning>,
}
