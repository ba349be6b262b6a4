//! The `fqdnd` command line, run as a user runs it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

mod common;

use std::path::Path;
use std::process::Command;

use common::{TestDir, fqdnd, json_of, stdout_of, text};

#[test]
fn policy_match_follows_cilium_semantics_and_canonicalises_names() {
    let out = fqdnd(&[
        "policy",
        "match",
        "--json",
        "*.cilium.io",
        "WWW.Cilium.io",
        "cilium.io",
        "a.b.cilium.io.",
        "sub.cilium.io",
    ]);
    let rows = json_of(&out);
    let got: Vec<(String, bool)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_owned(),
                r["matches"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("WWW.Cilium.io".to_owned(), true),
            ("cilium.io".to_owned(), false),
            ("a.b.cilium.io.".to_owned(), false),
            ("sub.cilium.io".to_owned(), true),
        ]
    );
    let out = fqdnd(&[
        "policy",
        "match",
        "**.cilium.io",
        "a.b.cilium.io",
        "cilium.io",
    ]);
    assert_eq!(
        text(&out.stdout),
        "match\ta.b.cilium.io.\nno match\tcilium.io.\n"
    );
}

#[test]
fn policy_match_rejects_an_invalid_pattern() {
    let out = fqdnd(&["policy", "match", "*.exa!mple.com", "x.example.com"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("invalid character '!'"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn policy_check_reports_every_error_with_its_location() {
    let bad = common::repo_path("tests/fixtures/bad.yaml");
    let out = fqdnd(&["policy", "check", &bad]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("bad.yaml:11:"), "{stderr}");
    assert!(
        stderr.contains(
            "bad.yaml:19:3: `nodeSelector` is not supported by fqdnd: it is Kubernetes-only"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("2 error(s)"), "{stderr}");
}

#[test]
fn policy_check_accepts_the_bundled_example() {
    let example = common::repo_path("config/examples/policy.yaml");
    let stdout = stdout_of(&fqdnd(&["policy", "check", &example]));
    assert!(stdout.starts_with("ok: 1 file(s)"), "{stdout}");
}

#[test]
fn policy_check_fails_cleanly_on_a_missing_file() {
    let out = fqdnd(&["policy", "check", "/nonexistent/policy.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/nonexistent/policy.yaml"));
}

/// A file without documents (`# disabled`) is a warning, not an error: exit 0.
#[test]
fn policy_check_warns_about_an_empty_file() {
    let dir = TestDir::new("cli-empty");
    let disabled = dir.write("disabled.yaml", "# disabled\n");
    let out = fqdnd(&["policy", "check", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:1:1: warning: no policy or configuration documents",
            disabled.display()
        )),
        "{stderr}"
    );
    assert!(text(&out.stdout).starts_with("ok: 1 file(s)"));
}

#[test]
fn simulate_runs_the_embedded_example_and_shares_identities() {
    let stdout = stdout_of(&fqdnd(&["simulate"]));
    // 24 rotating S3 addresses end up under the one pre-allocated *.s3.amazonaws.com identity.
    let s3_line = stdout
        .lines()
        .find(|l| l.contains("fqdn:*.s3.amazonaws.com.") && l.contains("world-ipv4"))
        .unwrap();
    assert!(s3_line.contains("refs 25"), "{s3_line}");
    assert!(stdout.contains("10.0.9.9 is in no endpoint"), "{stdout}");
    assert!(stdout.contains("summary: 7 answer(s)"), "{stdout}");
}

/// Guards the CLI's search for the admin socket: with no `--admin-socket`, no
/// `FQDND_ADMIN_SOCKET`, no `--config` and no daemon at either default socket, the error names
/// both defaults, the gateway's and the node's (before, there was one default,
/// `/run/fqdnd/admin.sock`, and the error named only it). Nothing is created under
/// /run/fqdnd: if a daemon's default socket exists on this machine, the case cannot be set up
/// and the test says so and returns.
#[test]
fn without_any_socket_the_error_names_both_default_sockets() {
    let defaults = ["/run/fqdnd/gateway.sock", "/run/fqdnd/node.sock"];
    if let Some(present) = defaults.iter().find(|p| Path::new(p).exists()) {
        eprintln!("{present} exists on this machine: the no-daemon error cannot be checked here");
        return;
    }
    // `fqdnd()` removes FQDND_ADMIN_SOCKET from the environment.
    let out = fqdnd(&["status"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    for default in defaults {
        assert!(stderr.contains(default), "{stderr}");
    }
}

/// `fqdnd policy explain --offline`: the rule that decides a flow, in both directions, from
/// files alone; exit 0 allowed, 1 denied, 2 for a flow it cannot read.
#[test]
fn policy_explain_offline_names_the_deciding_rule() {
    let dir = TestDir::new("explain");
    let file = dir.write(
        "policy.yaml",
        r#"apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: web}
spec: {id: 1, addresses: ["10.0.1.2", "fd00::1:2"], labels: {app: web}}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: web}
spec:
  endpointSelector: {matchLabels: {app: web}}
  egress:
  - toCIDR: ["192.0.2.0/24"]
    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
  egressDeny:
  - toCIDR: ["192.0.2.66/32"]
  ingress:
  - fromEntities: [world]
    icmps: [{fields: [{type: EchoRequest, family: IPv6}]}]
"#,
    );
    let file = file.to_str().unwrap();
    let explain = |args: &[&str]| {
        let mut all = vec!["policy", "explain", "--offline", file, "--endpoint", "1"];
        all.extend(args);
        let out = fqdnd(&all);
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let (code, out, _) = explain(&["192.0.2.1:443/tcp"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.starts_with("egress endpoint 1 -> 192.0.2.1 TCP/443: ALLOWED"),
        "{out}"
    );
    assert!(
        out.contains("allowed by ") && out.contains("web egress[0]"),
        "{out}"
    );
    let (code, out, _) = explain(&["--to", "192.0.2.66:443/tcp"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("denied by ")
            && out.contains("egressDeny[0] (it shadows 1 matching allow(s))"),
        "{out}"
    );
    let (code, out, _) = explain(&["--from", "[2001:db8::1]:128/icmpv6"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("entity world on ICMPv6 type 128"), "{out}");
    let (code, out, _) = explain(&["--from", "[2001:db8::1]:129/icmpv6", "--json"]);
    assert_eq!(code, Some(1), "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["allowed"].as_bool(), v["defaultDeny"].as_bool()),
        (Some(false), Some(true))
    );
    // What it cannot read is an error that says why.
    let (code, _, err) = explain(&["--from", "10.0.0.1:8/icmpv6"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("10.0.0.1 is IPv4"), "{err}");
    let (code, _, err) = explain(&["10.0.0.1:99999"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("is not a port number"), "{err}");
}

/// `fqdnd operator` with a member URL that cannot be dialled stops at once with the place of
/// the mistake; with an etcd nobody answers on it says so, naming the endpoints and the error,
/// and its metrics show it unreachable — never a silent allocator.
#[test]
fn operator_refuses_a_bad_url_and_reports_an_unreachable_etcd() {
    let dir = TestDir::new("operator-unreachable");
    let bad = dir.write(
        "bad.yaml",
        "apiVersion: fqdnd.io/v1\nkind: Cluster\nspec:\n  endpoints: [\"http://127.0.0.1:notaport\"]\n",
    );
    let out = fqdnd(&["operator", "--config", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("bad.yaml:4:") && stderr.contains("not an etcd member URL"),
        "{stderr}"
    );
    // A port nothing listens on.
    let port = common::free_port();
    let config = dir.write(
        "cluster.yaml",
        format!(
            "apiVersion: fqdnd.io/v1\nkind: Cluster\nspec:\n  endpoints: [\"http://127.0.0.1:{port}\"]\n  nodeName: op-1\n"
        ),
    );
    let metrics: std::net::SocketAddr = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let log = dir.join("operator.log");
    let mut child = common::fqdnd_command()
        .args(["operator", "--config", config.to_str().unwrap()])
        .args(["--metrics", &metrics.to_string()])
        .env("FQDND_LOG", "info")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let seen = common::poll_until(
        common::PATIENCE * 4,
        "the operator says etcd is unreachable",
        || {
            let text = std::fs::read_to_string(&log).ok()?;
            text.lines()
                .find(|l| {
                    l.contains("etcd is unreachable") && l.contains(&format!("127.0.0.1:{port}"))
                })
                .map(str::to_owned)
        },
    );
    assert!(seen.contains("error"), "{seen}");
    common::wait_metric(
        || common::scrape(metrics),
        "fqdnd_operator_state{state=\"unreachable\"}",
        "1",
        |v| v == 1.0,
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// A CiliumNetworkPolicy without `metadata.namespace` is in `default` (as `kubectl apply`
/// without `-n`): it governs the endpoint without a namespace (in `default` too) and not the
/// one in `prod` — it used to govern both — and `policy check` warns about it.
#[test]
fn a_policy_without_a_namespace_governs_the_default_namespace_only() {
    let dir = TestDir::new("cli-namespace");
    let file = dir.write(
        "policy.yaml",
        r#"apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: web}
spec: {id: 1, addresses: ["10.0.1.2"], labels: {app: web}}
---
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: web-prod}
spec: {id: 2, addresses: ["10.0.1.3"], namespace: prod, labels: {app: web}}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: web}
spec:
  endpointSelector: {matchLabels: {app: web}}
  egress:
  - toCIDR: ["192.0.2.0/24"]
"#,
    );
    let file = file.to_str().unwrap();
    let explain = |endpoint: &str| {
        let out = fqdnd(&[
            "policy",
            "explain",
            "--offline",
            file,
            "--endpoint",
            endpoint,
            "198.51.100.1:443/tcp",
        ]);
        (out.status.code(), text(&out.stdout))
    };
    // The default namespace's endpoint is under the policy: denied outside its CIDR.
    let (code, out) = explain("1");
    assert_eq!(code, Some(1), "{out}");
    // The one in `prod` is under no policy.
    let (code, out) = explain("2");
    assert_eq!(code, Some(0), "{out}");

    let out = fqdnd(&["policy", "check", file]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "policy.yaml:13:18: warning: CiliumNetworkPolicy \"web\" has no `metadata.namespace`"
        ),
        "{stderr}"
    );
}

/// The exit codes docs/manual/cli-reference.md lists ("Exit codes and what each command
/// does"): 2 for a usage error of any command (`endpoint add` said 0/1), 0 for `--help`; 1
/// when the command cannot do its job (no agent at the socket, a file that cannot be read, a
/// capture that does not exist: `replay` said 0 only), each error one line that prints each
/// cause once.
#[test]
fn exit_codes_are_those_the_docs_list() {
    let dir = TestDir::new("cli-exit");
    let socket = dir.join("none.sock");
    let socket = socket.to_str().unwrap();
    let missing = dir.join("missing");
    let missing = missing.to_str().unwrap();
    let commands: &[&[&str]] = &[
        &["gateway"],
        &["node"],
        &["operator"],
        &["endpoint", "add"],
        &["endpoint", "remove"],
        &["endpoint", "list"],
        &["service", "set"],
        &["service", "list"],
        &["monitor"],
        &["checkpoint", "inspect"],
        &["bpf", "ipcache", "list"],
        &["bpf", "unload"],
        &["status"],
        &["cache", "list"],
        &["identity", "list"],
        &["ipcache", "list"],
        &["policy", "check"],
        &["policy", "explain"],
        &["policy", "match"],
        &["policy", "reload"],
        &["policy", "apply"],
        &["simulate"],
        &["replay"],
        &["record", "start"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.push("--no-such-flag");
        let out = fqdnd(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let mut args = command.to_vec();
        args.push("--help");
        assert_eq!(fqdnd(&args).status.code(), Some(0), "{args:?}");
    }
    // A missing required argument is a usage error too.
    let out = fqdnd(&["endpoint", "add", "--id", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));

    let fails: &[&[&str]] = &[
        &[
            "endpoint",
            "add",
            "--id",
            "1",
            "--name",
            "x",
            "--cgroup",
            "/x",
            "--admin-socket",
            socket,
        ],
        &["endpoint", "list", "--admin-socket", socket],
        &["service", "list", "--admin-socket", socket],
        &["monitor", "--admin-socket", socket],
        &["record", "status", "--admin-socket", socket],
        &["status", "--admin-socket", socket],
        &["checkpoint", "inspect", missing],
        &["bpf", "ipcache", "list", "--pin-dir", missing],
        &["simulate", "--answers", missing],
        &["replay", missing, "--policy", missing],
    ];
    for args in fails {
        let out = fqdnd(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.starts_with("fqdnd: "), "{args:?}: {stderr}");
        common::assert_each_cause_once(&stderr);
    }
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let out = fqdnd(&["--version"]);
    assert!(out.status.success());
    let version = stdout_of(&out);
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success());
    match head {
        // Built from a git checkout: the commit is named (a tarball build names none).
        Some(head) => assert_eq!(
            version.trim(),
            format!(
                "fqdnd {} (git {})",
                env!("CARGO_PKG_VERSION"),
                text(&head.stdout).trim()
            )
        ),
        None => assert_eq!(
            version.trim(),
            format!("fqdnd {}", env!("CARGO_PKG_VERSION"))
        ),
    }
}

#[test]
fn generate_writes_man_pages_and_completions_from_the_cli_definition() {
    let dir = TestDir::new("generate");
    let man = dir.join("man");
    let out = fqdnd(&["generate", "man", man.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // One page per command and subcommand, with its options.
    let gateway = std::fs::read_to_string(man.join("fqdnd-gateway.1")).unwrap();
    assert!(gateway.starts_with(".ie"), "{gateway}");
    assert!(gateway.contains("strict\\-restore"), "{gateway}");
    for page in [
        "fqdnd.1",
        "fqdnd-node.1",
        "fqdnd-operator.1",
        "fqdnd-cache-forget.1",
    ] {
        assert!(man.join(page).is_file(), "no {page}");
    }
    let completions = dir.join("completions");
    let out = fqdnd(&["generate", "completions", completions.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for file in ["fqdnd.bash", "_fqdnd", "fqdnd.fish"] {
        let script = std::fs::read_to_string(completions.join(file)).unwrap();
        assert!(
            // fish writes a long option as `-l strict-restore`.
            script.contains("gateway") && script.contains("strict-restore"),
            "{file}: {script}"
        );
    }
    // A bad kind is refused with the choices.
    let out = fqdnd(&["generate", "pdf", dir.join("x").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("possible values: man, completions"));
}
