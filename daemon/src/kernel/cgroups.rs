//! Host processes as endpoints: the endpoints-by-cgroup map, the cgroup socket programs at
//! the root of the cgroup v2 hierarchy, and each endpoint's cgroup resolved to its id again
//! as cgroups come and go. The logic runs over [`CgroupOps`] — the kernel and the file system
//! ([`RealCgroups`]), or in unit tests a model of them — so it is tested without root.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use crate::{Context, Result, bail};
use fqdnd_config::Cgroup;
use fqdnd_ebpf::{EndpointFlags, KernelDatapath, Loaded};
use fqdnd_ipcache::EndpointId;

use super::{CgroupAttached, WantedCgroup};

/// What reconciling cgroup endpoints does to the kernel and reads of the file system.
pub trait CgroupOps {
    /// The cgroup v2 mount of the whole hierarchy, after the start-up checks.
    fn hierarchy(&self) -> Result<PathBuf>;
    /// `/proc/self/mountinfo`.
    fn mountinfo(&self) -> Result<String>;
    /// Refuses a path under `root` that can never match (a v1 path, a file, the mount written
    /// out), saying what to write.
    fn check_path(&self, root: &Path, below: &str, mountinfo: &str) -> Result<()>;
    /// The directory of `cgroup` under `root` (a systemd unit's found through systemd).
    fn dir(&self, root: &Path, cgroup: &Cgroup) -> Result<PathBuf>;
    /// This process's own cgroup directory under `root`.
    fn own(&self, root: &Path) -> Option<PathBuf>;
    /// The id of the cgroup at `path`; `None` while it does not exist.
    fn id(&self, path: &Path) -> Option<u64>;
    /// The proxy's network namespace cookie.
    fn netns_cookie(&self) -> Result<u64>;
    /// Whether socket programs are attached (by this run or an earlier one).
    fn programs_attached(&self) -> bool;
    /// Attaches the socket programs at `root`.
    fn attach_programs(&mut self, root: &Path) -> Result<()>;
    /// Detaches the socket programs.
    fn detach_programs(&mut self) -> Result<()>;
    /// The socket programs' settings: the proxy's namespace and how many entries there are.
    fn set_sock_settings(&mut self, netns_cookie: u64, entries: u32) -> Result<()>;
    /// Every (cgroup id, endpoint) in the map.
    fn entries(&self) -> Result<Vec<(u64, EndpointId)>>;
    /// Removes a cgroup's entry.
    fn remove_entry(&mut self, cgroup_id: u64) -> Result<()>;
    /// Writes a cgroup's entry.
    fn set_entry(&mut self, cgroup_id: u64, id: EndpointId, flags: EndpointFlags) -> Result<()>;
}

/// The kernel and the file system.
pub(super) struct RealCgroups<'a> {
    pub(super) loaded: &'a mut Loaded,
    pub(super) maps: &'a mut KernelDatapath,
    pub(super) pin_dir: &'a Path,
}

impl CgroupOps for RealCgroups<'_> {
    fn hierarchy(&self) -> Result<PathBuf> {
        cgroup_checks()
    }
    fn mountinfo(&self) -> Result<String> {
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")
    }
    fn check_path(&self, root: &Path, below: &str, mountinfo: &str) -> Result<()> {
        Ok(fqdnd_ebpf::cgroup::check_endpoint_path(
            root,
            below,
            mountinfo,
            fqdnd_ebpf::cgroup::found,
        )?)
    }
    fn dir(&self, root: &Path, cgroup: &Cgroup) -> Result<PathBuf> {
        cgroup_dir(root, cgroup)
    }
    fn own(&self, root: &Path) -> Option<PathBuf> {
        own_cgroup(root)
    }
    fn id(&self, path: &Path) -> Option<u64> {
        fqdnd_ebpf::cgroup::cgroup_id(path).ok()
    }
    fn netns_cookie(&self) -> Result<u64> {
        Ok(fqdnd_ebpf::sys::netns_cookie()?)
    }
    fn programs_attached(&self) -> bool {
        fqdnd_ebpf::cgroup_attached(self.pin_dir)
    }
    fn attach_programs(&mut self, root: &Path) -> Result<()> {
        Ok(self.loaded.attach_cgroup(root)?)
    }
    fn detach_programs(&mut self) -> Result<()> {
        Ok(self.loaded.detach_cgroup()?)
    }
    fn set_sock_settings(&mut self, netns_cookie: u64, entries: u32) -> Result<()> {
        Ok(self.maps.set_sock_settings(netns_cookie, entries)?)
    }
    fn entries(&self) -> Result<Vec<(u64, EndpointId)>> {
        Ok(self
            .maps
            .cgroup_entries()?
            .into_iter()
            .map(|(cgroup, id, _)| (cgroup, id))
            .collect())
    }
    fn remove_entry(&mut self, cgroup_id: u64) -> Result<()> {
        Ok(self.maps.remove_cgroup_endpoint(cgroup_id)?)
    }
    fn set_entry(&mut self, cgroup_id: u64, id: EndpointId, flags: EndpointFlags) -> Result<()> {
        Ok(self.maps.set_cgroup_endpoint(cgroup_id, id, flags)?)
    }
}

