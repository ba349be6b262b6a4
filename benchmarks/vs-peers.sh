#!/usr/bin/env bash
# vs-peers.sh — fqdnd gateway against dnsdist, same NSD upstream, same 2k-suffix policy, in one
# run: cache off (mode `nocache`) and both answer caches on (mode `cached`: dnsdist's packet
# cache against fqdnd's gateway cache). Prints per mode and server the QPS at saturation, the
# server's CPU µs per answered query (utime+stime from /proc/PID/stat over the saturation run:
# the machine is shared, so this is the figure to compare), p50/p99 at fixed rates and the CPU
# µs per answered query over the runs at the higher fixed rate (`cpu us/q @20k`: every server
# under the same load, less noisy than at saturation); the last lines are
#   ratio fqdnd/dnsdist cached qps: X.XX
#   ratio fqdnd/dnsdist qps: X.XX
#
#   NSD (authoritative, example.test: 10k A records)   127.0.0.1:5300
#   dnsdist 1.7 (2 listeners, no packet cache)          127.0.0.1:5301
#   dnsdist 1.7 (2 listeners, packet cache 100k)        127.0.0.1:5302
#   fqdnd gateway (full FQDN engine on, cache off)      127.0.0.1:5305
#   fqdnd gateway (the same, cache on: 100k entries)    127.0.0.1:5306
#   with BARE=1: bare_forwarder (no policy; 2 threads,  127.0.0.1:5307
#                one with PIN=1)
#   modes dot/doh: dnsdist 1.7 DoT / DoH frontends      127.0.0.1:5311 / 5312
#                  fqdnd gateway `tls` DoT / DoH         127.0.0.1:5315 / 5316
#                  (cache off on both, a test certificate made with openssl)
#
# Modes `dot` and `doh` (MODES="dot doh"): the same upstream and policy over DNS over TLS and
# DNS over HTTPS. DoT is driven by `dnsperf -m dot`; DoH by nghttp2's `h2load` (HTTP/2 GET
# `?dns=` requests cycling through the 10k names), because dnsperf 2.10's DoH client handles one
# response per TLS read and stalls when two arrive together (against dnsdist too). Their lines:
#   ratio fqdnd/dnsdist dot qps: X.XX
#   ratio fqdnd/dnsdist doh qps: X.XX
# and each server's CPU µs per answered query in the table, then `ratio fqdnd/dnsdist dot|doh
# cpu per query: X.XX`. With BARE=1 also `ratio fqdnd/bare cpu per query: X.XX`
# (issue 39's figure). No fixed-rate latency runs for them. After the table, the host's steal
# time over the run (`host steal during the run: N %`): runs with more than a few per cent
# compare the host's stalls more than the servers.
#
# Policy on both: allowed suffixes = example.test + 1000 others; denied = 500 suffixes inside
# example.test + 500 elsewhere. fqdnd additionally learns every answer (NameManager → IpCache)
# under a `toFQDNs: *.example.test` selector; a warm-up pass makes the names known first
# (steady state). Queries: the 10k names of the zone, shuffled.
#
# Knobs (env): DURATION=15 (s per saturation run), SAT_ROUNDS=1 (saturation runs per server,
# in rounds that take the servers in turn; QPS is their mean, CPU per query pooled over them),
# LAT_QPS="5000 20000", LAT_DURATION=10 (s per server and rate, in LAT_ROUNDS=1 rounds that
# take the servers in turn; p50/p99 are pooled over the rounds, and each round's p99 is
# printed too, with the number of rounds where fqdnd's was at or below dnsdist's),
# CLIENTS=4, OUTSTANDING=200, RUN=/tmp/fqdnd-vs-peers, MODES="nocache cached",
# FQDND_BIN (a built fqdnd to measure instead of building this tree's), FQDND_THREADS (the
# gateways' `dns.threads`; default: fqdnd's own, half the CPUs), FQDND_METRICS (an address:
# the uncached gateway serves Prometheus `/metrics` there, as a gateway in service does;
# default off), BARE=1 (also measure
# `benchmarks/src/bin/bare_forwarder.rs` in mode nocache: the same I/O as a forwarder with
# nothing else to do, about the most a forwarder with this I/O reaches here; its line
# `ratio bare/dnsdist qps: X.XX` comes before fqdnd's), PIN=1 (the servers on CPU 0, NSD and
# dnsperf on CPU 1, the bare forwarder with one thread; `taskset` must be there. dnsperf also
# saturates NSD directly on CPU 1: `ceiling nsd direct qps: N` is about the most any forwarder
# can answer in this layout, as CPU 1 does the same client and upstream work either way).
# Every process started here is stopped on exit; every dnsperf run is bounded by -l and an
# outer timeout. Traffic stays on loopback.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
RUN="${RUN:-/tmp/fqdnd-vs-peers}"
DURATION="${DURATION:-15}"
LAT_QPS="${LAT_QPS:-5000 20000}"
LAT_DURATION="${LAT_DURATION:-10}"
LAT_ROUNDS="${LAT_ROUNDS:-1}"
SAT_ROUNDS="${SAT_ROUNDS:-1}"
CLIENTS="${CLIENTS:-4}"
OUTSTANDING="${OUTSTANDING:-200}"
MODES="${MODES:-nocache cached}"
FQDND_BIN="${FQDND_BIN:-}"
FQDND_THREADS="${FQDND_THREADS:-}"
FQDND_METRICS="${FQDND_METRICS:-}"
BARE="${BARE:-0}"
PIN="${PIN:-0}"
SRV=() GEN=() BARE_THREADS=2
if [[ $PIN == 1 ]]; then SRV=(taskset -c 0) GEN=(taskset -c 1) BARE_THREADS=1; fi
AUTH=5300 DNSDIST=5301 DNSDIST_CACHED=5302 FQDND=5305 FQDND_CACHED=5306 BARE_PORT=5307
DNSDIST_DOT=5311 DNSDIST_DOH=5312 FQDND_TLS=5314 FQDND_DOT=5315 FQDND_DOH=5316

