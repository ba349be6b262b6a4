//! Warnings about files whose permissions undo the policy: checked at start and on every
//! reload, one warning per file.
//!
//! - **Writable by group or others** (or owned by a user other than root and the daemon's):
//!   whoever can write the policy, a list or a static zone decides what clients may reach.
//!   Checked for every configuration file read, every list and zone file, and the
//!   directories holding them (a writable directory lets the file be replaced; the sticky bit,
//!   as on `/tmp`, prevents that).
//! - **Readable by others**, only where something sensitive is. Policies and lists are not
//!   secret, so the configuration files are not checked for it; the three secrets a
//!   configuration names — the etcd password file (`auth.passwordFile`), the dashboard's
//!   token file (`dashboard.tokenFile`) and the DoT/DoH private key (`tls.key`) — are checked
//!   where they are read (cluster glue, dashboard, [`crate::tls`]). What fqdnd *writes* is sensitive too: the query
//!   log and the state directory's journal say which client asked for which name. The query
//!   log is created 0600; an existing one, or a state directory, that others can read is
//!   warned about.

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use fqdnd_config::{Config, Daemon, StaticZone, ZoneSource};

/// Group- or other-writable.
const WRITABLE: u32 = 0o022;
/// Readable (or, for a directory, searchable) by others.
const OTHERS_READ: u32 = 0o005;
const STICKY: u32 = 0o1000;

/// What is wrong with `path`'s permissions for a file that decides the policy, if anything.
fn policy_problem(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    let mode = meta.permissions().mode();
    let me = nix::unistd::geteuid().as_raw();
    if meta.is_dir() && mode & STICKY != 0 {
        return None;
    }
    if mode & WRITABLE != 0 {
        return Some(format!(
            "is writable by {} (mode {:o}): anyone there can change what clients may reach; \
             make it writable by its owner only",
            if mode & 0o002 != 0 {
                "everyone"
            } else {
                "its group"
            },
            mode & 0o7777
        ));
    }
    if meta.uid() != 0 && meta.uid() != me {
        return Some(format!(
            "is owned by uid {} (neither root nor the daemon's user), who can change what \
             clients may reach",
            meta.uid()
        ));
    }
    None
}

/// Checks the files of `config` (and `daemon`'s lists, query log and state directory) and logs
/// one warning per problem; returns the warnings.
pub(crate) fn check(
    paths: &[PathBuf],
    config: &Config,
    daemon: &Daemon,
    zones: &[StaticZone],
) -> Vec<String> {
    let mut policy: BTreeSet<PathBuf> = BTreeSet::new();
    let files = config
        .sources
        .iter()
        .chain(&daemon.lists.deny)
        .chain(&daemon.lists.allow)
        .chain(zones.iter().filter_map(|z| match &z.source {
            ZoneSource::File(p) => Some(p),
            ZoneSource::Inline(_) => None,
        }));
    for file in files {
        policy.insert(file.clone());
        if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
            policy.insert(dir.to_path_buf());
        }
    }
    policy.extend(paths.iter().cloned());
    let mut warnings = Vec::new();
    for path in &policy {
        if let Some(problem) = policy_problem(path) {
            warnings.push(format!("{} {problem}", path.display()));
        }
    }
    let private = [
        daemon.query_log.as_ref().map(|p| (p, "the query log")),
        daemon
            .state_dir
            .as_ref()
            .map(|p| (p, "the state directory")),
    ];
    for (path, what) in private.into_iter().flatten() {
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & OTHERS_READ != 0
        {
            warnings.push(format!(
                "{} ({what}) is readable by everyone (mode {:o}): it tells which client asked for \
                 which name; restrict it to the daemon's user",
                path.display(),
                meta.permissions().mode() & 0o7777
            ));
        }
    }
    for w in &warnings {
        tracing::warn!("{w}");
    }
    warnings
}