/// What this run's cgroup endpoints are and where the programs are attached.
#[derive(Debug, Default)]
pub struct Cgroups {
    /// Cgroup endpoints, by endpoint.
    endpoints: BTreeMap<EndpointId, CgroupAttached>,
    /// The cgroup v2 mount the socket programs are attached at (by this run), once they are.
    root: Option<PathBuf>,
    /// This process's network namespace cookie (the proxy's), once read.
    netns_cookie: Option<u64>,
}

impl Cgroups {
    /// The cgroup endpoints, with their directories and ids.
    pub fn endpoints(&self) -> &BTreeMap<EndpointId, CgroupAttached> {
        &self.endpoints
    }

    /// Makes the endpoints-by-cgroup map hold `wanted`. The cgroup socket programs are
    /// attached (after the start-up checks) when the first cgroup endpoint comes, or at the
    /// first sync with `host_processes`; once attached by this run they stay (attaching a
    /// cgroup skb program needs CAP_NET_ADMIN, which the node drops after start-up), doing
    /// nothing but a lookup while no cgroup endpoint is left. Programs an earlier run left
    /// attached are replaced, or detached when this run wants none. Entries are written
    /// before the programs run with them; entries no endpoint wants (removed endpoints, an
    /// earlier run's) are removed. A cgroup whose directory does not exist yet gets its entry
    /// once it does ([`Self::refresh`]).
    pub fn sync(
        &mut self,
        ops: &mut impl CgroupOps,
        wanted: &[WantedCgroup],
        host_processes: bool,
    ) -> Result<()> {
        if wanted.is_empty() && !host_processes && self.root.is_none() {
            self.endpoints.clear();
            self.remove_unwanted(ops)?;
            if ops.programs_attached() {
                ops.detach_programs()
                    .context("detaching the cgroup socket programs an earlier run attached")?;
                tracing::info!("cgroup socket programs detached: no cgroup endpoint");
            }
            return Ok(());
        }
        let root = match &self.root {
            Some(root) => root.clone(),
            None => ops.hierarchy()?,
        };
        let mut next = BTreeMap::new();
        let mountinfo = ops.mountinfo()?;
        for w in wanted {
            let path = ops.dir(&root, &w.cgroup)?;
            if let Cgroup::Path(below) = &w.cgroup {
                // a path that can never match is refused (saying what to write); one that
                // does not exist yet is matched once it does
                ops.check_path(&root, below, &mountinfo)
                    .with_context(|| format!("endpoint {}", w.id))?;
            }
            if let Some(own) = ops.own(&root)
                && own.starts_with(&path)
            {
                bail!(
                    "endpoint {} ({}): fqdnd itself runs in {}, inside that cgroup: its own \
                     upstream queries would be redirected to itself; run fqdnd outside the \
                     endpoint's cgroup",
                    w.id,
                    w.cgroup,
                    own.display()
                );
            }
            let kept = self
                .endpoints
                .get(&w.id)
                .filter(|old| old.wanted == *w && old.path == path)
                .and_then(|old| old.cgroup_id);
            next.insert(
                w.id,
                CgroupAttached {
                    wanted: w.clone(),
                    path,
                    cgroup_id: kept,
                },
            );
        }
        // The entries of endpoints gone or changed go first, so an id is never claimed twice.
        for (id, old) in &self.endpoints {
            let stays = next.get(id).and_then(|n| n.cgroup_id);
            if let Some(cgroup_id) = old.cgroup_id
                && stays != Some(cgroup_id)
            {
                ops.remove_entry(cgroup_id)
                    .with_context(|| format!("removing the cgroup entry of endpoint {id}"))?;
                tracing::info!(endpoint = %id, cgroup_id, "cgroup endpoint entry removed");
            }
        }
        self.endpoints = next;
        self.refresh(ops)?;
        for (id, entry) in &self.endpoints {
            if entry.cgroup_id.is_none() {
                tracing::warn!(endpoint = %id, cgroup = %entry.path.display(), "the endpoint's cgroup does not exist (yet): its processes are matched once it does");
            }
        }
        self.remove_unwanted(ops)?;
        self.write_sock_settings(ops)?;
        if self.root.is_none() {
            ops.attach_programs(&root).with_context(|| {
                format!(
                    "attaching the cgroup socket programs at {} (a node that has dropped its \
                     capabilities cannot: with `hostProcesses: true` in the Node document, or a \
                     cgroup Endpoint in the files, they are attached at start-up)",
                    root.display()
                )
            })?;
            tracing::info!(root = %root.display(), "cgroup socket programs attached");
            self.root = Some(root);
        }
        Ok(())
    }