log() { printf '[vs-peers] %s\n' "$*" >&2; }

need() {
  local missing=()
  command -v nsd >/dev/null || missing+=(nsd)
  command -v dnsdist >/dev/null || missing+=(dnsdist)
  command -v dnsperf >/dev/null || missing+=(dnsperf)
  command -v dig >/dev/null || missing+=(bind9-dnsutils)
  command -v h2load >/dev/null || missing+=(nghttp2-client)
  command -v kdig >/dev/null || missing+=(knot-dnsutils)
  command -v openssl >/dev/null || missing+=(openssl)
  # The build: etcd-client compiles etcd's protos (`protoc` and the well-known .proto files).
  command -v protoc >/dev/null || missing+=(protobuf-compiler)
  [ -e /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

need_perf() { # perf, for the scripts that measure on this set-up (proxy-costs.sh, profile.sh)
  command -v perf >/dev/null || {
    log "installing linux-perf"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null
  }
}

fqdnd_bin() { # tree -> the fqdnd to run: $FQDND_BIN, or the tree's release build
  if [[ -n ${FQDND_BIN:-} ]]; then
    echo "$FQDND_BIN"
    return
  fi
  log "building fqdnd (release)"
  (cd "$1" && cargo build --release --locked --quiet)
  echo "${CARGO_TARGET_DIR:-$1/target}/release/fqdnd"
}

start_one() { # server tree -> starts fqdnd's gateway, dnsdist or (`bare`) tree's bare forwarder on this
  # set-up, waits for it to answer, sends it every name once (so what follows measures the
  # steady state: every name learned); sets ONE_PID and ONE_PORT
  case $1 in
    fqdnd)
      local bin
      bin=$(fqdnd_bin "$2")
      "$bin" gateway --config "$RUN/fqdnd.yaml" 2>"$RUN/fqdnd.err" & PIDS+=($!)
      ONE_PID=$! ONE_PORT=$FQDND ;;
    dnsdist)
      dnsdist --supervised --disable-syslog -C "$RUN/dnsdist.conf" >"$RUN/dnsdist.out" 2>&1 & PIDS+=($!)
      ONE_PID=$! ONE_PORT=$DNSDIST ;;
    bare)
      (cd "$2" && cargo build --release --locked --quiet -p fqdnd-benchmarks --bin bare_forwarder)
      "$2/target/release/bare_forwarder" "127.0.0.1:$BARE_PORT" "127.0.0.1:$AUTH" "$BARE_THREADS" \
        2>"$RUN/bare.err" & PIDS+=($!)
      ONE_PID=$! ONE_PORT=$BARE_PORT ;;
    *) log "SERVER is fqdnd, bare or dnsdist, not $1"; return 2 ;;
  esac
  wait_port "$ONE_PORT"
  timeout 60 dnsperf -s 127.0.0.1 -p "$ONE_PORT" -d "$RUN/queries.txt" -n 1 -c 1 -q 100 >/dev/null 2>&1 || true
}

