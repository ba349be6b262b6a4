//! An HA gateway group's side of the engine ([`crate::host::Host`]): peers' records learned
//! as the local policy and breakers allow, revocations forgotten, and the live answers held
//! (for what the group lacks).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use fqdnd_cluster::{Held, Import, Revocation};
use fqdnd_engine::{Clock as _, Forget};
use fqdnd_ipcache::EndpointId;

use super::{Shared, lock};

/// The engine's client groups (or endpoints) by name.
fn groups<D>(engine: &fqdnd_engine::Engine<D>) -> HashMap<String, EndpointId> {
    engine
        .ipcache
        .endpoints()
        .values()
        .map(|e| (e.name.clone(), e.id))
        .collect()
}

/// Each record is learned for the client group of its name here, if this gateway's DNS
/// policy lets the group ask it (one of `servers`) for the name, until the record's expiry
/// as the importer clamped it — through the engine's breakers into the kernel maps, and
/// into the journal with `stateDir`. Returns how many were.
pub(super) fn import(shared: &Shared, records: &[Import], servers: &[SocketAddr]) -> usize {
    let policy = shared.dns.current();
    let Ok(mut engine) = lock(&shared.engine, "engine") else {
        return 0;
    };
    let groups = groups(&engine);
    let now = shared.clock.now();
    let mut imported = 0;
    for r in records {
        let Some(&id) = groups.get(&r.client) else {
            tracing::debug!(client = %r.client, name = %r.name, "an imported answer names an unknown client group: skipped");
            continue;
        };
        if !policy.endpoint_may_ask(id, servers, &r.name) {
            tracing::debug!(client = %r.client, name = %r.name, "an imported answer's name is refused here: skipped");
            continue;
        }
        let ttl = shared.clock.seconds_until_unix_ms(r.expires_ms);
        if ttl == 0 {
            continue;
        }
        // Learned without a commit each: the batch is committed once, below.
        match engine.restore_answer(id, &r.name, &r.addrs, ttl, now) {
            Ok(learned) => {
                let learning = fqdnd_engine::Learning {
                    learned,
                    total: r.addrs.len(),
                };
                if let Some(p) = &shared.persist
                    && let Err(e) = p.answer(&engine, id, &r.name, &r.addrs, ttl, &learning)
                {
                    tracing::warn!(error = %fqdnd_engine::error_chain(&e), "journaling an imported answer failed");
                }
                match learning.complete() {
                    Ok(()) => imported += 1,
                    Err(e) => {
                        tracing::debug!(name = %r.name, error = %fqdnd_engine::error_chain(&e), "an imported answer was not wholly learned");
                    }
                }
            }
            Err(e) => {
                tracing::debug!(name = %r.name, error = %fqdnd_engine::error_chain(&e), "an imported answer was refused");
            }
        }
    }
    if let Err(e) = engine.commit() {
        // It stays pending and goes with the next commit.
        crate::metrics::record_datapath_error(&e);
        tracing::warn!(error = %fqdnd_engine::error_chain(&e), "the datapath refused imported answers");
    }
    imported
}

/// Forgets what each revocation takes away — the addresses for everyone, the client
/// group's record of the name if it says so — at once, out of the datapath, and journaled
/// (a restart does not bring it back).
pub(super) fn revoke(shared: &Shared, revocations: &[Revocation]) {
    let Ok(mut engine) = lock(&shared.engine, "engine") else {
        return;
    };
    let groups = groups(&engine);
    for r in revocations {
        let endpoint = if r.record {
            groups.get(&r.client).copied()
        } else {
            None
        };
        if r.addrs.is_empty() && endpoint.is_none() {
            continue;
        }
        let forget = Forget {
            name: &r.name,
            addrs: Some(&r.addrs),
            endpoint,
        };
        match engine.forget(&forget) {
            Ok(done) => {
                tracing::debug!(client = %r.client, name = %r.name, forgotten = done.mappings, "revoked in the HA group: forgotten");
            }
            Err(e) => {
                crate::metrics::record_datapath_error(&e);
                tracing::warn!(name = %r.name, error = %fqdnd_engine::error_chain(&e), "forgetting a revoked answer failed");
            }
        }
        if let Some(p) = &shared.persist
            && let Err(e) = p.forgotten(&forget)
        {
            tracing::warn!(error = %fqdnd_engine::error_chain(&e), "journaling a revocation failed");
        }
    }
}

/// The live answers the engine holds: per client group with a record of a name, the name's
/// addresses not expired, each with its expiry on the wall clock.
pub(super) fn held(shared: &Shared) -> Vec<Held> {
    let Ok(engine) = lock(&shared.engine, "engine") else {
        return Vec::new();
    };
    let names: HashMap<EndpointId, &str> = engine
        .ipcache
        .endpoints()
        .values()
        .map(|e| (e.id, e.name.as_str()))
        .collect();
    let now = shared.clock.now().as_secs();
    let mut out = Vec::new();
    for cached in engine.names.cached_names() {
        let addrs: Vec<_> = cached
            .ips()
            .filter(|e| u64::from(e.expires) > now)
            .map(|e| {
                let at = Duration::from_secs(e.expires.into());
                (e.addr, shared.clock.unix_ms_of(at))
            })
            .collect();
        if addrs.is_empty() {
            continue;
        }
        for endpoint in cached.endpoints() {
            if let Some(client) = names.get(&endpoint) {
                out.push(Held {
                    client: (*client).to_owned(),
                    name: cached.name.to_owned(),
                    addrs: addrs.clone(),
                });
            }
        }
    }
    out
}
