//! `fqdnd policy check` and `fqdnd policy match`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use fqdnd_namemgr::{FqdnSelector, canonicalize};
use serde::Serialize;

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
