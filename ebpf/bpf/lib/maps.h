// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * The maps every program of policy.o shares, pinned by name under the versioned bpffs
 * directory. Their layouts, sizes and what each holds: include/fqdnd_maps.h.
 */
#ifndef FQDND_LIB_MAPS_H
#define FQDND_LIB_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "fqdnd_maps.h"

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct fqdnd_ipcache_key4);
	__type(value, struct fqdnd_ipcache_value);
	__uint(max_entries, FQDND_IPCACHE_V4_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_ipc4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct fqdnd_ipcache_key6);
	__type(value, struct fqdnd_ipcache_value);
	__uint(max_entries, FQDND_IPCACHE_V6_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_ipc6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* ifindex */
	__type(value, struct fqdnd_endpoint_value);
	__uint(max_entries, FQDND_ENDPOINTS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct fqdnd_ipcache_key4); /* source prefix */
	__type(value, struct fqdnd_endpoint_value);
	__uint(max_entries, FQDND_CLIENTS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_clients4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct fqdnd_ipcache_key6); /* source prefix */
	__type(value, struct fqdnd_endpoint_value);
	__uint(max_entries, FQDND_CLIENTS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_clients6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct fqdnd_dns_proxy);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_dns_proxy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct fqdnd_policy_key);
	__type(value, struct fqdnd_policy_value);
	__uint(max_entries, FQDND_POLICY_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_policy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct fqdnd_ep_addr_key);
	__type(value, struct fqdnd_ep_addr_value);
	__uint(max_entries, FQDND_EP_ADDRS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_ep_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct fqdnd_frag_key);
	__type(value, struct fqdnd_frag_value);
	__uint(max_entries, FQDND_FRAGS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_frags SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct fqdnd_settings);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_settings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct fqdnd_ct_key);
	__type(value, struct fqdnd_ct_value);
	__uint(max_entries, FQDND_CT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct fqdnd_lb_svc_key);
	__type(value, struct fqdnd_lb_svc_value);
	__uint(max_entries, FQDND_LB_SERVICES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_lb_svc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u16); /* backend id */
	__type(value, struct fqdnd_lb_backend);
	__uint(max_entries, FQDND_LB_BACKENDS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_lb_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u16); /* rev-NAT index */
	__type(value, struct fqdnd_lb_revnat);
	__uint(max_entries, FQDND_LB_SERVICES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_lb_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, FQDND_EVENTS_BYTES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_events SEC(".maps");

/* The cgroup socket programs' maps (include/fqdnd_maps.h says what each holds). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64); /* cgroup v2 id */
	__type(value, struct fqdnd_endpoint_value);
	__uint(max_entries, FQDND_CGROUPS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, __u64); /* socket cookie */
	__type(value, struct fqdnd_sock_origin);
	__uint(max_entries, FQDND_SOCK_ORIGINS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_sock_dns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct fqdnd_origin_key);
	__type(value, struct fqdnd_sock_origin);
	__uint(max_entries, FQDND_SOCK_ORIGINS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_dns_origins SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct fqdnd_sock_cfg);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fqdnd_sock_cfg SEC(".maps");

#endif /* FQDND_LIB_MAPS_H */
