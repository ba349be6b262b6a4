#!/usr/bin/env bash
# make-trace.sh: a realistic DNS capture made by real software, for `fqdnd replay`.
#
# Everything runs inside a private network namespace that this script creates and always
# removes (trap on EXIT/INT/TERM), on loopback addresses of that namespace only:
#
#   127.53.0.1  nsd      the root zone "."            (fake root; delegates com net org io)
#   127.53.0.2  nsd      the TLDs com net org io      (delegate to knot and PowerDNS)
#   127.53.2.1  knot     example.com example.org edgekey.net cluster.local
#   127.53.3.1  pdns     amazonaws.com cloudfront.net akamaiedge.net, LUA records:
#                        *.s3.amazonaws.com          pickrandom over 256 IPs, TTL 5
#                        *.s3.us-west-2.amazonaws.com pickrandomsample(8 of 256)
#                        *.cloudfront.net            4 of 128, TTL 60 (56 IPs shared with S3)
#                        e1234.a.akamaiedge.net      2 of 32, A and AAAA, TTL 20
#   127.53.1.1  unbound  the resolver clients use (recursing from 127.53.1.2; cluster.local
#                        is a stub zone on knot, as CoreDNS would serve it)
#   clients, one source address each (one "pod" each):
#   127.53.10.1 dnsperf "app": UDP, no EDNS, 25 qps, Zipf-like mix of names
#   127.53.10.2 dnsperf "backup job": EDNS, mostly S3 buckets, 10 qps
#   127.53.10.3 dnsperf over TCP, 2 qps
#   127.0.0.1   glibc `getent ahosts` with a Kubernetes resolv.conf (search
#               default.svc.cluster.local svc.cluster.local cluster.local, ndots:5): A and
#               AAAA in parallel, the search-path NXDOMAINs
#   127.53.10.5 dig: over TCP, with and without EDNS, and a 40-record name (TC=1 over UDP,
#               then dig retries over TCP)
#
# tcpdump captures port 53 and IP fragments on the namespace's loopback. The client side
# (`host 127.53.1.1`) is then split into its own file: that is what a node's DNS proxy sees.
#
# Usage (as root): benchmarks/traces/make-trace.sh [--seconds N] [--out DIR] [--seed N]
#   --seconds N   how long the clients run (default 60; the whole run takes N + ~15 s)
#   --out DIR     where to write (default ./lab-trace)
#   --seed N      seed of the query mixes (default 1)
# Writes DIR/lab-full.pcap (every DNS packet, resolver↔servers included), DIR/lab-client.pcap
# (clients ↔ resolver only), DIR/logs/ (every daemon's output), DIR/summary.txt.
#
# Installs its Debian packages with apt-get if a command is missing: unbound nsd knot
# pdns-server pdns-backend-bind dnsperf bind9-dnsutils tcpdump iproute2.
#
# Facts this relies on (see shared/notes/traces.md §2): daemons are started with
# `ip netns exec NS cmd &` so `$!` is the daemon itself; tcpdump is stopped with SIGTERM and
# run with `-Z root`; unbound needs `do-not-query-localhost: no`; pdns needs an empty
# `security-poll-suffix` (else it asks the lab's own resolver about itself); nsd refuses an
# SOA rname of `hostmaster..` for the root; apt does not start the daemons here, so each runs
# in the foreground with its own configuration.

set -euo pipefail

SECONDS_TO_RUN=60
OUT=./lab-trace
SEED=1
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_TO_RUN="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "make-trace.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$SECONDS_TO_RUN" in ''|*[!0-9]*) echo "--seconds needs a whole number" >&2; exit 2 ;; esac
if [ "$SECONDS_TO_RUN" -lt 5 ] || [ "$SECONDS_TO_RUN" -gt 3600 ]; then
  echo "--seconds must be between 5 and 3600" >&2; exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "make-trace.sh: run as root (it creates a network namespace)" >&2; exit 1
fi

