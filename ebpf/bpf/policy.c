// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * fqdnd egress policy: tc programs on the host side of an endpoint's veth, and (at the end of
 * this file) the cgroup v2 socket programs of host processes, which share the maps, the
 * parser, conntrack and the policy lookups.
 *
 *  fqdnd_from_ep  host-side veth *ingress* = the endpoint's egress. Source validation first
 *                 (interfaces flagged CHECK_SOURCE: a source that is not one of the
 *                 interface's addresses is dropped), then the DNS redirect (endpoints flagged
 *                 REDIRECT_DNS: UDP/TCP dport 53 is assigned to the DNS proxy's socket and
 *                 marked for local delivery; no policy, no conntrack), then conntrack and
 *                 policy: every packet of the direction that opened a flow — new or
 *                 established — is checked against the endpoint's policy map (LPM over
 *                 identity, protocol, port prefix) and its destination's identity now
 *                 (ipcache LPM, world when unknown); only replies to flows opened towards
 *                 the endpoint and ICMP errors about tracked flows skip it. Deny drops and
 *                 emits a ring-buffer event. Endpoints not flagged enforcing pass (their
 *                 flows are still tracked).
 *                 Conntrack keeps TCP state (SYN, established, closing after FIN both ways
 *                 or RST) and an expiry per entry (lifetimes in fqdnd_settings).
 *                 ICMP/ICMPv6: echo is a flow like any other (identifier as port; only
 *                 rules without ports allow it); errors pass when the packet they embed
 *                 belongs to a tracked flow; neighbour discovery passes; the rest drops.
 *                 Fragments: the first is classified, later ones follow it (fqdnd_frags).
 *                 IPv6 extension headers are walked, at most FQDND_IPV6_MAX_EXT_HEADERS.
 *                 New flows to a service VIP (fqdnd_lb_svc) are translated to a backend
 *                 first and policy is checked against the backend; conntrack keeps the
 *                 backend for the flow's later packets, which are checked against it too.
 *  fqdnd_to_ep    host-side veth *egress* = the endpoint's ingress. Replies in flows the
 *                 endpoint opened pass (TCP state tracked, a service backend's replies get
 *                 the VIP back as their source); endpoints flagged ENFORCE_INGRESS check every
 *                 other packet — new and established inbound flows — against their ingress
 *                 entries (the source's identity from the ipcache); the proxy's DNS answers
 *                 pass as replies to the redirected query's conntrack entry. Allowed inbound
 *                 flows are recorded so the endpoint's replies pass at its egress.
 *                 Deny entries win over allows in both directions (see fqdnd_maps.h).
 *
 * The endpoint is found by the skb's ifindex (fqdnd_endpoints map); an unknown ifindex
 * passes untouched. An interface entry flagged BY_SOURCE (gateway mode: one LAN interface,
 * many client groups) takes the endpoint from the LPM of the packet's source address
 * (fqdnd_clients4/6; the destination's for fqdnd_to_ep). Map layouts: include/fqdnd_maps.h.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "fqdnd_maps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct fqdnd_ipcache_key4);
	__type(value, struct fqdnd_ipcache_value);
	__uint(max_entries, FQDND_IPCACHE_V4_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_ipc4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct fqdnd_ipcache_key6);
	__type(value, struct fqdnd_ipcache_value);
	__uint(max_entries, FQDND_IPCACHE_V6_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_ipc6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* ifindex */
	__type(value, struct fqdnd_endpoint_value);
	__uint(max_entries, FQDND_ENDPOINTS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct fqdnd_ipcache_key4); /* source prefix */
	__type(value, struct fqdnd_endpoint_value);
	__uint(max_entries, FQDND_CLIENTS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_clients4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct fqdnd_ipcache_key6); /* source prefix */
	__type(value, struct fqdnd_endpoint_value);
	__uint(max_entries, FQDND_CLIENTS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_clients6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct fqdnd_dns_proxy);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_dns_proxy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct fqdnd_policy_key);
	__type(value, struct fqdnd_policy_value);
	__uint(max_entries, FQDND_POLICY_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_policy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct fqdnd_ep_addr_key);
	__type(value, struct fqdnd_ep_addr_value);
	__uint(max_entries, FQDND_EP_ADDRS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_ep_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct fqdnd_frag_key);
	__type(value, struct fqdnd_frag_value);
	__uint(max_entries, FQDND_FRAGS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_frags SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct fqdnd_settings);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_settings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct fqdnd_ct_key);
	__type(value, struct fqdnd_ct_value);
	__uint(max_entries, FQDND_CT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct fqdnd_lb_svc_key);
	__type(value, struct fqdnd_lb_svc_value);
	__uint(max_entries, FQDND_LB_SERVICES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_lb_svc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u16); /* backend id */
	__type(value, struct fqdnd_lb_backend);
	__uint(max_entries, FQDND_LB_BACKENDS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_lb_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u16); /* rev-NAT index */
	__type(value, struct fqdnd_lb_revnat);
	__uint(max_entries, FQDND_LB_SERVICES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_lb_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, FQDND_EVENTS_BYTES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_events SEC(".maps");

/* The cgroup socket programs' maps (include/fqdnd_maps.h says what each holds). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64); /* cgroup v2 id */
	__type(value, struct fqdnd_endpoint_value);
	__uint(max_entries, FQDND_CGROUPS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, __u64); /* socket cookie */
	__type(value, struct fqdnd_sock_origin);
	__uint(max_entries, FQDND_SOCK_ORIGINS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_sock_dns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct fqdnd_origin_key);
	__type(value, struct fqdnd_sock_origin);
	__uint(max_entries, FQDND_SOCK_ORIGINS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_dns_origins SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct fqdnd_sock_cfg);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_sock_cfg SEC(".maps");

/* ---- parsing ---- */

#define IP_MF     0x2000
#define IP_OFFSET 0x1FFF
#define TH_FIN 0x01
#define TH_SYN 0x02
#define TH_RST 0x04
#define TH_ACK 0x10

enum parse_result {
	PARSE_OK = 0,          /* TCP, UDP, ICMP or ICMPv6 with its tuple in p->key */
	PARSE_NOT_IP,          /* ARP and friends: pass */
	PARSE_ALWAYS_PASS,     /* IPv6 neighbour discovery, link-local multicast */
	PARSE_LATER_FRAGMENT,  /* a fragment after the first: addresses, protocol, id; no ports */
	PARSE_UNHANDLED,       /* another IP protocol, or headers cut short */
	PARSE_EXT_HEADERS,     /* more IPv6 extension headers than FQDND_IPV6_MAX_EXT_HEADERS */
};

enum frag { FRAG_NONE = 0, FRAG_FIRST, FRAG_LATER };

enum icmp_kind {
	ICMP_NONE = 0,         /* not ICMP */
	ICMP_ECHO_REQUEST,     /* key: sport = identifier, dport = 0 */
	ICMP_ECHO_REPLY,       /* key: sport = 0, dport = identifier */
	ICMP_ERROR,            /* destination unreachable, packet too big, time exceeded,
				* parameter problem: about the packet it embeds */
	ICMP_OTHER,
};

/* One packet as the programs see it. */
struct pkt {
	struct fqdnd_ct_key key;
	__u32 l4;          /* offset of the L4 header */
	__u32 frag_id;     /* fragment identification as in the header (IPv4: 16 bits) */
	__u8 frag;         /* enum frag */
	__u8 tcp_flags;
	__u8 icmp;         /* enum icmp_kind */
	__u8 icmp_type;
	__u8 icmp_code;
	__u8 pad[3];
};

static __always_inline int is_icmp(const struct fqdnd_ct_key *key)
{
	return (key->family == 4 && key->proto == IPPROTO_ICMP) ||
	       (key->family == 6 && key->proto == IPPROTO_ICMPV6);
}

/* The L4 header at p->l4: ports (TCP, UDP), TCP flags, the ICMP kind. */
static __always_inline int parse_l4(struct __sk_buff *skb, struct pkt *p)
{
	if (p->key.proto == IPPROTO_TCP) {
		__u8 h[14];

		if (bpf_skb_load_bytes(skb, p->l4, h, sizeof(h)) < 0)
			return PARSE_UNHANDLED;
		__builtin_memcpy(&p->key.sport, &h[0], 2);
		__builtin_memcpy(&p->key.dport, &h[2], 2);
		p->tcp_flags = h[13];
		return PARSE_OK;
	}
	if (p->key.proto == IPPROTO_UDP) {
		__u16 ports[2];

		if (bpf_skb_load_bytes(skb, p->l4, ports, sizeof(ports)) < 0)
			return PARSE_UNHANDLED;
		p->key.sport = ports[0];
		p->key.dport = ports[1];
		return PARSE_OK;
	}
	if (!is_icmp(&p->key))
		return PARSE_UNHANDLED;
	{
		__u8 h[8]; /* type, code, checksum, identifier, sequence */
		__u8 t;
		__u16 id;

		if (bpf_skb_load_bytes(skb, p->l4, h, sizeof(h)) < 0)
			return PARSE_UNHANDLED;
		t = h[0];
		__builtin_memcpy(&id, &h[4], 2);
		p->icmp_type = t;
		p->icmp_code = h[1];
		if (p->key.family == 4) {
			if (t == 8) {
				p->icmp = ICMP_ECHO_REQUEST;
				p->key.sport = id;
			} else if (t == 0) {
				p->icmp = ICMP_ECHO_REPLY;
				p->key.dport = id;
			} else if (t == 3 || t == 11 || t == 12) {
				p->icmp = ICMP_ERROR;
			} else {
				p->icmp = ICMP_OTHER;
			}
			return PARSE_OK;
		}
		/* router/neighbour solicitation/advertisement, redirect */
		if (t >= 133 && t <= 137)
			return PARSE_ALWAYS_PASS;
		if (t == 128) {
			p->icmp = ICMP_ECHO_REQUEST;
			p->key.sport = id;
		} else if (t == 129) {
			p->icmp = ICMP_ECHO_REPLY;
			p->key.dport = id;
		} else if (t >= 1 && t <= 4) {
			p->icmp = ICMP_ERROR;
		} else {
			p->icmp = ICMP_OTHER;
		}
		return PARSE_OK;
	}
}

static __always_inline int ipv6_ext_header(__u8 nh)
{
	return nh == IPPROTO_HOPOPTS || nh == IPPROTO_ROUTING || nh == IPPROTO_DSTOPTS ||
	       nh == IPPROTO_FRAGMENT || nh == IPPROTO_AH;
}

/* Fills p with the tuple of the packet whose IP header starts at `l3` (`h_proto`: its
 * EtherType, network order): addresses, protocol, ports or ICMP identifier, where its L4
 * header starts, and whether it is a fragment. IPv6 extension headers are walked. */
static __always_inline int parse_l3(struct __sk_buff *skb, struct pkt *p, __u32 l3, __u16 h_proto)
{
	if (h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		__u16 fo;

		if (bpf_skb_load_bytes(skb, l3, &ip, sizeof(ip)) < 0)
			return PARSE_UNHANDLED;
		__builtin_memcpy(p->key.saddr, &ip.saddr, 4);
		__builtin_memcpy(p->key.daddr, &ip.daddr, 4);
		p->key.proto = ip.protocol;
		p->key.family = 4;
		/* link-local multicast (224.0.0.0/24: IGMP, ...) never leaves the link */
		if (p->key.daddr[0] == 224 && p->key.daddr[1] == 0 && p->key.daddr[2] == 0)
			return PARSE_ALWAYS_PASS;
		if (ip.ihl < 5)
			return PARSE_UNHANDLED;
		fo = bpf_ntohs(ip.frag_off);
		if (fo & (IP_MF | IP_OFFSET)) {
			p->frag_id = ip.id;
			if (fo & IP_OFFSET) {
				p->frag = FRAG_LATER;
				return PARSE_LATER_FRAGMENT;
			}
			p->frag = FRAG_FIRST;
		}
		p->l4 = l3 + ip.ihl * 4;
		return parse_l4(skb, p);
	}
	if (h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		__u32 off = l3 + sizeof(ip6);
		__u8 nh;
		int i;

		if (bpf_skb_load_bytes(skb, l3, &ip6, sizeof(ip6)) < 0)
			return PARSE_UNHANDLED;
		__builtin_memcpy(p->key.saddr, &ip6.saddr, 16);
		__builtin_memcpy(p->key.daddr, &ip6.daddr, 16);
		p->key.family = 6;
		/* link-local scope multicast (ff02::/16 and friends: MLD reports with their
		 * hop-by-hop header, ND) never leaves the link */
		if (p->key.daddr[0] == 0xff && (p->key.daddr[1] & 0x0f) <= 0x02) {
			p->key.proto = ip6.nexthdr;
			return PARSE_ALWAYS_PASS;
		}
		nh = ip6.nexthdr;
#pragma unroll
		for (i = 0; i < FQDND_IPV6_MAX_EXT_HEADERS; i++) {
			__u8 h[8];

			if (!ipv6_ext_header(nh))
				break;
			if (nh == IPPROTO_FRAGMENT) {
				/* next header, reserved, offset (13 bits) + 2 reserved + M, id */
				__u16 fo;

				if (bpf_skb_load_bytes(skb, off, h, 8) < 0)
					return PARSE_UNHANDLED;
				fo = ((__u16)h[2] << 8) | h[3];
				__builtin_memcpy(&p->frag_id, &h[4], 4);
				nh = h[0];
				off += 8;
				if (fo & 0xfff8) {
					p->key.proto = nh;
					p->frag = FRAG_LATER;
					return PARSE_LATER_FRAGMENT;
				}
				if (fo & 1)
					p->frag = FRAG_FIRST;
				continue;
			}
			if (bpf_skb_load_bytes(skb, off, h, 2) < 0)
				return PARSE_UNHANDLED;
			if (nh == IPPROTO_AH)
				off += ((__u32)h[1] + 2) * 4;
			else
				off += ((__u32)h[1] + 1) * 8;
			nh = h[0];
		}
		p->key.proto = nh;
		if (ipv6_ext_header(nh))
			return PARSE_EXT_HEADERS;
		p->l4 = off;
		return parse_l4(skb, p);
	}
	return PARSE_NOT_IP;
}

/* parse_l3 of a packet that starts with its Ethernet header (the tc programs). */
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	struct ethhdr eth;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return PARSE_NOT_IP;
	return parse_l3(skb, p, ETH_HLEN, eth.h_proto);
}

/* ---- conntrack ---- */

static __always_inline void reverse(const struct fqdnd_ct_key *in, struct fqdnd_ct_key *out)
{
	__builtin_memcpy(out->saddr, in->daddr, 16);
	__builtin_memcpy(out->daddr, in->saddr, 16);
	out->sport = in->dport;
	out->dport = in->sport;
	out->proto = in->proto;
	out->family = in->family;
	out->zone = in->zone;
	out->pad = 0;
}

static __always_inline int tcp_closing(__u32 flags)
{
	return (flags & FQDND_CT_TCP_RST) ||
	       ((flags & FQDND_CT_TCP_FIN_FWD) && (flags & FQDND_CT_TCP_FIN_REV));
}

/* How long an entry in state `flags` lives after a packet (fqdnd_settings, 0 = default). */
static __always_inline __u64 ct_lifetime(__u32 flags, __u8 proto)
{
	struct fqdnd_settings *s;
	__u32 zero = 0;
	__u64 v;

	s = bpf_map_lookup_elem(&fqdnd_settings, &zero);
	if (proto != IPPROTO_TCP) {
		v = s ? s->ct_other_ns : 0;
		return v ? v : FQDND_CT_OTHER_DEFAULT_NS;
	}
	if (tcp_closing(flags)) {
		v = s ? s->ct_tcp_closing_ns : 0;
		return v ? v : FQDND_CT_TCP_CLOSING_DEFAULT_NS;
	}
	if (flags & FQDND_CT_TCP_SEEN_NON_SYN) {
		v = s ? s->ct_tcp_established_ns : 0;
		return v ? v : FQDND_CT_TCP_ESTABLISHED_DEFAULT_NS;
	}
	v = s ? s->ct_tcp_syn_ns : 0;
	return v ? v : FQDND_CT_TCP_SYN_DEFAULT_NS;
}

/* The state bits a TCP packet with `tcp_flags` adds, in the key's direction when `fwd`. */
static __always_inline __u32 tcp_bits(__u8 tcp_flags, int fwd)
{
	__u32 bits = 0;

	if (!(tcp_flags & TH_SYN))
		bits |= FQDND_CT_TCP_SEEN_NON_SYN;
	if (tcp_flags & TH_RST)
		bits |= FQDND_CT_TCP_RST;
	if (tcp_flags & TH_FIN)
		bits |= fwd ? FQDND_CT_TCP_FIN_FWD : FQDND_CT_TCP_FIN_REV;
	return bits;
}

/* The live entry of `key`; NULL when there is none or it is dead (past its lifetime). */
static __always_inline struct fqdnd_ct_value *ct_lookup(const struct fqdnd_ct_key *key, __u64 now)
{
	struct fqdnd_ct_value *v = bpf_map_lookup_elem(&fqdnd_ct, key);

	if (!v || v->expires_ns <= now)
		return NULL;
	return v;
}

/* The live entry of the reverse tuple when it carries `want` (the packet is a reply in that
 * flow); NULL otherwise. */
static __always_inline struct fqdnd_ct_value *ct_reply(const struct fqdnd_ct_key *key, __u32 want,
						      __u64 now)
{
	struct fqdnd_ct_key rkey;
	struct fqdnd_ct_value *v;

	reverse(key, &rkey);
	v = ct_lookup(&rkey, now);
	if (!v || !(v->flags & want))
		return NULL;
	return v;
}

/* A packet of the entry's flow passes (in the key's direction when `fwd`): its TCP flags go
 * into the state and the lifetime starts again. A SYN without ACK from the opener on a
 * closing entry is a new connection on the same tuple: the state starts over. (Packets of one
 * flow on two CPUs may race here; the worst case is a lost state bit, corrected by the next
 * packet carrying it.) */
static __always_inline void ct_refresh(struct fqdnd_ct_value *v, const struct pkt *p, int fwd,
				       __u64 now)
{
	__u32 flags = v->flags;

	if (p->key.proto == IPPROTO_TCP) {
		if (fwd && (p->tcp_flags & (TH_SYN | TH_ACK)) == TH_SYN && tcp_closing(flags)) {
			flags &= ~FQDND_CT_TCP_STATE;
			v->created_ns = now;
		}
		flags |= tcp_bits(p->tcp_flags, fwd);
		if (flags != v->flags)
			v->flags = flags;
	}
	v->last_seen_ns = now;
	v->expires_ns = now + ct_lifetime(flags, p->key.proto);
}

/* Creates (or replaces a dead) entry for `key`, opened by packet `p`. */
static __always_inline void ct_create(const struct fqdnd_ct_key *key, const struct pkt *p,
				      __u32 flags, __u16 rev_nat, __u16 backend, __u64 now)
{
	struct fqdnd_ct_value v = {};

	if (p->key.proto == IPPROTO_TCP)
		flags |= tcp_bits(p->tcp_flags, 1);
	v.created_ns = now;
	v.last_seen_ns = now;
	v.expires_ns = now + ct_lifetime(flags, p->key.proto);
	v.flags = flags;
	v.rev_nat = rev_nat;
	v.backend = backend;
	bpf_map_update_elem(&fqdnd_ct, key, &v, BPF_ANY);
}

/* ---- policy ---- */

/* The identity of an address of the tuple's family (world when the ipcache has none). */
static __always_inline __u32 identity_of_addr(const struct fqdnd_ct_key *key, const __u8 *addr)
{
	struct fqdnd_ipcache_value *v;

	if (key->family == 4) {
		struct fqdnd_ipcache_key4 k = { .prefixlen = 32 };

		__builtin_memcpy(k.addr, addr, 4);
		v = bpf_map_lookup_elem(&fqdnd_ipc4, &k);
		return v ? v->identity : FQDND_ID_WORLD_IPV4;
	}
	struct fqdnd_ipcache_key6 k6 = { .prefixlen = 128 };

	__builtin_memcpy(k6.addr, addr, 16);
	v = bpf_map_lookup_elem(&fqdnd_ipc6, &k6);
	return v ? v->identity : FQDND_ID_WORLD_IPV6;
}

/* The endpoint's policy for (identity, proto, dport in network order), `dir` 0 (egress) or
 * FQDND_POLICY_ID_INGRESS: the longest entry of the identity decides; when it has none, the
 * longest of any identity. A deny entry drops (userspace makes a deny at least as long as
 * every allow it overlaps, so a deny wins). */
static __always_inline int policy_allows(__u16 endpoint, __u32 identity, __u32 dir, __u8 proto,
					 __u16 dport)
{
	struct fqdnd_policy_key k = {};
	struct fqdnd_policy_value *v;

	k.prefixlen = FQDND_POLICY_PREFIX_FULL;
	k.identity = identity | dir;
	k.endpoint = endpoint;
	k.proto = proto;
	k.dport = dport;
	v = bpf_map_lookup_elem(&fqdnd_policy, &k);
	if (!v) {
		k.identity = FQDND_ID_ANY | dir;
		v = bpf_map_lookup_elem(&fqdnd_policy, &k);
	}
	return v && !(v->flags & FQDND_POLICY_DENY) && (v->flags & FQDND_POLICY_ALLOW);
}

/* The "port" a packet is looked up with: its destination port, or for ICMP its type. */
static __always_inline __u16 policy_port(const struct fqdnd_ct_key *key, __u8 icmp_type)
{
	return is_icmp(key) ? bpf_htons(icmp_type) : key->dport;
}

/* Whether the endpoint may send the packet of tuple `key` (its destination's identity, now,
 * into *identity). ICMP packets are looked up with their type as the port: entries for every
 * protocol (L3 rules) and `icmps` entries of that type match them. */
static __always_inline int allowed(__u16 endpoint, const struct fqdnd_ct_key *key, __u8 icmp_type,
				   __u32 *identity)
{
	*identity = identity_of_addr(key, key->daddr);
	return policy_allows(endpoint, *identity, 0, key->proto, policy_port(key, icmp_type));
}

/* Whether the endpoint may receive the packet of tuple `key` (its source's identity, now,
 * into *identity), by its ingress entries. */
static __always_inline int allowed_in(__u16 endpoint, const struct fqdnd_ct_key *key,
				      __u8 icmp_type, __u32 *identity)
{
	*identity = identity_of_addr(key, key->saddr);
	return policy_allows(endpoint, *identity, FQDND_POLICY_ID_INGRESS, key->proto,
			     policy_port(key, icmp_type));
}

/* ---- events ---- */

static __always_inline void emit(struct __sk_buff *skb, __u16 endpoint, __u32 identity,
				 const struct fqdnd_ct_key *key, const struct pkt *p, __u8 reason)
{
	struct fqdnd_drop_event *e;

	e = bpf_ringbuf_reserve(&fqdnd_events, sizeof(*e), 0);
	if (!e)
		return;
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_ns = bpf_ktime_get_ns();
	e->ifindex = skb->ifindex;
	e->identity = identity;
	e->endpoint = endpoint;
	if (p->icmp != ICMP_NONE) {
		e->sport = p->icmp_type;
		e->dport = p->icmp_code;
	} else {
		e->sport = bpf_ntohs(key->sport);
		e->dport = bpf_ntohs(key->dport);
	}
	e->proto = key->proto;
	e->family = key->family;
	e->reason = reason;
	e->source = key->zone == FQDND_CT_ZONE_SOCKET ? FQDND_SOURCE_SOCKET : FQDND_SOURCE_INTERFACE;
	__builtin_memcpy(e->saddr, key->saddr, 16);
	__builtin_memcpy(e->daddr, key->daddr, 16);
	bpf_ringbuf_submit(e, 0);
}

static __always_inline void emit_drop(struct __sk_buff *skb, __u16 endpoint, __u32 identity,
				      const struct pkt *p, __u8 reason)
{
	emit(skb, endpoint, identity, &p->key, p, reason);
}

/* ---- endpoints ---- */

/* The endpoint of a BY_SOURCE interface: the client prefix holding `addr` (the packet's
 * source on the way out, its destination on the way in). 0 when no prefix holds it. */
static __always_inline int client_of(const struct fqdnd_ct_key *key, const __u8 *addr,
				     struct fqdnd_endpoint_value *out)
{
	struct fqdnd_endpoint_value *v;

	if (key->family == 4) {
		struct fqdnd_ipcache_key4 k = { .prefixlen = 32 };

		__builtin_memcpy(k.addr, addr, 4);
		v = bpf_map_lookup_elem(&fqdnd_clients4, &k);
	} else if (key->family == 6) {
		struct fqdnd_ipcache_key6 k6 = { .prefixlen = 128 };

		__builtin_memcpy(k6.addr, addr, 16);
		v = bpf_map_lookup_elem(&fqdnd_clients6, &k6);
	} else {
		return 0;
	}
	if (!v)
		return 0;
	*out = *v;
	return 1;
}

/* Whether the packet's source is one of the interface's addresses. */
static __always_inline int source_ok(__u32 ifindex, const struct fqdnd_ct_key *key)
{
	struct fqdnd_ep_addr_key k = {};

	k.ifindex = ifindex;
	k.family = key->family;
	__builtin_memcpy(k.addr, key->saddr, 16);
	return bpf_map_lookup_elem(&fqdnd_ep_addrs, &k) != NULL;
}

/* ---- DNS redirect ---- */

/* Assigns the packet to `sk` unless it is NULL or (for the lookup of the packet's own tuple)
 * a listener or a TIME_WAIT socket; always releases it. 0 when assigned. */
static __always_inline int assign(struct __sk_buff *skb, struct bpf_sock *sk, int established)
{
	long r;

	if (!sk)
		return -1;
	if (established && (sk->state == BPF_TCP_LISTEN || sk->state == BPF_TCP_TIME_WAIT)) {
		bpf_sk_release(sk);
		return -1;
	}
	r = bpf_sk_assign(skb, sk, 0);
	bpf_sk_release(sk);
	return r == 0 ? 0 : -1;
}

/* Finds the proxy socket for a DNS packet and assigns the packet to it. TCP: first the
 * socket of the packet's own tuple (an established connection or a request socket: skc
 * lookup, so a request socket is not turned into its listener), then the listener. UDP: the
 * listener only (the packet's own tuple could find a local resolver bound to :53). The
 * listener tuple is (0:0 → proxy addr:port), which finds a wildcard-bound listener with addr
 * 0.0.0.0/:: and a bound one with its own address. 0 when assigned. */
static __always_inline int redirect_dns(struct __sk_buff *skb, const struct fqdnd_ct_key *key)
{
	struct bpf_sock_tuple t = {};
	struct fqdnd_dns_proxy *cfg;
	__u32 zero = 0;

	cfg = bpf_map_lookup_elem(&fqdnd_dns_proxy, &zero);
	if (!cfg)
		return -1;
	if (key->family == 4) {
		const __u32 len = sizeof(t.ipv4);

		if (!cfg->port4)
			return -1;
		if (key->proto == IPPROTO_TCP) {
			__builtin_memcpy(&t.ipv4.saddr, key->saddr, 4);
			__builtin_memcpy(&t.ipv4.daddr, key->daddr, 4);
			t.ipv4.sport = key->sport;
			t.ipv4.dport = key->dport;
			if (!assign(skb, bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0), 1))
				return 0;
		}
		t.ipv4.saddr = 0;
		t.ipv4.sport = 0;
		__builtin_memcpy(&t.ipv4.daddr, cfg->addr4, 4);
		t.ipv4.dport = cfg->port4;
		if (key->proto == IPPROTO_TCP)
			return assign(skb, bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0), 0);
		return assign(skb, bpf_sk_lookup_udp(skb, &t, len, BPF_F_CURRENT_NETNS, 0), 0);
	}
	{
		const __u32 len = sizeof(t.ipv6);

		if (!cfg->port6)
			return -1;
		if (key->proto == IPPROTO_TCP) {
			__builtin_memcpy(t.ipv6.saddr, key->saddr, 16);
			__builtin_memcpy(t.ipv6.daddr, key->daddr, 16);
			t.ipv6.sport = key->sport;
			t.ipv6.dport = key->dport;
			if (!assign(skb, bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0), 1))
				return 0;
		}
		__builtin_memset(t.ipv6.saddr, 0, 16);
		t.ipv6.sport = 0;
		__builtin_memcpy(t.ipv6.daddr, cfg->addr6, 16);
		t.ipv6.dport = cfg->port6;
		if (key->proto == IPPROTO_TCP)
			return assign(skb, bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0), 0);
		return assign(skb, bpf_sk_lookup_udp(skb, &t, len, BPF_F_CURRENT_NETNS, 0), 0);
	}
}

