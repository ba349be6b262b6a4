//! Policy preview: what a new policy would have done to a capture's DNS traffic, next to the
//! policy in force (the baseline) — the question a policy author asks before a rollout.
//!
//! The capture is read once; every response goes through two engines, one per policy, as the
//! daemon would have handled it: the query's verdict first (`fqdnd_engine::dns::DnsPolicy`:
//! the client's endpoint, its DNS rules, the server it asked), and only an allowed answer is
//! learned (a refused query is never answered, so it teaches nothing). Per endpoint the report
//! lists the names whose verdict differs and the addresses that gain or lose access, with the
//! ports concerned (what the endpoint's policy allowed towards the address right after an
//! answer taught it, over the capture; an L4-only rule reaches every address on its ports),
//! plus each side's identities and breaker trips.
//!
//! Memory grows with the distinct (endpoint, name) pairs and reachable (endpoint, address)
//! pairs of the capture, not with its length.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use fqdnd_config::{Config, Lists, Settings};
use fqdnd_engine::IdentityMode;
use fqdnd_engine::answer::Extracted;
use fqdnd_engine::dns::{DnsPolicy, DnsService, Verdict};
use fqdnd_ipcache::policy::{LabelSelector, Protocol};
use fqdnd_ipcache::{Endpoint, EndpointId, PolicyKey};
use serde::Serialize;

use crate::Error;
use crate::capture::CaptureReader;
use crate::dns::Decoder;
use crate::engine::{ALL_CLIENTS, Clients, EngineRun};
use crate::extract::{DnsPayload, Extractor, Limits, Transport};
use crate::record::Encryption;
use crate::run::SettingsOverrides;

/// The JSON schema version of [`PreviewReport`].
pub const PREVIEW_SCHEMA_VERSION: u32 = 1;

/// What to compare.
#[derive(Debug, Clone)]
pub struct PreviewOptions {
    /// Capture files, read in order as one capture.
    pub traces: Vec<PathBuf>,
    /// The new policy (files or directories).
    pub policy: Vec<PathBuf>,
    /// The policy in force.
    pub baseline: Vec<PathBuf>,
    /// `Endpoint`/`ClientGroup` files; none: every client is one endpoint every rule selects.
    pub endpoints: Vec<PathBuf>,
    /// DNS ports.
    pub ports: Vec<u16>,
    /// Settings overrides (both sides).
    pub settings: SettingsOverrides,
    /// Reassembly bounds.
    pub limits: Limits,
}

/// One policy's totals.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SideReport {
    /// The policy files.
    pub files: Vec<String>,
    /// Responses whose query the policy allowed (and so were learned).
    pub queries_allowed: u64,
    /// Responses whose query the policy refused.
    pub queries_refused: u64,
    /// Responses whose client is in no endpoint.
    pub queries_unknown_client: u64,
    /// Identities alive at the end.
    pub identities_live_end: usize,
    /// Of them, with an `fqdn:` label.
    pub fqdn_identities_live_end: usize,
    /// Circuit-breaker trips.
    pub breaker_trips: u64,
    /// (name, IP) mappings in the DNS cache at the end.
    pub cache_mappings_end: usize,
}

/// What changes for one endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EndpointChanges {
    /// The endpoint's id.
    pub endpoint: u16,
    /// Its name.
    pub name: String,
    /// Names every query of which the baseline allowed and the new policy refuses (or that
    /// it refuses some of the time: see `names_mixed`).
    pub names_now_refused: Vec<String>,
    /// Names the baseline refused and the new policy allows.
    pub names_now_allowed: Vec<String>,
    /// Names whose queries get different verdicts under one of the policies (another server
    /// or protocol), and whose verdicts differ between the two.
    pub names_mixed: Vec<String>,
    /// Of `names_now_allowed` and `names_mixed`, the names the new policy allows whose
    /// responses in the capture give no address — the baseline refused them when it was
    /// recorded (a refused query is answered without one), or they have none — so what they
    /// would reach is missing from `ips_gaining_access`.
    pub names_without_addresses: Vec<String>,
    /// Addresses the baseline let the endpoint reach on ports the new policy does not.
    pub ips_losing_access: Vec<Access>,
    /// Addresses the new policy lets the endpoint reach on ports the baseline did not.
    pub ips_gaining_access: Vec<Access>,
}

