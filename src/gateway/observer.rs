//! The engine as the proxy's [`ResponseObserver`]: every allowed answer is learned
//! (NameManager → IpCache → datapath) before the proxy releases it.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use fqdnd_dnsproxy::{Observation, ObserveError, ResponseContext, ResponseObserver};
use fqdnd_ipcache::{EndpointId, MemoryDatapath};
use fqdnd_namemgr::{Answer, Record, RecordData};
use hickory_proto::rr::RData;

use crate::clock::Clock;
use crate::engine::Engine;

/// The engine, shared between the proxy's observer, the GC task and the admin API. Each
/// holder locks it briefly (one answer, one GC pass, one listing).
pub(crate) type SharedEngine = Arc<Mutex<Engine<MemoryDatapath>>>;

/// Learns answers into the engine.
pub(crate) struct EngineObserver {
    pub(crate) engine: SharedEngine,
    pub(crate) clock: Clock,
}

/// The records of an answer section that the NameManager learns from.
pub(crate) fn answer_records(response: &hickory_proto::op::Message) -> Vec<Record> {
    response
        .answers
        .iter()
        .filter_map(|rr| {
            let data = match &rr.data {
                RData::A(a) => RecordData::Addr(IpAddr::V4(a.0)),
                RData::AAAA(a) => RecordData::Addr(IpAddr::V6(a.0)),
                RData::CNAME(c) => RecordData::Cname(c.0.to_ascii()),
                _ => return None,
            };
            Some(Record {
                owner: rr.name.to_ascii(),
                ttl: rr.ttl,
                data,
            })
        })
        .collect()
}

impl ResponseObserver for EngineObserver {
    fn observe(&self, ctx: &ResponseContext<'_>) -> Observation {
        let records = answer_records(ctx.response);
        if !records
            .iter()
            .any(|r| matches!(r.data, RecordData::Addr(_)))
        {
            // NXDOMAIN, NODATA, or no address at all: nothing to learn.
            return Observation::Done(Ok(()));
        }
        let answer = match Answer::from_records(ctx.name, &records) {
            Ok(answer) => answer,
            Err(e) => {
                return Observation::Done(Err(ObserveError {
                    reason: e.to_string(),
                }));
            }
        };
        let endpoint = EndpointId(u16::try_from(ctx.tag).unwrap_or(u16::MAX));
        let Ok(mut engine) = self.engine.lock() else {
            return Observation::Done(Err(ObserveError {
                reason: "engine lock poisoned".into(),
            }));
        };
        match engine.observe(endpoint, &answer, self.clock.now()) {
            Ok(_) => Observation::Done(Ok(())),
            Err(e) => Observation::Done(Err(ObserveError {
                reason: format!("{e:#}"),
            })),
        }
    }
}
