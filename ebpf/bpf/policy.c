// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * fqdnd's eBPF object (ebpf/obj/policy.o, built by ebpf/build.rs): every program fqdnd loads,
 * over one set of pinned maps. This file is its one compilation unit; the code is in
 *
 *  bpf_tc.c       the tc programs of interface endpoints: fqdnd_from_ep (the endpoint's
 *                 egress) and fqdnd_to_ep (its ingress)
 *  bpf_sock.c     the cgroup v2 socket programs of host processes: the DNS redirect of their
 *                 sockets (connect, sendmsg, recvmsg, getpeername) and their packets' egress
 *                 and ingress (cgroup_skb)
 *  lib/maps.h       the maps (layouts: include/fqdnd_maps.h)
 *  lib/parse.h      a packet's tuple: IPv4/IPv6, extension headers, TCP flags, ICMP, fragments
 *  lib/conntrack.h  conntrack entries, TCP state, lifetimes
 *  lib/policy.h     identities (ipcache) and the endpoint's policy entries
 *  lib/events.h     drop events (ring buffer)
 *  lib/endpoints.h  client prefixes of by-source interfaces, source validation
 *  lib/redirect.h   the tc programs' DNS redirect to the proxy's socket
 *  lib/lb.h         service load balancing (VIP to backend and back)
 *  lib/frag.h       later fragments following their first
 *  lib/verdict.h    egress() and ingress(): the verdicts both kinds of program share
 *
 * One unit, so one object: the loader loads a single ELF file and the programs share the
 * map definitions. Each file includes what it uses (the headers have include guards), so
 * each also compiles alone (`clang -fsyntax-only`); this file includes them in dependency
 * order.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/conntrack.h"
#include "lib/policy.h"
#include "lib/events.h"
#include "lib/endpoints.h"
#include "lib/redirect.h"
#include "lib/lb.h"
#include "lib/frag.h"
#include "lib/verdict.h"

#include "bpf_tc.c"
#include "bpf_sock.c"
