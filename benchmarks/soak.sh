#!/usr/bin/env bash
# soak.sh — hostile input and faults against a real gateway, for SOAK_MINUTES (default 10):
#
#   - verdict checkers: 100 known names (kN.corp.test, learned before the rest starts) must be
#     answered NOERROR with their own address; a deny-listed name and a name no rule allows
#     must be REFUSED. A wrong verdict is a known name REFUSED or answered with other addresses,
#     or a denied name not REFUSED; a known name answered SERVFAIL (no live upstream, a hold
#     fallback) is counted as unavailable, no reply at all as lost;
#   - water torture: two dnsperf clients (127.0.0.2, 127.0.0.4) at FLOOD_QPS each, every name
#     unique (*.flood.test, TTL 20), against maxCacheEntries 50000;
#   - a client over its rate limit (127.0.0.3 at 3x the 1000 qps limit, REFUSED past it);
#   - big answers: cdn.big.test, 2,500 new addresses per TCP answer (capped, fails closed);
#   - identity pressure: aN.multi.test, each its own matchName selector plus a shared address,
#     against maxFQDNIdentities 64;
#   - upstream faults: *.garbage.test (garbage replies), *.slow.test (no reply);
#   - two kill -9 restarts (state directory with journal), at 1/3 and 2/3 of the run.
#
# Everything is on 127.0.0.0/8, bounded in time (every client has a deadline) and cleaned up
# on exit, failure or Ctrl-C. Measures the gateway's max RSS (sampled every second) and CPU
# (user+system of each incarnation), counts crashes (exits that were not our kill -9) and wrong
# verdicts. Last line:
#   soak: <minutes> min, crashes: N, max RSS MiB: M, wrong verdicts: W
# Knobs (env): SOAK_MINUTES=10, FLOOD_QPS=900, PORT_BASE=15300, KEEP=1 (keep the work dir).
set -euo pipefail
MINUTES="${SOAK_MINUTES:-10}"
FLOOD_QPS="${FLOOD_QPS:-900}"
BASE="${PORT_BASE:-15300}"
DNS_PORT=$((BASE + 53)) UP_PORT=$((BASE + 54)) METRICS_PORT=$((BASE + 67))
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
say() { echo "[soak] $*" >&2; }

