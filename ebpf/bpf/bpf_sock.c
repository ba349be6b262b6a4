// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * The cgroup v2 socket programs of host processes, which share the maps, the parser,
 * conntrack and the policy lookups with the tc programs (bpf_tc.c). Compiled as part of
 * policy.c (one object); the headers they use are in lib/.
 *
 * Attached once at the root of the cgroup v2 hierarchy (see the header). Sockets of no
 * endpoint's cgroup are left alone: each program returns at once when the walk of the
 * socket's cgroup ancestry finds no fqdnd_cgroups entry.
 *
 *  fqdnd_connect4/6, fqdnd_sendmsg4/6  the DNS redirect: a UDP or TCP destination port 53 of
 *                 a socket of an endpoint flagged REDIRECT_DNS becomes the proxy (127.0.0.1 /
 *                 ::1 and its port, or the proxy's bound address), in the proxy's network
 *                 namespace; the destination asked for is recorded per socket cookie
 *                 (fqdnd_sock_dns). No proxy: the call fails (EPERM) — DNS fails closed.
 *                 connect4/6 also refuse (EPERM) a TCP connect the endpoint's egress policy
 *                 does not allow (connect_allowed), so that it fails at once.
 *  fqdnd_recvmsg4/6, fqdnd_getpeername4/6  give the socket the recorded destination back where
 *                 the kernel would show the proxy's address (recvfrom's source, getpeername).
 *  fqdnd_sock_egress  cgroup_skb egress: a packet a redirected socket sends to the proxy
 *                 records that socket's destination under the packet's source address and
 *                 port (fqdnd_dns_origins, read by the proxy); other packets to loopback pass;
 *                 everything else is egress() as for an interface (same ipcache, policy and
 *                 conntrack maps, the socket conntrack zone) without service translation (a
 *                 cgroup skb program may not rewrite packets), DNS that was not redirected
 *                 dropped.
 *  fqdnd_sock_ingress cgroup_skb ingress: packets from loopback (the host itself, the proxy's
 *                 answers included) pass; everything else is ingress() as for an interface
 *                 (the socket conntrack zone, no service translation): flows opened towards
 *                 the endpoint's sockets are recorded so their replies pass, and an endpoint
 *                 flagged ENFORCE_INGRESS drops what its ingress policy does not allow.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/policy.h"
#include "lib/frag.h"
#include "lib/verdict.h"

#define SOCK_PASS 1
#define SOCK_DROP 0
#define LOOPBACK4 0x7f000001 /* 127.0.0.1, host order */

/* The endpoint of the deepest cgroup on the path from the root to `own` (a socket's cgroup)
 * that has an fqdnd_cgroups entry; `ancestor(level)` is the id of its ancestor at `level`
 * (0 = the root), 0 beyond `own`'s depth. */
#define CGROUP_ENDPOINT(own, ancestor, out)                                                  \
	({                                                                                   \
		struct fqdnd_endpoint_value *__v;                                            \
		__u64 __own = (own);                                                         \
		int __found = 0, __level;                                                    \
                                                                                             \
		__v = bpf_map_lookup_elem(&fqdnd_cgroups, &__own);                           \
		if (__v) {                                                                   \
			*(out) = *__v;                                                       \
			__found = 1;                                                         \
		} else {                                                                     \
			for (__level = 0; __level < FQDND_CGROUP_MAX_DEPTH; __level++) {     \
				__u64 __id = ancestor(__level);                              \
                                                                                             \
				if (!__id || __id == __own)                                  \
					break;                                               \
				__v = bpf_map_lookup_elem(&fqdnd_cgroups, &__id);            \
				if (__v) {                                                   \
					*(out) = *__v;                                       \
					__found = 1;                                         \
				}                                                            \
			}                                                                    \
		}                                                                            \
		__found;                                                                     \
	})

#define SKB_ANCESTOR(level)     bpf_skb_ancestor_cgroup_id(skb, (level))
#define CURRENT_ANCESTOR(level) bpf_get_current_ancestor_cgroup_id(level)

