//! What can go wrong.

use std::net::SocketAddr;

use crate::types::ServiceKey;

/// Why a change to the load balancer was refused. A refused change writes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A backend of another address family than the VIP.
    #[error("service {service}: backend {backend} is not of the VIP's address family")]
    FamilyMismatch {
        /// The service.
        service: ServiceKey,
        /// The backend.
        backend: SocketAddr,
    },
    /// The VIP is unspecified, or port 0 was given.
    #[error("service {service}: {what}")]
    InvalidService {
        /// The service.
        service: ServiceKey,
        /// What is wrong.
        what: &'static str,
    },
    /// More backends than the slot numbers can hold.
    #[error("service {service}: {count} backends, at most {max}")]
    TooManyBackends {
        /// The service.
        service: ServiceKey,
        /// Backends asked for.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// Every backend id (or rev-NAT index) is in use.
    #[error("no free {what}: {in_use} in use")]
    Exhausted {
        /// "backend id" or "rev-NAT index".
        what: &'static str,
        /// How many are in use.
        in_use: usize,
    },
    /// A restored state that contradicts itself (ids given twice, slots naming unknown
    /// backends).
    #[error("inconsistent load-balancer state: {0}")]
    Inconsistent(String),
}
