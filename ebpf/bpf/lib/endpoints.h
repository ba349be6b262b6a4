// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * Endpoints: the client prefix of a by-source interface (fqdnd_clients4/6) and source
 * validation against an interface's addresses (fqdnd_ep_addrs).
 */
#ifndef FQDND_LIB_ENDPOINTS_H
#define FQDND_LIB_ENDPOINTS_H

#include "maps.h"

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

#endif /* FQDND_LIB_ENDPOINTS_H */