/// An address and the ports on which its access changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Access {
    /// The address.
    pub ip: IpAddr,
    /// `TCP/443`, `UDP/1000-2000`, `ANY/*`, … (the policy entries one side has and the other
    /// does not cover).
    pub ports: Vec<String>,
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.ip, self.ports.join(","))
    }
}

/// Protocol and port range of a policy entry (its identity left out).
type Ports = (Protocol, u16, u16);

fn ports_of(k: &PolicyKey) -> Ports {
    (k.protocol, k.port, k.end_port.max(k.port))
}

/// Whether `outer` allows everything `inner` allows.
fn covers(outer: &Ports, inner: &Ports) -> bool {
    let proto = outer.0 == Protocol::Any || outer.0 == inner.0;
    if outer.0.is_icmp() || inner.0.is_icmp() {
        return (outer.0 == Protocol::Any && outer.1 == 0) || outer == inner;
    }
    let range = outer.1 == 0 || (inner.1 != 0 && outer.1 <= inner.1 && inner.2 <= outer.2);
    proto && range
}

fn render((proto, port, end): &Ports) -> String {
    let proto = proto.name();
    match (port, end) {
        (p, _) if matches!(proto, "ICMP" | "ICMPv6") => format!("{proto}/type {p}"),
        (0, _) => format!("{proto}/*"),
        (p, e) if p == e => format!("{proto}/{p}"),
        (p, e) => format!("{proto}/{p}-{e}"),
    }
}

/// The entries of `have` that nothing in `other` covers.
fn uncovered(have: &BTreeSet<Ports>, other: &BTreeSet<Ports>) -> Vec<String> {
    have.iter()
        .filter(|p| !other.iter().any(|o| covers(o, p)))
        .map(render)
        .collect()
}

impl EndpointChanges {
    fn is_empty(&self) -> bool {
        self.names_now_refused.is_empty()
            && self.names_now_allowed.is_empty()
            && self.names_mixed.is_empty()
            && self.ips_losing_access.is_empty()
            && self.ips_gaining_access.is_empty()
    }
}

/// The preview.
#[derive(Debug, Clone, Serialize)]
pub struct PreviewReport {
    /// [`PREVIEW_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The capture files.
    pub traces: Vec<String>,
    /// Files that could not be read to the end (what came before was used).
    pub capture_errors: Vec<String>,
    /// DNS responses read.
    pub responses: u64,
    /// The policy in force.
    pub baseline: SideReport,
    /// The new policy.
    pub policy: SideReport,
    /// Endpoints for which something changes, by id.
    pub endpoints: Vec<EndpointChanges>,
}

/// How often a name's queries were allowed and refused under one policy.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    allowed: u32,
    refused: u32,
    /// Of the allowed, responses that gave addresses.
    answered: u32,
}

/// Per endpoint and name, its tally.
type Verdicts = HashMap<(EndpointId, Box<str>), Tally>;

/// One policy: its verdicts, its engine, what each endpoint could reach.
struct Side {
    dns: DnsPolicy,
    /// Endpoints were declared (`--endpoints`): a recording's socket-named endpoint counts.
    declared: bool,
    run: EngineRun,
    verdicts: Verdicts,
    /// Per endpoint and address, the ports it could reach it on (right after an answer that
    /// taught the address), over the whole capture.
    reachable: BTreeMap<EndpointId, BTreeMap<IpAddr, BTreeSet<Ports>>>,
    report: SideReport,
}