    /// The socket programs' settings: the proxy's network namespace and how many cgroup
    /// endpoint entries there are (none: the programs return at once).
    fn write_sock_settings(&mut self, ops: &mut impl CgroupOps) -> Result<()> {
        let cookie = match self.netns_cookie {
            Some(c) => c,
            None => *self.netns_cookie.insert(
                ops.netns_cookie()
                    .context("reading the proxy's network namespace cookie")?,
            ),
        };
        let entries = self
            .endpoints
            .values()
            .filter(|c| c.cgroup_id.is_some())
            .count();
        ops.set_sock_settings(cookie, u32::try_from(entries).unwrap_or(u32::MAX))
            .context("writing the socket programs' settings")
    }

    /// Removes the map's entries of cgroups no endpoint has now.
    fn remove_unwanted(&mut self, ops: &mut impl CgroupOps) -> Result<()> {
        let ours: HashSet<u64> = self
            .endpoints
            .values()
            .filter_map(|c| c.cgroup_id)
            .collect();
        let entries = ops.entries().context("reading the cgroup endpoint map")?;
        for (cgroup_id, id) in entries {
            if !ours.contains(&cgroup_id) {
                ops.remove_entry(cgroup_id)
                    .with_context(|| format!("removing the cgroup entry of endpoint {id}"))?;
                tracing::info!(endpoint = %id, cgroup_id, "cgroup entry no endpoint has removed");
            }
        }
        Ok(())
    }

    /// Resolves each cgroup endpoint's directory to its id again and writes what changed: a
    /// directory created since, or removed and created again (a new id), or gone (its entry
    /// removed). Returns how many entries changed.
    pub fn refresh(&mut self, ops: &mut impl CgroupOps) -> Result<usize> {
        let mut changed = 0;
        for (id, entry) in &mut self.endpoints {
            let now = ops.id(&entry.path);
            if now == entry.cgroup_id {
                continue;
            }
            if let Some(old) = entry.cgroup_id {
                ops.remove_entry(old)
                    .with_context(|| format!("removing the cgroup entry of endpoint {id}"))?;
            }
            match now {
                Some(cgroup_id) => {
                    let flags = EndpointFlags {
                        enforce_egress: entry.wanted.enforcing.egress,
                        redirect_dns: true,
                        check_source: false,
                        enforce_ingress: entry.wanted.enforcing.ingress,
                    };
                    ops.set_entry(cgroup_id, *id, flags)
                        .with_context(|| format!("writing the cgroup entry of endpoint {id}"))?;
                    tracing::info!(endpoint = %id, cgroup = %entry.path.display(), cgroup_id, egress = entry.wanted.enforcing.egress, ingress = entry.wanted.enforcing.ingress, "cgroup endpoint in force");
                }
                None => {
                    tracing::warn!(endpoint = %id, cgroup = %entry.path.display(), "the endpoint's cgroup does not exist (yet): its processes are matched once it does");
                }
            }
            entry.cgroup_id = now;
            changed += 1;
        }
        if changed > 0 {
            self.write_sock_settings(ops)?;
        }
        Ok(changed)
    }
}

