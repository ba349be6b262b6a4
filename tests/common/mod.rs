//! What the integration tests share, written once: running the `fqdnd` binary (with a time
//! limit), a port free for UDP and TCP, a scratch directory that goes when the test ends, a
//! gateway process started from its files and awaited through its admin socket, waiting by
//! polling observable state with a deadline, DNS questions over UDP and TCP, the Prometheus
//! endpoint, and the admin API through the CLI.
//!
//! Each test crate includes it with `mod common;` (`tests/node` with a `#[path]`).

#![allow(dead_code, reason = "each test crate uses a part of the harness")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "test code: real processes, clocks and polling; a failed step should panic"
)]

pub(crate) mod tls;

use std::fmt::Display;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

/// How long a test waits for something that should happen soon (a metrics tick, a reload, a
/// daemon coming up): generous, because the suite runs while other work uses every core.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// How long one `fqdnd` command may run before it counts as hung.
const COMMAND_LIMIT: Duration = Duration::from_secs(120);

/// How long a DNS client waits for a reply. A test that expects a reply fails without one;
/// none expects silence, so a long wait only makes them patient on a loaded machine.
pub(crate) const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// Long enough for a dropped SYN to show as a failure, short enough to keep tests quick.
pub(crate) const DROPPED: Duration = Duration::from_millis(700);

/// How long an allowed connection may take (SYN retransmits included) on a loaded machine.
pub(crate) const REACHES: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// Waiting.

/// Calls `attempt` until it returns `Ok`, pausing a little longer each time (5 ms up to
/// 100 ms); after `within`, panics naming `what` was awaited and the last `Err`.
pub(crate) fn poll<T, E: Display>(
    within: Duration,
    what: &str,
    attempt: impl FnMut() -> Result<T, E>,
) -> T {
    let mut pause = Duration::from_millis(5);
    poll_paced(within, what, attempt, || {
        pause = (pause * 2).min(Duration::from_millis(100));
        pause
    })
}

/// [`poll`] at a fixed pace: every `every`, for when the first success itself is judged.
pub(crate) fn poll_every<T, E: Display>(
    every: Duration,
    within: Duration,
    what: &str,
    attempt: impl FnMut() -> Result<T, E>,
) -> T {
    poll_paced(within, what, attempt, || every)
}

fn poll_paced<T, E: Display>(
    within: Duration,
    what: &str,
    mut attempt: impl FnMut() -> Result<T, E>,
    mut pause: impl FnMut() -> Duration,
) -> T {
    let start = Instant::now();
    loop {
        match attempt() {
            Ok(value) => return value,
            Err(last) if start.elapsed() >= within => {
                panic!("waited {within:?} for {what}, in vain; last seen: {last}")
            }
            Err(_) => std::thread::sleep(pause()),
        }
    }
}

/// Runs `check` every `every` until `period` has passed (at least once): for what must hold
/// throughout a stretch of real time (an outage of a given length), not just once.
pub(crate) fn throughout(period: Duration, every: Duration, mut check: impl FnMut()) {
    let start = Instant::now();
    loop {
        check();
        if start.elapsed() >= period {
            return;
        }
        std::thread::sleep(every);
    }
}

/// [`poll`] for an attempt that has nothing to say when it fails.
pub(crate) fn poll_until<T>(
    within: Duration,
    what: &str,
    mut attempt: impl FnMut() -> Option<T>,
) -> T {
    poll(within, what, || attempt().ok_or("not yet"))
}

// ---------------------------------------------------------------------------------------------
// The binary.

/// A command for the `fqdnd` binary under test. `FQDND_ADMIN_SOCKET` is removed from its
/// environment, so the caller's does not decide which daemon a test talks to.
pub(crate) fn fqdnd_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fqdnd"));
    command.env_remove("FQDND_ADMIN_SOCKET");
    command
}

