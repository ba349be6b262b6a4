//! What the two daemon modes (gateway, node) share: the DNS proxy's settings from the
//! `Daemon` options, and the background tasks every daemon runs (metrics sampling, the admin
//! API, SIGHUP reloads).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use fqdnd_config::{Daemon, Settings};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::admin::{self, AdminState};
use crate::gateway::observer::SharedEngine;
use crate::state::Persist;

/// The proxy settings both modes take from `Settings` and their `Daemon` options; the caller
/// fills in listen addresses, upstreams and the transparent mode.
pub(crate) fn proxy_config(settings: &Settings, daemon: &Daemon) -> fqdnd_dnsproxy::Config {
    fqdnd_dnsproxy::Config {
        upstream_timeout: daemon.upstream_timeout,
        on_upstream_timeout: daemon.on_upstream_timeout,
        response_max_delay: settings.proxy_response_max_delay,
        on_hold_timeout: daemon.on_hold_timeout,
        on_truncated: daemon.on_truncated,
        randomize_case: daemon.randomize_case,
        reject_code: settings.reject_response_code,
        concurrency_limit: settings.concurrency_limit,
        rate_limit_qps: daemon.rate_limit.map_or(0, |r| r.qps),
        rate_limit_burst: daemon.rate_limit.map_or(0, |r| r.burst),
        rate_limit_clients: daemon.rate_limit.map_or(65_536, |r| r.clients),
        rate_limit_action: daemon.rate_limit.map(|r| r.action).unwrap_or_default(),
        ..fqdnd_dnsproxy::Config::default()
    }
}

/// Reads the conntrack map's occupancy: (entries, capacity).
pub(crate) type ConntrackProbe = Box<dyn Fn() -> Result<(usize, u32)> + Send + Sync>;

/// How many metric ticks (seconds) between two walks of the conntrack map.
const CONNTRACK_SAMPLE_TICKS: u64 = 10;

/// Samples the engine's and the journal's state into metrics once a second, and the conntrack
/// map's occupancy every 10 s (a walk of the whole map).
pub(crate) fn spawn_metrics(
    tasks: &mut JoinSet<Result<()>>,
    stopped: &watch::Receiver<bool>,
    engine: &SharedEngine,
    persist: Option<&Arc<Persist>>,
    conntrack: Option<ConntrackProbe>,
) {
    let engine = Arc::clone(engine);
    let persist = persist.cloned();
    let mut stopped = stopped.clone();
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut ticks: u64 = 0;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    crate::metrics::record_engine(&engine);
                    if let Some(p) = &persist {
                        p.record_metrics();
                    }
                    if let Some(probe) = &conntrack
                        && ticks.is_multiple_of(CONNTRACK_SAMPLE_TICKS)
                    {
                        match probe() {
                            Ok((entries, capacity)) => crate::metrics::record_conntrack(entries, capacity),
                            Err(e) => tracing::debug!(error = %format!("{e:#}"), "reading conntrack occupancy failed"),
                        }
                    }
                    ticks += 1;
                }
                _ = stopped.changed() => return Ok(()),
            }
        }
    });
}

/// Serves the admin API on `socket` (mode 0600) and reloads the policy on SIGHUP.
pub(crate) fn spawn_admin(
    tasks: &mut JoinSet<Result<()>>,
    stopped: &watch::Receiver<bool>,
    state: &Arc<AdminState>,
    socket: &Path,
) -> Result<()> {
    let listener = admin::bind(socket)?;
    {
        let state = Arc::clone(state);
        let mut stopped = stopped.clone();
        tasks.spawn(async move {
            admin::serve(listener, state, async move {
                let _ = stopped.changed().await;
            })
            .await
        });
    }
    let state = Arc::clone(state);
    let mut stopped = stopped.clone();
    tasks.spawn(async move {
        let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("installing the SIGHUP handler")?;
        loop {
            tokio::select! {
                _ = hangup.recv() => {
                    tracing::info!("SIGHUP: reloading policy");
                    let _ = admin::reload(&state);
                }
                _ = stopped.changed() => return Ok(()),
            }
        }
    });
    Ok(())
}
