//! `fqdnd cache forget` (`POST /v1/cache/forget`): a name's mappings out of the engine and
//! the datapath at once (not as zombies), a journal record so that a restart does not bring
//! them back, and — on a gateway of an HA group — out of the group's keys, which revokes them
//! on every gateway of the group.

use std::net::IpAddr;

use super::{Shared, lock};
use crate::admin::{ForgetOutcome, ForgetRequest};

/// Why a forget failed: the request's fault, or the daemon's.
#[derive(Debug)]
pub enum ForgetError {
    /// A name that is not one, an unknown client group.
    Request(String),
    /// The engine or the journal failed.
    Daemon(String),
}

impl Shared {
    /// Forgets what `request` names (see the module's docs).
    pub async fn forget(&self, request: &ForgetRequest) -> Result<ForgetOutcome, ForgetError> {
        let name = fqdnd_namemgr::DnsName::canonical(&request.name)
            .map_err(|e| {
                ForgetError::Request(format!("{:?} is not a DNS name: {e}", request.name))
            })?
            .into_owned();
        let addrs: Option<&[IpAddr]> =
            (!request.addresses.is_empty()).then_some(&request.addresses);
        let (outcome, ack) = {
            let mut engine =
                lock(&self.engine, "engine").map_err(|e| ForgetError::Daemon(crate::chain(&e)))?;
            let endpoint = match &request.client {
                None => None,
                Some(client) => Some(
                    engine
                        .ipcache
                        .endpoints()
                        .values()
                        .find(|e| &e.name == client)
                        .map(|e| e.id)
                        .ok_or_else(|| {
                            ForgetError::Request(format!(
                                "no client group or endpoint named {client:?}"
                            ))
                        })?,
                ),
            };
            let forget = engine.scope_forget(&name, addrs, endpoint);
            let kept_for_others = endpoint.is_some() && forget.addrs == Some(&[]);
            let done = engine.forget(&forget);
            let ack = match &self.persist {
                Some(p) => Some(
                    p.forgotten(&forget)
                        .map_err(|e| ForgetError::Daemon(fqdnd_engine::error_chain(&e)))?,
                ),
                None => None,
            };
            let done = done.map_err(|e| {
                crate::metrics::record_datapath_error(&e);
                ForgetError::Daemon(fqdnd_engine::error_chain(&e))
            })?;
            let outcome = ForgetOutcome {
                name: name.clone(),
                mappings: done.mappings,
                records: done.endpoint_records,
                kept_for_others,
                journaled: ack.is_some(),
                group: None,
            };
            (outcome, ack)
        };
        if let Some(ack) = ack {
            ack.await.map_err(|e| {
                ForgetError::Daemon(format!("the journal did not take the forget: {e}"))
            })?;
        }
        tracing::info!(name = %outcome.name, addresses = ?request.addresses, client = ?request.client, mappings = outcome.mappings, records = outcome.records, "cache forget");
        let mut outcome = outcome;
        if let Some(ha) = self.cluster.as_ref().and_then(|c| c.ha()) {
            outcome.group = Some(ha.forget(&name, addrs, request.client.as_deref()).await);
        }
        Ok(outcome)
    }
}
