//! Service load balancing, as the LB v2 design (cilium/cilium#7106) lays it out: a service is
//! (VIP, port, protocol); slot 0 of its map entries holds the backend count and the rev-NAT
//! index, slots `1..=count` one backend id each; backends are keyed by an id allocated once;
//! rev-NAT indexes map replies back to the VIP.
//!
//! It owns the [`LoadBalancer`]: which services exist, which backends each has and in which
//! slot, the backend ids and rev-NAT indexes (allocated monotonically so an id a conntrack
//! entry may still hold is not handed to another backend soon), and the ordered [`LbWrite`]s
//! that move the maps from one state to the next without ever exposing a hole, a duplicate
//! slot or a slot naming a missing backend. Its [`LbState`] is what the checkpoint persists.
//!
//! It never touches the kernel: the datapath applies the writes ([`MemoryMaps`] is the
//! in-memory one the tests check every step on).
#![forbid(unsafe_code)]

mod balancer;
mod error;
mod maps;
mod types;

pub use balancer::{BackendState, LbState, LoadBalancer, MAX_BACKENDS_PER_SERVICE, ServiceState};
pub use error::Error;
pub use maps::{LbWrite, MemoryMaps, SlotValue};
pub use types::{BackendId, Protocol, RevNatIndex, ServiceKey};
