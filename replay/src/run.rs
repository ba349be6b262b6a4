//! A replay: frames → DNS messages → answers → engine run(s), on the capture's clock, and the
//! report at the end.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::time::Duration;

use fqdnd_config::Settings;
use fqdnd_engine::answer::{self, Extracted};
use fqdnd_ipcache::EndpointId;
use fqdnd_ipcache::policy::Rule;
use serde::Serialize;

use crate::Error;
use crate::capture::{CaptureReader, Frame};
use crate::distinct::{Distinct, hash64};
use crate::dns::{self, Data, Decoder};
use crate::engine::{Clients, EngineRun, IdentityMode, RunReport};
use crate::extract::{Counters, DnsPayload, Extractor, Limits, Transport};
use crate::timeseries::{CSV_HEADER, Series};
use crate::wall::WallTime;

/// Distinct names and IPs are counted exactly up to this many, then estimated.
const DISTINCT_EXACT: usize = 1_000_000;

/// The JSON schema version; bumped only when a key changes meaning or disappears.
pub const SCHEMA_VERSION: u32 = 1;

/// Settings given on the command line; each replaces the policy files' `Settings` value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettingsOverrides {
    /// `dns.minTTL`.
    pub min_ttl: Option<u32>,
    /// `dns.maxIPsPerHostname`.
    pub max_ips_per_hostname: Option<usize>,
    /// `breakers.maxFQDNIdentities`.
    pub max_fqdn_identities: Option<usize>,
    /// `breakers.maxIPsPerName`.
    pub max_ips_per_name: Option<usize>,
    /// `breakers.maxNamesPerEndpoint`.
    pub max_names_per_endpoint: Option<usize>,
    /// `gcInterval`.
    pub gc_interval: Option<Duration>,
}

impl SettingsOverrides {
    /// `settings` with every given override applied.
    pub fn apply(&self, mut settings: Settings) -> Settings {
        if let Some(v) = self.min_ttl {
            settings.min_ttl = v;
        }
        if let Some(v) = self.max_ips_per_hostname {
            settings.max_ips_per_hostname = v.max(1);
        }
        if let Some(v) = self.max_fqdn_identities {
            settings.max_fqdn_identities = v;
        }
        if let Some(v) = self.max_ips_per_name {
            settings.max_ips_per_name = v;
        }
        if let Some(v) = self.max_names_per_endpoint {
            settings.max_names_per_endpoint = v;
        }
        if let Some(v) = self.gc_interval {
            settings.gc_interval = v.max(fqdnd_config::MIN_GC_INTERVAL);
        }
        settings
    }
}

/// What to replay and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// Capture files, read one after another as one capture.
    pub traces: Vec<PathBuf>,
    /// Policy files or directories (CNP/CCNP and `Settings`).
    pub policy: Vec<PathBuf>,
    /// Files with `Endpoint`/`ClientGroup` documents; none: every client is one endpoint.
    pub endpoints: Vec<PathBuf>,
    /// DNS ports.
    pub ports: Vec<u16>,
    /// One run per mode, fed the same answers.
    pub modes: Vec<IdentityMode>,
    /// Settings overrides.
    pub settings: SettingsOverrides,
    /// Reassembly bounds.
    pub limits: Limits,
    /// Write the per-second time series here.
    pub csv_timeseries: Option<PathBuf>,
    /// Report progress this often (wall time; checked every 4096 frames).
    pub progress_interval: Option<Duration>,
}

/// A progress report.
#[derive(Debug, Clone)]
pub struct Progress {
    /// Frames read.
    pub frames: u64,
    /// Capture time reached.
    pub capture_seconds: f64,
    /// Wall time spent.
    pub wall_seconds: f64,
    /// Responses decoded.
    pub responses: u64,
    /// Per run: mode, identities alive, names and IPs in the DNS cache, breaker trips.
    pub runs: Vec<(IdentityMode, usize, usize, usize, u64)>,
    /// TCP streams held.
    pub tcp_streams: usize,
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let speed = if self.wall_seconds > 0.0 {
            self.capture_seconds / self.wall_seconds
        } else {
            0.0
        };
        write!(
            f,
            "[progress] capture {:.1} s, wall {:.1} s (x{speed:.0}), {} frames, {} responses ({:.0}/s)",
            self.capture_seconds,
            self.wall_seconds,
            self.frames,
            self.responses,
            self.responses as f64 / self.wall_seconds.max(1e-9)
        )?;
        for (mode, ids, names, ips, trips) in &self.runs {
            write!(
                f,
                "; {}: {ids} identities, cache {names} names {ips} IPs, {trips} breaker trips",
                mode.name()
            )?;
        }
        write!(f, "; {} TCP streams", self.tcp_streams)
    }
}

