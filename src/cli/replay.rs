//! `fqdnd replay`: captured DNS traffic through the engine on the capture's clock (the
//! `fqdnd-replay` crate), or, with `--live`, the capture's queries against a running server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use fqdnd_replay::{IdentityMode, Limits, LiveOptions, Options, PreviewOptions, SettingsOverrides};

/// The exit code when the captures gave nothing to replay: no DNS response (no query for
/// `--live`), or, for a preview, none to a client in an endpoint (docs/replay.md, "Exit
/// codes").
const NOTHING_TO_REPLAY: u8 = 3;

/// Says why nothing was replayed (`what`: judged, replayed, sent), and gives
/// [`NOTHING_TO_REPLAY`].
fn nothing(what: &str, why: &str) -> ExitCode {
    eprintln!("fqdnd: warning: nothing was {what}: {why}");
    ExitCode::from(NOTHING_TO_REPLAY)
}

/// "the captures hold no DNS `message` on port 53 (--port names others)".
fn no_dns(message: &str, ports: &[u16]) -> String {
    let ports: Vec<String> = ports.iter().map(ToString::to_string).collect();
    format!(
        "the captures hold no DNS {message} on port {} (--port names others)",
        ports.join(", ")
    )
}

/// Identity allocation to replay with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ModeArg {
    /// One identity per distinct set of FQDN labels (fqdnd, Cilium ≥ 1.16).
    Selector,
    /// One identity per selected IP (Cilium ≤ 1.15).
    PerIp,
}

/// `fqdnd replay` arguments.
#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// Capture files (pcap or pcapng, gzip-compressed or not), read in order as one capture.
    #[arg(required = true, value_name = "TRACE")]
    traces: Vec<PathBuf>,
    /// Policy files or directories (CiliumNetworkPolicy, fqdnd Settings). Repeatable.
    #[arg(long, value_name = "FILE", required_unless_present = "live")]
    policy: Vec<PathBuf>,
    /// fqdnd Endpoint/ClientGroup files mapping client IPs to labels (in a recording of
    /// `fqdnd record`, a host process's message is the endpoint its comment names). Without:
    /// every client is one endpoint to which every rule applies.
    #[arg(long, value_name = "FILE")]
    endpoints: Vec<PathBuf>,
    /// DNS port (repeatable; default 53).
    #[arg(long = "port", value_name = "PORT")]
    ports: Vec<u16>,
    /// Identity allocation: `selector` (one per label set) or `per-ip` (one per IP).
    #[arg(long, value_enum, default_value = "selector")]
    identity_mode: ModeArg,
    /// Run both identity modes on the same answers and show them side by side.
    #[arg(long, conflicts_with = "baseline")]
    compare: bool,
    /// Policy preview: replay the capture under `--policy` (the new policy) and under these
    /// files (the policy in force), each query judged by its DNS rules as the daemon would,
    /// and report per endpoint the names whose verdict changes and the addresses that gain
    /// or lose access, with each side's identities and breaker trips. Repeatable.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["live", "plot", "csv_timeseries"])]
    baseline: Vec<PathBuf>,
    /// Override `dns.minTTL` (seconds).
    #[arg(long, value_name = "SECONDS")]
    min_ttl: Option<u32>,
    /// Override `dns.maxIPsPerHostname`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_ips_per_hostname: Option<u64>,
    /// Override `breakers.maxFQDNIdentities`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_fqdn_identities: Option<u64>,
    /// Override `breakers.maxIPsPerName`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_ips_per_name: Option<u64>,
    /// Override `breakers.maxNamesPerEndpoint`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_names_per_endpoint: Option<u64>,
    /// Override `gcInterval` (capture time): `90`, `90s`, `1500ms`, `2m`; at least 1 s.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    gc_interval: Option<Duration>,
    /// Print the report as one JSON object (schema in docs/replay.md) instead of the text.
    #[arg(long)]
    json: bool,
    /// Write the per-second time series (capture time) as CSV.
    #[arg(long, value_name = "FILE")]
    csv_timeseries: Option<PathBuf>,
    /// Draw identities over capture time as SVG (both modes with --compare).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Progress line on stderr every this many seconds of wall time; 0: none.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    progress: f64,
    /// Send the capture's queries to this DNS server (UDP) and compare its answers with the
    /// captured ones, instead of replaying through the engine.
    #[arg(long, value_name = "ADDR")]
    live: Option<SocketAddr>,
    /// Live: speed factor over the capture's timing (2 = twice as fast); 0: as fast as
    /// --max-outstanding allows.
    #[arg(long, value_name = "X", default_value_t = 1.0, requires = "live")]
    speed: f64,
    /// Live: an answer later than this is a timeout.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration, requires = "live")]
    timeout: Duration,
    /// Live: queries in flight at most.
    #[arg(long, value_name = "N", default_value_t = 100, requires = "live")]
    max_outstanding: usize,
    /// Live: send at most this many queries.
    #[arg(long, value_name = "N", requires = "live")]
    limit: Option<u64>,
}