/* The ingress of a bridge whose ports are endpoints (FQDND_EP_DNS_ONLY): their packets were
 * judged at their port, but a DNS query's socket assignment made there does not survive the
 * bridge, so it is made again here, where the packet goes up to the IP layer; the endpoint is
 * the client entry of the source (checked against the port's addresses at the port).
 * Everything else passes. */
static __always_inline int bridge_dns(struct __sk_buff *skb, const struct pkt *p, int r)
{
	struct fqdnd_endpoint_value ep;

	if (r != PARSE_OK || p->icmp != ICMP_NONE || p->key.dport != bpf_htons(53))
		return TC_ACT_OK;
	if (!client_of(&p->key, p->key.saddr, &ep) || !(ep.flags & FQDND_EP_REDIRECT_DNS))
		return TC_ACT_OK;
	if (redirect_dns(skb, &p->key) == 0) {
		skb->mark = (skb->mark & ~FQDND_MARK_MASK) | FQDND_MARK_TO_PROXY;
		return TC_ACT_OK;
	}
	emit_drop(skb, ep.endpoint, 0, p, FQDND_DROP_NO_PROXY);
	return TC_ACT_SHOT;
}

/* ---- service load balancing (maps and design: include/fqdnd_maps.h) ---- */

#define IP_CSUM_OFF   (ETH_HLEN + __builtin_offsetof(struct iphdr, check))
#define IP_SADDR_OFF  (ETH_HLEN + __builtin_offsetof(struct iphdr, saddr))
#define IP_DADDR_OFF  (ETH_HLEN + __builtin_offsetof(struct iphdr, daddr))
#define IP6_SADDR_OFF (ETH_HLEN + __builtin_offsetof(struct ipv6hdr, saddr))
#define IP6_DADDR_OFF (ETH_HLEN + __builtin_offsetof(struct ipv6hdr, daddr))