/// What the capture held, before the engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct InputReport {
    /// The capture files, in order.
    pub files: Vec<String>,
    /// Files that could not be read to the end, with why (the frames before were used).
    pub capture_errors: Vec<String>,
    /// DNS ports.
    pub ports: Vec<u16>,
    /// Frames read.
    pub packets: u64,
    /// Capture time from the first frame to the last, seconds.
    pub capture_seconds: f64,
    /// Wall time of the replay, seconds.
    pub wall_seconds: f64,
    /// Responses replayed per second of wall time.
    pub responses_per_second: f64,
    /// DNS messages found (UDP datagrams and TCP messages on the DNS ports).
    pub dns_messages: u64,
    /// Of them, over TCP.
    pub dns_messages_tcp: u64,
    /// Messages that do not decode (or do not have exactly one question).
    pub dns_malformed: u64,
    /// Decoded messages with an opcode other than QUERY.
    pub dns_other_opcode: u64,
    /// Queries (QR=0).
    pub queries: u64,
    /// Responses (QR=1).
    pub responses: u64,
    /// Of them, over TCP.
    pub responses_tcp: u64,
    /// Of them, with TC=1.
    pub responses_truncated: u64,
    /// Responses by RCODE name.
    pub rcodes: BTreeMap<String, u64>,
    /// NOERROR responses whose answer gives no address (NODATA, or a CNAME chain only).
    pub responses_nodata: u64,
    /// NOERROR responses whose answer records are off the CNAME chain of the question (or
    /// whose chain loops), refused as the proxy refuses them.
    pub responses_invalid_answer: u64,
    /// Responses with addresses, handed to the engine.
    pub responses_with_addresses: u64,
    /// Responses not handed to the engine (`responses - responses_with_addresses`).
    pub responses_skipped: u64,
    /// Distinct question names of responses.
    pub names: usize,
    /// Of them, names with at least one address.
    pub names_with_addresses: usize,
    /// Distinct A/AAAA addresses in answer sections.
    pub ips: usize,
    /// Whether `names`, `names_with_addresses` and `ips` are exact: each is counted exactly up
    /// to 1,000,000 distinct values, then estimated (HyperLogLog, about ±1 %) so that memory
    /// does not grow with the capture.
    pub distinct_counts_exact: bool,
}

/// The whole result.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Input counts.
    #[serde(flatten)]
    pub input: InputReport,
    /// The (first) engine run.
    #[serde(flatten)]
    pub run: RunReport,
    /// The second run when comparing identity modes.
    pub compare: Option<RunReport>,
    /// Frame-level counts.
    pub extract: Counters,
}

/// Everything past the extractor (so the extractor's callback can borrow it alone).
struct Sink {
    runs: Vec<EngineRun>,
    series: Vec<Series>,
    csv: Option<BufWriter<File>>,
    csv_error: Option<io::Error>,
    decoder: Decoder,
    origin: Option<Duration>,
    now: Duration,
    second: Option<u64>,
    input: InputReport,
    names: Distinct,
    names_with_addresses: Distinct,
    ips: Distinct,
    extracted: Extracted,
}

/// A replay in progress. Feed it frames (or DNS payloads) in capture order, then finish.
pub struct Replay {
    extractor: Extractor,
    sink: Sink,
    started: WallTime,
    first_frame: Option<Duration>,
    last_frame: Duration,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay").finish_non_exhaustive()
    }
}

impl Replay {
    /// A replay of DNS on `ports` through one engine run per mode.
    ///
    /// # Errors
    /// The engine refuses the policy or endpoints.
    pub fn new(
        settings: &Settings,
        rules: &[Rule],
        clients: &Clients,
        modes: &[IdentityMode],
        ports: &[u16],
        limits: Limits,
    ) -> Result<Self, Error> {
        let runs = modes
            .iter()
            .map(|m| EngineRun::new(settings, rules, clients, *m))
            .collect::<Result<Vec<_>, _>>()?;
        let mut ports: Vec<u16> = ports.to_vec();
        ports.sort_unstable();
        ports.dedup();
        Ok(Self {
            extractor: Extractor::new(&ports, limits),
            sink: Sink {
                series: modes.iter().map(|m| Series::new(*m)).collect(),
                runs,
                csv: None,
                csv_error: None,
                decoder: Decoder::new(),
                origin: None,
                now: Duration::ZERO,
                second: None,
                input: InputReport {
                    ports,
                    ..InputReport::default()
                },
                names: Distinct::new(DISTINCT_EXACT),
                names_with_addresses: Distinct::new(DISTINCT_EXACT),
                ips: Distinct::new(DISTINCT_EXACT),
                extracted: Extracted::default(),
            },
            started: WallTime::now(),
            first_frame: None,
            last_frame: Duration::ZERO,
        })
    }

