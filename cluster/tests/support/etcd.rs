//! A throw-away etcd cluster for tests: N members of the system's `etcd` (Debian
//! `etcd-server`) on one address, optionally inside a network namespace, data on tmpfs
//! (`/dev/shm`), each member's log in the scratch directory. Members can be killed (SIGKILL)
//! and restarted; the leader is found with `etcdctl endpoint status`. Everything — processes
//! and directories — goes when the value drops, even after a failed assertion (logs are kept
//! then).
//!
//! Used by the cluster crate's tests, the binary's `tests/cluster.rs` and the benchmark load
//! generator (included by path: `#[path = …] mod etcd;`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Whether `etcd` and `etcdctl` are installed. Without them an etcd test is skipped, unless
/// `FQDND_REQUIRE_PRIVILEGED=1` (CI, which runs `scripts/install-deps.sh` first), where it
/// fails.
pub fn available(test: &str) -> bool {
    let found = |bin: &str, arg: &str| {
        Command::new(bin)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if found("etcd", "--version") && found("etcdctl", "version") {
        return true;
    }
    let msg = format!("{test}: needs etcd and etcdctl (scripts/install-deps.sh) (skipped)");
    assert!(
        std::env::var("FQDND_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
        "{msg}, and FQDND_REQUIRE_PRIVILEGED=1"
    );
    eprintln!("{msg}");
    false
}

/// One member.
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    child: Option<Child>,
    data: PathBuf,
}

/// The cluster.
pub struct EtcdCluster {
    /// Scratch directory: the members' logs.
    pub dir: PathBuf,
    /// The namespace the members run in, if any.
    pub netns: Option<String>,
    /// The address every member listens on.
    pub host: String,
    pub members: Vec<Member>,
    token: String,
}

impl EtcdCluster {
    /// Starts `n` members on `host` (inside `netns` if given) and waits for a leader.
    pub fn start(test: &str, n: usize, netns: Option<&str>, host: &str) -> Self {
        let pid = std::process::id();
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        // Ports below the ephemeral range, spread by process and cluster.
        let base = 10_000 + ((pid * 7 + k * 61) % 3_500) * 6;
        let dir = std::env::temp_dir().join(format!("fqdnd-etcd-{pid}-{k}-{test}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let members = (0..n)
            .map(|i| {
                let i = u32::try_from(i).unwrap();
                Member {
                    name: format!("m{i}"),
                    client_port: u16::try_from(base + 2 * i).unwrap(),
                    peer_port: u16::try_from(base + 2 * i + 1).unwrap(),
                    child: None,
                    data: PathBuf::from(format!("/dev/shm/fqdnd-etcd-{pid}-{k}-m{i}")),
                }
            })
            .collect();
        let mut cluster = Self {
            dir,
            netns: netns.map(str::to_owned),
            host: host.to_owned(),
            members,
            token: format!("fqdnd-test-{pid}-{k}"),
        };
        for i in 0..n {
            let _ = std::fs::remove_dir_all(&cluster.members[i].data);
            cluster.spawn(i, true);
        }
        cluster.wait_healthy(Duration::from_secs(60));
        cluster
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://{}:{}", m.name, self.host, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn command(&self, program: &str) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => Command::new(program),
        }
    }

    fn spawn(&mut self, i: usize, new: bool) {
        let initial = self.initial_cluster();
        let (host, token) = (self.host.clone(), self.token.clone());
        let m = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", m.name)))
            .unwrap();
        let client = format!("http://{host}:{}", m.client_port);
        let peer = format!("http://{host}:{}", m.peer_port);
        let child = self
            .command("etcd")
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&m.data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial])
            .args([
                "--initial-cluster-state",
                if new { "new" } else { "existing" },
            ])
            .args(["--initial-cluster-token", &token])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.members[i].child = Some(child);
    }

    /// Client URLs of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://{}:{}", self.host, m.client_port))
            .collect()
    }

    /// `etcdctl endpoint status` of the running members: (member index, member id, leader id).
    fn status(&self) -> Vec<(usize, u64, u64)> {
        let running: Vec<usize> = (0..self.members.len())
            .filter(|i| self.members[*i].child.is_some())
            .collect();
        let mut out = Vec::new();
        for i in running {
            let endpoint = format!("http://{}:{}", self.host, self.members[i].client_port);
            let Ok(output) = self
                .command("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &endpoint, "--command-timeout=2s"])
                .args(["endpoint", "status", "-w", "json"])
                .output()
            else {
                continue;
            };
            let Ok(json) = serde_json::from_slice::<serde_json::Value>(&output.stdout) else {
                continue;
            };
            let Some(status) = json.get(0).and_then(|s| s.get("Status")) else {
                continue;
            };
            let member = status["header"]["member_id"].as_u64().unwrap_or(0);
            let leader = status["leader"].as_u64().unwrap_or(0);
            out.push((i, member, leader));
        }
        out
    }

    /// The index of the leader, if every running member answers and agrees on one.
    pub fn leader(&self) -> Option<usize> {
        let status = self.status();
        let running = self.members.iter().filter(|m| m.child.is_some()).count();
        if status.len() < running {
            return None;
        }
        let leader = status.first()?.2;
        if leader == 0 || status.iter().any(|s| s.2 != leader) {
            return None;
        }
        status.iter().find(|s| s.1 == leader).map(|s| s.0)
    }

    /// Waits until the running members agree on a leader.
    pub fn wait_healthy(&self, limit: Duration) -> usize {
        let start = Instant::now();
        loop {
            if let Some(l) = self.leader() {
                return l;
            }
            assert!(
                start.elapsed() < limit,
                "etcd has no leader after {limit:?}; logs in {}",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills member `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data.
    pub fn restart(&mut self, i: usize) {
        assert!(self.members[i].child.is_none());
        self.spawn(i, false);
    }

    /// Kills every member.
    pub fn stop_all(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }

    /// Restarts every member and waits for a leader.
    pub fn start_all(&mut self) {
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                self.restart(i);
            }
        }
        self.wait_healthy(Duration::from_secs(60));
    }

    /// Resident memory of each running member, in KiB (from /proc).
    pub fn rss_kib(&self) -> Vec<u64> {
        self.members
            .iter()
            .filter_map(|m| m.child.as_ref())
            .filter_map(|c| {
                let status = std::fs::read_to_string(format!("/proc/{}/status", c.id())).ok()?;
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            })
            .collect()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.stop_all();
        for m in &self.members {
            let _ = std::fs::remove_dir_all(&m.data);
        }
        if std::thread::panicking() {
            eprintln!("etcd logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
