//! Names the commit in `fqdnd --version` (`0.1.0 (git 1a2b3c4d5e6f)`): from `git` when the
//! source is a git checkout, else from `FQDND_GIT_COMMIT` (a build from a tarball can set it),
//! else the version alone. And links the binary with full RELRO (`-z relro -z now`), as Debian's
//! hardening flags ask of a packaged executable.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=FQDND_GIT_COMMIT");
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let commit = std::env::var("FQDND_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    // Rebuilt when HEAD moves: the HEAD file (a branch switch) and the branch's ref (a commit),
    // loose or packed.
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(&["rev-parse", "--git-path", &branch])
    {
        println!("cargo:rerun-if-changed={p}");
    }
    let full = match commit {
        Some(c) => format!("{version} (git {c})"),
        None => version,
    };
    println!("cargo:rustc-env=FQDND_VERSION={full}");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,relro,-z,now");
    }
}
