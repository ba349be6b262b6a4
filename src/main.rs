//! fqdnd: a transparent DNS proxy and FQDN policy enforcer.
//!
//! This binary wires the library crates (config → namemgr → ipcache → datapath) into the
//! command-line tools. It is the only place `anyhow` is used.

#![forbid(unsafe_code)]

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use fqdnd_daemon::{admin, cni, gateway, node, privileges, skeleton};
use fqdnd_engine::durable::Written;

/// fqdnd lets workloads reach only the IPs that DNS answered for the names their policy
/// allows. Policies are CiliumNetworkPolicy YAML (cilium.io/v2), taken as they are.
#[derive(Parser)]
#[command(name = "fqdnd", version = env!("FQDND_VERSION"), about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run fqdnd as a standalone DNS firewall (needs a `kind: Gateway` document).
    ///
    /// Client groups (by CIDR) may ask only the names their CiliumNetworkPolicy DNS rules and
    /// the allow/deny lists permit; every allowed answer is learned (name → IPs → identities)
    /// before the client gets it. Reload the policy with SIGHUP or `fqdnd policy reload`.
    Gateway {
        /// Configuration files or directories.
        #[arg(
            long = "config",
            short = 'c',
            value_name = "PATH",
            required_unless_present = "demo"
        )]
        config: Vec<PathBuf>,
        /// Run the embedded demo (static zones, no network): ask a few questions, print the
        /// answers and the identities they created, and exit.
        #[arg(long, conflicts_with = "config")]
        demo: bool,
        /// The admin API socket (default: the Gateway document's `adminSocket`).
        #[arg(long, value_name = "PATH")]
        admin_socket: Option<PathBuf>,
        /// Refuse to start when the state directory's journal has a torn or corrupt tail
        /// (default: cut it off, report it and start from the valid prefix).
        #[arg(long)]
        strict_restore: bool,
    },
    /// Run fqdnd as the node agent of the endpoints on this host (needs root).
    ///
    /// Loads the eBPF programs (maps and links pinned under /sys/fs/bpf/fqdnd), attaches them
    /// to each Endpoint's `interface` (or, for Endpoints of host processes named by their
    /// `cgroup` or systemd `unit`, the socket programs at the cgroup v2 root), and serves the
    /// transparent DNS proxy they redirect DNS to: queries go to the resolver the endpoint
    /// asked, answers are learned into the kernel maps before the endpoint gets them, and
    /// other egress reaches only what policy allows. Endpoints can be added at run time
    /// (`fqdnd endpoint add`). Stopping the agent leaves enforcement in place; `fqdnd bpf
    /// unload` removes it.
    Node {
        /// Configuration files or directories (Endpoints, policies, optional Node and
        /// Settings documents).
        #[arg(long = "config", short = 'c', value_name = "PATH", required = true)]
        config: Vec<PathBuf>,
        /// The admin API socket (default: the Node document's `adminSocket`).
        #[arg(long, value_name = "PATH")]
        admin_socket: Option<PathBuf>,
        /// Refuse to start when the state directory's journal has a torn or corrupt tail.
        #[arg(long)]
        strict_restore: bool,
    },
    /// Run an identity allocator of the cluster (needs a `kind: Cluster` document).
    ///
    /// Watches the endpoints the nodes publish in etcd and creates one global identity
    /// (256-65535) per new label set, collecting those no endpoint used for
    /// `identityGCGrace`. Any number may run: one leads (etcd lease), another takes over
    /// within the lease TTL when it dies.
    Operator {
        /// Configuration files or directories holding the Cluster document.
        #[arg(long = "config", short = 'c', value_name = "PATH", required = true)]
        config: Vec<PathBuf>,
        /// This allocator's name (default: the Cluster document's `nodeName`, else the host
        /// name).
        #[arg(long)]
        name: Option<String>,
        /// Serve Prometheus metrics on this address (`fqdnd_operator_state{state}`:
        /// leader, follower or unreachable; identities, creations, collections, refused
        /// records).
        #[arg(long, value_name = "ADDR:PORT")]
        metrics: Option<std::net::SocketAddr>,
    },
    /// Load-balanced services of the running node agent: a VIP and port whose new flows
    /// the datapath spreads over backends (and whose DNS queries the proxy forwards to one).
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Endpoints of the running node agent.
    #[command(subcommand)]
    Endpoint(EndpointCommand),
    /// Print packets the datapath drops, as they happen (node agent).
    Monitor {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// Stop after this many drops.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
        /// First print the recent drops the agent still holds (up to 4096), then follow.
        #[arg(long)]
        recent: bool,
        #[command(flatten)]
        target: cli::Target,
    },
    /// Durable state (`stateDir`).
    #[command(subcommand)]
    Checkpoint(CheckpointCommand),
    /// Read the kernel's pinned maps directly (works with or without a running agent).
    #[command(subcommand)]
    Bpf(BpfCommand),
    /// Show the running gateway's or node agent's state.
    Status(ListArgs),
    /// The DNS cache (`cache list`, `cache forget`).
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Identities (`identity list`).
    #[command(subcommand)]
    Identity(IdentityCommand),
    /// The ipcache (`ipcache list`).
    #[command(subcommand)]
    Ipcache(IpcacheCommand),
    /// Validate policies and test FQDN patterns.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Run DNS answers from a text file through the engine on a virtual clock and print the
    /// identities, ipcache and per-endpoint policy they produce.
    ///
    /// With no arguments it uses the bundled example policy and answers (no network needed).
    /// Answers file lines: `seconds client-ip name ttl address...`; `#` starts a comment.
    Simulate {
        /// Policy and configuration files or directories (default: the bundled example).
        #[arg(long = "config", short = 'c', value_name = "PATH")]
        config: Vec<PathBuf>,
        /// Answers file (default: the bundled example answers).
        #[arg(long, value_name = "FILE")]
        answers: Option<PathBuf>,
        /// Run a final GC at this virtual time (seconds), to show expiry.
        #[arg(long, value_name = "SECONDS")]
        end: Option<f64>,
    },
    /// Replay pcap/pcapng captures of DNS through the engine on the capture's clock and report
    /// identities, cache and churn; or, with --live, send their queries to a DNS server.
    ///
    /// Every DNS response with addresses is learned as the daemon would learn it (NameManager,
    /// IpCache, in-memory datapath), with TTL expiry and GC on capture time. `--compare` runs
    /// one-identity-per-label-set and one-identity-per-IP side by side. See docs/replay.md.
    ///
    /// Exit codes: 0 replayed; 1 an error (a file that does not load or read); 2 a command
    /// line that does not parse; 3 nothing to replay — no DNS response in the captures on the
    /// DNS ports (no query, for --live), or for a preview none to a client in an endpoint.
    Replay(Box<cli::replay::ReplayArgs>),
    /// Record the running gateway's or node agent's DNS traffic (every query and reply as
    /// the client saw it, over the transport it came by, with the endpoint or client group
    /// and the verdict in each packet's comment) into rotating pcapng files, which `fqdnd
    /// replay` and tshark read back.
    #[command(subcommand)]
    Record(RecordCommand),
    /// Write the man pages or the bash, zsh and fish completions into DIR (for packagers).
    #[command(hide = true)]
    Generate {
        /// `man` or `completions`.
        what: cli::generate::What,
        /// The directory (created if missing).
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum RecordCommand {
    /// Start recording into a directory.
    Start {
        #[command(flatten)]
        args: cli::record::StartArgs,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Stop recording; returns once every message taken is written and the files closed.
    Stop(ListArgs),
    /// Whether it records, what it wrote, the files.
    Status(ListArgs),
}

/// Options of the commands that read the admin API.
#[derive(clap::Args, Clone)]
struct ListArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    target: cli::Target,
}

#[derive(Subcommand)]
enum EndpointCommand {
    /// Add an endpoint (or replace one added earlier with the same id), as a CNI plugin
    /// would when a workload starts (its interface must exist), or the host processes of a
    /// cgroup (`--cgroup PATH`) or systemd unit (`--unit NAME`).
    Add {
        #[command(flatten)]
        endpoint: cli::node::AddEndpoint,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Remove an endpoint added with `endpoint add`.
    Remove {
        /// The endpoint's id.
        id: u16,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Every endpoint: id, name, interface or cgroup, enforcement, where it was declared.
    List(ListArgs),
}

#[derive(Subcommand)]
enum ServiceCommand {
    /// Set a service (create it, or replace the backends of one set earlier with the same
    /// name): backends that stay keep their id and slot, established flows their backend.
    Set {
        #[command(flatten)]
        service: cli::service::SetService,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Remove a service set with `service set`.
    Remove {
        /// The service's name.
        name: String,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Every service: frontend, protocol, rev-NAT index, backends with their ids.
    List(ListArgs),
}

/// Where the pinned maps are.
#[derive(clap::Args, Clone)]
struct PinArgs {
    /// The pin directory (default: /sys/fs/bpf/fqdnd/v<layout version>).
    #[arg(long, value_name = "DIR")]
    pin_dir: Option<PathBuf>,
}

#[derive(Subcommand)]
enum BpfCommand {
    /// The kernel ipcache: prefix → identity (IPv4 and IPv6 LPM tries).
    #[command(subcommand)]
    Ipcache(BpfList),
    /// The kernel policy: (endpoint, identity, port, protocol) entries that allow.
    #[command(subcommand)]
    Policy(BpfList),
    /// Conntrack entries with their state, remaining lifetime and idle time.
    #[command(subcommand)]
    Ct(BpfList),
    /// The endpoint maps: interface → endpoint id and flags, cgroup id → endpoint.
    #[command(subcommand)]
    Endpoint(BpfList),
    /// The load-balancer maps: service slots, backends, rev-NAT entries (exit 1 if they
    /// break an invariant).
    #[command(subcommand)]
    Lb(BpfList),
    /// Detach the programs from every interface, remove the pins and the DNS-redirect routes.
    Unload(PinArgs),
}

#[derive(Subcommand)]
enum CheckpointCommand {
    /// What a state directory holds: snapshot (age, entries, identities), journal generations
    /// (records by kind), and any torn tail the next start would cut off. Read-only: safe
    /// while the daemon runs. Exit 1 if something is damaged.
    Inspect {
        /// The state directory.
        dir: PathBuf,
    },
    /// Write a synthetic state directory (NAMES names under ZONE, IPS addresses each, valid
    /// for an hour), for restore benchmarks.
    #[command(hide = true)]
    Synthesize {
        /// The (new) state directory.
        dir: PathBuf,
        /// The zone the names are under, e.g. `bench.test`.
        #[arg(long)]
        zone: String,
        /// Names.
        #[arg(long)]
        names: u32,
        /// Addresses per name.
        #[arg(long, default_value_t = 10)]
        ips: u32,
        /// Every name is valid for an hour, and up to this many seconds more (each name a
        /// random share: expiries in no particular order, as in a real cache).
        #[arg(long, default_value_t = 0)]
        expiry_spread: u64,
        /// Write the names in the order made up, not in the order compaction writes them
        /// (latest expiry first): with a spread, a snapshot in no order, as an older fqdnd
        /// wrote them.
        #[arg(long)]
        as_made: bool,
    },
}

#[derive(Subcommand)]
enum BpfList {
    /// List the entries.
    List(PinArgs),
}

#[derive(Subcommand)]
enum CacheCommand {
    /// Every cached name with its IPs: endpoint, source (lookup or connection), FQDN, TTL,
    /// expiration, IPs — Cilium's `fqdn cache list` columns.
    List(ListArgs),
    /// Forget a name, or some of its addresses, at once: out of the DNS cache and the
    /// datapath (not kept as zombies: connections open to them are cut at their next
    /// packet) and, with `stateDir`, out of what a restart restores. On a gateway of an HA
    /// group (`gatewayGroup`) also out of the group's records in etcd, which revokes it on
    /// every gateway of the group. The name comes back when a client asks it again.
    ///
    /// Examples:
    ///   fqdnd cache forget evil.example.com
    ///   fqdnd cache forget cdn.example.com --address 198.51.100.7 --address 2001:db8::7
    ///   fqdnd cache forget api.example.com --client lab
    #[command(verbatim_doc_comment)]
    Forget(ForgetArgs),
}

#[derive(clap::Args)]
struct ForgetArgs {
    /// The name (case and the trailing dot do not matter).
    #[arg(value_name = "NAME")]
    name: String,
    /// Only this address of the name (repeat for more) [default: every address].
    #[arg(long = "address", value_name = "IP")]
    addresses: Vec<std::net::IpAddr>,
    /// Only for this client group (gateway) or endpoint (node), by name: its record of the
    /// name goes, and the addresses too unless another client group still has the name (the
    /// DNS cache is shared, as Cilium's: an address is allowed to every group whose policy
    /// selects its name). In an HA group, only that group's records are changed.
    #[arg(long, value_name = "GROUP")]
    client: Option<String>,
    /// Print JSON instead of a sentence.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    target: cli::Target,
}

#[derive(Subcommand)]
enum IdentityCommand {
    /// Every identity with its labels and references.
    List(ListArgs),
}

#[derive(Subcommand)]
enum IpcacheCommand {
    /// Every prefix the datapath knows, with its identity and owners.
    List(ListArgs),
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Ask the running gateway to reload its configuration files. A file with errors is
    /// rejected with its errors and the policy in force stays.
    Reload(ListArgs),
    /// Load policy and configuration files (or directories of them) and print every error
    /// as `file:line:column: message`. Exits 1 if there is any.
    Check {
        /// Files or directories (`*.yaml`, `*.yml`, `*.json`).
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
    /// Store policies in the cluster (cluster mode): every node applies them beside its own
    /// files. Each file is validated first; a file with errors is refused with them and
    /// nothing is stored.
    Apply {
        /// The configuration holding the Cluster document.
        #[arg(long = "config", short = 'c', value_name = "PATH", required = true)]
        config: Vec<PathBuf>,
        /// Policy files (CiliumNetworkPolicy / CiliumClusterwideNetworkPolicy documents only).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Remove policies from the cluster by name (`cnp/NAMESPACE/NAME` or `ccnp/NAME`, as
    /// `policy list` shows).
    Delete {
        /// The configuration holding the Cluster document.
        #[arg(long = "config", short = 'c', value_name = "PATH", required = true)]
        config: Vec<PathBuf>,
        /// Names.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// The policies stored in the cluster.
    List {
        /// The configuration holding the Cluster document.
        #[arg(long = "config", short = 'c', value_name = "PATH", required = true)]
        config: Vec<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Say which rule allows or denies a flow — without traffic — by the policy in force in
    /// the running agent (its endpoints, the addresses DNS taught it, the node's addresses),
    /// or with `--offline` by policy files alone.
    ///
    /// Egress: `--endpoint ID DEST[:PORT/PROTO]` (or `--to`); ingress: `--endpoint ID --from
    /// SRC[:PORT/PROTO]`, PORT being the endpoint's. PROTO is tcp (the default), udp, icmp or
    /// icmpv6 (PORT is then the ICMP type); an IPv6 address with a port is written
    /// `[ADDR]:PORT/PROTO`. An address alone asks about every protocol (only rules without
    /// ports match). Exits 0 when the flow is allowed, 1 when it is denied, 2 when there is
    /// no answer (a flow it cannot read, no agent, files with errors).
    Explain {
        /// The endpoint (node) or client group (gateway) whose policy decides.
        #[arg(long, value_name = "ID")]
        endpoint: u16,
        /// Egress: the destination, `ADDR[:PORT/PROTO]`.
        #[arg(value_name = "DEST", conflicts_with_all = ["to", "from"], required_unless_present_any = ["to", "from"])]
        dest: Option<String>,
        /// Egress: the destination (the same as DEST).
        #[arg(long, value_name = "DEST", conflicts_with = "from")]
        to: Option<String>,
        /// Ingress: the source, `ADDR[:PORT/PROTO]` with the endpoint's port.
        #[arg(long, value_name = "SRC")]
        from: Option<String>,
        /// Load these policy and configuration files (or directories) instead of asking the
        /// running agent. No DNS answer is known then: `toFQDNs` select no address.
        #[arg(long, value_name = "PATH", num_args = 1..)]
        offline: Vec<PathBuf>,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Tell for each NAME whether the FQDN PATTERN (`matchPattern` syntax) matches it.
    ///
    /// Names are canonicalised as the DNS proxy does: lowercased, trailing dot added.
    /// Pattern semantics are Cilium's: `*` matches within one label, a leading `**.` spans
    /// one or more labels, a lone `*` matches every name.
    Match {
        /// Print `[{"name": ..., "matches": true|false}, ...]` in input order.
        #[arg(long)]
        json: bool,
        /// The pattern, e.g. `*.cilium.io` or `**.example.com`.
        pattern: String,
        /// Names to test.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("fqdnd")
        .build()?)
}

/// `FQDND_LOG` (default `warn`). The static zones' server (hickory) logs two lines per query
/// at `info`: left out unless the filter names it (`queryLog` is fqdnd's per-query log).
fn log_filter() -> tracing_subscriber::EnvFilter {
    let Ok(text) = std::env::var("FQDND_LOG") else {
        return "warn".into();
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&text).unwrap_or_else(|e| {
        eprintln!("FQDND_LOG={text:?}: {e}; logging at warn");
        "warn".into()
    });
    match "hickory_server=warn".parse() {
        Ok(quiet) if !text.contains("hickory") => filter.add_directive(quiet),
        _ => filter,
    }
}

fn main() -> ExitCode {
    // Called as `fqdnd-cni` (a link in the runtime's CNI plugin directory): the CNI plugin.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&argv0).file_name() == Some(std::ffi::OsStr::new("fqdnd-cni")) {
        return cni::main();
    }
    tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Gateway {
            config,
            demo,
            admin_socket,
            strict_restore,
        } => runtime().and_then(|rt| {
            rt.block_on(async {
                if demo {
                    print!("{}", gateway::demo::run().await?);
                } else {
                    let options = skeleton::StartOptions {
                        paths: config,
                        demo: false,
                        admin_socket,
                        strict_restore,
                        cluster_store: None,
                    };
                    gateway::start(options)
                        .await?
                        .serve("gateway", privileges::GATEWAY)
                        .await?;
                }
                Ok(ExitCode::SUCCESS)
            })
        }),
        Command::Node {
            config,
            admin_socket,
            strict_restore,
        } => runtime().and_then(|rt| {
            rt.block_on(async {
                let options = skeleton::StartOptions {
                    paths: config,
                    demo: false,
                    admin_socket,
                    strict_restore,
                    cluster_store: None,
                };
                node::start(options)
                    .await?
                    .serve("node", privileges::NODE)
                    .await?;
                Ok(ExitCode::SUCCESS)
            })
        }),
        Command::Endpoint(EndpointCommand::Add { endpoint, list }) => {
            cli::node::add(&list.target, &endpoint, list.json)
        }
        Command::Endpoint(EndpointCommand::Remove { id, list }) => {
            cli::node::remove(&list.target, id)
        }
        Command::Service(ServiceCommand::Set { service, list }) => {
            cli::service::set(&list.target, &service, list.json)
        }
        Command::Service(ServiceCommand::Remove { name, list }) => {
            cli::service::remove(&list.target, &name)
        }
        Command::Service(ServiceCommand::List(args)) => cli::service::list(&args.target, args.json),
        Command::Endpoint(EndpointCommand::List(args)) => cli::node::list(&args.target, args.json),
        Command::Monitor {
            json,
            count,
            recent,
            target,
        } => cli::node::monitor(&target, json, count, recent),
        Command::Bpf(BpfCommand::Ipcache(BpfList::List(p))) => {
            cli::node::bpf_ipcache(p.pin_dir.as_deref())
        }
        Command::Bpf(BpfCommand::Policy(BpfList::List(p))) => {
            cli::node::bpf_policy(p.pin_dir.as_deref())
        }
        Command::Bpf(BpfCommand::Ct(BpfList::List(p))) => cli::node::bpf_ct(p.pin_dir.as_deref()),
        Command::Bpf(BpfCommand::Endpoint(BpfList::List(p))) => {
            cli::node::bpf_endpoints(p.pin_dir.as_deref())
        }
        Command::Bpf(BpfCommand::Lb(BpfList::List(p))) => {
            cli::service::bpf_lb(p.pin_dir.as_deref())
        }
        Command::Checkpoint(CheckpointCommand::Inspect { dir }) => cli::checkpoint::inspect(&dir),
        Command::Checkpoint(CheckpointCommand::Synthesize {
            dir,
            zone,
            names,
            ips,
            expiry_spread,
            as_made,
        }) => cli::checkpoint::synthesize(
            &dir,
            &zone,
            (names, ips),
            (
                Duration::from_secs(expiry_spread),
                if as_made {
                    Written::AsMade
                } else {
                    Written::InRestoreOrder
                },
            ),
        ),
        Command::Bpf(BpfCommand::Unload(p)) => cli::node::bpf_unload(p.pin_dir.as_deref()),
        Command::Status(args) => cli::list::status(&args.target, args.json),
        Command::Cache(CacheCommand::List(args)) => cli::list::cache(&args.target, args.json),
        Command::Cache(CacheCommand::Forget(args)) => cli::list::forget(
            &args.target,
            &admin::ForgetRequest {
                name: args.name,
                addresses: args.addresses,
                client: args.client,
            },
            args.json,
        ),
        Command::Identity(IdentityCommand::List(args)) => {
            cli::list::identities(&args.target, args.json)
        }
        Command::Ipcache(IpcacheCommand::List(args)) => cli::list::ipcache(&args.target, args.json),
        Command::Policy(PolicyCommand::Reload(args)) => cli::list::reload(&args.target, args.json),
        Command::Policy(PolicyCommand::Check { paths }) => cli::policy::check(&paths),
        Command::Policy(PolicyCommand::Apply { config, files }) => {
            cli::cluster::apply(&config, &files)
        }
        Command::Policy(PolicyCommand::Delete { config, names }) => {
            cli::cluster::delete(&config, &names)
        }
        Command::Policy(PolicyCommand::List { config, json }) => cli::cluster::list(&config, json),
        Command::Operator {
            config,
            name,
            metrics,
        } => cli::cluster::operator(&config, name, metrics),
        Command::Policy(PolicyCommand::Explain {
            endpoint,
            dest,
            to,
            from,
            offline,
            list,
        }) => cli::policy::explain(
            &list.target,
            &offline,
            endpoint,
            dest.or(to).as_deref(),
            from.as_deref(),
            list.json,
        ),
        Command::Policy(PolicyCommand::Match {
            json,
            pattern,
            names,
        }) => cli::policy::matches(&pattern, &names, json),
        Command::Simulate {
            config,
            answers,
            end,
        } => cli::simulate::run(&config, answers.as_deref(), end).map(|out| {
            print!("{out}");
            ExitCode::SUCCESS
        }),
        Command::Replay(args) => cli::replay::run(*args),
        Command::Record(RecordCommand::Start { args, list }) => {
            cli::record::start(&list.target, &args, list.json)
        }
        Command::Record(RecordCommand::Stop(list)) => cli::record::stop(&list.target, list.json),
        Command::Generate { what, dir } => cli::generate::run(Cli::command(), what, &dir),
        Command::Record(RecordCommand::Status(list)) => {
            cli::record::status(&list.target, list.json)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fqdnd: {e:#}");
            ExitCode::FAILURE
        }
    }
}
