//! The proxy's periodic work: the timeout sweep (one timer for every in-flight table; an
//! expired query is answered per `on_upstream_timeout` and counts against its upstream's
//! health) and the health prober (`. NS` to dead and idle upstreams).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};

use super::{Outcome, Shared};
use crate::config::UpstreamTimeoutAction;
use crate::ids::IdSource;
use crate::querylog::QueryResult;
use crate::question::Question;
use crate::upstream::Origin;
use crate::upstream_socket::Inflight;
use crate::wire;

impl Shared {
    /// Every `upstream_timeout / 8` (5 ms..250 ms), takes the expired queries out of every
    /// in-flight table: one timer for the whole proxy, not one per query. A sweep that finds
    /// expired queries (or an expired probe) of a pooled upstream counts one failure against
    /// it, however many it finds: `health_check_failures` failures take that many sweeps with
    /// no good answer in between, so a burst of unanswered queries (a flood of names the
    /// upstream ignores, say) does not mark an upstream dead that answers everything else.
    pub(crate) async fn sweep_loop(self: Arc<Self>) {
        let period = (self.config.upstream_timeout / 8)
            .clamp(Duration::from_millis(5), Duration::from_millis(250));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut expired = Vec::new();
        let mut originals = Vec::new();
        let mut sockets = Vec::new();
        loop {
            tick.tick().await;
            let now = Instant::now();
            if let Some(cutoff) = now.checked_sub(self.config.upstream_timeout) {
                originals.clear();
                if let Some(table) = &self.originals {
                    table.snapshot(&mut originals);
                }
                // Only the pool is health-checked: an original destination has no alternative.
                let all = (self.upstreams.iter().map(|u| (u, true)))
                    .chain(originals.iter().map(|u| (u, false)));
                for (upstream, checked) in all {
                    sockets.clear();
                    upstream.all_sockets(&mut sockets);
                    for socket in &sockets {
                        socket.lock().expire(cutoff, &mut expired);
                        if socket.is_retired() {
                            // Its receiver closes it once its table is empty.
                            socket.drained.notify_one();
                        }
                    }
                    if checked && !expired.is_empty() {
                        upstream.on_failure(self.config.health_check_failures);
                    }
                    for (_, inflight) in expired.drain(..) {
                        match inflight.origin {
                            None => upstream.probing.store(false, Ordering::Relaxed),
                            Some(origin) => {
                                self.upstream_failed(
                                    origin,
                                    upstream.addr,
                                    &inflight.query,
                                    inflight.question,
                                )
                                .await;
                            }
                        }
                    }
                }
            }
            // The latency summaries' window moves on.
            self.metrics.latency.tick(now);
            #[allow(clippy::cast_precision_loss, reason = "a gauge")]
            self.metrics
                .inflight
                .set(self.inflight.load(Ordering::Relaxed) as f64);
        }
    }

    /// The upstream did not answer: SERVFAIL or nothing, as configured.
    pub(super) async fn upstream_failed(
        &self,
        origin: Origin,
        upstream: SocketAddr,
        query: &[u8],
        question: Question,
    ) {
        let Origin { reply, asked } = origin;
        let code = match self.config.on_upstream_timeout {
            UpstreamTimeoutAction::ServFail => {
                let code = self
                    .send_servfail(reply, &asked, query, question, QueryResult::UpstreamTimeout)
                    .await;
                Some(code.into())
            }
            UpstreamTimeoutAction::NoReply => None,
        };
        let outcome = Outcome {
            result: QueryResult::UpstreamTimeout,
            rcode: code,
            upstream: Some(upstream),
            hold: Duration::ZERO,
            addresses: None,
        };
        self.finish_admitted(&asked, outcome, None);
    }

    /// Every `health_check_interval`, probes each dead upstream, and each live one that has
    /// not answered for that long, with `. NS`.
    pub(crate) async fn health_loop(self: Arc<Self>) {
        let interval = self.config.health_check_interval;
        let mut tick = tokio::time::interval_at(Instant::now() + interval, interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        let mut ids = IdSource::new();
        let mut probe = Vec::with_capacity(17);
        let mut next_socket = 0usize;
        loop {
            tick.tick().await;
            let now = Instant::now();
            let now_ms = self.elapsed_ms(now);
            for upstream in &self.upstreams {
                let idle = now_ms.saturating_sub(upstream.last_answer_ms()) >= interval_ms;
                if upstream.is_alive() && !idle {
                    continue;
                }
                if upstream.probing.swap(true, Ordering::Relaxed) {
                    continue;
                }
                next_socket = next_socket.wrapping_add(1);
                let socket = upstream.socket(next_socket % upstream.slots());
                let reserved = {
                    let mut table = socket.lock();
                    table.insert(&mut ids).and_then(|slot| {
                        let question = wire::write_probe(&mut probe, slot.id())?;
                        slot.fill(Inflight {
                            query: probe.clone(),
                            question,
                            sent_name: Vec::new(),
                            sent: now,
                            origin: None,
                        });
                        Some(())
                    })
                };
                if reserved.is_none() {
                    upstream.probing.store(false, Ordering::Relaxed);
                    continue;
                }
                tracing::debug!(upstream = %upstream.addr, alive = upstream.is_alive(), "probing DNS upstream");
                // A probe that is not sent times out and counts as a failure.
                match (&upstream.encrypted, &socket.socket) {
                    (Some(encrypted), _) => encrypted.send(probe.clone()),
                    (None, Some(udp)) => {
                        let _ = udp.try_send(&probe);
                    }
                    (None, None) => {}
                }
            }
        }
    }
}
