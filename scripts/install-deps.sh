#!/usr/bin/env bash
# Installs the system packages the build and the test suite need, if they are missing:
# clang-19 + libbpf-dev (to rebuild and check the eBPF object), iproute2 (the netns tests),
# tshark (tests/record.rs reads the recordings with Wireshark's reader).
# Needs root and the Debian package mirror; does nothing when everything is there.
set -euo pipefail
missing=()
command -v clang-19 >/dev/null || missing+=(clang-19)
[ -e /usr/include/bpf/bpf_helpers.h ] || missing+=(libbpf-dev)
command -v ip >/dev/null || missing+=(iproute2)
command -v tshark >/dev/null || missing+=(tshark)
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
