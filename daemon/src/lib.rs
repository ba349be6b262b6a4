//! fqdnd-daemon: the gateway, the node agent and the cluster operator as a library — the
//! daemon the `fqdnd` binary starts.
//!
//! It owns the wiring of the pure crates into running services: the daemon skeleton both
//! modes share ([`skeleton`]: start, reload with rollback, stop, the periodic tasks), the
//! gateway's and the node's own parts ([`gateway`], [`node`]), the kernel reconcilers
//! ([`kernel`]: the endpoints' programs and cgroup attachments brought to what the
//! configuration wants), the cluster and HA glue ([`cluster`], [`ha`]), the admin API
//! (server and client, [`admin`]), the read-only web dashboard ([`dashboard`]), the metrics
//! catalogue ([`metrics`]), the gateway's DoT/DoH certificate ([`tls`]), the CNI plugin's
//! protocol ([`cni`]), dropping privileges ([`privileges`]) and telling systemd the daemon's
//! state ([`notify`]).
//!
//! It must never parse command lines or print for a user (that is the binary's), never
//! decide policy (the engine does) and never touch the kernel but through `fqdnd-ebpf` and
//! `fqdnd-privileges`. Its one real clock is [`clock::Clock`]; everything below it takes
//! `now`.

#![forbid(unsafe_code)]

pub mod admin;
pub mod clock;
pub mod cluster;
pub mod cni;
pub mod dashboard;
mod datapath;
mod error;
pub mod gateway;
pub mod ha;
mod host;
pub mod kernel;
mod links;
pub mod metrics;
pub mod node;
pub mod notify;
mod perms;
pub mod privileges;
pub mod skeleton;
mod store;
pub mod tls;

pub use error::{Cause, Context, Error, Result, chain};
