//! Operator commands of node mode: `fqdnd endpoint add|remove|list` and `fqdnd monitor`
//! (through the admin API), and `fqdnd bpf …` (straight from the pinned maps, so they work
//! whether or not the daemon runs).

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use fqdnd_config::Cgroup;
use fqdnd_ebpf::KernelDatapath;
use fqdnd_engine::endpoints::Attachment;

use crate::cli::Target;
use fqdnd_daemon::admin::client;
use fqdnd_daemon::node::{DropPage, EndpointRow};

/// What `fqdnd endpoint add` is told.
#[derive(clap::Args, Clone)]
pub(crate) struct AddEndpoint {
    /// An `Endpoint` document (YAML) to read instead of the flags; `-` reads stdin.
    #[arg(long, short = 'f', value_name = "FILE", conflicts_with_all = ["id", "name", "address", "interface", "cgroup", "unit", "label"])]
    pub(crate) file: Option<PathBuf>,
    /// Endpoint id (1-65535).
    #[arg(long, required_unless_present = "file")]
    pub(crate) id: Option<u16>,
    /// Endpoint name.
    #[arg(long, required_unless_present = "file")]
    pub(crate) name: Option<String>,
    /// An address of the endpoint (repeat for more); not for host processes (`--cgroup`,
    /// `--unit`), which share the host's.
    #[arg(long, required_unless_present_any = ["file", "cgroup", "unit"], conflicts_with_all = ["cgroup", "unit"])]
    pub(crate) address: Vec<IpAddr>,
    /// Its host-side interface (e.g. the host end of its veth pair).
    #[arg(long, required_unless_present_any = ["file", "cgroup", "unit"], conflicts_with_all = ["cgroup", "unit"])]
    pub(crate) interface: Option<String>,
    /// Host processes instead of an interface: the cgroup v2 directory they run in, below
    /// the hierarchy's root as the `0::` line of /proc/PID/cgroup shows it (e.g.
    /// `/ci/runner`, not `/sys/fs/cgroup/...`); every process in it or in a cgroup below it
    /// is the endpoint. A cgroup that does not exist yet is waited for.
    #[arg(long, value_name = "PATH", conflicts_with = "unit")]
    pub(crate) cgroup: Option<String>,
    /// Host processes of a systemd unit (`name.service`, `.scope`, `.slice`): its cgroup,
    /// found through systemd (where systemd runs).
    #[arg(long, value_name = "NAME")]
    pub(crate) unit: Option<String>,
    /// A label `key=value` or `source:key=value` (repeat for more).
    #[arg(long, value_name = "KEY=VALUE")]
    pub(crate) label: Vec<String>,
}

impl AddEndpoint {
    /// The `Endpoint` document the flags describe (validated by the daemon).
    fn document(&self) -> Result<String> {
        if let Some(file) = &self.file {
            let mut text = String::new();
            if file == Path::new("-") {
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                    .context("reading stdin")?;
            } else {
                text = std::fs::read_to_string(file)
                    .with_context(|| format!("reading {}", file.display()))?;
            }
            return Ok(text);
        }
        let mut labels = Vec::new();
        for label in &self.label {
            let Some((key, value)) = label.split_once('=') else {
                bail!("label {label:?} is not KEY=VALUE");
            };
            labels.push((key.to_owned(), value.to_owned()));
        }
        let attachment = match (&self.cgroup, &self.unit) {
            (Some(path), _) => {
                let cgroup = Cgroup::path(path).with_context(|| {
                    format!("--cgroup {path:?} is not a cgroup v2 path (`/a/b`, no `.` or `..`)")
                })?;
                if cgroup.is_root() {
                    bail!("--cgroup {path:?}: {}", Cgroup::ROOT_REFUSED);
                }
                Attachment::Cgroup(cgroup)
            }
            (None, Some(unit)) => Attachment::Cgroup(Cgroup::unit(unit).with_context(|| {
                format!("--unit {unit:?} is not a unit name ending in .service, .scope or .slice")
            })?),
            (None, None) => Attachment::Interface(self.interface.clone().unwrap_or_default()),
        };
        let doc = fqdnd_engine::endpoints::document(
            self.name.as_deref().unwrap_or_default(),
            fqdnd_ipcache::EndpointId(self.id.unwrap_or_default()),
            &attachment,
            &self.address,
            &labels,
        );
        Ok(doc)
    }
}

