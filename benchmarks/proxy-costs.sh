#!/usr/bin/env bash
# proxy-costs.sh — what one query costs each server at a fixed rate, on vs-peers.sh's set-up
# (same NSD upstream, same 2k-suffix policy, fqdnd with the full FQDN engine): for fqdnd's
# gateway and dnsdist in turn, dnsperf at RATE qps for DURATION seconds while `perf stat -p`
# counts the server's system calls, context switches and CPU time over MEASURE seconds of it;
# then fqdnd's own view of the same run from its /metrics (the upstream leg: query sent →
# answer read; the hold; the observer). Where vs-peers.sh says *how much*, this says *where*.
#
#   benchmarks/proxy-costs.sh
#   RATE=20000 FQDND_BIN=target/release/fqdnd TOKIO_WORKER_THREADS=1 benchmarks/proxy-costs.sh
#
# Knobs (env): RATE=20000, DURATION=10, MEASURE=5, FQDND_BIN (default: build this tree's),
# RUN=/tmp/fqdnd-proxy-costs; the fqdnd gateway inherits the environment (TOKIO_WORKER_THREADS
# sets its runtime's worker threads). Needs `perf` (installed with linux-perf if missing).
# Lines: `<server> at <rate> qps: <n> queries, <s> syscalls/q, <c> context switches/q,
# <u> CPU us/q, dnsperf p50/p99 <a>/<b> ms`, then fqdnd's histograms' p50/p99.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
COSTS_ROOT="$(cd "$HERE/.." && pwd)"
RATE="${RATE:-20000}" DURATION_C="${DURATION:-10}" MEASURE="${MEASURE:-5}"
export RUN="${RUN:-/tmp/fqdnd-proxy-costs}"
METRICS=127.0.0.1:9968
# vs-peers.sh's functions (setup, need, need_perf, fqdnd_bin, wait_port, field), without
# running its main (which sets its own HERE and ROOT: this script's tree is in COSTS_ROOT).
# shellcheck source=/dev/null
source <(sed 's/^main "\$@"$//' "$HERE/vs-peers.sh")
need
need_perf
BIN=$(fqdnd_bin "$COSTS_ROOT")
setup
# fqdnd's histograms on a port of their own.
sed -i "s|^  adminSocket: \(.*fqdnd.sock\)$|  adminSocket: \1\n  metrics: $METRICS|" "$RUN/fqdnd.yaml"
grep -q "metrics: $METRICS" "$RUN/fqdnd.yaml"
nsd -c "$RUN/nsd.conf" -d >"$RUN/nsd.out" 2>&1 & PIDS+=($!)
wait_port "$AUTH"

measure() { # name port pid
  local out="$RUN/perf-$1.txt" lat="$RUN/lat-$1.txt"
  timeout 60 dnsperf -s 127.0.0.1 -p "$2" -d "$RUN/queries.txt" -n 1 -c 1 -q 100 >/dev/null 2>&1 || true
  timeout $((DURATION_C + 30)) dnsperf -s 127.0.0.1 -p "$2" -d "$RUN/queries.txt" -l "$DURATION_C" \
    -c "$CLIENTS" -q "$OUTSTANDING" -Q "$RATE" -t 2 -v >"$lat" 2>&1 &
  local load=$!
  sleep 1
  perf stat -x, -e raw_syscalls:sys_enter,context-switches,task-clock -p "$3" -o "$out" -- sleep "$MEASURE"
  wait "$load" || true
  local calls switches ms p
  calls=$(awk -F, '/raw_syscalls:sys_enter/{print $1}' "$out")
  switches=$(awk -F, '/context-switches/{print $1}' "$out")
  ms=$(awk -F, '/task-clock/{print $1}' "$out")
  p=$(awk '$1==">" && $2!="T" {print $NF}' "$lat" | sort -g | awk '{v[NR]=$1} END{ if(NR==0){print "NA/NA"; exit}
    printf "%.3f/%.3f", v[int(NR*0.50)]*1000, v[int(NR*0.99)]*1000 }')
  awk -v n="$1" -v r="$RATE" -v q=$((RATE * MEASURE)) -v c="$calls" -v s="$switches" -v ms="$ms" -v p="$p" \
    'BEGIN{ printf "%s at %d qps: %d queries, %.2f syscalls/q, %.2f context switches/q, %.1f CPU us/q, dnsperf p50/p99 %s ms\n",
      n, r, q, c / q, s / q, ms * 1000 / q, p }'
}

"$BIN" gateway --config "$RUN/fqdnd.yaml" 2>"$RUN/fqdnd.err" & PIDS+=($!)
FQ=$!
wait_port "$FQDND"
measure fqdnd "$FQDND" "$FQ"
curl -s "http://$METRICS/metrics" >"$RUN/metrics.txt" || true
for h in fqdnd_dns_upstream_latency_seconds fqdnd_dns_hold_seconds fqdnd_dns_observer_seconds; do
  awk -v h="$h" '$1 ~ "^"h"\\{quantile=\"0.5\"\\}" {p50=$2} $1 ~ "^"h"\\{quantile=\"0.99\"\\}" {p99=$2}
    END{ if (p50 != "") printf "fqdnd %s p50/p99: %.1f/%.1f us\n", h, p50 * 1e6, p99 * 1e6 }' "$RUN/metrics.txt"
done
kill "$FQ" 2>/dev/null || true

dnsdist --supervised --disable-syslog -C "$RUN/dnsdist.conf" >"$RUN/dnsdist.out" 2>&1 & PIDS+=($!)
DD=$!
wait_port "$DNSDIST"
measure dnsdist "$DNSDIST" "$DD"