    /// Writes the time series to `path` as CSV.
    ///
    /// # Errors
    /// The file cannot be created or written.
    pub fn write_csv_to(&mut self, path: &std::path::Path) -> Result<(), Error> {
        let io_err = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut w = BufWriter::new(File::create(path).map_err(io_err)?);
        writeln!(w, "{CSV_HEADER}").map_err(io_err)?;
        self.sink.csv = Some(w);
        Ok(())
    }

    /// Takes one frame.
    pub fn frame(&mut self, frame: &Frame<'_>) {
        if self.first_frame.is_none() {
            self.first_frame = Some(frame.ts);
            self.sink.origin.get_or_insert(frame.ts);
        }
        self.last_frame = self.last_frame.max(frame.ts);
        let sink = &mut self.sink;
        self.extractor.frame(frame, &mut |p| sink.payload(p));
    }

    /// Takes one DNS message directly (bypassing frame decoding).
    pub fn payload(&mut self, payload: &DnsPayload<'_>) {
        if self.first_frame.is_none() {
            self.first_frame = Some(payload.ts);
        }
        self.last_frame = self.last_frame.max(payload.ts);
        self.sink.payload(payload);
    }

    /// Notes a capture file (for the report).
    pub fn add_file(&mut self, name: String) {
        self.sink.input.files.push(name);
    }

    /// Notes a file that could not be read to its end.
    pub fn add_capture_error(&mut self, error: String) {
        self.sink.input.capture_errors.push(error);
    }

    /// The state now, for a progress line.
    pub fn progress(&self) -> Progress {
        Progress {
            frames: self.extractor.counters().frames,
            capture_seconds: self.sink.now.as_secs_f64(),
            wall_seconds: self.started.elapsed().as_secs_f64(),
            responses: self.sink.input.responses,
            runs: self
                .sink
                .runs
                .iter()
                .map(|r| {
                    (
                        r.mode(),
                        r.ipcache().allocator().len(),
                        r.names().name_count(),
                        r.names().ip_count(),
                        r.names().stats().breaker_trips,
                    )
                })
                .collect(),
            tcp_streams: self.extractor.state_size().0,
        }
    }

    /// Frames taken so far.
    pub fn frames(&self) -> u64 {
        self.extractor.counters().frames
    }

    /// Ends the replay: TCP streams are flushed, a last GC pass runs at the time of the last
    /// frame, and the report is made.
    ///
    /// # Errors
    /// Writing the time series failed.
    pub fn finish(mut self) -> Result<(Report, Vec<Series>), Error> {
        let sink = &mut self.sink;
        self.extractor.finish(&mut |p| sink.payload(p));
        let origin = self.sink.origin.or(self.first_frame).unwrap_or_default();
        let end = self.sink.now.max(self.last_frame.saturating_sub(origin));
        self.sink.now = end;
        self.sink.tick(end);
        for run in &mut self.sink.runs {
            run.advance(end);
            run.gc(end);
        }
        if let Some(second) = self.sink.second {
            self.sink.rows(second);
        }
        if let Some(mut csv) = self.sink.csv.take()
            && let Err(e) = csv.flush()
        {
            self.sink.csv_error.get_or_insert(e);
        }
        if let Some(e) = self.sink.csv_error.take() {
            return Err(Error::Io {
                path: PathBuf::from("<time series>"),
                source: e,
            });
        }
        let mut input = std::mem::take(&mut self.sink.input);
        input.packets = self.extractor.counters().frames;
        input.capture_seconds = self
            .last_frame
            .saturating_sub(self.first_frame.unwrap_or_default())
            .as_secs_f64();
        input.wall_seconds = self.started.elapsed().as_secs_f64();
        input.responses_per_second = input.responses as f64 / input.wall_seconds.max(1e-9);
        input.names = self.sink.names.count();
        input.names_with_addresses = self.sink.names_with_addresses.count();
        input.ips = self.sink.ips.count();
        input.distinct_counts_exact = self.sink.names.is_exact()
            && self.sink.names_with_addresses.is_exact()
            && self.sink.ips.is_exact();
        input.responses_skipped = input.responses - input.responses_with_addresses;
        let mut runs = self.sink.runs.iter().map(EngineRun::report);
        let run = runs.next().unwrap_or_default();
        let compare = runs.next();
        Ok((
            Report {
                schema_version: SCHEMA_VERSION,
                input,
                run,
                compare,
                extract: self.extractor.counters().clone(),
            },
            self.sink.series,
        ))
    }
}

fn rcode_name(rcode: u8) -> String {
    match rcode {
        0 => "NOERROR".into(),
        1 => "FORMERR".into(),
        2 => "SERVFAIL".into(),
        3 => "NXDOMAIN".into(),
        4 => "NOTIMP".into(),
        5 => "REFUSED".into(),
        other => format!("RCODE{other}"),
    }
}

