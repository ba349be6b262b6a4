#!/usr/bin/env bash
# hold-time.sh — how long `fqdnd node` holds an answer that teaches a new IP, on the real
# kernel datapath. Needs root (namespaces, eBPF).
#
#   endpoint netns ──veth── host netns: fqdnd node (eBPF redirect, transparent proxy,
#                                       kernel ipcache/policy maps)
#                           └─veth── ext netns: authoritative DNS (fqdnd gateway, static zone)
#
# The endpoint's policy has one FQDN selector, `*.bench.test`, and the zone holds N names each
# with its own IPv4 address. dnsperf, inside the endpoint namespace, asks each name once at
# RATE queries/s (so RATE new IPs/s for an existing selector: every answer adds a /32 to the
# kernel ipcache before it is released). The hold is the proxy's own histogram
# `fqdnd_dns_hold_seconds`: from the validated upstream answer to the reply leaving.
#
# With STATE=1 the node has a stateDir (on the disk, /var/tmp): each reply is then held until
# its journal record is fsynced (group commit) as well.
# With RECORD=1 `fqdnd record` writes every query and reply into pcapng files meanwhile (to
# measure what recording adds to the hold); at the end the files are read back by
# `fqdnd replay` and the record status (written, dropped) is printed.
# With STATE=1 FREEZE=SECONDS the state directory is a 256 MiB ext4 file system on a loop
# device instead, frozen (`fsfreeze`) for that long 60 % into each rate's run: a state disk
# whose sync stalls. dnsperf's lost queries and each namespace's UDP receive-buffer drops
# (`RcvbufErrors`) are printed after each rate.
# Knobs (env): RATES="1000 5000" DURATION=10 (s per rate), STATE=0, FREEZE=, RECORD=0,
# RUN=/tmp/fqdnd-hold-time, FQDND_BIN (a built fqdnd to measure instead of building this tree's).
# Last line: `hold-time: <rate>/s p50 <µs> p99 <µs> ...` for each rate.
# Everything started here (namespaces, processes, pins) is removed on exit.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
RUN="${RUN:-/tmp/fqdnd-hold-time}"
RATES="${RATES:-1000 5000}"
DURATION="${DURATION:-10}"
P=fqht
N=77
PIN=/sys/fs/bpf/fqdnd-hold-time
FREEZE="${FREEZE:-}"
DISK=/var/tmp/fqdnd-hold-time-disk
STATE_DIR=/var/tmp/fqdnd-hold-time-state
if [ -n "$FREEZE" ]; then
  [ "${STATE:-0}" = 1 ] || { echo "hold-time.sh: FREEZE needs STATE=1" >&2; exit 1; }
  STATE_DIR=$DISK/mnt/state
fi

log() { printf '[hold-time] %s\n' "$*" >&2; }

[ "$(id -u)" -eq 0 ] || { echo "hold-time.sh: needs root (namespaces, eBPF)" >&2; exit 1; }
command -v dnsperf >/dev/null || {
  log "installing dnsperf"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dnsperf >/dev/null
}
"$ROOT/scripts/install-deps.sh"

PIDS=()
FREEZER=
cleanup() {
  # The freezer first, so that it cannot freeze the disk again behind this.
  if [ -n "$FREEZER" ]; then kill "$FREEZER" 2>/dev/null || true; wait "$FREEZER" 2>/dev/null || true; fi
  if mountpoint -q "$DISK/mnt"; then fsfreeze -u "$DISK/mnt" 2>/dev/null || true; fi
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  # Gone before the unmount: a dying fqdnd still holds its state files open.
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if mountpoint -q "$DISK/mnt"; then umount "$DISK/mnt" || umount -l "$DISK/mnt" || true; fi
  rm -rf "$DISK" || true
  for ns in host ep ext; do ip netns del "$P-$ns" 2>/dev/null || true; done
  rm -rf "$PIN"
}
trap cleanup EXIT INT TERM
cleanup

BIN="${FQDND_BIN:-}"
if [[ -z $BIN ]]; then
  log "building fqdnd (release)"
  (cd "$ROOT" && cargo build --release --locked --quiet)
  BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/fqdnd"
fi

