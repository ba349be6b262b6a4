/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fqdnd_maps.h — the single source of truth for the layout of every map key, map value and
 * event shared between the eBPF programs (bpf/ directory) and the Rust loader (src/sys.rs).
 *
 * Rules:
 *  - every struct has explicit padding; no implicit holes, no trailing padding;
 *  - addresses and L4 ports in *keys of conntrack and ipcache* are in network byte order
 *    (as on the wire); everything else (identity, endpoint id, policy dport) is host order;
 *  - any change here bumps FQDND_MAPS_ABI_VERSION, which names the bpffs pin directory
 *    (/sys/fs/bpf/fqdnd/v<N>/), because aya reuses a pinned map without checking its layout —
 *    except two compatible kinds: a new map, and meaning given to padding that was always
 *    written as zero, where zero keeps the old meaning (the load balancer's fields in
 *    struct fqdnd_ct_value were added that way);
 *  - src/sys.rs mirrors each struct with #[repr(C)] and its tests assert size and offsets.
 */
#ifndef FQDND_MAPS_H
#define FQDND_MAPS_H

#include <linux/types.h>

#define FQDND_MAPS_ABI_VERSION 3

/* Reserved identities (ipcache/src/identity.rs). */
#define FQDND_ID_ANY        0   /* wildcard in policy keys */
#define FQDND_ID_WORLD_IPV4 9
#define FQDND_ID_WORLD_IPV6 10

/* IP protocol numbers (IANA). In policy keys FQDND_PROTO_ANY (0) never appears in the key
 * itself: an entry for every protocol is one whose prefix stops before the protocol byte. */
#define FQDND_PROTO_ANY    0
#define FQDND_PROTO_ICMP   1
#define FQDND_PROTO_TCP    6
#define FQDND_PROTO_UDP    17
#define FQDND_PROTO_ICMPV6 58

/* Map sizes. */
#define FQDND_IPCACHE_V4_MAX 512000
#define FQDND_IPCACHE_V6_MAX 512000
#define FQDND_POLICY_MAX     65536
#define FQDND_ENDPOINTS_MAX  65536
#define FQDND_CT_MAX         262144
#define FQDND_CLIENTS_MAX    65536
/* service entries and backend slots together; also the rev-NAT map's size */
#define FQDND_LB_SERVICES_MAX 65536
#define FQDND_LB_BACKENDS_MAX 65536
#define FQDND_EP_ADDRS_MAX   131072
#define FQDND_FRAGS_MAX      8192
#define FQDND_CGROUPS_MAX    4096
#define FQDND_SOCK_ORIGINS_MAX 16384
#define FQDND_EVENTS_BYTES   (256 * 1024)

/* ipcache: LPM trie, prefix → identity. prefixlen counts bits of addr. */
struct fqdnd_ipcache_key4 {
	__u32 prefixlen;
	__u8 addr[4];      /* network order */
};                         /* 8 bytes */

struct fqdnd_ipcache_key6 {
	__u32 prefixlen;
	__u8 addr[16];     /* network order */
};                         /* 20 bytes */

struct fqdnd_ipcache_value {
	__u32 identity;
};                         /* 4 bytes */

/* Endpoint lookup: ifindex of the host-side veth (__u32) → endpoint (fqdnd_endpoints), and
 * source prefix → endpoint for interfaces flagged BY_SOURCE (fqdnd_clients4/6, LPM tries
 * keyed like the ipcache: struct fqdnd_ipcache_key4/6 holding the *source* prefix). */
#define FQDND_EP_ENFORCE_EGRESS 0x1 /* default deny for this endpoint's egress; on a
				     * BY_SOURCE interface entry: drop sources no prefix holds */
#define FQDND_EP_REDIRECT_DNS   0x2 /* UDP/TCP dport 53 goes to the DNS proxy (bpf_sk_assign) */
#define FQDND_EP_BY_SOURCE      0x4 /* interface entry only: the endpoint (id + flags) is the
				     * fqdnd_clients4/6 entry of the packet's source address */
#define FQDND_EP_CHECK_SOURCE   0x8 /* a packet whose source is not one of the interface's
				     * addresses (fqdnd_ep_addrs) is dropped: FQDND_DROP_SPOOFED */
#define FQDND_EP_ENFORCE_INGRESS 0x10 /* the endpoint's ingress (fqdnd_to_ep) goes through its
				       * ingress policy entries; a flag always zero before (v3) */