/// Runs `command` to the end with its output captured; panics if it takes longer than two
/// minutes (it is killed) or cannot start.
pub(crate) fn run(command: &mut Command) -> Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    // Another thread reads the pipes, so a large output never blocks the child.
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(COMMAND_LIMIT) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            // Not reaped yet (the reader thread still waits for it): the pid is the child's.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("{command:?} did not finish within {COMMAND_LIMIT:?}")
        }
    }
}

/// `fqdnd ARGS`, run to the end.
pub(crate) fn fqdnd(args: &[&str]) -> Output {
    run(fqdnd_command().args(args))
}

/// Output bytes as text.
pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Panics when a line of `message` (an error as a command prints it, `fqdnd: a: b: c`) shows
/// a cause twice: a segment between `": "` separators that appears twice in the line (the
/// mark of an error that both prints its source and returns it as its `source`).
#[allow(dead_code, reason = "not every test binary checks error messages")]
pub(crate) fn assert_each_cause_once(message: &str) {
    for line in message.lines() {
        let segments: Vec<&str> = line.split(": ").map(str::trim).collect();
        for (i, segment) in segments.iter().enumerate() {
            assert!(
                segment.len() < 4 || !segments[i + 1..].contains(segment),
                "{segment:?} is printed twice in {line:?}"
            );
        }
    }
}

