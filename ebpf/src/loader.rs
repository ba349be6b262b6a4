//! Loading the object, mounting bpffs and pinning the maps.

use std::path::{Path, PathBuf};

use aya::maps::{Map, MapData, MapError};
use aya::programs::links::{FdLink, LinkError, PinnedLink};
use aya::programs::tc::{SchedClassifierLink, TcAttachOptions};
use aya::programs::{
    CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, CgroupSockAddr, LinkOrder, ProgramError,
    SchedClassifier, TcAttachType,
};
use aya::{Ebpf, EbpfLoader};
use nix::mount::{MsFlags, mount};
use nix::sys::statfs::{BPF_FS_MAGIC, statfs};

use crate::error::Error;
use crate::migrate::{self, MapSizes, Migration};
use crate::sys::ABI_VERSION;

/// The compiled `bpf/policy.c`, which includes every program (built by build.rs into `OUT_DIR`).
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/policy.o"));

/// Where bpffs is mounted.
pub const BPFFS_ROOT: &str = "/sys/fs/bpf";
/// The program for the host-side veth ingress (the endpoint's egress): policy.
pub const FROM_ENDPOINT: &str = "fqdnd_from_ep";
/// The program for the host-side veth egress (the endpoint's ingress): conntrack only.
pub const TO_ENDPOINT: &str = "fqdnd_to_ep";

/// The cgroup socket-address programs (host processes' DNS redirect), each attached at the
/// root of the cgroup v2 hierarchy by [`Loaded::attach_cgroup`]; the attach type comes from
/// the program's ELF section.
pub const SOCK_ADDR_PROGRAMS: [&str; 8] = [
    "fqdnd_connect4",
    "fqdnd_connect6",
    "fqdnd_sendmsg4",
    "fqdnd_sendmsg6",
    "fqdnd_recvmsg4",
    "fqdnd_recvmsg6",
    "fqdnd_getpeername4",
    "fqdnd_getpeername6",
];

/// The cgroup skb programs (host processes' egress and ingress policy, conntrack), with
/// where they attach.
pub const SOCK_SKB_PROGRAMS: [(&str, CgroupSkbAttachType); 2] = [
    ("fqdnd_sock_egress", CgroupSkbAttachType::Egress),
    ("fqdnd_sock_ingress", CgroupSkbAttachType::Ingress),
];

/// The maps the object pins, by name (each is pinned as `<pin dir>/<name>`).
pub fn map_names() -> &'static [&'static str] {
    &[
        "fqdnd_ipc4",
        "fqdnd_ipc6",
        "fqdnd_endpoints",
        "fqdnd_policy",
        "fqdnd_ct",
        "fqdnd_events",
        "fqdnd_clients4",
        "fqdnd_clients6",
        "fqdnd_dns_proxy",
        "fqdnd_lb_svc",
        "fqdnd_lb_backends",
        "fqdnd_lb_revnat",
        "fqdnd_ep_addrs",
        "fqdnd_frags",
        "fqdnd_settings",
        "fqdnd_cgroups",
        "fqdnd_sock_dns",
        "fqdnd_dns_origins",
        "fqdnd_sock_cfg",
    ]
}

/// The directory of the pinned TCX links: `<pin_dir>/links`, one pin per interface and
/// direction, `<iface>-ingress` ([`FROM_ENDPOINT`]) and `<iface>-egress` ([`TO_ENDPOINT`]).
pub fn links_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join("links")
}

const DIRECTIONS: [(&str, TcAttachType, &str); 2] = [
    (FROM_ENDPOINT, TcAttachType::Ingress, "ingress"),
    (TO_ENDPOINT, TcAttachType::Egress, "egress"),
];