total=0
for r in $RATES; do total=$((total + r * DURATION)); done
rm -rf "$RUN" /var/tmp/fqdnd-hold-time-state && mkdir -p "$RUN"
if [ -n "$FREEZE" ]; then
  mkdir -p "$DISK/mnt"
  truncate -s 256M "$DISK/img"
  mkfs.ext4 -q -F "$DISK/img"
  mount -o loop "$DISK/img" "$DISK/mnt"
fi
{
  printf '$TTL 3600\n@ IN SOA ns.bench.test. admin.bench.test. 1 3600 600 86400 60\n@ IN NS ns.bench.test.\n'
  awk -v n="$total" -v N="$N" 'BEGIN{for(i=0;i<n;i++) printf "h%06d 3600 IN A 100.%d.%d.%d\n", i, 64+int(i/62500), int(i/250)%250, (i%250)+1}'
} | sed 's/^/      /' >"$RUN/zone.txt"

# Topology.
for ns in host ep ext; do ip netns add "$P-$ns"; ip -n "$P-$ns" link set lo up; done
ip netns exec "$P-host" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
ip -n "$P-host" link add "${P}eh" type veth peer name "${P}e" netns "$P-ep"
ip -n "$P-host" addr add "10.$N.1.1/24" dev "${P}eh"; ip -n "$P-host" link set "${P}eh" up
ip -n "$P-ep" addr add "10.$N.1.2/24" dev "${P}e"; ip -n "$P-ep" link set "${P}e" up
ip -n "$P-ep" route add default via "10.$N.1.1"
ip -n "$P-host" link add "${P}xh" type veth peer name "${P}x" netns "$P-ext"
ip -n "$P-host" addr add "10.$N.9.1/24" dev "${P}xh"; ip -n "$P-host" link set "${P}xh" up
ip -n "$P-ext" addr add "10.$N.9.53/24" dev "${P}x"; ip -n "$P-ext" link set "${P}x" up
ip -n "$P-ext" route add default via "10.$N.9.1"

cat >"$RUN/dns.yaml" <<EOF
apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: ["10.$N.9.53:53"]
  adminSocket: $RUN/dns-admin.sock
  staticZones:
  - origin: bench.test
    records: |
$(cat "$RUN/zone.txt")
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: all}
spec: {id: 1, addresses: ["0.0.0.0/0"]}
EOF
cat >"$RUN/node.yaml" <<EOF
apiVersion: fqdnd.io/v1
kind: Node
spec:
  pinDir: $PIN
  adminSocket: $RUN/node-admin.sock
  metrics: 127.0.0.1:9967
$( [ "${STATE:-0}" = 1 ] && echo "  stateDir: $STATE_DIR" )
---
apiVersion: fqdnd.io/v1
kind: Settings
spec:
  breakers: {maxNamesPerEndpoint: 1000000}   # every answer must be learned, none rejected
---
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: bench}
spec: {id: 1, interface: ${P}eh, addresses: [10.$N.1.2], labels: {app: bench}}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: bench}
spec:
  endpointSelector: {matchLabels: {app: bench}}
  egress:
  - toCIDR: [10.$N.9.53/32]
    toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules: {dns: [{matchPattern: "*.bench.test"}]}
  - toFQDNs: [{matchPattern: "*.bench.test"}]
    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
EOF

wait_sock() {
  for _ in $(seq 1 600); do [ -S "$1" ] && return 0; sleep 0.05; done
  echo "hold-time.sh: $1 did not appear" >&2; exit 1
}
nsenter --net="/run/netns/$P-ext" "$BIN" gateway --config "$RUN/dns.yaml" >"$RUN/dns.log" 2>&1 &
PIDS+=($!)
wait_sock "$RUN/dns-admin.sock"
FQDND_LOG=warn nsenter --net="/run/netns/$P-host" "$BIN" node --config "$RUN/node.yaml" >"$RUN/node.log" 2>&1 &
PIDS+=($!)
wait_sock "$RUN/node-admin.sock"
if [ "${RECORD:-0}" = 1 ]; then
  "$BIN" record start --dir "$RUN/rec" --max-files 1000 --admin-socket "$RUN/node-admin.sock" >/dev/null
  log "recording into $RUN/rec"
fi

