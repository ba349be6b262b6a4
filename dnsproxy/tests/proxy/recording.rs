//! The recording tap: queries and replies as the client saw them, with the verdict and the
//! tag, only while the recorder is on.

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;

use fqdnd_dnsproxy::{Direction, Transport};
use hickory_proto::rr::RecordType;

use crate::harness::{Harness, Mode, Taken, TcpClient, eventually, query, udp_exchange};
use crate::upstream::answer;

fn taken(h: &Harness) -> Vec<Taken> {
    h.recorder.taken.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_and_replies_are_recorded_as_the_client_saw_them_while_on() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream.rule(
        "www.example.",
        answer("www.example.", [Ipv4Addr::new(192, 0, 2, 1)]),
    );
    // Off: nothing.
    let q = query("www.example.", RecordType::A, None);
    udp_exchange(h.udp, &q).await;
    h.settled().await;
    assert!(taken(&h).is_empty());

    h.recorder.on.store(true, Ordering::Relaxed);
    let q = query("www.example.", RecordType::A, None);
    let r = udp_exchange(h.udp, &q).await;
    let denied = query("denied.example.", RecordType::A, None);
    let refused = udp_exchange(h.udp, &denied).await;
    assert!(eventually(|| taken(&h).len() == 4).await, "{:?}", taken(&h));
    let t = taken(&h);
    let (ask, reply) = (&t[0], &t[1]);
    assert_eq!(
        (ask.direction, ask.verdict, ask.tag),
        (Direction::Query, "allow", Some(7))
    );
    assert_eq!(ask.bytes, q, "the query with the client's own ID");
    assert_eq!(ask.server, h.udp);
    assert_eq!(ask.transport, Transport::Udp);
    assert_eq!(
        (reply.direction, reply.verdict, reply.tag),
        (Direction::Reply, "answered", Some(7))
    );
    assert_eq!(reply.bytes, r, "the reply exactly as the client got it");
    assert_eq!(reply.client, ask.client);
    // A refused query and its reply name who asked, as an allowed one does.
    assert_eq!(
        (t[2].verdict, t[2].tag, &t[2].bytes),
        ("deny", Some(7), &denied)
    );
    assert_eq!(
        (t[3].direction, t[3].verdict, t[3].tag, &t[3].bytes),
        (Direction::Reply, "denied", Some(7), &refused)
    );
    assert!(t.iter().all(|m| !m.redirected), "{t:?}");

    // Over TCP: the message without its length prefix.
    let mut client = TcpClient::connect(h.tcp).await;
    let q = query("www.example.", RecordType::A, None);
    client.send_all(&[&q]).await;
    let r = client.recv().await.unwrap();
    assert!(eventually(|| taken(&h).len() == 6).await, "{:?}", taken(&h));
    let t = taken(&h);
    assert_eq!((t[4].transport, &t[4].bytes), (Transport::Tcp, &q));
    assert_eq!((t[5].transport, &t[5].bytes), (Transport::Tcp, &r));

    // Off again: nothing more.
    h.recorder.on.store(false, Ordering::Relaxed);
    udp_exchange(h.udp, &query("www.example.", RecordType::A, None)).await;
    h.settled().await;
    assert_eq!(taken(&h).len(), 6);
    h.stop().await;
}
