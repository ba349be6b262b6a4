//! A container started by podman with CNI networking (bridge or ptp, then fqdnd-cni) becomes
//! an endpoint of a real `fqdnd node`, resolves through it, reaches the allowed name's IP and
//! not another, and is gone when removed; then issue 36's findings, as black-box checks: a
//! container on two networks, `podman network connect`/`disconnect`, an agent without
//! `stateDir` restarted, `podman rm` while the agent is down, labels of one container, CHECK.
//! The scenario is `scripts/podman-e2e.sh` (root; it installs podman and its helpers if
//! missing).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::process::Command;

fn run(plugin: &str) -> String {
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/podman-e2e.sh"
    ))
    .env("FQDND_BIN", env!("CARGO_BIN_EXE_fqdnd"))
    .env("CNI_PLUGIN", plugin)
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().last().unwrap_or_default().to_owned()
}

#[test]
fn a_podman_container_is_an_endpoint_while_it_runs() {
    if !common::privileged("podman e2e", "for namespaces, eBPF and podman") {
        return;
    }
    assert_eq!(run("bridge"), "podman e2e: ok (bridge)");
    assert_eq!(run("ptp"), "podman e2e: ok (ptp)");
}