impl Sink {
    /// Moves the clock to `now`; closes the time-series second(s) left behind.
    fn tick(&mut self, now: Duration) {
        let second = now.as_secs();
        match self.second {
            Some(s) if s == second => {}
            Some(s) => {
                self.rows(s);
                self.second = Some(second);
            }
            None => self.second = Some(second),
        }
    }

    fn rows(&mut self, second: u64) {
        for (run, series) in self.runs.iter_mut().zip(&mut self.series) {
            let row = run.sample(second);
            series.push(second, row.identities);
            if let Some(csv) = &mut self.csv
                && let Err(e) = row.write_csv(csv)
            {
                self.csv_error.get_or_insert(e);
                self.csv = None;
            }
        }
    }

    fn payload(&mut self, p: &DnsPayload<'_>) {
        let origin = *self.origin.get_or_insert(p.ts);
        self.now = self.now.max(p.ts.saturating_sub(origin));
        let now = self.now;
        self.tick(now);
        for run in &mut self.runs {
            run.advance(now);
        }
        self.input.dns_messages += 1;
        let transport = p.used_transport();
        if transport == Transport::Tcp {
            self.input.dns_messages_tcp += 1;
        }
        let Ok(msg) = self.decoder.decode(p.bytes) else {
            self.input.dns_malformed += 1;
            return;
        };
        if msg.header.opcode != 0 {
            self.input.dns_other_opcode += 1;
            return;
        }
        if !msg.header.response {
            self.input.queries += 1;
            return;
        }
        let input = &mut self.input;
        input.responses += 1;
        if transport == Transport::Tcp {
            input.responses_tcp += 1;
        }
        if msg.header.truncated {
            input.responses_truncated += 1;
        }
        *input
            .rcodes
            .entry(rcode_name(msg.header.rcode))
            .or_default() += 1;
        let qname = msg.qname();
        let qname_hash = hash64(qname);
        self.names.insert(qname_hash);
        for rr in &msg.answers {
            if let Data::Addr(a) = rr.data {
                self.ips.insert(hash64(&a));
            }
        }
        if msg.header.rcode != dns::RCODE_NOERROR {
            return;
        }
        if answer::extract_decoded(msg, &mut self.extracted).is_err() {
            self.input.responses_invalid_answer += 1;
            return;
        }
        if self.extracted.addrs.is_empty() {
            self.input.responses_nodata += 1;
            return;
        }
        self.input.responses_with_addresses += 1;
        self.names_with_addresses.insert(qname_hash);
        let client = p.dst.ip();
        let by_socket = p.socket_endpoint().map(EndpointId);
        for run in &mut self.runs {
            run.observe(
                client,
                by_socket,
                qname,
                &self.extracted.addrs,
                self.extracted.ttl,
                now,
            );
        }
    }
}

/// Loads the policy and endpoints, reads every capture, and reports.
///
/// # Errors
/// Policy or endpoint files that do not load, a capture that cannot be opened at all, a time
/// series that cannot be written. A capture damaged part-way is reported in
/// [`InputReport::capture_errors`], not as an error.
pub fn replay(
    options: &Options,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(Report, Vec<Series>), Error> {
    let config = fqdnd_config::load(&options.policy).map_err(|errors| Error::Config { errors })?;
    let clients = if options.endpoints.is_empty() {
        Clients::All
    } else {
        let eps = fqdnd_config::load(&options.endpoints)
            .map_err(|errors| Error::Config { errors })?
            .endpoints;
        Clients::Declared(eps)
    };
    let settings = options.settings.apply(config.settings);
    let mut replay = Replay::new(
        &settings,
        &config.rules,
        &clients,
        &options.modes,
        &options.ports,
        options.limits.clone(),
    )?;
    if let Some(path) = &options.csv_timeseries {
        replay.write_csv_to(path)?;
    }
    let mut next_report = options
        .progress_interval
        .map(|every| (every, WallTime::now().plus(every)));
    for path in &options.traces {
        replay.add_file(path.display().to_string());
        let mut reader = CaptureReader::open(path).map_err(|source| Error::Capture {
            path: path.clone(),
            source,
        })?;
        let result = reader.for_each(|frame| {
            replay.frame(frame);
            let frames = replay.frames();
            if frames & 0xfff == 0
                && let Some((every, at)) = &mut next_report
                && WallTime::now() >= *at
            {
                progress(&replay.progress());
                *at = WallTime::now().plus(*every);
            }
        });
        if let Err(e) = result {
            replay.add_capture_error(format!("{}: {e}", path.display()));
        }
    }
    replay.finish()
}
