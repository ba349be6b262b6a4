//! `fqdnd checkpoint inspect DIR`: what a state directory holds, read without changing it
//! (no lock, nothing truncated) — what an operator reaches for after an incident.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use fqdnd_checkpoint::{Options, decode_journal_bytes, format::decode_value, read_snapshot};

use fqdnd_engine::Clock as _;
use fqdnd_engine::durable::{Record, SCHEMA, Snapshot, Written};

/// Prints the files, the snapshot's age, record counts by kind, identities, and any tail
/// recovery would cut off. Exit 1 when something is damaged.
pub(crate) fn inspect(dir: &Path) -> Result<ExitCode> {
    let clock = fqdnd_daemon::clock::Clock::start();
    let now_ms = clock.unix_ms_of(clock.now());
    let inspection = fqdnd_checkpoint::inspect(dir, Some(SCHEMA), now_ms)
        .with_context(|| format!("reading {}", dir.display()))?;
    let mut out = std::io::stdout().lock();
    write!(out, "{inspection}")?;
    let mut damaged = false;
    let options = Options::new(SCHEMA);
    match read_snapshot::<Snapshot>(dir, &options) {
        Ok(Some((meta, snapshot))) => {
            writeln!(
                out,
                "snapshot content: {} (name, IP) entries over {} names, {} identities; next generation {}, next seq {}",
                snapshot.entries(),
                snapshot.names.len(),
                snapshot.identities.len(),
                meta.next_generation,
                meta.next_seq
            )?;
        }
        Ok(None) => writeln!(out, "snapshot content: none")?,
        Err(e) => {
            damaged = true;
            writeln!(out, "snapshot content: unreadable: {e}")?;
        }
    }
    for generation in &inspection.generations {
        if generation.error.is_some() || generation.discarded.is_some() {
            damaged = true;
        }
        if generation.covered_by_snapshot {
            continue;
        }
        let Ok(bytes) = std::fs::read(&generation.file) else {
            continue;
        };
        let Ok(decoded) = decode_journal_bytes(&bytes, SCHEMA, options.max_record_bytes) else {
            continue;
        };
        let (mut learned, mut identities, mut forgotten, mut undecodable) = (0usize, 0, 0, 0);
        for (_, payload) in &decoded.records {
            match decode_value::<Record>(payload) {
                Ok(Record::Learned { .. }) => learned += 1,
                Ok(Record::Identity { .. }) => identities += 1,
                Ok(Record::Forgotten { .. }) => forgotten += 1,
                Err(_) => undecodable += 1,
            }
        }
        if undecodable > 0 {
            damaged = true;
        }
        writeln!(
            out,
            "{}: {learned} answers, {identities} identity records{}{}",
            generation.file.display(),
            if forgotten > 0 {
                format!(", {forgotten} forgets")
            } else {
                String::new()
            },
            if undecodable > 0 {
                format!(", {undecodable} records that do not decode")
            } else {
                String::new()
            }
        )?;
    }
    Ok(if damaged {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `fqdnd checkpoint synthesize`: a synthetic state directory for restore benchmarks.
pub(crate) fn synthesize(
    dir: &Path,
    zone: &str,
    (names, ips): (u32, u32),
    (spread, written): (Duration, Written),
) -> Result<ExitCode> {
    let clock = fqdnd_daemon::clock::Clock::start();
    fqdnd_engine::durable::synthesize(dir, &clock, zone, (names, ips), (spread, written))
        .with_context(|| format!("writing a synthetic state directory in {}", dir.display()))?;
    Ok(ExitCode::SUCCESS)
}
