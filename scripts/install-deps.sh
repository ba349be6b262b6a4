#!/usr/bin/env bash
# Installs the system packages the build and the test suite need, if they are missing:
# clang-19 + libbpf-dev (to rebuild and check the eBPF object), iproute2 (the netns tests),
# protobuf-compiler + libprotobuf-dev (`protoc` and the well-known .proto files: the
# etcd-client crate compiles etcd's protos when it builds),
# etcd-server + etcd-client (the cluster tests run a real 3-member etcd; `etcdctl` inspects it),
# openssl (the etcd TLS test makes its certificates),
# tshark (tests/record.rs reads the recordings with Wireshark's reader),
# keepalived + nsd (tests/gateway_ha.rs and benchmarks/gateway-failover.sh: a VRRP pair moving
# the gateways' virtual addresses, an authoritative server behind them),
# chromium + chromium-driver + dnsutils (scripts/dashboard-e2e.sh: Debian's headless Chromium,
# driven over WebDriver from Python's standard library, looks at the dashboard; dig makes traffic).
# mmdebstrap + podman + runc + lintian (scripts/package-e2e.sh: a booted Debian in a container
# installs the package; lintian checks it).
# knot-dnsutils + dnsperf + unbound + dnsdist (tests/encrypted_dns.rs: kdig +tls/+https and
# dnsperf -m dot/doh are real DoT/DoH clients; Unbound serves DoT and dnsdist DoH as upstreams).
# Needs root and the Debian package mirror; does nothing when everything is there.
set -euo pipefail
missing=()
command -v clang-19 >/dev/null || missing+=(clang-19)
[ -e /usr/include/bpf/bpf_helpers.h ] || missing+=(libbpf-dev)
command -v ip >/dev/null || missing+=(iproute2)
command -v protoc >/dev/null || missing+=(protobuf-compiler)
[ -e /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
command -v openssl >/dev/null || missing+=(openssl)
command -v tshark >/dev/null || missing+=(tshark)
command -v keepalived >/dev/null || missing+=(keepalived)
command -v nsd >/dev/null || missing+=(nsd)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
command -v dig >/dev/null || missing+=(dnsutils)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v lintian >/dev/null || missing+=(lintian)
command -v kdig >/dev/null || missing+=(knot-dnsutils)
command -v dnsperf >/dev/null || missing+=(dnsperf)
command -v unbound >/dev/null || missing+=(unbound)
command -v dnsdist >/dev/null || missing+=(dnsdist)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps.sh: missing ${missing[*]}; run as root or: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "install-deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