steal_since() { # the first line of /proc/stat taken before -> the host's steal time since
  # then (a VM's vCPU given to another guest), in per cent of the CPU time, or NA
  printf '%s\n%s\n' "$1" "$(head -1 /proc/stat)" | awk '
    NR == 1 { for (i = 2; i <= NF; i++) a[i] = $i }
    NR == 2 { for (i = 2; i <= NF; i++) t += $i - a[i]; st = $9 - a[9] }
    END { if (t > 0) printf "%.1f\n", 100 * st / t; else print "NA" }'
}

start_upstream() { # tree -> the scripts that measure on this set-up: sets BIN (the fqdnd to
  # run), builds the tree's bare forwarder, starts NSD and waits for it to answer
  BIN=$(fqdnd_bin "$1")
  (cd "$1" && cargo build --release --locked --quiet -p fqdnd-benchmarks --bin bare_forwarder)
  nsd -c "$RUN/nsd.conf" -d >"$RUN/nsd.out" 2>&1 & PIDS+=($!)
  wait_port "$AUTH"
}

PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.3
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

setup() {
  rm -rf "$RUN" && mkdir -p "$RUN"
  {
    printf '$TTL 3600\n@ IN SOA ns.example.test. admin.example.test. 1 3600 600 86400 60\n@ IN NS ns.example.test.\nns IN A 127.0.0.1\n'
    awk 'BEGIN{for(i=0;i<10000;i++) printf "h%05d IN A 198.18.%d.%d\n", i, int(i/250), (i%250)+1}'
  } >"$RUN/example.test.zone"
  { echo example.test; awk 'BEGIN{for(i=0;i<1000;i++) printf "allow%04d.corp.test\n", i}'; } >"$RUN/allow.txt"
  awk 'BEGIN{for(i=0;i<500;i++) printf "blocked%04d.example.test\n", i; for(i=0;i<500;i++) printf "tracker%04d.ads.test\n", i}' >"$RUN/deny.txt"
  awk 'BEGIN{srand(7); for(i=0;i<10000;i++) printf "%f h%05d.example.test A\n", rand(), i}' | sort -n | cut -d' ' -f2- >"$RUN/queries.txt"

  cat >"$RUN/nsd.conf" <<NSD
server:
    ip-address: 127.0.0.1@$AUTH
    port: $AUTH
    do-ip6: no
    server-count: 1
    username: ""
    chroot: ""
    zonesdir: "$RUN"
    database: ""
    zonelistfile: "$RUN/nsd.zonelist"
    xfrdfile: "$RUN/nsd.xfrd.state"
    pidfile: "$RUN/nsd.pid"
    logfile: "$RUN/nsd.log"
    verbosity: 0
remote-control:
    control-enable: no
zone:
    name: "example.test"
    zonefile: "$RUN/example.test.zone"
NSD

  for cached in 0 1; do
    local port=$DNSDIST conf="$RUN/dnsdist.conf"
    if ((cached)); then port=$DNSDIST_CACHED conf="$RUN/dnsdist-cached.conf"; fi
    cat >"$conf" <<DD
setACL({"127.0.0.0/8"})
setLocal("127.0.0.1:$port", {reusePort=true})
addLocal("127.0.0.1:$port", {reusePort=true})
newServer({address="127.0.0.1:$AUTH", name="auth", sockets=2, checkName="example.test.", checkType="SOA", checkInterval=5})
setServerPolicy(firstAvailable)
allow = newSuffixMatchNode()
for line in io.lines("$RUN/allow.txt") do allow:add(line) end
deny = newSuffixMatchNode()
for line in io.lines("$RUN/deny.txt") do deny:add(line) end
addAction(SuffixMatchNodeRule(deny, true), RCodeAction(DNSRCode.REFUSED))
addAction(NotRule(SuffixMatchNodeRule(allow, true)), RCodeAction(DNSRCode.REFUSED))
DD
    if ((cached)); then
      printf 'pc = newPacketCache(100000, {maxTTL=86400, minTTL=0, temporaryFailureTTL=60, staleTTL=60})\ngetPool(""):setCache(pc)\n' >>"$conf"
    fi
  done

  for cached in 0 1; do
    local port=$FQDND file="$RUN/fqdnd.yaml" admin="$RUN/fqdnd.sock" cache="" metrics=""
    if [[ -n $FQDND_METRICS ]]; then metrics="  metrics: $FQDND_METRICS"; fi
    if ((cached)); then
      port=$FQDND_CACHED file="$RUN/fqdnd-cached.yaml" admin="$RUN/fqdnd-cached.sock"
      cache="  cache: {enabled: true, size: 100000}" metrics=""
    fi
    {
      cat <<GW
apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: ["127.0.0.1:$port"]
  upstreams: ["127.0.0.1:$AUTH"]
  adminSocket: $admin
$cache
$metrics
  lists:
    deny: [$RUN/deny.txt]
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: bench}
spec: {id: 1, addresses: ["127.0.0.0/8"], labels: {app: bench}}
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: bench}
spec:
  endpointSelector: {matchLabels: {app: bench}}
  egress:
  - toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules:
        dns:
