//! The query's way in: parse, policy verdict, rate limit, then forwarding, or the reply the
//! proxy writes itself (FORMERR/NOTIMP, REFUSED/NXDOMAIN, SERVFAIL when it cannot forward),
//! or nothing (a runt shorter than a header, a response, a query over its rate limit).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::time::Instant;

use super::{Answer, Handled, Held, Outcome, Shared, Worker};
use crate::cache::{AnswerCache, Entry};
use crate::config::{RateLimitAction, RejectCode};
use crate::policy::{QueryInfo, Transport, Verdict};
use crate::query::{self, NotForwarded, ParsedQuery};
use crate::querylog::QueryResult;
use crate::question::Question;
use crate::record::Direction;
use crate::upstream::Origin;
use crate::upstream::{Asked, ReplyTo};
use crate::wire::{self, rcode};

impl Shared {
    /// Handles one query from a client that reached the proxy at `local`. `raw` is the
    /// client's message; it is rewritten in place (the ID only) when forwarded. `reply` is
    /// called only when the query is forwarded; replies leave from `local` (the callers' and
    /// `reply`'s business) even when the policy says the query was redirected from elsewhere.
    pub(crate) async fn handle_query(
        self: &Arc<Self>,
        w: &mut Worker,
        raw: &mut [u8],
        client: SocketAddr,
        local: SocketAddr,
        transport: Transport,
        reply: impl FnOnce() -> ReplyTo,
    ) -> Handled {
        let received = w.batch_received.unwrap_or_else(Instant::now);
        // A socket-level redirect: the query is about where the client was going.
        let (server, sender) = match self.policy.redirected(client, local, transport) {
            Some(r) => (r.server, Some(r.sender)),
            None => (local, None),
        };
        let parsed = match query::parse(raw, &mut w.name) {
            Ok(parsed) => parsed,
            Err(NotForwarded::Runt) => {
                self.metrics.runt_queries.inc();
                tracing::debug!(%client, ?transport, len = raw.len(), "DNS message shorter than a header dropped");
                return Handled::Runt;
            }
            Err(not_forwarded) => {
                self.tap(
                    Direction::Query,
                    client,
                    server,
                    transport,
                    raw,
                    (None, sender.is_some()),
                    "malformed",
                );
                let code = not_forwarded.write_reply(&mut w.scratch, raw);
                if code.is_some() {
                    let result = QueryResult::Malformed.as_str();
                    self.tap(
                        Direction::Reply,
                        client,
                        server,
                        transport,
                        &w.scratch,
                        (None, sender.is_some()),
                        result,
                    );
                }
                self.finish(
                    client,
                    transport,
                    "",
                    not_forwarded.qtype(),
                    received,
                    Outcome::local(QueryResult::Malformed, code),
                    None,
                );
                return match code {
                    Some(_) => Handled::Reply,
                    None => Handled::Dropped,
                };
            }
        };
        let ParsedQuery {
            client_id,
            opt,
            question,
            qtype,
            udp_limit,
        } = parsed;
        let info = QueryInfo {
            client,
            server,
            sender,
            name: &w.name,
            qtype,
            transport,
        };
        let verdict = self.policy.check(&info);
        let limited = verdict != Verdict::UnknownClient
            && self
                .rate_limit
                .as_ref()
                .is_some_and(|limit| !limit.allow(client.ip(), received));
        // Who asked, for the recording: the endpoint or group whose rules judged the query.
        let tag = match verdict {
            Verdict::Allow { tag } | Verdict::Deny { tag } => Some(tag),
            Verdict::UnknownClient => None,
        };
        let said = match verdict {
            _ if limited => "rate_limited",
            Verdict::Allow { .. } => "allow",
            Verdict::Deny { .. } => "deny",
            Verdict::UnknownClient => "unknown_client",
        };
        // Before `forward` rewrites the ID: the query as the client sent it.
        let who = (tag, sender.is_some());
        self.tap(Direction::Query, client, server, transport, raw, who, said);
        let (result, code) = if limited {
            if self.config.rate_limit_action == RateLimitAction::Drop {
                let outcome = Outcome::local(QueryResult::RateLimited, None);
                self.finish(
                    client,
                    transport,
                    &w.name,
                    Some(qtype),
                    received,
                    outcome,
                    None,
                );
                return Handled::Dropped;
            }
            (QueryResult::RateLimited, rcode::REFUSED)
        } else {
            match verdict {
                Verdict::Allow { tag } => {
                    let asked = Asked {
                        client,
                        server,
                        transport,
                        client_id,
                        // The worker gets a spare buffer back when the query is forwarded or
                        // answered.
                        name: std::mem::take(&mut w.name),
                        qtype,
                        tag,
                        redirected: sender.is_some(),
                        udp_limit,
                        opt,
                        cache_flags: crate::cache::key_flags(
                            raw,
                            opt.map(|o| o.dnssec_ok),
                            udp_limit,
                            transport,
                        ),
                        received,
                    };
                    if let Some(cache) = &self.cache {
                        let key =
                            question.cache_key(raw, &asked.name, asked.cache_flags, asked.tag);
                        if let Some(entry) = cache.lookup(&key, received) {
                            match self
                                .answer_from_cache(w, raw, question, asked, &entry, reply)
                                .await
                            {
                                Ok(handled) => return handled,
                                Err((asked, reply)) => {
                                    return self.forward(w, raw, question, asked, reply).await;
                                }
                            }
                        }
                    }
                    return self.forward(w, raw, question, asked, reply).await;
                }
                Verdict::Deny { .. } => (
                    QueryResult::Denied,
                    match self.config.reject_code {
                        RejectCode::Refused => rcode::REFUSED,
                        RejectCode::NxDomain => rcode::NXDOMAIN,
                    },
                ),
                Verdict::UnknownClient => (QueryResult::UnknownClient, rcode::REFUSED),
            }
        };
        wire::write_header_reply(
            &mut w.scratch,
            raw,
            client_id,
            Some(question),
            code,
            false,
            opt,
        );
        self.tap(
            Direction::Reply,
            client,
            server,
            transport,
            &w.scratch,
            who,
            result.as_str(),
        );
        self.finish(
            client,
            transport,
            &w.name,
            Some(qtype),
            received,
            Outcome::local(result, Some(code)),
            None,
        );
        Handled::Reply
    }

