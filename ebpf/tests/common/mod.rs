//! Helpers shared by the privileged tests: root check, pin dirs, network namespaces with a
//! veth pair, the local-delivery routes. Every resource is a Drop guard, so a failing test
//! still cleans up.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers (a module of each test crate); not every test file uses every helper"
)]

pub mod packets;

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// A unique pin dir under bpffs, removed on drop (with its maps and link pins).
pub struct PinDir(pub PathBuf);

impl PinDir {
    pub fn new(test: &str) -> Self {
        PinDir(PathBuf::from(format!(
            "/sys/fs/bpf/fqdnd-test-{}-{test}",
            std::process::id()
        )))
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether the test can run: root, or skip with a message (fail with
/// `FQDND_REQUIRE_PRIVILEGED=1`).
pub fn privileged(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let msg = format!("{test}: needs root for eBPF (skipped)");
    assert!(
        std::env::var("FQDND_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
        "{msg}, and FQDND_REQUIRE_PRIVILEGED=1"
    );
    eprintln!("{msg}");
    false
}

/// Runs `ip <args>`, panicking with its stderr on failure.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace `ns` with a veth pair: `host` in the caller's namespace
/// (10.98.<n>.1/24, fd00:98:<n>::1/64), `peer` inside (10.98.<n>.2, fd00:98:<n>::2, default
/// routes via the host side). Deleted on drop.
pub struct Netns {
    pub ns: String,
    pub host: String,
    pub n: u8,
}

impl Netns {
    pub fn new(n: u8) -> Self {
        let pid = std::process::id() % 100_000;
        let guard = Netns {
            ns: format!("fqdnd-test-{pid}-{n}"),
            host: format!("fqh{pid}x{n}"),
            n,
        };
        let peer = format!("fqp{pid}x{n}");
        let (ns, host) = (guard.ns.as_str(), guard.host.as_str());
        ip(&["netns", "add", ns]);
        ip(&[
            "link", "add", host, "type", "veth", "peer", "name", &peer, "netns", ns,
        ]);
        ip(&["addr", "add", &format!("10.98.{n}.1/24"), "dev", host]);
        ip(&[
            "-6",
            "addr",
            "add",
            &format!("fd00:98:{n}::1/64"),
            "dev",
            host,
            "nodad",
        ]);
        ip(&["link", "set", host, "up"]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("10.98.{n}.2/24"),
            "dev",
            &peer,
        ]);
        ip(&[
            "-n",
            ns,
            "-6",
            "addr",
            "add",
            &format!("fd00:98:{n}::2/64"),
            "dev",
            &peer,
            "nodad",
        ]);
        ip(&["-n", ns, "link", "set", &peer, "up"]);
        ip(&[
            "-n",
            ns,
            "route",
            "add",
            "default",
            "via",
            &format!("10.98.{n}.1"),
        ]);
        ip(&[
            "-n",
            ns,
            "-6",
            "route",
            "add",
            "default",
            "via",
            &format!("fd00:98:{n}::1"),
        ]);
        guard
    }

    pub fn ifindex(&self) -> u32 {
        nix::net::if_::if_nametoindex(self.host.as_str()).expect("host veth ifindex")
    }

    /// The endpoint's addresses (inside the namespace).
    pub fn client_v4(&self) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(10, 98, self.n, 2)
    }

    /// Starts `f` on a thread that entered the namespace (only that thread moves).
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = format!("/var/run/netns/{}", self.ns);
        std::thread::spawn(move || {
            let fd = std::fs::File::open(&path).expect("open netns");
            nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
    }

    /// Runs `f` in the namespace and waits for it.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.spawn(f).join().expect("netns thread")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host])
            .output();
    }
}

/// Kernel BPF run-time statistics (`kernel.bpf_stats_enabled`) on for the guard's life, for
/// the measurements; the old setting comes back on drop.
pub struct BpfStats(String);

impl BpfStats {
    const PATH: &str = "/proc/sys/kernel/bpf_stats_enabled";
    pub fn enable() -> Self {
        let old = std::fs::read_to_string(Self::PATH).unwrap();
        std::fs::write(Self::PATH, "1").unwrap();
        BpfStats(old.trim().to_owned())
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
    }
}

/// Users of the local-delivery routes in this process, and whether this process added them.
static ROUTES: Mutex<(usize, bool)> = Mutex::new((0, false));

/// The local-delivery routes for the test's life: installed when absent, removed by the last
/// guard only if this process installed them (a daemon's routes are left alone).
pub struct Routes;

impl Routes {
    pub fn new() -> Self {
        let mut r = ROUTES.lock().unwrap_or_else(|e| e.into_inner());
        if r.0 == 0 {
            let present = fqdnd_ebpf::route::local_delivery_installed().expect("ip rule show");
            fqdnd_ebpf::route::install_local_delivery().expect("install local delivery");
            assert!(fqdnd_ebpf::route::local_delivery_installed().unwrap());
            r.1 = !present;
        }
        r.0 += 1;
        Routes
    }
}

impl Drop for Routes {
    fn drop(&mut self) {
        let mut r = ROUTES.lock().unwrap_or_else(|e| e.into_inner());
        r.0 -= 1;
        if r.0 == 0 && r.1 {
            let _ = fqdnd_ebpf::route::remove_local_delivery();
            r.1 = false;
        }
    }
}

/// Ethernet + IPv4/IPv6 + TCP (20-byte header) or UDP (8-byte header).
pub fn packet(src: IpAddr, dst: IpAddr, proto: u8, sport: u16, dport: u16) -> Vec<u8> {
    let mut p = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    let l4_len = if proto == fqdnd_ebpf::sys::PROTO_TCP {
        20
    } else {
        8
    };
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            p.extend([0x08, 0x00]);
            let total = (20 + l4_len) as u16;
            p.extend([0x45, 0]);
            p.extend(total.to_be_bytes());
            p.extend([0, 0, 0x40, 0, 64, proto, 0, 0]);
            p.extend(s.octets());
            p.extend(d.octets());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            p.extend([0x86, 0xdd]);
            p.extend([0x60, 0, 0, 0]);
            p.extend((l4_len as u16).to_be_bytes());
            p.extend([proto, 64]);
            p.extend(s.octets());
            p.extend(d.octets());
        }
        _ => panic!("mixed families"),
    }
    p.extend(sport.to_be_bytes());
    p.extend(dport.to_be_bytes());
    if proto == fqdnd_ebpf::sys::PROTO_TCP {
        p.extend([0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    } else {
        p.extend((8u16).to_be_bytes());
        p.extend([0, 0]);
    }
    p
}