impl Side {
    fn new(
        config: &Config,
        files: &[PathBuf],
        settings: &Settings,
        clients: &Clients,
    ) -> Result<Self, Error> {
        let (endpoints, rules) = match clients {
            // The DNS verdict of the synthetic "every client" endpoint: its addresses are
            // everything and every rule selects it, as in the engine run.
            Clients::All => (
                vec![Endpoint {
                    id: ALL_CLIENTS,
                    name: "all-clients".into(),
                    addresses: vec![
                        ipnet::Ipv4Net::default().into(),
                        ipnet::Ipv6Net::default().into(),
                    ],
                    labels: Vec::new(),
                }],
                config
                    .rules
                    .iter()
                    .map(|r| fqdnd_ipcache::policy::Rule {
                        endpoint_selector: LabelSelector::default(),
                        ..r.clone()
                    })
                    .collect(),
            ),
            Clients::Declared(eps) => (eps.clone(), config.rules.clone()),
        };
        let dns_config = Config {
            endpoints,
            rules,
            ..config.clone()
        };
        let dns = DnsPolicy::compile(&dns_config, &Lists::default())
            .map_err(|source| Error::Engine { source })?;
        let run = EngineRun::new(settings, &config.rules, clients, IdentityMode::Selector)?;
        Ok(Self {
            dns,
            declared: matches!(clients, Clients::Declared(_)),
            run,
            verdicts: HashMap::new(),
            reachable: BTreeMap::new(),
            report: SideReport {
                files: files.iter().map(|p| p.display().to_string()).collect(),
                ..SideReport::default()
            },
        })
    }

    fn response(
        &mut self,
        p: &DnsPayload<'_>,
        name: &str,
        answer: Option<&Extracted>,
        now: Duration,
    ) {
        // The transport the query came by, as the proxy judged it (a recording's note says it,
        // DoT and DoH included).
        let protocol = match (p.used_transport(), p.encryption()) {
            (_, Some(Encryption::Dot)) => DnsService::Tls,
            (_, Some(Encryption::Doh)) => DnsService::Https,
            (Transport::Udp, None) => DnsService::Plain(Protocol::Udp),
            (Transport::Tcp, None) => DnsService::Plain(Protocol::Tcp),
        };
        let client = p.dst.ip();
        // A host process's query is its cgroup's endpoint's, as the kernel named it (its address
        // is the host's); with every client one endpoint, it is that one.
        let verdict = match p.socket_endpoint() {
            Some(id) if self.declared => {
                self.dns
                    .endpoint_verdict(EndpointId(id), p.src, protocol, name)
            }
            _ => self.dns.verdict(client, p.src, protocol, name),
        };
        let endpoint = match verdict {
            Verdict::UnknownClient => {
                self.report.queries_unknown_client += 1;
                return;
            }
            Verdict::Deny { endpoint } => {
                self.report.queries_refused += 1;
                self.verdicts
                    .entry((endpoint, name.into()))
                    .or_default()
                    .refused += 1;
                return;
            }
            Verdict::Allow { endpoint } => endpoint,
        };
        self.report.queries_allowed += 1;
        let tally = self.verdicts.entry((endpoint, name.into())).or_default();
        tally.allowed += 1;
        let Some(answer) = answer.filter(|a| !a.addrs.is_empty()) else {
            return;
        };
        tally.answered += 1;
        self.run
            .learn(endpoint, name, &answer.addrs, answer.ttl, now);
        for addr in &answer.addrs {
            let access = self.run.access(endpoint, *addr);
            if !access.is_empty() {
                self.reachable
                    .entry(endpoint)
                    .or_default()
                    .entry(*addr)
                    .or_default()
                    .extend(access.iter().map(ports_of));
            }
        }
    }

    fn finish(&mut self, end: Duration) -> SideReport {
        self.run.advance(end);
        self.run.gc(end);
        let run = self.run.report();
        SideReport {
            identities_live_end: run.identities_live_end,
            fqdn_identities_live_end: run.fqdn_identities_live_end,
            breaker_trips: run.breaker_trips,
            cache_mappings_end: run.cache_mappings_end,
            ..self.report.clone()
        }
    }
}

/// Allowed always, refused always, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Allowed,
    Refused,
    Mixed,
}