GW
      while read -r d; do printf '        - matchName: "%s"\n        - matchPattern: "**.%s"\n' "$d" "$d"; done <"$RUN/allow.txt"
      cat <<GW
  - toFQDNs: [{matchPattern: "*.example.test"}]
    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
GW
      if [[ -n $FQDND_THREADS ]]; then
        printf -- '---\napiVersion: fqdnd.io/v1\nkind: Settings\nspec:\n  dns: {threads: %s}\n' "$FQDND_THREADS"
      fi
    } >"$file"
  done

  # DoT/DoH: a test certificate, dnsdist's TLS frontends and a gateway with `tls`, the same
  # rules and upstream as above; the 10k questions as DoH GET URIs for h2load.
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=bench.test -addext subjectAltName=DNS:bench.test,IP:127.0.0.1 \
    -keyout "$RUN/tls.key" -out "$RUN/tls.pem" 2>/dev/null
  chmod 600 "$RUN/tls.key"
  sed -e "s/^setLocal(.*/setLocal(\"127.0.0.1:5310\")/" -e '/^addLocal(/d' "$RUN/dnsdist.conf" >"$RUN/dnsdist-tls.conf"
  cat >>"$RUN/dnsdist-tls.conf" <<DD
addTLSLocal("127.0.0.1:$DNSDIST_DOT", "$RUN/tls.pem", "$RUN/tls.key", {reusePort=true})
addDOHLocal("127.0.0.1:$DNSDIST_DOH", "$RUN/tls.pem", "$RUN/tls.key", "/dns-query", {reusePort=true})
DD
  # The DNS rule allows the DoT and DoH services too (TCP 853 and 443 for `toPorts`); the
  # uncached gateway's `metrics:` line is left out (one process serves that address).
  sed -e "s/127.0.0.1:$FQDND\"/127.0.0.1:$FQDND_TLS\"/" -e "s|fqdnd.sock|fqdnd-tls.sock|" -e '/^  metrics: /d' \
    -e 's/ports: \[{port: "53", protocol: ANY}\]/ports: [{port: "53", protocol: ANY}, {port: "853", protocol: TCP}, {port: "443", protocol: TCP}]/' \
    "$RUN/fqdnd.yaml" |
    awk -v tls="  tls: {certificate: $RUN/tls.pem, key: $RUN/tls.key, dot: [\"127.0.0.1:$FQDND_DOT\"], doh: [\"127.0.0.1:$FQDND_DOH\"]}" \
      '{print} /^  adminSocket:/ {print tls}' >"$RUN/fqdnd-tls.yaml"
  python3 - "$RUN/queries.txt" "$RUN" "$DNSDIST_DOH" "$FQDND_DOH" <<'PY'
import base64, struct, sys
names = [l.split()[0] for l in open(sys.argv[1]) if l.strip()]
def query(name):
    msg = struct.pack(">HHHHHH", 0, 0x0100, 1, 0, 0, 0)
    for label in name.rstrip(".").split("."):
        msg += bytes([len(label)]) + label.encode()
    return base64.urlsafe_b64encode(msg + b"\0" + struct.pack(">HH", 1, 1)).rstrip(b"=").decode()