/* The endpoint of the call a sock_addr program runs for, when the redirect applies to it: in
 * the proxy's network namespace (fqdnd_sock_cfg) and made by a process in an endpoint's
 * cgroup. (sock_addr programs cannot read a socket's cgroup, only the calling task's: a
 * socket created before its process joined the cgroup is redirected by its process's
 * cgroup, while the skb programs follow the socket's.) */
static __always_inline int sock_addr_endpoint(struct bpf_sock_addr *ctx,
					      struct fqdnd_endpoint_value *out)
{
	struct fqdnd_sock_cfg *cfg;
	__u32 zero = 0;

	cfg = bpf_map_lookup_elem(&fqdnd_sock_cfg, &zero);
	if (!cfg || !cfg->endpoints)
		return 0;
	if (cfg->netns_cookie && cfg->netns_cookie != bpf_get_netns_cookie(ctx))
		return 0;
	return CGROUP_ENDPOINT(bpf_get_current_cgroup_id(), CURRENT_ANCESTOR, out);
}

/* The proxy's IPv4 address for redirected sockets, network order: its bound address, or
 * 127.0.0.1 for a wildcard listener. */
static __always_inline __u32 proxy_addr4(const struct fqdnd_dns_proxy *cfg)
{
	__u32 a;

	__builtin_memcpy(&a, cfg->addr4, 4);
	return a ? a : bpf_htonl(LOOPBACK4);
}

/* The proxy's IPv6 address (::1 for a wildcard listener), as four network-order words. */
static __always_inline void proxy_addr6(const struct fqdnd_dns_proxy *cfg, __u32 out[4])
{
	__builtin_memcpy(out, cfg->addr6, 16);
	if (!(out[0] | out[1] | out[2] | out[3]))
		out[3] = bpf_htonl(1);
}

/* Whether the four network-order words `a` are the proxy's IPv6 address. */
static __always_inline int is_proxy6(const struct fqdnd_dns_proxy *cfg, const __u32 a[4])
{
	__u32 proxy[4];

	proxy_addr6(cfg, proxy);
	return a[0] == proxy[0] && a[1] == proxy[1] && a[2] == proxy[2] && a[3] == proxy[3];
}

/* The sock_addr context's IPv6 address, read and written a word at a time (the only access
 * the verifier allows). */
static __always_inline void load_ip6(const struct bpf_sock_addr *ctx, __u32 a[4])
{
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
}

static __always_inline void store_ip6(struct bpf_sock_addr *ctx, const __u32 a[4])
{
	ctx->user_ip6[0] = a[0];
	ctx->user_ip6[1] = a[1];
	ctx->user_ip6[2] = a[2];
	ctx->user_ip6[3] = a[3];
}

static __always_inline int v4_mapped(const __u32 a[4])
{
	return !a[0] && !a[1] && a[2] == bpf_htonl(0xffff);
}

/* A drop event for a call the sock_addr programs refused (no proxy, or a connect the policy
 * does not allow: `identity` is then the destination's). */
static __always_inline void emit_sock(__u16 endpoint, __u32 identity, const __u8 *daddr,
				      __u8 family, __u16 dport, __u8 proto, __u8 reason)
{
	struct fqdnd_drop_event *e;

	e = bpf_ringbuf_reserve(&fqdnd_events, sizeof(*e), 0);
	if (!e)
		return;
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_ns = bpf_ktime_get_ns();
	e->endpoint = endpoint;
	e->identity = identity;
	e->dport = bpf_ntohs(dport);
	e->proto = proto;
	e->family = family;
	e->reason = reason;
	e->source = FQDND_SOURCE_SOCKET;
	__builtin_memcpy(e->daddr, daddr, 16);
	bpf_ringbuf_submit(e, 0);
}

