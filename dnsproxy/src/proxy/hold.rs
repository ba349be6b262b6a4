//! The hold and the reply out: a validated answer is shown to the observer and released once
//! it is done, or gets the fallback (release anyway or SERVFAIL) when it fails or takes longer
//! than `response_max_delay`. Also the replies the proxy writes itself, over UDP (from the
//! listener, or from the original destination through the raw socket) and TCP.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use fqdnd_dnswire::Decoded;
use tokio::time::Instant;

use super::{Answer, Held, Outcome, Replies, Shared};
use crate::answer;
use crate::config::HoldFallback;
use crate::latency::Series;
use crate::metrics::HoldFailure;
use crate::observer::{Observation, ObserveError, ObserveFuture, ResponseContext};
use crate::querylog::QueryResult;
use crate::question::Question;
use crate::transparent;
use crate::udp::UdpSocket;
use crate::upstream::{Asked, Origin, ReplyTo};
use crate::wire::{self, rcode};

/// Sends a datagram, waiting for buffer space only if the socket is full.
async fn send_udp(socket: &UdpSocket, bytes: &[u8], to: SocketAddr) {
    match socket.try_send_to(bytes, to) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            if let Err(e) = socket.send_to(bytes, to).await {
                tracing::debug!(client = %to, error = %e, "DNS reply not sent");
            }
        }
        Err(e) => tracing::debug!(client = %to, error = %e, "DNS reply not sent"),
    }
}

impl Shared {
    /// Shows the answer (`raw`, decoded in `decoded`) to the observer; releases the reply at
    /// once if the observer is done, or returns the task that waits for it (at most
    /// `response_max_delay`).
    /// With `out`, a UDP reply through a listener socket is queued there (the caller sends the
    /// batch); otherwise it is sent at once.
    pub(super) async fn observe_and_reply(
        self: &Arc<Self>,
        answer: Answer,
        raw: &mut [u8],
        decoded: &Decoded,
        out: Option<&mut Replies>,
    ) -> Held {
        // Shown to the observer in a block of its own: what the future holds across its
        // awaits is then the answer and the awaited step only (see `release`).
        let (observation, started) = {
            let asked = &answer.origin.asked;
            let context = ResponseContext {
                client: asked.client,
                server: asked.server,
                upstream: answer.upstream,
                tag: asked.tag,
                name: &asked.name,
                response: decoded,
                bytes: raw,
                transport: asked.transport,
                answered: answer.answered,
            };
            let started = Instant::now();
            (self.observer.observe(&context), started)
        };
        match observation {
            Observation::Done(Ok(())) => {
                // One clock read ends the observation and the hold.
                let observed = Instant::now();
                self.metrics
                    .latency
                    .record(Series::Observer, observed - started);
                Held::Done(
                    self.release(answer, raw, QueryResult::Answered, out, observed)
                        .await,
                )
            }
            // Boxed: a rare path kept out of the common path's future (see `release`).
            Observation::Done(Err(e)) => {
                self.metrics
                    .latency
                    .record(Series::Observer, started.elapsed());
                Held::Done(
                    Box::pin(self.fallback(answer, raw, HoldFailure::ObserverError, Some(&e), out))
                        .await,
                )
            }
            Observation::Pending(future) => {
                let raw = raw.to_vec();
                Held::Pending(Box::pin(
                    self.clone().await_observation(answer, raw, started, future),
                ))
            }
        }
    }

    /// Waits for a pending observation, then releases the reply, or applies the fallback once
    /// `response_max_delay` has passed since the answer arrived. The observation itself is not
    /// cancelled: it runs to its end after the fallback.
    async fn await_observation(
        self: Arc<Self>,
        answer: Answer,
        mut raw: Vec<u8>,
        started: Instant,
        mut future: ObserveFuture,
    ) {
        let deadline = answer.answered + self.config.response_max_delay;
        tokio::select! {
            biased;
            result = &mut future => {
                let observed = Instant::now();
                self.metrics.latency.record(Series::Observer, observed - started);
                match result {
                    Ok(()) => self.release(answer, &mut raw, QueryResult::Answered, None, observed).await,
                    Err(e) => {
                        self.fallback(answer, &mut raw, HoldFailure::ObserverError, Some(&e), None).await
                    }
                };
            }
            () = tokio::time::sleep_until(deadline) => {
                let name = self.fallback(answer, &mut raw, HoldFailure::Timeout, None, None).await;
                let result = future.await;
                self.metrics.latency.record(Series::Observer, started.elapsed());
                if let Err(e) = result {
                    if self.warn_due(&self.observer_warned_ms, Instant::now()) {
                        tracing::warn!(%name, reason = %e, "DNS observer failed after the hold timed out (the fallback was applied then)");
                    } else {
                        tracing::debug!(%name, reason = %e, "DNS observer failed after the hold timed out (the fallback was applied then)");
                    }
                }
            }
        }
    }