/* Rewrites one address of the IP header — the destination when `dst`, else the source — to
 * `addr`, keeping the IPv4 header checksum right; `old` is the address there now. For the
 * later fragments of a translated datagram (no L4 header: its checksum was fixed in the
 * first fragment). 0 when done. */
static __always_inline int rewrite_l3(struct __sk_buff *skb, __u8 family, int dst,
				      const __u8 *old, const __u8 *addr)
{
	if (family == 4) {
		__be32 old_ip, new_ip;

		__builtin_memcpy(&old_ip, old, 4);
		__builtin_memcpy(&new_ip, addr, 4);
		if (bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_ip, new_ip, sizeof(new_ip)) < 0)
			return -1;
		return bpf_skb_store_bytes(skb, dst ? IP_DADDR_OFF : IP_SADDR_OFF, &new_ip,
					   sizeof(new_ip), 0) < 0 ? -1 : 0;
	}
	{
		__u8 new6[16];

		__builtin_memcpy(new6, addr, 16);
		return bpf_skb_store_bytes(skb, dst ? IP6_DADDR_OFF : IP6_SADDR_OFF, new6, 16, 0) < 0
			       ? -1 : 0;
	}
}

/* Rewrites one end of a TCP/UDP packet — its destination when `dst`, else its source — to
 * addr:port (network order), keeping the IPv4 header and L4 checksums right (the L4 one
 * covers the addresses through the pseudo header; a UDP/IPv4 checksum of 0 stays 0).
 * 0 when done. */
