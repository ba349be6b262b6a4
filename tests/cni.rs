//! The CNI plugin as a runtime calls it: the fqdnd binary through a link named `fqdnd-cni`,
//! the network configuration on stdin, the command in `CNI_COMMAND` (spec 1.0). What needs a
//! running node agent and a container runtime is `scripts/podman-e2e.sh` (tests/podman.rs).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A directory with `fqdnd-cni` linked to the binary under test.
fn plugin_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("fqdnd-cni");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_fqdnd"), &plugin).unwrap();
    (dir, plugin)
}

fn cni(plugin: &Path, command: &str, stdin: &str) -> (Output, serde_json::Value) {
    let mut child = Command::new(plugin)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "0123456789abcdef0123")
        .env("CNI_NETNS", "/run/netns/none")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out, json)
}

/// A configuration with a previous result (ptp's shape) and an agent socket nobody serves.
fn config(socket: &Path, prev: bool) -> String {
    let prev = if prev {
        r#","prevResult": {"cniVersion": "1.0.0",
            "interfaces": [{"name": "veth-no-such"}, {"name": "eth0", "sandbox": "/run/netns/x"}],
            "ips": [{"address": "198.51.100.7/24", "interface": 1}]}"#
    } else {
        ""
    };
    format!(
        r#"{{"cniVersion": "1.0.0", "name": "t", "type": "fqdnd-cni", "adminSocket": "{}"{prev}}}"#,
        socket.display()
    )
}

#[test]
fn version_lists_the_spec_versions_it_speaks() {
    let (_dir, plugin) = plugin_dir();
    let (out, json) = cni(&plugin, "VERSION", r#"{"cniVersion": "1.0.0"}"#);
    assert!(out.status.success());
    let versions = json["supportedVersions"].as_array().unwrap();
    assert!(versions.iter().any(|v| v == "1.0.0") && versions.iter().any(|v| v == "0.4.0"));
}

#[test]
fn add_fails_with_the_spec_error_when_the_agent_is_down_or_the_input_is_bad() {
    let (dir, plugin) = plugin_dir();
    let socket = dir.path().join("nobody.sock");
    // Agent down: a container must not run without enforcement.
    let (out, json) = cni(&plugin, "ADD", &config(&socket, true));
    assert!(!out.status.success());
    assert_eq!(json["code"], 11, "try again later: {json}");
    assert_eq!(json["cniVersion"], "1.0.0");
    assert!(json["msg"].as_str().unwrap().contains("does not answer"));
    // No previous result: not chained after the interface's plugin.
    let (out, json) = cni(&plugin, "ADD", &config(&socket, false));
    assert!(!out.status.success());
    assert_eq!(json["code"], 7, "{json}");
    // Not JSON.
    let (out, json) = cni(&plugin, "ADD", "{not json");
    assert!(!out.status.success());
    assert_eq!(json["code"], 6, "{json}");
    // A version it does not speak.
    let old = config(&socket, true).replace(
        "\"cniVersion\": \"1.0.0\", \"name\"",
        "\"cniVersion\": \"0.1.0\", \"name\"",
    );
    let (_, json) = cni(&plugin, "ADD", &old);
    assert_eq!(json["code"], 1, "{json}");
}

#[test]
fn del_succeeds_whatever_happens_and_check_and_status_need_the_agent() {
    let (dir, plugin) = plugin_dir();
    let socket = dir.path().join("nobody.sock");
    let (out, _) = cni(&plugin, "DEL", &config(&socket, true));
    assert!(out.status.success(), "DEL is idempotent: {out:?}");
    assert!(out.stdout.is_empty(), "DEL prints nothing on success");
    let (out, json) = cni(&plugin, "STATUS", &config(&socket, false));
    assert!(!out.status.success());
    assert_eq!(json["code"], 50, "{json}");
    let (out, _) = cni(&plugin, "CHECK", &config(&socket, true));
    assert!(!out.status.success());
}
