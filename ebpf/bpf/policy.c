// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * fqdnd egress policy: tc programs on the host side of an endpoint's veth.
 *
 *  fqdnd_from_ep  host-side veth *ingress* = the endpoint's egress. DNS redirect first
 *                 (endpoints flagged REDIRECT_DNS: UDP/TCP dport 53 is assigned to the DNS
 *                 proxy's socket and marked for local delivery; no policy, no conntrack),
 *                 then conntrack (established flows and replies to inbound flows pass with no
 *                 policy lookup), then ipcache LPM (destination → identity, world when
 *                 unknown), then the endpoint's policy map; allow creates a conntrack entry,
 *                 deny drops and emits a ring-buffer event. Endpoints not flagged enforcing
 *                 pass.
 *                 New flows to a service VIP (fqdnd_lb_svc) are translated to a backend
 *                 first and policy is checked against the backend; conntrack keeps the
 *                 backend for the flow's later packets.
 *  fqdnd_to_ep    host-side veth *egress* = the endpoint's ingress. No ingress policy yet:
 *                 records inbound flows in conntrack so the endpoint's replies pass, and
 *                 gives a service backend's replies the VIP back as their source.
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
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct fqdnd_policy_key);
	__type(value, struct fqdnd_policy_value);
	__uint(max_entries, FQDND_POLICY_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_policy SEC(".maps");

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

enum parse_result {
	PARSE_OK = 0,        /* TCP/UDP flow in key */
	PARSE_NOT_IP,        /* ARP and friends: pass */
	PARSE_ALWAYS_PASS,   /* IPv6 neighbour discovery, link-local multicast */
	PARSE_UNHANDLED,     /* IP we do not classify: fragments, ICMP, extension headers */
};

#define IP_MF     0x2000
#define IP_OFFSET 0x1FFF

/* Fills `key` with the packet's tuple and `*l4_off` with where its TCP/UDP header starts. */
static __always_inline int parse(struct __sk_buff *skb, struct fqdnd_ct_key *key, __u32 *l4_off)
{
	struct ethhdr eth;
	__u16 ports[2];
	__u32 l4;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return PARSE_NOT_IP;

	if (eth.h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
			return PARSE_UNHANDLED;
		__builtin_memcpy(key->saddr, &ip.saddr, 4);
		__builtin_memcpy(key->daddr, &ip.daddr, 4);
		key->proto = ip.protocol;
		key->family = 4;
		/* link-local multicast (224.0.0.0/24: IGMP, ...) never leaves the link */
		if (key->daddr[0] == 224 && key->daddr[1] == 0 && key->daddr[2] == 0)
			return PARSE_ALWAYS_PASS;
		if (ip.ihl < 5)
			return PARSE_UNHANDLED;
		if (ip.frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return PARSE_UNHANDLED;
		l4 = ETH_HLEN + ip.ihl * 4;
	} else if (eth.h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
			return PARSE_UNHANDLED;
		__builtin_memcpy(key->saddr, &ip6.saddr, 16);
		__builtin_memcpy(key->daddr, &ip6.daddr, 16);
		key->proto = ip6.nexthdr;
		key->family = 6;
		/* link-local scope multicast (ff02::/16 and friends: MLD reports with their
		 * hop-by-hop header, ND) never leaves the link */
		if (key->daddr[0] == 0xff && (key->daddr[1] & 0x0f) <= 0x02)
			return PARSE_ALWAYS_PASS;
		l4 = ETH_HLEN + sizeof(ip6);
		if (ip6.nexthdr == IPPROTO_ICMPV6) {
			__u8 type;

			if (bpf_skb_load_bytes(skb, l4, &type, 1) < 0)
				return PARSE_UNHANDLED;
			/* router/neighbour solicitation/advertisement, redirect */
			if (type >= 133 && type <= 137)
				return PARSE_ALWAYS_PASS;
			return PARSE_UNHANDLED;
		}
	} else {
		return PARSE_NOT_IP;
	}

	if (key->proto != IPPROTO_TCP && key->proto != IPPROTO_UDP)
		return PARSE_UNHANDLED;
	if (bpf_skb_load_bytes(skb, l4, ports, sizeof(ports)) < 0)
		return PARSE_UNHANDLED;
	key->sport = ports[0];
	key->dport = ports[1];
	*l4_off = l4;
	return PARSE_OK;
}

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

/* The entry of the packet's own tuple, refreshed; NULL when there is none. */
static __always_inline struct fqdnd_ct_value *ct_touch(const struct fqdnd_ct_key *key, __u64 now)
{
	struct fqdnd_ct_value *v = bpf_map_lookup_elem(&fqdnd_ct, key);

	if (v)
		v->last_seen_ns = now;
	return v;
}

/* The entry of the reverse tuple when it carries `want` (the packet is a reply in that
 * flow), refreshed; NULL otherwise. */
static __always_inline struct fqdnd_ct_value *ct_reply(const struct fqdnd_ct_key *key, __u32 want,
						      __u64 now)
{
	struct fqdnd_ct_key rkey;
	struct fqdnd_ct_value *v;

	reverse(key, &rkey);
	v = bpf_map_lookup_elem(&fqdnd_ct, &rkey);
	if (!v || !(v->flags & want))
		return NULL;
	v->last_seen_ns = now;
	return v;
}

static __always_inline void ct_create_lb(const struct fqdnd_ct_key *key, __u32 flags,
					 __u16 rev_nat, __u16 backend, __u64 update)
{
	struct fqdnd_ct_value v = {};

	v.created_ns = bpf_ktime_get_ns();
	v.last_seen_ns = v.created_ns;
	v.flags = flags;
	v.rev_nat = rev_nat;
	v.backend = backend;
	bpf_map_update_elem(&fqdnd_ct, key, &v, update);
}

static __always_inline void ct_create(const struct fqdnd_ct_key *key, __u32 flags)
{
	ct_create_lb(key, flags, 0, 0, BPF_NOEXIST);
}

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

static __always_inline int policy_lookup(struct fqdnd_policy_key *k)
{
	struct fqdnd_policy_value *v;
	__u8 proto = k->proto;

	v = bpf_map_lookup_elem(&fqdnd_policy, k);
	if (v && (v->flags & FQDND_POLICY_ALLOW))
		return 1;
	k->proto = FQDND_PROTO_ANY;
	v = bpf_map_lookup_elem(&fqdnd_policy, k);
	k->proto = proto;
	return v && (v->flags & FQDND_POLICY_ALLOW);
}

/* Exact (identity, port), (identity, any port), (any identity, port), (any, any); each with
 * the packet's protocol, then protocol ANY. */
static __always_inline int policy_allows(__u16 endpoint, __u32 identity, __u8 proto, __u16 dport)
{
	struct fqdnd_policy_key k = {};

	k.endpoint = endpoint;
	k.proto = proto;
	k.identity = identity;
	k.dport = dport;
	if (policy_lookup(&k))
		return 1;
	k.dport = 0;
	if (policy_lookup(&k))
		return 1;
	k.identity = FQDND_ID_ANY;
	k.dport = dport;
	if (policy_lookup(&k))
		return 1;
	k.dport = 0;
	return policy_lookup(&k);
}

static __always_inline void emit_drop(struct __sk_buff *skb, __u16 endpoint, __u32 identity,
				      const struct fqdnd_ct_key *key, __u8 reason)
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
	e->sport = bpf_ntohs(key->sport);
	e->dport = bpf_ntohs(key->dport);
	e->proto = key->proto;
	e->family = key->family;
	e->reason = reason;
	__builtin_memcpy(e->saddr, key->saddr, 16);
	__builtin_memcpy(e->daddr, key->daddr, 16);
	bpf_ringbuf_submit(e, 0);
}

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

/* A packet of an established service flow (`ct`: the entry of its client → VIP tuple):
 * translated to the flow's backend, whose own entry is refreshed (recreated if the LRU
 * evicted it). LB_NONE when the backend is gone: the caller treats it as a new flow. */
static __always_inline int lb_established(struct __sk_buff *skb, const struct fqdnd_ct_key *key,
					  __u32 l4, const struct fqdnd_ct_value *ct, __u64 now)
{
	struct fqdnd_lb_backend be;
	struct fqdnd_ct_key tkey;
	__u16 rev_nat = ct->rev_nat;

	if (backend_of(ct->backend, key, &be))
		return LB_NONE;
	to_backend(key, &be, &tkey);
	if (!ct_touch(&tkey, now))
		ct_create_lb(&tkey, FQDND_CT_EGRESS, rev_nat, 0, BPF_NOEXIST);
	return rewrite(skb, key, l4, 1, be.addr, be.port) ? LB_DROP : LB_PASS;
}

/* A new flow: when its destination is a service, picks the backend of slot
 * (flow hash % count) + 1, checks the endpoint's policy against the backend (its identity
 * and port), records both conntrack entries and translates the packet. */
static __always_inline int lb_new_flow(struct __sk_buff *skb, const struct fqdnd_ct_key *key,
				       __u32 l4, const struct fqdnd_endpoint_value *ep)
{
	struct fqdnd_lb_svc_key sk = {};
	struct fqdnd_lb_svc_value *svc;
	struct fqdnd_lb_backend be;
	struct fqdnd_ct_key tkey;
	__u16 rev_nat, id;
	__u32 identity;

	__builtin_memcpy(sk.addr, key->daddr, 16);
	sk.dport = key->dport;
	sk.proto = key->proto;
	sk.family = key->family;
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
	if (backend_of(id, key, &be))
		goto no_backend;
	to_backend(key, &be, &tkey);
	if (ep->flags & FQDND_EP_ENFORCE_EGRESS) {
		identity = identity_of(&tkey);
		if (!policy_allows(ep->endpoint, identity, key->proto, bpf_ntohs(be.port))) {
			emit_drop(skb, ep->endpoint, identity, &tkey, FQDND_DROP_POLICY);
			return LB_DROP;
		}
	}
	/* BPF_ANY: replaces the entry of a flow whose backend went away */
	ct_create_lb(key, FQDND_CT_EGRESS, rev_nat, id, BPF_ANY);
	ct_create_lb(&tkey, FQDND_CT_EGRESS, rev_nat, 0, BPF_ANY);
	return rewrite(skb, key, l4, 1, be.addr, be.port) ? LB_DROP : LB_PASS;

no_backend:
	emit_drop(skb, ep->endpoint, 0, key, FQDND_DROP_NO_BACKEND);
	return LB_DROP;
}

/* A backend's reply in a service flow (`rev_nat` from the entry of its client → backend
 * tuple): the source becomes the VIP and service port again, and the client → VIP entry is
 * refreshed too (so a flow whose packets mostly come back stays alive in both). A service
 * removed meanwhile leaves the reply as it is. */
static __always_inline int lb_reply(struct __sk_buff *skb, const struct fqdnd_ct_key *key,
				    __u32 l4, __u16 rev_nat, __u64 now)
{
	struct fqdnd_lb_revnat *rn = bpf_map_lookup_elem(&fqdnd_lb_revnat, &rev_nat);
	struct fqdnd_ct_key akey;
	__u8 addr[16];
	__u16 port;

	if (!rn || rn->family != key->family)
		return LB_PASS;
	__builtin_memcpy(addr, rn->addr, 16);
	port = rn->port;
	__builtin_memcpy(akey.saddr, key->daddr, 16);
	__builtin_memcpy(akey.daddr, addr, 16);
	akey.sport = key->dport;
	akey.dport = port;
	akey.proto = key->proto;
	akey.family = key->family;
	akey.pad[0] = 0;
	akey.pad[1] = 0;
	ct_touch(&akey, now);
	return rewrite(skb, key, l4, 0, addr, port) ? LB_DROP : LB_PASS;
}

SEC("classifier")
int fqdnd_from_ep(struct __sk_buff *skb)
{
	struct fqdnd_ct_key key = {};
	struct fqdnd_endpoint_value ep;
	struct fqdnd_endpoint_value *iface;
	struct fqdnd_ct_value *ct;
	__u32 ifindex = skb->ifindex;
	__u64 now = bpf_ktime_get_ns();
	__u32 identity, l4 = 0;
	int enforce, r;

	iface = bpf_map_lookup_elem(&fqdnd_endpoints, &ifindex);
	if (!iface)
		return TC_ACT_OK;
	ep = *iface;

	r = parse(skb, &key, &l4);
	if (r == PARSE_NOT_IP || r == PARSE_ALWAYS_PASS)
		return TC_ACT_OK;
	if ((ep.flags & FQDND_EP_BY_SOURCE) && !client_of(&key, key.saddr, &ep)) {
		/* a source no client prefix holds: the interface entry's ENFORCE decides */
		if (!(ep.flags & FQDND_EP_ENFORCE_EGRESS))
			return TC_ACT_OK;
		emit_drop(skb, 0, 0, &key,
			  r == PARSE_OK ? FQDND_DROP_POLICY : FQDND_DROP_UNHANDLED);
		return TC_ACT_SHOT;
	}
	enforce = ep.flags & FQDND_EP_ENFORCE_EGRESS;
	if (r == PARSE_UNHANDLED) {
		if (!enforce)
			return TC_ACT_OK;
		emit_drop(skb, ep.endpoint, 0, &key, FQDND_DROP_UNHANDLED);
		return TC_ACT_SHOT;
	}

	if ((ep.flags & FQDND_EP_REDIRECT_DNS) && key.dport == bpf_htons(53)) {
		if (redirect_dns(skb, &key) == 0) {
			skb->mark = (skb->mark & ~FQDND_MARK_MASK) | FQDND_MARK_TO_PROXY;
			return TC_ACT_OK;
		}
		/* fail closed: DNS never bypasses the proxy */
		emit_drop(skb, ep.endpoint, 0, &key, FQDND_DROP_NO_PROXY);
		return TC_ACT_SHOT;
	}

	ct = ct_touch(&key, now);
	if (ct) {
		if (!ct->backend)
			return TC_ACT_OK;
		r = lb_established(skb, &key, l4, ct, now);
		if (r != LB_NONE)
			return r == LB_PASS ? TC_ACT_OK : TC_ACT_SHOT;
		/* its backend is gone: chosen again below, like a new flow */
	} else if (ct_reply(&key, FQDND_CT_INGRESS, now)) {
		return TC_ACT_OK;
	}

	r = lb_new_flow(skb, &key, l4, &ep);
	if (r != LB_NONE)
		return r == LB_PASS ? TC_ACT_OK : TC_ACT_SHOT;

	if (enforce) {
		identity = identity_of(&key);
		if (!policy_allows(ep.endpoint, identity, key.proto, bpf_ntohs(key.dport))) {
			emit_drop(skb, ep.endpoint, identity, &key, FQDND_DROP_POLICY);
			return TC_ACT_SHOT;
		}
	}
	ct_create(&key, FQDND_CT_EGRESS);
	return TC_ACT_OK;
}

SEC("classifier")
int fqdnd_to_ep(struct __sk_buff *skb)
{
	struct fqdnd_ct_key key = {};
	struct fqdnd_endpoint_value ep;
	struct fqdnd_endpoint_value *iface;
	struct fqdnd_ct_value *ct;
	__u32 ifindex = skb->ifindex;
	__u64 now = bpf_ktime_get_ns();
	__u32 l4 = 0;

	iface = bpf_map_lookup_elem(&fqdnd_endpoints, &ifindex);
	if (!iface)
		return TC_ACT_OK;
	ep = *iface;
	if (parse(skb, &key, &l4) != PARSE_OK)
		return TC_ACT_OK;
	if ((ep.flags & FQDND_EP_BY_SOURCE) && !client_of(&key, key.daddr, &ep))
		return TC_ACT_OK;
	/* The proxy's answers to redirected DNS: no conntrack entry (the queries never consult
	 * conntrack, and an INGRESS entry would let them pass as replies without the redirect). */
	if ((ep.flags & FQDND_EP_REDIRECT_DNS) && key.sport == bpf_htons(53))
		return TC_ACT_OK;
	if (ct_touch(&key, now))
		return TC_ACT_OK;
	ct = ct_reply(&key, FQDND_CT_EGRESS, now);
	if (ct) {
		if (ct->rev_nat && lb_reply(skb, &key, l4, ct->rev_nat, now) == LB_DROP)
			return TC_ACT_SHOT;
		return TC_ACT_OK;
	}
	ct_create(&key, FQDND_CT_INGRESS);
	return TC_ACT_OK;
}