static __always_inline int rewrite(struct __sk_buff *skb, const struct fqdnd_ct_key *key,
				   __u32 l4, int dst, const __u8 *addr, __u16 port)
{
	__u32 csum_off = l4 + (key->proto == IPPROTO_TCP ? 16 : 6);
	__u16 old_port = dst ? key->dport : key->sport;
	__u64 mangled = key->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;

	if (key->family == 4) {
		__be32 old_ip, new_ip;

		__builtin_memcpy(&old_ip, dst ? key->daddr : key->saddr, 4);
		__builtin_memcpy(&new_ip, addr, 4);
		if (bpf_l4_csum_replace(skb, csum_off, old_ip, new_ip,
					BPF_F_PSEUDO_HDR | mangled | sizeof(new_ip)) < 0)
			return -1;
		if (bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_ip, new_ip, sizeof(new_ip)) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, dst ? IP_DADDR_OFF : IP_SADDR_OFF, &new_ip,
					sizeof(new_ip), 0) < 0)
			return -1;
	} else {
		__u8 old6[16], new6[16];
		__s64 diff;

		__builtin_memcpy(old6, dst ? key->daddr : key->saddr, 16);
		__builtin_memcpy(new6, addr, 16);
		diff = bpf_csum_diff((__be32 *)old6, 16, (__be32 *)new6, 16, 0);
		if (bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR | mangled) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, dst ? IP6_DADDR_OFF : IP6_SADDR_OFF, new6, 16, 0) < 0)
			return -1;
	}
	if (old_port == port)
		return 0;
	if (bpf_l4_csum_replace(skb, csum_off, old_port, port, mangled | sizeof(port)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, l4 + (dst ? 2 : 0), &port, sizeof(port), 0) < 0 ? -1 : 0;
}

/* `key` with its destination replaced by the backend's. */
static __always_inline void to_backend(const struct fqdnd_ct_key *key,
				       const struct fqdnd_lb_backend *be, struct fqdnd_ct_key *out)
{
	*out = *key;
	__builtin_memcpy(out->daddr, be->addr, 16);
	out->dport = be->port;
}

/* The backend `id` (copied), when it exists and suits the packet's family and protocol. */
static __always_inline int backend_of(__u16 id, const struct fqdnd_ct_key *key,
				      struct fqdnd_lb_backend *out)
{
	struct fqdnd_lb_backend *be = bpf_map_lookup_elem(&fqdnd_lb_backends, &id);

	if (!be || be->family != key->family || be->proto != key->proto)
		return -1;
	*out = *be;
	return 0;
}

enum lb_result {
	LB_NONE = 0,  /* not a service flow: go on */
	LB_PASS,      /* translated: pass */
	LB_DROP,      /* dropped (event emitted when it was policy or no backend) */
};

/* A packet of an established service flow (`ct`: the entry of its client → VIP tuple): the
 * endpoint's policy is checked again against the flow's backend (its current identity and
 * port), then the packet is translated and both entries refreshed (the backend's recreated
 * if it died). LB_NONE when the backend is gone: the caller treats it as a new flow. */
static __always_inline int lb_established(struct __sk_buff *skb, const struct pkt *p,
					  struct fqdnd_ct_value *ct,
					  const struct fqdnd_endpoint_value *ep, __u64 now)
{
	struct fqdnd_lb_backend be;
	struct fqdnd_ct_key tkey;
	struct fqdnd_ct_value *t;
	__u16 rev_nat = ct->rev_nat;
	__u32 identity;

	if (backend_of(ct->backend, &p->key, &be))
		return LB_NONE;
	to_backend(&p->key, &be, &tkey);
	if ((ep->flags & FQDND_EP_ENFORCE_EGRESS) && !allowed(ep->endpoint, &tkey, 0, &identity)) {
		emit(skb, ep->endpoint, identity, &tkey, p, FQDND_DROP_POLICY);
		return LB_DROP;
	}
	ct_refresh(ct, p, 1, now);
	t = ct_lookup(&tkey, now);
	if (t)
		ct_refresh(t, p, 1, now);
	else
		ct_create(&tkey, p, FQDND_CT_EGRESS, rev_nat, 0, now);
	return rewrite(skb, &p->key, p->l4, 1, be.addr, be.port) ? LB_DROP : LB_PASS;
}

/* A new flow: when its destination is a service, picks the backend of slot
 * (flow hash % count) + 1, checks the endpoint's policy against the backend (its identity
 * and port), records both conntrack entries and translates the packet. The backend id goes
 * to *backend (a first fragment's later fragments follow it). */
static __always_inline int lb_new_flow(struct __sk_buff *skb, const struct pkt *p,
				       const struct fqdnd_endpoint_value *ep, __u64 now,
				       __u16 *backend)
{
	struct fqdnd_lb_svc_key sk = {};
	struct fqdnd_lb_svc_value *svc;
	struct fqdnd_lb_backend be;
	struct fqdnd_ct_key tkey;
	__u16 rev_nat, id;
	__u32 identity;

	__builtin_memcpy(sk.addr, p->key.daddr, 16);
	sk.dport = p->key.dport;
	sk.proto = p->key.proto;
	sk.family = p->key.family;
	svc = bpf_map_lookup_elem(&fqdnd_lb_svc, &sk);
	if (!svc)
		return LB_NONE;
	rev_nat = svc->rev_nat;
	if (!svc->count)
		goto no_backend;
	sk.slot = (bpf_get_hash_recalc(skb) % svc->count) + 1;
	svc = bpf_map_lookup_elem(&fqdnd_lb_svc, &sk);
	if (!svc)
		goto no_backend;
	id = svc->backend;
	if (backend_of(id, &p->key, &be))
		goto no_backend;
	to_backend(&p->key, &be, &tkey);
	if ((ep->flags & FQDND_EP_ENFORCE_EGRESS) && !allowed(ep->endpoint, &tkey, 0, &identity)) {
		emit(skb, ep->endpoint, identity, &tkey, p, FQDND_DROP_POLICY);
		return LB_DROP;
	}
	/* replaces the entry of a flow whose backend went away */
	ct_create(&p->key, p, FQDND_CT_EGRESS, rev_nat, id, now);
	ct_create(&tkey, p, FQDND_CT_EGRESS, rev_nat, 0, now);
	*backend = id;
	return rewrite(skb, &p->key, p->l4, 1, be.addr, be.port) ? LB_DROP : LB_PASS;

no_backend:
	emit_drop(skb, ep->endpoint, 0, p, FQDND_DROP_NO_BACKEND);
	return LB_DROP;
}

/* A backend's reply in a service flow (`rev_nat` from the entry of its client → backend
 * tuple): the source becomes the VIP and service port again, and the client → VIP entry is
 * refreshed too (so a flow whose packets mostly come back stays alive in both). A service
 * removed meanwhile leaves the reply as it is. */
static __always_inline int lb_reply(struct __sk_buff *skb, const struct pkt *p, __u16 rev_nat,
				    __u64 now)
{
	struct fqdnd_lb_revnat *rn = bpf_map_lookup_elem(&fqdnd_lb_revnat, &rev_nat);
	struct fqdnd_ct_key akey;
	struct fqdnd_ct_value *a;
	__u8 addr[16];
	__u16 port;

	if (!rn || rn->family != p->key.family)
		return LB_PASS;
	__builtin_memcpy(addr, rn->addr, 16);
	port = rn->port;
	__builtin_memcpy(akey.saddr, p->key.daddr, 16);
	__builtin_memcpy(akey.daddr, addr, 16);
	akey.sport = p->key.dport;
	akey.dport = port;
	akey.proto = p->key.proto;
	akey.family = p->key.family;
	akey.zone = FQDND_CT_ZONE_INTERFACE;
	akey.pad = 0;
	a = ct_lookup(&akey, now);
	if (a)
		ct_refresh(a, p, 0, now);
	return rewrite(skb, &p->key, p->l4, 0, addr, port) ? LB_DROP : LB_PASS;
}

/* ---- fragments ---- */

static __always_inline void frag_key(const struct pkt *p, struct fqdnd_frag_key *k)
{
	__builtin_memcpy(k->saddr, p->key.saddr, 16);
	__builtin_memcpy(k->daddr, p->key.daddr, 16);
	k->id = p->frag_id;
	k->proto = p->key.proto;
	k->family = p->key.family;
	k->pad[0] = 0;
	k->pad[1] = 0;
}

/* After the verdict on a first fragment: a passed one lets its later fragments follow
 * (translated to `backend`, or given the VIP of `rev_nat`), a dropped one forgets an older
 * datagram of the same id. */
