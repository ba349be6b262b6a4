//! What the cluster and HA glue need from the running daemon: the [`Host`] trait, which the
//! daemon skeleton implements. Its own module, so that `ha` and `cluster` both depend on it
//! and not on each other (`cluster` builds on `ha`; `ha` knows neither `cluster` nor the
//! skeleton).

use std::sync::Mutex;

use fqdnd_cluster::{Held, Import, Revocation};
use fqdnd_engine::Engine;

use crate::datapath::AnyDatapath;

/// What the cluster glue needs from the running daemon.
pub trait Host: Send + Sync + 'static {
    /// The engine.
    fn engine(&self) -> &Mutex<Engine<AnyDatapath>>;
    /// Re-reads the configuration and applies it (files + the shared policy now accepted),
    /// whole or not at all; the errors if it was refused.
    fn reload_all(&self) -> Result<(), Vec<String>>;
    /// An HA gateway group's records learned by peers (or by this gateway before a restart):
    /// learned as the local policy (for a query to one of `servers`, the proxy's listen
    /// addresses) and breakers allow; how many were.
    fn import_learned(&self, records: &[Import], servers: &[std::net::SocketAddr]) -> usize;
    /// An HA gateway group's revocations: forgotten at once, out of the engine, the datapath
    /// and the journal.
    fn revoke_learned(&self, revocations: &[Revocation]);
    /// The live answers the engine holds, per client group and name (for what the group
    /// lacks).
    fn held_answers(&self) -> Vec<Held>;
}
