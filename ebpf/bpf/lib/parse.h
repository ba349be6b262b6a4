// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * Parsing: a packet's tuple (struct pkt) from its IP header on, IPv6 extension headers walked
 * (at most FQDND_IPV6_MAX_EXT_HEADERS), TCP flags, the ICMP kind, fragments.
 */
#ifndef FQDND_LIB_PARSE_H
#define FQDND_LIB_PARSE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "fqdnd_maps.h"

#define IP_MF     0x2000
#define IP_OFFSET 0x1FFF
#define TH_FIN 0x01
#define TH_SYN 0x02
#define TH_RST 0x04
#define TH_ACK 0x10

enum parse_result {
	PARSE_OK = 0,          /* TCP, UDP, ICMP or ICMPv6 with its tuple in p->key */
	PARSE_NOT_IP,          /* ARP and friends: pass */
	PARSE_ALWAYS_PASS,     /* IPv6 neighbour discovery, link-local multicast */
	PARSE_LATER_FRAGMENT,  /* a fragment after the first: addresses, protocol, id; no ports */
	PARSE_UNHANDLED,       /* another IP protocol, or headers cut short */
	PARSE_EXT_HEADERS,     /* more IPv6 extension headers than FQDND_IPV6_MAX_EXT_HEADERS */
};

enum frag { FRAG_NONE = 0, FRAG_FIRST, FRAG_LATER };

enum icmp_kind {
	ICMP_NONE = 0,         /* not ICMP */
	ICMP_ECHO_REQUEST,     /* key: sport = identifier, dport = 0 */
	ICMP_ECHO_REPLY,       /* key: sport = 0, dport = identifier */
	ICMP_ERROR,            /* destination unreachable, packet too big, time exceeded,
				* parameter problem: about the packet it embeds */
	ICMP_OTHER,
};

/* One packet as the programs see it. */
struct pkt {
	struct fqdnd_ct_key key;
	__u32 l4;          /* offset of the L4 header */
	__u32 frag_id;     /* fragment identification as in the header (IPv4: 16 bits) */
	__u8 frag;         /* enum frag */
	__u8 tcp_flags;
	__u8 icmp;         /* enum icmp_kind */
	__u8 icmp_type;
	__u8 icmp_code;
	__u8 pad[3];
};

static __always_inline int is_icmp(const struct fqdnd_ct_key *key)
{
	return (key->family == 4 && key->proto == IPPROTO_ICMP) ||
	       (key->family == 6 && key->proto == IPPROTO_ICMPV6);
}

/* The L4 header at p->l4: ports (TCP, UDP), TCP flags, the ICMP kind. */
static __always_inline int parse_l4(struct __sk_buff *skb, struct pkt *p)
{
	if (p->key.proto == IPPROTO_TCP) {
		__u8 h[14];

		if (bpf_skb_load_bytes(skb, p->l4, h, sizeof(h)) < 0)
			return PARSE_UNHANDLED;
		__builtin_memcpy(&p->key.sport, &h[0], 2);
		__builtin_memcpy(&p->key.dport, &h[2], 2);
		p->tcp_flags = h[13];
		return PARSE_OK;
	}
	if (p->key.proto == IPPROTO_UDP) {
		__u16 ports[2];

		if (bpf_skb_load_bytes(skb, p->l4, ports, sizeof(ports)) < 0)
			return PARSE_UNHANDLED;
		p->key.sport = ports[0];
		p->key.dport = ports[1];
		return PARSE_OK;
	}
	if (!is_icmp(&p->key))
		return PARSE_UNHANDLED;
	{
		__u8 h[8]; /* type, code, checksum, identifier, sequence */
		__u8 t;
		__u16 id;

		if (bpf_skb_load_bytes(skb, p->l4, h, sizeof(h)) < 0)
			return PARSE_UNHANDLED;
		t = h[0];
		__builtin_memcpy(&id, &h[4], 2);
		p->icmp_type = t;
		p->icmp_code = h[1];
		if (p->key.family == 4) {
			if (t == 8) {
				p->icmp = ICMP_ECHO_REQUEST;
				p->key.sport = id;
			} else if (t == 0) {
				p->icmp = ICMP_ECHO_REPLY;
				p->key.dport = id;
			} else if (t == 3 || t == 11 || t == 12) {
				p->icmp = ICMP_ERROR;
			} else {
				p->icmp = ICMP_OTHER;
			}
			return PARSE_OK;
		}
		/* router/neighbour solicitation/advertisement, redirect */
		if (t >= 133 && t <= 137)
			return PARSE_ALWAYS_PASS;
		if (t == 128) {
			p->icmp = ICMP_ECHO_REQUEST;
			p->key.sport = id;
		} else if (t == 129) {
			p->icmp = ICMP_ECHO_REPLY;
			p->key.dport = id;
		} else if (t >= 1 && t <= 4) {
			p->icmp = ICMP_ERROR;
		} else {
			p->icmp = ICMP_OTHER;
		}
		return PARSE_OK;
	}
}