/// The start-up checks of cgroup endpoints: the cgroup v2 mount of the whole hierarchy, and
/// no cgroup v1 net_cls / net_prio in use. Returns the mount.
fn cgroup_checks() -> Result<PathBuf> {
    let root = fqdnd_ebpf::cgroup::v2_root().context("finding the cgroup v2 hierarchy")?;
    let unseen = fqdnd_ebpf::cgroup::check_v1_net()
        .context("checking the cgroup v1 net_cls / net_prio controllers")?;
    for controller in unseen {
        tracing::warn!(
            controller,
            "cgroup v1 {controller} is bound to a hierarchy this mount namespace does not show:              fqdnd cannot check that it is unused (if it is used, cgroup endpoints may not match              their sockets)"
        );
    }
    Ok(root)
}

/// The directory of `cgroup` under the v2 mount `root`.
fn cgroup_dir(root: &Path, cgroup: &Cgroup) -> Result<PathBuf> {
    let below = match cgroup {
        Cgroup::Path(p) => p.clone(),
        Cgroup::Unit(u) => fqdnd_ebpf::cgroup::unit_path(u)
            .with_context(|| format!("finding the cgroup of {u}"))?,
    };
    Ok(root.join(below.trim_start_matches('/')))
}

/// This process's cgroup v2 directory under `root`, if `/proc/self/cgroup` says.
fn own_cgroup(root: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let below = fqdnd_ebpf::cgroup::v2_path_of(&text)?;
    Some(root.join(below.trim_start_matches('/')))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use fqdnd_ebpf::cgroup::Found;

    use super::*;
    use crate::kernel::Enforcing;

    const ROOT: &str = "/sys/fs/cgroup/unified";
    const MOUNTINFO: &str = "30 23 0:26 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";

    /// The cgroup hierarchy, the programs' attachment and the map, as the reconciler sees
    /// them. It outlives a [`Cgroups`], as the kernel outlives a run.
    #[derive(Debug, Default)]
    struct Model {
        /// Cgroup directories and their ids.
        dirs: BTreeMap<PathBuf, u64>,
        /// fqdnd's own cgroup.
        own: Option<PathBuf>,
        /// Where the socket programs are attached.
        attached: Option<PathBuf>,
        entries: BTreeMap<u64, (EndpointId, EndpointFlags)>,
        settings: Option<(u64, u32)>,
    }

    impl Model {
        fn cgroup(&mut self, below: &str, id: u64) {
            self.dirs
                .insert(Path::new(ROOT).join(below.trim_start_matches('/')), id);
        }
        fn remove(&mut self, below: &str) {
            self.dirs
                .remove(&Path::new(ROOT).join(below.trim_start_matches('/')));
        }
        fn endpoints(&self) -> BTreeSet<(u64, u16)> {
            self.entries.iter().map(|(c, (id, _))| (*c, id.0)).collect()
        }
    }

    impl CgroupOps for Model {
        fn hierarchy(&self) -> Result<PathBuf> {
            Ok(PathBuf::from(ROOT))
        }
        fn mountinfo(&self) -> Result<String> {
            Ok(MOUNTINFO.to_owned())
        }
        fn check_path(&self, root: &Path, below: &str, mountinfo: &str) -> Result<()> {
            // The real checks, on the model's directories.
            Ok(fqdnd_ebpf::cgroup::check_endpoint_path(
                root,
                below,
                mountinfo,
                |path| {
                    Ok(if self.dirs.contains_key(path) {
                        Found::Directory
                    } else {
                        Found::Nothing
                    })
                },
            )?)
        }
        fn dir(&self, root: &Path, cgroup: &Cgroup) -> Result<PathBuf> {
            match cgroup {
                Cgroup::Path(p) => Ok(root.join(p.trim_start_matches('/'))),
                Cgroup::Unit(u) => bail!("no systemd here for {u}"),
            }
        }
        fn own(&self, _root: &Path) -> Option<PathBuf> {
            self.own.clone()
        }
        fn id(&self, path: &Path) -> Option<u64> {
            self.dirs.get(path).copied()
        }
        fn netns_cookie(&self) -> Result<u64> {
            Ok(4096)
        }
        fn programs_attached(&self) -> bool {
            self.attached.is_some()
        }
        fn attach_programs(&mut self, root: &Path) -> Result<()> {
            self.attached = Some(root.to_path_buf());
            Ok(())
        }
        fn detach_programs(&mut self) -> Result<()> {
            self.attached = None;
            Ok(())
        }
        fn set_sock_settings(&mut self, netns_cookie: u64, entries: u32) -> Result<()> {
            self.settings = Some((netns_cookie, entries));
            Ok(())
        }
        fn entries(&self) -> Result<Vec<(u64, EndpointId)>> {
            Ok(self.entries.iter().map(|(c, (id, _))| (*c, *id)).collect())
        }
        fn remove_entry(&mut self, cgroup_id: u64) -> Result<()> {
            self.entries.remove(&cgroup_id);
            Ok(())
        }
        fn set_entry(
            &mut self,
            cgroup_id: u64,
            id: EndpointId,
            flags: EndpointFlags,
        ) -> Result<()> {
            self.entries.insert(cgroup_id, (id, flags));
            Ok(())
        }
    }

    fn wanted(id: u16, below: &str) -> WantedCgroup {
        WantedCgroup {
            id: EndpointId(id),
            cgroup: Cgroup::Path(below.into()),
            enforcing: Enforcing {
                egress: true,
                ingress: false,
            },
        }
    }

    #[test]
    fn entries_follow_the_cgroups_as_they_come_go_and_come_back() {
        let mut kernel = Model::default();
        kernel.cgroup("/ci/job1", 11);
        let mut run = Cgroups::default();
        run.sync(
            &mut kernel,
            &[wanted(1, "/ci/job1"), wanted(2, "/ci/job2")],
            false,
        )
        .unwrap();
        assert_eq!(kernel.attached.as_deref(), Some(Path::new(ROOT)));
        assert_eq!(kernel.endpoints(), BTreeSet::from([(11, 1)]), "job2 waits");
        assert_eq!(kernel.settings, Some((4096, 1)));

        // job2's cgroup appears; job1's is removed and made again (a restarted unit): new id.
        kernel.cgroup("/ci/job2", 12);
        kernel.remove("/ci/job1");
        kernel.cgroup("/ci/job1", 21);
        assert_eq!(run.refresh(&mut kernel).unwrap(), 2);
        assert_eq!(kernel.endpoints(), BTreeSet::from([(21, 1), (12, 2)]));
        assert_eq!(kernel.settings, Some((4096, 2)));
        assert_eq!(run.refresh(&mut kernel).unwrap(), 0, "nothing changed");

        // The last endpoint gone: its entries go, the programs stay (re-attaching needs the
        // capability the node dropped) and do nothing but a lookup.
        run.sync(&mut kernel, &[], false).unwrap();
        assert!(kernel.entries.is_empty());
        assert_eq!(kernel.settings, Some((4096, 0)));
        assert!(kernel.attached.is_some());
    }

    #[test]
    fn a_restart_removes_an_earlier_run_s_entries_and_programs_no_endpoint_wants() {
        let mut kernel = Model::default();
        kernel.cgroup("/ci/job1", 11);
        kernel.attached = Some(PathBuf::from(ROOT));
        kernel
            .entries
            .insert(99, (EndpointId(7), EndpointFlags::default()));
        // A run with a cgroup endpoint: the earlier run's entry goes, its own is written.
        Cgroups::default()
            .sync(&mut kernel, &[wanted(1, "/ci/job1")], false)
            .unwrap();
        assert_eq!(kernel.endpoints(), BTreeSet::from([(11, 1)]));
        // A run with none (and no hostProcesses): programs and entries go.
        Cgroups::default().sync(&mut kernel, &[], false).unwrap();
        assert!(kernel.entries.is_empty());
        assert!(kernel.attached.is_none());
    }

    #[test]
    fn fqdnd_inside_an_endpoint_s_cgroup_and_paths_that_never_match_are_refused() {
        let mut kernel = Model::default();
        kernel.cgroup("/system.slice", 3);
        kernel.own = Some(Path::new(ROOT).join("system.slice/fqdnd.service"));
        let err = Cgroups::default()
            .sync(&mut kernel, &[wanted(1, "/system.slice")], false)
            .unwrap_err();
        assert!(crate::chain(&err).contains("fqdnd itself runs in"), "{err}");
        assert!(kernel.entries.is_empty() && kernel.attached.is_none());

        let err = Cgroups::default()
            .sync(&mut kernel, &[wanted(2, "/sys/fs/cgroup/unified/x")], false)
            .unwrap_err();
        assert!(
            crate::chain(&err).contains("endpoint 2"),
            "{}",
            crate::chain(&err)
        );
    }
}