/// The interfaces that have a pinned link in `pin_dir` (sorted, each once), so a restarted
/// daemon sees what its predecessor attached. A missing or unreadable directory is none.
pub fn attached_interfaces(pin_dir: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(links_dir(pin_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| {
            let (iface, dir) = name.rsplit_once('-')?;
            matches!(dir, "ingress" | "egress").then(|| iface.to_owned())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The interface index each pinned link is attached to, by the interface name the agent
/// pinned it under: names resolved in the agent's network namespace, whatever namespace the
/// caller is in (interface indexes are per namespace). Read from the kernel's description of
/// the link (`/proc/self/fdinfo` of the link opened from its pin: `link_id`, `ifindex`). An
/// unreadable pin is left out.
pub fn attached_ifindexes(pin_dir: &Path) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for iface in attached_interfaces(pin_dir) {
        let pin = links_dir(pin_dir).join(format!("{iface}-ingress"));
        let Ok(link) = PinnedLink::from_pin(&pin) else {
            continue;
        };
        let link = FdLink::from(link);
        let Ok(info) = link.info() else { continue };
        if let Some(ifindex) = fdinfo_ifindex(info.id()) {
            out.push((iface, ifindex));
        }
    }
    out
}

/// The `ifindex` of the open link with id `link_id`, from this process's fdinfo.
fn fdinfo_ifindex(link_id: u32) -> Option<u32> {
    let wanted = format!("link_id:\t{link_id}");
    for entry in std::fs::read_dir("/proc/self/fdinfo").ok()?.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        if !text.lines().any(|l| l == wanted) {
            continue;
        }
        return text
            .lines()
            .find_map(|l| l.strip_prefix("ifindex:"))
            .and_then(|v| v.trim().parse().ok());
    }
    None
}

/// Removes the pinned links of `iface` (its programs detach once no process holds the link);
/// missing pins are fine. Needs no loaded object: an operator's CLI can call it.
pub fn detach_pinned(pin_dir: &Path, iface: &str) -> Result<(), Error> {
    for (_, _, dir) in DIRECTIONS {
        let pin = links_dir(pin_dir).join(format!("{iface}-{dir}"));
        match std::fs::remove_file(&pin) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(Error::Io {
                    what: format!("removing {}", pin.display()),
                    error: source,
                });
            }
        }
    }
    Ok(())
}

