//! Forwarding an admitted query: the concurrency limit, the upstream (pool round robin or the
//! original destination), a socket of it (rotated first when due) and a random free ID on
//! it, then the send.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::{Handled, Shared, Worker};
use crate::case;
use crate::ids::IdSource;
use crate::querylog::QueryResult;
use crate::question::Question;
use crate::shards::Job;
use crate::upstream::{Asked, OpenError, Origin, ReplyTo, Upstream};
use crate::upstream_socket::{Inflight, UpstreamSocket};
use crate::wire::{self, rcode};

/// Why a query was not placed on a socket.
enum NotPlaced {
    /// Every ID of it is in flight.
    Full,
    /// Closed (retired and drained): its slot holds another socket now.
    Closed,
}
use NotPlaced::{Closed, Full};

/// Where an admitted query was placed.
enum Placed {
    /// In the batch's queue of the socket it queued to already for that slot.
    Queued,
    /// On the socket of slot `si`, reserved from the slot, to queue or send.
    Reserved(Arc<UpstreamSocket>, usize),
}

/// Where an allowed query is forwarded.
enum Target {
    /// The pooled upstream with this index.
    Pool(usize),
    /// Its original destination.
    Original(Arc<Upstream>),
}

impl Shared {
    /// Admits an allowed query and sends it to an upstream.
    pub(super) async fn forward(
        self: &Arc<Self>,
        w: &mut Worker,
        raw: &mut [u8],
        question: Question,
        asked: Asked,
        reply: impl FnOnce() -> ReplyTo,
    ) -> Handled {
        let limit = self.config.concurrency_limit;
        let before = self.inflight.fetch_add(1, Ordering::Relaxed);
        if limit != 0 && before >= limit {
            self.inflight.fetch_sub(1, Ordering::Relaxed);
            self.metrics.concurrency_limited.inc();
            return self.refuse_admitted(
                w,
                raw,
                question,
                asked,
                QueryResult::ConcurrencyLimited,
                rcode::SERVFAIL,
            );
        }
        let original;
        let target = self
            .originals
            .as_ref()
            .and_then(|_| {
                self.policy
                    .forward_to(asked.client, asked.server, asked.transport)
            })
            .unwrap_or(asked.server);
        let pool = self.pools.for_name(question.name(raw));
        let mut pooled = None;
        let upstream: &Arc<Upstream> = match self.upstream_for(w, target, pool) {
            Ok(Target::Pool(ui)) => {
                pooled = Some(ui);
                &self.upstreams[ui]
            }
            Ok(Target::Original(upstream)) => {
                original = upstream;
                &original
            }
            Err(code) => {
                self.inflight.fetch_sub(1, Ordering::Relaxed);
                return self.refuse_admitted(
                    w,
                    raw,
                    question,
                    asked,
                    QueryResult::NoUpstream,
                    code,
                );
            }
        };
        let sent = asked.received;
        let mut origin = Some(Origin {
            reply: reply(),
            asked,
        });
        let mut order = w.slot_order(upstream.slots());
        if !w.batching {
            w.next_socket = w.next_socket.wrapping_add(1);
        }
        let chosen = order.find_map(|si| {
            // A slot this batch sent to already (pooled UDP upstreams): its socket as queued.
            if let Some(k) = pooled
                .filter(|_| w.batching)
                .and_then(|ui| w.queued_socket(ui, si, sent))
            {
                let Worker {
                    ids, name, queries, ..
                } = &mut *w;
                let queued = &mut queries[k];
                match self.place(ids, name, &queued.socket, raw, question, sent, &mut origin) {
                    Ok(()) => {
                        queued.queue.push(raw, None);
                        return Some(Placed::Queued);
                    }
                    Err(Full) => return None,
                    // Replaced and drained meanwhile: the slot's socket now.
                    Err(Closed) => {}
                }
            }
            self.reserve(w, upstream, si, raw, question, sent, &mut origin)
                .map(|socket| Placed::Reserved(socket, si))
        });
        let Some(chosen) = chosen else {
            // Every socket of the upstream holds its maximum: refuse like the concurrency limit.
            self.inflight.fetch_sub(1, Ordering::Relaxed);
            self.metrics.concurrency_limited.inc();
            let Some(Origin { asked, .. }) = origin else {
                return Handled::Dropped;
            };
            return self.refuse_admitted(
                w,
                raw,
                question,
                asked,
                QueryResult::ConcurrencyLimited,
                rcode::SERVFAIL,
            );
        };
        let Placed::Reserved(socket, si) = chosen else {
            return Handled::Forwarded;
        };
        if let Some(encrypted) = &upstream.encrypted {
            encrypted.send(raw.to_vec());
            return Handled::Forwarded;
        }
        if w.batching {
            w.queue_query(&socket, pooled.map(|ui| (ui, si)), raw);
            return Handled::Forwarded;
        }
        // Every socket but an encrypted upstream's (sent above) has its UDP socket.
        let Some(socket) = &socket.socket else {
            return Handled::Forwarded;
        };
        match socket.try_send(raw) {
            Ok(_) => {}
            // Boxed: a rare wait kept out of the future every query's way goes through.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if let Err(e) = Box::pin(socket.send(raw)).await {
                    tracing::debug!(upstream = %upstream.addr, error = %e, "query not sent; it will time out");
                }
            }
            // A pending ICMP error from an earlier datagram is reported once: send again.
            Err(_) => {
                if let Err(e) = socket.try_send(raw) {
                    tracing::debug!(upstream = %upstream.addr, error = %e, "query not sent; it will time out");
                }
            }
        }
        Handled::Forwarded
    }

    /// Reserves a random free ID for the query on the socket of slot `si` (rotated first if it
    /// is due), writes it into `raw` and records the query in flight; with `randomize_case`
    /// the name's case in `raw` is then randomised (the table keeps the client's bytes).
    /// `None` if that socket is full.
    #[allow(
        clippy::too_many_arguments,
        reason = "the query's parts, passed through once"
    )]
    fn reserve(
        self: &Arc<Self>,
        w: &mut Worker,
        upstream: &Arc<Upstream>,
        si: usize,
        raw: &mut [u8],
        question: Question,
        sent: Instant,
        origin: &mut Option<Origin>,
    ) -> Option<Arc<UpstreamSocket>> {
        // A closed socket was replaced in its slot before its receiver closed it: reading the
        // slot again gives the new one.
        for _ in 0..4 {
            let socket = self.current_socket(upstream, si, sent);
            match self.place(
                &mut w.ids,
                &mut w.name,
                &socket,
                raw,
                question,
                sent,
                origin,
            ) {
                Ok(()) => return Some(socket),
                Err(Full) => return None,
                Err(Closed) => {}
            }
        }
        None
    }

    /// Under `socket`'s table lock: a random free ID for the query, written into `raw`, and
    /// the query recorded in flight (`origin` taken); with `randomize_case` the name's case
    /// in `raw` is then randomised (the table keeps the client's bytes). `name`, the worker's
    /// name buffer that the query took along, gets a spare one.
    #[allow(
        clippy::too_many_arguments,
        reason = "the query's parts and the worker's buffers, passed through once"
    )]
    fn place(
        &self,
        ids: &mut IdSource,
        name: &mut String,
        socket: &UpstreamSocket,
        raw: &mut [u8],
        question: Question,
        sent: Instant,
        origin: &mut Option<Origin>,
    ) -> Result<(), NotPlaced> {
        let mut table = socket.lock();
        if table.is_closed() {
            return Err(Closed);
        }
        let mut slot = table.insert(ids).ok_or(Full)?;
        wire::set_id(raw, slot.id());
        // Buffers of earlier queries on this socket: no allocation once warm.
        let (mut query, mut sent_name, spare_name) = {
            let spare = slot.spare();
            (spare.bytes(), spare.bytes(), spare.name())
        };
        *name = spare_name;
        query.extend_from_slice(raw);
        if self.config.randomize_case {
            case::randomize(raw, question, ids, &mut sent_name);
        }
        slot.fill(Inflight {
            query,
            question,
            sent_name,
            sent,
            origin: origin.take(),
        });
        socket.count_query(&table);
        Ok(())
    }

    /// The socket of slot `si`, replaced first by one on a fresh port if it has carried
    /// `upstream_socket_max_queries` or is older than `upstream_socket_max_age`. If the new
    /// socket cannot be opened (no file descriptor left, …) the old one goes on serving: the
    /// failure is counted and logged at most every [`WARN_EVERY`].
    fn current_socket(
        self: &Arc<Self>,
        upstream: &Arc<Upstream>,
        si: usize,
        now: Instant,
    ) -> Arc<UpstreamSocket> {
        let socket = upstream.socket(si);
        if !socket.is_due(now) {
            return socket;
        }
        match upstream.rotate(si, &socket, now) {
            Ok(Some(fresh)) => {
                self.metrics.upstream_socket_rotations.inc();
                tracing::debug!(upstream = %upstream.addr, old_port = socket.port, new_port = fresh.port, "DNS upstream socket rotated");
                // Straight to the shard thread that reads slot `si` (this one, often), so
                // the answers to the next queries are read at once; without shards, to
                // `run`. Nobody listens once the proxy stopped; nothing is received then,
                // as for the others.
                let job = Job::Upstream(self.clone(), upstream.clone(), fresh.clone());
                if let Err(Job::Upstream(_, upstream, socket)) = self.shards.submit(si, job) {
                    let _ = self.new_sockets.send((upstream, socket, si));
                }
                fresh
            }
            Ok(None) => upstream.socket(si),
            Err(e) => {
                self.metrics.upstream_socket_rotation_failures.inc();
                if self.warn_due(&self.rotation_warned_ms, now) {
                    tracing::warn!(upstream = %upstream.addr, port = socket.port, error = %e, "cannot open a new DNS upstream socket; the old one stays in use");
                }
                socket
            }
        }
    }

    /// Where a query to `server` goes: its original destination when that is not one of the
    /// proxy's own addresses and `forward_to_original_destination` is set, `pool` (its name's
    /// zone's, or the default) otherwise.
    /// `Err` carries the reply code when it cannot go anywhere: REFUSED for a query to the
    /// proxy itself with no pool (never a loop to ourselves), SERVFAIL when no pooled upstream
    /// is alive or no more original destinations may be opened.
    fn upstream_for(
        &self,
        w: &mut Worker,
        server: SocketAddr,
        pool: std::ops::Range<usize>,
    ) -> Result<Target, u8> {
        if let Some(originals) = &self.originals
            && !self.is_own(server)
        {
            return match originals.get_or_open(server) {
                Ok(upstream) => Ok(Target::Original(upstream)),
                Err(OpenError::Full) => {
                    self.metrics.original_destination_overflow.inc();
                    tracing::debug!(upstream = %server, max = self.config.max_original_destinations, "original destination not forwarded to: too many open");
                    Err(rcode::SERVFAIL)
                }
                Err(OpenError::Socket(e)) => {
                    tracing::warn!(error = %e, "original destination not forwarded to");
                    Err(rcode::SERVFAIL)
                }
            };
        }
        if pool.is_empty() {
            return Err(rcode::REFUSED);
        }
        self.pick_upstream(w, pool)
            .map(Target::Pool)
            .ok_or(rcode::SERVFAIL)
    }

    /// Whether `addr` is one of the proxy's listen addresses (a wildcard one owns its port).
    pub(crate) fn is_own(&self, addr: SocketAddr) -> bool {
        self.own.iter().any(|own| {
            *own == addr
                || (own.ip().is_unspecified()
                    && own.port() == addr.port()
                    && own.is_ipv4() == addr.is_ipv4())
        })
    }

    /// Round robin over the live upstreams of `pool`, starting one further on each call (per
    /// task, so tasks share no counter).
    fn pick_upstream(&self, w: &mut Worker, pool: std::ops::Range<usize>) -> Option<usize> {
        let n = pool.len();
        if n == 0 {
            return None;
        }
        let start = w.next_upstream % n;
        w.next_upstream = w.next_upstream.wrapping_add(1);
        (0..n)
            .map(|k| pool.start + (start + k) % n)
            .find(|&i| self.upstreams[i].is_alive())
    }
}
