// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * The verdicts on an endpoint's packets, shared by the tc programs (bpf_tc.c) and the cgroup
 * skb programs of host processes (bpf_sock.c): egress() on what the endpoint sends, ingress()
 * on what it receives, and whether an ICMP error relates to a tracked flow.
 */
#ifndef FQDND_LIB_VERDICT_H
#define FQDND_LIB_VERDICT_H

#include <linux/pkt_cls.h>

#include "maps.h"
#include "parse.h"
#include "conntrack.h"
#include "policy.h"
#include "events.h"
#include "redirect.h"
#include "lb.h"
#include "frag.h"

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

#endif /* FQDND_LIB_VERDICT_H */