# --- packages -------------------------------------------------------------------------------
need=()
command -v unbound >/dev/null || need+=(unbound)
command -v nsd >/dev/null || need+=(nsd)
command -v knotd >/dev/null || need+=(knot)
command -v pdns_server >/dev/null || need+=(pdns-server)
[ -e /usr/lib/x86_64-linux-gnu/pdns/libbindbackend.so ] || ls /usr/lib/*/pdns/libbindbackend.so >/dev/null 2>&1 || need+=(pdns-backend-bind)
command -v dnsperf >/dev/null || need+=(dnsperf)
command -v dig >/dev/null || need+=(bind9-dnsutils)
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v ip >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  echo "make-trace.sh: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# --- workspace and cleanup ------------------------------------------------------------------
NS="fqdnd-lab-$$"
mkdir -p "$OUT/logs"
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d /tmp/fqdnd-lab.XXXXXX)"
PIDS=()
TCPDUMP_PID=""

cleanup() {
  local rc=$?
  set +e
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  [ -n "$TCPDUMP_PID" ] && kill -TERM "$TCPDUMP_PID" 2>/dev/null
  for pid in "${PIDS[@]}" $TCPDUMP_PID; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.3; done
    kill -KILL "$pid" 2>/dev/null
  done
  wait 2>/dev/null
  ip netns del "$NS" 2>/dev/null
  rm -rf "/etc/netns/$NS" "$WORK"
  exit "$rc"
}
trap cleanup EXIT INT TERM

ip netns add "$NS"
ip netns exec "$NS" ip link set lo up
in_ns() { ip netns exec "$NS" "$@"; }

# --- zones ----------------------------------------------------------------------------------
Z="$WORK/zones"
mkdir -p "$Z" "$WORK/knot" "$WORK/pdns" "$WORK/unbound" "$WORK/nsd"
soa() { # origin-independent SOA: soa PRIMARY MINIMUM
  echo "@ 3600 IN SOA $1 hostmaster.example.net. 1 3600 600 86400 $2"
}

{
  echo '$ORIGIN .'
  echo ". 86400 IN SOA a.root. hostmaster.root. 1 3600 600 86400 3600"
  echo ". 86400 IN NS a.root."
  echo "a.root. 86400 IN A 127.53.0.1"
  for tld in com net org io; do
    echo "$tld. 86400 IN NS ns.tld."
  done
  echo "ns.tld. 86400 IN A 127.53.0.2"
} > "$Z/root.zone"

for tld in com net org io; do
  {
    echo "\$ORIGIN $tld."
    soa ns.tld. 3600
    echo "@ 86400 IN NS ns.tld."
    case $tld in
      com)
        echo "example 86400 IN NS ns.knot.example.net."
        echo "amazonaws 86400 IN NS ns.pdns.example.net."
        ;;
      net)
        echo "example 86400 IN NS ns.knot.example.net."
        echo "ns.knot.example 86400 IN A 127.53.2.1"
        echo "ns.pdns.example 86400 IN A 127.53.3.1"
        echo "edgekey 86400 IN NS ns.knot.example.net."
        echo "akamaiedge 86400 IN NS ns.pdns.example.net."
        echo "cloudfront 86400 IN NS ns.pdns.example.net."
        ;;
      org) echo "example 86400 IN NS ns.knot.example.net." ;;
      io) ;;
    esac
  } > "$Z/$tld.zone"
done

# knot: example.com (1500 hosts, 50 names on 10 IPs, a 40-record name, the CNAME into the
# CDN), example.org, example.net (name server names), edgekey.net, cluster.local.
{
  echo '$ORIGIN example.com.'
  soa ns.knot.example.net. 30
  echo "@ 3600 IN NS ns.knot.example.net."
  echo "@ 300 IN A 192.0.2.10"
  echo "www 300 IN CNAME www.example.com.edgekey.net."
  echo "api 60 IN A 192.0.2.20"
  echo "api 60 IN AAAA 2001:db8::20"
  for i in $(seq 1 1500); do
    echo "host-$i 300 IN A 198.18.$((i / 250)).$((i % 250 + 1))"
  done
  for i in $(seq 1 50); do
    echo "shared-$i 120 IN A 198.19.0.$((i % 10 + 1))"
  done
  for i in $(seq 1 40); do
    echo "big 60 IN A 198.19.1.$i"
  done
} > "$Z/example.com.zone"
{
  echo '$ORIGIN example.org.'
  soa ns.knot.example.net. 30
  echo "@ 3600 IN NS ns.knot.example.net."
  echo "@ 600 IN A 192.0.2.30"
  echo "www 600 IN A 192.0.2.31"
  echo "mail 600 IN MX 10 mx.example.org."
  echo "mx 600 IN A 192.0.2.32"
} > "$Z/example.org.zone"
{
  echo '$ORIGIN example.net.'
  soa ns.knot.example.net. 30
  echo "@ 3600 IN NS ns.knot.example.net."
  echo "ns.knot 86400 IN A 127.53.2.1"
  echo "ns.pdns 86400 IN A 127.53.3.1"
} > "$Z/example.net.zone"
{
  echo '$ORIGIN edgekey.net.'
  soa ns.knot.example.net. 60
  echo "@ 3600 IN NS ns.knot.example.net."
  echo "www.example.com 60 IN CNAME e1234.a.akamaiedge.net."
} > "$Z/edgekey.net.zone"
{
  echo '$ORIGIN cluster.local.'
  soa ns.knot.example.net. 5
  echo "@ 30 IN NS ns.knot.example.net."
  echo "kubernetes.default.svc 5 IN A 10.96.0.1"
  echo "kube-dns.kube-system.svc 5 IN A 10.96.0.10"
  for s in api web cart payments search; do
    echo "$s.default.svc 5 IN A 10.96.1.$((RANDOM % 250 + 1))"
  done
} > "$Z/cluster.local.zone"

# PowerDNS: LUA records for the rotating cloud endpoints.
ipset() { # ipset PREFIX3 COUNT -> '{ "a", "b", ... }' over PREFIX3.1..COUNT
  local out="" i
  for i in $(seq 1 "$2"); do out="$out'$1.$i',"; done
  echo "{${out%,}}"
}
S3="$(ipset 52.216.0 200)"
S3="${S3%\}},'54.230.0.1','54.230.0.2','54.230.0.3','54.230.0.4','54.230.0.5','54.230.0.6','54.230.0.7','54.230.0.8'"
for i in $(seq 9 56); do S3="$S3,'54.230.0.$i'"; done
S3="$S3}"
S3W2="$(ipset 52.218.0 250)"
CF="$(ipset 54.230.0 128)"
AK4="$(ipset 23.32.0 32)"
AK6="{"; for i in $(seq 1 32); do AK6="$AK6'2600:1400::$i',"; done; AK6="${AK6%,}}"
{
  echo '$ORIGIN amazonaws.com.'
  soa ns.pdns.example.net. 60
  echo "@ 3600 IN NS ns.pdns.example.net."
  echo "s3 5 IN LUA A \"pickrandom($S3)\""
  echo "*.s3 5 IN LUA A \"pickrandom($S3)\""
  echo "*.s3.us-west-2 5 IN LUA A \"pickrandomsample(8, $S3W2)\""
} > "$Z/amazonaws.com.zone"
{
  echo '$ORIGIN cloudfront.net.'
  soa ns.pdns.example.net. 60
  echo "@ 3600 IN NS ns.pdns.example.net."
  echo "* 60 IN LUA A \"pickrandomsample(4, $CF)\""
} > "$Z/cloudfront.net.zone"
{
  echo '$ORIGIN akamaiedge.net.'
  soa ns.pdns.example.net. 60
  echo "@ 3600 IN NS ns.pdns.example.net."
  echo "e1234.a 20 IN LUA A \"pickrandomsample(2, $AK4)\""
  echo "e1234.a 20 IN LUA AAAA \"pickrandomsample(2, $AK6)\""
} > "$Z/akamaiedge.net.zone"

# --- daemon configurations ------------------------------------------------------------------
cat > "$WORK/nsd/nsd.conf" <<EOF
server:
  ip-address: 127.53.0.1
  ip-address: 127.53.0.2
  port: 53
  username: ""
  chroot: ""
  database: ""
  zonelistfile: "$WORK/nsd/zone.list"
  xfrdfile: "$WORK/nsd/xfrd.state"
  pidfile: "$WORK/nsd/nsd.pid"
  zonesdir: "$Z"
  verbosity: 1
remote-control:
  control-enable: no
zone:
  name: "."
  zonefile: "root.zone"
EOF
for tld in com net org io; do
  printf 'zone:\n  name: "%s"\n  zonefile: "%s.zone"\n' "$tld" "$tld" >> "$WORK/nsd/nsd.conf"
done

cat > "$WORK/knot/knot.conf" <<EOF
server:
  listen: 127.53.2.1@53
  rundir: "$WORK/knot"
  user: root:root
log:
  - target: stderr
    any: warning
database:
  storage: "$WORK/knot"
template:
  - id: default
    storage: "$Z"
    semantic-checks: off
    zonefile-sync: -1
    journal-content: none
zone:
  - domain: example.com
    file: example.com.zone
  - domain: example.org
    file: example.org.zone
  - domain: example.net
    file: example.net.zone
  - domain: edgekey.net
    file: edgekey.net.zone
  - domain: cluster.local
    file: cluster.local.zone
EOF

cat > "$WORK/pdns/named.conf" <<EOF
options { directory "$Z"; };
zone "amazonaws.com" { type master; file "$Z/amazonaws.com.zone"; };
zone "cloudfront.net" { type master; file "$Z/cloudfront.net.zone"; };
zone "akamaiedge.net" { type master; file "$Z/akamaiedge.net.zone"; };
EOF
cat > "$WORK/pdns/pdns.conf" <<EOF
launch=bind
bind-config=$WORK/pdns/named.conf
local-address=127.53.3.1
local-port=53
enable-lua-records=yes
security-poll-suffix=
socket-dir=$WORK/pdns
guardian=no
daemon=no
disable-syslog=yes
loglevel=4
EOF

cat > "$WORK/unbound/root.hints" <<EOF
.           3600000 IN NS a.root.
a.root.     3600000 IN A  127.53.0.1
EOF
cat > "$WORK/unbound/unbound.conf" <<EOF
server:
  interface: 127.53.1.1
  port: 53
  outgoing-interface: 127.53.1.2
  do-not-query-localhost: no
  access-control: 127.0.0.0/8 allow
  root-hints: "$WORK/unbound/root.hints"
  module-config: "iterator"
  username: ""
  chroot: ""
  directory: "$WORK/unbound"
  pidfile: "$WORK/unbound/unbound.pid"
  do-daemonize: no
  use-syslog: no
  logfile: ""
  verbosity: 1
  num-threads: 1
  harden-referral-path: no
  qname-minimisation: no
  minimal-responses: yes
  cache-min-ttl: 0
  local-zone: "local." nodefault
stub-zone:
  name: "cluster.local"
  stub-addr: 127.53.2.1
EOF

# --- start the hierarchy --------------------------------------------------------------------
LOGS="$OUT/logs"
in_ns nsd -d -c "$WORK/nsd/nsd.conf" > "$LOGS/nsd.log" 2>&1 &
PIDS+=($!)
in_ns knotd -c "$WORK/knot/knot.conf" > "$LOGS/knot.log" 2>&1 &
PIDS+=($!)
in_ns pdns_server --config-dir="$WORK/pdns" > "$LOGS/pdns.log" 2>&1 &
PIDS+=($!)
in_ns unbound -d -c "$WORK/unbound/unbound.conf" > "$LOGS/unbound.log" 2>&1 &
PIDS+=($!)

ready() { # ready SERVER NAME: wait until SERVER answers NAME
  local i
  for i in $(seq 1 50); do
    if in_ns dig +time=1 +tries=1 +short @"$1" "$2" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "make-trace.sh: $1 does not answer $2; see $LOGS" >&2
  return 1
}
ready 127.53.0.1 .
ready 127.53.2.1 example.com
ready 127.53.3.1 bucket-1.s3.amazonaws.com
ready 127.53.1.1 www.example.com

# --- capture --------------------------------------------------------------------------------
FULL="$OUT/lab-full.pcap"
in_ns tcpdump -i lo -s 0 -U -Z root -w "$FULL" 'port 53 or (ip[6:2] & 0x3fff != 0)' \
  > "$LOGS/tcpdump.log" 2>&1 &
TCPDUMP_PID=$!
sleep 1

# --- clients --------------------------------------------------------------------------------
RANDOM=$SEED
# Zipf-like: name k of N appears about N/k times.
zipf() { # zipf FILE LINES: LINES query lines drawn from the app's name list
  local names=() k
  names+=("www.example.com A" "api.example.com A" "api.example.com AAAA" "example.com A")
  names+=("www.example.org A" "d111abcdef8.cloudfront.net A" "bucket-1.s3.amazonaws.com A")
  for k in $(seq 1 60); do names+=("host-$((k * 23 % 1500 + 1)).example.com A"); done
  for k in $(seq 1 20); do names+=("shared-$k.example.com A"); done
  names+=("nosuch.example.com A" "photos.s3.us-west-2.amazonaws.com A")
  local n=${#names[@]} i r
  : > "$1"
  for i in $(seq 1 "$2"); do
    r=$(( RANDOM % n + 1 )); r=$(( (RANDOM % r) ))
    echo "${names[$r]}" >> "$1"
  done
  for k in $(seq 1 1500); do [ $((k % 7)) -eq 0 ] && echo "host-$k.example.com A" >> "$1"; done
  return 0
}
zipf "$WORK/app.txt" 3000
: > "$WORK/backup.txt"
for i in $(seq 1 400); do
  echo "bucket-$((RANDOM % 40 + 1)).s3.amazonaws.com A" >> "$WORK/backup.txt"
  [ $((i % 5)) -eq 0 ] && echo "logs-$((RANDOM % 10)).s3.us-west-2.amazonaws.com A" >> "$WORK/backup.txt"
  [ $((i % 9)) -eq 0 ] && echo "d$((RANDOM % 50))x.cloudfront.net A" >> "$WORK/backup.txt"
done
: > "$WORK/tcp.txt"
for i in $(seq 1 100); do echo "host-$((RANDOM % 1500 + 1)).example.com A" >> "$WORK/tcp.txt"; done
echo "big.example.com A" >> "$WORK/tcp.txt"

in_ns dnsperf -s 127.53.1.1 -a 127.53.10.1 -d "$WORK/app.txt" -l "$SECONDS_TO_RUN" -Q 25 -c 1 \
  > "$LOGS/dnsperf-app.log" 2>&1 &
PIDS+=($!)
in_ns dnsperf -s 127.53.1.1 -a 127.53.10.2 -e -d "$WORK/backup.txt" -l "$SECONDS_TO_RUN" -Q 10 -c 1 \
  > "$LOGS/dnsperf-backup.log" 2>&1 &
PIDS+=($!)
in_ns dnsperf -s 127.53.1.1 -a 127.53.10.3 -m tcp -d "$WORK/tcp.txt" -l "$SECONDS_TO_RUN" -Q 2 -c 1 \
  > "$LOGS/dnsperf-tcp.log" 2>&1 &
PIDS+=($!)

# glibc with a Kubernetes resolv.conf (ip netns exec bind-mounts /etc/netns/NS/resolv.conf).
mkdir -p "/etc/netns/$NS"
cat > "/etc/netns/$NS/resolv.conf" <<EOF
nameserver 127.53.1.1
search default.svc.cluster.local svc.cluster.local cluster.local
options ndots:5 timeout:1 attempts:2
EOF
GLIBC_NAMES=(kubernetes.default api web.default.svc.cluster.local www.example.com
  bucket-3.s3.amazonaws.com api.example.com host-17.example.com cart payments
  d222x.cloudfront.net www.example.org shared-3.example.com)

end=$(( $(date +%s) + SECONDS_TO_RUN ))
i=0
while [ "$(date +%s)" -lt "$end" ]; do
  name=${GLIBC_NAMES[$(( i % ${#GLIBC_NAMES[@]} ))]}
  in_ns getent ahosts "$name" > /dev/null 2>&1 || true
  case $(( i % 6 )) in
    0) in_ns dig +tcp +time=2 +tries=1 -b 127.53.10.5 @127.53.1.1 "host-$((i % 1500 + 1)).example.com" > /dev/null 2>&1 || true ;;
    1) in_ns dig +noedns +time=2 +tries=1 -b 127.53.10.5 @127.53.1.1 big.example.com > /dev/null 2>&1 || true ;;
    2) in_ns dig +time=2 +tries=1 -b 127.53.10.5 @127.53.1.1 www.example.com AAAA > /dev/null 2>&1 || true ;;
    *) ;;
  esac
  i=$((i + 1))
  sleep 0.5
done
# Let dnsperf finish its last queries.
for pid in "${PIDS[@]:4}"; do
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
done
sleep 1

# --- stop the capture and split the client side -----------------------------------------------
kill -TERM "$TCPDUMP_PID"
wait "$TCPDUMP_PID" 2>/dev/null || true
TCPDUMP_PID=""
tcpdump -Z root -r "$FULL" -w "$OUT/lab-client.pcap" 'host 127.53.1.1' 2>/dev/null

{
  echo "make-trace.sh: $SECONDS_TO_RUN s of clients, seed $SEED, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "versions: unbound $(unbound -V 2>/dev/null | sed -n 's/^Version //p'), nsd $(nsd -v 2>&1 | head -1 | awk '{print $NF}'), knot $(knotd -V 2>&1 | awk '{print $NF}'), pdns $(dpkg-query -W -f='${Version}' pdns-server 2>/dev/null), dnsperf $(dpkg-query -W -f='${Version}' dnsperf 2>/dev/null), tcpdump $(dpkg-query -W -f='${Version}' tcpdump 2>/dev/null)"
  for f in "$FULL" "$OUT/lab-client.pcap"; do
    echo "$(basename "$f"): $(stat -c %s "$f") bytes, $(tcpdump -r "$f" 2>/dev/null | wc -l) packets"
  done
  for l in app backup tcp; do
    grep -E "Queries (sent|completed|lost)" "$LOGS/dnsperf-$l.log" | sed "s/^/dnsperf-$l: /" || true
  done
} | tee "$OUT/summary.txt"
