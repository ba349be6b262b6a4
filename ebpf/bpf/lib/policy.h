// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * Policy: identities from the ipcache (LPM, world when unknown) and the endpoint's policy
 * entries (LPM over identity, protocol, port prefix; a deny wins over allows).
 */
#ifndef FQDND_LIB_POLICY_H
#define FQDND_LIB_POLICY_H

#include "maps.h"
#include "parse.h"

/* The identity of an address of the tuple's family (world when the ipcache has none). */
static __always_inline __u32 identity_of_addr(const struct fqdnd_ct_key *key, const __u8 *addr)
{
	struct fqdnd_ipcache_value *v;

	if (key->family == 4) {
		struct fqdnd_ipcache_key4 k = { .prefixlen = 32 };

		__builtin_memcpy(k.addr, addr, 4);
		v = bpf_map_lookup_elem(&fqdnd_ipc4, &k);
		return v ? v->identity : FQDND_ID_WORLD_IPV4;
	}
	struct fqdnd_ipcache_key6 k6 = { .prefixlen = 128 };

	__builtin_memcpy(k6.addr, addr, 16);
	v = bpf_map_lookup_elem(&fqdnd_ipc6, &k6);
	return v ? v->identity : FQDND_ID_WORLD_IPV6;
}

/* The endpoint's policy for (identity, proto, dport in network order), `dir` 0 (egress) or
 * FQDND_POLICY_ID_INGRESS: the longest entry of the identity decides; when it has none, the
 * longest of any identity. A deny entry drops (userspace makes a deny at least as long as
 * every allow it overlaps, so a deny wins). */
static __always_inline int policy_allows(__u16 endpoint, __u32 identity, __u32 dir, __u8 proto,
					 __u16 dport)
{
	struct fqdnd_policy_key k = {};
	struct fqdnd_policy_value *v;

	k.prefixlen = FQDND_POLICY_PREFIX_FULL;
	k.identity = identity | dir;
	k.endpoint = endpoint;
	k.proto = proto;
	k.dport = dport;
	v = bpf_map_lookup_elem(&fqdnd_policy, &k);
	if (!v) {
		k.identity = FQDND_ID_ANY | dir;
		v = bpf_map_lookup_elem(&fqdnd_policy, &k);
	}
	return v && !(v->flags & FQDND_POLICY_DENY) && (v->flags & FQDND_POLICY_ALLOW);
}

/* The "port" a packet is looked up with: its destination port, or for ICMP its type. */
static __always_inline __u16 policy_port(const struct fqdnd_ct_key *key, __u8 icmp_type)
{
	return is_icmp(key) ? bpf_htons(icmp_type) : key->dport;
}

/* Whether the endpoint may send the packet of tuple `key` (its destination's identity, now,
 * into *identity). ICMP packets are looked up with their type as the port: entries for every
 * protocol (L3 rules) and `icmps` entries of that type match them. */
static __always_inline int allowed(__u16 endpoint, const struct fqdnd_ct_key *key, __u8 icmp_type,
				   __u32 *identity)
{
	*identity = identity_of_addr(key, key->daddr);
	return policy_allows(endpoint, *identity, 0, key->proto, policy_port(key, icmp_type));
}

/* Whether the endpoint may receive the packet of tuple `key` (its source's identity, now,
 * into *identity), by its ingress entries. */
static __always_inline int allowed_in(__u16 endpoint, const struct fqdnd_ct_key *key,
				      __u8 icmp_type, __u32 *identity)
{
	*identity = identity_of_addr(key, key->saddr);
	return policy_allows(endpoint, *identity, FQDND_POLICY_ID_INGRESS, key->proto,
			     policy_port(key, icmp_type));
}

#endif /* FQDND_LIB_POLICY_H */
