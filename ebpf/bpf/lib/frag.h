// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * Fragments (fqdnd_frags): a first fragment is classified like any packet; the later
 * fragments of a datagram whose first one passed follow it (with its ports, backend or VIP).
 */
#ifndef FQDND_LIB_FRAG_H
#define FQDND_LIB_FRAG_H

#include "maps.h"
#include "parse.h"

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

#endif /* FQDND_LIB_FRAG_H */
