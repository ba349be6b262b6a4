#!/usr/bin/env bash
# proxy-ab.sh — two fqdnd builds side by side on vs-peers.sh's set-up (same NSD upstream, same
# 2k-suffix policy, full FQDN engine): each build's gateway in turn, alternated ROUNDS times,
# saturated by dnsperf for DURATION seconds (or held at RATE queries/s). Prints per run the QPS
# and the gateway's CPU µs per answered query (utime+stime from /proc: the figure to compare on
# a shared machine).
#
#   benchmarks/proxy-ab.sh BEFORE_BIN AFTER_BIN
#
# Knobs (env): ROUNDS=3, DURATION=8, MODES="nocache cached", RUN=/tmp/fqdnd-proxy-ab,
# RATE (queries/s: a fixed rate instead of saturation, so every run has the same load and the
# CPU per query compares the work done, not how well a busy machine let it batch), BARE=1
# (mode nocache: `benchmarks/src/bin/bare_forwarder.rs` too, as the third side `bare`, with
# BARE_THREADS=2 threads as in vs-peers.sh),
# BEFORE_THREADS / AFTER_THREADS (that side's `dns.threads`, through a Settings document added to
# its config: the same build twice compares two thread counts),
# BEFORE_METRICS / AFTER_METRICS (an address: that side's gateway serves Prometheus `/metrics`
# there, so the same build twice measures what the metrics cost),
# LATENCY=1 (with RATE: also each run's p50/p99 latency in ms, from dnsperf's per-query times,
# and how many rounds' p99 was lower after than before; take DURATION=2 and ROUNDS of 10 or
# more, as a 2-s run's p99 moves with the host's slow spells by more than builds differ).
# Last lines: `proxy-ab <mode> <before|after|bare>: median qps Q, median cpu us/q C` (with
# LATENCY=1 also `, median p99 ms P`, and `proxy-ab <mode>: p99 lower after in N of ROUNDS`).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
AB_ROOT="$(cd "$HERE/.." && pwd)"
[ $# -eq 2 ] || { echo "usage: $0 BEFORE_BIN AFTER_BIN" >&2; exit 2; }
BEFORE="$1" AFTER="$2"
ROUNDS="${ROUNDS:-3}" DURATION_AB="${DURATION:-8}" MODES_AB="${MODES:-nocache cached}"
RATE_AB="${RATE:-}" BARE_AB="${BARE:-0}" LATENCY_AB="${LATENCY:-0}"
BEFORE_THREADS="${BEFORE_THREADS:-}" AFTER_THREADS="${AFTER_THREADS:-}" BARE_THREADS_AB="${BARE_THREADS:-2}"
BEFORE_METRICS="${BEFORE_METRICS:-}" AFTER_METRICS="${AFTER_METRICS:-}"
if [[ $LATENCY_AB == 1 && -z $RATE_AB ]]; then
  echo "LATENCY=1 needs RATE: latency at saturation is the queue's length, not the server's" >&2
  exit 2
fi
export RUN="${RUN:-/tmp/fqdnd-proxy-ab}"
# vs-peers.sh's functions (setup, need, wait_port, field), without running its main.
# shellcheck source=/dev/null
source <(sed 's/^main "\$@"$//' "$HERE/vs-peers.sh")
need
setup
nsd -c "$RUN/nsd.conf" -d >"$RUN/nsd.out" 2>&1 & PIDS+=($!)
wait_port "$AUTH"

BARE_BIN=""
if [[ $BARE_AB == 1 ]]; then
  (cd "$AB_ROOT" && cargo build --release --locked --quiet -p fqdnd-benchmarks --bin bare_forwarder)
  BARE_BIN="$AB_ROOT/target/release/bare_forwarder"
fi

one() { # bin mode [threads] [metrics address] -> "qps cpu_us_per_query[ p50_ms p99_ms]" (bin
  # `bare`: the bare forwarder)
  local conf="$RUN/fqdnd.yaml" port=$FQDND pid t0 t1 out="$RUN/ab.txt" rate=() verbose=()
  if [[ $2 == cached ]]; then conf="$RUN/fqdnd-cached.yaml" port=$FQDND_CACHED; fi
  if [[ -n ${4:-} ]]; then
    sed "s|^  listen: |  metrics: $4\n  listen: |" "$conf" >"$RUN/ab-metrics.yaml"
    grep -q "^  metrics: $4\$" "$RUN/ab-metrics.yaml" || { echo "no metrics line added to $conf" >&2; exit 1; }
    conf="$RUN/ab-metrics.yaml"
  fi
  if [[ -n ${3:-} ]]; then
    { cat "$conf"; printf -- '---\napiVersion: fqdnd.io/v1\nkind: Settings\nspec:\n  dns:\n    threads: %s\n' "$3"; } \
      >"$RUN/ab-threads.yaml"
    conf="$RUN/ab-threads.yaml"
  fi
  if [[ $1 == bare ]]; then
    port=$BARE_PORT
    "$BARE_BIN" "127.0.0.1:$port" "127.0.0.1:$AUTH" "$BARE_THREADS_AB" 2>"$RUN/bare.err" & pid=$!
  else
    "$1" gateway --config "$conf" 2>"$RUN/gateway.err" & pid=$!
  fi
  wait_port "$port"
  timeout 60 dnsperf -s 127.0.0.1 -p "$port" -d "$RUN/queries.txt" -n 1 -c 1 -q 100 >/dev/null 2>&1 || true
  [[ -n $RATE_AB ]] && rate=(-Q "$RATE_AB")
  [[ $LATENCY_AB == 1 ]] && verbose=(-v) out="$RUN/lat-ab-$RATE_AB.txt"
  t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  timeout $((DURATION_AB + 30)) dnsperf -s 127.0.0.1 -p "$port" -d "$RUN/queries.txt" -l "$DURATION_AB" \
    -c "$CLIENTS" -q "$OUTSTANDING" "${rate[@]}" "${verbose[@]}" -t 2 >"$out" 2>&1 || true
  t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  awk -v q="$(field 'Queries per second' "$out")" -v n="$(field 'Queries completed' "$out" | awk '{print $1}')" \
    -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" 'BEGIN{ printf "%.0f %.2f", q, (n > 0 ? t * 1e6 / hz / n : 0) }'
  # dnsperf -v's per-query times, through vs-peers.sh's `percentiles` (it reads lat-NAME-RATE.txt).
  [[ $LATENCY_AB == 1 ]] && printf ' %s %s' $(percentiles ab "$RATE_AB")
  echo
}

median() { sort -g | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'; }
sides() { # mode -> the sides measured in it
  if [[ $1 == nocache && $BARE_AB == 1 ]]; then echo before after bare; else echo before after; fi
}
for mode in $MODES_AB; do
  for side in $(sides "$mode"); do : >"$RUN/$mode-$side"; done
  for _ in $(seq "$ROUNDS"); do
    for side in $(sides "$mode"); do
      bin=$BEFORE threads=$BEFORE_THREADS metrics=$BEFORE_METRICS
      [[ $side == after ]] && bin=$AFTER threads=$AFTER_THREADS metrics=$AFTER_METRICS
      [[ $side == bare ]] && bin=bare threads= metrics=
      read -r q c p50 p99 < <(one "$bin" "$mode" "$threads" "$metrics")
      if [[ $LATENCY_AB == 1 ]]; then
        echo "$mode $side: $q qps, $c us/q, p50/p99 $p50/$p99 ms"
      else
        echo "$mode $side: $q qps, $c us/q"
      fi
      echo "$q $c ${p99:-}" >>"$RUN/$mode-$side"
    done
  done
done
for mode in $MODES_AB; do
  for side in $(sides "$mode"); do
    line="proxy-ab $mode $side: median qps $(cut -d' ' -f1 "$RUN/$mode-$side" | median), median cpu us/q $(cut -d' ' -f2 "$RUN/$mode-$side" | median)"
    [[ $LATENCY_AB == 1 ]] && line+=", median p99 ms $(cut -d' ' -f3 "$RUN/$mode-$side" | median)"
    echo "$line"
  done
  if [[ $LATENCY_AB == 1 ]]; then
    echo "proxy-ab $mode: p99 lower after in $(paste -d' ' "$RUN/$mode-before" "$RUN/$mode-after" | awk '$6 < $3 {n++} END{print n + 0}') of $ROUNDS"
  fi
done
