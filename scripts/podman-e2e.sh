#!/usr/bin/env bash
# A container started the normal way (podman, CNI: bridge + fqdnd-cni) becomes an endpoint of
# the fqdnd node agent by itself and stops being one when it goes away; its DNS goes through
# fqdnd transparently and it reaches the IP of an allowed name and not another. Then what
# issue 36 found, as a user meets it: every interface of a container on two networks is
# enforced; `podman network connect` and `disconnect` add and remove one attachment each; a
# restart of an agent without `stateDir` keeps every container enforced; a container removed
# while the agent is down leaves nothing of its own in the kernel maps once the agent is back.
#
#   scripts/podman-e2e.sh            # root; installs podman, runc, containernetworking-plugins
#                                    # and busybox-static if missing
#   FQDND_BIN=target/release/fqdnd scripts/podman-e2e.sh
#   CNI_PLUGIN=ptp scripts/podman-e2e.sh      # the routed ptp plugin instead of a bridge
#
# Everything runs in network namespaces the script creates (a "host" one for the agent,
# podman and its bridges; an "external" one with the DNS server and the web servers), on
# documentation addresses, with a test-owned containers.conf: nothing global changes, and
# everything is removed at the end, even on failure. Last line: `podman e2e: ok` or
# `podman e2e: FAILED at <step>`.
set -Eeuo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The plugin that creates the container's interface: bridge (the container's veth is a port
# of a bridge holding the gateway address; the agent redirects DNS at the bridge too) or ptp
# (routed).
plugin="${CNI_PLUGIN:-bridge}"
# Absolute: podman finds the plugin through a link to it.
bin="$(realpath -m "${FQDND_BIN:-$root/target/debug/fqdnd}")"
step="start"
fail() {
    # What the agent saw, for the one reading the failure.
    if [ -n "${work:-}" ] && [ -f "$work/node.log" ]; then
        echo "--- last lines of the node agent's log:" >&2
        tail -n 30 "$work/node.log" >&2
        echo "--- drops:" >&2
        timeout 5 "$bin" monitor --recent --count 20 --admin-socket "$work/node.sock" >&2 || true
    fi
    echo "podman e2e: FAILED at $step${1:+: $1}"
    exit 1
}
trap 'fail "command failed (line $LINENO)"' ERR

[ "$(id -u)" -eq 0 ] || { step="privileges"; fail "needs root"; }
if [ ! -x "$bin" ]; then
    step="build"
    (cd "$root" && cargo build --quiet --bin fqdnd)
fi