static __always_inline void frag_record(const struct pkt *p, int passed, __u16 backend,
					__u16 rev_nat, __u64 now)
{
	struct fqdnd_frag_key k;

	if (p->frag != FRAG_FIRST)
		return;
	frag_key(p, &k);
	if (passed) {
		struct fqdnd_frag_value v = {};

		v.created_ns = now;
		v.sport = p->key.sport;
		v.dport = p->key.dport;
		v.backend = backend;
		v.rev_nat = rev_nat;
		bpf_map_update_elem(&fqdnd_frags, &k, &v, BPF_ANY);
	} else {
		bpf_map_delete_elem(&fqdnd_frags, &k);
	}
}

/* The entry of a later fragment's datagram, when its first fragment passed recently. */
static __always_inline struct fqdnd_frag_value *frag_find(struct pkt *p, __u64 now)
{
	struct fqdnd_frag_key k;
	struct fqdnd_frag_value *v;

	frag_key(p, &k);
	v = bpf_map_lookup_elem(&fqdnd_frags, &k);
	if (!v || now - v->created_ns > FQDND_FRAG_LIFETIME_NS)
		return NULL;
	p->key.sport = v->sport;
	p->key.dport = v->dport;
	return v;
}

/* ---- the endpoint's egress ---- */

/* Whether an ICMP error relates to a tracked flow: the packet it embeds has a live conntrack
 * entry in either direction. From the endpoint (`inbound` 0) the endpoint received that
 * packet: its destination is the error's source and its source the error's destination. To
 * the endpoint (`inbound` 1) the endpoint sent it: its source is the error's destination (the
 * error may come from any router on the way). */
static __always_inline int icmp_related(struct __sk_buff *skb, const struct pkt *p, __u64 now,
					int inbound)
{
	struct fqdnd_ct_key ik = {};
	struct fqdnd_ct_key rk;
	__u32 off = p->l4 + 8, l4;

	if (p->key.family == 4) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) < 0 || ip.ihl < 5)
			return 0;
		__builtin_memcpy(ik.saddr, &ip.saddr, 4);
		__builtin_memcpy(ik.daddr, &ip.daddr, 4);
		ik.proto = ip.protocol;
		l4 = off + ip.ihl * 4;
	} else {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)) < 0)
			return 0;
		__builtin_memcpy(ik.saddr, &ip6.saddr, 16);
		__builtin_memcpy(ik.daddr, &ip6.daddr, 16);
		ik.proto = ip6.nexthdr;
		l4 = off + sizeof(ip6);
	}
	ik.family = p->key.family;
	ik.zone = p->key.zone;
	if (__builtin_memcmp(ik.saddr, p->key.daddr, 16))
		return 0;
	if (!inbound && __builtin_memcmp(ik.daddr, p->key.saddr, 16))
		return 0;
	if (ik.proto == IPPROTO_TCP || ik.proto == IPPROTO_UDP) {
		__u16 ports[2];

		if (bpf_skb_load_bytes(skb, l4, ports, sizeof(ports)) < 0)
			return 0;
		ik.sport = ports[0];
		ik.dport = ports[1];
	} else if (is_icmp(&ik)) {
		__u8 h[6];
		__u16 id;

		if (bpf_skb_load_bytes(skb, l4, h, sizeof(h)) < 0)
			return 0;
		__builtin_memcpy(&id, &h[4], 2);
		if (h[0] == 8 || h[0] == 128)
			ik.sport = id;
		else if (h[0] == 0 || h[0] == 129)
			ik.dport = id;
		else
			return 0;
	} else {
		return 0;
	}
	if (ct_lookup(&ik, now))
		return 1;
	reverse(&ik, &rk);
	return ct_lookup(&rk, now) != NULL;
}

/* The verdict on a packet of the endpoint `ep` (TC_ACT_OK or TC_ACT_SHOT, event emitted);
 * *backend: the service backend a passed packet was translated to; *follow = 0 when the later
 * fragments of a passed first fragment must not follow it. `socket` (a constant: the code of
 * the other case is compiled out) when a cgroup skb program asks for a host process's
 * socket: no packet rewrite (the program may not), so no service translation, and DNS the
 * socket programs did not redirect is dropped instead of assigned to the proxy. */
static __always_inline int egress(struct __sk_buff *skb, struct pkt *p, int r,
				  const struct fqdnd_endpoint_value *ep, __u64 now, __u16 *backend,
				  __u8 *follow, const int socket)
{
	int enforce = ep->flags & FQDND_EP_ENFORCE_EGRESS;
	struct fqdnd_ct_value *ct;
	__u32 identity;

	if (r == PARSE_LATER_FRAGMENT) {
		struct fqdnd_frag_value *f = frag_find(p, now);

		if (f) {
			struct fqdnd_lb_backend be;

			if (socket || !f->backend)
				return TC_ACT_OK;
			if (backend_of(f->backend, &p->key, &be))
				return TC_ACT_SHOT;
			return rewrite_l3(skb, p->key.family, 1, p->key.daddr, be.addr) ? TC_ACT_SHOT
											 : TC_ACT_OK;
		}
		if (!enforce)
			return TC_ACT_OK;
		emit_drop(skb, ep->endpoint, 0, p, FQDND_DROP_FRAGMENT);
		return TC_ACT_SHOT;
	}
	if (r != PARSE_OK) {
		if (!enforce)
			return TC_ACT_OK;
		emit_drop(skb, ep->endpoint, 0, p,
			  r == PARSE_EXT_HEADERS ? FQDND_DROP_EXT_HEADERS : FQDND_DROP_UNHANDLED);
		return TC_ACT_SHOT;
	}
	if (p->icmp == ICMP_ERROR || p->icmp == ICMP_OTHER) {
		/* related errors pass both ways (path MTU discovery); other ICMP only as the
		 * policy allows its type (an `icmps` entry, or a rule for every protocol) */
		if (!enforce || (p->icmp == ICMP_ERROR && icmp_related(skb, p, now, 0)))
			return TC_ACT_OK;
		if (allowed(ep->endpoint, &p->key, p->icmp_type, &identity))
			return TC_ACT_OK;
		emit_drop(skb, ep->endpoint, identity, p, FQDND_DROP_ICMP);
		return TC_ACT_SHOT;
	}

	if ((ep->flags & FQDND_EP_REDIRECT_DNS) && p->icmp == ICMP_NONE &&
	    p->key.dport == bpf_htons(53)) {
		/* a fragmented query's later fragments would go to the original destination,
		 * past the proxy: they are dropped */
		*follow = 0;
		if (socket) {
			/* a host process's DNS the socket programs did not send to the proxy (a
			 * socket connected before its cgroup became an endpoint) */
			emit_drop(skb, ep->endpoint, 0, p, FQDND_DROP_DNS_BYPASS);
			return TC_ACT_SHOT;
		}
		if (redirect_dns(skb, &p->key) == 0) {
			skb->mark = (skb->mark & ~FQDND_MARK_MASK) | FQDND_MARK_TO_PROXY;
			if (ep->flags & FQDND_EP_ENFORCE_INGRESS) {
				/* under ingress policy the proxy's answers pass as its replies */
				ct = ct_lookup(&p->key, now);
				if (ct)
					ct_refresh(ct, p, 1, now);
				else
					ct_create(&p->key, p, FQDND_CT_DNS, 0, 0, now);
			}
			return TC_ACT_OK;
		}
		/* fail closed: DNS never bypasses the proxy */
		emit_drop(skb, ep->endpoint, 0, p, FQDND_DROP_NO_PROXY);
		return TC_ACT_SHOT;
	}

	ct = ct_lookup(&p->key, now);
	if (ct) {
		/* an established flow: checked again against the policy and the destination's
		 * identity now (a removed rule, a released name cut it) */
		if (!socket && ct->backend) {
			__u16 id = ct->backend;

			r = lb_established(skb, p, ct, ep, now);
			if (r != LB_NONE) {
				*backend = id;
				return r == LB_PASS ? TC_ACT_OK : TC_ACT_SHOT;
			}
			/* its backend is gone: chosen again below, like a new flow */
		} else {
			if (enforce && !allowed(ep->endpoint, &p->key, p->icmp_type, &identity)) {
				emit_drop(skb, ep->endpoint, identity, p, FQDND_DROP_POLICY);
				return TC_ACT_SHOT;
			}
			ct_refresh(ct, p, 1, now);
			return TC_ACT_OK;
		}
	} else {
		ct = ct_reply(&p->key, FQDND_CT_INGRESS, now);
		if (ct) {
			/* a reply in a flow opened towards the endpoint: no policy */
			ct_refresh(ct, p, 0, now);
			return TC_ACT_OK;
		}
	}

	if (p->icmp == ICMP_ECHO_REPLY) {
		/* a reply to no request */
		if (!enforce)
			return TC_ACT_OK;
		emit_drop(skb, ep->endpoint, 0, p, FQDND_DROP_ICMP);
		return TC_ACT_SHOT;
	}
	if (!socket && p->icmp == ICMP_NONE) {
		r = lb_new_flow(skb, p, ep, now, backend);
		if (r != LB_NONE)
			return r == LB_PASS ? TC_ACT_OK : TC_ACT_SHOT;
	}
	if (enforce && !allowed(ep->endpoint, &p->key, p->icmp_type, &identity)) {
		emit_drop(skb, ep->endpoint, identity, p, FQDND_DROP_POLICY);
		return TC_ACT_SHOT;
	}
	ct_create(&p->key, p, FQDND_CT_EGRESS, 0, 0, now);
	return TC_ACT_OK;
}

/* The verdict on a packet towards the endpoint `ep` (TC_ACT_OK or TC_ACT_SHOT, event
 * emitted); *rev_nat: the service a passed reply was given the VIP of. Without
 * ENFORCE_INGRESS nothing is dropped: inbound flows are recorded so the endpoint's replies
 * pass, and replies in its own flows are tracked (and translated back for services).
 * `socket` (a constant: the code of the other case is compiled out) when a cgroup skb program
 * asks for a host process's socket: no packet rewrite (the program may not, and its egress
 * never translates), and no exception for the proxy's answers (they come from loopback, which
 * the program lets pass before). */
