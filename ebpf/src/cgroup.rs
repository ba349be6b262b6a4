//! Host processes as endpoints: the cgroup v2 hierarchy the socket programs attach to, the
//! cgroup v1 controllers that would blind them, cgroup ids, and systemd units' cgroups.
//!
//! - **Where to attach.** Socket programs attach only to cgroup v2. Its mount is found in
//!   `/proc/self/mountinfo` (hybrid hosts mount it at `/sys/fs/cgroup/unified`, unified ones
//!   at `/sys/fs/cgroup`), and it must show the hierarchy from its root: a container's view
//!   (a mount of a sub-directory) would attach the programs where the host's sockets never
//!   pass (LPC 2021, "BPF datapath extensions for K8s workloads", the KIND case).
//! - **The v1 trap.** Before Linux 5.15 a socket's cgroup v2 pointer shared its storage with
//!   the v1 net_cls classid and net_prio index: once either controller is used (a classid or
//!   a priority set anywhere), sockets lose their v2 cgroup and the programs silently see the
//!   root instead. fqdnd refuses cgroup endpoints when a v1 hierarchy with net_cls or
//!   net_prio is mounted and a non-default value is set in it ([`check_v1_net`]).
//!
//! The decisions are pure functions of the files' text ([`v2_mount`], [`v1_net_in_use`]),
//! tested with sample contents; the readers around them are thin.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::Error;

/// One line of `/proc/self/mountinfo` (proc(5)): the fields fqdnd reads.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    /// The directory of the filesystem that is the mount's root (`/` for a whole hierarchy).
    root: String,
    /// Where it is mounted.
    point: PathBuf,
    /// The filesystem type (`cgroup2`, `cgroup`, …).
    fstype: String,
    /// Per-superblock options (a v1 hierarchy's controllers are among them).
    options: String,
}

/// mountinfo escapes space, tab, newline and backslash as `\NNN` (octal).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mounts of a mountinfo text; malformed lines are skipped.
fn mounts(mountinfo: &str) -> impl Iterator<Item = Mount> + '_ {
    mountinfo.lines().filter_map(|line| {
        // id parent major:minor root point options [optional…] - fstype source super-options
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        let fstype = right.next()?;
        let _source = right.next()?;
        let options = right.next().unwrap_or_default();
        Some(Mount {
            root: unescape(left.get(3)?),
            point: PathBuf::from(unescape(left.get(4)?)),
            fstype: fstype.to_owned(),
            options: options.to_owned(),
        })
    })
}

/// The cgroup v2 mount in a mountinfo text: the first `cgroup2` mount of the hierarchy's
/// root.
///
/// # Errors
/// [`Error::CgroupV2Missing`] when there is none, [`Error::CgroupV2NotRoot`] when the only
/// ones show a sub-directory (a container's view).
pub fn v2_mount(mountinfo: &str) -> Result<PathBuf, Error> {
    let mut partial = None;
    for m in mounts(mountinfo).filter(|m| m.fstype == "cgroup2") {
        if m.root == "/" {
            return Ok(m.point);
        }
        partial.get_or_insert(m);
    }
    match partial {
        Some(m) => Err(Error::CgroupV2NotRoot {
            mount: m.point,
            root: m.root,
        }),
        None => Err(Error::CgroupV2Missing),
    }
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        what: format!("reading {}", path.display()),
        error: source,
    })
}

/// [`v2_mount`] of this process's `/proc/self/mountinfo`.
///
/// # Errors
/// As [`v2_mount`], or the file cannot be read.
pub fn v2_root() -> Result<PathBuf, Error> {
    v2_mount(&read(Path::new("/proc/self/mountinfo"))?)
}

/// The cgroup v1 controllers that tag sockets.
pub const V1_NET_CONTROLLERS: [&str; 2] = ["net_cls", "net_prio"];