/// The stdout of a command that must have succeeded; panics with its output otherwise.
pub(crate) fn stdout_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}: {}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// [`stdout_of`], decoded as JSON.
pub(crate) fn json_of(out: &Output) -> serde_json::Value {
    let stdout = stdout_of(out);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// A path of the repository (`CARGO_MANIFEST_DIR`).
pub(crate) fn repo_path(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(rel)
        .display()
        .to_string()
}

/// Whether this process may run a test that needs root (`test` names it); without root the
/// test is skipped with a message, unless `FQDND_REQUIRE_PRIVILEGED=1` (CI), where it fails.
/// `why` says what root is needed for.
pub(crate) fn privileged(test: &str, why: &str) -> bool {
    runnable(
        test,
        nix::unistd::geteuid().is_root(),
        &format!("root {why}"),
    )
}

/// `ok`, or else: test `test` is skipped with a message saying it `needs` something, unless
/// `FQDND_REQUIRE_PRIVILEGED=1` (CI), where it fails.
pub(crate) fn runnable(test: &str, ok: bool, needs: &str) -> bool {
    if ok {
        return true;
    }
    let msg = format!("{test}: needs {needs} (skipped)");
    assert!(
        std::env::var("FQDND_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
        "{msg}, and FQDND_REQUIRE_PRIVILEGED=1"
    );
    eprintln!("{msg}");
    false
}

// ---------------------------------------------------------------------------------------------
// Configuration documents.

/// YAML documents joined with `---`.
pub(crate) fn documents(docs: &[&str]) -> String {
    docs.join("---\n")
}

/// A `kind: Gateway` document listening on `listen` (`127.0.0.1:0`: a port the kernel picks,
/// read back from `fqdnd status`); `spec` holds more spec lines, indented two spaces.
pub(crate) fn gateway_doc(listen: &str, spec: &str) -> String {
    format!("apiVersion: fqdnd.io/v1\nkind: Gateway\nspec:\n  listen: [\"{listen}\"]\n{spec}")
}

/// The address of `h<i>.corp.test` in [`numbered_zone`]: 100.64.x.y.
pub(crate) fn numbered_addr(i: u32) -> IpAddr {
    IpAddr::from([100, 64, (i / 250) as u8, (i % 250 + 1) as u8])
}

/// A zone file for `corp.test` with `names` names `h0000`, `h0001`… (TTL 1 h), each with
/// its [`numbered_addr`].
pub(crate) fn numbered_zone(names: u32) -> String {
    let mut zone = String::from(
        "$TTL 3600\n@ IN SOA ns.corp.test. admin.corp.test. 1 3600 600 86400 60\n@ IN NS ns.corp.test.\n",
    );
    for i in 0..names {
        zone += &format!("h{i:04} IN A {}\n", numbered_addr(i));
    }
    zone
}

/// A `kind: Settings` document; `spec` holds its spec lines, indented two spaces.
pub(crate) fn settings_doc(spec: &str) -> String {
    format!("apiVersion: fqdnd.io/v1\nkind: Settings\nspec:\n{spec}")
}

/// The gateway tests' clients: every loopback address, client group 7, `site: lan`.
pub(crate) const LAN_GROUP: &str = "apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: lan}
spec: {id: 7, addresses: [\"127.0.0.0/8\"], labels: {site: lan}}
";

/// A Cilium policy `kind` (`CiliumNetworkPolicy`, `CiliumClusterwideNetworkPolicy`) named
/// `name` for the endpoints labelled `label` (`key: value`), with `egress` rules (lines
/// starting `  - `).
pub(crate) fn policy_doc(kind: &str, name: &str, label: &str, egress: &str) -> String {
    format!(
        "apiVersion: cilium.io/v2\nkind: {kind}\nmetadata: {{name: {name}}}\nspec:\n  endpointSelector: {{matchLabels: {{{label}}}}}\n  egress:\n{egress}"
    )
}

/// The clusterwide policy of the [`LAN_GROUP`], with `egress` rules.
pub(crate) fn lan_policy(egress: &str) -> String {
    policy_doc("CiliumClusterwideNetworkPolicy", "lan", "site: lan", egress)
}

/// An egress rule: DNS to anywhere on port 53, any name.
pub(crate) const DNS_ANYWHERE: &str = "  - toPorts: [{ports: [{port: \"53\", protocol: ANY}]}]\n";

/// An egress rule: `selectors` (`matchPattern: …` or `matchName: …`) on TCP 443.
pub(crate) fn fqdns_on_443(selectors: &[&str]) -> String {
    let list: String = selectors.iter().map(|s| format!("    - {s}\n")).collect();
    format!("  - toFQDNs:\n{list}    toPorts: [{{ports: [{{port: \"443\", protocol: TCP}}]}}]\n")
}

// ---------------------------------------------------------------------------------------------
// Ports and scratch directories.

/// A port of 127.0.0.1 that is free for both UDP and TCP right now (a DNS listener binds
/// both).
pub(crate) fn free_port() -> u16 {
    let (udp, _tcp) = udp_and_tcp_on_one_port();
    udp.local_addr().unwrap().port()
}

/// A UDP socket and a TCP listener bound to the same fresh port of 127.0.0.1, for a test's
/// own DNS server. The UDP port the kernel picks may be taken for TCP (by another test's
/// connection), so it tries again until both bind.
pub(crate) fn udp_and_tcp_on_one_port() -> (UdpSocket, TcpListener) {
    poll_until(PATIENCE, "a port free for both UDP and TCP", || {
        let udp = UdpSocket::bind("127.0.0.1:0").ok()?;
        let tcp = TcpListener::bind(udp.local_addr().ok()?).ok()?;
        Some((udp, tcp))
    })
}

/// A scratch directory of its own, removed when dropped — kept (and named on stderr) when the
/// test failed. Mounts made with [`TestDir::mount_tmpfs`] or [`TestDir::mount_ext4`] are
/// unmounted first.
pub(crate) struct TestDir {
    path: PathBuf,
    mounts: Vec<PathBuf>,
}

impl TestDir {
    /// `$TMPDIR/fqdnd-<test>-<pid>-<n>`, empty.
    pub(crate) fn new(test: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("fqdnd-{test}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self {
            path,
            mounts: Vec::new(),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.path.join(rel)
    }

    /// Writes `rel` (its parent directories created) and returns its path.
    pub(crate) fn write(&self, rel: impl AsRef<Path>, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.path.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, contents).unwrap();
        path
    }

    /// Mounts a tmpfs of `size` (e.g. `64k`) on `rel` (root only).
    pub(crate) fn mount_tmpfs(&mut self, rel: &str, size: &str) -> PathBuf {
        let mount = self.path.join(rel);
        std::fs::create_dir_all(&mount).unwrap();
        let out = run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "fqdnd-test"])
            .arg(&mount));
        assert!(out.status.success(), "mount tmpfs: {}", text(&out.stderr));
        self.mounts.push(mount.clone());
        mount
    }

    /// Mounts a fresh ext4 file system of `mib` MiB (an image file on a loop device) at
    /// `<dir>/<rel>`: one that [`Frozen`] can freeze. Unmounted (and the loop device freed)
    /// when the directory is dropped.
    pub(crate) fn mount_ext4(&mut self, rel: &str, mib: u32) -> PathBuf {
        let image = self.path.join(format!("{rel}.ext4"));
        let file = std::fs::File::create(&image).unwrap();
        file.set_len(u64::from(mib) << 20).unwrap();
        let out = run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image));
        assert!(out.status.success(), "mkfs.ext4: {}", text(&out.stderr));
        let mount = self.path.join(rel);
        std::fs::create_dir_all(&mount).unwrap();
        let out = run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount));
        assert!(out.status.success(), "mount -o loop: {}", text(&out.stderr));
        self.mounts.push(mount.clone());
        mount
    }
}

