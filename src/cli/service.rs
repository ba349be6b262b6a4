//! `fqdnd service set|remove|list` (through the node's admin API) and `fqdnd bpf lb list`
//! (straight from the pinned load-balancer maps).

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use fqdnd_ebpf::LbMaps;
use fqdnd_lb::{LoadBalancer, Protocol, SlotValue};

use crate::cli::Target;
use fqdnd_daemon::admin::client;
use fqdnd_daemon::node::ServiceRow;

/// What `fqdnd service set` is told.
#[derive(clap::Args, Clone)]
pub(crate) struct SetService {
    /// A `Service` document (YAML) to read instead of the flags; `-` reads stdin.
    #[arg(long, short = 'f', value_name = "FILE", conflicts_with_all = ["name", "frontend", "protocol", "backend"])]
    pub(crate) file: Option<PathBuf>,
    /// The service's name.
    #[arg(long, required_unless_present = "file")]
    pub(crate) name: Option<String>,
    /// Its VIP and port, e.g. `10.96.0.10:53` or `[fd00::10]:53`.
    #[arg(long, required_unless_present = "file")]
    pub(crate) frontend: Option<SocketAddr>,
    /// TCP or UDP (TCP and UDP services on one VIP and port are distinct).
    #[arg(long, default_value = "TCP")]
    pub(crate) protocol: Protocol,
    /// A backend `ADDRESS:PORT` (repeat for more; none: new flows to the VIP are dropped).
    #[arg(long)]
    pub(crate) backend: Vec<SocketAddr>,
}

impl SetService {
    /// The `Service` document the flags describe (validated by the daemon).
    fn document(&self) -> Result<String> {
        if let Some(file) = &self.file {
            if file == Path::new("-") {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                    .context("reading stdin")?;
                return Ok(text);
            }
            return std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()));
        }
        let quoted = |t: &str| serde_json::to_string(t).unwrap_or_default();
        Ok(format!(
            "apiVersion: fqdnd.io/v1\nkind: Service\nmetadata:\n  name: {}\nspec:\n  frontend: {}\n  protocol: {}\n  backends: [{}]\n",
            quoted(self.name.as_deref().unwrap_or_default()),
            quoted(&self.frontend.map(|f| f.to_string()).unwrap_or_default()),
            self.protocol,
            self.backend
                .iter()
                .map(|b| quoted(&b.to_string()))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

fn print_services(rows: &[ServiceRow]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<16} {:<28} {:<6} {:<8} {:<7} BACKENDS (id=address)",
        "NAME", "FRONTEND", "PROTO", "REV-NAT", "SOURCE"
    )?;
    for r in rows {
        let backends: Vec<String> = r
            .backends
            .iter()
            .map(|(id, a)| format!("{id}={a}"))
            .collect();
        writeln!(
            out,
            "{:<16} {:<28} {:<6} {:<8} {:<7} {}",
            r.name,
            r.frontend,
            r.protocol,
            r.rev_nat,
            r.source,
            backends.join(",")
        )?;
    }
    Ok(())
}

/// `fqdnd service set`.
pub(crate) fn set(target: &Target, args: &SetService, json: bool) -> Result<ExitCode> {
    let (body, row): (_, ServiceRow) =
        client::post(&target.socket()?, "/v1/services", &args.document()?)?;
    if json {
        println!("{body}");
    } else {
        print_services(&[row])?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd service remove`.
pub(crate) fn remove(target: &Target, name: &str) -> Result<ExitCode> {
    client::delete(&target.socket()?, &format!("/v1/services/{name}"))?;
    println!("service {name} removed");
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd service list`.
pub(crate) fn list(target: &Target, json: bool) -> Result<ExitCode> {
    let (body, rows): (_, Vec<ServiceRow>) = client::get(&target.socket()?, "/v1/services")?;
    if json {
        println!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    print_services(&rows)?;
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd bpf lb list`: every service with its slots, then the backends and rev-NAT entries,
/// as the maps hold them; exit 1 when they break an invariant the datapath relies on.
pub(crate) fn bpf_lb(pin_dir: Option<&Path>) -> Result<ExitCode> {
    let dir = crate::cli::node::pins(pin_dir);
    let maps = LbMaps::open(&dir)
        .with_context(|| {
            format!(
                "opening the load-balancer maps pinned in {} (is `fqdnd node` loaded? are you root?)",
                dir.display()
            )
        })?
        .read()?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{:<28} {:<6} {:<5} VALUE", "FRONTEND", "PROTO", "SLOT")?;
    for ((service, slot), value) in &maps.slots {
        let value = match value {
            SlotValue::Service { count, rev_nat } => {
                format!("count={count} rev_nat={rev_nat}")
            }
            SlotValue::Backend { id, rev_nat } => {
                let addr = maps
                    .backends
                    .get(id)
                    .map_or_else(|| "missing".to_owned(), |(a, _)| a.to_string());
                format!("backend={id} ({addr}) rev_nat={rev_nat}")
            }
        };
        writeln!(
            out,
            "{:<28} {:<6} {slot:<5} {value}",
            service.addr().to_string(),
            service.proto.to_string()
        )?;
    }
    writeln!(out, "\n{:<8} {:<6} ADDRESS", "BACKEND", "PROTO")?;
    for (id, (addr, proto)) in &maps.backends {
        writeln!(out, "{:<8} {:<6} {addr}", id.to_string(), proto.to_string())?;
    }
    writeln!(out, "\n{:<8} FRONTEND", "REV-NAT")?;
    for (index, vip) in &maps.rev_nats {
        writeln!(out, "{:<8} {vip}", index.to_string())?;
    }
    match maps.check_settled().and_then(|()| {
        LoadBalancer::from_maps(&maps)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(problem) => {
            eprintln!("the load-balancer maps are inconsistent: {problem}");
            Ok(ExitCode::FAILURE)
        }
    }
}