step="install"
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
[ -x /bin/busybox ] || missing+=(busybox-static)
if [ ${#missing[@]} -gt 0 ]; then
    echo "podman-e2e.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
fi

id="fqpm$$"
host="$id-host"
ext="$id-ext"
work="$(mktemp -d /tmp/fqdnd-podman-e2e.XXXXXX)"
pins="/sys/fs/bpf/fqdnd-podman-e2e-$$"
node_pid=""
dns_pid=""
web_pids=()
export CONTAINERS_CONF="$work/containers.conf"
export CONTAINERS_STORAGE_CONF="$work/storage.conf"
# nsenter, not `ip netns exec`: that one also remounts /sys, hiding the cgroup and bpf mounts.
in_ns() { local ns="$1"; shift; nsenter --net="/run/netns/$ns" "$@"; }
podman() { in_ns "$host" podman --root "$work/storage" --runroot "$work/run" "$@"; }

cleanup() {
    if [ -n "${KEEP:-}" ]; then
        echo "KEEP: left in place: namespaces $host $ext, $work" >&2
        return
    fi
    set +e
    trap - ERR
    for c in "$id" "${id}m" "${id}n"; do podman rm -f -t 0 "$c" >/dev/null 2>&1; done
    [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null
    [ -n "$dns_pid" ] && kill "$dns_pid" 2>/dev/null && wait "$dns_pid" 2>/dev/null
    for p in "${web_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    [ -d "$pins" ] && in_ns "$host" "$bin" bpf unload --pin-dir "$pins" >/dev/null 2>&1
    ip netns del "$host" 2>/dev/null
    ip netns del "$ext" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Waits up to $1 seconds for command "${@:2}" to succeed.
until_ok() {
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}

step="network"
ip netns add "$host"
ip netns add "$ext"
ip -n "$host" link set lo up
ip -n "$ext" link set lo up
ip netns exec "$host" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
ip -n "$host" link add "${id}x" type veth peer name "${id}e" netns "$ext"
ip -n "$host" addr add 192.0.2.1/24 dev "${id}x"
ip -n "$host" link set "${id}x" up
ip -n "$ext" addr add 192.0.2.2/24 dev "${id}e"
ip -n "$ext" addr add 192.0.2.53/32 dev "${id}e"
ip -n "$ext" link set "${id}e" up
ip -n "$ext" route add default via 192.0.2.1
# .10 and .20: allowed.test's and denied.test's web servers; .30: pings a CIDR rule allows (a
# route that works); .40: an address no answer the containers may get gives (name.other, a
# name their policy does not let them resolve): reaching it means no enforcement.
for a in 10 20 30 40; do ip -n "$ext" addr add "203.0.113.$a/32" dev lo; done
ip -n "$host" route add 203.0.113.0/24 via 192.0.2.2

step="external servers"
cat > "$work/dns.yaml" <<EOF
apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: ["192.0.2.53:53"]
  adminSocket: $work/dns.sock
  staticZones:
  - origin: test
    records: |
      \$TTL 300
      @ IN SOA ns.test. admin.test. 1 3600 600 86400 60
      @ IN NS ns.test.
      allowed IN A 203.0.113.10
      denied IN A 203.0.113.20
  - origin: other
    records: |
      \$TTL 300
      @ IN SOA ns.other. admin.other. 1 3600 600 86400 60
      @ IN NS ns.other.
      name IN A 203.0.113.40
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: everyone}
spec: {id: 1, addresses: ["0.0.0.0/0"]}
EOF
nsenter --net="/run/netns/$ext" "$bin" gateway --config "$work/dns.yaml" > "$work/dns.log" 2>&1 &
dns_pid=$!
for name in allowed denied; do
    mkdir -p "$work/www-$name"
    echo "hello from $name" > "$work/www-$name/index.html"
done
nsenter --net="/run/netns/$ext" busybox httpd -f -p 203.0.113.10:80 -h "$work/www-allowed" &
web_pids+=($!)
nsenter --net="/run/netns/$ext" busybox httpd -f -p 203.0.113.20:80 -h "$work/www-denied" &
web_pids+=($!)
until_ok 30 test -S "$work/dns.sock" || fail "the DNS server did not start: $(cat "$work/dns.log")"
# The controls of the checks below: the server answers name.other, .40 answers pings.
in_ns "$host" busybox nslookup name.other 192.0.2.53 | grep -q 203.0.113.40 \
    || fail "the DNS server does not answer name.other"
in_ns "$host" busybox ping -c 1 -W 3 203.0.113.40 >/dev/null || fail "the host cannot ping 203.0.113.40"

step="node agent"
# No `stateDir`: what the agent enforces must survive its restarts all the same.
cat > "$work/node.yaml" <<EOF
apiVersion: fqdnd.io/v1
kind: Node
spec:
  dnsProxyPort: 10053
  pinDir: $pins
  adminSocket: $work/node.sock
---
# Every namespace's podtest containers: a clusterwide policy.
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: podtest}
spec:
  endpointSelector: {matchLabels: {app: podtest}}
  egress:
  - toCIDR: ["192.0.2.53/32"]
    toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules:
        dns: [{matchPattern: "*.test"}]
  - toFQDNs: [{matchName: allowed.test}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
  - toCIDR: ["203.0.113.30/32"]
---
# Labels of one container, as podman can give them (docs/manual/node.md): its namespace through
# CNI_ARGS, and its name.
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: shop, namespace: shop}
spec:
  endpointSelector: {matchLabels: {k8s:io.kubernetes.pod.namespace: shop}}
  egress:
  - toCIDR: ["203.0.113.40/32"]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: by-name, namespace: shop}
spec:
  endpointSelector: {matchLabels: {cni:name: ${id}n}}
  egress:
  - toCIDR: ["203.0.113.20/32"]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
EOF
start_node() {
    FQDND_LOG=info,fqdnd_dnsproxy=debug nsenter --net="/run/netns/$host" "$bin" node \
        --config "$work/node.yaml" >> "$work/node.log" 2>&1 &
    node_pid=$!
    until_ok 60 "$bin" status --admin-socket "$work/node.sock" \
        || fail "the node agent did not start: $(tail -20 "$work/node.log")"
}
stop_node() {
    kill "$node_pid"
    wait "$node_pid" || true
    node_pid=""
}
start_node

step="podman configuration"
mkdir -p "$work/cni" "$work/plugins" "$work/rootfs/bin" "$work/rootfs/etc" "$work/storage" "$work/run"
ln -s "$bin" "$work/plugins/fqdnd-cni"
cp /bin/busybox "$work/rootfs/bin/busybox"
ln -s busybox "$work/rootfs/bin/sh"
cat > "$CONTAINERS_CONF" <<EOF
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=1024:1024"]
[network]
network_backend = "cni"
network_config_dir = "$work/cni"
cni_plugin_dirs = ["/usr/lib/cni", "$work/plugins"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$work/events.log"
EOF
cat > "$CONTAINERS_STORAGE_CONF" <<EOF
[storage]
driver = "vfs"
runroot = "$work/run"
graphroot = "$work/storage"
EOF
# Network $1 (its file and name): subnet $2, gateway $3, the containers' routes $4, and (for
# the bridge plugin) bridge $5.
network() {
    cat > "$work/cni/$1.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$1",
  "plugins": [
    {
      "type": "$plugin",
$([ "$plugin" = bridge ] && printf '      "bridge": "%s",\n      "isGateway": true,\n' "$5")
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$2", "gateway": "$3"}]],
        "routes": [$4],
        "dataDir": "$work/ipam"
      }
    },
    {
      "type": "fqdnd-cni",
      "adminSocket": "$work/node.sock",
      "labels": {"app": "podtest"}
    }
  ]
}
EOF
}
# The second network routes only the external servers' range: a container on both reaches
# them through eth1 by default, and through either with `ping -I`.
network "$id" 198.51.100.0/25 198.51.100.1 '{"dst": "0.0.0.0/0"}' "${id}br"
network "${id}b" 198.51.100.128/25 198.51.100.129 '{"dst": "203.0.113.0/24"}' "${id}bb"