for port in sys.argv[3:]:
    with open(f"{sys.argv[2]}/uris-{port}.txt", "w") as f:
        for n in names:
            f.write(f"https://127.0.0.1:{port}/dns-query?dns={query(n)}\n")
PY
}

field() { awk -F': *' -v k="$1" '$0 ~ k {print $2; exit}' "$2"; }

cpu_ticks() { # pid -> utime+stime of the whole process (every thread), in clock ticks
  awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0
}

saturate() { # name port pid -> "qps cpu_us_per_query cpu_ticks answered" (DoT: dnsperf -m dot;
  # DoH: h2load)
  local out="$RUN/sat-$1.txt" t0 t1 qps done
  t0=$(cpu_ticks "$3")
  case $1 in
    *-doh)
      timeout $((DURATION + 30)) "${GEN[@]}" h2load -i "$RUN/uris-$2.txt" -D "$DURATION" -c "$CLIENTS" -m $((OUTSTANDING / CLIENTS)) -t 1 >"$out" 2>&1 || true
      t1=$(cpu_ticks "$3")
      qps=$(awk '/^finished in/ {gsub(",", "", $4); printf "%.0f", $4}' "$out")
      done=$(awk '/^status codes:/ {print $3}' "$out")
      ;;
    *)
      local mode=()
      [[ $1 == *-dot ]] && mode=(-m dot)
      timeout $((DURATION + 30)) "${GEN[@]}" dnsperf "${mode[@]}" -s 127.0.0.1 -p "$2" -d "$RUN/queries.txt" -l "$DURATION" -c "$CLIENTS" -q "$OUTSTANDING" -t 2 >"$out" 2>&1 || true
      t1=$(cpu_ticks "$3")
      qps=$(field 'Queries per second' "$out" | awk '{printf "%.0f", $1}')
      done=$(field 'Queries completed' "$out" | awk '{print $1}')
      ;;
  esac
  awk -v q="${qps:-0}" -v n="${done:-0}" -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" \
    'BEGIN{ if (n>0) printf "%s %.1f %d %d\n", q, t * 1e6 / hz / n, t, n; else printf "%s NA %d 0\n", q, t }'
}

fixed_rate() { # name port rate seconds pid -> appends dnsperf's per-query lines to
  # lat-NAME-RATE.txt, and "cpu_ticks completed" of the run to cpu-NAME-RATE.txt
  local out="$RUN/lat-run.txt" t0 t1
  t0=$(cpu_ticks "$5")
  timeout $(($4 + 30)) "${GEN[@]}" dnsperf -s 127.0.0.1 -p "$2" -d "$RUN/queries.txt" -l "$4" -c "$CLIENTS" -q "$OUTSTANDING" -Q "$3" -t 2 -v >"$out" 2>&1 || true
  t1=$(cpu_ticks "$5")
  cat "$out" >>"$RUN/lat-$1-$3.txt"
  # This round's p99 alone: whether one round's slow spell decided the pooled p99.
  lat_quantiles "$out" | awk '{print $2}' >>"$RUN/p99r-$1-$3.txt"
  printf '%s %s\n' $((t1 - t0)) "$(field 'Queries completed' "$out" | awk '{print $1}')" >>"$RUN/cpu-$1-$3.txt"
}

fixed_cpu() { # name rate -> the server's CPU µs per answered query over its fixed-rate runs
  awk -v hz="$(getconf CLK_TCK)" '{t += $1; n += $2} END{ if (n>0) printf "%.1f\n", t * 1e6 / hz / n; else print "NA" }' "$RUN/cpu-$1-$2.txt" 2>/dev/null || echo NA
}

lat_quantiles() { # file of dnsperf -v output -> "p50 p99" in ms of its answered queries
  awk '$1==">" && $2!="T" {print $NF}' "$1" | sort -g | awk '{v[NR]=$1} END{ if(NR==0){print "NA NA"; exit}
    i50=int(NR*0.50); i99=int(NR*0.99); if(i50<1)i50=1; if(i99<1)i99=1; printf "%.3f %.3f\n", v[i50]*1000, v[i99]*1000 }'
}

percentiles() { # name rate -> "p50 p99" in ms over every fixed-rate run of that server and rate
  lat_quantiles "$RUN/lat-$1-$2.txt"
}