/* Whether the sock_addr call is DNS of a redirected endpoint: UDP or TCP to port 53. */
static __always_inline int dns_call(struct bpf_sock_addr *ctx, struct fqdnd_endpoint_value *ep)
{
	if (ctx->user_port != bpf_htons(53))
		return 0;
	if (ctx->protocol != IPPROTO_UDP && ctx->protocol != IPPROTO_TCP)
		return 0;
	return sock_addr_endpoint(ctx, ep) && (ep->flags & FQDND_EP_REDIRECT_DNS);
}

/* What redirect4/6 did with a call. */
#define REDIRECT_REFUSED 0 /* DNS of a redirected endpoint and no proxy: refuse (EPERM) */
#define REDIRECT_NONE    1 /* not DNS of a redirected endpoint: untouched */
#define REDIRECT_DONE    2 /* sent to the proxy */

/* connect4 / sendmsg4: REDIRECT_*. */
static __always_inline int redirect4(struct bpf_sock_addr *ctx)
{
	struct fqdnd_endpoint_value ep;
	struct fqdnd_sock_origin o = {};
	struct fqdnd_dns_proxy *cfg;
	__u32 zero = 0, dst;
	__u64 cookie;

	if (!dns_call(ctx, &ep))
		return REDIRECT_NONE;
	dst = ctx->user_ip4;
	__builtin_memcpy(o.addr, &dst, 4);
	cfg = bpf_map_lookup_elem(&fqdnd_dns_proxy, &zero);
	if (!cfg || !cfg->port4) {
		emit_sock(ep.endpoint, 0, o.addr, 4, ctx->user_port, ctx->protocol,
			  FQDND_DROP_NO_PROXY);
		return REDIRECT_REFUSED;
	}
	o.port = ctx->user_port;
	o.endpoint = ep.endpoint;
	o.family = 4;
	o.proto = ctx->protocol;
	cookie = bpf_get_socket_cookie(ctx);
	bpf_map_update_elem(&fqdnd_sock_dns, &cookie, &o, BPF_ANY);
	ctx->user_ip4 = proxy_addr4(cfg);
	ctx->user_port = cfg->port4;
	return REDIRECT_DONE;
}

/* connect6 / sendmsg6, v4-mapped destinations (a dual-stack socket) included: REDIRECT_*.
 * (An unconnected dual-stack UDP socket's datagram to a v4-mapped address runs sendmsg4
 * instead, with the IPv4 address: the kernel sends it as IPv4.) */
static __always_inline int redirect6(struct bpf_sock_addr *ctx)
{
	struct fqdnd_endpoint_value ep;
	struct fqdnd_sock_origin o = {};
	struct fqdnd_dns_proxy *cfg;
	__u32 zero = 0, dst[4], proxy[4];
	__u64 cookie;
	int mapped;

	if (!dns_call(ctx, &ep))
		return REDIRECT_NONE;
	load_ip6(ctx, dst);
	__builtin_memcpy(o.addr, dst, 16);
	mapped = v4_mapped(dst);
	cfg = bpf_map_lookup_elem(&fqdnd_dns_proxy, &zero);
	if (!cfg || !(mapped ? cfg->port4 : cfg->port6)) {
		emit_sock(ep.endpoint, 0, o.addr, 6, ctx->user_port, ctx->protocol,
			  FQDND_DROP_NO_PROXY);
		return REDIRECT_REFUSED;
	}
	o.port = ctx->user_port;
	o.endpoint = ep.endpoint;
	o.family = 6;
	o.proto = ctx->protocol;
	cookie = bpf_get_socket_cookie(ctx);
	bpf_map_update_elem(&fqdnd_sock_dns, &cookie, &o, BPF_ANY);
	if (mapped) {
		ctx->user_ip6[3] = proxy_addr4(cfg);
		ctx->user_port = cfg->port4;
		return REDIRECT_DONE;
	}
	proxy_addr6(cfg, proxy);
	store_ip6(ctx, proxy);
	ctx->user_port = cfg->port6;
	return REDIRECT_DONE;
}