step="podman run"
podman run -d --name "$id" --network "$id" --dns 192.0.2.53 --rootfs "$work/rootfs" \
    /bin/busybox sleep 300 > "$work/podman-run.log" 2>&1 \
    || fail "$(cat "$work/podman-run.log")"
in_box() { podman exec "$id" /bin/busybox "$@"; }
# An HTTP GET of / from IP $1 inside the container (busybox nc: the static busybox's wget
# crashes in glibc's resolver even for an address).
get() { podman exec "$id" /bin/busybox sh -c "printf 'GET / HTTP/1.0\r\n\r\n' | /bin/busybox nc -w 3 $1 80"; }

step="endpoint registered"
list() { "$bin" endpoint list --admin-socket "$work/node.sock"; }
until_ok 30 sh -c "'$bin' endpoint list --admin-socket '$work/node.sock' | grep -q 'k8s:app=podtest'" \
    || fail "$(list)"
list | grep 'k8s:app=podtest' | grep -q ' true ' || fail "not enforcing: $(list)"

step="no access before DNS"
if get 203.0.113.10 >/dev/null 2>&1; then
    fail "the allowed name's IP was reachable before it was resolved"
fi

step="DNS through fqdnd"
in_box nslookup allowed.test 192.0.2.53 > "$work/nslookup.log" 2>&1 || fail "$(cat "$work/nslookup.log")"
grep -q 203.0.113.10 "$work/nslookup.log" || fail "$(cat "$work/nslookup.log")"
if in_box nslookup name.other 192.0.2.53 > "$work/refused.log" 2>&1; then
    fail "a name outside *.test was answered: $(cat "$work/refused.log")"
fi
# The proxy saw the container's queries: its cache holds the name for the endpoint.
"$bin" cache list --admin-socket "$work/node.sock" | grep -q 'allowed.test' || fail "not learned"

