// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * The DNS redirect of the tc programs: a DNS packet is assigned to the proxy's socket
 * (bpf_sk_assign) and marked for local delivery; the bridge of bridged endpoints assigns it
 * again. (Host processes' sockets are redirected by the socket programs: bpf_sock.c.)
 */
#ifndef FQDND_LIB_REDIRECT_H
#define FQDND_LIB_REDIRECT_H

#include <linux/pkt_cls.h>

#include "maps.h"
#include "parse.h"
#include "events.h"
#include "endpoints.h"

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

#endif /* FQDND_LIB_REDIRECT_H */
