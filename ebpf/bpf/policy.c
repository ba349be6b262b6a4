// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * fqdnd egress policy: tc programs on the host side of an endpoint's veth.
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
 *  fqdnd_to_ep    host-side veth *egress* = the endpoint's ingress. No ingress policy:
 *                 records inbound flows in conntrack so the endpoint's replies pass, tracks
 *                 the TCP state of replies, and gives a service backend's replies the VIP
 *                 back as their source.
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

/* Fills p with the packet's tuple (addresses, protocol, ports or ICMP identifier), where its
 * L4 header starts, and whether it is a fragment. IPv6 extension headers are walked. */
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	struct ethhdr eth;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return PARSE_NOT_IP;

	if (eth.h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		__u16 fo;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
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
		p->l4 = ETH_HLEN + ip.ihl * 4;
		return parse_l4(skb, p);
	}
	if (eth.h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		__u32 off = ETH_HLEN + sizeof(ip6);
		__u8 nh;
		int i;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
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

/* ---- conntrack ---- */

static __always_inline void reverse(const struct fqdnd_ct_key *in, struct fqdnd_ct_key *out)
{
	__builtin_memcpy(out->saddr, in->daddr, 16);
	__builtin_memcpy(out->daddr, in->saddr, 16);
	out->sport = in->dport;
	out->dport = in->sport;
	out->proto = in->proto;
	out->family = in->family;
	out->pad[0] = 0;
	out->pad[1] = 0;
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

static __always_inline __u32 identity_of(const struct fqdnd_ct_key *key)
{
	struct fqdnd_ipcache_value *v;

	if (key->family == 4) {
		struct fqdnd_ipcache_key4 k = { .prefixlen = 32 };

		__builtin_memcpy(k.addr, key->daddr, 4);
		v = bpf_map_lookup_elem(&fqdnd_ipc4, &k);
		return v ? v->identity : FQDND_ID_WORLD_IPV4;
	}
	struct fqdnd_ipcache_key6 k6 = { .prefixlen = 128 };

	__builtin_memcpy(k6.addr, key->daddr, 16);
	v = bpf_map_lookup_elem(&fqdnd_ipc6, &k6);
	return v ? v->identity : FQDND_ID_WORLD_IPV6;
}

/* The endpoint's policy for (identity, proto, dport in network order): the longest entry of
 * the identity, else of any identity. Entries are allow entries only. */
static __always_inline int policy_allows(__u16 endpoint, __u32 identity, __u8 proto, __u16 dport)
{
	struct fqdnd_policy_key k = {};
	struct fqdnd_policy_value *v;

	k.prefixlen = FQDND_POLICY_PREFIX_FULL;
	k.identity = identity;
	k.endpoint = endpoint;
	k.proto = proto;
	k.dport = dport;
	v = bpf_map_lookup_elem(&fqdnd_policy, &k);
	if (v && (v->flags & FQDND_POLICY_ALLOW))
		return 1;
	k.identity = FQDND_ID_ANY;
	v = bpf_map_lookup_elem(&fqdnd_policy, &k);
	return v && (v->flags & FQDND_POLICY_ALLOW);
}

/* Whether the endpoint may send the packet of tuple `key` (its destination's identity, now,
 * into *identity). ICMP tuples carry dport 0: only entries for every port and protocol
 * (L3 rules) match them. */
static __always_inline int allowed(__u16 endpoint, const struct fqdnd_ct_key *key, __u32 *identity)
{
	__u16 dport = is_icmp(key) ? 0 : key->dport;

	*identity = identity_of(key);
	return policy_allows(endpoint, *identity, key->proto, dport);
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
	if ((ep->flags & FQDND_EP_ENFORCE_EGRESS) && !allowed(ep->endpoint, &tkey, &identity)) {
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
	if ((ep->flags & FQDND_EP_ENFORCE_EGRESS) && !allowed(ep->endpoint, &tkey, &identity)) {
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
	akey.pad[0] = 0;
	akey.pad[1] = 0;
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

/* Whether an ICMP error relates to a tracked flow: the packet it embeds (which the endpoint
 * received: its destination is the error's source and its source the error's destination)
 * has a live conntrack entry in either direction. */
static __always_inline int icmp_related(struct __sk_buff *skb, const struct pkt *p, __u64 now)
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
	if (__builtin_memcmp(ik.daddr, p->key.saddr, 16) ||
	    __builtin_memcmp(ik.saddr, p->key.daddr, 16))
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
 * fragments of a passed first fragment must not follow it. */
static __always_inline int egress(struct __sk_buff *skb, struct pkt *p, int r,
				  const struct fqdnd_endpoint_value *ep, __u64 now, __u16 *backend,
				  __u8 *follow)
{
	int enforce = ep->flags & FQDND_EP_ENFORCE_EGRESS;
	struct fqdnd_ct_value *ct;
	__u32 identity;

	if (r == PARSE_LATER_FRAGMENT) {
		struct fqdnd_frag_value *f = frag_find(p, now);

		if (f) {
			struct fqdnd_lb_backend be;

			if (!f->backend)
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
		/* related errors pass both ways (path MTU discovery); no other ICMP */
		if (!enforce || (p->icmp == ICMP_ERROR && icmp_related(skb, p, now)))
			return TC_ACT_OK;
		emit_drop(skb, ep->endpoint, 0, p, FQDND_DROP_ICMP);
		return TC_ACT_SHOT;
	}

	if ((ep->flags & FQDND_EP_REDIRECT_DNS) && p->icmp == ICMP_NONE &&
	    p->key.dport == bpf_htons(53)) {
		/* a fragmented query's later fragments would go to the original destination,
		 * past the proxy: they are dropped */
		*follow = 0;
		if (redirect_dns(skb, &p->key) == 0) {
			skb->mark = (skb->mark & ~FQDND_MARK_MASK) | FQDND_MARK_TO_PROXY;
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
		if (ct->backend) {
			__u16 id = ct->backend;

			r = lb_established(skb, p, ct, ep, now);
			if (r != LB_NONE) {
				*backend = id;
				return r == LB_PASS ? TC_ACT_OK : TC_ACT_SHOT;
			}
			/* its backend is gone: chosen again below, like a new flow */
		} else {
			if (enforce && !allowed(ep->endpoint, &p->key, &identity)) {
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
	if (p->icmp == ICMP_NONE) {
		r = lb_new_flow(skb, p, ep, now, backend);
		if (r != LB_NONE)
			return r == LB_PASS ? TC_ACT_OK : TC_ACT_SHOT;
	}
	if (enforce && !allowed(ep->endpoint, &p->key, &identity)) {
		emit_drop(skb, ep->endpoint, identity, p, FQDND_DROP_POLICY);
		return TC_ACT_SHOT;
	}
	ct_create(&p->key, p, FQDND_CT_EGRESS, 0, 0, now);
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
	verdict = egress(skb, &p, r, &ep, now, &backend, &follow);
	frag_record(&p, verdict == TC_ACT_OK && follow, backend, 0, now);
	return verdict;
}

SEC("classifier")
int fqdnd_to_ep(struct __sk_buff *skb)
{
	struct pkt p = {};
	struct fqdnd_endpoint_value ep;
	struct fqdnd_endpoint_value *iface;
	struct fqdnd_ct_value *ct;
	__u32 ifindex = skb->ifindex;
	__u64 now;
	int r;

	iface = bpf_map_lookup_elem(&fqdnd_endpoints, &ifindex);
	if (!iface)
		return TC_ACT_OK;
	ep = *iface;
	r = parse(skb, &p);
	if (r == PARSE_LATER_FRAGMENT) {
		/* no ingress policy; a service's reply datagram gets its VIP back */
		struct fqdnd_frag_value *f = frag_find(&p, bpf_ktime_get_ns());
		struct fqdnd_lb_revnat *rn;
		__u16 rev_nat;

		if (!f || !f->rev_nat)
			return TC_ACT_OK;
		rev_nat = f->rev_nat;
		rn = bpf_map_lookup_elem(&fqdnd_lb_revnat, &rev_nat);
		if (!rn || rn->family != p.key.family)
			return TC_ACT_OK;
		return rewrite_l3(skb, p.key.family, 0, p.key.saddr, rn->addr) ? TC_ACT_SHOT
									       : TC_ACT_OK;
	}
	if (r != PARSE_OK)
		return TC_ACT_OK;
	if ((ep.flags & FQDND_EP_BY_SOURCE) && !client_of(&p.key, p.key.daddr, &ep))
		return TC_ACT_OK;
	/* The proxy's answers to redirected DNS: no conntrack entry (the queries never consult
	 * conntrack, and an INGRESS entry would let them pass as replies without the redirect). */
	if ((ep.flags & FQDND_EP_REDIRECT_DNS) && p.icmp == ICMP_NONE &&
	    p.key.sport == bpf_htons(53))
		return TC_ACT_OK;
	/* no ingress policy: ICMP errors (path MTU discovery) and other ICMP pass untracked */
	if (p.icmp == ICMP_ERROR || p.icmp == ICMP_OTHER)
		return TC_ACT_OK;
	now = bpf_ktime_get_ns();
	ct = ct_lookup(&p.key, now);
	if (ct) {
		ct_refresh(ct, &p, 1, now);
		return TC_ACT_OK;
	}
	ct = ct_reply(&p.key, FQDND_CT_EGRESS, now);
	if (ct) {
		__u16 rev_nat = ct->rev_nat;

		ct_refresh(ct, &p, 0, now);
		if (rev_nat) {
			if (lb_reply(skb, &p, rev_nat, now) == LB_DROP)
				return TC_ACT_SHOT;
			frag_record(&p, 1, 0, rev_nat, now);
		}
		return TC_ACT_OK;
	}
	/* A flow opened towards the endpoint: its replies will pass. Only a SYN opens a TCP flow
	 * (a stray segment, say of a flow whose entry died, must not make the endpoint's packets
	 * replies), only a request an echo. */
	if (p.key.proto == IPPROTO_TCP && (p.tcp_flags & (TH_SYN | TH_ACK)) != TH_SYN)
		return TC_ACT_OK;
	if (p.icmp == ICMP_ECHO_REPLY)
		return TC_ACT_OK;
	ct_create(&p.key, &p, FQDND_CT_INGRESS, 0, 0, now);
	return TC_ACT_OK;
}