step="allowed IP reachable"
get 203.0.113.10 | grep -q "hello from allowed" \
    || fail "could not reach the allowed name's IP"

step="denied IP dropped"
in_box nslookup denied.test 192.0.2.53 | grep -q 203.0.113.20 || fail "denied.test did not resolve"
if get 203.0.113.20 >/dev/null 2>&1; then
    fail "reached denied.test's IP"
fi

# The container id's first 16 characters (its endpoints are named after them).
cid() { podman inspect -f '{{.Id}}' "$1" | cut -c1-16; }
# The rows of `fqdnd endpoint list` of container $1.
endpoints_of() { local c; c="$(cid "$1")"; list | grep " cni-$c" || true; }
# Container $1 has exactly $2 endpoints, each attached and enforcing.
enforced() {
    local rows n
    rows="$(endpoints_of "$1")"
    n="$(printf '%s' "$rows" | grep -c . || true)"
    [ "$n" -eq "$2" ] && ! printf '%s\n' "$rows" | grep -qv ' true '
}
# Container $1 pings 203.0.113.30 (its policy allows it: the route works) and not .40 through
# its interface $2.
ping_denied() {
    podman exec "$1" /bin/busybox ping -c 1 -W 3 -I "$2" 203.0.113.30 >/dev/null 2>&1 \
        || fail "$1 cannot ping 203.0.113.30 (allowed) through $2: $(endpoints_of "$1")"
    if podman exec "$1" /bin/busybox ping -c 1 -W 2 -I "$2" 203.0.113.40 >/dev/null 2>&1; then
        fail "$1 reached 203.0.113.40 through $2: $(endpoints_of "$1")"
    fi
}
# Container $1's DNS goes through fqdnd: name.other (the server answers it) is refused.
dns_enforced() {
    if podman exec "$1" /bin/busybox nslookup name.other 192.0.2.53 > "$work/other.log" 2>&1; then
        fail "$1 resolved name.other, which its policy denies: $(cat "$work/other.log")"
    fi
}
bpf_list() { in_ns "$host" "$bin" bpf endpoint list --pin-dir "$pins"; }
# Every endpoint id the kernel's endpoint, source and client entries name is one the agent
# has.
kernel_ids_known() {
    local known kernel k
    known="$(list | awk 'NR > 1 {print $1}')"
    kernel="$(bpf_list | { grep -o 'endpoint [0-9]*' || true; } | awk '{print $2}' | sort -u)"
    kernel="$kernel $(bpf_list | awk 'NR > 1 && $1 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/ {print $3}')"
    for k in $kernel; do
        printf '%s\n' "$known" | grep -qx "$k" \
            || fail "the kernel maps name endpoint $k, which the agent does not have: $(bpf_list)"
    done
}

step="network connect"
podman network connect "${id}b" "$id"
until_ok 30 enforced "$id" 2 || fail "not two enforcing endpoints: $(list)"
ping_denied "$id" eth0
ping_denied "$id" eth1
get 203.0.113.10 | grep -q "hello from allowed" || fail "lost the allowed name's IP"

step="network disconnect"
podman network disconnect "${id}b" "$id"
until_ok 30 enforced "$id" 1 || fail "not one enforcing endpoint: $(list)"
dns_enforced "$id"
ping_denied "$id" eth0

step="two networks"
podman run -d --name "${id}m" --network "$id" --network "${id}b" --dns 192.0.2.53 \
    --rootfs "$work/rootfs" /bin/busybox sleep 300 > "$work/podman-run-m.log" 2>&1 \
    || fail "$(cat "$work/podman-run-m.log")"
until_ok 30 enforced "${id}m" 2 || fail "not two enforcing endpoints: $(list)"
ping_denied "${id}m" eth0
ping_denied "${id}m" eth1
dns_enforced "${id}m"

step="restart without stateDir"
before="$(list | grep -c ' cni-')"
stop_node
start_node
[ "$(list | grep -c ' cni-')" -eq "$before" ] || fail "$before endpoints before, now: $(list)"
until_ok 30 enforced "$id" 1 || fail "$id: $(list)"
until_ok 30 enforced "${id}m" 2 || fail "${id}m: $(list)"
ping_denied "$id" eth0
ping_denied "${id}m" eth0
ping_denied "${id}m" eth1
dns_enforced "$id"
dns_enforced "${id}m"

