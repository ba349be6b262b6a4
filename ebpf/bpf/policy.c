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
 *  fqdnd_to_ep    host-side veth *egress* = the endpoint's ingress. No ingress policy yet:
 *                 records inbound flows in conntrack so the endpoint's replies pass.
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

static __always_inline int parse(struct __sk_buff *skb, struct fqdnd_ct_key *key)
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

/* An existing entry in either direction: touch it and say so. `want_reverse` is the flag the
 * reverse entry must carry for this direction to count as its reply. */
static __always_inline int ct_established(const struct fqdnd_ct_key *key, __u32 want_reverse)
{
	struct fqdnd_ct_key rkey;
	struct fqdnd_ct_value *v;
	__u64 now = bpf_ktime_get_ns();

	v = bpf_map_lookup_elem(&fqdnd_ct, key);
	if (v) {
		v->last_seen_ns = now;
		return 1;
	}
	reverse(key, &rkey);
	v = bpf_map_lookup_elem(&fqdnd_ct, &rkey);
	if (v && (v->flags & want_reverse)) {
		v->last_seen_ns = now;
		return 1;
	}
	return 0;
}

static __always_inline void ct_create(const struct fqdnd_ct_key *key, __u32 flags)
{
	struct fqdnd_ct_value v = {};

	v.created_ns = bpf_ktime_get_ns();
	v.last_seen_ns = v.created_ns;
	v.flags = flags;
	bpf_map_update_elem(&fqdnd_ct, key, &v, BPF_NOEXIST);
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

SEC("classifier")
int fqdnd_from_ep(struct __sk_buff *skb)
{
	struct fqdnd_ct_key key = {};
	struct fqdnd_endpoint_value ep;
	struct fqdnd_endpoint_value *iface;
	__u32 ifindex = skb->ifindex;
	__u32 identity;
	int enforce, r;

	iface = bpf_map_lookup_elem(&fqdnd_endpoints, &ifindex);
	if (!iface)
		return TC_ACT_OK;
	ep = *iface;

	r = parse(skb, &key);
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

	if (ct_established(&key, FQDND_CT_INGRESS))
		return TC_ACT_OK;

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
	__u32 ifindex = skb->ifindex;

	iface = bpf_map_lookup_elem(&fqdnd_endpoints, &ifindex);
	if (!iface)
		return TC_ACT_OK;
	ep = *iface;
	if (parse(skb, &key) != PARSE_OK)
		return TC_ACT_OK;
	if ((ep.flags & FQDND_EP_BY_SOURCE) && !client_of(&key, key.daddr, &ep))
		return TC_ACT_OK;
	/* The proxy's answers to redirected DNS: no conntrack entry (the queries never consult
	 * conntrack, and an INGRESS entry would let them pass as replies without the redirect). */
	if ((ep.flags & FQDND_EP_REDIRECT_DNS) && key.sport == bpf_htons(53))
		return TC_ACT_OK;
	if (ct_established(&key, FQDND_CT_EGRESS))
		return TC_ACT_OK;
	ct_create(&key, FQDND_CT_INGRESS);
	return TC_ACT_OK;
}