/// The file of a v1 controller that shows it in use, and whether its contents are not the
/// default (`net_cls.classid`: a class id other than 0; `net_prio.ifpriomap`: a priority
/// other than 0 on any interface).
fn in_use_file(controller: &str) -> (&'static str, fn(&str) -> bool) {
    if controller == "net_cls" {
        ("net_cls.classid", |text| {
            // anything but a plain 0 counts (an unreadable value too)
            !matches!(text.trim().parse::<u64>(), Ok(0))
        })
    } else {
        ("net_prio.ifpriomap", |text| {
            text.lines()
                .filter_map(|l| l.split_whitespace().nth(1))
                .any(|prio| prio != "0")
        })
    }
}

/// A v1 hierarchy holding one of [`V1_NET_CONTROLLERS`], as `/proc/cgroups` and mountinfo
/// show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V1NetMount {
    /// `net_cls` or `net_prio`.
    pub controller: &'static str,
    /// Where the hierarchy is mounted; `None` when `/proc/cgroups` puts the controller in a v1
    /// hierarchy this process sees no mount of (another mount namespace).
    pub path: Option<PathBuf>,
}

/// The net_cls / net_prio controllers bound to a v1 hierarchy (`/proc/cgroups`: hierarchy id
/// not 0, enabled), each with its mount in `mountinfo`. Controllers on the v2 hierarchy (id
/// 0) cannot tag sockets.
pub fn v1_net_mounts(proc_cgroups: &str, mountinfo: &str) -> Vec<V1NetMount> {
    let all: Vec<Mount> = mounts(mountinfo).filter(|m| m.fstype == "cgroup").collect();
    let mut out = Vec::new();
    for line in proc_cgroups.lines().filter(|l| !l.starts_with('#')) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, hierarchy, _count, enabled] = fields[..] else {
            continue;
        };
        let Some(controller) = V1_NET_CONTROLLERS.iter().find(|c| **c == name) else {
            continue;
        };
        if hierarchy == "0" || enabled == "0" {
            continue;
        }
        let mount = |root_only: bool| {
            all.iter()
                .filter(|m| !root_only || m.root == "/")
                .find(|m| m.options.split(',').any(|o| o == name))
                .map(|m| m.point.clone())
        };
        out.push(V1NetMount {
            controller,
            path: mount(true).or_else(|| mount(false)),
        });
    }
    out
}

/// Reads every `(file, contents)` of one file name (second argument) in the cgroup tree
/// under a hierarchy's mount (first argument).
pub type TreeReader<'a> = dyn FnMut(&Path, &str) -> Vec<(PathBuf, String)> + 'a;

/// The decision of [`check_v1_net`]: given the mounted v1 net controllers and a reader of
/// their in-use files, the first file showing a non-default value.
///
/// # Errors
/// [`Error::CgroupV1InUse`] naming the controller, the file and its value.
pub fn v1_net_in_use(mounted: &[V1NetMount], files: &mut TreeReader<'_>) -> Result<(), Error> {
    for m in mounted {
        let Some(path) = &m.path else { continue };
        let (name, in_use) = in_use_file(m.controller);
        for (file, text) in files(path, name) {
            if in_use(&text) {
                return Err(Error::CgroupV1InUse {
                    controller: m.controller,
                    file,
                    value: text.trim().replace('\n', "; "),
                });
            }
        }
    }
    Ok(())
}

/// Cgroup directories walked at most per hierarchy (a bound on a pathological tree).
const MAX_CGROUPS: usize = 100_000;

/// Every `(path, contents)` of the file `name` in the cgroup tree under `root`.
fn tree_files(root: &Path, name: &str) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    let mut seen = 0;
    while let Some(dir) = dirs.pop() {
        seen += 1;
        if seen > MAX_CGROUPS {
            break;
        }
        let file = dir.join(name);
        if let Ok(text) = std::fs::read_to_string(&file) {
            out.push((file, text));
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path());
            }
        }
    }
    out
}