    /// Answers an allowed query from the cache: the entry is written as the reply (the
    /// client's ID and question, TTLs less its age), shown to the observer like an upstream
    /// answer (the engine learns its IPs with the remaining TTLs) and released once the
    /// observer is done, or per the hold fallback, exactly as an upstream answer. Over UDP the
    /// reply joins the batch's replies; a pending observation is held in a task of the worker.
    /// `Err` gives the query back (to be forwarded) if the entry cannot be served.
    async fn answer_from_cache<R: FnOnce() -> ReplyTo>(
        self: &Arc<Self>,
        w: &mut Worker,
        raw: &[u8],
        question: Question,
        asked: Asked,
        entry: &Entry,
        reply: R,
    ) -> Result<Handled, (Asked, R)> {
        let now = Instant::now();
        let mut bytes = std::mem::take(&mut w.cached);
        let mut decoder = std::mem::take(&mut w.decoder);
        let served =
            AnswerCache::serve(entry, now, question.bytes(raw), asked.client_id, &mut bytes);
        let decoded = served.then(|| decoder.decode_whole(&bytes).ok()).flatten();
        let Some((decoded, answer_question)) = decoded.zip(Question::parse(&bytes)) else {
            w.cached = bytes;
            w.decoder = decoder;
            return Err((asked, reply));
        };
        // Ended by `finish_admitted` like a forwarded query.
        self.inflight
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let answer = Answer {
            origin: Origin {
                reply: reply(),
                asked,
            },
            upstream: entry.upstream,
            rcode: decoded.rcode,
            addresses: super::addresses(decoded),
            question: answer_question,
            answered: now,
            cached: true,
        };
        let queue = w.reply_queue();
        match self
            .observe_and_reply(answer, &mut bytes, decoded, queue)
            .await
        {
            Held::Done(name) => w.name = name,
            Held::Pending(pending) if w.batching => {
                w.pending.spawn(pending);
            }
            Held::Pending(pending) => {
                // A TCP connection's reader may end before the hold does: the hold must not
                // end with it.
                tokio::spawn(pending);
            }
        }
        w.cached = bytes;
        w.decoder = decoder;
        Ok(Handled::Forwarded)
    }

    /// SERVFAIL (or REFUSED) for an allowed query that cannot be forwarded.
    pub(super) fn refuse_admitted(
        &self,
        w: &mut Worker,
        raw: &[u8],
        question: Question,
        asked: Asked,
        result: QueryResult,
        code: u8,
    ) -> Handled {
        wire::write_header_reply(
            &mut w.scratch,
            raw,
            asked.client_id,
            Some(question),
            code,
            false,
            asked.opt,
        );
        self.tap_reply(&asked, &w.scratch, result);
        self.finish(
            asked.client,
            asked.transport,
            &asked.name,
            Some(asked.qtype),
            asked.received,
            Outcome::local(result, Some(code)),
            None,
        );
        // The name's buffer serves the worker's next query.
        w.name = asked.name;
        Handled::Reply
    }
}
