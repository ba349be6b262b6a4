//! The engine as the proxy's [`ResponseObserver`]: every allowed answer is learned
//! (NameManager → IpCache → datapath) before the proxy releases it.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use fqdnd_dnsproxy::{Observation, ObserveError, ResponseContext, ResponseObserver};
use fqdnd_ipcache::EndpointId;
use fqdnd_namemgr::{Answer, Learned, Record, RecordData};
use hickory_proto::rr::RData;
use smallvec::SmallVec;

use crate::clock::Clock;
use crate::datapath::AnyDatapath;
use crate::engine::Engine;
use crate::state::Persist;
use fqdnd_checkpoint::{Ack, Seq};

/// The engine, shared between the proxy's observer, the GC task and the admin API. Each
/// holder locks it briefly (one answer, one GC pass, one listing).
pub(crate) type SharedEngine = Arc<Mutex<Engine<AnyDatapath>>>;

/// Learns answers into the engine and, with a state directory, makes what they taught
/// durable before the reply is released.
pub(crate) struct EngineObserver {
    pub(crate) engine: SharedEngine,
    pub(crate) clock: Clock,
    pub(crate) persist: Option<Arc<Persist>>,
}

/// Waits for the journal's acknowledgements: the observation is done once they are durable.
fn durable(acks: Vec<Ack<Seq>>) -> Observation {
    if acks.is_empty() {
        return Observation::Done(Ok(()));
    }
    Observation::Pending(Box::pin(async move {
        for ack in acks {
            ack.await.map_err(|e| {
                metrics::counter!("fqdnd_checkpoint_errors_total").increment(1);
                tracing::error!(error = %e, "journal write failed: the answer is not durable, the reply gets the hold fallback");
                ObserveError {
                    reason: format!("journal: {e}"),
                }
            })?;
        }
        Ok(())
    }))
}

fn failed(e: &anyhow::Error) -> Observation {
    crate::metrics::record_datapath_error(e);
    Observation::Done(Err(ObserveError {
        reason: format!("{e:#}"),
    }))
}

/// Fail closed: an answer some of whose addresses the engine did not learn (a circuit breaker,
/// the name's IP cap, a full datapath map) is not released as allowed — the datapath would
/// not know those addresses. The reply gets the hold fallback (`onHoldTimeout`: SERVFAIL, or
/// released anyway with `release`); what was learned stays learned (and journaled).
fn incomplete(learned: &Learned, total: usize) -> Option<ObserveError> {
    let missing = learned.rejected + learned.capped;
    (missing > 0).then(|| ObserveError {
        reason: format!(
            "{missing} of the answer's {total} addresses were not learned (circuit breaker, IP \
             cap or full datapath map): failing closed"
        ),
    })
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

/// The addresses and minimum TTL of an answer whose records all belong to the question (no
/// CNAME): the common case, read without allocating. `None` when the answer needs the chain
/// walk of [`Answer::from_records`].
fn direct_answer(response: &hickory_proto::op::Message) -> Option<(SmallVec<[IpAddr; 8]>, u32)> {
    let question = &response.queries.first()?.name;
    let mut addrs = SmallVec::new();
    let mut ttl = u32::MAX;
    for rr in &response.answers {
        let addr = match &rr.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            RData::CNAME(_) => return None,
            _ => continue,
        };
        if rr.name != *question {
            return None;
        }
        if !addrs.contains(&addr) {
            addrs.push(addr);
        }
        ttl = ttl.min(rr.ttl);
    }
    Some((addrs, ttl))
}

impl ResponseObserver for EngineObserver {
    fn observe(&self, ctx: &ResponseContext<'_>) -> Observation {
        let endpoint = EndpointId(u16::try_from(ctx.tag).unwrap_or(u16::MAX));
        if let Some((addrs, ttl)) = direct_answer(ctx.response) {
            if addrs.is_empty() {
                return Observation::Done(Ok(()));
            }
            let Ok(mut engine) = self.engine.lock() else {
                return Observation::Done(Err(ObserveError {
                    reason: "engine lock poisoned".into(),
                }));
            };
            return match engine.observe_parts(endpoint, ctx.name, &addrs, ttl, self.clock.now()) {
                Ok(learned) => {
                    let acks = match &self.persist {
                        None => Vec::new(),
                        Some(p) => {
                            match p.answer(&engine, endpoint, ctx.name, &addrs, ttl, &learned) {
                                Ok(acks) => acks,
                                Err(e) => return failed(&e),
                            }
                        }
                    };
                    drop(engine);
                    match incomplete(&learned, addrs.len()) {
                        Some(err) => Observation::Done(Err(err)),
                        None => durable(acks),
                    }
                }
                Err(e) => failed(&e),
            };
        }
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
        let Ok(mut engine) = self.engine.lock() else {
            return Observation::Done(Err(ObserveError {
                reason: "engine lock poisoned".into(),
            }));
        };
        match engine.observe(endpoint, &answer, self.clock.now()) {
            Ok(learned) => {
                let acks = match &self.persist {
                    None => Vec::new(),
                    Some(p) => match p.answer(
                        &engine,
                        endpoint,
                        &answer.name,
                        &answer.addrs,
                        answer.ttl,
                        &learned,
                    ) {
                        Ok(acks) => acks,
                        Err(e) => return failed(&e),
                    },
                };
                drop(engine);
                match incomplete(&learned, answer.addrs.len()) {
                    Some(err) => Observation::Done(Err(err)),
                    None => durable(acks),
                }
            }
            Err(e) => failed(&e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::rdata::{A, CNAME};
    use hickory_proto::rr::{Name, Record, RecordType};

    fn response(records: Vec<Record>) -> Message {
        let mut m = Message::new(1, MessageType::Response, OpCode::Query);
        m.queries.push(Query::query(
            Name::from_ascii("www.example.test.").unwrap(),
            RecordType::A,
        ));
        m.answers = records;
        m
    }

    fn a(owner: &str, ttl: u32, ip: [u8; 4]) -> Record {
        Record::from_rdata(
            Name::from_ascii(owner).unwrap(),
            ttl,
            RData::A(A::new(ip[0], ip[1], ip[2], ip[3])),
        )
    }

    #[test]
    fn plain_answers_are_read_directly_and_chains_are_not() {
        let plain = response(vec![
            a("WWW.example.test.", 60, [192, 0, 2, 1]),
            a("www.example.test.", 30, [192, 0, 2, 2]),
        ]);
        let (addrs, ttl) = direct_answer(&plain).unwrap();
        assert_eq!(addrs.len(), 2);
        assert_eq!(ttl, 30);
        let cname = Record::from_rdata(
            Name::from_ascii("www.example.test.").unwrap(),
            60,
            RData::CNAME(CNAME(Name::from_ascii("edge.example.test.").unwrap())),
        );
        assert!(
            direct_answer(&response(vec![
                cname,
                a("edge.example.test.", 60, [192, 0, 2, 3])
            ]))
            .is_none()
        );
        // A record for another name goes the strict way (and is rejected there).
        assert!(
            direct_answer(&response(vec![a("bank.example.test.", 60, [192, 0, 2, 9])])).is_none()
        );
        let (none, _) = direct_answer(&response(vec![])).unwrap();
        assert!(none.is_empty());
    }
}
