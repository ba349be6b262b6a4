//! `fqdnd policy check`, `fqdnd policy explain` and `fqdnd policy match`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, anyhow, bail};
use fqdnd_engine::explain::{Explanation, Flow, parse_target};
use fqdnd_ipcache::policy::{Direction, Protocol};
use fqdnd_ipcache::{EndpointId, MemoryDatapath};
use fqdnd_namemgr::{FqdnSelector, canonicalize};
use serde::Serialize;

use crate::cli::Target;
use fqdnd_daemon::admin::client::get;

/// `policy check`: loads every file (or directory) and prints every error, and every warning
/// (`file:line:column: warning: …`, on stderr; warnings do not change the exit status).
pub(crate) fn check(paths: &[PathBuf]) -> Result<ExitCode> {
    match fqdnd_config::load(paths) {
        Ok(config) => {
            if !config.warnings.is_empty() {
                let mut err = std::io::stderr().lock();
                for warning in &config.warnings {
                    writeln!(err, "{warning}")?;
                }
                writeln!(err, "{} warning(s)", config.warnings.len())?;
            }
            let fqdn_selectors: std::collections::BTreeSet<_> = config
                .rules
                .iter()
                .flat_map(|r| &r.egress)
                .flat_map(|e| &e.peers)
                .filter(|p| matches!(p, fqdnd_ipcache::policy::PeerSelector::Fqdn(_)))
                .collect();
            println!(
                "ok: {} file(s), {} rule(s), {} FQDN selector(s), {} endpoint(s)",
                config.sources.len(),
                config.rules.len(),
                fqdn_selectors.len(),
                config.endpoints.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            let mut err = std::io::stderr().lock();
            for e in errors.iter() {
                writeln!(err, "{e}")?;
            }
            writeln!(err, "{} error(s)", errors.len())?;
            Ok(ExitCode::FAILURE)
        }
    }
}

#[derive(Serialize)]
struct MatchRow<'a> {
    name: &'a str,
    matches: bool,
}

/// `policy match`: whether `pattern` matches each name, canonicalised as the proxy does.
pub(crate) fn matches(pattern: &str, names: &[String], json: bool) -> Result<ExitCode> {
    let selector = match FqdnSelector::match_pattern(pattern) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("invalid pattern {pattern:?}: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let rows: Vec<MatchRow<'_>> = names
        .iter()
        .map(|name| MatchRow {
            name,
            matches: selector.matches(&canonicalize(name)),
        })
        .collect();
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, &rows)?;
        writeln!(out)?;
    } else {
        for row in &rows {
            let verdict = if row.matches { "match" } else { "no match" };
            writeln!(out, "{verdict}\t{}", canonicalize(row.name))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `policy explain`: asks the running agent (or, with `offline` files, an engine built from
/// them) which rule allows or denies the flow of `endpoint` to `dest` (egress) or from `src`
/// (ingress). Exit status: 0 allowed, 1 denied, 2 no answer (the error on stderr).
pub(crate) fn explain(
    target: &Target,
    offline: &[PathBuf],
    endpoint: u16,
    dest: Option<&str>,
    src: Option<&str>,
    json: bool,
) -> Result<ExitCode> {
    match explain_flow(target, offline, endpoint, dest, src, json) {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("fqdnd: {e:#}");
            Ok(ExitCode::from(2))
        }
    }
}

fn explain_flow(
    target: &Target,
    offline: &[PathBuf],
    endpoint: u16,
    dest: Option<&str>,
    src: Option<&str>,
    json: bool,
) -> Result<ExitCode> {
    let (direction, text) = match (dest, src) {
        (Some(dest), None) => (Direction::Egress, dest),
        (None, Some(src)) => (Direction::Ingress, src),
        _ => bail!("say the destination (DEST or --to, egress) or the source (--from, ingress)"),
    };
    let (peer, protocol, port) = parse_target(text).map_err(|e| anyhow!("{e}"))?;
    let (body, explanation) = if offline.is_empty() {
        let protocol_name = if protocol == Protocol::Any {
            "any".to_owned()
        } else {
            protocol.name().to_ascii_lowercase()
        };
        let path = format!(
            "/v1/policy/explain?endpoint={endpoint}&direction={}&peer={peer}&protocol={protocol_name}&port={port}",
            direction.name(),
        );
        get::<Explanation>(&target.socket()?, &path)?
    } else {
        let config = fqdnd_config::load(offline).map_err(|errors| anyhow!("{errors}"))?;
        let engine = fqdnd_engine::Engine::from_config(
            &config,
            MemoryDatapath::default(),
            std::time::Duration::ZERO,
        )
        .map_err(|e| anyhow!(fqdnd_engine::error_chain(&e)))?;
        let flow = Flow {
            endpoint: EndpointId(endpoint),
            direction,
            peer,
            protocol,
            port,
        };
        let explanation = fqdnd_engine::explain::explain(&engine.ipcache, flow);
        (serde_json::to_string(&explanation)?, explanation)
    };
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{body}")?;
    } else {
        write!(out, "{explanation}")?;
        if !offline.is_empty() {
            writeln!(
                out,
                "  (offline: from the files alone; no DNS answer is known, so toFQDNs select \
                 no address, and the node's own addresses are not the host)"
            )?;
        }
    }
    Ok(if explanation.allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
