#!/usr/bin/env bash
# restore-time.sh — how long a restarting gateway takes to restore a large DNS cache from its
# state directory (issue 5 target: ≤ 1 s for 1M cache entries).
#
# Writes a synthetic snapshot (NAMES names × IPS addresses under bench.test, all valid for an
# hour), starts `fqdnd gateway` on it with a policy whose FQDN selector matches every name
# (so every entry gets labels and an identity, as in production), and reads the restore's own
# timing from its log (`DNS cache restored … restore_ms`): identities, every answer learned
# again through the NameManager and IpCache, one commit (to no datapath: the gateway does not
# enforce; a node's or an enforcing gateway's kernel maps are reconciled, not rewritten, when
# they already hold the entries, which this does not measure).
# Knobs (env): NAMES=100000 IPS=10, SPREAD=0 (expiries spread over that many seconds past the
# hour, each name's at random), AS_MADE=0 (1: the snapshot's names in the order made up, not
# latest expiry first as compaction writes them: with a spread, restored in an order that is
# not the snapshot's),
# RUN=/tmp/fqdnd-restore-time, FQDND_BIN (a built fqdnd to
# measure instead of building this tree's), SYNTH_BIN (the build that writes the snapshot, if
# not that one: one older than `--expiry-spread`, say), PRELOAD (a library for the gateway's LD_PRELOAD:
# another malloc, say). Last line:
#   restore-time: <entries> entries: read + decode <ms> ms, rebuild <ms> ms, total <ms> ms (...)
# (in brackets: the CPU time of every thread since the process started, and its page faults).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN="${RUN:-/tmp/fqdnd-restore-time}"
NAMES="${NAMES:-100000}"
IPS="${IPS:-10}"
SPREAD="${SPREAD:-0}"
cd "$ROOT"
BIN="${FQDND_BIN:-}"
if [[ -z $BIN ]]; then
  command -v protoc >/dev/null || { echo "restore-time.sh: protoc is missing, the build needs it (scripts/install-deps.sh)" >&2; exit 1; }
  cargo build --release --locked --quiet
  BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/fqdnd"
fi
rm -rf "$RUN" && mkdir -p "$RUN"
PID=
trap '[ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; true' EXIT
order=()
[[ ${AS_MADE:-0} == 1 ]] && order=(--as-made)
"${SYNTH_BIN:-$BIN}" checkpoint synthesize "$RUN/state" --zone bench.test --names "$NAMES" --ips "$IPS" \
  --expiry-spread "$SPREAD" "${order[@]}"
port=$(python3 -c 'import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
cat >"$RUN/gateway.yaml" <<YAML
apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: ["127.0.0.1:$port"]
  upstreams: ["127.0.0.1:9"]
  stateDir: state
  adminSocket: admin.sock
---
apiVersion: fqdnd.io/v1
kind: Settings
spec:
  breakers: {maxNamesPerEndpoint: 10000000, maxFQDNIdentities: 100000}
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: all}
spec: {id: 1, addresses: ["127.0.0.0/8"], labels: {site: lan}}
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: all}
spec:
  endpointSelector: {matchLabels: {site: lan}}
  egress:
  - toFQDNs: [{matchPattern: "*.bench.test"}]
    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
YAML
FQDND_LOG=info,fqdnd=debug ${PRELOAD:+env LD_PRELOAD=$PRELOAD} "$BIN" gateway --config "$RUN/gateway.yaml" 2>"$RUN/gateway.log" &
PID=$!
for _ in $(seq 1 600); do [ -S "$RUN/admin.sock" ] && break; sleep 0.1; done
[ -S "$RUN/admin.sock" ] || { cat "$RUN/gateway.log" >&2; exit 1; }
read_line=$(grep "state restored" "$RUN/gateway.log" | tail -1)
line=$(grep "DNS cache restored" "$RUN/gateway.log" | tail -1)
echo "$read_line" >&2
echo "$line" >&2
read_ms=$(sed -n 's/.*read_ms=\([0-9]*\).*/\1/p' <<<"$read_line")
entries=$(sed -n 's/.*entries=\([0-9]*\).*/\1/p' <<<"$line")
ms=$(sed -n 's/.*restore_ms=\([0-9]*\).*/\1/p' <<<"$line")
rss=$(awk '/VmRSS/{printf "%d", $2/1024}' "/proc/$PID/status")
# CPU time of the whole start (every thread's, the restore's helpers included) and its page
# faults (each costs ~2 us on a VM: a large part of a restore's CPU).
cpu=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%d", ($14 + $15) * 1000 / hz}' "/proc/$PID/stat")
minflt=$(awk "{print \$10}" "/proc/$PID/stat")
size=$(du -m "$RUN/state/snapshot" | cut -f1)
echo "restore-time: $entries entries: read + decode $read_ms ms, rebuild $ms ms, total $((read_ms + ms)) ms (snapshot $size MB, RSS $rss MB, CPU $cpu ms, $minflt page faults)"
