// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * Conntrack (fqdnd_ct): entries keyed by tuple and zone, TCP state (SYN, established,
 * closing after FIN both ways or RST) and an expiry per entry (lifetimes in fqdnd_settings).
 * A dead entry (past its expiry) is treated as absent.
 */
#ifndef FQDND_LIB_CONNTRACK_H
#define FQDND_LIB_CONNTRACK_H

#include "maps.h"
#include "parse.h"

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

#endif /* FQDND_LIB_CONNTRACK_H */
