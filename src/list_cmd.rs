//! The commands that read the running gateway through its admin API.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use serde::de::DeserializeOwned;

use crate::admin::{CacheRow, IdentityRow, IpcacheRow, Reload, Status, request};

fn get<T: DeserializeOwned>(socket: &Path, path: &str) -> Result<(String, T)> {
    let body = request(socket, "GET", path)?;
    let parsed = serde_json::from_str(&body).with_context(|| format!("decoding {path}"))?;
    Ok((body, parsed))
}

/// `fqdnd status`.
pub(crate) fn status(socket: &Path, json: bool) -> Result<ExitCode> {
    let (body, s): (_, Status) = get(socket, "/v1/status")?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{body}")?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "version:          {}", s.version)?;
    writeln!(out, "uptime:           {}s", s.uptime_seconds)?;
    writeln!(out, "config:           {}", s.config.join(", "))?;
    writeln!(out, "listening on:     {}", s.listen.join(", "))?;
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
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd cache list`.
pub(crate) fn cache(socket: &Path, json: bool) -> Result<ExitCode> {
    let (body, rows): (_, Vec<CacheRow>) = get(socket, "/v1/cache")?;
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

/// `fqdnd identity list`.
pub(crate) fn identities(socket: &Path, json: bool) -> Result<ExitCode> {
    let (body, rows): (_, Vec<IdentityRow>) = get(socket, "/v1/identities")?;
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
pub(crate) fn ipcache(socket: &Path, json: bool) -> Result<ExitCode> {
    let (body, rows): (_, Vec<IpcacheRow>) = get(socket, "/v1/ipcache")?;
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
pub(crate) fn reload(socket: &Path, json: bool) -> Result<ExitCode> {
    let body = request(socket, "POST", "/v1/policy/reload")?;
    let reload: Reload = serde_json::from_str(&body).context("decoding the reload answer")?;
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
