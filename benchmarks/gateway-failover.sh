#!/usr/bin/env bash
# gateway-failover.sh — an HA gateway pair (docs/ha-gateway.md) failing over, as root: two
# `fqdnd gateway`s in their own namespaces enforcing their LAN side and sharing learned answers
# through a 3-member etcd, keepalived moving the LAN and WAN virtual addresses, a client
# namespace routed through them, nsd and TCP servers outside. The client resolves names through
# the active gateway and runs a TCP transfer; the active gateway is killed with SIGKILL;
# keepalived moves the addresses; the script reports how long that took, whether the transfer
# went on through the survivor, and how many connections to addresses only the dead gateway had
# learned the survivor allowed without new DNS (then the dead gateway comes back and imports
# the state; the test asserts all of it).
#
# This is the test suite's `tests/gateway_ha.rs`, run ROUNDS times (default 1). Installs
# keepalived, nsd and etcd if missing (scripts/install-deps.sh). Lines per round on stderr
# (state lag: the active gateway's publication lag, the standby's import lag); last line:
#   failover: address moved in X s, transfer survived: yes|no, learned-only connections allowed: N/M
# (with ROUNDS > 1: the median time, "yes" only if every round's transfer survived, N/M summed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ "$(id -u)" -eq 0 ] || { echo "gateway-failover.sh: needs root (netns, eBPF, keepalived)" >&2; exit 1; }
"$ROOT/scripts/install-deps.sh"
cd "$ROOT"
ROUNDS="${ROUNDS:-1}"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
times=(); survived=yes; allowed=0; total=0
for round in $(seq 1 "$ROUNDS"); do
  FQDND_REQUIRE_PRIVILEGED=1 cargo test --locked --quiet --test gateway_ha -- --nocapture >"$out" 2>&1 || true
  # (not anchored: in --quiet mode a test's dot may precede a printed line)
  line="$(grep -oE 'failover: .*' "$out" || true)"
  if [ -z "$line" ]; then
    cat "$out" >&2
    echo "gateway-failover.sh: round $round reported nothing" >&2
    exit 1
  fi
  grep -oE '(state lag: |panicked).*' "$out" | sed "s/^/[round $round] /" >&2 || true
  echo "[round $round] $line" >&2
  times+=("$(sed -E 's/.*moved in ([0-9.]+) s.*/\1/' <<<"$line")")
  grep -q 'transfer survived: yes' <<<"$line" || survived=no
  n="$(sed -E 's/.*allowed: ([0-9]+)\/([0-9]+).*/\1 \2/' <<<"$line")"
  allowed=$((allowed + ${n% *})); total=$((total + ${n#* }))
done
median="$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
echo "failover: address moved in $median s, transfer survived: $survived, learned-only connections allowed: $allowed/$total"
