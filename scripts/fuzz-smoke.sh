#!/usr/bin/env bash
# Smoke-runs every cargo-fuzz target in fuzz/ for FUZZ_SECONDS (default 20) each, starting from
# the committed seeds plus the regression reproducers, and fails if any target crashes, leaks,
# times out or runs out of memory. Needs the nightly toolchain (libFuzzer + sanitizers).
#
#   scripts/fuzz-smoke.sh                 # every target, 20 s each
#   FUZZ_SECONDS=60 scripts/fuzz-smoke.sh dns_name answer_chain
#   FUZZ_SECONDS=5 scripts/fuzz-smoke.sh  # what .ci/run does
#
# The per-target summary (executions, exec/s, coverage) goes to stdout; libFuzzer's own log of
# each run is kept in ${FUZZ_LOG_DIR:-fuzz/target/smoke-logs}/<target>.log.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/fuzz"
seconds="${FUZZ_SECONDS:-20}"
log_dir="${FUZZ_LOG_DIR:-$root/fuzz/target/smoke-logs}"
mkdir -p "$log_dir"

# A fresh machine: the nightly toolchain (libFuzzer's sanitizer flags; `+nightly` takes
# precedence over the pinned rust-toolchain.toml), a C++ compiler (libfuzzer-sys builds
# libFuzzer) and cargo-fuzz.
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "nightly toolchain not found: installing it" >&2
    rustup toolchain install nightly --profile minimal
fi
if ! command -v c++ >/dev/null 2>&1 && ! command -v clang++ >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "no C++ compiler: installing g++" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ >/dev/null \
            || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ >/dev/null; }
    else
        echo "fuzz-smoke.sh: a C++ compiler (g++ or clang++) is needed to build libFuzzer" >&2
        exit 1
    fi
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz not found: installing it" >&2
    cargo +nightly install cargo-fuzz --locked
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

# Build once up front so that the time limit is spent fuzzing.
cargo +nightly fuzz build

failed=()
for target in "${targets[@]}"; do
    corpus="corpus/$target"
    work="$(mktemp -d)"
    mkdir -p "$corpus" "artifacts/$target"
    # Fuzz into a scratch corpus so the committed seed directory stays as it is; the seeds and
    # any saved reproducers are read from their own directories.
    dirs=("$work" "$corpus")
    [ -d "regressions/$target" ] && dirs+=("regressions/$target")
    log="$log_dir/$target.log"
    echo "== $target (${seconds}s)"
    if cargo +nightly fuzz run "$target" "${dirs[@]}" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        >"$log" 2>&1; then
        status=ok
    else
        status=FAILED
        failed+=("$target")
    fi
    execs="$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || true)"
    rate="$(grep -Eo 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || true)"
    cov="$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 || true)"
    echo "   $status executions=${execs:-?} exec/s=${rate:-?} ${cov}"
    if [ "$status" = FAILED ]; then
        grep -E 'panicked at|ERROR: libFuzzer|SUMMARY|Test unit written to' "$log" | head -20 || true
        echo "   full log: $log"
    fi
    rm -rf "$work"
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz smoke FAILED: ${failed[*]} (reproducers under fuzz/artifacts/<target>/)" >&2
    exit 1
fi
echo "fuzz smoke ok: ${#targets[@]} targets, ${seconds}s each"