need=()
command -v dnsperf >/dev/null || need+=(dnsperf)
command -v dig >/dev/null || need+=(bind9-dnsutils)
# The build: etcd-client compiles etcd's protos (`protoc` and the well-known .proto files).
command -v protoc >/dev/null || need+=(protobuf-compiler)
[ -e /usr/include/google/protobuf/descriptor.proto ] || need+=(libprotobuf-dev)
if ((${#need[@]})); then
  say "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
cd "$ROOT"
say "building"
cargo build --release --locked --quiet --bin fqdnd
cargo build --release --locked --quiet -p fqdnd-benchmarks --bin soak_upstream
FQDND="$TARGET/release/fqdnd"

WORK="$(mktemp -d /tmp/fqdnd-soak.XXXXXX)"
PIDS=()
GW_PID=""
cleanup() {
  for p in "${PIDS[@]}" $GW_PID; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [[ "${KEEP:-0}" == 1 ]]; then say "work dir kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

SECS=$((MINUTES * 60))
"$TARGET/release/soak_upstream" "127.0.0.1:$UP_PORT" --seconds $((SECS + 120)) &
PIDS+=($!)

selectors=""
for n in $(seq 1 200); do selectors+="    - matchName: a$n.multi.test"$'\n'; done
cat >"$WORK/gateway.yaml" <<EOF
apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: ["127.0.0.1:$DNS_PORT"]
  upstreams: ["127.0.0.1:$UP_PORT"]
  adminSocket: admin.sock
  metrics: 127.0.0.1:$METRICS_PORT
  stateDir: state
  upstreamTimeout: 1s
  onHoldTimeout: servfail
  rateLimit: {qps: 1000, burst: 2000, action: refused}
  lists: {denyNames: ["bad.corp.test"]}
---
apiVersion: fqdnd.io/v1
kind: Settings
spec:
  gcInterval: 10s
  breakers: {maxCacheEntries: 50000, maxNamesPerEndpoint: 10000000, maxFQDNIdentities: 64}
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: lan}
spec: {id: 7, addresses: ["127.0.0.0/8"], labels: {site: lan}}
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: lan}
spec:
  endpointSelector: {matchLabels: {site: lan}}
  egress:
  - toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules:
        dns:
        - matchPattern: "*.corp.test"
        - matchPattern: "*.flood.test"
        - matchPattern: "*.big.test"
        - matchPattern: "*.multi.test"
        - matchPattern: "*.garbage.test"
        - matchPattern: "*.slow.test"
  - toFQDNs:
    - matchPattern: "*.corp.test"
    - matchPattern: "*.flood.test"
    - matchPattern: "*.big.test"
    - matchPattern: "*.multi.test"
$selectors    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
EOF

CPU_TICKS=0
cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
start_gateway() {
  rm -f "$WORK/admin.sock"
  (cd "$WORK" && exec "$FQDND" gateway --config gateway.yaml) 2>>"$WORK/gateway.log" &
  GW_PID=$!
  for _ in $(seq 1 300); do
    [[ -S "$WORK/admin.sock" ]] && dig +short +tries=1 +time=1 -p "$DNS_PORT" @127.0.0.1 k0.corp.test >/dev/null 2>&1 && return 0
    kill -0 "$GW_PID" 2>/dev/null || { say "gateway exited at start"; tail -20 "$WORK/gateway.log" >&2; return 1; }
    sleep 0.1
  done
  say "gateway did not come up"; return 1
}
start_gateway
START_WALL=$SECONDS

# Learn the known names before the flood.
for n in $(seq 0 99); do
  dig +short +tries=2 +time=2 -p "$DNS_PORT" @127.0.0.1 "k$n.corp.test" >/dev/null || true
done

expected_ip() { local n=$1; echo "100.64.$((n / 250)).$((n % 250 + 1))"; }
END=$((SECONDS + SECS))

# Verdict checkers (127.0.0.1): one line per check into checks.N.
checker() {
  local id=$1 out="$WORK/checks.$1"
  while ((SECONDS < END)); do
    local r=$((RANDOM % 10)) name want
    if ((r == 0)); then name="bad.corp.test"; want=REFUSED
    elif ((r == 1)); then name="x$RANDOM.other.test"; want=REFUSED
    else local n=$((RANDOM % 100)); name="k$n.corp.test"; want="NOERROR $(expected_ip "$n")"
    fi
    local reply status ips got
    if ! reply=$(dig +tries=1 +time=2 -b 127.0.0.1 -p "$DNS_PORT" @127.0.0.1 "$name" A +noall +comments +answer 2>/dev/null); then
      echo "lost $name" >>"$out"; continue
    fi
    status=$(grep -o 'status: [A-Z]*' <<<"$reply" | awk '{print $2}')
    [[ -z "$status" ]] && { echo "lost $name" >>"$out"; continue; }
    ips=$(awk '$4 == "A" {print $5}' <<<"$reply" | sort | tr '\n' ' ' | sed 's/ $//')
    got="$status${ips:+ $ips}"
    if [[ "$got" == "$want" ]]; then echo ok >>"$out"
    elif [[ "$want" != REFUSED && "$status" == SERVFAIL ]]; then
      # Fail closed, not a verdict: no upstream answer (marked dead, timeout) or a hold
      # fallback. A policy error is an allowed name refused or answered with other addresses,
      # or a denied name not refused.
      echo "unavailable $name" >>"$out"
    else echo "wrong $name: got '$got' want '$want'" >>"$out"; fi
    sleep 0.05
  done
}
checker 1 & PIDS+=($!)
checker 2 & PIDS+=($!)

# Water torture from two addresses, under the rate limit each.
for src in 2 4; do
  seq 1 $((FLOOD_QPS * SECS)) | awk -v s="$src" '{printf "w%d-%d.flood.test A\n", $1, s}' >"$WORK/flood.$src"
  timeout $((SECS + 30)) dnsperf -s 127.0.0.1 -p "$DNS_PORT" -a "127.0.0.$src" -d "$WORK/flood.$src" \
    -l "$SECS" -Q "$FLOOD_QPS" -c 4 -t 2 >"$WORK/dnsperf.flood.$src" 2>&1 &
  PIDS+=($!)
done
# A client over its rate limit: 3000 qps of known names against a 1000 qps limit.
for n in $(seq 0 99); do echo "k$n.corp.test A"; done >"$WORK/known"
timeout $((SECS + 30)) dnsperf -s 127.0.0.1 -p "$DNS_PORT" -a 127.0.0.3 -d "$WORK/known" \
  -l "$SECS" -Q 3000 -c 2 -t 2 >"$WORK/dnsperf.limited" 2>&1 &
PIDS+=($!)
# Big answers, identity pressure, upstream faults: low-rate loops with deadlines.
(while ((SECONDS < END)); do dig +tcp +tries=1 +time=5 -p "$DNS_PORT" @127.0.0.1 cdn.big.test >/dev/null 2>&1 || true; sleep 3; done) &
PIDS+=($!)
(n=1; while ((SECONDS < END)); do dig +tries=1 +time=2 -p "$DNS_PORT" @127.0.0.1 "a$n.multi.test" >/dev/null 2>&1 || true; n=$((n % 250 + 1)); sleep 0.5; done) &
PIDS+=($!)
(while ((SECONDS < END)); do
  dig +tries=1 +time=2 -p "$DNS_PORT" @127.0.0.1 "g$RANDOM.garbage.test" >/dev/null 2>&1 || true
  dig +tries=1 +time=2 -p "$DNS_PORT" @127.0.0.1 "s$RANDOM.slow.test" >/dev/null 2>&1 || true
  sleep 1
done) &
PIDS+=($!)

say "running for $MINUTES min (gateway pid $GW_PID, work dir $WORK)"
crashes=0 kills=0 max_rss_kib=0
kill_at=($((START_WALL + SECS / 3)) $((START_WALL + 2 * SECS / 3)))
while ((SECONDS < END)); do
  sleep 1
  if ! kill -0 "$GW_PID" 2>/dev/null; then
    crashes=$((crashes + 1))
    say "the gateway exited by itself (crash $crashes); restarting"
    tail -5 "$WORK/gateway.log" >&2
    wait "$GW_PID" 2>/dev/null || true
    start_gateway || break
    continue
  fi
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$GW_PID/status" 2>/dev/null || echo 0)
  ((rss > max_rss_kib)) && max_rss_kib=$rss
  last_cpu=$(cpu_of "$GW_PID")
  if ((kills < ${#kill_at[@]})) && ((SECONDS >= kill_at[kills])); then
    CPU_TICKS=$((CPU_TICKS + last_cpu))
    kill -9 "$GW_PID"; wait "$GW_PID" 2>/dev/null || true
    kills=$((kills + 1))
    say "kill -9 $kills at $((SECONDS - START_WALL)) s; restarting"
    start_gateway
  fi
done
# Let the clients finish (they stop at END), then read what the gateway says.
sleep 3
metrics=$(curl -s "http://127.0.0.1:$METRICS_PORT/metrics" 2>/dev/null || true)
if [[ -n "$GW_PID" ]] && kill -0 "$GW_PID" 2>/dev/null; then
  CPU_TICKS=$((CPU_TICKS + $(cpu_of "$GW_PID")))
else
  CPU_TICKS=$((CPU_TICKS + last_cpu))
fi
wall=$((SECONDS - START_WALL))
hz=$(getconf CLK_TCK)
cat "$WORK"/checks.* >"$WORK/checks"
ok=$(grep -c '^ok' "$WORK/checks" || true)
lost=$(grep -c '^lost' "$WORK/checks" || true)
wrong=$(grep -c '^wrong' "$WORK/checks" || true)
unavailable=$(grep -c '^unavailable' "$WORK/checks" || true)
grep '^wrong' "$WORK/checks" | head -5 >&2 || true
metric() { awk -v m="$1" 'index($0, m) == 1 {s += $NF} END {printf "%d", s}' <<<"$metrics"; }
say "checks: $ok right, $wrong wrong, $unavailable unavailable (SERVFAIL), $lost lost (no reply within 2 s)"
say "upstream marked dead: $(grep -c 'upstream marked dead' "$WORK/gateway.log" || true) times; hold timeouts: $(grep -c 'did not finish in time' "$WORK/gateway.log" || true)"
say "flood: $(grep -h 'Queries sent' "$WORK"/dnsperf.flood.* | awk '{s += $3} END {print s}') queries sent by the two flooders"
say "limited client: $(grep -h -E 'Queries completed|Response codes' "$WORK/dnsperf.limited" | tr -s ' ' | tr '\n' ' ')"
say "metrics (last incarnation): rate_limited $(metric 'fqdnd_dns_queries_total{result="rate_limited"}'), trips cache_entries $(metric 'fqdnd_breaker_trips_total{breaker="cache_entries"}') fqdn_identities $(metric 'fqdnd_breaker_trips_total{breaker="fqdn_identities"}') ips_per_name $(metric 'fqdnd_breaker_trips_total{breaker="ips_per_name"}'), hold fallbacks $(metric 'fqdnd_dns_hold_fallbacks_total'), malformed answers dropped $(metric 'fqdnd_dns_dropped_answers_total{reason="malformed"}'), upstream timeouts $(metric 'fqdnd_dns_queries_total{result="upstream_timeout"}'), cache entries $(metric 'fqdnd_cache_entries ') (max $(metric 'fqdnd_cache_entries_max'))"
say "gateway CPU: $(awk -v t="$CPU_TICKS" -v h="$hz" -v w="$wall" 'BEGIN {printf "%.1f s over %d s wall (%.0f%% of one core)", t / h, w, 100 * t / h / w}'); kills: $kills"
echo "soak: $MINUTES min, crashes: $crashes, max RSS MiB: $((max_rss_kib / 1024)), wrong verdicts: $wrong"