SEC("cgroup/sendmsg4")
int fqdnd_sendmsg4(struct bpf_sock_addr *ctx)
{
	return redirect4(ctx) != REDIRECT_REFUSED;
}

SEC("cgroup/sendmsg6")
int fqdnd_sendmsg6(struct bpf_sock_addr *ctx)
{
	return redirect6(ctx) != REDIRECT_REFUSED;
}

/* recvmsg4 / getpeername4: the proxy's address becomes the destination the socket's last
 * redirected DNS message was sent to. Always 1 (these hooks cannot refuse). */
static __always_inline int restore4(struct bpf_sock_addr *ctx)
{
	struct fqdnd_sock_origin *o;
	struct fqdnd_dns_proxy *cfg;
	__u32 zero = 0, a;
	__u64 cookie;

	cfg = bpf_map_lookup_elem(&fqdnd_dns_proxy, &zero);
	if (!cfg || !cfg->port4 || ctx->user_port != cfg->port4 ||
	    ctx->user_ip4 != proxy_addr4(cfg))
		return 1;
	cookie = bpf_get_socket_cookie(ctx);
	o = bpf_map_lookup_elem(&fqdnd_sock_dns, &cookie);
	if (!o || o->family != 4)
		return 1;
	__builtin_memcpy(&a, o->addr, 4);
	ctx->user_ip4 = a;
	ctx->user_port = o->port;
	return 1;
}

/* recvmsg6 / getpeername6: the same for an IPv6 socket (the proxy's IPv6 address, or its
 * IPv4 address v4-mapped: then the record is sendmsg4's, IPv4, for an unconnected socket). */
static __always_inline int restore6(struct bpf_sock_addr *ctx)
{
	struct fqdnd_sock_origin *o;
	struct fqdnd_dns_proxy *cfg;
	__u32 zero = 0, a[4];
	__u64 cookie;

	cfg = bpf_map_lookup_elem(&fqdnd_dns_proxy, &zero);
	if (!cfg)
		return 1;
	load_ip6(ctx, a);
	if (v4_mapped(a)) {
		if (!cfg->port4 || ctx->user_port != cfg->port4 || a[3] != proxy_addr4(cfg))
			return 1;
	} else if (!cfg->port6 || ctx->user_port != cfg->port6 || !is_proxy6(cfg, a)) {
		return 1;
	}
	cookie = bpf_get_socket_cookie(ctx);
	o = bpf_map_lookup_elem(&fqdnd_sock_dns, &cookie);
	if (!o)
		return 1;
	if (o->family == 4 && v4_mapped(a)) {
		/* an unconnected dual-stack socket's datagram to a v4-mapped resolver: recorded by
		 * sendmsg4 (the kernel sent it as IPv4), shown v4-mapped as the socket wrote it */
		__builtin_memcpy(&a[3], o->addr, 4);
	} else if (o->family == 6) {
		__builtin_memcpy(a, o->addr, 16);
	} else {
		return 1;
	}
	store_ip6(ctx, a);
	ctx->user_port = o->port;
	return 1;
}

SEC("cgroup/recvmsg4")
int fqdnd_recvmsg4(struct bpf_sock_addr *ctx)
{
	return restore4(ctx);
}

SEC("cgroup/getpeername4")
int fqdnd_getpeername4(struct bpf_sock_addr *ctx)
{
	return restore4(ctx);
}

SEC("cgroup/recvmsg6")
int fqdnd_recvmsg6(struct bpf_sock_addr *ctx)
{
	return restore6(ctx);
}

SEC("cgroup/getpeername6")
int fqdnd_getpeername6(struct bpf_sock_addr *ctx)
{
	return restore6(ctx);
}

static __always_inline int is_loopback(const struct fqdnd_ct_key *key, const __u8 *addr)
{
	if (key->family == 4)
		return addr[0] == 127;
	{
		__u32 w[4];

		__builtin_memcpy(w, addr, 16);
		return !w[0] && !w[1] && !w[2] && w[3] == bpf_htonl(1);
	}
}

