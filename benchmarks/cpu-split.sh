#!/usr/bin/env bash
# cpu-split.sh — where the CPU per query goes at saturation, fqdnd's gateway against the bare
# forwarder, on vs-peers.sh's set-up (same NSD upstream, same policy, full FQDN engine): user
# space against the kernel, from each process's utime and stime (/proc/PID/stat) over an
# unpaced `dnsperf -c 4 -q 200` of SECONDS_RUN, the two servers taken in turn for ROUNDS
# rounds, with the host's steal time over each (ticks of /proc/stat). Issue 39's gap is the
# difference in user space; the kernel's share follows the batch sizes.
#
#   benchmarks/cpu-split.sh
#   FQDND_BIN=/tmp/fqdnd-old ROUNDS=5 benchmarks/cpu-split.sh
#
# Knobs (env): FQDND_BIN (default: build this tree's), ROUNDS=3, SECONDS_RUN=4,
# RUN=/tmp/fqdnd-cpu-split. Every process started here is stopped on exit.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SPLIT_ROOT="$(cd "$HERE/.." && pwd)"
ROUNDS="${ROUNDS:-3}" SECONDS_RUN="${SECONDS_RUN:-4}"
export RUN="${RUN:-/tmp/fqdnd-cpu-split}"
# vs-peers.sh's functions (setup, need, start_upstream, wait_port), without running its main.
# shellcheck source=/dev/null
source <(sed 's/^main "\$@"$//' "$HERE/vs-peers.sh")
need
setup
start_upstream "$SPLIT_ROOT"
"$BIN" gateway --config "$RUN/fqdnd.yaml" 2>"$RUN/fqdnd.err" & PIDS+=($!)
declare -A PID PORT
PID[fqdnd]=$! PORT[fqdnd]=$FQDND
"$SPLIT_ROOT/target/release/bare_forwarder" "127.0.0.1:$BARE_PORT" "127.0.0.1:$AUTH" "$BARE_THREADS" \
  2>"$RUN/bare.err" & PIDS+=($!)
PID[bare]=$! PORT[bare]=$BARE_PORT
wait_port "$FQDND"
wait_port "$BARE_PORT"
# Every name once, so the rounds measure the steady state (every name learned).
for s in fqdnd bare; do
  timeout 60 dnsperf -s 127.0.0.1 -p "${PORT[$s]}" -d "$RUN/queries.txt" -n 1 -c 1 -q 100 >/dev/null 2>&1 || true
done
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
steal() { awk 'NR == 1 {print $9}' /proc/stat; }
printf '%-6s %5s %8s %14s %14s %13s %12s\n' server round qps "user us/q" "kernel us/q" "total us/q" "steal ticks"
for round in $(seq "$ROUNDS"); do
  for s in fqdnd bare; do
    read -r u0 k0 < <(ticks "${PID[$s]}")
    st0=$(steal)
    timeout $((SECONDS_RUN + 30)) dnsperf -s 127.0.0.1 -p "${PORT[$s]}" -d "$RUN/queries.txt" -l "$SECONDS_RUN" \
      -c 4 -q 200 -t 2 >"$RUN/dnsperf.txt" 2>&1 || true
    read -r u1 k1 < <(ticks "${PID[$s]}")
    st1=$(steal)
    q=$(awk '/Queries completed/ {print $3}' "$RUN/dnsperf.txt")
    awk -v s="$s" -v r="$round" -v u=$((u1 - u0)) -v k=$((k1 - k0)) -v q="${q:-0}" -v d="$SECONDS_RUN" \
      -v hz="$(getconf CLK_TCK)" -v st=$((st1 - st0)) 'BEGIN {
        if (q == 0) { printf "%-6s %5d no answers\n", s, r; exit }
        f = 1e6 / hz / q
        printf "%-6s %5d %8.0f %14.2f %14.2f %13.2f %12d\n", s, r, q / d, u * f, k * f, (u + k) * f, st }'
  done
done