step="podman rm while the agent is down"
gone="$(podman inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "${id}m")"
[ -n "${gone// /}" ] || fail "no addresses for ${id}m"
stop_node
podman rm -f -t 0 "${id}m" >/dev/null
start_node
until_ok 30 enforced "$id" 1 || fail "$id: $(list)"
for a in $gone; do
    if bpf_list | grep -q "source $a[ /]"; then
        fail "the removed container's address $a is still in the kernel maps: $(bpf_list)"
    fi
done
kernel_ids_known
# (Its namespace through podman's environment.)
CNI_ARGS="K8S_POD_NAMESPACE=shop" podman run -d --name "${id}n" --network "$id" --dns 192.0.2.53 \
    --rootfs "$work/rootfs" /bin/busybox sleep 300 > "$work/podman-run-n.log" 2>&1 \
    || fail "$(cat "$work/podman-run-n.log")"
until_ok 30 enforced "${id}n" 1 || fail "${id}n: $(list)"
dns_enforced "${id}n"
kernel_ids_known

step="labels of one container"
endpoints_of "${id}n" | grep -q "k8s:io.kubernetes.pod.namespace=shop" \
    || fail "no namespace label: $(endpoints_of "${id}n")"
endpoints_of "${id}n" | grep -q "cni:name=${id}n" || fail "no name label: $(endpoints_of "${id}n")"
# The policies of its namespace and its name are its own: it reaches .40 and denied.test's
# web server, the other container neither.
podman exec "${id}n" /bin/busybox ping -c 1 -W 3 -I eth0 203.0.113.40 >/dev/null 2>&1 \
    || fail "the namespace's policy does not apply: $(endpoints_of "${id}n")"
podman exec "${id}n" /bin/busybox sh -c "printf 'GET / HTTP/1.0\r\n\r\n' | /bin/busybox nc -w 3 203.0.113.20 80" \
    | grep -q "hello from denied" || fail "the name's policy does not apply: $(endpoints_of "${id}n")"
ping_denied "$id" eth0
if get 203.0.113.20 >/dev/null 2>&1; then
    fail "$id reached denied.test's IP, which only ${id}n's policy allows"
fi

step="CNI CHECK"
# The plugin's CHECK of container $1's attachment eth0 on host interface $2 (what a runtime
# sends; the exit code is CHECK's, the error object on stdout).
check() {
    printf '{"cniVersion": "1.0.0", "name": "%s", "type": "fqdnd-cni", "adminSocket": "%s",
             "prevResult": {"cniVersion": "1.0.0",
                            "interfaces": [{"name": "%s"}, {"name": "eth0", "sandbox": "/x"}],
                            "ips": [{"address": "198.51.100.9/25", "interface": 1}]}}' \
        "$id" "$work/node.sock" "$2" \
        | in_ns "$host" env CNI_COMMAND=CHECK CNI_CONTAINERID="$1" CNI_IFNAME=eth0 \
            CNI_NETNS=/x CNI_PATH=/x "$work/plugins/fqdnd-cni"
}
n_full="$(podman inspect -f '{{.Id}}' "${id}n")"
# (The ATTACHED column, found by its header.)
n_veth="$(list | awk -v c=" cni-$(cid "${id}n")" \
    'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "ATTACHED") col = i } index($0, c) { print $col }')"
check "$n_full" "$n_veth" > "$work/check.log" || fail "CHECK of ${id}n failed: $(cat "$work/check.log")"
if check 0123456789abcdef0123 "$n_veth" > "$work/check.log"; then
    fail "CHECK of a container the agent never had succeeded"
fi
grep -q '"code":3' "$work/check.log" || fail "CHECK of an unknown container: $(cat "$work/check.log")"

step="podman rm"
podman rm -f -t 0 "$id" "${id}n" >/dev/null
until_ok 30 sh -c "! '$bin' endpoint list --admin-socket '$work/node.sock' | grep -q 'k8s:app=podtest'" \
    || fail "the endpoints are still there: $(list)"
kernel_ids_known

echo "podman e2e: ok ($plugin)"