    /// Sends the upstream's answer to the client with the client's ID (truncated for a UDP
    /// client whose payload size it exceeds); the query ends with `result` (`Answered`, or the
    /// hold failure when the fallback releases). Returns the query's name.
    async fn release(
        &self,
        answer: Answer,
        raw: &mut [u8],
        result: QueryResult,
        mut queue: Option<&mut Replies>,
        released: Instant,
    ) -> String {
        let Answer {
            origin: Origin { reply, asked },
            upstream,
            rcode: code,
            addresses,
            question,
            answered,
            cached,
        } = answer;
        if result == QueryResult::Answered
            && !cached
            && let Some(cache) = &self.cache
        {
            let key = question.cache_key(raw, &asked.name, asked.cache_flags, asked.tag);
            cache.insert(key, raw, upstream, answered);
        }
        match reply {
            ReplyTo::Udp { listener, server } => {
                let mut out = Vec::new();
                let reply = answer::fit_udp(
                    raw,
                    &mut out,
                    asked.client_id,
                    asked.udp_limit,
                    asked.opt,
                    question,
                    code,
                );
                self.tap_reply(&asked, reply, result);
                match queue.as_deref_mut() {
                    Some(queue) if !self.needs_raw(listener, server) => {
                        queue.push(listener, reply, asked.client);
                    }
                    // Boxed, as the fallback is: each answer's future holds the common
                    // path inline, and what is inline is copied at every step of it.
                    _ => {
                        Box::pin(self.send_udp_reply(listener, server, reply, asked.client)).await;
                    }
                }
            }
            ReplyTo::Tcp(tcp) => {
                let mut out = raw.to_vec();
                wire::set_id(&mut out, asked.client_id);
                self.tap_reply(&asked, &out, result);
                tcp.send(out);
            }
        }
        let hold = released.saturating_duration_since(answered);
        self.metrics.latency.record(Series::Hold, hold);
        let outcome = Outcome {
            result,
            rcode: Some(code),
            upstream: Some(upstream),
            hold,
            addresses: Some(addresses),
        };
        self.finish_admitted(&asked, outcome, queue.map(|q| &mut q.ended));
        asked.name
    }

    /// The observer timed out or failed (with `error`): release anyway or SERVFAIL, as
    /// configured. Either way the query ends as `hold_timeout` or `observer_failed`, and a
    /// warning says what happened and what was done. Returns the query's name.
    async fn fallback(
        &self,
        answer: Answer,
        raw: &mut [u8],
        failure: HoldFailure,
        error: Option<&ObserveError>,
        queue: Option<&mut Replies>,
    ) -> String {
        self.metrics.hold_failure(failure);
        let release = self.config.on_hold_timeout == HoldFallback::Release;
        self.log_fallback(&answer.origin.asked.name, failure, error, release);
        let result = match failure {
            HoldFailure::Timeout => QueryResult::HoldTimeout,
            HoldFailure::ObserverError => QueryResult::ObserverFailed,
        };
        if release {
            return self
                .release(answer, raw, result, queue, Instant::now())
                .await;
        }
        let Answer {
            origin: Origin { reply, asked },
            upstream,
            question,
            answered,
            ..
        } = answer;
        let code = self
            .send_servfail(reply, &asked, raw, question, result)
            .await;
        let hold = answered.elapsed();
        self.metrics.latency.record(Series::Hold, hold);
        let outcome = Outcome {
            result,
            rcode: Some(code.into()),
            upstream: Some(upstream),
            hold,
            addresses: None,
        };
        self.finish_admitted(&asked, outcome, None);
        asked.name
    }

