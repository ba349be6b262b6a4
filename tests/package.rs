//! The Debian package in a booted Debian with systemd: installed, upgraded from the previous
//! packaged commit with its state kept, its units used as an administrator would (gateway,
//! operator, node agent with a systemd unit as an endpoint), removed and purged. The scenario
//! is `scripts/package-e2e.sh` (root; podman, mmdebstrap and the Debian mirror for the first
//! run's root file system, cached after it).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::process::Command;

#[test]
fn the_package_installs_upgrades_serves_and_purges_in_a_booted_debian() {
    if !common::privileged("package e2e", "for podman, a booted systemd and eBPF") {
        return;
    }
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/package-e2e.sh"
    ))
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    // The figures (boot, upgrade losses, systemd-analyze) for whoever reads the test's output.
    eprintln!("{stderr}");
    assert_eq!(stdout.lines().last().unwrap_or_default(), "package e2e: ok");
}