fn outcome(t: Tally) -> Outcome {
    match (t.allowed > 0, t.refused > 0) {
        (true, false) => Outcome::Allowed,
        (false, true) => Outcome::Refused,
        _ => Outcome::Mixed,
    }
}

/// Compares `baseline` and `policy` on the captures of `options`.
///
/// # Errors
/// A policy or endpoint file does not load, the engine refuses a policy, or a capture cannot
/// be opened at all (one damaged part-way is reported in `capture_errors`).
pub fn preview(options: &PreviewOptions) -> Result<PreviewReport, Error> {
    let load =
        |paths: &[PathBuf]| fqdnd_config::load(paths).map_err(|errors| Error::Config { errors });
    let new = load(&options.policy)?;
    let old = load(&options.baseline)?;
    let declared = if options.endpoints.is_empty() {
        None
    } else {
        Some(load(&options.endpoints)?.endpoints)
    };
    let clients = match &declared {
        None => Clients::All,
        Some(eps) => Clients::Declared(eps.clone()),
    };
    let names: BTreeMap<EndpointId, String> = match &declared {
        None => [(ALL_CLIENTS, "all-clients".to_owned())].into(),
        Some(eps) => eps.iter().map(|e| (e.id, e.name.clone())).collect(),
    };
    let mut sides = [
        Side::new(
            &old,
            &options.baseline,
            &options.settings.apply(old.settings),
            &clients,
        )?,
        Side::new(
            &new,
            &options.policy,
            &options.settings.apply(new.settings),
            &clients,
        )?,
    ];
    let mut ports = options.ports.clone();
    ports.sort_unstable();
    ports.dedup();
    let mut extractor = Extractor::new(&ports, options.limits.clone());
    let mut decoder = Decoder::new();
    let mut extracted = Extracted::default();
    let mut origin: Option<Duration> = None;
    let mut now = Duration::ZERO;
    let mut responses = 0u64;
    let mut capture_errors = Vec::new();
    let mut sink = |p: &DnsPayload<'_>| {
        let start = *origin.get_or_insert(p.ts);
        now = now.max(p.ts.saturating_sub(start));
        for side in &mut sides {
            side.run.advance(now);
        }
        let Ok(msg) = decoder.decode(p.bytes) else {
            return;
        };
        if msg.header.opcode != 0 || !msg.header.response {
            return;
        }
        responses += 1;
        let answer = (msg.header.rcode == crate::dns::RCODE_NOERROR
            && fqdnd_engine::answer::extract_decoded(msg, &mut extracted).is_ok())
        .then_some(&extracted);
        let name = msg.qname();
        for side in &mut sides {
            side.response(p, name, answer, now);
        }
    };
    for path in &options.traces {
        let mut reader = CaptureReader::open(path).map_err(|source| Error::Capture {
            path: path.clone(),
            source,
        })?;
        if let Err(e) = reader.for_each(|frame| extractor.frame(frame, &mut sink)) {
            capture_errors.push(format!("{}: {e}", path.display()));
        }
    }
    extractor.finish(&mut sink);
    let [mut base, mut next] = sides;
    let baseline = base.finish(now);
    let policy = next.finish(now);
    Ok(PreviewReport {
        schema_version: PREVIEW_SCHEMA_VERSION,
        traces: options
            .traces
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        capture_errors,
        responses,
        endpoints: changes(&base, &next, &names),
        baseline,
        policy,
    })
}