    /// Warns that the observer failed or timed out on `name`, and what the reply is: at most
    /// every [`super::WARN_EVERY`] per kind of failure (a flood of failures would otherwise
    /// log one line per query; they are all counted), at debug level in between.
    fn log_fallback(
        &self,
        name: &str,
        failure: HoldFailure,
        error: Option<&ObserveError>,
        released: bool,
    ) {
        let action = if released {
            "released anyway (onHoldTimeout: release)"
        } else {
            "SERVFAIL (onHoldTimeout: servfail)"
        };
        let last = match failure {
            HoldFailure::Timeout => &self.hold_timeout_warned_ms,
            HoldFailure::ObserverError => &self.observer_warned_ms,
        };
        let warn = self.warn_due(last, Instant::now());
        let max_delay = self.config.response_max_delay;
        match (error, warn) {
            (Some(e), true) => tracing::warn!(name, reason = %e, action, "DNS observer failed"),
            (Some(e), false) => tracing::debug!(name, reason = %e, action, "DNS observer failed"),
            (None, true) => {
                tracing::warn!(
                    name,
                    ?max_delay,
                    action,
                    "DNS observer did not finish in time"
                );
            }
            (None, false) => {
                tracing::debug!(
                    name,
                    ?max_delay,
                    action,
                    "DNS observer did not finish in time"
                );
            }
        }
    }

    /// Answers the asker of `query` (`question` is its question) with SERVFAIL, question and OPT
    /// echoed; returns the code.
    pub(super) async fn send_servfail(
        &self,
        reply: ReplyTo,
        asked: &Asked,
        query: &[u8],
        question: Question,
        result: QueryResult,
    ) -> u8 {
        let mut out = Vec::with_capacity(question.end() + 11);
        let code = rcode::SERVFAIL;
        wire::write_header_reply(
            &mut out,
            query,
            asked.client_id,
            Some(question),
            code,
            false,
            asked.opt,
        );
        self.tap_reply(asked, &out, result);
        self.send_reply(reply, asked.client, &out).await;
        code
    }

    /// Sends a reply the proxy wrote itself.
    pub(crate) async fn send_reply(&self, reply: ReplyTo, client: SocketAddr, bytes: &[u8]) {
        match reply {
            ReplyTo::Udp { listener, server } => {
                self.send_udp_reply(listener, server, bytes, client).await;
            }
            ReplyTo::Tcp(tcp) => tcp.send(bytes.to_vec()),
        }
    }

    /// Whether a UDP reply to a query sent to `server` must leave through the raw socket: in
    /// transparent mode, when `server` is not listener `listener`'s bound address.
    pub(crate) fn needs_raw(&self, listener: usize, server: SocketAddr) -> bool {
        self.raw.is_some() && self.udp.get(listener).is_some_and(|l| l.local != server)
    }

    /// Sends a UDP reply so that it comes from `server`, the address the client sent its query
    /// to: through listener `listener` when that is its bound address, through the raw socket
    /// otherwise (transparent mode). A reply too big for the route's MTU on the raw path (the
    /// kernel does not fragment header-included packets) is sent again truncated, so the client
    /// retries over TCP.
    pub(crate) async fn send_udp_reply(
        &self,
        listener: usize,
        server: SocketAddr,
        bytes: &[u8],
        client: SocketAddr,
    ) {
        let listener_index = listener;
        let listener = &self.udp[listener];
        let Some(raw) = self
            .raw
            .as_ref()
            .filter(|_| self.needs_raw(listener_index, server))
        else {
            return send_udp(listener.sender(), bytes, client).await;
        };
        let mut sent = raw.send(server, client, bytes).await;
        if let Err(e) = &sent
            && transparent::is_too_big(e)
        {
            let mut out = Vec::new();
            wire::write_truncated(&mut out, bytes);
            sent = raw.send(server, client, &out).await;
        }
        match sent {
            Ok(()) => self.metrics.raw_replies.inc(),
            Err(e) => {
                self.metrics.raw_reply_errors.inc();
                tracing::debug!(%client, %server, error = %e, "DNS reply not sent through the raw socket");
            }
        }
    }
}
