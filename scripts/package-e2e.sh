#!/usr/bin/env bash
# The Debian package, installed and used as an administrator would, in a booted Debian
# bookworm with systemd (a podman container running /sbin/init):
#
# 1. the package of the previous packaged commit is installed: the gateway unit starts by
#    itself on its shipped configuration; it is taught answers;
# 2. the package of this commit upgrades it while a client asks a question every 20 ms: the
#    unit restarts with the new binary, keeps the identity numbers and the learned names
#    (its stateDir), and the questions lost during the upgrade are counted (printed);
# 3. the gateway as a user meets it: ready (systemctl returns) only once it answers, `dig`
#    gets the allowed answer and the refusals, `systemctl reload` applies a policy change,
#    `systemctl restart` keeps the identities, `journalctl -u` shows its log;
# 4. the operator runs as its own unprivileged user against the etcd of the container;
# 5. the node agent runs privileged (bpffs) and `fqdnd endpoint add --unit` makes a real
#    systemd unit's processes an endpoint: their DNS goes through the agent's proxy (a name
#    the gateway answers but the endpoint's policy does not allow is refused) and their
#    egress is enforced (the learned address is reached, another is not); a restart of the
#    unit keeps it enforced;
# 6. `apt-get remove` keeps the configuration and the state, `apt-get purge` removes them;
# and prints `systemd-analyze security` for each unit.
#
#   scripts/package-e2e.sh        # root; installs mmdebstrap, podman, runc if missing
#   FQDND_DEB=path.deb scripts/package-e2e.sh     # test this package instead of building it
#   KEEP=1 scripts/package-e2e.sh                 # leave the container running to look at it
#
# The root file system is made once with mmdebstrap (needs the Debian mirror) and cached in
# /var/cache/fqdnd-e2e (FQDND_E2E_CACHE), with the previous commit's package. The container
# has no network but loopback; it and its image are removed at the end, even on failure.
# Last line: `package e2e: ok` or `package e2e: FAILED at <step>`.
set -Eeuo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${FQDND_E2E_CACHE:-/var/cache/fqdnd-e2e}"
name="fqdnd-e2e-$$"
image="localhost/fqdnd-e2e:$$"
work="$(mktemp -d /tmp/fqdnd-package-e2e.XXXXXX)"
step="start"
t0=$SECONDS

in_ct() { podman exec "$name" "$@"; }
# The same with stdin (a here-document to write a file).
in_ct_i() { podman exec -i "$name" "$@"; }

fail() {
    set +e
    trap - ERR
    if podman container exists "$name" 2>/dev/null; then
        echo "--- units:" >&2
        in_ct systemctl --no-pager list-units 'fqdnd*' 'web*' >&2
        for u in fqdnd-gateway fqdnd-node fqdnd-operator web; do
            echo "--- journal of $u:" >&2
            in_ct journalctl --no-pager -n 25 -u "$u" >&2
        done
    fi
    echo "package e2e: FAILED at $step${1:+: $1}"
    exit 1
}
trap 'fail "command failed (line $LINENO)"' ERR