/// An endpoint's attachment as the listing shows it: its interface, or `cgroup:<path>` for
/// host processes; and the interface index or cgroup id.
fn attached(r: &EndpointRow) -> (String, String) {
    match &r.cgroup {
        Some(cgroup) => (
            format!("cgroup:{cgroup}"),
            r.cgroup_id
                .map_or_else(|| "-".to_owned(), |i| i.to_string()),
        ),
        None => (
            r.interface.clone(),
            r.ifindex.map_or_else(|| "-".to_owned(), |i| i.to_string()),
        ),
    }
}

/// The listing: IDENTITY is the one its addresses have (`-` for host processes, which share
/// the host's); ENFORCING is `waiting` for a cgroup endpoint whose cgroup does not exist yet.
fn print_endpoints(rows: &[EndpointRow]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<6} {:<16} {:<10} {:<24} {:<8} {:<9} {:<7} {:<28} LABELS",
        "ID", "NAME", "IDENTITY", "ATTACHED", "INDEX", "ENFORCING", "SOURCE", "ADDRESSES"
    )?;
    for r in rows {
        let (what, index) = attached(r);
        let identity = r.identity.map_or_else(|| "-".to_owned(), |i| i.to_string());
        let enforcing = if r.waiting {
            "waiting".to_owned()
        } else {
            r.enforcing.to_string()
        };
        writeln!(
            out,
            "{:<6} {:<16} {identity:<10} {:<24} {:<8} {enforcing:<9} {:<7} {:<28} {}",
            r.id,
            r.name,
            what,
            index,
            r.source,
            r.addresses.join(","),
            r.labels.join(",")
        )?;
    }
    Ok(())
}