static __always_inline int ingress(struct __sk_buff *skb, struct pkt *p, int r,
				   const struct fqdnd_endpoint_value *ep, __u64 now, __u16 *rev_nat,
				   const int socket)
{
	int enforce = ep->flags & FQDND_EP_ENFORCE_INGRESS;
	struct fqdnd_ct_value *ct;
	__u32 identity = 0;

	if (r == PARSE_LATER_FRAGMENT) {
		/* a passed datagram's later fragments follow it; a service's reply datagram
		 * gets its VIP back */
		struct fqdnd_frag_value *f = frag_find(p, now);
		struct fqdnd_lb_revnat *rn;
		__u16 idx;

		if (!f) {
			if (!enforce)
				return TC_ACT_OK;
			emit_drop(skb, ep->endpoint, 0, p, FQDND_DROP_FRAGMENT);
			return TC_ACT_SHOT;
		}
		if (socket || !f->rev_nat)
			return TC_ACT_OK;
		idx = f->rev_nat;
		rn = bpf_map_lookup_elem(&fqdnd_lb_revnat, &idx);
		if (!rn || rn->family != p->key.family)
			return TC_ACT_OK;
		return rewrite_l3(skb, p->key.family, 0, p->key.saddr, rn->addr) ? TC_ACT_SHOT
										 : TC_ACT_OK;
	}
	if (r != PARSE_OK) {
		if (!enforce)
			return TC_ACT_OK;
		emit_drop(skb, ep->endpoint, 0, p,
			  r == PARSE_EXT_HEADERS ? FQDND_DROP_EXT_HEADERS : FQDND_DROP_UNHANDLED);
		return TC_ACT_SHOT;
	}
	/* The proxy's answers to redirected DNS: no conntrack entry of their own (the queries
	 * never consult conntrack, and an INGRESS entry would let them pass as replies without
	 * the redirect). Under ingress policy they pass as replies to the query's DNS entry. */
	if (!socket && (ep->flags & FQDND_EP_REDIRECT_DNS) && p->icmp == ICMP_NONE &&
	    p->key.sport == bpf_htons(53)) {
		if (!enforce || ct_reply(&p->key, FQDND_CT_DNS, now))
			return TC_ACT_OK;
	}
	if (p->icmp == ICMP_ERROR || p->icmp == ICMP_OTHER) {
		/* errors about the endpoint's flows pass (path MTU discovery); other ICMP only as
		 * the ingress policy allows its type */
		if (!enforce || (p->icmp == ICMP_ERROR && icmp_related(skb, p, now, 1)))
			return TC_ACT_OK;
		if (allowed_in(ep->endpoint, &p->key, p->icmp_type, &identity))
			return TC_ACT_OK;
		emit_drop(skb, ep->endpoint, identity, p, FQDND_DROP_ICMP);
		return TC_ACT_SHOT;
	}
	ct = ct_lookup(&p->key, now);
	if (ct) {
		/* an established inbound flow: checked again against the ingress policy and its
		 * source's identity now */
		if (enforce && !allowed_in(ep->endpoint, &p->key, p->icmp_type, &identity)) {
			emit_drop(skb, ep->endpoint, identity, p, FQDND_DROP_POLICY);
			return TC_ACT_SHOT;
		}
		/* The entry may be the sender's own (another endpoint of this node opened the
		 * flow at its egress, and conntrack is shared): it is a flow towards this
		 * endpoint too, whose replies must pass. */
		if (!(ct->flags & FQDND_CT_INGRESS))
			ct->flags |= FQDND_CT_INGRESS;
		ct_refresh(ct, p, 1, now);
		return TC_ACT_OK;
	}
	ct = ct_reply(&p->key, FQDND_CT_EGRESS, now);
	if (ct) {
		/* a reply in a flow the endpoint opened: no ingress policy */
		ct_refresh(ct, p, 0, now);
		if (socket)
			return TC_ACT_OK;
		*rev_nat = ct->rev_nat;
		if (*rev_nat && lb_reply(skb, p, *rev_nat, now) == LB_DROP)
			return TC_ACT_SHOT;
		return TC_ACT_OK;
	}
	if (p->icmp == ICMP_ECHO_REPLY) {
		/* a reply to no request */
		if (!enforce)
			return TC_ACT_OK;
		emit_drop(skb, ep->endpoint, 0, p, FQDND_DROP_ICMP);
		return TC_ACT_SHOT;
	}
	if (enforce && !allowed_in(ep->endpoint, &p->key, p->icmp_type, &identity)) {
		emit_drop(skb, ep->endpoint, identity, p, FQDND_DROP_POLICY);
		return TC_ACT_SHOT;
	}
	/* A flow opened towards the endpoint: its replies will pass. Only a SYN opens a TCP flow
	 * (a stray segment, say of a flow whose entry died, must not make the endpoint's packets
	 * replies), only a request an echo. */
	if (p->key.proto == IPPROTO_TCP && (p->tcp_flags & (TH_SYN | TH_ACK)) != TH_SYN)
		return TC_ACT_OK;
	ct_create(&p->key, p, FQDND_CT_INGRESS, 0, 0, now);
	return TC_ACT_OK;
}

SEC("classifier")
int fqdnd_from_ep(struct __sk_buff *skb)
{
	struct pkt p = {};
	struct fqdnd_endpoint_value ep;
	struct fqdnd_endpoint_value *iface;
	__u32 ifindex = skb->ifindex;
	__u16 backend = 0;
	__u8 follow = 1;
	__u64 now;
	int r, verdict;

	iface = bpf_map_lookup_elem(&fqdnd_endpoints, &ifindex);
	if (!iface)
		return TC_ACT_OK;
	ep = *iface;

	r = parse(skb, &p);
	if (r == PARSE_NOT_IP || r == PARSE_ALWAYS_PASS)
		return TC_ACT_OK;
	if (ep.flags & FQDND_EP_DNS_ONLY)
		return bridge_dns(skb, &p, r);
	if (ep.flags & FQDND_EP_BY_SOURCE) {
		if (!client_of(&p.key, p.key.saddr, &ep)) {
			/* a source no client prefix holds: the interface entry's ENFORCE decides */
			if (!(ep.flags & FQDND_EP_ENFORCE_EGRESS))
				return TC_ACT_OK;
			emit_drop(skb, 0, 0, &p, FQDND_DROP_POLICY);
			return TC_ACT_SHOT;
		}
	} else if ((ep.flags & FQDND_EP_CHECK_SOURCE) && !source_ok(ifindex, &p.key)) {
		/* before anything else, the DNS redirect included: a spoofed query never reaches
		 * the proxy */
		emit_drop(skb, ep.endpoint, 0, &p, FQDND_DROP_SPOOFED);
		return TC_ACT_SHOT;
	}
	now = bpf_ktime_get_ns();
	verdict = egress(skb, &p, r, &ep, now, &backend, &follow, 0);
	frag_record(&p, verdict == TC_ACT_OK && follow, backend, 0, now);
	return verdict;
}

SEC("classifier")
int fqdnd_to_ep(struct __sk_buff *skb)
{
	struct pkt p = {};
	struct fqdnd_endpoint_value ep;
	struct fqdnd_endpoint_value *iface;
	__u32 ifindex = skb->ifindex;
	__u16 rev_nat = 0;
	__u64 now;
	int r, verdict;

	iface = bpf_map_lookup_elem(&fqdnd_endpoints, &ifindex);
	if (!iface || (iface->flags & FQDND_EP_DNS_ONLY))
		return TC_ACT_OK;
	ep = *iface;
	r = parse(skb, &p);
	if (r == PARSE_NOT_IP || r == PARSE_ALWAYS_PASS)
		return TC_ACT_OK;
	if ((ep.flags & FQDND_EP_BY_SOURCE) && !client_of(&p.key, p.key.daddr, &ep))
		return TC_ACT_OK;
	now = bpf_ktime_get_ns();
	verdict = ingress(skb, &p, r, &ep, now, &rev_nat, 0);
	if (r == PARSE_OK && (rev_nat || (ep.flags & FQDND_EP_ENFORCE_INGRESS)))
		frag_record(&p, verdict == TC_ACT_OK, 0, rev_nat, now);
	return verdict;
}

/* ---- host processes: cgroup v2 socket programs ----
 *
 * Attached once at the root of the cgroup v2 hierarchy (see the header). Sockets of no
 * endpoint's cgroup are left alone: each program returns at once when the walk of the
 * socket's cgroup ancestry finds no fqdnd_cgroups entry.
 *
 *  fqdnd_connect4/6, fqdnd_sendmsg4/6  the DNS redirect: a UDP or TCP destination port 53 of
 *                 a socket of an endpoint flagged REDIRECT_DNS becomes the proxy (127.0.0.1 /
 *                 ::1 and its port, or the proxy's bound address), in the proxy's network
 *                 namespace; the destination asked for is recorded per socket cookie
 *                 (fqdnd_sock_dns). No proxy: the call fails (EPERM) — DNS fails closed.
 *                 connect4/6 also refuse (EPERM) a TCP connect the endpoint's egress policy
 *                 does not allow (connect_allowed), so that it fails at once.
 *  fqdnd_recvmsg4/6, fqdnd_getpeername4/6  give the socket the recorded destination back where
 *                 the kernel would show the proxy's address (recvfrom's source, getpeername).
 *  fqdnd_sock_egress  cgroup_skb egress: a packet a redirected socket sends to the proxy
 *                 records that socket's destination under the packet's source address and
 *                 port (fqdnd_dns_origins, read by the proxy); other packets to loopback pass;
 *                 everything else is egress() as for an interface (same ipcache, policy and
 *                 conntrack maps, the socket conntrack zone) without service translation (a
 *                 cgroup skb program may not rewrite packets), DNS that was not redirected
 *                 dropped.
 *  fqdnd_sock_ingress cgroup_skb ingress: packets from loopback (the host itself, the proxy's
 *                 answers included) pass; everything else is ingress() as for an interface
 *                 (the socket conntrack zone, no service translation): flows opened towards
 *                 the endpoint's sockets are recorded so their replies pass, and an endpoint
 *                 flagged ENFORCE_INGRESS drops what its ingress policy does not allow.
 */

#define SOCK_PASS 1
#define SOCK_DROP 0
#define LOOPBACK4 0x7f000001 /* 127.0.0.1, host order */

/* The endpoint of the deepest cgroup on the path from the root to `own` (a socket's cgroup)
 * that has an fqdnd_cgroups entry; `ancestor(level)` is the id of its ancestor at `level`
 * (0 = the root), 0 beyond `own`'s depth. */