/// What differs per endpoint.
fn changes(base: &Side, next: &Side, names: &BTreeMap<EndpointId, String>) -> Vec<EndpointChanges> {
    let mut by_endpoint: BTreeMap<EndpointId, EndpointChanges> = BTreeMap::new();
    let keys: BTreeSet<&(EndpointId, Box<str>)> =
        base.verdicts.keys().chain(next.verdicts.keys()).collect();
    for key in keys {
        let before = base.verdicts.get(key).copied().map(outcome);
        let after = next.verdicts.get(key).copied().map(outcome);
        let (Some(before), Some(after)) = (before, after) else {
            continue;
        };
        if before == after {
            continue;
        }
        let changes = by_endpoint.entry(key.0).or_insert_with(|| EndpointChanges {
            endpoint: key.0.0,
            name: names.get(&key.0).cloned().unwrap_or_default(),
            ..EndpointChanges::default()
        });
        let name = key.1.to_string();
        // Allowed now, but no response the capture holds gave it an address (a refused query
        // is answered without): what it would reach cannot be listed.
        if after != Outcome::Refused && next.verdicts.get(key).is_some_and(|t| t.answered == 0) {
            changes.names_without_addresses.push(name.clone());
        }
        match (before, after) {
            (Outcome::Allowed, Outcome::Refused) => changes.names_now_refused.push(name),
            (Outcome::Refused, Outcome::Allowed) => changes.names_now_allowed.push(name),
            _ => changes.names_mixed.push(name),
        }
    }
    let endpoints: BTreeSet<EndpointId> = base
        .reachable
        .keys()
        .chain(next.reachable.keys())
        .copied()
        .collect();
    let no_addresses = BTreeMap::new();
    let no_ports = BTreeSet::new();
    for ep in endpoints {
        let before = base.reachable.get(&ep).unwrap_or(&no_addresses);
        let after = next.reachable.get(&ep).unwrap_or(&no_addresses);
        let addrs: BTreeSet<&IpAddr> = before.keys().chain(after.keys()).collect();
        let (mut lost, mut gained) = (Vec::new(), Vec::new());
        // What an L4-only rule allows reaches every address, learned or not.
        let anywhere = |side: &Side| -> BTreeSet<Ports> {
            side.run.access_anywhere(ep).iter().map(ports_of).collect()
        };
        let (base_anywhere, next_anywhere) = (anywhere(base), anywhere(next));
        for ip in addrs {
            let b: BTreeSet<Ports> = before
                .get(ip)
                .unwrap_or(&no_ports)
                .union(&base_anywhere)
                .copied()
                .collect();
            let a: BTreeSet<Ports> = after
                .get(ip)
                .unwrap_or(&no_ports)
                .union(&next_anywhere)
                .copied()
                .collect();
            let (b, a) = (&b, &a);
            let l = uncovered(b, a);
            if !l.is_empty() {
                lost.push(Access { ip: *ip, ports: l });
            }
            let g = uncovered(a, b);
            if !g.is_empty() {
                gained.push(Access { ip: *ip, ports: g });
            }
        }
        if lost.is_empty() && gained.is_empty() {
            continue;
        }
        let changes = by_endpoint.entry(ep).or_insert_with(|| EndpointChanges {
            endpoint: ep.0,
            name: names.get(&ep).cloned().unwrap_or_default(),
            ..EndpointChanges::default()
        });
        changes.ips_losing_access = lost;
        changes.ips_gaining_access = gained;
    }
    let mut out: Vec<EndpointChanges> = by_endpoint
        .into_values()
        .filter(|c| !c.is_empty())
        .collect();
    for c in &mut out {
        c.names_now_refused.sort();
        c.names_now_allowed.sort();
        c.names_mixed.sort();
        c.names_without_addresses.sort();
    }
    out
}

/// Most entries of one list in the text summary (the JSON has them all).
const SHOWN: usize = 20;

fn list<T: std::fmt::Display>(out: &mut String, label: &str, items: &[T]) {
    if items.is_empty() {
        return;
    }
    let shown: Vec<String> = items.iter().take(SHOWN).map(ToString::to_string).collect();
    let more = items.len().saturating_sub(SHOWN);
    let _ = write!(out, "  {label:<15} {}", shown.join(" "));
    if more > 0 {
        let _ = write!(out, " … and {more} more");
    }
    out.push('\n');
}

impl PreviewReport {
    /// Responses a policy judged: those to a client in an endpoint (the same on both sides).
    pub fn judged(&self) -> u64 {
        let judged = |s: &SideReport| s.queries_allowed + s.queries_refused;
        judged(&self.baseline).max(judged(&self.policy))
    }

