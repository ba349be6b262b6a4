//! The dashboard in a real browser: `scripts/dashboard-e2e.sh` runs a gateway with its
//! dashboard behind a token, makes traffic with dig and drives Debian's headless Chromium over
//! WebDriver through every page (figures against `fqdnd status`/`cache list`, the live tail
//! within 2 s, explain against `fqdnd policy explain`, markup shown as text, no console error,
//! the token required). Needs chromium, chromium-driver and dnsutils (scripts/install-deps.sh);
//! skipped without them, except with FQDND_REQUIRE_PRIVILEGED=1 (CI), where it fails.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::process::Command;

fn installed(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_dashboard_shows_what_the_gateway_does_in_a_real_browser() {
    let tools = ["chromium", "chromedriver", "dig", "python3"];
    if !common::runnable(
        "dashboard e2e",
        tools.iter().all(|t| installed(t)),
        "chromium, chromedriver, dig and python3 (scripts/install-deps.sh)",
    ) {
        return;
    }
    let out = Command::new(common::repo_path("scripts/dashboard-e2e.sh"))
        .env("FQDND_BIN", env!("CARGO_BIN_EXE_fqdnd"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().last().unwrap_or_default(),
        "dashboard e2e: ok",
        "{stdout}"
    );
}
