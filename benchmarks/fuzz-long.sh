#!/usr/bin/env bash
# Long fuzzing campaign: every cargo-fuzz target in fuzz/ (or those named) for ${HOURS:-1} hours
# each, one after the other, with a persistent corpus per target under
# ${FUZZ_WORK:-fuzz/target/long}/<target>/corpus (seeded from fuzz/corpus/<target>). After each
# run one line is appended to ${FUZZ_LONG_LOG:-benchmarks/results/fuzz-long.log}:
#
#   <UTC date> <git rev> <target> hours=<h> jobs=<n> executions=<n> exec/s=<n> cov=<n> corpus=<files> findings=<n> status=<ok|crash>
#
# Crashes found are in fuzz/artifacts/<target>/; minimise one with
#   cargo +nightly fuzz tmin <target> fuzz/artifacts/<target>/<crash-file>
# and save it under fuzz/regressions/<target>/. JOBS (default 1) runs that many libFuzzer
# workers in parallel per target (-fork mode).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/fuzz" || exit 1
hours="${HOURS:-1}"
jobs="${JOBS:-1}"
work="${FUZZ_WORK:-$root/fuzz/target/long}"
log_file="${FUZZ_LONG_LOG:-$root/benchmarks/results/fuzz-long.log}"
mkdir -p "$(dirname "$log_file")"
seconds="$(awk -v h="$hours" 'BEGIN { printf "%d", h * 3600 }')"
rev="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo +nightly install cargo-fuzz --locked || exit 1
fi
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
cargo +nightly fuzz build || exit 1

any_crash=0
for target in "${targets[@]}"; do
    corpus="$work/$target/corpus"
    mkdir -p "$corpus" "artifacts/$target"
    [ -d "corpus/$target" ] && cp -n "corpus/$target"/* "$corpus"/ 2>/dev/null
    [ -d "regressions/$target" ] && cp -n "regressions/$target"/* "$corpus"/ 2>/dev/null
    before="$(find "artifacts/$target" -type f | wc -l)"
    log="$work/$target/run-$(date -u +%Y%m%dT%H%M%SZ).log"
    extra=()
    [ "$jobs" -gt 1 ] && extra+=(-fork="$jobs" -ignore_crashes=1)
    echo "== $target for ${hours}h (log: $log)"
    if cargo +nightly fuzz run "$target" "$corpus" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        "${extra[@]}" >"$log" 2>&1; then
        status=ok
    else
        status=crash
    fi
    after="$(find "artifacts/$target" -type f | wc -l)"
    findings=$((after - before))
    [ "$findings" -gt 0 ] && status=crash
    [ "$status" = crash ] && any_crash=1
    execs="$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)"
    [ -z "$execs" ] && execs="$(grep -Eo '^#[0-9]+' "$log" | tail -1 | tr -d '#')"
    rate="$(grep -Eo 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)"
    cov="$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+')"
    files="$(find "$corpus" -type f | wc -l)"
    line="$(date -u +%Y-%m-%dT%H:%M:%SZ) $rev $target hours=$hours jobs=$jobs executions=${execs:-?} exec/s=${rate:-?} cov=${cov:-?} corpus=$files findings=$findings status=$status"
    echo "$line" | tee -a "$log_file"
done
exit "$any_crash"
