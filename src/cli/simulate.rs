//! `fqdnd simulate`: DNS answers from a text file through the real engine (config →
//! NameManager → IpCache → in-memory datapath) on a virtual clock, then the state they leave.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use fqdnd_ipcache::{Identity, MemoryDatapath};
use fqdnd_namemgr::Answer;

use fqdnd_engine::Engine;
use fqdnd_engine::dns::Clients;

/// The answers the README's main job replays when no file is given.
pub(crate) const EXAMPLE_ANSWERS: &str = include_str!("../../examples/answers.txt");

/// One line of an answers file.
struct Line {
    at: Duration,
    client: IpAddr,
    answer: Answer,
}

fn parse_answers(text: &str, file: &str) -> Result<Vec<Line>> {
    let mut lines = Vec::new();
    let mut last = Duration::ZERO;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let at = |what: &str| format!("{file}:{}: {what}", n + 1);
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [secs, client, name, ttl, addrs @ ..] = fields.as_slice() else {
            bail!(at("expected `seconds client name ttl address...`"));
        };
        let secs: f64 = secs
            .parse()
            .ok()
            .filter(|s: &f64| s.is_finite() && *s >= 0.0)
            .with_context(|| at("time must be seconds ≥ 0"))?;
        let time = Duration::from_secs_f64(secs);
        if time < last {
            bail!(at("times must not go backwards"));
        }
        last = time;
        let client = client
            .parse()
            .with_context(|| at("client must be an IP address"))?;
        let ttl = ttl
            .parse()
            .with_context(|| at("ttl must be whole seconds"))?;
        let addrs = addrs
            .iter()
            .map(|a| a.parse::<IpAddr>())
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| at("addresses must be IP addresses"))?;
        let name = fqdnd_namemgr::canonicalize(name).into_owned();
        lines.push(Line {
            at: time,
            client,
            answer: Answer { name, addrs, ttl },
        });
    }
    Ok(lines)
}

/// Runs the simulation and prints what happened.
pub(crate) fn run(configs: &[PathBuf], answers: Option<&Path>, end: Option<f64>) -> Result<String> {
    let config = if configs.is_empty() {
        fqdnd_config::load_str(
            fqdnd_config::EXAMPLE_POLICY,
            Path::new("<embedded example policy>"),
        )
    } else {
        fqdnd_config::load(configs)
    }
    .map_err(|errors| anyhow::anyhow!("{errors}"))?;
    let (text, file) = match answers {
        Some(path) => (
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
            path.display().to_string(),
        ),
        None => (
            EXAMPLE_ANSWERS.to_owned(),
            "<embedded example answers>".to_owned(),
        ),
    };
    let lines = parse_answers(&text, &file)?;
    let gc_interval = config.settings.gc_interval.max(Duration::from_secs(1));
    let mut engine = Engine::from_config(&config, MemoryDatapath::default(), Duration::ZERO)?;
    let clients = Clients::new(&config.endpoints);
    let mut out = String::new();
    let mut next_gc = gc_interval;
    let nothing_in_use = |_: IpAddr| false;
    let mut answered = 0usize;
    for line in &lines {
        while line.at >= next_gc {
            let gc = engine.gc(next_gc, &nothing_in_use)?;
            if gc.released > 0 {
                writeln!(
                    out,
                    "{:>6.1}s  gc: {} mapping(s) expired, {} released",
                    next_gc.as_secs_f64(),
                    gc.expired,
                    gc.released
                )?;
            }
            next_gc += gc_interval;
        }
        let Some(endpoint) = clients.lookup(line.client) else {
            writeln!(
                out,
                "{:>6.1}s  {} is in no endpoint or client group: not learned",
                line.at.as_secs_f64(),
                line.client
            )?;
            continue;
        };
        answered += 1;
        let name = &line.answer.name;
        match engine.learn(
            endpoint,
            &line.answer.name,
            &line.answer.addrs,
            line.answer.ttl,
            line.at,
        ) {
            Ok(fqdnd_engine::Learning { learned, .. }) => {
                let identities: std::collections::BTreeSet<String> = line
                    .answer
                    .addrs
                    .iter()
                    .filter_map(|a| engine.ipcache.identity_of(&fqdnd_ipcache::host_prefix(*a)))
                    .map(|id| id.to_string())
                    .collect();
                let identities = if identities.is_empty() {
                    "no selector matches: not in the ipcache".to_owned()
                } else {
                    format!(
                        "identity {}",
                        identities.into_iter().collect::<Vec<_>>().join(", ")
                    )
                };
                writeln!(
                    out,
                    "{:>6.1}s  endpoint {endpoint} {name} → {} new, {} refreshed; {identities}",
                    line.at.as_secs_f64(),
                    learned.new,
                    learned.refreshed
                )?;
            }
            Err(e) => writeln!(
                out,
                "{:>6.1}s  endpoint {endpoint} {name}: {}",
                line.at.as_secs_f64(),
                fqdnd_engine::error_chain(&e)
            )?,
        }
    }
    if let Some(end) = end.filter(|e| e.is_finite() && *e >= 0.0) {
        let end = Duration::from_secs_f64(end);
        let gc = engine.gc(end, &nothing_in_use)?;
        writeln!(
            out,
            "{:>6.1}s  gc: {} mapping(s) expired, {} released",
            end.as_secs_f64(),
            gc.expired,
            gc.released
        )?;
    }
    report(&mut out, &engine, answered)?;
    Ok(out)
}

