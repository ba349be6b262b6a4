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
    cni_bytes(plugin, command, stdin.as_bytes())
}

/// [`cni`] with any bytes on stdin.
fn cni_bytes(plugin: &Path, command: &str, stdin: &[u8]) -> (Output, serde_json::Value) {
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
    child.stdin.take().unwrap().write_all(stdin).unwrap();
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

/// VERSION lists exactly the versions docs/manual/node.md names (issue 36, item 5: it listed
/// 0.3.0, which the documented range left out).
#[test]
fn version_lists_the_spec_versions_it_speaks() {
    let (_dir, plugin) = plugin_dir();
    let (out, json) = cni(&plugin, "VERSION", r#"{"cniVersion": "1.0.0"}"#);
    assert!(out.status.success());
    let versions: Vec<&str> = json["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(versions, ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]);
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/manual/node.md"))
        .unwrap();
    let range = format!("(CNI {}–{})", versions[0], versions[versions.len() - 1]);
    assert!(
        docs.contains(&range),
        "docs/manual/node.md does not say {range}"
    );
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
    let (out, json) = cni(&plugin, "CHECK", &config(&socket, true));
    assert!(!out.status.success());
    assert_eq!(
        json["code"], 11,
        "the agent is down: try again later: {json}"
    );
}

/// Serves one admin API request on `socket`: answers `404 Not Found` (an agent without the
/// endpoint asked for); returns the request line.
fn agent_without_endpoints(socket: &Path) -> std::thread::JoinHandle<String> {
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = Vec::new();
        let mut byte = [0u8; 1];
        while !request.ends_with(b"\r\n\r\n")
            && std::io::Read::read(&mut stream, &mut byte).unwrap() == 1
        {
            request.push(byte[0]);
        }
        let body = "no endpoint for this container";
        write!(
            stream,
            "HTTP/1.1 404 Not Found\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        String::from_utf8_lossy(&request)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    })
}

/// Guards issue 36 (item 5): CHECK of an attachment the agent does not have is code 3 (unknown
/// container: it will not clear by itself), not 11 (try again later), which stays for an agent
/// that does not answer; it asks for the attachment `CNI_IFNAME` names.
#[test]
fn check_of_an_attachment_the_agent_does_not_have_is_an_unknown_container() {
    let (dir, plugin) = plugin_dir();
    let socket = dir.path().join("agent.sock");
    let agent = agent_without_endpoints(&socket);
    let (out, json) = cni(&plugin, "CHECK", &config(&socket, true));
    assert!(!out.status.success());
    assert_eq!(json["code"], 3, "{json}");
    assert_eq!(
        agent.join().unwrap(),
        "GET /v1/cni/0123456789abcdef0123/eth0 HTTP/1.1"
    );
}

/// Guards issue 36 (item 5): bytes that are not text on stdin are a decode failure (code 6),
/// not an I/O error (5); VERSION reads no configuration and answers anyway.
#[test]
fn bytes_that_are_not_text_are_a_decode_error() {
    let (_dir, plugin) = plugin_dir();
    let garbage: Vec<u8> = (0..512u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 0x80)
        .collect();
    assert!(std::str::from_utf8(&garbage).is_err());
    for command in ["ADD", "CHECK", "DEL"] {
        let (out, json) = cni_bytes(&plugin, command, &garbage);
        assert!(!out.status.success(), "{command}");
        assert_eq!(json["code"], 6, "{command}: {json}");
    }
    let (out, json) = cni_bytes(&plugin, "VERSION", &garbage);
    assert!(out.status.success(), "{json}");
    assert!(json["supportedVersions"].is_array(), "{json}");
}