/* A packet to the proxy from an endpoint's socket: when the redirect recorded the socket,
 * the proxy will find the record under the packet's source address and port. */
static __always_inline void record_origin(struct __sk_buff *skb, const struct pkt *p)
{
	struct fqdnd_origin_key k = {};
	struct fqdnd_sock_origin *o;
	struct fqdnd_dns_proxy *cfg;
	__u32 zero = 0;
	__u64 cookie;

	if (p->key.proto != IPPROTO_UDP && p->key.proto != IPPROTO_TCP)
		return;
	cfg = bpf_map_lookup_elem(&fqdnd_dns_proxy, &zero);
	if (!cfg)
		return;
	if (p->key.family == 4) {
		__u32 d;

		__builtin_memcpy(&d, p->key.daddr, 4);
		if (!cfg->port4 || p->key.dport != cfg->port4 || d != proxy_addr4(cfg))
			return;
	} else {
		__u32 d[4];

		__builtin_memcpy(d, p->key.daddr, 16);
		if (!cfg->port6 || p->key.dport != cfg->port6 || !is_proxy6(cfg, d))
			return;
	}
	__builtin_memcpy(k.addr, p->key.saddr, 16);
	k.port = p->key.sport;
	k.proto = p->key.proto;
	k.family = p->key.family;
	cookie = bpf_get_socket_cookie(skb);
	o = bpf_map_lookup_elem(&fqdnd_sock_dns, &cookie);
	if (o)
		bpf_map_update_elem(&fqdnd_dns_origins, &k, o, BPF_ANY);
	else
		/* a socket that talks to the proxy directly: no record of an earlier socket on
		 * this address and port may speak for it */
		bpf_map_delete_elem(&fqdnd_dns_origins, &k);
}

/* Whether any cgroup endpoint exists (the skb programs' first question, for every packet of
 * the host). */
static __always_inline int cgroup_endpoints(void)
{
	struct fqdnd_sock_cfg *cfg;
	__u32 zero = 0;

	cfg = bpf_map_lookup_elem(&fqdnd_sock_cfg, &zero);
	return cfg && cfg->endpoints;
}

/* A TCP connect of an endpoint under egress policy to `daddr` (family 4 or 6, network order;
 * port `dport`) that its policy does not allow now: refused at once (EPERM) with a drop event,
 * instead of a SYN the egress program would drop and the caller would retry until it gives up.
 * The same decision as egress() for a new flow's first packet: loopback (and the unspecified
 * address, which the kernel connects to loopback) is not egress, DNS a redirecting endpoint did
 * not send to the proxy is dropped, else the destination's identity now and the endpoint's
 * policy. The endpoint is the calling process's (the DNS redirect's rule), in any network
 * namespace (the egress program checks them all). UDP is not refused here: its datagrams are,
 * at send (EPERM). 1 to go on, 0 to refuse. */
static __always_inline int connect_allowed(struct bpf_sock_addr *ctx, __u8 family,
					   const __u32 daddr[4])
{
	struct fqdnd_endpoint_value ep;
	struct fqdnd_ct_key key = {};
	__u32 identity;
	__u8 reason = FQDND_DROP_POLICY;

	if (ctx->protocol != IPPROTO_TCP || !cgroup_endpoints())
		return 1;
	if (!CGROUP_ENDPOINT(bpf_get_current_cgroup_id(), CURRENT_ANCESTOR, &ep))
		return 1;
	if (!(ep.flags & FQDND_EP_ENFORCE_EGRESS) && !(ep.flags & FQDND_EP_REDIRECT_DNS))
		return 1;
	key.family = family;
	key.proto = IPPROTO_TCP;
	key.dport = ctx->user_port;
	key.zone = FQDND_CT_ZONE_SOCKET;
	if (family == 4)
		__builtin_memcpy(key.daddr, &daddr[3], 4);
	else
		__builtin_memcpy(key.daddr, daddr, 16);
	if (is_loopback(&key, key.daddr) ||
	    (family == 4 ? !daddr[3] : !(daddr[0] | daddr[1] | daddr[2] | daddr[3])))
		return 1;
	identity = 0;
	if ((ep.flags & FQDND_EP_REDIRECT_DNS) && key.dport == bpf_htons(53)) {
		reason = FQDND_DROP_DNS_BYPASS;
	} else {
		if (!(ep.flags & FQDND_EP_ENFORCE_EGRESS) ||
		    allowed(ep.endpoint, &key, 0, &identity))
			return 1;
	}
	emit_sock(ep.endpoint, identity, key.daddr, family, key.dport, IPPROTO_TCP, reason);
	return 0;
}

