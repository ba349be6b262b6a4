#!/usr/bin/env bash
# kill-restart.sh — crash safety of the gateway's durable state under load: a gateway with a
# stateDir is killed with SIGKILL at random moments and restarted, ITERATIONS times, while
# dnsperf (background load, QPS queries/s) and 4 recording clients ask names that each teach
# a new IP. After every restart, every (name, IP) a recording client received before a kill
# must be in the ipcache, and every label set must keep its identity number.
#
# This is the test suite's `tests/restart.rs` (20 iterations there) with more iterations and
# dnsperf on top. Knobs (env): ITERATIONS=100, QPS=2000. Last line:
#   kill-restart: N kills, lost acknowledged mappings: L, identity changes: C (...)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
command -v dnsperf >/dev/null || {
  echo "[kill-restart] installing dnsperf" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dnsperf >/dev/null
}
cd "$ROOT"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
FQDND_KILL_ITERATIONS="${ITERATIONS:-100}" FQDND_KILL_DNSPERF="${QPS:-2000}" \
  cargo test --release --locked --quiet --test restart -- --nocapture >"$out" 2>&1 || true
grep -v '^kill-restart:' "$out" | grep -E 'round|panicked|error' >&2 || true
grep '^kill-restart:' "$out" || { cat "$out" >&2; exit 1; }
