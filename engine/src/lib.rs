//! The FQDN policy engine, as the daemon (gateway and node) and `fqdnd replay` both run it.
//!
//! It owns
//! - [`Engine`]: the NameManager and the IpCache wired together over a datapath, and the
//!   order of operations (policy into the IpCache first, then the NameManager's selectors,
//!   then one ordered batch to the datapath; a change the datapath refuses is rolled back);
//! - [`answer`]: what a DNS answer teaches — one rule for classes (IN only), CNAME chains and
//!   TTLs, read from a message `fqdnd-dnswire` decoded or from any other decoder;
//! - [`dns`]: the per-query DNS verdict — which endpoint or client group asks, and whether
//!   its CiliumNetworkPolicy DNS rules and the allow/deny lists let it ask the name;
//! - [`durable`]: the records that make learned state durable before a reply is released,
//!   the snapshot of the whole engine, and the restore order after a restart;
//! - [`endpoints`]: node mode's endpoint registry (endpoints from files and from the admin
//!   API) and the rules that keep two endpoints from claiming one name, interface or address;
//! - [`view`]: the engine's state as the admin API lists it;
//! - cluster mode's entry points ([`Engine::enable_cluster`], [`Engine::apply_cluster`]): the
//!   cluster's identity numbers, other nodes' endpoints and other nodes' own addresses (the
//!   remote-node identity), applied in the order that keeps a
//!   number from meaning two label sets in one batch (the binary translates the cluster
//!   crate's view into a [`ClusterUpdate`]).
//! - [`explain`]: which rule allows or denies a flow (`fqdnd policy explain`).
//!
//! It never opens a socket, never talks to the kernel (the datapath is the IpCache's
//! [`Datapath`](fqdnd_ipcache::Datapath) trait), never reads the clock (monotonic `now` is an
//! argument, wall time comes through the [`Clock`] trait) and knows nothing of the DNS proxy:
//! the binary adapts the proxy's `QueryPolicy` and `ResponseObserver` traits to
//! [`dns::DnsPolicy`] and [`Engine::learn`].

#![forbid(unsafe_code)]

pub mod answer;
mod clock;
pub mod dns;
pub mod durable;
pub mod endpoints;
mod engine;
mod error;
pub mod explain;
pub mod view;

pub use clock::Clock;
pub use engine::{
    ClusterUpdate, Engine, IdentityMode, Learning, RemoteEndpoint, RemoteNode, Tunables,
};
pub use error::{Error, error_chain};
pub use fqdnd_namemgr::{Forget, Forgotten};