/// A file system frozen with `fsfreeze` (writes and syncs to it wait), thawed when dropped:
/// declare it after the process that writes there, so that it is thawed before that process
/// is killed.
pub(crate) struct Frozen(PathBuf);

impl Frozen {
    pub(crate) fn freeze(mount: &Path) -> Self {
        let out = run(Command::new("fsfreeze").arg("-f").arg(mount));
        assert!(out.status.success(), "fsfreeze -f: {}", text(&out.stderr));
        Self(mount.to_path_buf())
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze").arg("-u").arg(&self.0).status();
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        for mount in self.mounts.drain(..) {
            let _ = Command::new("umount").arg(&mount).status();
        }
        if std::thread::panicking() {
            eprintln!("files kept in {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A gateway process.

/// The files and options of a gateway about to start: configuration files written into its
/// own [`TestDir`], environment, where its admin socket is.
pub(crate) struct Setup {
    dir: TestDir,
    configs: Vec<PathBuf>,
    env: Vec<(String, String)>,
    socket_from_config: bool,
    metrics: Option<u16>,
}

/// A running `fqdnd gateway`, killed when dropped (also when the test panics; its log's last
/// lines are printed then), its directory removed after it.
pub(crate) struct Gateway {
    child: Option<Child>,
    /// The admin socket.
    pub(crate) socket: PathBuf,
    /// The first DNS listen address, as the gateway reports it (`listen` of `fqdnd status`).
    pub(crate) dns: SocketAddr,
    /// `http://…/metrics`, if [`Setup::metrics_port`] was asked for one.
    pub(crate) metrics: Option<SocketAddr>,
    setup: Setup,
}

impl Gateway {
    /// A new gateway's directory (`test` names it).
    pub(crate) fn setup(test: &str) -> Setup {
        Setup {
            dir: TestDir::new(test),
            configs: Vec::new(),
            env: Vec::new(),
            socket_from_config: false,
            metrics: None,
        }
    }
}

impl Setup {
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file the configuration refers to (a zone, a list).
    pub(crate) fn file(&self, rel: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        self.dir.write(rel, contents)
    }

    /// Writes a configuration file, passed to the gateway as `--config`.
    pub(crate) fn config(&mut self, rel: &str, contents: &str) -> PathBuf {
        let path = self.dir.write(rel, contents);
        self.configs.push(path.clone());
        path
    }

    /// The configuration files, in order.
    pub(crate) fn configs(&self) -> &[PathBuf] {
        &self.configs
    }

    /// A free port for the `metrics:` field; the gateway's [`Gateway::metrics`] is then
    /// `127.0.0.1:<port>`.
    pub(crate) fn metrics_port(&mut self) -> u16 {
        let port = free_port();
        self.metrics = Some(port);
        port
    }

    pub(crate) fn env(&mut self, key: &str, value: &str) {
        self.env.push((key.to_owned(), value.to_owned()));
    }

    /// The Gateway document names the admin socket (`adminSocket: admin.sock`): no
    /// `--admin-socket` on the command line.
    pub(crate) fn socket_from_config(&mut self) {
        self.socket_from_config = true;
    }

    /// See [`TestDir::mount_tmpfs`].
    pub(crate) fn mount_tmpfs(&mut self, rel: &str, size: &str) -> PathBuf {
        self.dir.mount_tmpfs(rel, size)
    }

    /// See [`TestDir::mount_ext4`].
    pub(crate) fn mount_ext4(&mut self, rel: &str, mib: u32) -> PathBuf {
        self.dir.mount_ext4(rel, mib)
    }

    /// `<dir>/admin.sock`.
    pub(crate) fn socket(&self) -> PathBuf {
        self.dir.join("admin.sock")
    }

    /// Starts the gateway and waits until its admin socket answers `fqdnd status`.
    pub(crate) fn start(self) -> Gateway {
        let mut gw = self.launch();
        gw.wait_ready();
        gw
    }

    /// Starts the gateway and does not wait (its [`Gateway::dns`] is unknown until
    /// [`Gateway::wait_ready`]).
    pub(crate) fn launch(self) -> Gateway {
        let mut gw = Gateway {
            child: None,
            socket: self.socket(),
            dns: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            metrics: self
                .metrics
                .map(|port| SocketAddr::from((Ipv4Addr::LOCALHOST, port))),
            setup: self,
        };
        gw.spawn();
        gw
    }
}

impl Gateway {
    pub(crate) fn dir(&self) -> &Path {
        self.setup.dir()
    }

    /// A path in the gateway's directory.
    pub(crate) fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.setup.dir.join(rel)
    }

    /// The configuration files it was started with.
    pub(crate) fn configs(&self) -> &[PathBuf] {
        &self.setup.configs
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().expect("the gateway runs").id()
    }

    /// Its stderr so far, all runs (`<dir>/gateway.log`).
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.join("gateway.log")).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub(crate) fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// Kills it (SIGKILL) and reaps it.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends it a signal (SIGHUP reloads).
    pub(crate) fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.pid()).unwrap()),
            signal,
        )
        .unwrap();
    }

    /// Starts the gateway again from the same files (after [`Gateway::kill`], or killing it
    /// first) and waits until it answers.
    pub(crate) fn restart(&mut self) {
        self.kill();
        self.spawn();
        self.wait_ready();
    }

    /// Starts the process, stderr appended to `gateway.log`; does not wait.
    pub(crate) fn spawn(&mut self) {
        assert!(self.child.is_none(), "the gateway already runs");
        let setup = &self.setup;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(setup.dir.join("gateway.log"))
            .unwrap();
        let mut command = fqdnd_command();
        command.arg("gateway");
        for config in &setup.configs {
            command.arg("--config").arg(config);
        }
        if !setup.socket_from_config {
            command.arg("--admin-socket").arg(&self.socket);
        }
        command
            .envs(setup.env.iter().map(|(k, v)| (k, v)))
            .current_dir(setup.dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        self.child = Some(command.spawn().unwrap());
    }

    /// Waits until the admin socket answers `fqdnd status` (panics at once if the process
    /// exits), and takes the DNS address from it.
    pub(crate) fn wait_ready(&mut self) -> serde_json::Value {
        let status = wait_serving(self.child.as_mut().unwrap(), &self.socket, "the gateway");
        self.dns = status["listen"][0]
            .as_str()
            .unwrap_or_else(|| panic!("no listen address in {status}"))
            .parse()
            .unwrap();
        status
    }

    /// `fqdnd ARGS --admin-socket <its socket>`.
    pub(crate) fn cli(&self, args: &[&str]) -> Output {
        run(fqdnd_command()
            .args(args)
            .arg("--admin-socket")
            .arg(&self.socket))
    }

    /// `fqdnd ARGS --json --admin-socket <its socket>`, decoded; panics if it fails.
    pub(crate) fn admin(&self, args: &[&str]) -> serde_json::Value {
        admin(&self.socket, args)
    }

    /// `fqdnd status --json`.
    pub(crate) fn status(&self) -> serde_json::Value {
        self.admin(&["status"])
    }

    /// The metrics page now; panics if it cannot be read.
    pub(crate) fn metrics_text(&self) -> String {
        scrape(self.metrics.expect("a metrics port")).unwrap()
    }

    /// Polls the metrics page until `series` satisfies `wanted` (described by `what`), and
    /// returns its value.
    pub(crate) fn wait_metric(
        &self,
        series: &str,
        what: &str,
        wanted: impl Fn(f64) -> bool,
    ) -> f64 {
        let addr = self.metrics.expect("a metrics port");
        wait_metric(|| scrape(addr), series, what, wanted)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- gateway.log (last lines) ---");
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// Waits until the daemon `child` (`what`, for messages) answers `fqdnd status` on `socket`;
/// panics at once if it exits. Returns the status.
pub(crate) fn wait_serving(child: &mut Child, socket: &Path, what: &str) -> serde_json::Value {
    let waited = format!("{what} to answer `fqdnd status` on {}", socket.display());
    poll(2 * PATIENCE, &waited, || {
        if let Some(code) = child.try_wait().unwrap() {
            panic!("{what} exited ({code}) before it answered");
        }
        try_admin(socket, &["status"])
    })
}

/// `fqdnd ARGS --json --admin-socket SOCKET`, decoded; panics if it fails.
pub(crate) fn admin(socket: &Path, args: &[&str]) -> serde_json::Value {
    try_admin(socket, args).unwrap_or_else(|e| panic!("fqdnd {args:?}: {e}"))
}

/// `fqdnd ARGS --json --admin-socket SOCKET`, decoded; what it printed if it failed.
pub(crate) fn try_admin(socket: &Path, args: &[&str]) -> Result<serde_json::Value, String> {
    let out = run(fqdnd_command()
        .args(args)
        .arg("--json")
        .arg("--admin-socket")
        .arg(socket));
    if !out.status.success() {
        return Err(format!("{}{}", text(&out.stdout), text(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("no JSON ({e}): {}", text(&out.stdout)))
}

// ---------------------------------------------------------------------------------------------
// Metrics.

/// `GET /metrics` from `addr`: the body, or an error if the endpoint does not answer 200.
pub(crate) fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(ANSWER_WAIT))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!("metrics answered: {head}")));
    }
    Ok(body.to_owned())
}

