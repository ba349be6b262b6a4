#!/usr/bin/env bash
# rate-timeline.sh — one server's cost per query second by second at a fixed rate, on
# vs-peers.sh's set-up (same NSD upstream, same policy, full FQDN engine): fqdnd's gateway or
# (SERVER=bare) the bare forwarder, held at RATE queries/s by dnsperf for SECONDS_RUN, and per
# second, summed over the server's threads from /proc/PID/task/*/schedstat: the CPU time it ran
# (`exec`), the time it waited on a run queue (`runq-wait`), both in ns per query, and how many
# times it was put on a CPU (`slices` per query). A `cpu us/q @20k` figure of vs-peers.sh
# (/proc over 2-s runs) is the mean of these seconds; this shows whether they agree.
#
#   benchmarks/rate-timeline.sh
#   SERVER=bare benchmarks/rate-timeline.sh
#   FQDND_BIN=/tmp/fqdnd-old RATE=20000 SECONDS_RUN=15 benchmarks/rate-timeline.sh
#
# With WAKES=1, also the tasks the server woke over 2 s in the middle of the run (`perf record -e
# sched:sched_waking`), by the woken task's name and whether it was put on the waker's CPU or
# the other: a wake onto another CPU that sleeps costs an inter-processor interrupt, on a VM an
# exit to the host.
#
# Knobs (env): SERVER=fqdnd|bare, FQDND_BIN (default: build this tree's), RATE=20000,
# SECONDS_RUN=12, VERBOSE=1 (dnsperf -v, as vs-peers.sh's fixed-rate runs: a line per query,
# more work for the generator), WAKES=1, RUN=/tmp/fqdnd-rate-timeline. Every process started
# here is stopped on exit. WAKES needs `perf` (installed with linux-perf if missing).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TIMELINE_ROOT="$(cd "$HERE/.." && pwd)"
SERVER="${SERVER:-fqdnd}" RATE="${RATE:-20000}" SECONDS_RUN="${SECONDS_RUN:-12}"
export RUN="${RUN:-/tmp/fqdnd-rate-timeline}"
# vs-peers.sh's functions (setup, need, need_perf, start_one), without running its main.
# shellcheck source=/dev/null
source <(sed 's/^main "\$@"$//' "$HERE/vs-peers.sh")
need
[[ ${WAKES:-} == 1 ]] && need_perf
setup
nsd -c "$RUN/nsd.conf" -d >"$RUN/nsd.out" 2>&1 & PIDS+=($!)
wait_port "$AUTH"
start_one "$SERVER" "$TIMELINE_ROOT"
PID=$ONE_PID PORT_S=$ONE_PORT
verbose=()
[[ ${VERBOSE:-} == 1 ]] && verbose=(-v)
timeout $((SECONDS_RUN + 30)) dnsperf -s 127.0.0.1 -p "$PORT_S" -d "$RUN/queries.txt" -l "$SECONDS_RUN" \
  -c 4 -q 200 -Q "$RATE" -t 2 "${verbose[@]}" >"$RUN/dnsperf.txt" 2>&1 &
dp=$!
# Per thread: id, ns on a CPU, ns waiting on a run queue, slices (%.0f: the sums pass 2^31).
snapshot() {
  for t in "/proc/$PID/task/"*; do
    awk -v t="${t##*/}" '{printf "%s %.0f %.0f %.0f\n", t, $1, $2, $3}' "$t/schedstat" 2>/dev/null || true
  done
}
snapshot >"$RUN/before.txt"
printf '%-6s %12s %16s %12s\n' second "exec ns/q" "runq-wait ns/q" "slices/q"
for second in $(seq $((SECONDS_RUN - 1))); do
  sleep 1
  snapshot >"$RUN/after.txt"
  awk -v r="$RATE" -v s="$second" 'NR == FNR {e[$1] = $2; w[$1] = $3; n[$1] = $4; next}
    ($1 in e) {de += $2 - e[$1]; dw += $3 - w[$1]; dn += $4 - n[$1]}
    END {printf "%-6d %12.0f %16.0f %12.2f\n", s, de / r, dw / r, dn / r}' "$RUN/before.txt" "$RUN/after.txt"
  mv "$RUN/after.txt" "$RUN/before.txt"
done
wait "$dp" || true
log "$SERVER: $(field 'Queries completed' "$RUN/dnsperf.txt")"
[[ ${WAKES:-} == 1 ]] || exit 0
log "$SERVER: the tasks it wakes, over 2 s at $RATE queries/s"
timeout $((2 + 30)) dnsperf -s 127.0.0.1 -p "$PORT_S" -d "$RUN/queries.txt" -l 6 -c 4 -q 200 -Q "$RATE" -t 2 \
  "${verbose[@]}" >"$RUN/dnsperf.txt" 2>&1 &
dp=$!
sleep 2
snapshot >"$RUN/before.txt"
perf record -q -e sched:sched_waking -p "$PID" -o "$RUN/wakes.data" -- sleep 2 >/dev/null 2>&1
snapshot >"$RUN/after.txt"
wait "$dp" || true
awk -v r="$((RATE * 2))" 'NR == FNR {e[$1] = $2; n[$1] = $4; next} ($1 in e) {de += $2 - e[$1]; dn += $4 - n[$1]}
  END {printf "over these 2 s (under perf): exec %.0f ns/q, %.2f slices/q\n", de / r, dn / r}' "$RUN/before.txt" "$RUN/after.txt"
# A line: `comm pid/tid [cpu] sched:sched_waking: comm=WOKEN pid=… prio=… target_cpu=N`.
perf script -i "$RUN/wakes.data" -F cpu,trace 2>/dev/null | awk '
  match($0, /\[[0-9]+\]/) { cpu = substr($0, RSTART + 1, RLENGTH - 2) + 0 }
  match($0, /comm=[^ ]+/) { woken = substr($0, RSTART + 5, RLENGTH - 5) }
  match($0, /target_cpu=[0-9]+/) {
    target = substr($0, RSTART + 11, RLENGTH - 11) + 0
    n[woken, target == cpu ? "the waker'"'"'s CPU" : "another CPU"]++; all++
  }
  END {
    for (k in n) { split(k, f, SUBSEP); printf "woke %-16s onto %-16s %7d (%.0f %%)\n", f[1], f[2], n[k], 100 * n[k] / all }
  }' | sort