/// `prog` at `attach_type` of `iface` through the link pinned at `pin`: the pinned link's
/// program is replaced in place (`bpf_link_update`: no moment without a program) when it
/// exists, else a new TCX link is created and pinned. A pinned link whose interface is gone
/// (the kernel answers ENOLINK) is unpinned and replaced by a new one. With `replace_only`
/// (a migration updating the links it finds) nothing is created: a missing pin is left
/// missing and a stale one is only removed.
fn attach_pinned(
    prog: &mut SchedClassifier,
    iface: &str,
    attach_type: TcAttachType,
    pin: &Path,
    replace_only: bool,
) -> Result<(), Error> {
    match PinnedLink::from_pin(pin) {
        Ok(old) => {
            let link = SchedClassifierLink::try_from(FdLink::from(old))?;
            match prog.attach_to_link(link) {
                Ok(id) => {
                    // The pin holds the link; this process keeps no handle on it.
                    drop(prog.take_link(id)?);
                    return Ok(());
                }
                Err(ProgramError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOLINK) =>
                {
                    std::fs::remove_file(pin).map_err(|source| Error::Io {
                        what: format!("removing the stale link pin {}", pin.display()),
                        error: source,
                    })?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(LinkError::SyscallError(e)) if e.io_error.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    if replace_only {
        return Ok(());
    }
    let id = prog.attach_with_options(
        iface,
        attach_type,
        TcAttachOptions::TcxOrder(LinkOrder::default()),
    )?;
    let link: FdLink = prog.take_link(id)?.try_into()?;
    // If pinning fails the link is dropped here, which detaches it: no unpinned leftovers.
    drop(link.pin(pin)?);
    Ok(())
}

/// `/sys/fs/bpf/fqdnd/v<ABI>`: versioned by the map layout. aya reuses a pinned map of the
/// same name without checking it; [`Loaded::load_with`] checks type, key and value size
/// (refused when different) and `max_entries` (migrated when different).
pub fn default_pin_dir() -> PathBuf {
    Path::new(BPFFS_ROOT)
        .join("fqdnd")
        .join(format!("v{ABI_VERSION}"))
}

/// Mounts bpffs at `root` unless it is mounted there already.
pub fn ensure_bpffs(root: &Path) -> Result<(), Error> {
    let io = |what: String| {
        move |e: nix::Error| Error::Io {
            what,
            error: e.into(),
        }
    };
    std::fs::create_dir_all(root).map_err(|source| Error::Io {
        what: format!("creating {}", root.display()),
        error: source,
    })?;
    let fs = statfs(root).map_err(io(format!("statfs {}", root.display())))?;
    if fs.filesystem_type() == BPF_FS_MAGIC {
        return Ok(());
    }
    mount(
        Some("bpf"),
        root,
        Some("bpf"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(io(format!("mounting bpffs at {}", root.display())))
}

/// The loaded object: maps created or reused from `pin_dir`, both programs loaded (verified)
/// but not attached.
pub struct Loaded {
    /// The aya handle; programs and maps live as long as it does (pins outlive it).
    pub ebpf: Ebpf,
    pin_dir: PathBuf,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("pin_dir", &self.pin_dir)
            .finish_non_exhaustive()
    }
}

impl Loaded {
    /// [`Self::load_with`] the default [`MapSizes`] (the object's own). Pinned maps of
    /// other sizes are migrated to the defaults (or refused when they do not fit).
    pub fn load(pin_dir: &Path) -> Result<Self, Error> {
        Ok(Self::load_with(pin_dir, &MapSizes::default())?.0)
    }

    /// Mounts bpffs if needed, creates `pin_dir` (which must lie under [`BPFFS_ROOT`]), loads
    /// [`OBJECT`] with its maps pinned there and sized by `sizes`, and loads both programs.
    ///
    /// Pinned maps are checked first (aya would reuse them blindly): a different type, key
    /// or value size or flags is [`Error::MapLayout`] and nothing changes. A pinned map of
    /// the right layout and size is reused. One whose `max_entries` differs is **migrated**,
    /// never flushed: a new map of the new size is created in a staging directory, every
    /// entry is copied, the new pins replace the old ones (`rename`, atomic per map), the
    /// programs in the pinned links of every interface of [`attached_interfaces`] are
    /// replaced by the new ones (bound to the new maps), and conntrack entries the old
    /// programs wrote meanwhile are copied again. A map whose entries do not fit the new size
    /// is [`Error::MapTooSmall`] and everything stays as it was. Returns what was migrated
    /// (empty when nothing was). Call it before opening [`crate::KernelDatapath`] or
    /// [`crate::Events`]: handles opened earlier keep the old maps.
    ///
    /// Crash safety (docs/ebpf-plan.md): until the pins are switched, the canonical pins are
    /// the old maps, in use by the links; leftovers in the staging directory are removed by
    /// the next load. Each switched pin names a complete copy, so a load after a crash
    /// between switches reuses the switched maps and migrates the rest.
    pub fn load_with(pin_dir: &Path, sizes: &MapSizes) -> Result<(Self, Vec<Migration>), Error> {
        sizes.validate()?;
        ensure_bpffs(Path::new(BPFFS_ROOT))?;
        std::fs::create_dir_all(pin_dir).map_err(|source| Error::Io {
            what: format!("creating {}", pin_dir.display()),
            error: source,
        })?;
        let staging = migrate::staging_dir(pin_dir);
        // An interrupted migration's new maps: never in use by a link (see above).
        migrate::remove_staging(&staging)?;

        let specs = migrate::specs(sizes);
        let mut pending = Vec::new();
        for spec in specs {
            let data = match MapData::from_pin(pin_dir.join(spec.name)) {
                Ok(d) => d,
                Err(MapError::SyscallError(e))
                    if e.io_error.kind() == std::io::ErrorKind::NotFound =>
                {
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let info = data.info()?;
            migrate::check_layout(&spec, &info)?;
            if info.max_entries() != spec.max_entries {
                pending.push(migrate::Pending::new(
                    spec,
                    Map::from_map_data(data)?,
                    info.max_entries(),
                ));
            }
        }
        // Refuse a shrink that cannot hold the entries before creating anything.
        for p in &pending {
            if p.spec.max_entries < p.from_max {
                let n = migrate::count(&p.spec, &p.old)?;
                if n > p.spec.max_entries as usize {
                    return Err(Error::MapTooSmall {
                        map: p.spec.name.to_owned(),
                        entries: n,
                        max_entries: p.spec.max_entries,
                    });
                }
            }
        }

        let mut loader = EbpfLoader::new();
        loader.default_map_pin_directory(pin_dir);
        for spec in &specs {
            loader.map_max_entries(spec.name, spec.max_entries);
        }
        if !pending.is_empty() {
            std::fs::create_dir_all(&staging).map_err(|source| Error::Io {
                what: format!("creating {}", staging.display()),
                error: source,
            })?;
            for p in &pending {
                // a fresh path: aya creates the map instead of reusing the pinned one
                loader.map_pin_path(p.spec.name, staging.join(p.spec.name));
            }
        }
        let result = Self::load_programs(&mut loader, pin_dir).and_then(|mut loaded| {
            for p in &mut pending {
                p.copy_into(loaded.map_mut(p.spec.name)?)?;
            }
            Ok(loaded)
        });
        let mut loaded = match result {
            Ok(l) => l,
            Err(e) => {
                // The old pins were not touched.
                let _ = migrate::remove_staging(&staging);
                return Err(e);
            }
        };
        if pending.is_empty() {
            return Ok((loaded, Vec::new()));
        }

        // Switch the pins, one atomic rename per map: from here on a reader (or the next
        // load) opens the new maps.
        for p in &pending {
            let from = staging.join(p.spec.name);
            let to = pin_dir.join(p.spec.name);
            std::fs::rename(&from, &to).map_err(|source| Error::Io {
                what: format!("moving the pin {} to {}", from.display(), to.display()),
                error: source,
            })?;
        }
        migrate::remove_staging(&staging)?;

        // The links: replace the old programs (bound to the old maps) in place. The first
        // failure is reported after trying every interface.
        let mut first_err = None;
        for iface in attached_interfaces(pin_dir) {
            if let Err(e) = loaded.replace_in_links(&iface) {
                first_err.get_or_insert(e);
            }
        }
        if cgroup_attached(pin_dir) {
            let replaced = crate::cgroup::v2_root().and_then(|root| loaded.attach_cgroup(&root));
            if let Err(e) = replaced {
                first_err.get_or_insert(e);
            }
        }
        // Conntrack entries the old programs wrote between the first copy and the update.
        for p in &pending {
            p.recopy_changed(loaded.map_mut(p.spec.name)?)?;
        }
        let mut migrations = Vec::new();
        for p in pending {
            let entries_after = migrate::count(&p.spec, loaded.map_mut(p.spec.name)?)?;
            migrations.push(Migration {
                map: p.spec.name.to_owned(),
                from_max: p.from_max,
                to_max: p.spec.max_entries,
                entries_before: p.entries_before,
                entries_after,
            });
            // `p.old` closes here: with the links updated nothing else holds the old map.
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok((loaded, migrations))
    }

    fn load_programs(loader: &mut EbpfLoader<'_>, pin_dir: &Path) -> Result<Self, Error> {
        let mut ebpf = loader.load(OBJECT).map_err(Box::new)?;
        for name in [FROM_ENDPOINT, TO_ENDPOINT] {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .ok_or(Error::Missing("program"))?
                .try_into()?;
            load_program(|| prog.load())?;
        }
        // Loaded (verified) now, while the daemon still holds its capabilities: a cgroup
        // endpoint added at run time only needs the links.
        for name in SOCK_ADDR_PROGRAMS {
            let prog: &mut CgroupSockAddr = ebpf
                .program_mut(name)
                .ok_or(Error::Missing("program"))?
                .try_into()?;
            load_program(|| prog.load())?;
        }
        for (name, _) in SOCK_SKB_PROGRAMS {
            let prog: &mut CgroupSkb = ebpf
                .program_mut(name)
                .ok_or(Error::Missing("program"))?
                .try_into()?;
            load_program(|| prog.load())?;
        }
        Ok(Loaded {
            ebpf,
            pin_dir: pin_dir.to_owned(),
        })
    }

    fn map_mut(&mut self, name: &str) -> Result<&mut Map, Error> {
        self.ebpf.map_mut(name).ok_or(Error::Missing("map"))
    }

    /// The pin directory of the maps.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// One of the two classifiers ([`FROM_ENDPOINT`], [`TO_ENDPOINT`]).
    pub fn classifier(&mut self, name: &str) -> Result<&mut SchedClassifier, Error> {
        Ok(self
            .ebpf
            .program_mut(name)
            .ok_or(Error::Missing("program"))?
            .try_into()?)
    }

    /// Attaches both programs to the host side of an endpoint's veth with TCX links pinned
    /// under [`links_dir`]: [`FROM_ENDPOINT`] at ingress, [`TO_ENDPOINT`] at egress. The links
    /// outlive this handle and the process (a stopped daemon keeps enforcing). When a link is
    /// already pinned (daemon restart), its program is replaced atomically in the link.
    pub fn attach(&mut self, iface: &str) -> Result<(), Error> {
        let dir = links_dir(&self.pin_dir);
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            what: format!("creating {}", dir.display()),
            error: source,
        })?;
        for (name, attach_type, suffix) in DIRECTIONS {
            let pin = dir.join(format!("{iface}-{suffix}"));
            attach_pinned(self.classifier(name)?, iface, attach_type, &pin, false)?;
        }
        Ok(())
    }

    /// Replaces the programs in the links pinned for `iface`, creating none.
    fn replace_in_links(&mut self, iface: &str) -> Result<(), Error> {
        let dir = links_dir(&self.pin_dir);
        for (name, attach_type, suffix) in DIRECTIONS {
            let pin = dir.join(format!("{iface}-{suffix}"));
            attach_pinned(self.classifier(name)?, iface, attach_type, &pin, true)?;
        }
        Ok(())
    }

    /// Detaches both programs from `iface` by removing their link pins ([`detach_pinned`]).
    pub fn detach(&mut self, iface: &str) -> Result<(), Error> {
        detach_pinned(&self.pin_dir, iface)
    }

    /// Attaches the cgroup socket programs at `root`, the root of the cgroup v2 hierarchy
    /// ([`crate::cgroup::v2_root`]), with links pinned under [`cgroup_links_dir`]: they run for
    /// every socket of the host from then on, the programs return at once for sockets of no
    /// endpoint's cgroup. Links pinned already (a restart) are replaced make-before-break:
    /// the new link is attached and pinned first, then the old pin goes (both run meanwhile:
    /// the old redirect sends DNS to the proxy, which the new one leaves alone; the policy
    /// programs share the maps).
    pub fn attach_cgroup(&mut self, root: &Path) -> Result<(), Error> {
        let dir = cgroup_links_dir(&self.pin_dir);
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            what: format!("creating {}", dir.display()),
            error: source,
        })?;
        let cgroup = std::fs::File::open(root).map_err(|source| Error::Io {
            what: format!("opening the cgroup {}", root.display()),
            error: source,
        })?;
        for name in SOCK_ADDR_PROGRAMS {
            let prog: &mut CgroupSockAddr = self
                .ebpf
                .program_mut(name)
                .ok_or(Error::Missing("program"))?
                .try_into()?;
            // A link is always "multi": the kernel wants no attach flag with it.
            let id = prog.attach(&cgroup, CgroupAttachMode::Single)?;
            let link: FdLink = prog.take_link(id)?.try_into()?;
            swap_pin(link, &dir, name)?;
        }
        for (name, attach_type) in SOCK_SKB_PROGRAMS {
            let prog: &mut CgroupSkb = self
                .ebpf
                .program_mut(name)
                .ok_or(Error::Missing("program"))?
                .try_into()?;
            let id = prog.attach(&cgroup, attach_type, CgroupAttachMode::Single)?;
            let link: FdLink = prog.take_link(id)?.try_into()?;
            swap_pin(link, &dir, name)?;
        }
        Ok(())
    }

    /// Detaches the cgroup socket programs ([`detach_cgroup_pinned`]).
    pub fn detach_cgroup(&mut self) -> Result<(), Error> {
        detach_cgroup_pinned(&self.pin_dir)
    }
}

/// The directory of the pinned cgroup links: `<pin_dir>/cgroup`, one pin per program.
pub fn cgroup_links_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join("cgroup")
}

/// Whether cgroup socket programs are attached from `pin_dir` (a pin exists).
pub fn cgroup_attached(pin_dir: &Path) -> bool {
    std::fs::read_dir(cgroup_links_dir(pin_dir)).is_ok_and(|mut d| d.next().is_some())
}

/// Removes the pinned cgroup links of `pin_dir` (their programs detach once no process holds
/// the link); missing pins are fine. Needs no loaded object.
pub fn detach_cgroup_pinned(pin_dir: &Path) -> Result<(), Error> {
    let dir = cgroup_links_dir(pin_dir);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io {
            what: format!("removing {}", dir.display()),
            error: source,
        }),
    }
}

/// Pins `link` as `<dir>/<name>`, replacing what was pinned there: pinned first under a
/// temporary name, then renamed over the old pin (atomic), whose link is released.
fn swap_pin(link: FdLink, dir: &Path, name: &str) -> Result<(), Error> {
    let pin = dir.join(name);
    // (bpffs refuses names with a dot)
    let fresh = dir.join(format!("{name}_new"));
    match std::fs::remove_file(&fresh) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(Error::Io {
                what: format!("removing the stale pin {}", fresh.display()),
                error: source,
            });
        }
    }
    // If pinning fails the link is dropped here, which detaches it.
    drop(link.pin(&fresh)?);
    std::fs::rename(&fresh, &pin).map_err(|source| Error::Io {
        what: format!("moving the pin {} to {}", fresh.display(), pin.display()),
        error: source,
    })
}