/// The value of `series` in a metrics page: the sum of every line whose series is `series`
/// (a name alone matches every label set of it, `name{labels}` that label set); `None` if
/// there is none.
pub(crate) fn metric(page: &str, series: &str) -> Option<f64> {
    let values: Vec<f64> = page
        .lines()
        .filter(|line| {
            line.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|line| line.split_whitespace().last()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Polls `fetch` (a metrics page) until `series` satisfies `wanted` (described by `what`),
/// and returns its value.
pub(crate) fn wait_metric(
    fetch: impl Fn() -> std::io::Result<String>,
    series: &str,
    what: &str,
    wanted: impl Fn(f64) -> bool,
) -> f64 {
    poll(PATIENCE, &format!("{series} {what}"), || {
        let page = fetch().map_err(|e| e.to_string())?;
        match metric(&page, series) {
            Some(v) if wanted(v) => Ok(v),
            other => Err(format!("{other:?}")),
        }
    })
}

// ---------------------------------------------------------------------------------------------
// DNS.

/// A query for `name` (RD set).
pub(crate) fn question(id: u16, name: &str, qtype: RecordType) -> Message {
    let mut q = Message::new(id, MessageType::Query, OpCode::Query);
    q.metadata.recursion_desired = true;
    q.queries
        .push(Query::query(Name::from_ascii(name).unwrap(), qtype));
    q
}

/// The unspecified address of `server`'s family (to bind a client to).
pub(crate) fn any_of(server: SocketAddr) -> IpAddr {
    if server.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    }
}

/// Sends `msg` over UDP from `from` (port chosen by the kernel) to `server`: the reply and
/// where it came from, `None` if nothing decodable came within [`ANSWER_WAIT`].
pub(crate) fn udp_from(
    from: IpAddr,
    server: SocketAddr,
    msg: &Message,
) -> Option<(Message, SocketAddr)> {
    let socket = UdpSocket::bind((from, 0)).unwrap();
    socket.set_read_timeout(Some(ANSWER_WAIT)).unwrap();
    socket.send_to(&msg.to_vec().unwrap(), server).unwrap();
    let mut buf = [0u8; 4096];
    let (n, peer) = socket.recv_from(&mut buf).ok()?;
    Some((Message::from_vec(&buf[..n]).ok()?, peer))
}

/// [`udp_from`] the unspecified address.
pub(crate) fn udp(server: SocketAddr, msg: &Message) -> Option<(Message, SocketAddr)> {
    udp_from(any_of(server), server, msg)
}

/// Sends `msg` over TCP (length-prefixed) to `server`: the reply and the address connected
/// to, `None` if the connection or the read failed.
pub(crate) fn tcp(server: SocketAddr, msg: &Message) -> Option<(Message, SocketAddr)> {
    let mut stream = TcpStream::connect_timeout(&server, ANSWER_WAIT).ok()?;
    stream.set_read_timeout(Some(ANSWER_WAIT)).ok()?;
    let bytes = msg.to_vec().unwrap();
    let mut framed = u16::try_from(bytes.len()).unwrap().to_be_bytes().to_vec();
    framed.extend_from_slice(&bytes);
    stream.write_all(&framed).ok()?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).ok()?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut buf).ok()?;
    Some((Message::from_vec(&buf).ok()?, stream.peer_addr().ok()?))
}