#define CGROUP_ENDPOINT(own, ancestor, out)                                                  \
	({                                                                                   \
		struct fqdnd_endpoint_value *__v;                                            \
		__u64 __own = (own);                                                         \
		int __found = 0, __level;                                                    \
                                                                                             \
		__v = bpf_map_lookup_elem(&fqdnd_cgroups, &__own);                           \
		if (__v) {                                                                   \
			*(out) = *__v;                                                       \
			__found = 1;                                                         \
		} else {                                                                     \
			for (__level = 0; __level < FQDND_CGROUP_MAX_DEPTH; __level++) {     \
				__u64 __id = ancestor(__level);                              \
                                                                                             \
				if (!__id || __id == __own)                                  \
					break;                                               \
				__v = bpf_map_lookup_elem(&fqdnd_cgroups, &__id);            \
				if (__v) {                                                   \
					*(out) = *__v;                                       \
					__found = 1;                                         \
				}                                                            \
			}                                                                    \
		}                                                                            \
		__found;                                                                     \
	})

#define SKB_ANCESTOR(level)     bpf_skb_ancestor_cgroup_id(skb, (level))
#define CURRENT_ANCESTOR(level) bpf_get_current_ancestor_cgroup_id(level)

/* The endpoint of the call a sock_addr program runs for, when the redirect applies to it: in
 * the proxy's network namespace (fqdnd_sock_cfg) and made by a process in an endpoint's
 * cgroup. (sock_addr programs cannot read a socket's cgroup, only the calling task's: a
 * socket created before its process joined the cgroup is redirected by its process's
 * cgroup, while the skb programs follow the socket's.) */
static __always_inline int sock_addr_endpoint(struct bpf_sock_addr *ctx,
					      struct fqdnd_endpoint_value *out)
{
	struct fqdnd_sock_cfg *cfg;
	__u32 zero = 0;

	cfg = bpf_map_lookup_elem(&fqdnd_sock_cfg, &zero);
	if (!cfg || !cfg->endpoints)
		return 0;
	if (cfg->netns_cookie && cfg->netns_cookie != bpf_get_netns_cookie(ctx))
		return 0;
	return CGROUP_ENDPOINT(bpf_get_current_cgroup_id(), CURRENT_ANCESTOR, out);
}

/* The proxy's IPv4 address for redirected sockets, network order: its bound address, or
 * 127.0.0.1 for a wildcard listener. */
static __always_inline __u32 proxy_addr4(const struct fqdnd_dns_proxy *cfg)
{
	__u32 a;

	__builtin_memcpy(&a, cfg->addr4, 4);
	return a ? a : bpf_htonl(LOOPBACK4);
}

/* The proxy's IPv6 address (::1 for a wildcard listener), as four network-order words. */
static __always_inline void proxy_addr6(const struct fqdnd_dns_proxy *cfg, __u32 out[4])
{
	__builtin_memcpy(out, cfg->addr6, 16);
	if (!(out[0] | out[1] | out[2] | out[3]))
		out[3] = bpf_htonl(1);
}

/* Whether the four network-order words `a` are the proxy's IPv6 address. */
static __always_inline int is_proxy6(const struct fqdnd_dns_proxy *cfg, const __u32 a[4])
{
	__u32 proxy[4];

	proxy_addr6(cfg, proxy);
	return a[0] == proxy[0] && a[1] == proxy[1] && a[2] == proxy[2] && a[3] == proxy[3];
}

/* The sock_addr context's IPv6 address, read and written a word at a time (the only access
 * the verifier allows). */
static __always_inline void load_ip6(const struct bpf_sock_addr *ctx, __u32 a[4])
{
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
}

static __always_inline void store_ip6(struct bpf_sock_addr *ctx, const __u32 a[4])
{
	ctx->user_ip6[0] = a[0];
	ctx->user_ip6[1] = a[1];
	ctx->user_ip6[2] = a[2];
	ctx->user_ip6[3] = a[3];
}

static __always_inline int v4_mapped(const __u32 a[4])
{
	return !a[0] && !a[1] && a[2] == bpf_htonl(0xffff);
}

/* A drop event for a call the sock_addr programs refused (no proxy, or a connect the policy
 * does not allow: `identity` is then the destination's). */
static __always_inline void emit_sock(__u16 endpoint, __u32 identity, const __u8 *daddr,
				      __u8 family, __u16 dport, __u8 proto, __u8 reason)
{
	struct fqdnd_drop_event *e;

	e = bpf_ringbuf_reserve(&fqdnd_events, sizeof(*e), 0);
	if (!e)
		return;
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_ns = bpf_ktime_get_ns();
	e->endpoint = endpoint;
	e->identity = identity;
	e->dport = bpf_ntohs(dport);
	e->proto = proto;
	e->family = family;
	e->reason = reason;
	e->source = FQDND_SOURCE_SOCKET;
	__builtin_memcpy(e->daddr, daddr, 16);
	bpf_ringbuf_submit(e, 0);
}

/* Whether the sock_addr call is DNS of a redirected endpoint: UDP or TCP to port 53. */
static __always_inline int dns_call(struct bpf_sock_addr *ctx, struct fqdnd_endpoint_value *ep)
{
	if (ctx->user_port != bpf_htons(53))
		return 0;
	if (ctx->protocol != IPPROTO_UDP && ctx->protocol != IPPROTO_TCP)
		return 0;
	return sock_addr_endpoint(ctx, ep) && (ep->flags & FQDND_EP_REDIRECT_DNS);
}

/* What redirect4/6 did with a call. */
#define REDIRECT_REFUSED 0 /* DNS of a redirected endpoint and no proxy: refuse (EPERM) */
#define REDIRECT_NONE    1 /* not DNS of a redirected endpoint: untouched */
#define REDIRECT_DONE    2 /* sent to the proxy */

/* connect4 / sendmsg4: REDIRECT_*. */
static __always_inline int redirect4(struct bpf_sock_addr *ctx)
{
	struct fqdnd_endpoint_value ep;
	struct fqdnd_sock_origin o = {};
	struct fqdnd_dns_proxy *cfg;
	__u32 zero = 0, dst;
	__u64 cookie;

	if (!dns_call(ctx, &ep))
		return REDIRECT_NONE;
	dst = ctx->user_ip4;
	__builtin_memcpy(o.addr, &dst, 4);
	cfg = bpf_map_lookup_elem(&fqdnd_dns_proxy, &zero);
	if (!cfg || !cfg->port4) {
		emit_sock(ep.endpoint, 0, o.addr, 4, ctx->user_port, ctx->protocol,
			  FQDND_DROP_NO_PROXY);
		return REDIRECT_REFUSED;
	}
	o.port = ctx->user_port;
	o.endpoint = ep.endpoint;
	o.family = 4;
	o.proto = ctx->protocol;
	cookie = bpf_get_socket_cookie(ctx);
	bpf_map_update_elem(&fqdnd_sock_dns, &cookie, &o, BPF_ANY);
	ctx->user_ip4 = proxy_addr4(cfg);
	ctx->user_port = cfg->port4;
	return REDIRECT_DONE;
}

/* connect6 / sendmsg6, v4-mapped destinations (a dual-stack socket) included: REDIRECT_*.
 * (An unconnected dual-stack UDP socket's datagram to a v4-mapped address runs sendmsg4
 * instead, with the IPv4 address: the kernel sends it as IPv4.) */
static __always_inline int redirect6(struct bpf_sock_addr *ctx)
{
	struct fqdnd_endpoint_value ep;
	struct fqdnd_sock_origin o = {};
	struct fqdnd_dns_proxy *cfg;
	__u32 zero = 0, dst[4], proxy[4];
	__u64 cookie;
	int mapped;

	if (!dns_call(ctx, &ep))
		return REDIRECT_NONE;
	load_ip6(ctx, dst);
	__builtin_memcpy(o.addr, dst, 16);
	mapped = v4_mapped(dst);
	cfg = bpf_map_lookup_elem(&fqdnd_dns_proxy, &zero);
	if (!cfg || !(mapped ? cfg->port4 : cfg->port6)) {
		emit_sock(ep.endpoint, 0, o.addr, 6, ctx->user_port, ctx->protocol,
			  FQDND_DROP_NO_PROXY);
		return REDIRECT_REFUSED;
	}
	o.port = ctx->user_port;
	o.endpoint = ep.endpoint;
	o.family = 6;
	o.proto = ctx->protocol;
	cookie = bpf_get_socket_cookie(ctx);
	bpf_map_update_elem(&fqdnd_sock_dns, &cookie, &o, BPF_ANY);
	if (mapped) {
		ctx->user_ip6[3] = proxy_addr4(cfg);
		ctx->user_port = cfg->port4;
		return REDIRECT_DONE;
	}
	proxy_addr6(cfg, proxy);
	store_ip6(ctx, proxy);
	ctx->user_port = cfg->port6;
	return REDIRECT_DONE;
}

SEC("cgroup/sendmsg4")
int fqdnd_sendmsg4(struct bpf_sock_addr *ctx)
{
	return redirect4(ctx) != REDIRECT_REFUSED;
}

SEC("cgroup/sendmsg6")
int fqdnd_sendmsg6(struct bpf_sock_addr *ctx)
{
	return redirect6(ctx) != REDIRECT_REFUSED;
}

/* recvmsg4 / getpeername4: the proxy's address becomes the destination the socket's last
 * redirected DNS message was sent to. Always 1 (these hooks cannot refuse). */
static __always_inline int restore4(struct bpf_sock_addr *ctx)
{
	struct fqdnd_sock_origin *o;
	struct fqdnd_dns_proxy *cfg;
	__u32 zero = 0, a;
	__u64 cookie;

	cfg = bpf_map_lookup_elem(&fqdnd_dns_proxy, &zero);
	if (!cfg || !cfg->port4 || ctx->user_port != cfg->port4 ||
	    ctx->user_ip4 != proxy_addr4(cfg))
		return 1;
	cookie = bpf_get_socket_cookie(ctx);
	o = bpf_map_lookup_elem(&fqdnd_sock_dns, &cookie);
	if (!o || o->family != 4)
		return 1;
	__builtin_memcpy(&a, o->addr, 4);
	ctx->user_ip4 = a;
	ctx->user_port = o->port;
	return 1;
}

