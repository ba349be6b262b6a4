// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * Drop events into the fqdnd_events ring buffer (struct fqdnd_drop_event).
 */
#ifndef FQDND_LIB_EVENTS_H
#define FQDND_LIB_EVENTS_H

#include "maps.h"
#include "parse.h"

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

#endif /* FQDND_LIB_EVENTS_H */