wait_port() { # port
  for _ in $(seq 100); do
    dig +time=1 +tries=1 -p "$1" @127.0.0.1 h00001.example.test A >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  log "nothing answers on $1"; return 1
}

main() {
  need
  local bin
  bin=$(fqdnd_bin "$ROOT")
  local bare="$ROOT/target/release/bare_forwarder"
  if [[ $BARE == 1 ]]; then
    (cd "$ROOT" && cargo build --release --locked --quiet -p fqdnd-benchmarks --bin bare_forwarder)
  fi
  setup
  # The host's steal time over the run, builds excluded (a VM's vCPU given to another guest):
  # with more than a few per cent, every server stalls for milliseconds at a time and p99 is
  # the host's.
  local stat0
  stat0=$(head -1 /proc/stat)
  "${GEN[@]}" nsd -c "$RUN/nsd.conf" -d >"$RUN/nsd.out" 2>&1 & PIDS+=($!)
  wait_port $AUTH
  declare -A PID PORT
  local mode s
  local tls_started=0
  for mode in $MODES; do
    if [[ $mode == dot || $mode == doh ]]; then
      if ((!tls_started)); then
        tls_started=1
        "${SRV[@]}" dnsdist --supervised --disable-syslog -C "$RUN/dnsdist-tls.conf" >"$RUN/dnsdist-tls.out" 2>&1 & PIDS+=($!)
        PID[dnsdist-tls]=$!
        "${SRV[@]}" "$bin" gateway --config "$RUN/fqdnd-tls.yaml" 2>"$RUN/fqdnd-tls.err" & PIDS+=($!)
        PID[fqdnd-tls]=$!
      fi
      PID[dnsdist-$mode]=${PID[dnsdist-tls]} PID[fqdnd-$mode]=${PID[fqdnd-tls]}
      if [[ $mode == dot ]]; then PORT[dnsdist-dot]=$DNSDIST_DOT PORT[fqdnd-dot]=$FQDND_DOT; else PORT[dnsdist-doh]=$DNSDIST_DOH PORT[fqdnd-doh]=$FQDND_DOH; fi
    elif [[ $mode == cached ]]; then
      "${SRV[@]}" dnsdist --supervised --disable-syslog -C "$RUN/dnsdist-cached.conf" >"$RUN/dnsdist-cached.out" 2>&1 & PIDS+=($!)
      PID[dnsdist-cached]=$! PORT[dnsdist-cached]=$DNSDIST_CACHED
      "${SRV[@]}" "$bin" gateway --config "$RUN/fqdnd-cached.yaml" 2>"$RUN/fqdnd-cached.err" & PIDS+=($!)
      PID[fqdnd-cached]=$! PORT[fqdnd-cached]=$FQDND_CACHED
    else
      "${SRV[@]}" dnsdist --supervised --disable-syslog -C "$RUN/dnsdist.conf" >"$RUN/dnsdist.out" 2>&1 & PIDS+=($!)
      PID[dnsdist]=$! PORT[dnsdist]=$DNSDIST
      "${SRV[@]}" "$bin" gateway --config "$RUN/fqdnd.yaml" 2>"$RUN/fqdnd.err" & PIDS+=($!)
      PID[fqdnd]=$! PORT[fqdnd]=$FQDND
      if [[ $BARE == 1 ]]; then
        "${SRV[@]}" "$bare" "127.0.0.1:$BARE_PORT" "127.0.0.1:$AUTH" "$BARE_THREADS" 2>"$RUN/bare.err" & PIDS+=($!)
        PID[bare]=$! PORT[bare]=$BARE_PORT
      fi
    fi
  done
  local servers=()
  for mode in $MODES; do
    case $mode in
      cached) servers+=(dnsdist-cached fqdnd-cached) ;;
      dot | doh) servers+=(dnsdist-$mode fqdnd-$mode) ;;
      *) servers+=(dnsdist fqdnd) ;;
    esac
    if [[ $mode == nocache && $BARE == 1 ]]; then servers+=(bare); fi
  done
  local plain=()
  for s in "${servers[@]}"; do
    case $s in *-dot | *-doh) ;; *) plain+=("$s") ;; esac
  done
  if ((tls_started)); then
    # The TLS servers' plain listeners answer the readiness probe and take the warm-up.
    PORT[dnsdist-tls]=5310 PORT[fqdnd-tls]=$FQDND_TLS
    plain+=(dnsdist-tls fqdnd-tls)
  fi
  for s in "${plain[@]}"; do wait_port "${PORT[$s]}"; done
  for s in "${servers[@]}"; do
    # Each encrypted server must answer an allowed name with its address before it is measured.
    local how=()
    case $s in *-dot) how=(+tls) ;; *-doh) how=(+https=/dns-query) ;; *) continue ;; esac
    local got
    got=$(kdig -p "${PORT[$s]}" @127.0.0.1 "${how[@]}" +tls-ca="$RUN/tls.pem" +tls-hostname=bench.test +time=5 +retry=2 +short h00001.example.test A 2>&1 || true)
    if [[ $got != *198.18.0.2* ]]; then log "$s does not answer h00001.example.test: $got"; return 1; fi
  done
  for s in "${plain[@]}"; do
    # Warm-up: every name once (the engine knows every name; the caches hold every answer).
    log "warm-up: every name once through $s"
    timeout 60 dnsperf -s 127.0.0.1 -p "${PORT[$s]}" -d "$RUN/queries.txt" -n 1 -c 1 -q 100 >/dev/null 2>&1 || true
  done

  declare -A QPS CPU P50_5 P99_5 P50_20 P99_20 CPU_20
  local direct=""
  if [[ $PIN == 1 ]]; then
    log "nsd direct: saturation ${DURATION}s"
    read -r direct _ < <(saturate nsd-direct "$AUTH" "${PIDS[0]}")
  fi
  # Saturation: SAT_ROUNDS rounds, each server in turn (a slow spell of the shared machine then
  # falls on every server alike); per server the mean QPS and the CPU per query pooled.
  local round
  for s in "${servers[@]}"; do rm -f "$RUN/sat-rounds-$s.txt"; done
  for ((round = 1; round <= SAT_ROUNDS; round++)); do
    for s in "${servers[@]}"; do
      log "$s: saturation ${DURATION}s (round $round of $SAT_ROUNDS)"
      saturate "$s" "${PORT[$s]}" "${PID[$s]}" >>"$RUN/sat-rounds-$s.txt"
    done
  done
  for s in "${servers[@]}"; do
    read -r QPS[$s] CPU[$s] < <(awk -v hz="$(getconf CLK_TCK)" \
      '{ q += $1; t += $3; n += $4 } END{ printf "%.0f ", q / NR; if (n > 0) printf "%.1f\n", t * 1e6 / hz / n; else print "NA" }' \
      "$RUN/sat-rounds-$s.txt")
  done
  # Fixed rates: LAT_ROUNDS rounds, each server in turn, so that a noisy spell of the shared
  # machine falls on every server alike; each server's latencies are pooled over its rounds.
  local round_s=$((LAT_DURATION / LAT_ROUNDS))
  ((round_s >= 1)) || round_s=1
  for rate in $LAT_QPS; do
    for s in "${servers[@]}"; do rm -f "$RUN/lat-$s-$rate.txt" "$RUN/cpu-$s-$rate.txt" "$RUN/p99r-$s-$rate.txt"; done
    for ((round = 1; round <= LAT_ROUNDS; round++)); do
      for s in "${servers[@]}"; do
        [[ $s == *-dot || $s == *-doh ]] && continue
        log "$s: ${rate} qps for ${round_s}s (round $round of $LAT_ROUNDS)"
        fixed_rate "$s" "${PORT[$s]}" "$rate" "$round_s" "${PID[$s]}"
      done
    done
    for s in "${servers[@]}"; do
      [[ $s == *-dot || $s == *-doh ]] && continue
      read -r p50 p99 < <(percentiles "$s" "$rate")
      if [[ $rate == 5000 ]]; then P50_5[$s]=$p50; P99_5[$s]=$p99; else P50_20[$s]=$p50; P99_20[$s]=$p99; CPU_20[$s]=$(fixed_cpu "$s" "$rate"); fi
    done
  done
  for s in fqdnd fqdnd-cached; do
    [[ -n ${PID[$s]:-} ]] || continue
    local sock="$RUN/$s.sock"
    "$bin" status --admin-socket "$sock" >"$RUN/$s-status.txt" 2>&1 || true
  done
  printf '\n%-15s %10s %10s %18s %18s %14s\n' server qps "cpu us/q" "p50/p99 ms @5k" "p50/p99 ms @20k" "cpu us/q @20k"
  for s in "${servers[@]}"; do
    printf '%-15s %10s %10s %18s %18s %14s\n' "$s" "${QPS[$s]:-NA}" "${CPU[$s]:-NA}" "${P50_5[$s]:-NA}/${P99_5[$s]:-NA}" "${P50_20[$s]:-NA}/${P99_20[$s]:-NA}" "${CPU_20[$s]:-NA}"
  done
  local steal
  steal=$(steal_since "$stat0")
  [[ $steal == NA ]] || printf 'host steal during the run: %s %% of the CPU time (/proc/stat)\n' "$steal"
  for s in fqdnd fqdnd-cached; do
    [[ -f "$RUN/$s-status.txt" ]] || continue
    grep -E 'queries:|identities:|dns cache:|answer cache:' "$RUN/$s-status.txt" | sed "s/^/$s /" || true
  done
  ratio() { awk -v a="${QPS[$2]:-0}" -v b="${QPS[$3]:-0}" -v l="$1" 'BEGIN{ if (b>0) printf "%s: %.2f\n", l, a/b; else printf "%s: NA\n", l }'; }
  [[ -n $direct ]] && printf 'ceiling nsd direct qps: %s\n' "$direct"
  [[ -n ${QPS[bare]:-} ]] && ratio "ratio bare/dnsdist qps" bare dnsdist
  [[ -n ${QPS[fqdnd-cached]:-} ]] && ratio "ratio fqdnd/dnsdist cached qps" fqdnd-cached dnsdist-cached
  [[ -n ${QPS[fqdnd-dot]:-} ]] && ratio "ratio fqdnd/dnsdist dot qps" fqdnd-dot dnsdist-dot
  [[ -n ${QPS[fqdnd-doh]:-} ]] && ratio "ratio fqdnd/dnsdist doh qps" fqdnd-doh dnsdist-doh
  [[ -n ${QPS[fqdnd]:-} ]] && ratio "ratio fqdnd/dnsdist qps" fqdnd dnsdist
  # CPU per answered query against the bare forwarder (issue 39's figure) and against dnsdist.
  cpu_ratio() { awk -v a="${CPU[$2]:-0}" -v b="${CPU[$3]:-0}" -v l="$1" 'BEGIN{ if (a>0 && b>0) printf "%s: %.2f\n", l, a/b; else printf "%s: NA\n", l }'; }
  [[ -n ${CPU[bare]:-} ]] && cpu_ratio "ratio fqdnd/bare cpu per query" fqdnd bare
  if [[ -n ${CPU_20[bare]:-} ]]; then
    CPU[fqdnd-20k]=${CPU_20[fqdnd]} CPU[bare-20k]=${CPU_20[bare]}
    cpu_ratio "ratio fqdnd/bare cpu per query at 20000 qps" fqdnd-20k bare-20k
  fi
  # The pooled p99 above is decided by the rounds with the host's slow spells; each round's
  # own p99, and in how many rounds fqdnd's was at or below dnsdist's round just before it.
  for rate in $LAT_QPS; do
    for s in "${servers[@]}"; do
      [[ -f "$RUN/p99r-$s-$rate.txt" ]] || continue
      printf 'p99 by round at %s qps, ms, %s: %s\n' "$rate" "$s" "$(paste -sd' ' "$RUN/p99r-$s-$rate.txt")"
    done
    if [[ -f "$RUN/p99r-fqdnd-$rate.txt" && -f "$RUN/p99r-dnsdist-$rate.txt" ]]; then
      paste "$RUN/p99r-fqdnd-$rate.txt" "$RUN/p99r-dnsdist-$rate.txt" | awk -v r="$rate" \
        '$1 != "NA" && $2 != "NA" { n++; if ($1 + 0 <= $2 + 0) k++ } END{ printf "rounds with fqdnd p99 at or below dnsdist at %s qps: %d of %d\n", r, k, n }'
    fi
  done
  [[ -n ${CPU[fqdnd-dot]:-} ]] && cpu_ratio "ratio fqdnd/dnsdist dot cpu per query" fqdnd-dot dnsdist-dot
  [[ -n ${CPU[fqdnd-doh]:-} ]] && cpu_ratio "ratio fqdnd/dnsdist doh cpu per query" fqdnd-doh dnsdist-doh
  return 0
}

main "$@"
