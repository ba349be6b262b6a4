//! The cluster commands: `fqdnd operator` (the identity allocator service) and `fqdnd policy
//! apply|delete|list` (the shared policy in etcd). Both read the `kind: Cluster` document of
//! `--config`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use fqdnd_cluster::operator::{self, OperatorConfig, OperatorStatus};
use fqdnd_cluster::{Compare, EtcdStore, Key, Layout, Op, Store, Txn};
use serde::Serialize;
use tokio::sync::watch;

use fqdnd_daemon::cluster::{connect_options, member_name};

/// Transactions hold at most this many policy puts (etcd allows 128 operations).
const PUT_BATCH: usize = 64;

/// The `Cluster` document of the configuration files.
fn cluster_doc(paths: &[PathBuf]) -> Result<fqdnd_config::Cluster> {
    let config = fqdnd_config::load(paths).map_err(|errors| anyhow!("{errors}"))?;
    config.cluster.context(
        "no `kind: Cluster` document in the configuration (--config): it says where etcd is",
    )
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("fqdnd-cluster")
        .build()?)
}

/// How often `fqdnd operator` repeats that etcd is unreachable.
const UNREACHABLE_LOG: Duration = Duration::from_secs(10);

/// `fqdnd operator`: runs an identity allocator until SIGINT/SIGTERM.
pub(crate) fn operator(
    paths: &[PathBuf],
    name: Option<String>,
    metrics: Option<std::net::SocketAddr>,
) -> Result<ExitCode> {
    let doc = cluster_doc(paths)?;
    let name = match name {
        Some(name) => name,
        None => member_name(&doc)?,
    };
    if !fqdnd_config::valid_node_name(&name) {
        bail!("--name {name:?}: 1-63 characters of A-Z a-z 0-9 . _ -");
    }
    let mut config = OperatorConfig::new(name.clone(), Layout::new(&doc.prefix));
    config.lease_ttl = doc.lease_ttl;
    config.gc_grace = doc.identity_gc_grace;
    config.gc_interval =
        (doc.identity_gc_grace / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    runtime()?.block_on(async move {
        let exporter = match metrics {
            Some(addr) => Some(fqdnd_daemon::metrics::install_operator(addr)?),
            None => None,
        };
        let store = EtcdStore::connect(&connect_options(&doc)?)
            .await
            .context("setting up the etcd client")?;
        if let Some(exporter) = exporter {
            fqdnd_daemon::metrics::serve(exporter);
        }
        let (status_tx, mut status) = watch::channel(OperatorStatus::default());
        let (stop_tx, stop) = watch::channel(false);
        tracing::info!(name = %name, endpoints = ?doc.endpoints, prefix = %doc.prefix, "identity allocator starting");
        let mut run = tokio::spawn(operator::run(store, config, status_tx, stop));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        fqdnd_daemon::notify::ready("the identity allocator runs (etcd not answered yet)");
        // The state last logged; etcd's silence is reported from the start, then every
        // UNREACHABLE_LOG while it lasts.
        let mut state = "starting";
        let mut tick = tokio::time::interval(UNREACHABLE_LOG);
        tick.tick().await;
        loop {
            tokio::select! {
                result = &mut run => {
                    result.context("the allocator panicked")??;
                    return Ok(ExitCode::SUCCESS);
                }
                changed = status.changed() => {
                    if changed.is_err() {
                        continue;
                    }
                    let s = status.borrow_and_update().clone();
                    fqdnd_daemon::metrics::record_operator(&s);
                    let now = s.state();
                    // Not tried yet is not unreachable.
                    if now == state || (now == "unreachable" && s.last_error.is_none()) {
                        continue;
                    }
                    match now {
                        "leader" => tracing::warn!(name = %name, term = s.terms, "this allocator leads"),
                        "follower" => tracing::warn!(name = %name, leader = ?s.leader, "this allocator follows (another leads)"),
                        _ => tracing::error!(name = %name, endpoints = ?doc.endpoints, error = s.last_error.as_deref().unwrap_or("-"), "etcd is unreachable: no identity is created or collected until it answers"),
                    }
                    fqdnd_daemon::notify::status(&format!("{now} (etcd {:?})", doc.endpoints));
                    state = now;
                }
                _ = tick.tick() => {
                    let s = status.borrow().clone();
                    fqdnd_daemon::metrics::record_operator(&s);
                    if !s.connected {
                        state = "unreachable";
                        tracing::error!(name = %name, endpoints = ?doc.endpoints, error = s.last_error.as_deref().unwrap_or("no answer yet"), "etcd is still unreachable");
                    }
                }
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
            }
        }
        tracing::info!("stopping: resigning the leadership");
        fqdnd_daemon::notify::stopping();
        let _ = stop_tx.send(true);
        run.await.context("the allocator panicked")??;
        Ok(ExitCode::SUCCESS)
    })
}

/// `fqdnd policy apply`: validates every file locally, then stores each policy document under
/// its name — all in one transaction when they fit.
pub(crate) fn apply(config: &[PathBuf], files: &[PathBuf]) -> Result<ExitCode> {
    let doc = cluster_doc(config)?;
    let mut policies: BTreeMap<String, (PathBuf, usize, String)> = BTreeMap::new();
    let mut failed = false;
    let mut err = std::io::stderr().lock();
    for file in files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        match fqdnd_config::shared_policies(&text, file) {
            Ok(found) => {
                for p in found {
                    if let Some((first, line, _)) = policies.get(&p.name) {
                        writeln!(
                            err,
                            "{}:{}:1: policy {} is also in {}:{line}",
                            file.display(),
                            p.line,
                            p.name,
                            first.display()
                        )?;
                        failed = true;
                        continue;
                    }
                    policies.insert(p.name, (file.clone(), p.line, p.text));
                }
            }
            Err(errors) => {
                for e in errors.iter() {
                    writeln!(err, "{e}")?;
                }
                failed = true;
            }
        }
    }
    if failed {
        writeln!(err, "nothing applied")?;
        return Ok(ExitCode::FAILURE);
    }
    if policies.is_empty() {
        bail!("no policy in the files");
    }
    let layout = Layout::new(&doc.prefix);
    runtime()?.block_on(async {
        let store = EtcdStore::connect(&connect_options(&doc)?).await?;
        let ops: Vec<Op> = policies
            .iter()
            .map(|(name, (_, _, text))| Op::Put {
                key: layout.policy(name),
                value: text.clone().into_bytes(),
                lease: None,
            })
            .collect();
        for chunk in ops.chunks(PUT_BATCH) {
            store
                .txn(Txn {
                    compares: Vec::new(),
                    ops: chunk.to_vec(),
                })
                .await
                .context("storing the policies in etcd")?;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    for (name, (file, line, _)) in &policies {
        println!("applied {name} ({}:{line})", file.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd policy delete NAME...`.
pub(crate) fn delete(config: &[PathBuf], names: &[String]) -> Result<ExitCode> {
    let doc = cluster_doc(config)?;
    let layout = Layout::new(&doc.prefix);
    let mut missing = false;
    runtime()?.block_on(async {
        let store = EtcdStore::connect(&connect_options(&doc)?).await?;
        for name in names {
            let key = layout.policy(name);
            let outcome = store
                .txn(Txn {
                    compares: vec![Compare {
                        key: key.clone(),
                        prefix: false,
                        op: fqdnd_cluster::CmpOp::Greater,
                        target: fqdnd_cluster::Target::CreateRevision(0),
                    }],
                    ops: vec![Op::Delete { key }],
                })
                .await
                .context("deleting from etcd")?;
            if outcome.succeeded {
                println!("deleted {name}");
            } else {
                eprintln!("no shared policy {name} (see `fqdnd policy list`)");
                missing = true;
            }
        }
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(if missing {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[derive(Serialize)]
struct PolicyRow {
    name: String,
    revision: i64,
    bytes: usize,
}

/// `fqdnd policy list`.
pub(crate) fn list(config: &[PathBuf], json: bool) -> Result<ExitCode> {
    let doc = cluster_doc(config)?;
    let layout = Layout::new(&doc.prefix);
    let rows: Vec<PolicyRow> = runtime()?.block_on(async {
        let store = EtcdStore::connect(&connect_options(&doc)?).await?;
        let snapshot = store
            .range(&layout.policies())
            .await
            .context("reading the shared policies from etcd")?;
        Ok::<_, anyhow::Error>(
            snapshot
                .kvs
                .iter()
                .filter_map(|kv| match layout.parse(&kv.key) {
                    Some(Key::Policy(name)) => Some(PolicyRow {
                        name,
                        revision: kv.mod_revision,
                        bytes: kv.value.len(),
                    }),
                    _ => None,
                })
                .collect(),
        )
    })?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string(&rows)?)?;
    } else {
        writeln!(out, "{:<50} {:>10} {:>7}", "NAME", "REVISION", "BYTES")?;
        for r in rows {
            writeln!(out, "{:<50} {:>10} {:>7}", r.name, r.revision, r.bytes)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