/// `fqdnd endpoint add`.
pub(crate) fn add(target: &Target, args: &AddEndpoint, json: bool) -> Result<ExitCode> {
    let (body, row): (_, EndpointRow) =
        client::post(&target.socket()?, "/v1/endpoints", &args.document()?)?;
    if json {
        println!("{body}");
    } else {
        print_endpoints(std::slice::from_ref(&row))?;
    }
    if row.waiting {
        eprintln!(
            "endpoint {} waits for its cgroup: {} does not exist yet; its processes are \
             matched once it does",
            row.id,
            row.cgroup_path.as_deref().unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd endpoint remove`.
pub(crate) fn remove(target: &Target, id: u16) -> Result<ExitCode> {
    client::delete(&target.socket()?, &format!("/v1/endpoints/{id}"))?;
    println!("endpoint {id} removed");
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd endpoint list`.
pub(crate) fn list(target: &Target, json: bool) -> Result<ExitCode> {
    let (body, rows): (_, Vec<EndpointRow>) = client::get(&target.socket()?, "/v1/endpoints")?;
    if json {
        println!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    print_endpoints(&rows)?;
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd monitor`: prints policy drops as they happen (polls the admin API).
pub(crate) fn monitor(
    target: &Target,
    json: bool,
    count: Option<u64>,
    recent: bool,
) -> Result<ExitCode> {
    let socket = target.socket()?;
    let page = |since: u64| -> Result<DropPage> {
        Ok(client::get(&socket, &format!("/v1/drops?since={since}"))?.1)
    };
    let mut since = 0;
    if !recent {
        // Start from the drops that happen from now on.
        since = page(0)?.next;
        loop {
            let next = page(since)?;
            if next.drops.is_empty() {
                break;
            }
            since = next.next;
        }
    }
    let mut printed = 0u64;
    let mut out = std::io::stdout().lock();
    loop {
        let page = page(since)?;
        if page.missed > 0 {
            writeln!(
                out,
                "... {} drops not shown (monitor fell behind)",
                page.missed
            )?;
        }
        for d in &page.drops {
            if json {
                writeln!(out, "{}", serde_json::to_string(d)?)?;
            } else {
                let icmp = d
                    .icmp
                    .map(|(t, c)| format!(" type {t} code {c}"))
                    .unwrap_or_default();
                let name = d
                    .endpoint_name
                    .as_deref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default();
                writeln!(
                    out,
                    "xx drop ({}) endpoint {}{name} [{}] {} -> {} {}{icmp} identity {}",
                    d.reason, d.endpoint, d.seen, d.src, d.dst, d.proto, d.identity
                )?;
            }
            printed += 1;
            if count.is_some_and(|c| printed >= c) {
                return Ok(ExitCode::SUCCESS);
            }
        }
        out.flush()?;
        since = page.next;
        if page.drops.is_empty() {
            #[allow(
                clippy::disallowed_methods,
                reason = "a CLI polling loop, not engine logic"
            )]
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The pin directory to read: the flag, or the default versioned one.
pub(crate) fn pins(pin_dir: Option<&Path>) -> PathBuf {
    pin_dir.map_or_else(fqdnd_ebpf::default_pin_dir, Path::to_path_buf)
}

fn open(pin_dir: Option<&Path>) -> Result<KernelDatapath> {
    let dir = pins(pin_dir);
    KernelDatapath::open(&dir).with_context(|| {
        format!(
            "opening the maps pinned in {} (is `fqdnd node` loaded? are you root?)",
            dir.display()
        )
    })
}

/// `fqdnd bpf ipcache list`.
pub(crate) fn bpf_ipcache(pin_dir: Option<&Path>) -> Result<ExitCode> {
    let maps = open(pin_dir)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{:<44} IDENTITY", "PREFIX")?;
    let mut rows = maps.ipcache_entries()?;
    rows.sort();
    for (prefix, identity) in rows {
        // `IpNet`'s Display ignores the width: pad its text.
        writeln!(out, "{:<44} {}", prefix.to_string(), identity.0)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn proto_name(proto: u8) -> String {
    match proto {
        fqdnd_ebpf::sys::PROTO_TCP => "tcp".to_owned(),
        fqdnd_ebpf::sys::PROTO_UDP => "udp".to_owned(),
        fqdnd_ebpf::sys::PROTO_ICMP => "icmp".to_owned(),
        fqdnd_ebpf::sys::PROTO_ICMPV6 => "icmpv6".to_owned(),
        other => other.to_string(),
    }
}

/// `fqdnd bpf policy list`: one row per kernel entry (a port range is split into port
/// prefixes, each shown as the ports it covers).
pub(crate) fn bpf_policy(pin_dir: Option<&Path>) -> Result<ExitCode> {
    let maps = open(pin_dir)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<9} {:<9} {:<12} PROTO",
        "ENDPOINT", "IDENTITY", "DPORT"
    )?;
    let mut rows = maps.policy_entries()?;
    rows.sort_by_key(|k| (k.endpoint, k.identity, k.protocol(), k.ports()));
    for k in rows {
        let proto = k.protocol().map_or_else(|| "any".to_owned(), proto_name);
        let identity = if k.identity == fqdnd_ebpf::sys::ID_ANY {
            "any".to_owned()
        } else {
            k.identity.to_string()
        };
        let port = match k.ports() {
            (0, 65535) => "any".to_owned(),
            (a, b) if a == b => a.to_string(),
            (a, b) => format!("{a}-{b}"),
        };
        writeln!(out, "{:<9} {identity:<9} {port:<12} {proto}", k.endpoint)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd bpf ct list`: every entry with its state and the time it has left without another
/// packet (dead entries, not yet collected, show `dead`).
pub(crate) fn bpf_ct(pin_dir: Option<&Path>) -> Result<ExitCode> {
    let maps = open(pin_dir)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<6} {:<46} {:<46} {:<12} {:<10} {:<24} IDLE",
        "PROTO", "SOURCE", "DESTINATION", "STATE", "EXPIRES", "FLAGS"
    )?;
    let now = fqdnd_ebpf::monotonic_ns()?;
    for e in maps.ct_entries()? {
        let mut flags = Vec::new();
        if e.flags & fqdnd_ebpf::sys::CT_EGRESS != 0 {
            flags.push("egress".to_owned());
        }
        if e.flags & fqdnd_ebpf::sys::CT_INGRESS != 0 {
            flags.push("ingress".to_owned());
        }
        if e.flags & fqdnd_ebpf::sys::CT_TCP_RST != 0 {
            flags.push("rst".to_owned());
        }
        match (
            e.flags & fqdnd_ebpf::sys::CT_TCP_FIN_FWD != 0,
            e.flags & fqdnd_ebpf::sys::CT_TCP_FIN_REV != 0,
        ) {
            (true, true) => flags.push("fin".to_owned()),
            (true, false) => flags.push("fin-fwd".to_owned()),
            (false, true) => flags.push("fin-rev".to_owned()),
            (false, false) => {}
        }
        if e.backend != 0 {
            flags.push(format!("backend={}", e.backend));
        }
        if e.rev_nat != 0 {
            flags.push(format!("rev_nat={}", e.rev_nat));
        }
        if e.zone == fqdnd_ebpf::sys::CT_ZONE_SOCKET {
            flags.push("socket".to_owned());
        }
        let expires = if e.alive(now) {
            format!("{}s", e.remaining(now).as_secs())
        } else {
            "dead".to_owned()
        };
        let idle = Duration::from_nanos(now.saturating_sub(e.last_seen_ns));
        writeln!(
            out,
            "{:<6} {:<46} {:<46} {:<12} {expires:<10} {:<24} {}s",
            proto_name(e.proto),
            std::net::SocketAddr::new(e.src, e.sport).to_string(),
            std::net::SocketAddr::new(e.dst, e.dport).to_string(),
            e.state().name(),
            flags.join(","),
            idle.as_secs()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// An endpoint entry's flags as the listing shows them (`enforce-egress,redirect-dns`).
fn flag_names(flags: fqdnd_ebpf::EndpointFlags) -> String {
    [
        (flags.enforce_egress, "enforce-egress"),
        (flags.redirect_dns, "redirect-dns"),
        (flags.check_source, "check-source"),
        (flags.enforce_ingress, "enforce-ingress"),
    ]
    .iter()
    .filter(|(set, _)| *set)
    .map(|(_, name)| *name)
    .collect::<Vec<_>>()
    .join(",")
}

/// `fqdnd bpf endpoint list`.
pub(crate) fn bpf_endpoints(pin_dir: Option<&Path>) -> Result<ExitCode> {
    let maps = open(pin_dir)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<8} {:<16} {:<9} FLAGS",
        "IFINDEX", "INTERFACE", "ENDPOINT"
    )?;
    // Names as the agent attached them (its network namespace), not as this command's
    // namespace would name the index.
    let names: std::collections::BTreeMap<u32, String> =
        fqdnd_ebpf::attached_ifindexes(&pins(pin_dir))
            .into_iter()
            .map(|(name, index)| (index, name))
            .collect();
    let name = |ifindex: u32| {
        names
            .get(&ifindex)
            .cloned()
            .unwrap_or_else(|| "?".to_owned())
    };
    for entry in maps.endpoint_entries()? {
        match entry {
            fqdnd_ebpf::EndpointEntry::Endpoint { ifindex, id, flags } => {
                writeln!(
                    out,
                    "{ifindex:<8} {:<16} {:<9} {}",
                    name(ifindex),
                    id.0,
                    flag_names(flags)
                )?;
            }
            fqdnd_ebpf::EndpointEntry::BySource {
                ifindex,
                enforce_unknown,
            } => {
                let unknown = if enforce_unknown {
                    "unknown-sources-dropped"
                } else {
                    "unknown-sources-pass"
                };
                writeln!(
                    out,
                    "{ifindex:<8} {:<16} {:<9} by-source,{unknown}",
                    name(ifindex),
                    "-"
                )?;
            }
            fqdnd_ebpf::EndpointEntry::Bridge { ifindex } => {
                writeln!(
                    out,
                    "{ifindex:<8} {:<16} {:<9} bridge,redirect-dns-of-its-ports",
                    name(ifindex),
                    "-"
                )?;
            }
        }
    }
    for (ifindex, id, addr) in maps.endpoint_addresses()? {
        writeln!(out, "  {} source {addr} → endpoint {}", name(ifindex), id.0)?;
    }
    for (cgroup_id, id, flags) in maps.cgroup_entries()? {
        writeln!(
            out,
            "  cgroup {cgroup_id} → endpoint {} {}",
            id.0,
            flag_names(flags)
        )?;
    }
    for (prefix, id, flags) in maps.client_entries()? {
        writeln!(
            out,
            "  source {prefix} → endpoint {}{}",
            id.0,
            if flags.enforce_egress {
                " (enforce-egress)"
            } else if flags.redirect_dns {
                " (bridged: DNS redirect)"
            } else {
                ""
            }
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd bpf unload`: detaches the programs from every interface and the cgroup socket
/// programs, removes the pins and the local-delivery routes. Enforcement and the DNS redirect
/// stop.
pub(crate) fn bpf_unload(pin_dir: Option<&Path>) -> Result<ExitCode> {
    let dir = pins(pin_dir);
    let cgroup = fqdnd_ebpf::cgroup_attached(&dir);
    fqdnd_ebpf::detach_cgroup_pinned(&dir).context("detaching the cgroup socket programs")?;
    let interfaces = fqdnd_ebpf::attached_interfaces(&dir);
    for iface in &interfaces {
        fqdnd_ebpf::detach_pinned(&dir, iface)
            .with_context(|| format!("detaching the programs from {iface}"))?;
    }
    let detached = interfaces.len();
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    // The endpoints kept for these programs without a `stateDir`: nothing enforces them now.
    let kept = fqdnd_config::default_endpoints_file(
        &std::path::absolute(&dir).unwrap_or_else(|_| dir.clone()),
    );
    let forgot = match std::fs::remove_file(&kept) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(e).with_context(|| format!("removing {}", kept.display())),
    };
    // Its directories too, up to the root, while empty.
    let root = Path::new(fqdnd_config::DEFAULT_NODE_ENDPOINTS_ROOT);
    for parent in kept.ancestors().skip(1) {
        if !parent.starts_with(root) || parent == root || std::fs::remove_dir(parent).is_err() {
            break;
        }
    }
    // The routes are shared: programs of another layout version (a sibling v<N> directory,
    // say the running agent's after an upgrade) still redirect DNS through them.
    let others: Vec<String> = fqdnd_ebpf::other_abi_dirs(&dir)
        .into_iter()
        .filter(|d| !fqdnd_ebpf::attached_interfaces(d).is_empty())
        .map(|d| d.display().to_string())
        .collect();
    if others.is_empty() {
        fqdnd_ebpf::route::remove_local_delivery().context("removing the local-delivery routes")?;
    }
    println!(
        "detached from {} interface(s){}, removed {}{}{}",
        detached,
        if cgroup {
            " and the cgroup v2 root"
        } else {
            ""
        },
        dir.display(),
        if forgot {
            format!(" and {}", kept.display())
        } else {
            String::new()
        },
        if others.is_empty() {
            String::new()
        } else {
            format!(
                "; the local-delivery routes stay for the programs pinned in {}",
                others.join(", ")
            )
        }
    );
    Ok(ExitCode::SUCCESS)
}