    /// Why nothing was judged, if nothing was: then "nothing changes" means nothing.
    pub fn nothing_judged(&self) -> Option<String> {
        if self.judged() > 0 {
            return None;
        }
        Some(if self.responses == 0 {
            "the captures hold no DNS response".to_owned()
        } else {
            format!(
                "none of the {} DNS responses is to a client in an endpoint",
                self.responses
            )
        })
    }

    /// The readable summary: totals first, then each endpoint that changes.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let sum = |f: fn(&EndpointChanges) -> usize| self.endpoints.iter().map(f).sum::<usize>();
        let _ = writeln!(
            out,
            "Policy preview: {} against the baseline {}, on {} responses from {} capture(s)",
            self.policy.files.join(", "),
            self.baseline.files.join(", "),
            self.responses,
            self.traces.len()
        );
        if let Some(why) = self.nothing_judged() {
            let _ = writeln!(out, "  nothing was judged: {why}");
        }
        let _ = writeln!(out, "  endpoints that change: {}", self.endpoints.len());
        let _ = writeln!(
            out,
            "  names newly refused: {}, newly allowed: {}, mixed: {}",
            sum(|c| c.names_now_refused.len()),
            sum(|c| c.names_now_allowed.len()),
            sum(|c| c.names_mixed.len())
        );
        let _ = writeln!(
            out,
            "  addresses losing access: {}, gaining access: {}",
            sum(|c| c.ips_losing_access.len()),
            sum(|c| c.ips_gaining_access.len())
        );
        let unknown = sum(|c| c.names_without_addresses.len());
        if unknown > 0 {
            let _ = writeln!(
                out,
                "  addresses incomplete: the capture holds no address for {unknown} name(s) allowed now (a refused query is answered without any): what they would reach is not listed"
            );
        }
        for (label, side) in [("baseline", &self.baseline), ("policy", &self.policy)] {
            let _ = writeln!(
                out,
                "  {label:<9} allowed {} refused {} unknown clients {}; identities {} ({} FQDN); breaker trips {}",
                side.queries_allowed,
                side.queries_refused,
                side.queries_unknown_client,
                side.identities_live_end,
                side.fqdn_identities_live_end,
                side.breaker_trips
            );
        }
        for e in &self.capture_errors {
            let _ = writeln!(out, "  damaged capture: {e}");
        }
        for c in &self.endpoints {
            let _ = writeln!(out, "\nendpoint {} ({}):", c.name, c.endpoint);
            list(&mut out, "refused now:", &c.names_now_refused);
            list(&mut out, "allowed now:", &c.names_now_allowed);
            list(&mut out, "mixed:", &c.names_mixed);
            list(&mut out, "no addresses:", &c.names_without_addresses);
            list(&mut out, "lose access:", &c.ips_losing_access);
            list(&mut out, "gain access:", &c.ips_gaining_access);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_covers_what_its_protocol_and_range_contain() {
        let all = (Protocol::Any, 0, 0);
        let https = (Protocol::Tcp, 443, 443);
        let high = (Protocol::Tcp, 1024, 65535);
        assert!(covers(&all, &https) && covers(&all, &all));
        assert!(!covers(&https, &all), "one port never covers every port");
        assert!(covers(&(Protocol::Any, 443, 443), &https));
        assert!(!covers(&(Protocol::Udp, 443, 443), &https));
        assert!(covers(&high, &(Protocol::Tcp, 8080, 8443)));
        assert!(!covers(&high, &(Protocol::Tcp, 1000, 2000)));
        assert!(!covers(&high, &https));
        let have: BTreeSet<Ports> = [https, (Protocol::Udp, 53, 53)].into();
        assert_eq!(
            uncovered(&have, &[(Protocol::Any, 53, 53)].into()),
            ["TCP/443"]
        );
        assert_eq!(render(&high), "TCP/1024-65535");
    }
}
