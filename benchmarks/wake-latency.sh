#!/usr/bin/env bash
# wake-latency.sh — how the threads of each server, of NSD and of dnsperf are scheduled at a
# fixed rate, on vs-peers.sh's set-up (same NSD upstream, same policy, full FQDN engine): for
# dnsdist, fqdnd's gateway and the bare forwarder in turn, dnsperf holds RATE queries/s while
# `perf sched record` traces every context switch for SECONDS_REC; then per task (threads of
# one name added up): runs per second, mean run and sleep, the mean delay from a wake to
# running and how many such delays passed 0.1 ms. On this 2-vCPU harness every server shares
# the machine with NSD and dnsperf, and where one server's threads run decides when the
# others get a CPU: that is part of each server's latency at a fixed rate (issue 39's p99).
#
#   benchmarks/wake-latency.sh
#   FQDND_BIN=target/release/fqdnd RATE=20000 SERVERS="fqdnd bare" benchmarks/wake-latency.sh
#
# Knobs (env): FQDND_BIN (default: build this tree's), RATE=20000, SECONDS_REC=4,
# SERVERS="dnsdist fqdnd bare", FQDND_THREADS (the gateway's `dns.threads`),
# RUN=/tmp/fqdnd-wake-latency (one perf.data per server is kept there).
# Needs `perf` (installed with linux-perf if missing). Every process started here is stopped
# on exit; each dnsperf run is bounded by -l and an outer timeout. Traffic stays on loopback.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WAKE_ROOT="$(cd "$HERE/.." && pwd)"
SECONDS_REC="${SECONDS_REC:-4}" RATE_W="${RATE:-20000}"
SERVERS_W="${SERVERS:-dnsdist fqdnd bare}"
export RUN="${RUN:-/tmp/fqdnd-wake-latency}"
# vs-peers.sh's functions (setup, need, need_perf, start_upstream, start_one, steal_since),
# without its main.
# shellcheck source=/dev/null
source <(sed 's/^main "\$@"$//' "$HERE/vs-peers.sh")
need
need_perf
setup
start_upstream "$WAKE_ROOT"
declare -A PORT
for s in $SERVERS_W; do
  # Started, and sent every name once (the engine knows every name: steady state).
  start_one "$s" "$WAKE_ROOT"
  PORT[$s]=$ONE_PORT
done
for s in $SERVERS_W; do
  timeout $((SECONDS_REC + 40)) dnsperf -s 127.0.0.1 -p "${PORT[$s]}" -d "$RUN/queries.txt" -l $((SECONDS_REC + 3)) \
    -c "$CLIENTS" -q "$OUTSTANDING" -Q "$RATE_W" -t 2 >"$RUN/dnsperf-$s.txt" 2>&1 &
  LOAD=$!
  sleep 1
  stat0=$(head -1 /proc/stat)
  perf sched record -q -o "$RUN/sched-$s.data" -- sleep "$SECONDS_REC" >/dev/null 2>&1
  # With more than a few per cent of steal, every wake waits for the host too.
  steal=$(steal_since "$stat0")
  wait "$LOAD" || true
  echo "wake-latency: $s at $(awk '/Queries per second/ {printf "%.0f", $4}' "$RUN/dnsperf-$s.txt") qps, host steal $steal %; $RUN/sched-$s.data"
  # timehist: time, CPU, task[tid/pid], then wait (sleep), sched delay and run time in ms;
  # a task's name may hold spaces ("nsd: server 1").
  perf sched timehist -i "$RUN/sched-$s.data" 2>/dev/null | awk -v secs="$SECONDS_REC" '
    NR > 3 && NF >= 6 && $NF ~ /^[0-9.]+$/ {
      t = ""; for (i = 3; i <= NF - 3; i++) t = t (i > 3 ? " " : "") $i
      sub(/\[[0-9\/]+\]$/, "", t)
      n[t]++; w[t] += $(NF - 2); d[t] += $(NF - 1); r[t] += $NF; if ($(NF - 1) > 0.1) late[t]++
    }
    END {
      for (k in n) if (n[k] >= 100 && k != "<idle>")
        printf "  %-18s %7.0f runs/s  run %6.1f us  sleep %6.1f us  wake to run %5.1f us  over 0.1 ms %5d  cpu %4.0f %%\n",
          k, n[k] / secs, 1000 * r[k] / n[k], 1000 * w[k] / n[k], 1000 * d[k] / n[k], late[k], 100 * r[k] / 1000 / secs
    }' | sort -k2 -n -r
done