/* recvmsg6 / getpeername6: the same for an IPv6 socket (the proxy's IPv6 address, or its
 * IPv4 address v4-mapped: then the record is sendmsg4's, IPv4, for an unconnected socket). */
static __always_inline int restore6(struct bpf_sock_addr *ctx)
{
	struct fqdnd_sock_origin *o;
	struct fqdnd_dns_proxy *cfg;
	__u32 zero = 0, a[4];
	__u64 cookie;

	cfg = bpf_map_lookup_elem(&fqdnd_dns_proxy, &zero);
	if (!cfg)
		return 1;
	load_ip6(ctx, a);
	if (v4_mapped(a)) {
		if (!cfg->port4 || ctx->user_port != cfg->port4 || a[3] != proxy_addr4(cfg))
			return 1;
	} else if (!cfg->port6 || ctx->user_port != cfg->port6 || !is_proxy6(cfg, a)) {
		return 1;
	}
	cookie = bpf_get_socket_cookie(ctx);
	o = bpf_map_lookup_elem(&fqdnd_sock_dns, &cookie);
	if (!o)
		return 1;
	if (o->family == 4 && v4_mapped(a)) {
		/* an unconnected dual-stack socket's datagram to a v4-mapped resolver: recorded by
		 * sendmsg4 (the kernel sent it as IPv4), shown v4-mapped as the socket wrote it */
		__builtin_memcpy(&a[3], o->addr, 4);
	} else if (o->family == 6) {
		__builtin_memcpy(a, o->addr, 16);
	} else {
		return 1;
	}
	store_ip6(ctx, a);
	ctx->user_port = o->port;
	return 1;
}

SEC("cgroup/recvmsg4")
int fqdnd_recvmsg4(struct bpf_sock_addr *ctx)
{
	return restore4(ctx);
}

SEC("cgroup/getpeername4")
int fqdnd_getpeername4(struct bpf_sock_addr *ctx)
{
	return restore4(ctx);
}

SEC("cgroup/recvmsg6")
int fqdnd_recvmsg6(struct bpf_sock_addr *ctx)
{
	return restore6(ctx);
}

SEC("cgroup/getpeername6")
int fqdnd_getpeername6(struct bpf_sock_addr *ctx)
{
	return restore6(ctx);
}

static __always_inline int is_loopback(const struct fqdnd_ct_key *key, const __u8 *addr)
{
	if (key->family == 4)
		return addr[0] == 127;
	{
		__u32 w[4];

		__builtin_memcpy(w, addr, 16);
		return !w[0] && !w[1] && !w[2] && w[3] == bpf_htonl(1);
	}
}

/* A packet to the proxy from an endpoint's socket: when the redirect recorded the socket,
 * the proxy will find the record under the packet's source address and port. */
static __always_inline void record_origin(struct __sk_buff *skb, const struct pkt *p)
{
	struct fqdnd_origin_key k = {};
	struct fqdnd_sock_origin *o;
	struct fqdnd_dns_proxy *cfg;
	__u32 zero = 0;
	__u64 cookie;

	if (p->key.proto != IPPROTO_UDP && p->key.proto != IPPROTO_TCP)
		return;
	cfg = bpf_map_lookup_elem(&fqdnd_dns_proxy, &zero);
	if (!cfg)
		return;
	if (p->key.family == 4) {
		__u32 d;

		__builtin_memcpy(&d, p->key.daddr, 4);
		if (!cfg->port4 || p->key.dport != cfg->port4 || d != proxy_addr4(cfg))
			return;
	} else {
		__u32 d[4];

		__builtin_memcpy(d, p->key.daddr, 16);
		if (!cfg->port6 || p->key.dport != cfg->port6 || !is_proxy6(cfg, d))
			return;
	}
	__builtin_memcpy(k.addr, p->key.saddr, 16);
	k.port = p->key.sport;
	k.proto = p->key.proto;
	k.family = p->key.family;
	cookie = bpf_get_socket_cookie(skb);
	o = bpf_map_lookup_elem(&fqdnd_sock_dns, &cookie);
	if (o)
		bpf_map_update_elem(&fqdnd_dns_origins, &k, o, BPF_ANY);
	else
		/* a socket that talks to the proxy directly: no record of an earlier socket on
		 * this address and port may speak for it */
		bpf_map_delete_elem(&fqdnd_dns_origins, &k);
}

/* Whether any cgroup endpoint exists (the skb programs' first question, for every packet of
 * the host). */
static __always_inline int cgroup_endpoints(void)
{
	struct fqdnd_sock_cfg *cfg;
	__u32 zero = 0;

	cfg = bpf_map_lookup_elem(&fqdnd_sock_cfg, &zero);
	return cfg && cfg->endpoints;
}

/* A TCP connect of an endpoint under egress policy to `daddr` (family 4 or 6, network order;
 * port `dport`) that its policy does not allow now: refused at once (EPERM) with a drop event,
 * instead of a SYN the egress program would drop and the caller would retry until it gives up.
 * The same decision as egress() for a new flow's first packet: loopback (and the unspecified
 * address, which the kernel connects to loopback) is not egress, DNS a redirecting endpoint did
 * not send to the proxy is dropped, else the destination's identity now and the endpoint's
 * policy. The endpoint is the calling process's (the DNS redirect's rule), in any network
 * namespace (the egress program checks them all). UDP is not refused here: its datagrams are,
 * at send (EPERM). 1 to go on, 0 to refuse. */
static __always_inline int connect_allowed(struct bpf_sock_addr *ctx, __u8 family,
					   const __u32 daddr[4])
{
	struct fqdnd_endpoint_value ep;
	struct fqdnd_ct_key key = {};
	__u32 identity;
	__u8 reason = FQDND_DROP_POLICY;

	if (ctx->protocol != IPPROTO_TCP || !cgroup_endpoints())
		return 1;
	if (!CGROUP_ENDPOINT(bpf_get_current_cgroup_id(), CURRENT_ANCESTOR, &ep))
		return 1;
	if (!(ep.flags & FQDND_EP_ENFORCE_EGRESS) && !(ep.flags & FQDND_EP_REDIRECT_DNS))
		return 1;
	key.family = family;
	key.proto = IPPROTO_TCP;
	key.dport = ctx->user_port;
	key.zone = FQDND_CT_ZONE_SOCKET;
	if (family == 4)
		__builtin_memcpy(key.daddr, &daddr[3], 4);
	else
		__builtin_memcpy(key.daddr, daddr, 16);
	if (is_loopback(&key, key.daddr) ||
	    (family == 4 ? !daddr[3] : !(daddr[0] | daddr[1] | daddr[2] | daddr[3])))
		return 1;
	identity = 0;
	if ((ep.flags & FQDND_EP_REDIRECT_DNS) && key.dport == bpf_htons(53)) {
		reason = FQDND_DROP_DNS_BYPASS;
	} else {
		if (!(ep.flags & FQDND_EP_ENFORCE_EGRESS) ||
		    allowed(ep.endpoint, &key, 0, &identity))
			return 1;
	}
	emit_sock(ep.endpoint, identity, key.daddr, family, key.dport, IPPROTO_TCP, reason);
	return 0;
}

SEC("cgroup/connect4")
int fqdnd_connect4(struct bpf_sock_addr *ctx)
{
	__u32 dst[4] = {};
	int r = redirect4(ctx);

	if (r != REDIRECT_NONE)
		return r == REDIRECT_DONE;
	dst[3] = ctx->user_ip4;
	return connect_allowed(ctx, 4, dst);
}

SEC("cgroup/connect6")
int fqdnd_connect6(struct bpf_sock_addr *ctx)
{
	__u32 dst[4];
	int r = redirect6(ctx);

	if (r != REDIRECT_NONE)
		return r == REDIRECT_DONE;
	load_ip6(ctx, dst);
	return connect_allowed(ctx, v4_mapped(dst) ? 4 : 6, dst);
}

SEC("cgroup_skb/egress")
int fqdnd_sock_egress(struct __sk_buff *skb)
{
	struct fqdnd_endpoint_value ep;
	struct pkt p = {};
	__u16 backend = 0;
	__u8 follow = 1;
	__u64 now;
	int r, verdict;

	if (!cgroup_endpoints() || !CGROUP_ENDPOINT(bpf_skb_cgroup_id(skb), SKB_ANCESTOR, &ep))
		return SOCK_PASS;
	r = parse_l3(skb, &p, 0, skb->protocol);
	if (r == PARSE_NOT_IP || r == PARSE_ALWAYS_PASS)
		return SOCK_PASS;
	p.key.zone = FQDND_CT_ZONE_SOCKET;
	if (is_loopback(&p.key, p.key.daddr)) {
		/* the host itself, the proxy included: not egress */
		if (r == PARSE_OK && (ep.flags & FQDND_EP_REDIRECT_DNS))
			record_origin(skb, &p);
		return SOCK_PASS;
	}
	now = bpf_ktime_get_ns();
	verdict = egress(skb, &p, r, &ep, now, &backend, &follow, 1);
	frag_record(&p, verdict == TC_ACT_OK && follow, 0, 0, now);
	return verdict == TC_ACT_OK ? SOCK_PASS : SOCK_DROP;
}

SEC("cgroup_skb/ingress")
int fqdnd_sock_ingress(struct __sk_buff *skb)
{
	struct fqdnd_endpoint_value ep;
	struct pkt p = {};
	__u16 rev_nat = 0;
	int r;

	if (!cgroup_endpoints() || !CGROUP_ENDPOINT(bpf_skb_cgroup_id(skb), SKB_ANCESTOR, &ep))
		return SOCK_PASS;
	r = parse_l3(skb, &p, 0, skb->protocol);
	if (r == PARSE_NOT_IP || r == PARSE_ALWAYS_PASS)
		return SOCK_PASS;
	p.key.zone = FQDND_CT_ZONE_SOCKET;
	/* the host itself, the proxy's answers included */
	if (is_loopback(&p.key, p.key.saddr))
		return SOCK_PASS;
	return ingress(skb, &p, r, &ep, bpf_ktime_get_ns(), &rev_nat, 1) == TC_ACT_OK ? SOCK_PASS
											: SOCK_DROP;
}