/// The response code of an A question for `name` to `server` over UDP; `None` without a
/// reply.
pub(crate) fn rcode(server: SocketAddr, name: &str) -> Option<ResponseCode> {
    udp(server, &question(0x4242, name, RecordType::A)).map(|(m, _)| m.metadata.response_code)
}

/// The A and AAAA addresses of an answer, in order.
pub(crate) fn addrs(msg: &Message) -> Vec<IpAddr> {
    msg.answers
        .iter()
        .filter_map(|rr| match &rr.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// File modes.

/// Sets this test process's umask to 022 (inherited by the daemons it starts), the usual
/// default: a file or directory created without an explicit mode then gets group and other
/// read bits, so a test of "created private" can fail whatever umask the runner had.
pub(crate) fn usual_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
}

/// `dir` and every directory and file under it, sorted.
pub(crate) fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(path) = todo.pop() {
        if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                todo.push(entry.unwrap().path());
            }
        }
        out.push(path);
    }
    out.sort();
    out
}

/// The paths of [`tree`] whose mode gives their group or others any access, with the mode.
pub(crate) fn not_private(dir: &Path) -> Vec<(PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt;
    tree(dir)
        .into_iter()
        .filter_map(|path| {
            let mode = std::fs::symlink_metadata(&path)
                .unwrap()
                .permissions()
                .mode()
                & 0o7777;
            (mode & 0o077 != 0).then_some((path, mode))
        })
        .collect()
}

/// Asserts that `dir` holds `expected` (relative paths; a name ending in `*` is a prefix) and
/// that nothing in it (itself included) gives its group or others any access.
pub(crate) fn assert_private(dir: &Path, expected: &[&str]) {
    let names: Vec<String> = tree(dir)
        .iter()
        .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
        .collect();
    for want in expected {
        let found = match want.strip_suffix('*') {
            Some(prefix) => names.iter().any(|n| n.starts_with(prefix)),
            None => names.iter().any(|n| n == want),
        };
        assert!(found, "no {want} in {}: {names:?}", dir.display());
    }
    let loose = not_private(dir);
    assert!(
        loose.is_empty(),
        "group or others have access (mode in octal): {:?}",
        loose
            .iter()
            .map(|(p, m)| format!("{} {m:o}", p.display()))
            .collect::<Vec<_>>()
    );
}
