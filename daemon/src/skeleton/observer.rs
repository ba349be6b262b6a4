//! The proxy's [`ResponseObserver`], adapted to the engine: every allowed answer is learned
//! (NameManager → IpCache → datapath) and, with a state directory, made durable before the
//! proxy releases it.

use std::sync::Arc;

use fqdnd_checkpoint::{Ack, Seq};
use fqdnd_dnsproxy::{Observation, ObserveError, ResponseContext, ResponseObserver};
use fqdnd_engine::answer::{self, Extracted};
use fqdnd_engine::durable::Persist;
use fqdnd_ipcache::EndpointId;

use crate::clock::Clock;
use crate::skeleton::SharedEngine;

/// Learns answers into the engine.
pub(super) struct EngineObserver {
    pub engine: SharedEngine,
    pub clock: Clock,
    pub persist: Option<Arc<Persist>>,
    /// An HA gateway group: what is learned is published to the peers.
    pub ha: Option<Arc<crate::ha::Ha>>,
}

fn failed(e: &fqdnd_engine::Error) -> Observation {
    crate::metrics::record_datapath_error(e);
    Observation::Done(Err(ObserveError {
        reason: fqdnd_engine::error_chain(e),
    }))
}

/// Waits for the journal's acknowledgements: the observation is done once they are durable.
fn durable(acks: Vec<Ack<Seq>>, persist: Option<Arc<Persist>>) -> Observation {
    if acks.is_empty() {
        return Observation::Done(Ok(()));
    }
    Observation::Pending(Box::pin(async move {
        for ack in acks {
            ack.await.map_err(|e| {
                if let Some(p) = &persist {
                    p.count_error();
                }
                tracing::error!(error = %e, "journal write failed: the answer is not durable");
                ObserveError {
                    reason: format!("journal: {e}"),
                }
            })?;
        }
        Ok(())
    }))
}

impl ResponseObserver for EngineObserver {
    fn observe(&self, ctx: &ResponseContext<'_>) -> Observation {
        let endpoint = EndpointId(u16::try_from(ctx.tag).unwrap_or(u16::MAX));
        let mut extracted = Extracted::default();
        if let Err(e) = answer::extract_decoded(ctx.response, &mut extracted) {
            return Observation::Done(Err(ObserveError {
                reason: e.to_string(),
            }));
        }
        if extracted.addrs.is_empty() {
            // NXDOMAIN, NODATA, a chain without addresses: nothing to learn.
            return Observation::Done(Ok(()));
        }
        let Ok(mut engine) = self.engine.lock() else {
            return Observation::Done(Err(ObserveError {
                reason: "engine lock poisoned".into(),
            }));
        };
        let learning = match engine.learn(
            endpoint,
            ctx.name,
            &extracted.addrs,
            extracted.ttl,
            // Learned as of the answer's arrival (no clock read per answer).
            self.clock.at(ctx.answered),
        ) {
            Ok(learning) => learning,
            Err(e) => return failed(&e),
        };
        let acks = match &self.persist {
            None => Vec::new(),
            Some(p) => match p.answer(
                &engine,
                endpoint,
                ctx.name,
                &extracted.addrs,
                extracted.ttl,
                &learning,
            ) {
                Ok(acks) => acks,
                Err(e) => return failed(&e),
            },
        };
        // An HA gateway group: the group learns it too (asynchronously: the reply waits for
        // the local engine and journal only).
        let share = match &self.ha {
            Some(ha) if learning.complete().is_ok() => {
                engine.ipcache.endpoints().get(&endpoint).map(|e| {
                    (
                        ha,
                        e.name.clone(),
                        extracted.ttl.max(engine.names.config().min_ttl),
                    )
                })
            }
            _ => None,
        };
        drop(engine);
        if let Some((ha, client, ttl)) = share {
            ha.offer(&client, ctx.name, &extracted.addrs, ttl);
        }
        // What was learned stays learned (and journaled); an answer not wholly learned is not
        // released as allowed: the proxy applies `onHoldTimeout`.
        match learning.complete() {
            Err(e) => failed(&e),
            Ok(()) => durable(acks, self.persist.clone()),
        }
    }
}
