// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * The tc programs of interface endpoints, attached (TCX) to the host side of an endpoint's
 * veth, to a gateway's LAN interface (by source) or to the bridge of bridged endpoints.
 * Compiled as part of policy.c (one object); the headers they use are in lib/.
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
#include <bpf/bpf_helpers.h>

#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/events.h"
#include "lib/endpoints.h"
#include "lib/redirect.h"
#include "lib/frag.h"
#include "lib/verdict.h"

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