SEC("cgroup/connect4")
int fqdnd_connect4(struct bpf_sock_addr *ctx)
{
	__u32 dst[4] = {};
	int r = redirect4(ctx);

	if (r != REDIRECT_NONE)
		return r == REDIRECT_DONE;
	dst[3] = ctx->user_ip4;
	return connect_allowed(ctx, 4, dst);
}

SEC("cgroup/connect6")
int fqdnd_connect6(struct bpf_sock_addr *ctx)
{
	__u32 dst[4];
	int r = redirect6(ctx);

	if (r != REDIRECT_NONE)
		return r == REDIRECT_DONE;
	load_ip6(ctx, dst);
	return connect_allowed(ctx, v4_mapped(dst) ? 4 : 6, dst);
}

SEC("cgroup_skb/egress")
int fqdnd_sock_egress(struct __sk_buff *skb)
{
	struct fqdnd_endpoint_value ep;
	struct pkt p = {};
	__u16 backend = 0;
	__u8 follow = 1;
	__u64 now;
	int r, verdict;

	if (!cgroup_endpoints() || !CGROUP_ENDPOINT(bpf_skb_cgroup_id(skb), SKB_ANCESTOR, &ep))
		return SOCK_PASS;
	r = parse_l3(skb, &p, 0, skb->protocol);
	if (r == PARSE_NOT_IP || r == PARSE_ALWAYS_PASS)
		return SOCK_PASS;
	p.key.zone = FQDND_CT_ZONE_SOCKET;
	if (is_loopback(&p.key, p.key.daddr)) {
		/* the host itself, the proxy included: not egress */
		if (r == PARSE_OK && (ep.flags & FQDND_EP_REDIRECT_DNS))
			record_origin(skb, &p);
		return SOCK_PASS;
	}
	now = bpf_ktime_get_ns();
	verdict = egress(skb, &p, r, &ep, now, &backend, &follow, 1);
	frag_record(&p, verdict == TC_ACT_OK && follow, 0, 0, now);
	return verdict == TC_ACT_OK ? SOCK_PASS : SOCK_DROP;
}

SEC("cgroup_skb/ingress")
int fqdnd_sock_ingress(struct __sk_buff *skb)
{
	struct fqdnd_endpoint_value ep;
	struct pkt p = {};
	__u16 rev_nat = 0;
	int r;

	if (!cgroup_endpoints() || !CGROUP_ENDPOINT(bpf_skb_cgroup_id(skb), SKB_ANCESTOR, &ep))
		return SOCK_PASS;
	r = parse_l3(skb, &p, 0, skb->protocol);
	if (r == PARSE_NOT_IP || r == PARSE_ALWAYS_PASS)
		return SOCK_PASS;
	p.key.zone = FQDND_CT_ZONE_SOCKET;
	/* the host itself, the proxy's answers included */
	if (is_loopback(&p.key, p.key.saddr))
		return SOCK_PASS;
	return ingress(skb, &p, r, &ep, bpf_ktime_get_ns(), &rev_nat, 1) == TC_ACT_OK ? SOCK_PASS
											: SOCK_DROP;
}