fn report(out: &mut String, engine: &Engine<MemoryDatapath>, answered: usize) -> Result<()> {
    let ipc = &engine.ipcache;
    writeln!(out, "\nidentities (one per label set):")?;
    let mut ids: Vec<(Identity, String, u32)> = ipc
        .allocator()
        .iter()
        .map(|(id, _, refs)| (id, ipc.canonical_labels_of(id).unwrap_or_default(), refs))
        .collect();
    ids.sort();
    for (id, labels, refs) in &ids {
        writeln!(out, "  {id:<9} refs {refs:<3} {labels}")?;
    }
    writeln!(out, "\nipcache (prefix → identity):")?;
    for (prefix, identity, owners) in engine.prefix_owners() {
        let Some(identity) = identity else { continue };
        writeln!(
            out,
            "  {:<20} {identity:<9} {}",
            prefix.to_string(),
            owners.join(" ")
        )?;
    }
    writeln!(out, "\npolicy (what each endpoint may reach):")?;
    for (id, ep) in ipc.endpoints() {
        let keys = ipc.endpoint_policy(*id).unwrap_or_default();
        let rendered: Vec<String> = keys
            .iter()
            .map(|k| {
                let who = if k.identity == Identity::ANY {
                    "any".to_owned()
                } else {
                    k.identity.to_string()
                };
                let proto = k.protocol.name();
                let who = if k.deny { format!("deny:{who}") } else { who };
                match (k.port, k.end_port) {
                    (p, _) if k.protocol.is_icmp() => format!("{who}/{proto}/type={p}"),
                    (0, _) => format!("{who}/{proto}/*"),
                    (p, e) if p == e => format!("{who}/{proto}/{p}"),
                    (p, e) => format!("{who}/{proto}/{p}-{e}"),
                }
            })
            .collect();
        writeln!(out, "  endpoint {id} ({}): {}", ep.name, rendered.join(" "))?;
    }
    let selected: Vec<Identity> = ipc
        .prefixes()
        .filter_map(|(_, id, _)| id)
        .filter(|id| ipc.has_fqdn_label(*id))
        .collect();
    let held: std::collections::BTreeSet<&Identity> = selected.iter().collect();
    let fqdn_ids = ids
        .iter()
        .filter(|(id, _, _)| ipc.has_fqdn_label(*id))
        .count();
    writeln!(
        out,
        "\nsummary: {answered} answer(s), {} name(s), {} cached IP(s), {} IP(s) selected by FQDN \
         selectors under {} identit(ies) ({fqdn_ids} FQDN identities with the pre-allocated); \
         one identity per IP would need {}",
        engine.names.name_count(),
        engine.names.ip_count(),
        selected.len(),
        held.len(),
        selected.len(),
    )?;
    Ok(())
}