static __always_inline int ipv6_ext_header(__u8 nh)
{
	return nh == IPPROTO_HOPOPTS || nh == IPPROTO_ROUTING || nh == IPPROTO_DSTOPTS ||
	       nh == IPPROTO_FRAGMENT || nh == IPPROTO_AH;
}

/* Fills p with the tuple of the packet whose IP header starts at `l3` (`h_proto`: its
 * EtherType, network order): addresses, protocol, ports or ICMP identifier, where its L4
 * header starts, and whether it is a fragment. IPv6 extension headers are walked. */
static __always_inline int parse_l3(struct __sk_buff *skb, struct pkt *p, __u32 l3, __u16 h_proto)
{
	if (h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		__u16 fo;

		if (bpf_skb_load_bytes(skb, l3, &ip, sizeof(ip)) < 0)
			return PARSE_UNHANDLED;
		__builtin_memcpy(p->key.saddr, &ip.saddr, 4);
		__builtin_memcpy(p->key.daddr, &ip.daddr, 4);
		p->key.proto = ip.protocol;
		p->key.family = 4;
		/* link-local multicast (224.0.0.0/24: IGMP, ...) never leaves the link */
		if (p->key.daddr[0] == 224 && p->key.daddr[1] == 0 && p->key.daddr[2] == 0)
			return PARSE_ALWAYS_PASS;
		if (ip.ihl < 5)
			return PARSE_UNHANDLED;
		fo = bpf_ntohs(ip.frag_off);
		if (fo & (IP_MF | IP_OFFSET)) {
			p->frag_id = ip.id;
			if (fo & IP_OFFSET) {
				p->frag = FRAG_LATER;
				return PARSE_LATER_FRAGMENT;
			}
			p->frag = FRAG_FIRST;
		}
		p->l4 = l3 + ip.ihl * 4;
		return parse_l4(skb, p);
	}
	if (h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		__u32 off = l3 + sizeof(ip6);
		__u8 nh;
		int i;

		if (bpf_skb_load_bytes(skb, l3, &ip6, sizeof(ip6)) < 0)
			return PARSE_UNHANDLED;
		__builtin_memcpy(p->key.saddr, &ip6.saddr, 16);
		__builtin_memcpy(p->key.daddr, &ip6.daddr, 16);
		p->key.family = 6;
		/* link-local scope multicast (ff02::/16 and friends: MLD reports with their
		 * hop-by-hop header, ND) never leaves the link */
		if (p->key.daddr[0] == 0xff && (p->key.daddr[1] & 0x0f) <= 0x02) {
			p->key.proto = ip6.nexthdr;
			return PARSE_ALWAYS_PASS;
		}
		nh = ip6.nexthdr;
#pragma unroll
		for (i = 0; i < FQDND_IPV6_MAX_EXT_HEADERS; i++) {
			__u8 h[8];

			if (!ipv6_ext_header(nh))
				break;
			if (nh == IPPROTO_FRAGMENT) {
				/* next header, reserved, offset (13 bits) + 2 reserved + M, id */
				__u16 fo;

				if (bpf_skb_load_bytes(skb, off, h, 8) < 0)
					return PARSE_UNHANDLED;
				fo = ((__u16)h[2] << 8) | h[3];
				__builtin_memcpy(&p->frag_id, &h[4], 4);
				nh = h[0];
				off += 8;
				if (fo & 0xfff8) {
					p->key.proto = nh;
					p->frag = FRAG_LATER;
					return PARSE_LATER_FRAGMENT;
				}
				if (fo & 1)
					p->frag = FRAG_FIRST;
				continue;
			}
			if (bpf_skb_load_bytes(skb, off, h, 2) < 0)
				return PARSE_UNHANDLED;
			if (nh == IPPROTO_AH)
				off += ((__u32)h[1] + 2) * 4;
			else
				off += ((__u32)h[1] + 1) * 8;
			nh = h[0];
		}
		p->key.proto = nh;
		if (ipv6_ext_header(nh))
			return PARSE_EXT_HEADERS;
		p->l4 = off;
		return parse_l4(skb, p);
	}
	return PARSE_NOT_IP;
}

/* parse_l3 of a packet that starts with its Ethernet header (the tc programs). */
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	struct ethhdr eth;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return PARSE_NOT_IP;
	return parse_l3(skb, p, ETH_HLEN, eth.h_proto);
}

#endif /* FQDND_LIB_PARSE_H */
