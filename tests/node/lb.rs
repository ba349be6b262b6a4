//! Service load balancing through the node's datapath (the LB v2 maps): new connections to a
//! VIP spread over its backends, policy is checked against the backend, removing a backend
//! leaves the other established flows alone, TCP and UDP services on one port are distinct,
//! a restart keeps every translation, and DNS to a service VIP reaches one of its backends.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use hickory_proto::rr::RecordType;

use crate::common::policy_doc;
use crate::dns::Over;
use crate::topology::{Topology, echo, whoami_tcp_open, whoami_udp_ask};
use crate::{A_PORTS, DROPPED, REACHES, ZONE, dns, dns_to, node_config_with, sa, setup_with, zone};

/// The node configuration of the other tests, plus: endpoint A may reach the backends
/// (10.N.10.0/24 on TCP 7070 and UDP 7053) and resolve anything through the cluster-DNS VIP
/// 10.N.96.53; `docs` adds more documents.
fn lb_config(t: &Topology, node_extra: &str, docs: &str) -> String {
    let n = t.n;
    let egress = format!(
        "  - toCIDR: [10.{n}.10.0/24, \"fd00:{n}:10::/64\"]
    toPorts:
    - ports: [{{port: \"7070\", protocol: TCP}}, {{port: \"7053\", protocol: UDP}}]
{}",
        dns_to(&format!("10.{n}.96.53/32"), "{matchPattern: \"*\"}")
    );
    format!(
        "{}---\n{}{docs}",
        node_config_with(t, A_PORTS, node_extra),
        policy_doc("CiliumNetworkPolicy", "a-backends", "app: a", &egress)
    )
}

fn service_doc(name: &str, frontend: &str, protocol: &str, backends: &[String]) -> String {
    let backends: Vec<String> = backends.iter().map(|b| format!("\"{b}\"")).collect();
    format!(
        "---\napiVersion: fqdnd.io/v1\nkind: Service\nmetadata: {{name: {name}}}\nspec:\n  frontend: \"{frontend}\"\n  protocol: {protocol}\n  backends: [{}]\n",
        backends.join(", ")
    )
}

/// `fqdnd service set` for the web VIP 10.N.96.10:80 with backends 10.N.10.{hosts}:7070.
fn set_web(t: &Topology, hosts: &[u32]) {
    let frontend = sa(t.v4(96, 10), 80).to_string();
    let backends: Vec<String> = hosts
        .iter()
        .map(|h| sa(t.v4(10, *h), 7070).to_string())
        .collect();
    let mut args = vec!["service", "set", "--name", "web", "--frontend", &frontend];
    args.extend(backends.iter().flat_map(|b| ["--backend", b.as_str()]));
    t.admin_cli(&args);
}

/// `count` new connections from endpoint A to `vip`: the backend each reached, in order.
fn connect_many(t: &Topology, vip: SocketAddr, count: usize) -> Vec<IpAddr> {
    (0..count)
        .map(|i| {
            whoami_tcp_open(&t.ep_a, vip, REACHES)
                .unwrap_or_else(|| panic!("connection {i} to {vip} failed\n{}", t.logs()))
                .1
        })
        .collect()
}

#[test]
fn services_spread_keep_established_flows_and_separate_protocols() {
    let Some(t) = setup_with("lb-spread", |t| {
        let dual = sa(t.v4(96, 10), 7000).to_string();
        let docs = service_doc(
            "dual-udp",
            &dual,
            "UDP",
            &[sa(t.v4(10, 1), 7053).to_string()],
        ) + &service_doc(
            "dual-tcp",
            &dual,
            "TCP",
            &[sa(t.v4(10, 2), 7070).to_string()],
        );
        lb_config(t, "", &docs)
    }) else {
        return;
    };
    set_web(&t, &[1, 2, 3]);
    let vip = sa(t.v4(96, 10), 80);

    // New connections spread over all three backends; some stay open.
    let mut kept = Vec::new();
    let mut seen: BTreeMap<IpAddr, usize> = BTreeMap::new();
    for i in 0..30 {
        let (stream, backend) = whoami_tcp_open(&t.ep_a, vip, REACHES)
            .unwrap_or_else(|| panic!("connection {i} to the VIP failed\n{}", t.logs()));
        *seen.entry(backend).or_default() += 1;
        if kept.len() < 12 {
            kept.push((stream, backend));
        }
    }
    let all: BTreeSet<IpAddr> = (1..=3).map(|h| t.v4(10, h)).collect();
    assert_eq!(
        seen.keys().copied().collect::<BTreeSet<_>>(),
        all,
        "30 connections did not reach every backend: {seen:?}"
    );

    // Policy is checked against the backend: B may not reach the backends, so not the VIP.
    assert!(
        whoami_tcp_open(&t.ep_b, vip, DROPPED).is_none(),
        "endpoint B reached a backend through the VIP"
    );

    // Remove one backend: established flows to the others are untouched, new flows never
    // reach it.
    let removed = t.v4(10, 2);
    set_web(&t, &[1, 3]);
    for (stream, backend) in kept.iter_mut().filter(|(_, b)| *b != removed) {
        assert!(
            echo(stream, b"still there"),
            "an established flow to {backend} broke when another backend was removed\n{}",
            t.logs()
        );
    }
    let after = connect_many(&t, vip, 30);
    assert!(
        !after.contains(&removed),
        "a new connection reached the removed backend: {after:?}"
    );
    assert_eq!(
        after.iter().copied().collect::<BTreeSet<_>>(),
        [t.v4(10, 1), t.v4(10, 3)].into_iter().collect(),
        "the remaining backends should both get new connections"
    );
    let maps = t.bpf_list("lb");
    assert!(maps.contains("count=2"), "{maps}");

    // TCP and UDP services on one VIP and port are distinct; the UDP reply comes back from
    // the VIP (the client's socket is connected to it).
    let dual = sa(t.v4(96, 10), 7000);
    assert_eq!(
        whoami_tcp_open(&t.ep_a, dual, REACHES).map(|(_, b)| b),
        Some(t.v4(10, 2)),
        "TCP to the shared port\n{}",
        t.logs()
    );
    assert_eq!(
        whoami_udp_ask(&t.ep_a, dual, REACHES),
        Some(t.v4(10, 1)),
        "UDP to the shared port\n{}",
        t.logs()
    );

    // IPv6: the same translation (no IPv4 header checksum, the L4 one over 16-byte addresses).
    let vip6 = sa(t.v6(96, 10), 80);
    let admin = t.admin();
    let mut args = vec![
        "service".to_owned(),
        "set".into(),
        "--admin-socket".into(),
        admin.to_str().unwrap().into(),
        "--name".into(),
        "web6".into(),
        "--frontend".into(),
        vip6.to_string(),
    ];
    for h in 1..=3 {
        args.push("--backend".into());
        args.push(sa(t.v6(10, h), 7070).to_string());
    }
    t.cli(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let reached: BTreeSet<IpAddr> = connect_many(&t, vip6, 30).into_iter().collect();
    assert_eq!(
        reached,
        (1..=3).map(|h| t.v6(10, h)).collect(),
        "IPv6 connections through the VIP"
    );
    let udp6 = sa(t.v6(96, 10), 7000);
    args.truncate(4);
    args.extend([
        "--name".into(),
        "dual6".into(),
        "--frontend".into(),
        udp6.to_string(),
        "--protocol".into(),
        "UDP".into(),
        "--backend".into(),
        sa(t.v6(10, 3), 7053).to_string(),
    ]);
    t.cli(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        whoami_udp_ask(&t.ep_a, udp6, REACHES),
        Some(t.v6(10, 3)),
        "IPv6 UDP through the VIP\n{}",
        t.logs()
    );
}

#[test]
fn a_restarted_node_keeps_every_translation_and_established_flow() {
    let Some(mut t) = setup_with("lb-restart", |t| {
        let state = t.dir.join("state");
        lb_config(t, &format!("  stateDir: {}\n", state.display()), "")
    }) else {
        return;
    };
    set_web(&t, &[1, 2, 3]);
    let vip = sa(t.v4(96, 10), 80);
    let mut flows: Vec<_> = (0..9)
        .map(|i| {
            whoami_tcp_open(&t.ep_a, vip, REACHES)
                .unwrap_or_else(|| panic!("connection {i} failed\n{}", t.logs()))
        })
        .collect();
    let admin = t.admin();
    let list = |t: &Topology| {
        t.cli(&[
            "service",
            "list",
            "--json",
            "--admin-socket",
            admin.to_str().unwrap(),
        ])
    };
    let before = list(&t);

    t.kill_node();
    for (stream, backend) in &mut flows {
        assert!(
            echo(stream, b"alone"),
            "flow to {backend} broke while the node was down"
        );
    }
    t.start_node(&t.config_dir());
    for (stream, backend) in &mut flows {
        assert!(
            echo(stream, b"restarted"),
            "flow to {backend} broke across the restart\n{}",
            t.logs()
        );
    }
    assert_eq!(
        list(&t),
        before,
        "the service (set through the API) came back with other ids"
    );
    let after: BTreeSet<IpAddr> = connect_many(&t, vip, 30).into_iter().collect();
    assert_eq!(
        after.len(),
        3,
        "new connections after the restart: {after:?}"
    );
}

#[test]
fn dns_to_a_service_vip_goes_to_its_backend_per_protocol() {
    let Some(mut t) = setup_with("lb-dns", |t| {
        let vip = sa(t.v4(96, 53), 53).to_string();
        let docs = service_doc("dns-udp", &vip, "UDP", &[sa(t.v4(9, 53), 53).to_string()])
            + &service_doc("dns-tcp", &vip, "TCP", &[sa(t.v4(9, 54), 53).to_string()]);
        lb_config(t, "", &docs)
    }) else {
        return;
    };
    // The TCP service's backend answers api.example.test with another address.
    t.start_dns_on(
        54,
        &zone(
            &t,
            &ZONE.replace("api 300 IN A 10.N.10.1", "api 300 IN A 10.N.10.2"),
        ),
    );
    let vip = sa(t.v4(96, 53), 53);
    let udp = dns::ask(
        &t,
        Over::Udp,
        &t.ep_a,
        vip,
        "api.example.test.",
        RecordType::A,
    );
    assert_eq!(udp.from, vip, "the UDP reply must come from the VIP");
    assert_eq!(
        udp.addrs,
        vec![t.v4(10, 1)],
        "UDP went to the UDP service's backend"
    );
    let tcp = dns::ask(
        &t,
        Over::Tcp,
        &t.ep_a,
        vip,
        "api.example.test.",
        RecordType::A,
    );
    assert_eq!(
        tcp.addrs,
        vec![t.v4(10, 2)],
        "TCP went to the TCP service's backend"
    );
}
