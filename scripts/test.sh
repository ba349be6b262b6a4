#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test of every crate (unit, property,
# integration). This is the README's test command and what .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
  echo "test.sh: cargo is not installed; install rustup and the toolchain in rust-toolchain.toml" >&2
  exit 1
fi

./scripts/install-deps.sh
# The committed eBPF object must be what its source compiles to (see ebpf/build.rs).
export FQDND_BPF_CHECK=1

cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked --no-fail-fast