#define FQDND_EP_DNS_ONLY       0x20 /* interface entry only (with BY_SOURCE): a bridge whose
				      * ports are endpoints judged at their port; its ingress only
				      * redoes the DNS redirect of the sources whose client entry has
				      * REDIRECT_DNS (the bridge does not carry a port's socket
				      * assignment up to the IP layer); its egress does nothing */
struct fqdnd_endpoint_value {
	__u16 endpoint;    /* EndpointId */
	__u8 flags;        /* FQDND_EP_* */
	__u8 pad;
};                         /* 4 bytes */

/* The DNS proxy's listening sockets (array map fqdnd_dns_proxy, one entry, key 0). The
 * programs look the listener up with this address and port as the destination and a zero
 * source, so addr is what the socket is bound to: 0.0.0.0 / :: for a wildcard listener,
 * 127.0.0.1 / ::1 (or any local address) for a bound one. Port 0 = no proxy for that family
 * (DNS from redirected endpoints is then dropped: FQDND_DROP_NO_PROXY). The same port serves
 * UDP and TCP. */
struct fqdnd_dns_proxy {
	__u8 addr4[4];     /* network order */
	__u16 port4;       /* network order */
	__u16 pad4;
	__u8 addr6[16];    /* network order */
	__u16 port6;       /* network order */
	__u16 pad6;
};                         /* 28 bytes */

/* skb->mark of a packet assigned to the proxy: the policy route
 * `ip rule add fwmark 0x200/0xf00 lookup 2004` + `ip route add local 0.0.0.0/0 dev lo table 2004`
 * (and IPv6) delivers it locally instead of forwarding it (same values as Cilium). */
#define FQDND_MARK_TO_PROXY 0x200
#define FQDND_MARK_MASK     0xf00
#define FQDND_PROXY_TABLE   2004

/* Source validation (interfaces flagged CHECK_SOURCE): hash of (ifindex, address) → the
 * endpoint that owns the address on that interface. */
struct fqdnd_ep_addr_key {
	__u32 ifindex;
	__u8 family;       /* 4 or 6 */
	__u8 pad[3];
	__u8 addr[16];     /* network order; IPv4 in the first 4 bytes, the rest zero */
};                         /* 24 bytes */

struct fqdnd_ep_addr_value {
	__u16 endpoint;
	__u16 pad;
};                         /* 4 bytes */

/* Per-endpoint policy: an LPM trie over (identity, endpoint, proto, dport), the data
 * after `prefixlen` compared bit by bit from `identity` on. identity and endpoint are always
 * matched in full (identity 0 = any destination, a separate lookup); an entry for every
 * protocol and port has prefixlen FQDND_POLICY_PREFIX_ANY_PROTO; one protocol with every
 * port FQDND_POLICY_PREFIX_PROTO; a port range is split by userspace into port prefixes,
 * FQDND_POLICY_PREFIX_PROTO + 0..16 bits of dport (network order, so the prefix is the high
 * bits); ICMP/ICMPv6 entries (`icmps`) hold the ICMP type as dport (network order) with the full
 * prefix, and ICMP packets are looked up with their type as dport. Lookups use
 * FQDND_POLICY_PREFIX_FULL. */
struct fqdnd_policy_key {
	__u32 prefixlen;
	__u32 identity;    /* host order */
	__u16 endpoint;    /* host order */
	__u8 proto;        /* IANA number, never 0 */
	__u8 pad;          /* 0 (matched with proto) */
	__u16 dport;       /* network order */
	__u16 pad2;        /* 0, beyond every prefix */
};                         /* 16 bytes */
#define FQDND_POLICY_PREFIX_ANY_PROTO 48 /* identity + endpoint */
#define FQDND_POLICY_PREFIX_PROTO     64 /* + proto + pad */
#define FQDND_POLICY_PREFIX_FULL      80 /* + dport */

/* Ingress entries (the endpoint's ingress: the peer identity is the packet's *source*) live in
 * the same map with this bit set in `identity` (identities never reach it: reserved < 256,
 * cluster < 2^16, node-local < 2^25); identity FQDND_ID_ANY | FQDND_POLICY_ID_INGRESS is
 * "any source". A meaning given to a bit always zero before. */
#define FQDND_POLICY_ID_INGRESS 0x80000000

