//! The node's services: the load balancer ([`fqdnd_lb::LoadBalancer`]) over the kernel's LB
//! maps, with the services of the configuration files and those added through the admin API.
//!
//! Every change is a sequence of ordered map writes that never exposes a hole or a missing
//! backend. The load balancer's state (backend ids, rev-NAT indexes) and the services added at
//! run time are saved atomically in `<stateDir>/services/` (a checkpoint snapshot) after every
//! change, so a restart gives every backend the id conntrack entries hold for it; without a
//! state directory the ids are adopted from the pinned maps.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::{Context, Result, bail, refused};
use fqdnd_checkpoint::{Options, Seq, SnapshotMeta};
use fqdnd_config::Service;
use fqdnd_ebpf::LbMaps;
use fqdnd_lb::{LbState, LoadBalancer, ServiceKey};
use serde::{Deserialize, Serialize};

/// The layout version of the saved services.
const SCHEMA: u32 = 1;

/// What `<stateDir>/services/snapshot` holds.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    lb: LbState,
    api: Vec<Service>,
}

/// One row of `fqdnd service list`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ServiceRow {
    /// The service's name.
    pub name: String,
    /// Its VIP and port.
    pub frontend: String,
    /// `TCP`, `UDP` or `ANY`.
    pub protocol: String,
    /// Its reverse-NAT index in the kernel maps.
    pub rev_nat: u16,
    /// `(backend id, address)` in slot order.
    pub backends: Vec<(u16, String)>,
    /// `config` or `api`.
    pub source: String,
}

/// The load balancer as the DNS proxy reads it: VIP → backend per client flow.
pub(super) type SharedLb = Arc<RwLock<LoadBalancer>>;