cleanup() {
    set +e
    trap - ERR
    if [ -n "${KEEP:-}" ]; then
        echo "KEEP: left running: container $name (podman exec -it $name bash), $work" >&2
        return
    fi
    podman rm -f -t 0 "$name" >/dev/null 2>&1
    podman rmi -f "$image" >/dev/null 2>&1
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

[ "$(id -u)" -eq 0 ] || { step="privileges"; fail "needs root"; }

step="install tools"
missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v lintian >/dev/null || missing+=(lintian)
if [ ${#missing[@]} -gt 0 ]; then
    echo "package-e2e.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
fi
# runc (crun refuses a hybrid cgroup layout), the process limits this machine allows, and
# systemd inside: a test-owned configuration, nothing global changes.
export CONTAINERS_CONF="$work/containers.conf"
cat > "$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
mkdir -p "$cache/debs"

step="build the package"
deb="${FQDND_DEB:-$("$root/scripts/build-deb.sh")}"
deb="$(realpath "$deb")"
echo "package: $(basename "$deb")" >&2
step="lintian"
# Clean but for the overrides the package carries (each justified in
# packaging/debian/lintian-overrides); warnings and errors fail.
lintian -I --fail-on error,warning,info --tag-display-limit 0 "$deb" >&2 || fail "lintian: see above"

# The package of the commit that last changed the packaging before this one (its own
# build-deb.sh, from `git archive`: the repository is not touched), built once and cached.
step="build the previous package"
head="$(git -C "$root" rev-parse HEAD)"
prev="${FQDND_E2E_PREVIOUS:-$(git -C "$root" log --format=%H -1 "$head~1" -- scripts/build-deb.sh packaging)}"
[ -n "$prev" ] || fail "no earlier commit has a package to upgrade from (FQDND_E2E_PREVIOUS=COMMIT)"
prev_short="$(git -C "$root" rev-parse --short=12 "$prev")"
prev_version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")+git$(git -C "$root" rev-list --count "$prev").$prev_short"
prev_deb="$(ls "$cache"/debs/fqdnd_"$prev_version"_*.deb 2>/dev/null | head -1 || true)"
if [ -z "$prev_deb" ]; then
    src="$cache/src-$prev_short"
    rm -rf "$src"
    mkdir -p "$src"
    git -C "$root" archive "$prev" | tar -x -C "$src"
    # The workspace's own target directory: only the workspace crates are built again.
    prev_deb="$(FQDND_GIT_COMMIT="$prev_short" FQDND_DEB_VERSION="$prev_version" \
        CARGO_TARGET_DIR="$root/target" OUT="$cache/debs" "$src/scripts/build-deb.sh")"
    rm -rf "$src"
    # The binary of this commit back in place (cargo links it again from its fresh build).
    [ -n "${FQDND_DEB:-}" ] || (cd "$root" && cargo build --release --locked --quiet --bin fqdnd)
fi
echo "previous package: $(basename "$prev_deb")" >&2

step="root file system"
include="systemd,systemd-sysv,dbus,iproute2,bind9-dnsutils,etcd-server,etcd-client,socat,procps"
rootfs="$cache/bookworm-$(echo "$include" | sha256sum | cut -c1-12).tar"
if [ ! -f "$rootfs" ]; then
    mmdebstrap --quiet --variant=minbase --format=tar --include="$include" bookworm \
        "$rootfs.part" http://deb.debian.org/debian >&2
    mv "$rootfs.part" "$rootfs"
fi

step="boot"
t_boot=$SECONDS
podman import -q "$rootfs" "$image" >/dev/null
# Privileged (the node agent loads eBPF programs), its own cgroup namespace (the unit paths
# systemd shows are then the cgroup v2 paths the agent sees), no network but loopback.
podman run -d --name "$name" --privileged --cgroupns=private --network none \
    --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 --systemd=always "$image" /sbin/init >/dev/null
booted() { case "$(in_ct systemctl is-system-running 2>/dev/null)" in running|degraded) return 0;; *) return 1;; esac; }
until_ok 90 booted || fail "systemd did not reach running"
echo "booted in $((SECONDS - t_boot)) s" >&2
in_ct mount -t bpf bpf /sys/fs/bpf
podman cp "$deb" "$name:/root/new.deb"
podman cp "$prev_deb" "$name:/root/previous.deb"

# --- 1. The previous package: the gateway starts on its own and learns. -------------------
step="install the previous package"
in_ct env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq /root/previous.deb >/dev/null
in_ct systemctl is-active fqdnd-gateway >/dev/null || fail "fqdnd-gateway is not active after install"
for u in fqdnd-node fqdnd-operator; do
    [ "$(in_ct systemctl is-enabled "$u")" = enabled ] || fail "$u is not enabled"
    ! in_ct systemctl is-active "$u" >/dev/null || fail "$u started without its configuration"
done
G="-c /etc/fqdnd/gateway.yaml"
ask() { in_ct dig +tries=1 +timeout=2 @127.0.0.1 "$@"; }
for n in www.example.test shop.example.test api.example.net; do
    [ -n "$(ask +short "$n" A)" ] || fail "no answer for $n"
done
ids_before="$(in_ct fqdnd identity list $G | awk 'NR > 1 {print $1, $3}' | sort)"
names_before="$(in_ct fqdnd cache list $G | awk 'NR > 1 {print $3}' | sort -u)"
echo "$names_before" | grep -qx 'www.example.test.' || fail "www.example.test not learned: $names_before"

# --- 2. The upgrade: restarts with the new binary, keeps the state, loses few questions. ---
step="upgrade"
in_ct sh -c 'n=0; while [ ! -e /root/stop ]; do
    if dig +tries=1 +timeout=1 +short @127.0.0.1 www.example.test A | grep -q 192.0.2.10; then echo ok; else echo lost; fi
    n=$((n + 1)); sleep 0.02; done > /root/during-upgrade' &
asker=$!
until_ok 10 in_ct test -s /root/during-upgrade
pid_before="$(in_ct systemctl show -p MainPID --value fqdnd-gateway)"
in_ct env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq /root/new.deb >/dev/null
sleep 1
in_ct touch /root/stop
wait "$asker" || true
asked="$(in_ct sh -c 'wc -l < /root/during-upgrade')"
lost="$(in_ct grep -c lost /root/during-upgrade || true)"
pid_after="$(in_ct systemctl show -p MainPID --value fqdnd-gateway)"
[ "$pid_before" != "$pid_after" ] || fail "the gateway was not restarted by the upgrade"
in_ct systemctl is-active fqdnd-gateway >/dev/null || fail "fqdnd-gateway is not active after the upgrade"
in_ct fqdnd --version | grep -q "$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo .)" \
    || [ -n "${FQDND_DEB:-}" ] || fail "fqdnd --version does not name this commit: $(in_ct fqdnd --version)"
ids_after="$(in_ct fqdnd identity list $G | awk 'NR > 1 {print $1, $3}' | sort)"
[ "$ids_before" = "$ids_after" ] || fail "identities changed across the upgrade: $ids_before / $ids_after"
names_after="$(in_ct fqdnd cache list $G | awk 'NR > 1 {print $3}' | sort -u)"
[ "$names_before" = "$names_after" ] || fail "learned names changed across the upgrade: $names_before / $names_after"
echo "upgrade $(basename "$prev_deb") -> $(basename "$deb"): $asked questions asked during it, $lost lost; $(echo "$ids_after" | wc -l) identities and $(echo "$names_after" | wc -l) names kept" >&2

# --- 3. The gateway as a user meets it. -----------------------------------------------------
step="gateway answers"
[ "$(ask +short www.example.test A | sort | tr '\n' ' ')" = "192.0.2.10 192.0.2.11 " ] || fail "allowed answer"
ask other.example.net A | grep -q 'status: REFUSED' || fail "other.example.net (no DNS rule) not refused"
ask ads.example.test A | grep -q 'status: REFUSED' || fail "ads.example.test (denyNames) not refused"

step="ready only once it answers"
# Type=notify: `systemctl restart` returns once the daemon said READY=1, which it says only
# once the proxy listens and the state is restored; the first question, sent at once and
# never retried, must get its answer.
for i in 1 2 3; do
    in_ct systemctl restart fqdnd-gateway
    [ "$(ask +short www.example.test A | head -1)" != "" ] || fail "no answer right after restart $i returned"
done

step="restart keeps identities"
ids_restart="$(in_ct fqdnd identity list $G | awk 'NR > 1 {print $1, $3}' | sort)"
[ "$ids_restart" = "$ids_after" ] || fail "identities changed across restarts: $ids_after / $ids_restart"

step="reload"
in_ct sed -i 's/        - matchName: "api.example.net"/        - matchName: "api.example.net"\n        - matchName: "other.example.net"/' /etc/fqdnd/gateway.yaml
in_ct fqdnd policy check /etc/fqdnd/gateway.yaml >/dev/null
pid="$(in_ct systemctl show -p MainPID --value fqdnd-gateway)"
in_ct systemctl reload fqdnd-gateway
until_ok 30 sh -c "podman exec $name dig +tries=1 +timeout=1 +short @127.0.0.1 other.example.net A | grep -q 203.0.113.8" \
    || fail "the reloaded policy does not allow other.example.net"
[ "$(in_ct systemctl show -p MainPID --value fqdnd-gateway)" = "$pid" ] || fail "reload restarted the daemon"

step="journal"
journal="$(in_ct journalctl --no-pager -u fqdnd-gateway)"
echo "$journal" | grep -q 'listening' || fail "no 'listening' line in journalctl -u fqdnd-gateway"
echo "$journal" | grep -q 'policy reloaded' || fail "no 'policy reloaded' line in journalctl -u fqdnd-gateway"
user="$(in_ct ps -o user= -p "$pid")"
[ "$user" != root ] || fail "the gateway runs as root"

# --- 4. The operator, unprivileged, against the container's etcd. -------------------------
step="operator"
until_ok 30 in_ct env ETCDCTL_API=3 etcdctl --endpoints http://127.0.0.1:2379 endpoint health \
    || in_ct systemd-run --unit=etcd-e2e etcd --data-dir /var/lib/etcd-e2e >/dev/null
until_ok 30 in_ct env ETCDCTL_API=3 etcdctl --endpoints http://127.0.0.1:2379 endpoint health \
    || fail "etcd does not answer"
in_ct cp /etc/fqdnd/cluster.yaml.example /etc/fqdnd/cluster.yaml
in_ct systemctl start fqdnd-operator
leads() { in_ct systemctl show -p StatusText --value fqdnd-operator | grep -q '^leader'; }
until_ok 60 leads || fail "the operator does not lead: $(in_ct systemctl show -p StatusText --value fqdnd-operator)"
opid="$(in_ct systemctl show -p MainPID --value fqdnd-operator)"
ouser="$(in_ct ps -o user= -p "$opid")"
[ "$ouser" != root ] || fail "the operator runs as root"
in_ct grep -q '^CapEff:[[:space:]]*0000000000000000' "/proc/$opid/status" || fail "the operator has capabilities"

# --- 5. The node agent and a systemd unit as an endpoint. ---------------------------------
step="node agent"
in_ct_i sh -c 'cat > /etc/fqdnd/node.yaml' <<'EOF'
apiVersion: fqdnd.io/v1
kind: Node
spec:
  hostProcesses: true
  stateDir: /var/lib/fqdnd-node
  adminSocket: /run/fqdnd/node.sock
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata:
  name: web-egress
spec:
  endpointSelector:
    matchLabels:
      app: web
  egress:
  - toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules:
        dns:
        - matchPattern: "*.example.test"
  - toFQDNs:
    - matchPattern: "*.example.test"
    toPorts:
    - ports: [{port: "443", protocol: TCP}]
EOF
in_ct systemctl start fqdnd-node
# Two web servers, www.example.test's and api.example.net's addresses, in a network namespace
# behind a veth pair: not addresses of the node (those carry the host identity).
in_ct sh -e -c '
    ip netns add ext
    ip link add fq0 type veth peer name fq1 netns ext
    ip addr add 198.51.100.253/30 dev fq0
    ip link set fq0 up
    ip -n ext addr add 198.51.100.254/30 dev fq1
    ip -n ext link set fq1 up
    ip -n ext link set lo up
    ip -n ext addr add 192.0.2.10/32 dev lo
    ip -n ext addr add 203.0.113.7/32 dev lo
    ip -n ext route add default via 198.51.100.253
    ip route add 192.0.2.10/32 via 198.51.100.254
    ip route add 203.0.113.7/32 via 198.51.100.254'
in_ct systemd-run --unit=listen-www ip netns exec ext socat TCP-LISTEN:443,bind=192.0.2.10,fork,reuseaddr SYSTEM:true >/dev/null
in_ct systemd-run --unit=listen-api ip netns exec ext socat TCP-LISTEN:443,bind=203.0.113.7,fork,reuseaddr SYSTEM:true >/dev/null
# The workload: a service that resolves and connects once a second and writes what it got.
in_ct_i sh -c 'cat > /usr/local/bin/web-probe' <<'EOF'
#!/bin/bash
while true; do
    www=$(dig +tries=1 +timeout=1 +short @127.0.0.1 www.example.test A | sort | head -1)
    api=$(dig +tries=1 +timeout=1 @127.0.0.1 api.example.net A | sed -n 's/.*status: \([A-Z]*\).*/\1/p')
    tcp() { timeout 2 bash -c "exec 3<>/dev/tcp/$1/443" 2>/dev/null && echo open || echo closed; }
    echo "$INVOCATION_ID www=$www api=$api www443=$(tcp 192.0.2.10) api443=$(tcp 203.0.113.7)" > /run/web-probe.tmp
    mv /run/web-probe.tmp /run/web-probe
    sleep 0.5
done
EOF
in_ct chmod 0755 /usr/local/bin/web-probe
in_ct sh -c 'printf "[Service]\nExecStart=/usr/local/bin/web-probe\n" > /etc/systemd/system/web.service'
in_ct systemctl daemon-reload
in_ct systemctl start web
probe() { { in_ct cat /run/web-probe 2>/dev/null || true; } | cut -d' ' -f2-; }
until_ok 30 sh -c "[ \"\$(podman exec $name cat /run/web-probe 2>/dev/null | cut -d' ' -f2-)\" = 'www=192.0.2.10 api=NOERROR www443=open api443=open' ]" \
    || fail "before it is an endpoint the workload should reach both: $(probe)"
in_ct fqdnd endpoint add --id 7 --name web --unit web.service --label app=web >/dev/null
enforced() {
    local line
    line="$(podman exec "$name" cat /run/web-probe 2>/dev/null)"
    [ "${line#* }" = "www=192.0.2.10 api=REFUSED www443=open api443=closed" ] && [ "${line%% *}" = "$1" ]
}
inv="$(in_ct systemctl show -p InvocationID --value web)"
until_ok 30 enforced "$inv" || fail "web.service is not enforced: $(probe)"
step="a restarted unit stays enforced"
in_ct systemctl restart web
inv2="$(in_ct systemctl show -p InvocationID --value web)"
until_ok 30 enforced "$inv2" || fail "web.service is not enforced after its restart: $(probe)"
step="a restarted agent keeps the endpoint"
in_ct systemctl restart fqdnd-node
in_ct fqdnd endpoint list | grep -q 'cgroup:web.service' || fail "the agent lost the endpoint: $(in_ct fqdnd endpoint list)"
sleep 2
until_ok 30 enforced "$inv2" || fail "web.service is not enforced after the agent restarted: $(probe)"

# --- systemd-analyze security. --------------------------------------------------------------
step="systemd-analyze security"
for u in fqdnd-gateway fqdnd-node fqdnd-operator; do
    in_ct systemd-analyze security "$u.service" --no-pager | tail -1 >&2
done

# --- 6. Remove and purge. ------------------------------------------------------------------
step="remove"
in_ct systemctl stop web listen-www listen-api
in_ct env DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq fqdnd >/dev/null
! in_ct test -e /usr/bin/fqdnd || fail "/usr/bin/fqdnd still there"
! in_ct pgrep -x fqdnd >/dev/null || fail "an fqdnd process still runs"
! in_ct test -e /sys/fs/bpf/fqdnd/v3 || fail "the node's pins are still there (prerm unloads them)"
in_ct test -f /etc/fqdnd/gateway.yaml || fail "remove took the configuration (conffiles stay)"
in_ct test -d /var/lib/fqdnd-gateway || fail "remove took the gateway's state"
in_ct test -d /var/lib/fqdnd-node || fail "remove took the node's state"
step="purge"
in_ct env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq fqdnd >/dev/null
for p in /etc/fqdnd/gateway.yaml /etc/fqdnd/node.yaml.example /etc/fqdnd/cluster.yaml.example \
    /var/lib/fqdnd-gateway /var/lib/private/fqdnd-gateway /var/lib/fqdnd-node; do
    ! in_ct test -e "$p" || fail "purge left $p"
done
# What the administrator wrote is not the package's: dpkg leaves it (and so its directory).
in_ct test -f /etc/fqdnd/node.yaml || fail "purge removed the administrator's /etc/fqdnd/node.yaml"
in_ct dpkg -s fqdnd >/dev/null 2>&1 && fail "dpkg still knows fqdnd"

echo "package e2e: $((SECONDS - t0)) s; upgrade: $asked questions, $lost lost" >&2
echo "package e2e: ok"