/* The value: allow or deny. The programs look the peer's identity up first and "any identity"
 * only when that finds nothing; the entry found decides. Userspace writes, for every allow a
 * deny overlaps (of the same identity or of any identity), a deny entry for the overlap under
 * the allow's identity (at least as long a prefix), so a deny always wins (Cilium's deny
 * policies). DENY is a meaning given to a bit always zero before. */
#define FQDND_POLICY_ALLOW 0x1
#define FQDND_POLICY_DENY 0x2
struct fqdnd_policy_value {
	__u32 flags;       /* FQDND_POLICY_* */
};                         /* 4 bytes */

/* Conntrack: LRU hash keyed by the 5-tuple in the direction of the flow's first packet.
 * IPv4 addresses use the first 4 bytes of saddr/daddr, the rest zero. ICMP/ICMPv6 echo: the
 * identifier is sport of the request's tuple (dport 0), so a reply's tuple (sport 0, dport
 * id) is the request's reversed. `zone` keeps the flows of host processes (the cgroup socket
 * programs, FQDND_CT_ZONE_SOCKET) apart from the flows the interface programs see (0), so a
 * host process talking to an interface endpoint has one entry on each side. */
#define FQDND_CT_ZONE_INTERFACE 0
#define FQDND_CT_ZONE_SOCKET    1
struct fqdnd_ct_key {
	__u8 saddr[16];    /* network order */
	__u8 daddr[16];    /* network order */
	__u16 sport;       /* network order */
	__u16 dport;       /* network order */
	__u8 proto;
	__u8 family;       /* 4 or 6 */
	__u8 zone;         /* FQDND_CT_ZONE_* (was padding, always 0: the interface zone) */
	__u8 pad;
};                         /* 40 bytes */

#define FQDND_CT_EGRESS  0x1 /* opened by the endpoint (allowed by policy) */
#define FQDND_CT_INGRESS 0x2 /* opened towards the endpoint: its replies pass */
#define FQDND_CT_DNS     0x40 /* a DNS query redirected to the proxy (endpoints under ingress
			       * policy only): the proxy's answers, which come from the original
			       * resolver's address and port, pass as its replies */
/* TCP state, from the flags seen in either direction ("fwd" = the key's direction). */
#define FQDND_CT_TCP_SEEN_NON_SYN 0x4  /* a packet without SYN: established */
#define FQDND_CT_TCP_FIN_FWD      0x8  /* FIN in the key's direction */
#define FQDND_CT_TCP_FIN_REV      0x10 /* FIN in the other direction */
#define FQDND_CT_TCP_RST          0x20 /* RST in either direction */
#define FQDND_CT_TCP_STATE (FQDND_CT_TCP_SEEN_NON_SYN | FQDND_CT_TCP_FIN_FWD | \
			    FQDND_CT_TCP_FIN_REV | FQDND_CT_TCP_RST)
/* An entry's lifetime after each packet: TCP closing (RST, or FIN both ways), TCP
 * established (a packet without SYN seen), TCP SYN (only SYNs so far), other protocols. An
 * entry past `expires_ns` is dead: the programs treat it as absent (a new flow) and the
 * daemon's GC deletes it. */
/* A flow the endpoint opened to a service VIP has two entries: one keyed by the tuple the
 * endpoint sends (client → VIP) with `backend` set (its packets are translated to that
 * backend as long as it exists), and one keyed by the translated tuple (client → backend)
 * with `rev_nat` set (the backend's replies get the VIP back as their source). Both carry
 * rev_nat; 0 in either field = no translation (the value entries had before the LB). */
struct fqdnd_ct_value {
	__u64 created_ns;  /* bpf_ktime_get_ns() */
	__u64 last_seen_ns;
	__u64 expires_ns;  /* last packet + the lifetime of the entry's state */
	__u32 flags;       /* FQDND_CT_* */
	__u16 rev_nat;     /* rev-NAT index of the service, 0 = none */
	__u16 backend;     /* backend id the flow is translated to, 0 = none */
};                         /* 32 bytes */

/* Datapath settings (array map fqdnd_settings, one entry, key 0), written by the daemon at
 * start. A zero field means its default (Cilium's). */
struct fqdnd_settings {
	__u64 ct_tcp_syn_ns;
	__u64 ct_tcp_established_ns;
	__u64 ct_tcp_closing_ns;
	__u64 ct_other_ns;
};                         /* 32 bytes */
#define FQDND_CT_TCP_SYN_DEFAULT_NS         (60ULL * 1000000000ULL)
#define FQDND_CT_TCP_ESTABLISHED_DEFAULT_NS (21600ULL * 1000000000ULL)
#define FQDND_CT_TCP_CLOSING_DEFAULT_NS     (10ULL * 1000000000ULL)
#define FQDND_CT_OTHER_DEFAULT_NS           (60ULL * 1000000000ULL)

