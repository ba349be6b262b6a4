#!/usr/bin/env bash
# cluster.sh — cluster mode at scale: a load generator (benchmarks/src/bin/cluster_load.rs)
# plays NODES simulated nodes with ENDPOINTS endpoints each against a real 3-member etcd
# cluster and the real allocator (`fqdnd operator`), while a real fqdnd daemon in cluster mode
# (`fqdnd gateway` with a Cluster document: the node side, the engine and the state file of a
# node, without a kernel datapath — no root needed) receives every endpoint. Measured:
# identities created/s, temporary → global p50/p99, propagation to the real node p50/p99,
# duplicate identities (must be 0), etcd and real-node memory.
#
# Knobs (env): NODES=1000 ENDPOINTS=100 SETS=2000 DURATION=30 (churn seconds) CHURN=500
# (endpoint replacements/s) NEW_SETS=10 (new label sets/s) BURST=1000 (new label sets at once)
# TTL=15 OPERATORS=2
# ETCD_DATA=/dev/shm (etcd data directories: tmpfs by default; a disk path for fsync costs)
# RUN=/tmp/fqdnd-cluster-bench. Last line:
#   cluster: nodes N, endpoints E, duplicate identities: 0, temp-to-global p99 ms: X, propagation p99 ms: Y
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN="${RUN:-/tmp/fqdnd-cluster-bench}"
NODES="${NODES:-1000}"
ENDPOINTS="${ENDPOINTS:-100}"
SETS="${SETS:-2000}"
DURATION="${DURATION:-30}"
CHURN="${CHURN:-500}"
NEW_SETS="${NEW_SETS:-10}"
BURST="${BURST:-1000}"
TTL="${TTL:-15}"
OPERATORS="${OPERATORS:-2}"
ETCD_DATA="${ETCD_DATA:-/dev/shm}"
cd "$ROOT"
command -v etcd >/dev/null || { echo "cluster.sh: etcd is missing (scripts/install-deps.sh)" >&2; exit 1; }
cargo build --release --locked --quiet -p fqdnd -p fqdnd-benchmarks --bin fqdnd --bin cluster_load
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}/release"
rm -rf "$RUN" && mkdir -p "$RUN"
PIDS=()
ETCD_PIDS=()
OP_PIDS=()
DATA_DIRS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  for d in "${DATA_DIRS[@]}"; do rm -rf "$d"; done
}
trap cleanup EXIT
base=$((20000 + ($$ % 500) * 10))
initial=""
for i in 0 1 2; do
  initial+="${initial:+,}e$i=http://127.0.0.1:$((base + 2 * i + 1))"
done
endpoints=""
for i in 0 1 2; do
  client="http://127.0.0.1:$((base + 2 * i))"
  peer="http://127.0.0.1:$((base + 2 * i + 1))"
  data="$ETCD_DATA/fqdnd-bench-etcd-$$-$i"
  rm -rf "$data"; DATA_DIRS+=("$data")
  etcd --name "e$i" --data-dir "$data" --listen-client-urls "$client" --advertise-client-urls "$client" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" --initial-cluster "$initial" \
    --initial-cluster-state new --initial-cluster-token "bench-$$" --quota-backend-bytes 8589934592 \
    --auto-compaction-mode revision --auto-compaction-retention 200000 \
    --logger zap --log-outputs stderr >"$RUN/etcd$i.log" 2>&1 &
  PIDS+=($!); ETCD_PIDS+=($!)
  endpoints+="${endpoints:+,}$client"
done
for _ in $(seq 1 100); do
  ETCDCTL_API=3 etcdctl --endpoints "$endpoints" endpoint health >/dev/null 2>&1 && break
  sleep 0.2
done
quoted=$(echo "$endpoints" | sed 's/[^,]*/"&"/g')
cat >"$RUN/cluster.yaml" <<YAML
apiVersion: fqdnd.io/v1
kind: Cluster
spec:
  endpoints: [$quoted]
  prefix: /fqdnd-bench
  nodeName: real-0
  leaseTTL: ${TTL}s
YAML
for i in $(seq 1 "$OPERATORS"); do
  FQDND_LOG=warn "$TARGET/fqdnd" operator --config "$RUN/cluster.yaml" --name "op$i" >"$RUN/op$i.log" 2>&1 &
  PIDS+=($!); OP_PIDS+=($!)
done
port=$(python3 -c 'import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
cat >"$RUN/node.yaml" <<YAML
apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: ["127.0.0.1:$port"]
  upstreams: ["127.0.0.1:9"]
  adminSocket: $RUN/node.sock
  stateDir: $RUN/node-state
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: local}
spec: {id: 1, addresses: ["127.0.0.0/8"], labels: {app: real}}
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: local}
spec:
  endpointSelector: {matchLabels: {app: real}}
  egress:
  - toEndpoints: [{matchLabels: {"io.kubernetes.pod.namespace": bench}}]
YAML
FQDND_LOG=warn "$TARGET/fqdnd" gateway --config "$RUN/node.yaml" --config "$RUN/cluster.yaml" >"$RUN/node.log" 2>&1 &
NODE_PID=$!; PIDS+=($NODE_PID)
for _ in $(seq 1 100); do [ -S "$RUN/node.sock" ] && break; sleep 0.1; done
node_rss0=$(awk '/VmRSS/{print $2}' /proc/$NODE_PID/status)
etcd_rss0=$(for p in "${ETCD_PIDS[@]}"; do awk '/VmRSS/{print $2}' /proc/$p/status; done | paste -sd+ | bc)
echo "command: NODES=$NODES ENDPOINTS=$ENDPOINTS SETS=$SETS DURATION=$DURATION CHURN=$CHURN NEW_SETS=$NEW_SETS BURST=$BURST TTL=$TTL OPERATORS=$OPERATORS ETCD_DATA=$ETCD_DATA benchmarks/cluster.sh"
"$TARGET/cluster_load" --etcd "$endpoints" --node-admin "$RUN/node.sock" --prefix /fqdnd-bench \
  --nodes "$NODES" --endpoints "$ENDPOINTS" --sets "$SETS" --seconds "$DURATION" \
  --churn "$CHURN" --new-sets "$NEW_SETS" --ttl "$TTL" --burst "$BURST" >"$RUN/load.raw"
grep -v '^cluster:' "$RUN/load.raw"
# Memory while every simulated endpoint is still published (their leases outlive the run by
# up to TTL).
node_rss=$(awk '/VmRSS/{print $2}' /proc/$NODE_PID/status)
etcd_rss=$(for p in "${ETCD_PIDS[@]}"; do awk '/VmRSS/{print $2}' /proc/$p/status; done | paste -sd+ | bc)
echo "etcd_rss_mib $((etcd_rss / 1024)) (3 members; $((etcd_rss0 / 1024)) at start)"
echo "real_node_rss_mib $((node_rss / 1024)) ($((node_rss0 / 1024)) at start)"
cpu() { awk -v t="$(getconf CLK_TCK)" '{printf "%.0f", ($14 + $15) / t}' "/proc/$1/stat"; }
echo "cpu_s etcd $(for p in "${ETCD_PIDS[@]}"; do cpu "$p"; echo; done | paste -sd+ | bc), allocators $(for p in "${OP_PIDS[@]}"; do cpu "$p"; echo; done | paste -sd+ | bc), real_node $(cpu "$NODE_PID") (load average $(cut -d' ' -f1-3 /proc/loadavg))"
echo "real_node_state_file_kib $(( $(stat -c %s "$RUN/node-state/cluster.state" 2>/dev/null || echo 0) / 1024 ))"
grep '^cluster:' "$RUN/load.raw"