/// The start-up check of cgroup endpoints: `Ok` with the v1 net controllers that are bound
/// to a hierarchy this process cannot see (the caller warns: they could not be checked), an
/// error when one is in use.
///
/// # Errors
/// [`Error::CgroupV1InUse`], or `/proc/cgroups` / mountinfo cannot be read.
pub fn check_v1_net() -> Result<Vec<&'static str>, Error> {
    // A kernel without cgroup v1 support has no /proc/cgroups: nothing to check.
    let proc_cgroups = match std::fs::read_to_string("/proc/cgroups") {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(Error::Io {
                what: "reading /proc/cgroups".to_owned(),
                error: source,
            });
        }
    };
    let mounted = v1_net_mounts(&proc_cgroups, &read(Path::new("/proc/self/mountinfo"))?);
    v1_net_in_use(&mounted, &mut tree_files)?;
    Ok(mounted
        .iter()
        .filter(|m| m.path.is_none())
        .map(|m| m.controller)
        .collect())
}

/// The id of the cgroup v2 directory `path` (what `bpf_skb_cgroup_id` and the socket
/// programs see): its inode number on cgroupfs.
///
/// # Errors
/// The directory cannot be read (it does not exist, say).
pub fn cgroup_id(path: &Path) -> std::io::Result<u64> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a cgroup directory", path.display()),
        ));
    }
    Ok(meta.ino())
}

/// What is at a path, as [`check_endpoint_path`] needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// A directory (a cgroup, under the v2 mount).
    Directory,
    /// Something else: a file such as `cgroup.procs`.
    File,
    /// Nothing (yet).
    Nothing,
    /// A component of the path is a file (`…/cgroup.procs/x`).
    UnderAFile,
}

/// What is at `path` on this host.
///
/// # Errors
/// The path cannot be examined for another reason than its absence (permissions, say).
pub fn found(path: &Path) -> std::io::Result<Found> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(Found::Directory),
        Ok(_) => Ok(Found::File),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Found::Nothing),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Ok(Found::UnderAFile),
        Err(e) => Err(e),
    }
}

/// Whether a cgroup endpoint's path (`below`: `/a/b` as configured, below the v2 hierarchy's
/// root, which is mounted at `root`) can ever match: its directory exists, or does not exist
/// yet (it is matched once it does). `found` says what is at a path (see [`found`]);
/// `mountinfo` is `/proc/self/mountinfo`'s text.
///
/// Refused, saying what to write instead, because they never match: the root cgroup (every
/// process of the host, fqdnd's own included); a path naming a file (`…/cgroup.procs`); and a
/// path that does not exist below the root but starts with a cgroup mount point — the v2
/// mount written out (`/sys/fs/cgroup/unified/x` is looked for at
/// `/sys/fs/cgroup/unified/sys/fs/cgroup/unified/x`), or a cgroup v1 hierarchy
/// (`/sys/fs/cgroup/cpu/x`: the socket programs see only cgroup v2).
///
/// # Errors
/// [`Error::CgroupPath`] saying why and what to write; [`Error::Io`] when the path cannot be
/// examined.
pub fn check_endpoint_path(
    root: &Path,
    below: &str,
    mountinfo: &str,
    found: impl Fn(&Path) -> std::io::Result<Found>,
) -> Result<(), Error> {
    let refuse = |reason: String| {
        Err(Error::CgroupPath {
            path: below.to_owned(),
            reason,
        })
    };
    let relative = below.trim_start_matches('/');
    if relative.is_empty() {
        return refuse(ROOT_CGROUP.to_owned());
    }
    let dir = root.join(relative);
    let what = found(&dir).map_err(|error| Error::Io {
        what: format!("examining {}", dir.display()),
        error,
    })?;
    let parent = Path::new(below)
        .parent()
        .map_or_else(|| "/".to_owned(), |p| p.display().to_string());
    match what {
        Found::Directory => return Ok(()),
        Found::File => {
            return refuse(format!(
                "{} is a file, not a cgroup directory: name the cgroup itself (`{parent}`)",
                dir.display()
            ));
        }
        Found::UnderAFile => {
            return refuse(format!(
                "a part of {} is a file, not a cgroup directory: name the cgroup itself",
                dir.display()
            ));
        }
        Found::Nothing => {}
    }
    // Not there: written as a path of a cgroup file system, it never will be.
    let written = Path::new(below);
    let mut cgroup_mounts: Vec<Mount> = mounts(mountinfo)
        .filter(|m| matches!(m.fstype.as_str(), "cgroup" | "cgroup2"))
        .filter(|m| m.point != Path::new("/") && written.starts_with(&m.point))
        .collect();
    // the deepest mount point first (`/sys/fs/cgroup/unified` under a v2 `/sys/fs/cgroup`)
    cgroup_mounts.sort_by_key(|m| std::cmp::Reverse(m.point.components().count()));
    let rest = |point: &Path| {
        let rest = written.strip_prefix(point).unwrap_or(written);
        format!("/{}", rest.display())
    };
    let how = "write the path below the cgroup v2 hierarchy's root, as the `0::` line of \
               /proc/<pid>/cgroup shows a process's cgroup";
    if let Some(m) = cgroup_mounts.first() {
        if m.fstype == "cgroup2" {
            return refuse(format!(
                "this is the path of the cgroup v2 mount ({}) written out, so it is looked for \
                 at {} and never matches; {how}: `{}`",
                m.point.display(),
                dir.display(),
                rest(&m.point)
            ));
        }
        let controllers: Vec<&str> = m
            .options
            .split(',')
            .filter(|o| !matches!(*o, "rw" | "ro") && !o.contains('='))
            .collect();
        return refuse(format!(
            "this is a cgroup v1 hierarchy ({}, mounted at {}): host processes are matched by \
             their cgroup v2 cgroup only (the v2 hierarchy is mounted at {}); {how}",
            controllers.join(","),
            m.point.display(),
            root.display()
        ));
    }
    if written.starts_with("/sys/fs/cgroup") {
        return refuse(format!(
            "this is a path of the cgroup file system written out, so it is looked for at {} \
             and never matches; {how} (the v2 hierarchy is mounted at {})",
            dir.display(),
            root.display()
        ));
    }
    Ok(())
}