/* Fragments (LRU hash fqdnd_frags): the first fragment of a datagram (IPv4 offset 0 with MF,
 * or an IPv6 fragment header with offset 0) is classified like any packet; when it passes,
 * its entry lets the later fragments (which carry no ports) follow it for
 * FQDND_FRAG_LIFETIME_NS. A first fragment that is dropped removes the entry. */
struct fqdnd_frag_key {
	__u8 saddr[16];    /* network order (IPv4 in the first 4 bytes) */
	__u8 daddr[16];
	__u32 id;          /* IPv4 identification (16 bits) or IPv6 fragment id, network order */
	__u8 proto;        /* the upper-layer protocol */
	__u8 family;       /* 4 or 6 */
	__u8 pad[2];
};                         /* 40 bytes */

struct fqdnd_frag_value {
	__u64 created_ns;
	__u16 sport;       /* the datagram's ports, network order (for events) */
	__u16 dport;
	__u16 backend;     /* from_ep: later fragments go to this backend (translated datagram) */
	__u16 rev_nat;     /* to_ep: later fragments get this service's VIP as their source */
};                         /* 16 bytes */
#define FQDND_FRAG_LIFETIME_NS (30ULL * 1000000000ULL) /* Linux's ipfrag_time */

/* IPv6 extension headers walked before the upper-layer header (hop-by-hop, routing,
 * destination options, fragment, authentication); more is FQDND_DROP_EXT_HEADERS. */
#define FQDND_IPV6_MAX_EXT_HEADERS 8

/* Service load balancing (the LB v2 design: cilium/cilium#7106). A service is
 * (VIP, port, protocol); its slot 0 entry holds the backend count and the rev-NAT index,
 * slots 1..=count each hold one backend id — no holes, no duplicates: removing a backend
 * moves the last slot into its place. A new flow takes slot (flow hash % count) + 1.
 * Backend ids and rev-NAT indexes are allocated by userspace (lb/ crate), never reused
 * while an entry holds them, and survive restarts (checkpoint). */
struct fqdnd_lb_svc_key {
	__u8 addr[16];     /* VIP, network order (IPv4 in the first 4 bytes) */
	__u16 dport;       /* network order */
	__u16 slot;        /* host order; 0 = the service entry */
	__u8 proto;        /* FQDND_PROTO_TCP or FQDND_PROTO_UDP */
	__u8 family;       /* 4 or 6 */
	__u8 pad[2];
};                         /* 24 bytes */

struct fqdnd_lb_svc_value {
	__u16 count;       /* slot 0: number of backends (0: the VIP drops new flows) */
	__u16 backend;     /* slot >= 1: backend id */
	__u16 rev_nat;     /* the service's rev-NAT index (every slot) */
	__u16 pad;
};                         /* 8 bytes */

/* Backends: backend id (__u16, never 0) → address. */
struct fqdnd_lb_backend {
	__u8 addr[16];     /* network order (IPv4 in the first 4 bytes) */
	__u16 port;        /* network order */
	__u8 proto;
	__u8 family;
};                         /* 20 bytes */

/* Reverse NAT: rev-NAT index (__u16, never 0) → the service's VIP and port. */
struct fqdnd_lb_revnat {
	__u8 addr[16];     /* network order */
	__u16 port;        /* network order */
	__u8 family;
	__u8 pad;
};                         /* 20 bytes */

/* Ring-buffer event for every drop. For ICMP/ICMPv6 drops sport is the ICMP type and dport
 * its code. */
#define FQDND_DROP_POLICY    1 /* no allow entry matched */
#define FQDND_DROP_UNHANDLED 2 /* enforcing endpoint, an IP protocol other than TCP, UDP, ICMP */
#define FQDND_DROP_NO_PROXY  3 /* DNS from a redirected endpoint and no proxy socket to assign */
#define FQDND_DROP_NO_BACKEND 4 /* a new flow to a service VIP that has no backend */
#define FQDND_DROP_SPOOFED   5 /* source address not one of the interface's (CHECK_SOURCE) */
#define FQDND_DROP_FRAGMENT  6 /* a later fragment whose first fragment did not pass (or was
				* not seen) */