/// How many times a program is offered to the verifier (libbpf's number).
const LOAD_ATTEMPTS: usize = 5;

/// Loads a program, again if the verifier gave up because a signal was pending for the loading
/// thread: it then answers `EAGAIN` (a child process of the daemon or of a test harness exiting
/// is enough). libbpf tries five times too.
fn load_program(load: impl FnMut() -> Result<(), ProgramError>) -> Result<(), ProgramError> {
    retry_interrupted(load, |e| {
        matches!(e, ProgramError::LoadError { io_error, .. }
            if io_error.kind() == std::io::ErrorKind::WouldBlock)
    })
}

/// `op` until it succeeds, fails other than `interrupted`, or has run [`LOAD_ATTEMPTS`] times.
fn retry_interrupted<E>(
    mut op: impl FnMut() -> Result<(), E>,
    interrupted: impl Fn(&E) -> bool,
) -> Result<(), E> {
    let mut attempts = 1;
    loop {
        match op() {
            Err(e) if interrupted(&e) && attempts < LOAD_ATTEMPTS => attempts += 1,
            done => return done,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Error, ErrorKind};

    use super::{LOAD_ATTEMPTS, retry_interrupted};

    /// Runs `retry_interrupted` over `results` (then successes); what it returned and how
    /// many times it ran the operation.
    fn run(results: Vec<Result<(), ErrorKind>>) -> (Result<(), ErrorKind>, usize) {
        let mut calls = 0;
        let mut results = results.into_iter();
        let got = retry_interrupted(
            || {
                calls += 1;
                results.next().unwrap_or(Ok(())).map_err(Error::from)
            },
            |e| e.kind() == ErrorKind::WouldBlock,
        );
        (got.map_err(|e| e.kind()), calls)
    }

    #[test]
    fn an_interrupted_load_is_tried_again() {
        let eagain = Err(ErrorKind::WouldBlock);
        assert_eq!(run(vec![]), (Ok(()), 1));
        assert_eq!(run(vec![eagain, eagain]), (Ok(()), 3));
        // Interrupted every time: the last error, after LOAD_ATTEMPTS tries.
        assert_eq!(
            run(vec![eagain; 2 * LOAD_ATTEMPTS]),
            (eagain, LOAD_ATTEMPTS)
        );
    }

    #[test]
    fn a_refused_load_is_not_tried_again() {
        let denied = Err(ErrorKind::PermissionDenied);
        assert_eq!(run(vec![denied]), (denied, 1));
        assert_eq!(run(vec![Err(ErrorKind::WouldBlock), denied]), (denied, 2));
    }
}