/// Why the root cgroup is never an endpoint (the configuration refuses it first).
const ROOT_CGROUP: &str = "the root cgroup holds every process of the host, fqdnd's own \
                           included, so it is never an endpoint: name a cgroup below it";

/// The cgroup v2 path (below the hierarchy's root, starting with `/`) of the cgroup
/// `/proc/<pid>/cgroup` puts a process in (its `0::` line), from that file's text.
pub fn v2_path_of(proc_pid_cgroup: &str) -> Option<String> {
    proc_pid_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_owned)
}

/// The path of a systemd slice in the cgroup tree: each `-` of its name opens a parent slice
/// (`a-b.slice` is `/a.slice/a-b.slice`), `-.slice` is the root (systemd.slice(5)).
pub fn slice_path(slice: &str) -> Option<String> {
    let stem = slice.strip_suffix(".slice")?;
    if stem == "-" {
        return Some(String::new());
    }
    if stem.is_empty() || stem.starts_with('-') || stem.ends_with('-') || stem.contains("--") {
        return None;
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push('/');
        path.push_str(&prefix);
        path.push_str(".slice");
    }
    Some(path)
}

/// Whether systemd manages this host (`/run/systemd/system` exists, as `sd_booted(3)`).
pub fn systemd_running() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// The cgroup v2 path of a systemd unit: its `ControlGroup` while it runs, else where its
/// `Slice` puts it (`systemctl show`). Only where systemd runs.
///
/// # Errors
/// [`Error::SystemdNotRunning`] on a host without systemd, [`Error::Command`] when
/// `systemctl` fails or knows no such unit's place.
pub fn unit_path(unit: &str) -> Result<String, Error> {
    if !systemd_running() {
        return Err(Error::SystemdNotRunning {
            unit: unit.to_owned(),
        });
    }
    let show = |property: &str| -> Result<String, Error> {
        let args = ["show", "--property", property, "--value", "--", unit];
        let command = format!("systemctl {}", args.join(" "));
        let out = Command::new("systemctl")
            .args(args)
            .output()
            .map_err(|e| Error::Command {
                command: command.clone(),
                message: format!("cannot run systemctl: {e}"),
            })?;
        if !out.status.success() {
            return Err(Error::Command {
                command,
                message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let running = show("ControlGroup")?;
    if !running.is_empty() {
        return Ok(running);
    }
    let slice = show("Slice")?;
    let parent = slice_path(&slice).ok_or_else(|| Error::Command {
        command: format!("systemctl show --property Slice --value -- {unit}"),
        message: format!("no slice for the unit (got {slice:?})"),
    })?;
    Ok(format!("{parent}/{unit}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine kind: hybrid, v2 at /sys/fs/cgroup/unified, no net_cls/net_prio mount.
    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// Ubuntu 20.04 (the talk's example): hybrid, net_cls and net_prio co-mounted.
    const UBUNTU: &str = "\
25 24 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:25 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
33 25 0:31 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,net_cls,net_prio
";

    const UBUNTU_CGROUPS: &str = "\
#subsys_name\thierarchy\tnum_cgroups\tenabled
cpuset\t6\t1\t1
net_cls\t9\t1\t1
net_prio\t9\t1\t1
pids\t3\t120\t1
";

    /// This machine's /proc/cgroups: net_cls and net_prio on the v2 hierarchy (id 0).
    const HYBRID_CGROUPS: &str = "\
#subsys_name\thierarchy\tnum_cgroups\tenabled
cpuset\t3\t3\t1
net_cls\t0\t2\t1
net_prio\t0\t2\t1
";

    #[test]
    fn the_v2_mount_is_found_where_it_is() {
        assert_eq!(
            v2_mount(HYBRID).unwrap(),
            Path::new("/sys/fs/cgroup/unified")
        );
        assert_eq!(
            v2_mount(UBUNTU).unwrap(),
            Path::new("/sys/fs/cgroup/unified")
        );
        let unified = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        assert_eq!(v2_mount(unified).unwrap(), Path::new("/sys/fs/cgroup"));
        // A path with a space, escaped.
        let spaced = "41 31 0:38 / /mnt/my\\040cgroups rw - cgroup2 none rw\n";
        assert_eq!(v2_mount(spaced).unwrap(), Path::new("/mnt/my cgroups"));
    }

    #[test]
    fn a_containers_view_or_no_v2_is_refused() {
        // KIND: the node container sees its own sub-tree mounted as /sys/fs/cgroup.
        let kind = "1200 1100 0:26 /docker/node-a /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
        match v2_mount(kind) {
            Err(Error::CgroupV2NotRoot { mount, root }) => {
                assert_eq!(mount, Path::new("/sys/fs/cgroup"));
                assert_eq!(root, "/docker/node-a");
            }
            other => panic!("{other:?}"),
        }
        // A sub-tree mount next to the root one: the root one wins.
        let both = format!("{kind}41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
        assert_eq!(
            v2_mount(&both).unwrap(),
            Path::new("/sys/fs/cgroup/unified")
        );
        let v1_only = "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\nbroken line\n";
        assert!(matches!(v2_mount(v1_only), Err(Error::CgroupV2Missing)));
        assert!(matches!(v2_mount(""), Err(Error::CgroupV2Missing)));
    }

    #[test]
    fn v1_net_controllers_are_found_only_on_a_v1_hierarchy() {
        assert_eq!(v1_net_mounts(HYBRID_CGROUPS, HYBRID), Vec::new());
        let m = v1_net_mounts(UBUNTU_CGROUPS, UBUNTU);
        let at = Some(PathBuf::from("/sys/fs/cgroup/net_cls,net_prio"));
        assert_eq!(
            m,
            vec![
                V1NetMount {
                    controller: "net_cls",
                    path: at.clone()
                },
                V1NetMount {
                    controller: "net_prio",
                    path: at
                },
            ]
        );
        // Bound to a hierarchy this mount namespace does not show.
        let unseen = v1_net_mounts(UBUNTU_CGROUPS, HYBRID);
        assert_eq!(unseen.len(), 2);
        assert!(unseen.iter().all(|m| m.path.is_none()));
        // Disabled (cgroup_disable=net_cls): ignored.
        let disabled = UBUNTU_CGROUPS.replace("net_cls\t9\t1\t1", "net_cls\t9\t1\t0");
        assert_eq!(v1_net_mounts(&disabled, UBUNTU).len(), 1);
    }

    /// A fake cgroup tree: file name → (path, contents) rows.
    fn tree(rows: &[(&str, &str, &str)]) -> impl FnMut(&Path, &str) -> Vec<(PathBuf, String)> {
        let rows: Vec<(String, String, String)> = rows
            .iter()
            .map(|(n, p, t)| ((*n).to_owned(), (*p).to_owned(), (*t).to_owned()))
            .collect();
        move |root: &Path, name: &str| {
            rows.iter()
                .filter(|(n, ..)| n == name)
                .map(|(_, p, t)| (root.join(p), t.clone()))
                .collect()
        }
    }

    #[test]
    fn mounted_but_default_values_are_not_in_use() {
        let mounted = v1_net_mounts(UBUNTU_CGROUPS, UBUNTU);
        let mut files = tree(&[
            ("net_cls.classid", "net_cls.classid", "0\n"),
            ("net_cls.classid", "docker/x/net_cls.classid", "0\n"),
            ("net_prio.ifpriomap", "net_prio.ifpriomap", "lo 0\neth0 0\n"),
        ]);
        assert!(v1_net_in_use(&mounted, &mut files).is_ok());
    }

    #[test]
    fn a_classid_or_a_priority_set_anywhere_is_in_use() {
        let mounted = v1_net_mounts(UBUNTU_CGROUPS, UBUNTU);
        let mut classid = tree(&[
            ("net_cls.classid", "net_cls.classid", "0\n"),
            ("net_cls.classid", "tc/shaped/net_cls.classid", "1048577\n"),
        ]);
        match v1_net_in_use(&mounted, &mut classid) {
            Err(Error::CgroupV1InUse {
                controller,
                file,
                value,
            }) => {
                assert_eq!(controller, "net_cls");
                assert_eq!(
                    file,
                    Path::new("/sys/fs/cgroup/net_cls,net_prio/tc/shaped/net_cls.classid")
                );
                assert_eq!(value, "1048577");
            }
            other => panic!("{other:?}"),
        }
        let mut prio = tree(&[
            ("net_cls.classid", "net_cls.classid", "0\n"),
            ("net_prio.ifpriomap", "net_prio.ifpriomap", "lo 0\neth0 5\n"),
        ]);
        let err = v1_net_in_use(&mounted, &mut prio).unwrap_err();
        assert!(
            matches!(err, Error::CgroupV1InUse { controller: "net_prio", ref value, .. } if value == "lo 0; eth0 5")
        );
        // The message names the controller.
        assert!(err.to_string().contains("cgroup v1 net_prio is in use"));
        // A hierarchy this process cannot see is not read.
        let unseen = v1_net_mounts(UBUNTU_CGROUPS, HYBRID);
        assert!(v1_net_in_use(&unseen, &mut prio).is_ok());
    }

    #[test]
    fn the_processes_v2_cgroup_is_its_0_line() {
        let text = "9:name=systemd:/\n4:memory:/a/b\n0::/fqdnd-test/x\n";
        assert_eq!(v2_path_of(text).as_deref(), Some("/fqdnd-test/x"));
        assert_eq!(v2_path_of("4:memory:/a\n"), None);
    }

    #[test]
    fn slices_nest_by_dashes() {
        assert_eq!(slice_path("system.slice").unwrap(), "/system.slice");
        assert_eq!(
            slice_path("user-1000.slice").unwrap(),
            "/user.slice/user-1000.slice"
        );
        assert_eq!(
            slice_path("a-b-c.slice").unwrap(),
            "/a.slice/a-b.slice/a-b-c.slice"
        );
        assert_eq!(slice_path("-.slice").unwrap(), "");
        for bad in ["system", "a--b.slice", "-a.slice", "a-.slice", ".slice"] {
            assert_eq!(slice_path(bad), None, "{bad}");
        }
    }

    /// [`check_endpoint_path`] on the hybrid host ([`HYBRID`]), with a fake tree under
    /// `/sys/fs/cgroup/unified`: the cgroup `/ep` with its `cgroup.procs`.
    fn check(below: &str) -> Result<(), Error> {
        let root = Path::new("/sys/fs/cgroup/unified");
        check_endpoint_path(root, below, HYBRID, |p| {
            Ok(match p.strip_prefix(root).unwrap().to_str().unwrap() {
                "ep" => Found::Directory,
                "ep/cgroup.procs" => Found::File,
                p if p.starts_with("ep/cgroup.procs/") => Found::UnderAFile,
                _ => Found::Nothing,
            })
        })
    }

    fn reason(below: &str) -> String {
        match check(below) {
            Err(Error::CgroupPath { path, reason }) => {
                assert_eq!(path, below);
                reason
            }
            other => panic!("{below}: {other:?}"),
        }
    }

    #[test]
    fn endpoint_paths_that_can_never_match_are_refused_saying_what_to_write() {
        // a cgroup, or one that does not exist yet: fine
        assert!(check("/ep").is_ok());
        assert!(check("/ci/runner").is_ok());
        // the root
        assert!(reason("/").contains("the root cgroup"), "{}", reason("/"));
        // a file of the cgroup, and below one
        let r = reason("/ep/cgroup.procs");
        assert!(
            r.contains("/sys/fs/cgroup/unified/ep/cgroup.procs is a file")
                && r.contains("name the cgroup itself (`/ep`)"),
            "{r}"
        );
        assert!(reason("/ep/cgroup.procs/x").contains("is a file"));
        // the v2 mount written out: write what is below it
        let r = reason("/sys/fs/cgroup/unified/x");
        assert!(
            r.contains("the cgroup v2 mount (/sys/fs/cgroup/unified) written out")
                && r.ends_with("`/x`"),
            "{r}"
        );
        // a v1 hierarchy
        let r = reason("/sys/fs/cgroup/cpu/x");
        assert!(
            r.contains("cgroup v1 hierarchy (cpu, mounted at /sys/fs/cgroup/cpu)")
                && r.contains("v2 hierarchy is mounted at /sys/fs/cgroup/unified"),
            "{r}"
        );
        // the file system's directory itself
        assert!(reason("/sys/fs/cgroup/x").contains("cgroup file system written out"));
        // On a unified host (v2 at /sys/fs/cgroup): the mount written out.
        let unified = "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let r = check_endpoint_path(
            Path::new("/sys/fs/cgroup"),
            "/sys/fs/cgroup/a/b",
            unified,
            |_| Ok(Found::Nothing),
        );
        assert!(
            matches!(&r, Err(Error::CgroupPath { reason, .. }) if reason.ends_with("`/a/b`")),
            "{r:?}"
        );
        // The message names the path.
        let e = check("/sys/fs/cgroup/cpu/x").unwrap_err().to_string();
        assert!(e.starts_with("cgroup /sys/fs/cgroup/cpu/x: "), "{e}");
    }

    #[test]
    fn what_is_found_at_a_path() {
        let dir = std::env::temp_dir();
        assert_eq!(found(&dir).unwrap(), Found::Directory);
        assert_eq!(found(Path::new("/proc/self/status")).unwrap(), Found::File);
        assert_eq!(
            found(Path::new("/proc/self/status/x")).unwrap(),
            Found::UnderAFile
        );
        assert_eq!(
            found(&dir.join("fqdnd-no-such-dir-here")).unwrap(),
            Found::Nothing
        );
    }

    #[test]
    fn cgroup_ids_are_directory_inodes() {
        let dir = std::env::temp_dir();
        assert_eq!(
            cgroup_id(&dir).unwrap(),
            std::fs::metadata(&dir).unwrap().ino()
        );
        assert!(cgroup_id(Path::new("/proc/self/status")).is_err());
    }
}
