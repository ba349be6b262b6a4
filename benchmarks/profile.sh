#!/usr/bin/env bash
# profile.sh — where fqdnd's gateway (or, with SERVER=bare, the bare forwarder) spends its
# CPU, on vs-peers.sh's set-up (same NSD upstream, same 2k-suffix policy, full FQDN engine):
# dnsperf saturates it (or holds RATE queries/s) while `perf record` samples it with call
# stacks for SECONDS_REC; then the split of its
# samples by object (kernel, fqdnd, libc, vDSO), its user-space functions above 0.3 %, and the
# share of its samples on the instruction right after a locked one (`lock …`, `xchg`: each
# waits for the CPU's pending stores, so its cost lands there), per function above 0.05 %.
# Two builds profiled one after the other compare on these shares where an alternated
# `proxy-ab.sh` cannot see a change smaller than the host's spread.
#
#   benchmarks/profile.sh
#   FQDND_BIN=/tmp/fqdnd-old benchmarks/profile.sh; FQDND_BIN=target/release/fqdnd benchmarks/profile.sh
#   SERVER=bare benchmarks/profile.sh     # the bare forwarder, as vs-peers.sh runs it, to compare
#
# Last, the kernel's samples where interrupts are enabled again (`_raw_spin_unlock_irqrestore`),
# by the function that enabled them: this VM has no PMU, so perf samples on a timer, and a
# sample that falls where interrupts are off (a wake-up under a wait queue's lock) lands there.
#
# Knobs (env): SERVER=fqdnd|bare, FQDND_BIN (default: build this tree's), RATE (queries/s; default: saturation),
# SECONDS_REC=4, FREQ=1999 (samples/s), RUN=/tmp/fqdnd-profile (perf.data is kept there).
# Needs `perf` (installed with linux-perf if missing).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROFILE_ROOT="$(cd "$HERE/.." && pwd)"
SECONDS_REC="${SECONDS_REC:-4}" FREQ="${FREQ:-1999}" RATE_P="${RATE:-}"
export RUN="${RUN:-/tmp/fqdnd-profile}"
# vs-peers.sh's functions (setup, need, need_perf, start_one), without running its
# main (which sets its own HERE and ROOT: this script's tree is in PROFILE_ROOT).
# shellcheck source=/dev/null
source <(sed 's/^main "\$@"$//' "$HERE/vs-peers.sh")
SERVER="${SERVER:-fqdnd}"
need
need_perf
setup
nsd -c "$RUN/nsd.conf" -d >"$RUN/nsd.out" 2>&1 & PIDS+=($!)
wait_port "$AUTH"
start_one "$SERVER" "$PROFILE_ROOT"
FQ=$ONE_PID PORT_P=$ONE_PORT
timeout $((SECONDS_REC + 40)) dnsperf -s 127.0.0.1 -p "$PORT_P" -d "$RUN/queries.txt" -l $((SECONDS_REC + 3)) \
  -c "$CLIENTS" -q "$OUTSTANDING" ${RATE_P:+-Q "$RATE_P"} -t 2 >"$RUN/dnsperf.txt" 2>&1 &
LOAD=$!
sleep 1
perf record -q -F "$FREQ" --call-graph dwarf,16384 -o "$RUN/perf.data" -p "$FQ" -- sleep "$SECONDS_REC" >/dev/null 2>&1
wait "$LOAD" || true
kill "$FQ" 2>/dev/null || true
echo "profile: $SERVER, $(awk '/Queries per second/ {print $4}' "$RUN/dnsperf.txt") qps; $RUN/perf.data"

report() { perf report -i "$RUN/perf.data" --no-children --stdio -g none "$@" 2>/dev/null | grep '%'; }
echo "profile: by object"
report --sort dso | head -6
echo "profile: user-space functions above 0.3 %"
report --sort sym | grep -F '[.]' | awk '$1+0 >= 0.3'
echo "profile: after a locked instruction"
report --sort sym | grep -F '[.]' | awk '$1+0 >= 0.1' | while read -r pct _ sym; do
  after=$(perf annotate -i "$RUN/perf.data" --stdio -s "$sym" 2>/dev/null |
    awk '/^ +[0-9]+\.[0-9]+ :/ { if (locked) sum += $1; locked = ($0 ~ /^ +[0-9.]+ : +[0-9a-f]+: +(lock |xchg)/) }
      END { print sum + 0 }')
  echo "${pct%\%} $after $sym"
done | awk '{ share = $1 * $2 / 100; total += share; sym = $0; sub(/^[^ ]+ [^ ]+ /, "", sym)
    if (share >= 0.05) printf "  %.2f %%  %s\n", share, sym }
  END { printf "profile: after a locked instruction, in all: %.2f %% of the samples\n", total }'
echo "profile: where interrupts are enabled again (_raw_spin_unlock_irqrestore), by caller"
perf report -i "$RUN/perf.data" --no-children --stdio --sort sym -S _raw_spin_unlock_irqrestore \
  -g caller,0.1,callee,function,percent --max-stack 2 2>/dev/null |
  grep -E '^ {12}\|--|^ {13}--' | sed -E 's/^ *\|?--([0-9.]+%)--/  \1  /'