metrics() {
  ip netns exec "$P-host" python3 -c 'import urllib.request;print(urllib.request.urlopen("http://127.0.0.1:9967/metrics").read().decode())'
}
# The proxy's summary: quantiles over its last 40–60 s (seconds → µs).
quantile() {
  awk -v q="$1" '$1 ~ /^fqdnd_dns_hold_seconds\{/ && $0 ~ "quantile=\""q"\"" {printf "%.0f", $2*1e6}'
}

first=0
summary=()
for rate in $RATES; do
  count=$((rate * DURATION))
  awk -v s="$first" -v n="$count" 'BEGIN{for(i=s;i<s+n;i++) printf "h%06d.bench.test A\n", i}' >"$RUN/q-$rate.txt"
  first=$((first + count))
  log "rate $rate/s for ${DURATION}s: $count new names, each a new IP for *.bench.test"
  if [ -n "$FREEZE" ]; then
    (
      sleep "$(awk -v d="$DURATION" 'BEGIN{print d * 0.6}')"
      fsfreeze -f "$DISK/mnt"
      sleep "$FREEZE"
      fsfreeze -u "$DISK/mnt"
    ) &
    FREEZER=$!
  fi
  ip netns exec "$P-ep" timeout $((DURATION + 20)) dnsperf -s "10.$N.9.53" -d "$RUN/q-$rate.txt" \
    -Q "$rate" -l "$DURATION" -n 1 -q 500 >"$RUN/dnsperf-$rate.txt" 2>&1 || true
  if [ -n "$FREEZER" ]; then wait "$FREEZER" || true; FREEZER=; fi
  grep -E "Queries (sent|completed|lost)|Average Latency" "$RUN/dnsperf-$rate.txt" | sed 's/^ */  /' >&2
  if [ -n "$FREEZE" ]; then
    drops=""
    for ns in ep host ext; do
      drops+=" $ns $(ip netns exec "$P-$ns" awk '$1=="Udp:" && $6!="RcvbufErrors" {print $6}' /proc/net/snmp)"
    done
    log "a ${FREEZE}s freeze: dnsperf lost $(awk '/Queries lost/{print $3}' "$RUN/dnsperf-$rate.txt") of $(awk '/Queries sent/{print $3}' "$RUN/dnsperf-$rate.txt"); UDP receive-buffer drops:$drops"
  fi
  m="$(metrics)"
  p50=$(quantile 0.5 <<<"$m"); p99=$(quantile 0.99 <<<"$m"); p999=$(quantile 0.999 <<<"$m"); max=$(quantile 1 <<<"$m")
  prefixes=$("$BIN" bpf ipcache list --pin-dir "$PIN" | grep -c "^100\.6[4-9]\." || true)
  log "hold p50 ${p50}µs p99 ${p99}µs p99.9 ${p999}µs max ${max}µs; learned /32s in the kernel ipcache so far: $prefixes of $first"
  summary+=("${rate}/s p50 ${p50}µs p99 ${p99}µs p99.9 ${p999}µs max ${max}µs")
  sleep 1
done
if [ "${STATE:-0}" = 1 ]; then
  m="$(metrics)"
  log "journal: $(grep -E '^fqdnd_checkpoint_((records|fsyncs)_total|slow_batches_total)' <<<"$m" | tr '\n' ' ')"
fi
if [ "${RECORD:-0}" = 1 ]; then
  "$BIN" record stop --json --admin-socket "$RUN/node-admin.sock" >"$RUN/record.json"
  log "record: $(python3 -c 'import json,sys;d=json.load(open(sys.argv[1]));print("taken",d["taken"],"written",d["packets"],"dropped",d["dropped"],"files",len(d["files"]))' "$RUN/record.json")"
  replayed=$("$BIN" replay "$RUN"/rec/*.pcapng --policy "$RUN/node.yaml" --json --progress 0 | python3 -c 'import json,sys;d=json.load(sys.stdin);print(d["queries"],"queries",d["responses"],"responses")')
  log "read back by fqdnd replay: $replayed"
fi
echo "hold-time$( [ "${STATE:-0}" = 1 ] && echo ' (stateDir, fsync per batch)')$( [ "${RECORD:-0}" = 1 ] && echo ' (recording)'): $(IFS=';'; echo "${summary[*]}")"
