//! Loading the object, mounting bpffs and pinning the maps.

use std::path::{Path, PathBuf};

use aya::programs::{SchedClassifier, TcAttachType};
use aya::{Ebpf, EbpfLoader};
use nix::mount::{MsFlags, mount};
use nix::sys::statfs::{BPF_FS_MAGIC, statfs};

use crate::error::Error;
use crate::sys::ABI_VERSION;

/// The compiled `bpf/policy.c` (built by build.rs into `OUT_DIR`).
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/policy.o"));

/// Where bpffs is mounted.
pub const BPFFS_ROOT: &str = "/sys/fs/bpf";
/// The program for the host-side veth ingress (the endpoint's egress): policy.
pub const FROM_ENDPOINT: &str = "fqdnd_from_ep";
/// The program for the host-side veth egress (the endpoint's ingress): conntrack only.
pub const TO_ENDPOINT: &str = "fqdnd_to_ep";

/// The maps the object pins, by name (each is pinned as `<pin dir>/<name>`).
pub fn map_names() -> &'static [&'static str] {
    &[
        "fqdnd_ipc4",
        "fqdnd_ipc6",
        "fqdnd_endpoints",
        "fqdnd_policy",
        "fqdnd_ct",
        "fqdnd_events",
    ]
}

/// `/sys/fs/bpf/fqdnd/v<ABI>`: versioned, because aya reuses a pinned map of the same name
/// without checking its layout.
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
            source: e.into(),
        }
    };
    std::fs::create_dir_all(root).map_err(|source| Error::Io {
        what: format!("creating {}", root.display()),
        source,
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
    /// Mounts bpffs if needed, creates `pin_dir` (which must lie under [`BPFFS_ROOT`]), loads
    /// [`OBJECT`] pinning its maps there (reusing maps already pinned), and loads both
    /// programs.
    pub fn load(pin_dir: &Path) -> Result<Self, Error> {
        ensure_bpffs(Path::new(BPFFS_ROOT))?;
        std::fs::create_dir_all(pin_dir).map_err(|source| Error::Io {
            what: format!("creating {}", pin_dir.display()),
            source,
        })?;
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(pin_dir)
            .load(OBJECT)
            .map_err(Box::new)?;
        for name in [FROM_ENDPOINT, TO_ENDPOINT] {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .ok_or(Error::Missing("program"))?
                .try_into()?;
            prog.load()?;
        }
        Ok(Loaded {
            ebpf,
            pin_dir: pin_dir.to_owned(),
        })
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

    /// Attaches both programs to the host side of an endpoint's veth (TCX on kernels ≥ 6.6):
    /// [`FROM_ENDPOINT`] at ingress, [`TO_ENDPOINT`] at egress. The links live as long as
    /// this handle (pinning the links for restarts is still to come).
    pub fn attach(&mut self, iface: &str) -> Result<(), Error> {
        self.classifier(FROM_ENDPOINT)?
            .attach(iface, TcAttachType::Ingress)?;
        self.classifier(TO_ENDPOINT)?
            .attach(iface, TcAttachType::Egress)?;
        Ok(())
    }
}
