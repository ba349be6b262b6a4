//! The load balancer's writes keep the maps valid at every step, and its state survives a
//! checkpoint round trip and an adoption from the maps.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use fqdnd_lb::{LbWrite, LoadBalancer, MemoryMaps, Protocol, ServiceKey};
use proptest::prelude::*;

fn service(vip: u8, port: u16, tcp: bool, v6: bool) -> ServiceKey {
    ServiceKey {
        vip: if v6 {
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0x10, u16::from(vip)))
        } else {
            IpAddr::V4(Ipv4Addr::new(10, 96, 0, vip))
        },
        port,
        proto: if tcp { Protocol::Tcp } else { Protocol::Udp },
    }
}

fn backend(n: u8, v6: bool) -> SocketAddr {
    let ip = if v6 {
        IpAddr::V6(Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, u16::from(n)))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 0, 1, n))
    };
    SocketAddr::new(ip, 8000 + u16::from(n % 3))
}

#[derive(Debug, Clone)]
enum Op {
    Set {
        svc: (u8, u16, bool, bool),
        backends: Vec<u8>,
    },
    Remove((u8, u16, bool, bool)),
}

fn op() -> impl Strategy<Value = Op> {
    let svc = (
        0u8..3,
        prop_oneof![Just(53u16), Just(80u16)],
        any::<bool>(),
        any::<bool>(),
    );
    prop_oneof![
        3 => (svc.clone(), prop::collection::vec(1u8..12, 0..8))
            .prop_map(|(svc, backends)| Op::Set { svc, backends }),
        1 => svc.prop_map(Op::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_step_is_valid_and_state_round_trips(ops in prop::collection::vec(op(), 1..40)) {
        let mut lb = LoadBalancer::new();
        let mut maps = MemoryMaps::default();
        for op in ops {
            let (key, writes, wanted) = match op {
                Op::Set { svc: (v, p, t, six), backends } => {
                    let key = service(v + 1, p, t, six);
                    let addrs: Vec<SocketAddr> =
                        backends.iter().map(|b| backend(*b, six)).collect();
                    let before: BTreeMap<SocketAddr, _> = lb
                        .services()
                        .filter(|(k, _, _)| *k == key)
                        .flat_map(|(_, _, b)| b.into_iter().map(|(id, a)| (a, id)))
                        .collect();
                    let writes = lb.set_service(key, &addrs).unwrap();
                    // Backends that stay keep their ids.
                    for (_, _, now) in lb.services().filter(|(k, _, _)| *k == key) {
                        for (id, a) in now {
                            if let Some(old) = before.get(&a) {
                                prop_assert_eq!(*old, id);
                            }
                        }
                    }
                    (key, writes, Some(addrs))
                }
                Op::Remove((v, p, t, six)) => {
                    let key = service(v + 1, p, t, six);
                    (key, lb.remove_service(&key), None)
                }
            };
            for w in &writes {
                maps.apply(w);
                prop_assert!(maps.check().is_ok(), "after {:?}: {:?}", w, maps.check());
            }
            prop_assert!(maps.check_settled().is_ok(), "{:?}", maps.check_settled());
            prop_assert_eq!(&maps, &lb.maps());
            // What the datapath picks is what the service holds.
            if let Some(addrs) = wanted {
                for hash in 0..16u32 {
                    let picked = maps.pick(&key, hash).map(|(_, a)| a);
                    prop_assert_eq!(picked, lb.pick(&key, hash));
                    if let Some(a) = picked {
                        prop_assert!(addrs.contains(&a));
                    } else {
                        prop_assert!(addrs.is_empty());
                    }
                }
            } else {
                prop_assert!(maps.pick(&key, 0).is_none());
            }
            let restored = LoadBalancer::from_state(&lb.state()).unwrap();
            prop_assert_eq!(restored.maps(), maps.clone());
            let adopted = LoadBalancer::from_maps(&maps).unwrap();
            prop_assert_eq!(adopted.maps(), maps.clone());
        }
    }
}

#[test]
fn removal_moves_the_last_slot_into_the_hole() {
    let key = service(10, 80, true, false);
    let (a, b, c) = (backend(1, false), backend(2, false), backend(3, false));
    let mut lb = LoadBalancer::new();
    lb.set_service(key, &[a, b, c]).unwrap();
    let ids: Vec<_> = lb.services().next().unwrap().2;
    let writes = lb.set_service(key, &[a, c]).unwrap();
    let (id_b, id_c) = (ids[1].0, ids[2].0);
    assert_eq!(writes.len(), 4, "{writes:?}");
    assert!(
        matches!(writes[0], LbWrite::SetSlot { slot: 2, value: fqdnd_lb::SlotValue::Backend { id, .. }, .. } if id == id_c)
    );
    assert!(matches!(
        writes[1],
        LbWrite::SetSlot {
            slot: 0,
            value: fqdnd_lb::SlotValue::Service { count: 2, .. },
            ..
        }
    ));
    assert!(matches!(writes[2], LbWrite::RemoveSlot { slot: 3, .. }));
    assert_eq!(writes[3], LbWrite::RemoveBackend(id_b));
    assert_eq!(
        lb.services().next().unwrap().2,
        vec![ids[0], ids[2]],
        "no hole, no duplicate"
    );
}

#[test]
fn ids_are_not_reused_soon() {
    let key = service(10, 80, true, false);
    let mut lb = LoadBalancer::new();
    lb.set_service(key, &[backend(1, false)]).unwrap();
    let first = lb.services().next().unwrap().2[0].0;
    lb.set_service(key, &[backend(2, false)]).unwrap();
    let second = lb.services().next().unwrap().2[0].0;
    assert_ne!(first, second, "a conntrack entry may still hold {first}");
    lb.set_service(key, &[backend(1, false)]).unwrap();
    let third = lb.services().next().unwrap().2[0].0;
    assert!(third != first && third != second);
}

#[test]
fn tcp_and_udp_on_one_port_are_distinct_services() {
    let tcp = service(10, 53, true, false);
    let udp = service(10, 53, false, false);
    let mut lb = LoadBalancer::new();
    lb.set_service(tcp, &[backend(1, false)]).unwrap();
    lb.set_service(udp, &[backend(2, false)]).unwrap();
    assert_eq!(lb.pick(&tcp, 7), Some(backend(1, false)));
    assert_eq!(lb.pick(&udp, 7), Some(backend(2, false)));
    let maps = lb.maps();
    assert_eq!(maps.backends.len(), 2);
    assert_eq!(maps.rev_nats.len(), 2);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let key = service(10, 80, true, false);
    let mut lb = LoadBalancer::new();
    assert!(matches!(
        lb.set_service(key, &[backend(1, true)]),
        Err(fqdnd_lb::Error::FamilyMismatch { .. })
    ));
    let zero_port = ServiceKey { port: 0, ..key };
    assert!(matches!(
        lb.set_service(zero_port, &[backend(1, false)]),
        Err(fqdnd_lb::Error::InvalidService { .. })
    ));
    assert!(lb.maps().slots.is_empty() && lb.maps().backends.is_empty());
}
