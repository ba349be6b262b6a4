#!/usr/bin/env bash
# The dashboard in a real browser: a gateway on loopback (the demo's static zones and policy,
# examples/gateway-demo.yaml) with its dashboard behind a token, traffic from dig, and Debian's
# headless Chromium driven over WebDriver (chromedriver) from Python's standard library. It
# checks what a user would see: every page loads without console errors, the figures match
# `fqdnd status --json` and `fqdnd cache list --json`, a new query shows in the live tail within
# 2 s, the explain form agrees with `fqdnd policy explain` on an allowed and a denied flow, a
# name carrying markup shows as text, and a request without the token is refused.
#
# Usage: scripts/dashboard-e2e.sh [--readme-shot]
#   FQDND_BIN   the fqdnd binary (default: target/debug/fqdnd)
#   --readme-shot  also copy the Overview's screenshot to docs/images/dashboard.png
# Screenshots of every page are kept in a temporary directory (printed). Prints
# `dashboard e2e: ok` last. Needs chromium, chromium-driver and dnsutils
# (scripts/install-deps.sh installs them).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${FQDND_BIN:-$repo/target/debug/fqdnd}"
readme_shot=0
[ "${1:-}" = "--readme-shot" ] && readme_shot=1
for tool in chromium chromedriver dig python3; do
  command -v "$tool" >/dev/null || { echo "dashboard e2e: $tool is missing (scripts/install-deps.sh)" >&2; exit 1; }
done
[ -x "$bin" ] || { echo "dashboard e2e: no fqdnd binary at $bin (cargo build --bin fqdnd)" >&2; exit 1; }

work="$(mktemp -d /tmp/fqdnd-dashboard-e2e.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    # Bounded: a process that ignores TERM gets KILL after 5 s.
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  if [ "${keep:-0}" = 1 ]; then
    # The screenshots stay; the rest (the token, the profile, sockets) goes.
    find "$work" -mindepth 1 -maxdepth 1 ! -name shots -exec rm -rf {} +
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

dash_port="$(free_port)"
token="$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')"
printf '%s\n' "$token" > "$work/token"
chmod 600 "$work/token"
# The demo's documents, with an admin socket, the answer cache and the dashboard in the Gateway
# document.
python3 - "$repo/examples/gateway-demo.yaml" "$work/gateway.yaml" "$work/admin.sock" "$dash_port" <<'PY'
import sys
src, dst, sock, port = sys.argv[1:]
text = open(src).read()
marker = "  upstreamTimeout: 2s\n"
assert marker in text, "examples/gateway-demo.yaml changed: no upstreamTimeout line"
text = text.replace(marker, marker + f"  adminSocket: {sock}\n  cache: {{}}\n  dashboard:\n    address: 127.0.0.1:{port}\n    tokenFile: token\n", 1)
open(dst, "w").write(text)
PY

"$bin" gateway --config "$work/gateway.yaml" > "$work/gateway.log" 2>&1 &
pids+=($!)
fqdnd() { "$bin" "$@" --admin-socket "$work/admin.sock"; }
# Bounded wait for the admin API and the dashboard.
for i in $(seq 100); do
  if fqdnd status --json > "$work/status.json" 2>/dev/null \
     && python3 -c "import socket; socket.create_connection(('127.0.0.1', $dash_port), 1)" 2>/dev/null; then
    break
  fi
  [ "$i" = 100 ] && { echo "dashboard e2e: the gateway did not start:" >&2; cat "$work/gateway.log" >&2; exit 1; }
  kill -0 "${pids[0]}" 2>/dev/null || { echo "dashboard e2e: the gateway exited:" >&2; cat "$work/gateway.log" >&2; exit 1; }
  sleep 0.1
done
dns="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["listen"][0])' "$work/status.json")"
dns_ip="${dns%:*}"
dns_port="${dns##*:}"
ask() { dig +short +tries=1 +time=2 -p "$dns_port" "@$dns_ip" "$@" || true; }

# Traffic: allowed names, a denied one, a deny-listed one, NXDOMAIN.
for _ in 1 2 3; do
  ask www.example.test A >/dev/null
  ask shop.example.test A >/dev/null
  ask api.example.net A >/dev/null
  ask other.example.net A >/dev/null
  ask ads.example.test A >/dev/null
  ask nothing-here.example.test A >/dev/null
done

driver_port="$(free_port)"
chromedriver --port="$driver_port" > "$work/chromedriver.log" 2>&1 &
pids+=($!)

mkdir -p "$work/shots"
keep=1
status=0
python3 "$repo/scripts/dashboard-e2e.py" \
  --dashboard "http://127.0.0.1:$dash_port" --token-file "$work/token" \
  --driver "http://127.0.0.1:$driver_port" --profile "$work/chrome-profile" \
  --shots "$work/shots" --fqdnd "$bin" --admin-socket "$work/admin.sock" \
  --dns "$dns_ip" --dns-port "$dns_port" || status=$?
if [ "$status" != 0 ]; then
  echo "dashboard e2e: FAILED; the gateway's log:" >&2
  tail -n 30 "$work/gateway.log" >&2
  echo "screenshots in $work/shots" >&2
  exit "$status"
fi
if [ "$readme_shot" = 1 ]; then
  mkdir -p "$repo/docs/images"
  cp "$work/shots/overview.png" "$repo/docs/images/dashboard.png"
fi
echo "screenshots: $work/shots"
echo "dashboard e2e: ok"
