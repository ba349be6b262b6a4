// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * Service load balancing (maps and design: include/fqdnd_maps.h): a new flow to a service
 * VIP is translated to a backend chosen by flow hash, conntrack keeps the backend for its
 * later packets, and the backend's replies get the VIP back. The endpoint's policy is checked
 * against the backend.
 */
#ifndef FQDND_LIB_LB_H
#define FQDND_LIB_LB_H

#include "maps.h"
#include "parse.h"
#include "conntrack.h"
#include "policy.h"
#include "events.h"

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

#endif /* FQDND_LIB_LB_H */
