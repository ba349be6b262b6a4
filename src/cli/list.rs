//! The commands that read the running gateway through its admin API.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use fqdnd_engine::view::{CacheRow, IdentityRow, IpcacheRow};

use crate::cli::Target;
use fqdnd_daemon::admin::client::{get, post, post_json};
use fqdnd_daemon::admin::{ForgetOutcome, ForgetRequest, Reload, Status};

/// `fqdnd status`.
pub(crate) fn status(target: &Target, json: bool) -> Result<ExitCode> {
    let (body, s): (_, Status) = get(&target.socket()?, "/v1/status")?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{body}")?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "version:          {}", s.version)?;
    writeln!(out, "mode:             {}", s.mode)?;
    writeln!(out, "uptime:           {}s", s.uptime_seconds)?;
    writeln!(out, "config:           {}", s.config.join(", "))?;
    writeln!(out, "listening on:     {}", s.listen.join(", "))?;
    if !s.encrypted.is_empty() {
        writeln!(out, "encrypted DNS:    {}", s.encrypted.join(", "))?;
    }
    for u in &s.upstreams {
        let rtt = u
            .rtt_us
            .map_or_else(|| "-".to_owned(), |r| format!("{r} µs"));
        writeln!(
            out,
            "upstream:         {} {} (failures {}, rtt {rtt})",
            u.addr,
            if u.alive { "up" } else { "DOWN" },
            u.failures
        )?;
    }
    let queries: Vec<String> = s.queries.iter().map(|(k, v)| format!("{k} {v}")).collect();
    writeln!(out, "queries:          {}", queries.join(", "))?;
    writeln!(
        out,
        "dns cache:        {} names, {} entries, {} zombies",
        s.cache_names, s.cache_entries, s.cache_zombies
    )?;
    match &s.answer_cache {
        Some(c) => writeln!(
            out,
            "answer cache:     {}/{} entries, {} hits, {} misses, {} inserts, {} evictions, {} expired",
            c.entries, c.capacity, c.hits, c.misses, c.inserts, c.evictions, c.expired
        )?,
        None => writeln!(out, "answer cache:     off")?,
    }
    writeln!(
        out,
        "identities:       {} ({} created by DNS answers)",
        s.identities, s.fqdn_identities
    )?;
    writeln!(out, "ipcache:          {} prefixes", s.ipcache_prefixes)?;
    writeln!(out, "breaker trips:    {}", s.breaker_trips)?;
    writeln!(
        out,
        "lists:            {} deny patterns, {} allow patterns",
        s.deny_list_patterns, s.allow_list_patterns
    )?;
    writeln!(
        out,
        "reloads:          {} ({} rejected)",
        s.reloads.reloads, s.reloads.failed
    )?;
    for e in &s.reloads.last_errors {
        writeln!(out, "  last rejected:  {e}")?;
    }
    if let Some(c) = &s.cluster {
        writeln!(
            out,
            "cluster:          node {} on {} (prefix {})",
            c.node,
            c.endpoints.join(","),
            c.prefix
        )?;
        writeln!(
            out,
            "  etcd:           {} for {}s (revision {}, {} resyncs){}",
            if c.connected {
                "connected"
            } else {
                "UNREACHABLE"
            },
            c.state_seconds,
            c.revision,
            c.resyncs,
            c.last_error
                .as_ref()
                .map(|e| format!(", last error: {e}"))
                .unwrap_or_default()
        )?;
        writeln!(
            out,
            "  allocator:      {}",
            match (&c.leader, &c.ha) {
                (Some(leader), _) => leader.as_str(),
                (None, Some(_)) => "none (not needed by an HA gateway pair)",
                (None, None) => "no leader",
            }
        )?;
        writeln!(
            out,
            "  known:          {} identities, {} remote endpoints, {} other nodes, {} shared policies; {} endpoints published",
            c.identities, c.remote_endpoints, c.remote_nodes, c.shared_policies, c.published
        )?;
        writeln!(
            out,
            "  temporary:      {} pending",
            c.temporary_identities.len()
        )?;
        for (id, labels) in &c.temporary_identities {
            writeln!(out, "    {id:#010x} {labels}")?;
        }
        if !c.shared_policy_known {
            writeln!(
                out,
                "  shared policy:  NOT KNOWN YET (etcd not read since start): every endpoint in default deny"
            )?;
        }
        for e in &c.shared_policy_errors {
            writeln!(out, "  shared policy refused: {e}")?;
        }
        if !c.rejected.is_empty() {
            let rejected: Vec<String> =
                c.rejected.iter().map(|(k, n)| format!("{k} {n}")).collect();
            writeln!(
                out,
                "  refused records: {} (not applied; see the log for each key)",
                rejected.join(", ")
            )?;
        }
        if let Some(h) = &c.ha {
            writeln!(
                out,
                "  HA group:       {} (publishing {}, importing {}, imported before serving: {})",
                h.group,
                if h.publishing { "ok" } else { "FAILING" },
                if h.importing { "ok" } else { "NOT RUNNING" },
                if h.initial_import_done { "yes" } else { "no" },
            )?;
            writeln!(
                out,
                "    published:    {} records in {} transactions, {} pending, {} dropped; lag {} ms (max {} ms)",
                h.published,
                h.transactions,
                h.pending,
                h.dropped,
                h.publish_lag_ms,
                h.publish_lag_max_ms
            )?;
            writeln!(
                out,
                "    imported:     {} records ({} refused here); lag {} ms (max {} ms); at start {} records in {} ms",
                h.imported,
                h.import_refused,
                h.import_lag_ms,
                h.import_lag_max_ms,
                h.startup_records,
                h.startup_import_ms
            )?;
            writeln!(
                out,
                "    checked:      {} records rejected (bad keys or values), {} revoked, {} published again (the group lacked them){}",
                h.rejected,
                h.revoked,
                h.republished,
                if h.forgets_pending > 0 {
                    format!(", {} forgets waiting for etcd", h.forgets_pending)
                } else {
                    String::new()
                }
            )?;
            if let Some(e) = &h.last_error {
                writeln!(out, "    last error:   {e}")?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd cache list`.
pub(crate) fn cache(target: &Target, json: bool) -> Result<ExitCode> {
    let (body, rows): (_, Vec<CacheRow>) = get(&target.socket()?, "/v1/cache")?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{body}")?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "{:<10} {:<11} {:<40} {:>6} {:<21} IPs",
        "Endpoint", "Source", "FQDN", "TTL", "ExpirationTime"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:<10} {:<11} {:<40} {:>6} {:<21} {}",
            r.endpoint,
            r.source,
            r.fqdn,
            r.ttl,
            r.expiration_time,
            r.ips.join(",")
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd cache forget`.
pub(crate) fn forget(target: &Target, request: &ForgetRequest, json: bool) -> Result<ExitCode> {
    let (body, done): (_, ForgetOutcome) =
        post_json(&target.socket()?, "/v1/cache/forget", request)?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{body}")?;
        return Ok(ExitCode::SUCCESS);
    }
    let which = if request.addresses.is_empty() {
        "every address".to_owned()
    } else {
        let addrs: Vec<String> = request.addresses.iter().map(ToString::to_string).collect();
        addrs.join(", ")
    };
    let whom = request.client.as_ref().map_or_else(
        || "every client group".to_owned(),
        |c| format!("client group {c}"),
    );
    writeln!(
        out,
        "{}: {which} for {whom}: {} cached addresses and {} client records forgotten{}",
        done.name,
        done.mappings,
        done.records,
        if done.journaled {
            " (journaled: a restart keeps them out)"
        } else {
            ""
        }
    )?;
    if done.kept_for_others {
        writeln!(
            out,
            "  its addresses stay: another client group still has {} (the cache is shared)",
            done.name
        )?;
    }
    if let Some(g) = &done.group {
        if g.pending {
            writeln!(
                out,
                "  HA group {}: etcd did not answer yet; its records are changed once it does (see `fqdnd status`)",
                g.group
            )?;
        } else {
            writeln!(
                out,
                "  HA group {}: {} records deleted, {} rewritten without it: every gateway of the group forgets what only they carried",
                g.group, g.deleted, g.rewritten
            )?;
            if g.denied > 0 {
                writeln!(
                    out,
                    "  {} records of other gateways NOT changed: etcd refused (their keys are theirs to write); run `fqdnd cache forget` on those gateways too",
                    g.denied
                )?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd identity list`.
pub(crate) fn identities(target: &Target, json: bool) -> Result<ExitCode> {
    let (body, rows): (_, Vec<IdentityRow>) = get(&target.socket()?, "/v1/identities")?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{body}")?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "{:<10} {:<5} LABELS", "ID", "REFS")?;
    for r in rows {
        writeln!(
            out,
            "{:<10} {:<5} {}",
            r.identity,
            r.refs,
            r.labels.join(",")
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd ipcache list`.
pub(crate) fn ipcache(target: &Target, json: bool) -> Result<ExitCode> {
    let (body, rows): (_, Vec<IpcacheRow>) = get(&target.socket()?, "/v1/ipcache")?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{body}")?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "{:<43} {:<10} OWNERS", "PREFIX", "IDENTITY")?;
    for r in rows {
        writeln!(
            out,
            "{:<43} {:<10} {}",
            r.prefix,
            r.identity,
            r.owners.join(" ")
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd policy reload`.
pub(crate) fn reload(target: &Target, json: bool) -> Result<ExitCode> {
    let (body, reload): (_, Reload) = post(&target.socket()?, "/v1/policy/reload", "")?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{body}")?;
    } else if reload.ok {
        writeln!(out, "policy reloaded")?;
    } else {
        for e in &reload.errors {
            writeln!(out, "{e}")?;
        }
        writeln!(out, "reload rejected: the previous policy stays in force")?;
    }
    Ok(if reload.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