/// Seconds (`90`, `1.5`) or a number with `ms`, `s`, `m` or `h`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 90, 90s, 1500ms, 2m)"))?;
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("unknown unit {other:?}: use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(value * scale)
        .map_err(|_| format!("{text:?} is not a non-negative duration"))
}

fn usize_of(v: Option<u64>) -> Option<usize> {
    v.map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// Runs `fqdnd replay`.
pub(crate) fn run(args: ReplayArgs) -> Result<ExitCode> {
    let ports = if args.ports.is_empty() {
        vec![53]
    } else {
        args.ports.clone()
    };
    if let Some(server) = args.live {
        return live(&args, server, ports);
    }
    if args.gc_interval.is_some_and(|d| d < Duration::from_secs(1)) {
        bail!("--gc-interval must be at least 1s");
    }
    let settings = SettingsOverrides {
        min_ttl: args.min_ttl,
        max_ips_per_hostname: usize_of(args.max_ips_per_hostname),
        max_fqdn_identities: usize_of(args.max_fqdn_identities),
        max_ips_per_name: usize_of(args.max_ips_per_name),
        max_names_per_endpoint: usize_of(args.max_names_per_endpoint),
        gc_interval: args.gc_interval,
    };
    if !args.baseline.is_empty() {
        let report = fqdnd_replay::preview(&PreviewOptions {
            traces: args.traces.clone(),
            policy: args.policy.clone(),
            baseline: args.baseline.clone(),
            endpoints: args.endpoints.clone(),
            ports: ports.clone(),
            settings,
            limits: Limits::default(),
        })?;
        for e in &report.capture_errors {
            eprintln!("fqdnd: warning: {e}");
        }
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.summary());
        }
        if report.responses == 0 {
            return Ok(nothing("judged", &no_dns("response", &ports)));
        }
        if let Some(why) = report.nothing_judged() {
            return Ok(nothing("judged", &why));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let first = match args.identity_mode {
        ModeArg::Selector => IdentityMode::Selector,
        ModeArg::PerIp => IdentityMode::PerIp,
    };
    let mut modes = vec![first];
    if args.compare {
        modes.push(match first {
            IdentityMode::Selector => IdentityMode::PerIp,
            IdentityMode::PerIp => IdentityMode::Selector,
        });
    }
    let progress_interval = (args.progress > 0.0 && args.progress.is_finite())
        .then(|| Duration::from_secs_f64(args.progress));
    let options = Options {
        traces: args.traces.clone(),
        policy: args.policy.clone(),
        endpoints: args.endpoints.clone(),
        ports: ports.clone(),
        modes,
        settings,
        limits: Limits::default(),
        csv_timeseries: args.csv_timeseries.clone(),
        progress_interval,
    };
    let (report, series) = fqdnd_replay::replay(&options, &mut |p| eprintln!("{p}"))?;
    if let Some(path) = &args.plot {
        let title = match args.traces.as_slice() {
            [one] => format!("Identities over capture time: {}", one.display()),
            many => format!("Identities over capture time: {} captures", many.len()),
        };
        std::fs::write(path, fqdnd_replay::plot::svg(&title, &series))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    for e in &report.input.capture_errors {
        eprintln!("fqdnd: warning: {e}");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", fqdnd_replay::report::summary(&report));
    }
    if report.input.responses == 0 {
        return Ok(nothing("replayed", &no_dns("response", &ports)));
    }
    Ok(ExitCode::SUCCESS)
}

fn live(args: &ReplayArgs, server: SocketAddr, ports: Vec<u16>) -> Result<ExitCode> {
    if !(args.speed >= 0.0 && args.speed.is_finite()) {
        bail!("--speed must be a number ≥ 0");
    }
    let options = LiveOptions {
        server,
        traces: args.traces.clone(),
        ports: ports.clone(),
        speed: args.speed,
        timeout: args.timeout,
        max_outstanding: args.max_outstanding.max(1),
        limit: args.limit,
    };
    let report = fqdnd_replay::live(&options)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.summary());
    }
    if report.queries_in_trace == 0 {
        return Ok(nothing("sent", &no_dns("query", &ports)));
    }
    Ok(ExitCode::SUCCESS)
}