#define FQDND_DROP_ICMP      7 /* enforcing endpoint: an ICMP type fqdnd does not pass, an
				* error about no tracked flow, or an echo reply to no request */
#define FQDND_DROP_EXT_HEADERS 8 /* more IPv6 extension headers than the walk allows */
#define FQDND_DROP_DNS_BYPASS 9 /* a host process's DNS (UDP/TCP port 53) that the socket hooks
				 * did not send to the proxy (say a socket connected before its
				 * cgroup became an endpoint): DNS never goes past the proxy */
/* Where the dropped packet was seen (fqdnd_drop_event.source). */
#define FQDND_SOURCE_INTERFACE 0 /* an interface program (ifindex says which) */
#define FQDND_SOURCE_SOCKET    1 /* a cgroup socket program: a host process's socket */
struct fqdnd_drop_event {
	__u64 ts_ns;
	__u32 ifindex;
	__u32 identity;    /* destination identity (0 if not looked up) */
	__u16 endpoint;
	__u16 sport;       /* host order */
	__u16 dport;       /* host order */
	__u8 proto;
	__u8 family;
	__u8 reason;       /* FQDND_DROP_* */
	__u8 source;       /* FQDND_SOURCE_* (was padding, always 0) */
	__u8 pad[6];
	__u8 saddr[16];
	__u8 daddr[16];
};                         /* 64 bytes */

/* ---- host processes as endpoints: cgroup v2 socket programs ----
 *
 * Attached once at the root of the cgroup v2 hierarchy, they run for every socket of the
 * host. The endpoint of a cgroup is the entry of the deepest cgroup on the path from the root
 * to it (itself included) in fqdnd_cgroups, so cgroups created later under an endpoint's
 * cgroup belong to it too. The skb programs take a socket's cgroup (the one it was created
 * in); the sock_addr programs, which cannot read it, the calling process's. */

/* fqdnd_cgroups: hash, cgroup v2 id (__u64: the cgroup directory's inode number) → struct
 * fqdnd_endpoint_value (flags FQDND_EP_ENFORCE_EGRESS, FQDND_EP_ENFORCE_INGRESS,
 * FQDND_EP_REDIRECT_DNS). */
#define FQDND_CGROUP_MAX_DEPTH 32 /* levels below the root walked; deeper cgroups are covered
				   * through their ancestors */

/* What fqdnd_connect4/6 and fqdnd_sendmsg4/6 record about a DNS message they sent to the
 * proxy instead of its destination: the destination the socket asked for and its endpoint.
 * fqdnd_sock_dns: LRU hash, socket cookie (__u64) → the socket's latest record;
 * fqdnd_recvmsg4/6 and fqdnd_getpeername4/6 give the socket this address back for the
 * proxy's.
 * fqdnd_dns_origins: LRU hash, struct fqdnd_origin_key → the record of the socket that sent
 * a packet from that address to the proxy (written by fqdnd_sock_egress for each such
 * packet): how the proxy learns a query's original destination and endpoint. */
struct fqdnd_sock_origin {
	__u8 addr[16];     /* network order; IPv4 in the first 4 bytes; an IPv6 socket's
			    * v4-mapped address stays v4-mapped (family 6) */
	__u16 port;        /* network order */
	__u16 endpoint;
	__u8 family;       /* 4 or 6: the socket's family */
	__u8 proto;        /* FQDND_PROTO_UDP or FQDND_PROTO_TCP */
	__u8 pad[2];
};                         /* 24 bytes */

struct fqdnd_origin_key {
	__u8 addr[16];     /* the client socket's source address as the proxy sees it (IPv4 in
			    * the first 4 bytes, the rest zero), network order */
	__u16 port;        /* its source port, network order */
	__u8 proto;
	__u8 family;       /* 4 or 6: the packet's family */
};                         /* 20 bytes */

/* fqdnd_sock_cfg (array, one entry, key 0), written by the daemon. */
struct fqdnd_sock_cfg {
	__u64 netns_cookie; /* the proxy's network namespace: sockets of others are left alone
			     * by the redirect (0 = every namespace) */
	__u32 endpoints;    /* entries in fqdnd_cgroups: while 0 every socket program returns
			     * at once (the programs stay attached without cgroup endpoints) */
	__u32 pad;
};                          /* 16 bytes */

#endif /* FQDND_MAPS_H */
