//! The state directory at start: opened (its lock taken, the journal writer started), and the
//! engine built from the configuration and what it held (engine::durable decides what; this
//! module only logs and times it). On the kernel, the pinned maps are reconciled afterwards.

use std::path::Path;
use std::sync::Arc;

use crate::{Context, Result};
use fqdnd_config::{Config, Daemon};
use fqdnd_ebpf::KernelDatapath;
use fqdnd_engine::durable::{self, Persist, Restored};
use fqdnd_engine::{Clock as _, Engine, IdentityMode};
use fqdnd_ipcache::Datapath;

use crate::clock::Clock;
use crate::datapath::AnyDatapath;

/// Creates the state directory (mode 0700: what it holds says which client asked for which
/// name) if the configuration names one and it does not exist yet. Each mode calls it before
/// anything writes there.
pub fn create_state_dir(daemon: &Daemon) -> Result<()> {
    let Some(dir) = daemon.state_dir.as_deref() else {
        return Ok(());
    };
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(dir)
        .with_context(|| format!("creating the state directory {}", dir.display()))
}

/// Opens the state directory if there is one: what to restore, and the journal. Without one,
/// the warning says what a restart loses, and what it keeps (`kept`, from the mode).
pub(super) fn open(
    daemon: &Daemon,
    strict: bool,
    clock: Clock,
    kept: Option<String>,
) -> Result<(Restored, Option<Arc<Persist>>)> {
    let Some(dir) = daemon.state_dir.as_deref() else {
        let kept = kept.map(|k| format!("; {k}")).unwrap_or_default();
        tracing::warn!(
            "no `stateDir`: a restart loses the learned names and their identity numbers: the \
             IPs DNS answers opened are closed (established connections to them included) \
             until their names are resolved again, and identities get new numbers{kept}"
        );
        return Ok((Restored::default(), None));
    };
    let started = clock.now();
    let (restored, journal) = durable::open(dir, strict).with_context(|| {
        format!(
            "restoring the state (`fqdnd checkpoint inspect {}` shows what it holds)",
            dir.display()
        )
    })?;
    let read_ms = (clock.now() - started).as_millis();
    if let Some(d) = &restored.discarded {
        tracing::warn!(
            file = %d.file.display(),
            offset = d.offset,
            bytes = d.bytes,
            reason = %d.reason,
            "a torn or corrupt journal tail was cut off (never acknowledged)"
        );
    }
    tracing::info!(
        dir = %dir.display(),
        snapshot_entries = restored.snapshot_entries,
        records = restored.records,
        identities = restored.identities.len(),
        read_ms,
        "state restored"
    );
    let persist = Arc::new(Persist::new(
        journal,
        Arc::new(clock),
        &restored,
        daemon.state_compact_after,
    ));
    Ok((restored, Some(persist)))
}

/// Builds the engine from the configuration and the restored state: identities keep their
/// numbers, `prime` gives it what it must know before the configuration (cluster mode: the
/// cluster's numbers and remote endpoints), answers come back with their remaining TTLs.
pub(super) fn build_engine<D: Datapath>(
    config: &Config,
    datapath: D,
    clock: Clock,
    restored: &mut Restored,
    prime: impl FnOnce(&mut Engine<D>),
) -> Result<Engine<D>> {
    let started = clock.now();
    let mut engine = Engine::new(&config.settings, IdentityMode::Selector, datapath);
    restored.reserve_identities(&mut engine);
    prime(&mut engine);
    engine.apply(config.endpoints.clone(), config.rules.clone(), clock.now())?;
    if !restored.answers.is_empty() {
        let n = restored.apply(&mut engine, &clock)?;
        tracing::info!(
            answers = n,
            entries = engine.names.mapping_count(),
            identities = engine.ipcache.allocator().len(),
            restore_ms = (clock.now() - started).as_millis(),
            "DNS cache restored"
        );
    }
    Ok(engine)
}

/// Builds the engine on the pinned maps: the engine writes the whole desired state, then what
/// an earlier run left there and is no longer wanted is removed (reconciled, never flushed).
pub(super) fn engine_on_kernel(
    config: &Config,
    pin_dir: &Path,
    clock: Clock,
    restored: &mut Restored,
    prime: impl FnOnce(&mut Engine<AnyDatapath>),
) -> Result<Engine<AnyDatapath>> {
    let mut maps = KernelDatapath::open(pin_dir).context("opening the pinned maps")?;
    maps.begin_resync().context("reading the pinned maps")?;
    let mut engine = build_engine(
        config,
        AnyDatapath::Kernel(Box::new(maps)),
        clock,
        restored,
        prime,
    )?;
    if let AnyDatapath::Kernel(maps) = engine.ipcache.datapath_mut() {
        let stats = maps
            .finish_resync()
            .context("reconciling the pinned maps")?;
        tracing::info!(
            kept = stats.kept,
            added = stats.added,
            removed = stats.removed,
            "pinned maps reconciled"
        );
    }
    Ok(engine)
}