/// The services, their kernel maps and where they are saved.
pub(super) struct Services {
    lb: SharedLb,
    maps: LbMaps,
    /// Services added through the admin API, by name.
    api: BTreeMap<String, Service>,
    /// `<stateDir>/services`.
    dir: Option<PathBuf>,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("api", &self.api.len())
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Services {
    /// Opens the pinned LB maps and restores the load balancer: from the saved state when
    /// `state_dir` has one, else from what the maps hold. Nothing is written yet.
    pub(super) fn open(pin_dir: &Path, state_dir: Option<&Path>) -> Result<Self> {
        let maps = LbMaps::open(pin_dir).context("opening the load-balancer maps")?;
        let dir = state_dir.map(|d| d.join("services"));
        let saved = match &dir {
            Some(dir) => fqdnd_checkpoint::read_snapshot::<Saved>(dir, &Options::new(SCHEMA))
                .with_context(|| format!("reading the saved services in {}", dir.display()))?
                .map(|(_, saved)| saved),
            None => None,
        };
        let (lb, api) = match saved {
            Some(saved) => {
                let lb = LoadBalancer::from_state(&saved.lb)
                    .context("the saved load-balancer state is inconsistent")?;
                tracing::info!(
                    services = saved.lb.services.len(),
                    backends = saved.lb.backends.len(),
                    api = saved.api.len(),
                    "load-balancer state restored"
                );
                let api = saved.api.into_iter().map(|s| (s.name.clone(), s)).collect();
                (lb, api)
            }
            None => {
                let lb = LoadBalancer::from_maps(&maps.read()?)
                    .context("the pinned load-balancer maps are inconsistent")?;
                (lb, BTreeMap::new())
            }
        };
        Ok(Self {
            lb: Arc::new(RwLock::new(lb)),
            maps,
            api,
            dir,
        })
    }

    /// The load balancer, for the DNS proxy.
    pub(super) fn shared(&self) -> SharedLb {
        Arc::clone(&self.lb)
    }

    /// The services wanted: the files', then the API's whose name and frontend are free.
    fn desired<'a>(&'a self, files: &'a [Service]) -> Vec<&'a Service> {
        let mut out: Vec<&Service> = files.iter().collect();
        for s in self.api.values() {
            if let Some(f) = files.iter().find(|f| f.name == s.name || f.key == s.key) {
                tracing::warn!(service = %s.name, file_service = %f.name, "a service added through the API clashes with the configuration files, which win");
                continue;
            }
            out.push(s);
        }
        out
    }

    /// Brings the load balancer and the kernel maps to `files` plus the API's services. At
    /// start (`initial`) the maps are reconciled with the whole state (entries already right
    /// untouched, strays removed, never flushed); later only the ordered writes of the
    /// changes are applied. An invalid service refuses the whole change.
    pub(super) fn apply(&mut self, files: &[Service], initial: bool) -> Result<()> {
        let mut lb = self
            .lb
            .read()
            .map_err(|_| refused!("load-balancer lock poisoned"))?
            .clone();
        let desired = self.desired(files);
        let mut writes = Vec::new();
        let stale: Vec<ServiceKey> = lb
            .services()
            .map(|(k, _, _)| k)
            .filter(|k| !desired.iter().any(|s| s.key == *k))
            .collect();
        for key in &stale {
            writes.extend(lb.remove_service(key));
        }
        for s in &desired {
            writes.extend(
                lb.set_service(s.key, &s.backends)
                    .with_context(|| format!("service {}", s.name))?,
            );
        }
        let wanted = desired.len();
        if !initial && writes.is_empty() {
            return Ok(());
        }
        if initial {
            let stats = self.maps.sync(&lb)?;
            tracing::info!(
                services = wanted,
                kept = stats.kept,
                written = stats.written,
                removed = stats.removed,
                "load-balancer maps reconciled"
            );
        } else if let Err(e) = self.maps.apply(&writes) {
            // Back to the state in force (the maps may hold part of the change).
            let current = self
                .lb
                .read()
                .map_err(|_| refused!("load-balancer lock poisoned"))?
                .clone();
            if let Err(undo) = self.maps.sync(&current) {
                tracing::error!(error = %undo, "restoring the load-balancer maps failed");
            }
            return Err(e).context("writing the load-balancer maps");
        }
        *self
            .lb
            .write()
            .map_err(|_| refused!("load-balancer lock poisoned"))? = lb;
        self.save();
        Ok(())
    }

    /// Adds or replaces a service through the API.
    pub(super) fn add(&mut self, service: Service, files: &[Service]) -> Result<()> {
        if let Some(f) = files
            .iter()
            .find(|f| f.name == service.name || f.key == service.key)
        {
            bail!(
                "service {} ({}) is declared in the configuration files; change it there",
                f.name,
                f.key
            );
        }
        if let Some(other) = self
            .api
            .values()
            .find(|o| o.key == service.key && o.name != service.name)
        {
            bail!("frontend {} belongs to service {}", service.key, other.name);
        }
        let previous = self.api.insert(service.name.clone(), service.clone());
        if let Err(e) = self.apply(files, false) {
            match previous {
                Some(p) => self.api.insert(p.name.clone(), p),
                None => self.api.remove(&service.name),
            };
            return Err(e);
        }
        tracing::info!(service = %service.name, frontend = %service.key, backends = service.backends.len(), "service set through the admin API");
        Ok(())
    }

    /// Removes a service added through the API.
    pub(super) fn remove(&mut self, name: &str, files: &[Service]) -> Result<()> {
        let Some(removed) = self.api.remove(name) else {
            if files.iter().any(|f| f.name == name) {
                bail!("service {name} is declared in the configuration files; remove it there");
            }
            bail!("no service {name}");
        };
        if let Err(e) = self.apply(files, false) {
            self.api.insert(removed.name.clone(), removed);
            return Err(e);
        }
        tracing::info!(service = %name, "service removed through the admin API");
        Ok(())
    }

    /// Every service with its ids.
    pub(super) fn rows(&self, files: &[Service]) -> Result<Vec<ServiceRow>> {
        let lb = self
            .lb
            .read()
            .map_err(|_| refused!("load-balancer lock poisoned"))?;
        let names: BTreeMap<ServiceKey, (&str, &str)> = files
            .iter()
            .map(|s| (s.key, (s.name.as_str(), "config")))
            .chain(self.api.values().map(|s| (s.key, (s.name.as_str(), "api"))))
            .collect();
        Ok(lb
            .services()
            .map(|(key, rev_nat, backends)| {
                let (name, source) = names.get(&key).copied().unwrap_or(("", ""));
                ServiceRow {
                    name: name.to_owned(),
                    frontend: key.addr().to_string(),
                    protocol: key.proto.to_string(),
                    rev_nat: rev_nat.0,
                    backends: backends
                        .into_iter()
                        .map(|(id, a)| (id.0, a.to_string()))
                        .collect(),
                    source: source.to_owned(),
                }
            })
            .collect())
    }

    /// Saves the state atomically; a failure is logged (the maps are in force, but a restart
    /// without the pins would not bring the run-time services back).
    fn save(&self) {
        let Some(dir) = &self.dir else {
            return;
        };
        let Ok(lb) = self.lb.read() else {
            return;
        };
        let saved = Saved {
            lb: lb.state(),
            api: self.api.values().cloned().collect(),
        };
        let meta = SnapshotMeta {
            next_generation: 0,
            next_seq: Seq(0),
            taken_at_unix_ms: 0,
        };
        let result = std::os::unix::fs::DirBuilderExt::mode(
            std::fs::DirBuilder::new().recursive(true),
            0o700,
        )
        .create(dir)
        .map_err(crate::Error::from)
        .and_then(|()| {
            fqdnd_checkpoint::write_snapshot(dir, SCHEMA, &meta, &saved).map_err(crate::Error::from)
        });
        if let Err(e) = result {
            crate::metrics::count_state_file_error();
            tracing::error!(dir = %dir.display(), error = %crate::chain(&e), "saving the services failed");
        }
    }
}
