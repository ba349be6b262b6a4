//! Frames to DNS messages: TCP reassembly on the dnscap captures, link layers, fragments,
//! snap-length cuts, gzip, and never a panic on any bytes.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use common::{all_fixtures, fixture};
use flate2::Compression;
use flate2::write::GzEncoder;
use fqdnd_replay::capture::linktype;
use fqdnd_replay::dns::{Data, Decoder, Header};
use fqdnd_replay::synth::{self, PcapWriter, SynthRr, tcp_flags};
use fqdnd_replay::{Counters, Transport, extract_bytes};
use proptest::prelude::*;

/// (queries, responses, counters) found in capture bytes.
fn messages(bytes: &[u8], ports: &[u16]) -> (usize, usize, Counters) {
    let (mut q, mut r) = (0, 0);
    let (counters, _) = extract_bytes(bytes, ports, &mut |p| match Header::parse(p.bytes) {
        Ok(h) if h.response => r += 1,
        Ok(_) => q += 1,
        Err(_) => {}
    });
    (q, r, counters)
}

fn file(rel: &str) -> (usize, usize, Counters) {
    messages(&std::fs::read(fixture(rel)).unwrap(), &[53])
}

/// Counts derived from the segment lists (tshark 4.0.17 `-T fields -e tcp.seq_raw -e tcp.len`):
/// each client query is a 2-byte length segment plus a body segment, each server response one
/// whole length-prefixed segment; a message is recoverable when all its bytes were captured.
#[test]
fn tcp_reassembly_recovers_every_captured_message() {
    for (rel, queries, responses) in [
        ("debsrc-dnscap/dnso1tcp.pcap", 41, 41),
        ("debsrc-dnscap/dnso1tcp-bighole.pcap", 38, 38),
        ("debsrc-dnscap/dnso1tcp-midmiss.pcap", 3, 3),
        ("debsrc-dnscap/dnsotcp-many1pkt.pcap", 3, 1),
        ("debsrc-dnscap/dnsotcp-manyopkts.pcap", 3, 0),
        ("debsrc-dnscap/1qtcpnosyn.pcap", 1, 1),
        ("debsrc-dnscap/1qtcppadd.pcap", 1, 1),
        ("debsrc-dnscap/do1t-nosyn-1nolen.pcap", 1, 2),
        ("debsrc-wireshark/dns-ooo.pcap", 0, 1),
        ("debian-pathspider/dns_valid_response_tcp.pcap", 1, 1),
    ] {
        let (q, r, c) = file(rel);
        assert_eq!((q, r), (queries, responses), "{rel}: {c:?}");
        assert_eq!(c.tcp_messages as usize, q + r, "{rel}");
    }
    let (_, _, c) = file("debsrc-dnscap/dnso1tcp-bighole.pcap");
    assert_eq!(c.tcp_gaps, 2, "one hole in each direction");
    assert!(c.tcp_out_of_order_segments > 0);
    let (_, _, c) = file("debsrc-dnscap/do1t-nosyn-1nolen.pcap");
    assert_eq!(c.tcp_streams_without_syn, 2);
    assert!(
        c.tcp_skipped_bytes >= 28,
        "the query whose length prefix was not captured"
    );
    let (_, _, c) = file("debsrc-wireshark/dns-ooo.pcap");
    assert_eq!(c.tcp_out_of_order_segments, 1);
}

#[test]
fn link_layers_fragments_and_ports() {
    for (rel, queries, responses) in [
        ("debsrc-dnscap/dns.pcap", 41, 41),
        ("debsrc-dnscap/vlan11.pcap", 41, 41),
        ("debsrc-dnscap/frags.pcap", 41, 41),
        ("debsrc-dnscap/dns6.pcap", 1, 1),
        ("debian-pathspider/basic_ipv6_udp.pcap", 1, 1),
        ("pypi-pypacker/dns4.pcap", 0, 1),
        ("github-dnscap/sll2.pcap", 1, 1),
        ("pypi-pypacker/ether.pcapng", 2, 2),
        ("debsrc-wireshark/dns+icmp.pcapng", 6, 5),
        ("crate-pcap-parser/wireshark_samples-test.pcapng", 27, 27),
        // PPPoE; the ninth response tshark shows is quoted inside an ICMP error.
        ("debian-python3-dpkt/nb6-http.pcap", 8, 8),
        ("debian-pathspider/real-dns-only.pcap", 195, 195),
    ] {
        let (q, r, c) = file(rel);
        assert_eq!((q, r), (queries, responses), "{rel}: {c:?}");
    }
    let (_, _, c) = file("debsrc-dnscap/frags.pcap");
    assert!(
        c.ip_datagrams_reassembled >= 1 && c.ip_fragments_dropped == 0,
        "{c:?}"
    );
    // DNS on 65282 only with --port.
    let bytes = std::fs::read(fixture("debsrc-wireshark/dns_port.pcap")).unwrap();
    assert_eq!(messages(&bytes, &[53]).0 + messages(&bytes, &[53]).1, 0);
    let (q, r, _) = messages(&bytes, &[53, 65282]);
    assert_eq!((q, r), (2, 2));
}

#[test]
fn snap_length_cuts_are_counted_and_skipped() {
    let (q, r, c) = file("debian-python3-dpkt/truncated_dns.pcap");
    assert_eq!((q, r), (0, 0));
    assert_eq!(c.truncated, 1);
    // snaplen 96: only the shortest response survives whole.
    let (q, r, c) = file("debian-python3-libtrace/anon-v4.pcap");
    assert_eq!((q, r), (14, 1));
    assert_eq!(c.truncated, 13);
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

#[test]
fn gzip_is_detected_by_magic_even_twice() {
    let plain = std::fs::read(fixture("debian-python3-libtrace/anon-v4.pcap")).unwrap();
    let twice = gzip(&gzip(&plain));
    let (a, b) = (messages(&plain, &[53]), messages(&twice, &[53]));
    assert_eq!(a, b);
    let ng = std::fs::read(fixture("pypi-pypacker/ether.pcapng")).unwrap();
    assert_eq!(messages(&gzip(&ng), &[53]), messages(&ng, &[53]));
    let (_, err) = extract_bytes(b"not a capture at all", &[53], &mut |_| {});
    assert!(err.is_some());
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn msg(i: u16) -> Vec<u8> {
    // Fixed width: every message has the same length.
    let name = format!("n{i:03}.example.com.");
    let rr = [SynthRr::Addr(
        name.clone(),
        60,
        format!("192.0.2.{}", i % 250).parse().unwrap(),
    )];
    synth::dns_message(i, &name, 1, 0, Some(&rr))
}

/// A TCP stream of `n` length-prefixed responses, cut into segments of `seg` bytes.
fn stream(n: u16) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        let m = msg(i);
        out.extend_from_slice(&(m.len() as u16).to_be_bytes());
        out.extend_from_slice(&m);
    }
    out
}

fn capture(frames: &[(Duration, Vec<u8>)], link: i32) -> Vec<u8> {
    let mut w = PcapWriter::new(Vec::new(), link).unwrap();
    for (ts, f) in frames {
        w.packet(*ts, f).unwrap();
    }
    w.into_inner()
}

fn segments(data: &[u8], seg: usize, isn: u32, syn: bool) -> Vec<(u32, Vec<u8>)> {
    let server = addr("192.0.2.53:53");
    let client = addr("10.0.0.1:40000");
    let mut out = Vec::new();
    if syn {
        out.push((
            isn,
            synth::tcp_frame(server, client, isn, tcp_flags::SYN | tcp_flags::ACK, &[]),
        ));
    }
    for (i, chunk) in data.chunks(seg.max(1)).enumerate() {
        let seq = isn.wrapping_add(1).wrapping_add((i * seg.max(1)) as u32);
        out.push((
            seq,
            synth::tcp_frame(server, client, seq, tcp_flags::ACK | tcp_flags::PSH, chunk),
        ));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any segmentation and any order (the SYN first), sequence numbers wrapping or not:
    /// every message comes out exactly once, in stream order.
    #[test]
    fn tcp_messages_survive_any_segmentation_and_order(
        n in 1u16..20,
        seg in 1usize..200,
        isn in any::<u32>(),
        shuffle in proptest::collection::vec(any::<u32>(), 0..64),
    ) {
        let data = stream(n);
        let mut segs = segments(&data, seg, isn, true);
        let syn = segs.remove(0);
        for (i, k) in shuffle.iter().enumerate() {
            if segs.len() > 1 {
                let a = i % segs.len();
                let b = (*k as usize) % segs.len();
                segs.swap(a, b);
            }
        }
        // Retransmit a few.
        let again: Vec<_> = segs.iter().step_by(3).cloned().collect();
        segs.extend(again);
        let frames: Vec<(Duration, Vec<u8>)> = std::iter::once(syn)
            .chain(segs)
            .enumerate()
            .map(|(i, (_, f))| (Duration::from_millis(1_000_000 + i as u64), f))
            .collect();
        let bytes = capture(&frames, linktype::ETHERNET);
        let mut ids = Vec::new();
        let (c, err) = extract_bytes(&bytes, &[53], &mut |p| {
            assert_eq!(p.transport, Transport::Tcp);
            ids.push(Header::parse(p.bytes).unwrap().id);
        });
        prop_assert!(err.is_none());
        prop_assert_eq!(ids, (0..n).collect::<Vec<_>>(), "{:?}", c);
    }

    /// A lost segment costs the messages it touches, never the ones after (resync).
    #[test]
    fn a_lost_segment_costs_only_its_messages(n in 4u16..20, lost in any::<u32>(), syn in any::<bool>()) {
        let data = stream(n);
        let m = msg(0).len() + 2;
        // Each segment holds one whole message: segment k carries message k.
        let mut segs = segments(&data, m, 7, syn);
        let skip = usize::from(syn) + (lost as usize % n as usize);
        segs.remove(skip);
        let frames: Vec<(Duration, Vec<u8>)> = segs
            .into_iter()
            .enumerate()
            .map(|(i, (_, f))| (Duration::from_millis(1_000_000 + i as u64), f))
            .collect();
        let bytes = capture(&frames, linktype::ETHERNET);
        let mut ids = Vec::new();
        let _ = extract_bytes(&bytes, &[53], &mut |p| ids.push(Header::parse(p.bytes).unwrap().id));
        let lost_id = (skip - usize::from(syn)) as u16;
        let want: Vec<u16> = (0..n).filter(|i| *i != lost_id).collect();
        // Messages whose lengths are all the same length differ only in digits; ids must
        // still come out in order with exactly the lost one missing (a stream without SYN
        // whose first segment is lost starts at the next boundary).
        prop_assert_eq!(ids, want);
    }

    /// Arbitrary bytes, bare or behind a valid pcap or pcapng header, never panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096), link in 0i32..300) {
        let _ = extract_bytes(&bytes, &[53], &mut |_| {});
        let mut w = PcapWriter::new(Vec::new(), link).unwrap();
        for chunk in bytes.chunks(97) {
            w.packet(Duration::from_secs(1), chunk).unwrap();
        }
        let _ = extract_bytes(&w.into_inner(), &[53], &mut |_| {});
        let mut raw = PcapWriter::new(Vec::new(), 0).unwrap().into_inner();
        raw.truncate(24);
        raw.extend_from_slice(&bytes);
        let _ = extract_bytes(&raw, &[53], &mut |_| {});
        let mut d = Decoder::new();
        let _ = d.decode(&bytes);
        let _ = fqdnd_replay::dns::is_whole_message(&bytes);
    }

    /// Every fixture, with bytes flipped, cut or inserted (and gzipped), never panics.
    #[test]
    fn mutated_fixtures_never_panic(
        which in any::<u32>(),
        edits in proptest::collection::vec((any::<u32>(), any::<u8>(), 0u8..4), 1..24),
        cut in any::<u32>(),
        zip in any::<bool>(),
    ) {
        let files = all_fixtures();
        let path = &files[which as usize % files.len()];
        let mut bytes = std::fs::read(path).unwrap();
        if bytes.len() > 200_000 {
            bytes.truncate(200_000);
        }
        for (at, value, kind) in edits {
            if bytes.is_empty() {
                break;
            }
            let i = at as usize % bytes.len();
            match kind {
                0 => bytes[i] = value,
                1 => bytes[i] ^= 1 << (value % 8),
                2 => bytes.insert(i, value),
                _ => {
                    bytes.remove(i);
                }
            }
        }
        let keep = bytes.len().saturating_sub(cut as usize % 64);
        bytes.truncate(keep);
        if zip {
            bytes = gzip(&bytes);
        }
        let _ = extract_bytes(&bytes, &[53, 65282], &mut |p| {
            let _ = Decoder::new().decode(p.bytes);
        });
    }
}

#[test]
fn ipv4_fragments_out_of_order_are_reassembled_and_bounded() {
    let src = addr("192.0.2.53:53");
    let dst = addr("10.0.0.1:40000");
    let big: Vec<SynthRr> = (0..40)
        .map(|i| {
            SynthRr::Addr(
                "big.example.com.".into(),
                60,
                format!("198.51.100.{i}").parse().unwrap(),
            )
        })
        .collect();
    let payload = synth::dns_message(9, "big.example.com.", 1, 0, Some(&big));
    let mut frags = synth::ipv4_udp_fragments(src, dst, &payload, 77, 300);
    assert!(frags.len() > 2);
    frags.reverse();
    let t = Duration::from_secs(100);
    let frames: Vec<(Duration, Vec<u8>)> = frags.iter().map(|f| (t, f.clone())).collect();
    let bytes = capture(&frames, linktype::RAW);
    let mut got = Vec::new();
    let (c, _) = extract_bytes(&bytes, &[53], &mut |p| got.push(p.bytes.to_vec()));
    assert_eq!(got, vec![payload.clone()]);
    assert_eq!(c.ip_datagrams_reassembled, 1);
    // A fragment that never completes is dropped after the timeout, on capture time.
    let mut frames: Vec<(Duration, Vec<u8>)> = vec![(t, frags[1].clone())];
    frames.push((t + Duration::from_secs(40), frags[0].clone()));
    for f in &frags[2..] {
        frames.push((t + Duration::from_secs(41), f.clone()));
    }
    let bytes = capture(&frames, linktype::RAW);
    let (c, _) = extract_bytes(&bytes, &[53], &mut |_| {});
    assert!(c.ip_fragments_dropped >= 1, "{c:?}");
}

#[test]
fn the_decoder_agrees_with_hickory_on_every_fixture_message() {
    use hickory_proto::op::Message;
    use hickory_proto::rr::RData;
    let mut compared = 0;
    for path in all_fixtures() {
        let bytes = std::fs::read(&path).unwrap();
        let _ = extract_bytes(&bytes, &[53, 65282], &mut |p| {
            let Ok(theirs) = Message::from_vec(p.bytes) else {
                return;
            };
            let mut d = Decoder::new();
            let ours = d
                .decode(p.bytes)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(ours.header.id, theirs.metadata.id);
            assert_eq!(
                ours.header.rcode,
                u16::from(theirs.metadata.response_code) as u8 & 0x0f
            );
            let qname = theirs.queries[0].name.to_lowercase().to_ascii();
            // Escaped bytes are written differently (hickory escapes more); such names are
            // refused by the NameManager either way.
            if !qname.contains('\\') {
                assert_eq!(
                    ours.qname().trim_end_matches('.'),
                    qname.trim_end_matches('.')
                );
            }
            let mut theirs_rr: Vec<String> = theirs
                .answers
                .iter()
                .filter_map(|r| match &r.data {
                    RData::A(a) => Some(format!("{} {} A {}", r.name.to_lowercase(), r.ttl, a.0)),
                    RData::AAAA(a) => {
                        Some(format!("{} {} AAAA {}", r.name.to_lowercase(), r.ttl, a.0))
                    }
                    RData::CNAME(c) => Some(format!(
                        "{} {} CNAME {}",
                        r.name.to_lowercase(),
                        r.ttl,
                        c.0.to_lowercase()
                    )),
                    _ => None,
                })
                .collect();
            let mut ours_rr: Vec<String> = ours
                .answers
                .iter()
                .filter_map(|r| match (&r.data, r.rtype) {
                    (Data::Addr(a), 1) => Some(format!("{} {} A {a}", ours.name(&r.owner), r.ttl)),
                    (Data::Addr(a), _) => {
                        Some(format!("{} {} AAAA {a}", ours.name(&r.owner), r.ttl))
                    }
                    (Data::Name(n), 5) => Some(format!(
                        "{} {} CNAME {}",
                        ours.name(&r.owner),
                        r.ttl,
                        ours.name(n)
                    )),
                    _ => None,
                })
                .collect();
            theirs_rr.sort();
            ours_rr.sort();
            assert_eq!(ours_rr, theirs_rr, "{}", path.display());
            compared += 1;
        });
    }
    assert!(compared > 900, "{compared}");
}

#[test]
fn many_streams_stay_within_bounds() {
    // More streams than the limit, each with an unfinished message: evicted, never unbounded.
    let mut frames = Vec::new();
    for i in 0..3000u32 {
        let client: SocketAddr = format!(
            "10.{}.{}.{}:{}",
            i >> 16,
            (i >> 8) & 255,
            i & 255,
            1024 + (i % 60000)
        )
        .parse()
        .unwrap();
        let f = synth::tcp_frame(
            addr("192.0.2.53:53"),
            client,
            i,
            tcp_flags::ACK,
            &[0x01, 0x00, 0xab],
        );
        frames.push((
            Duration::from_secs(10) + Duration::from_millis(u64::from(i)),
            f,
        ));
    }
    let bytes = capture(&frames, linktype::ETHERNET);
    let mut extractor = fqdnd_replay::Extractor::new(
        &[53],
        fqdnd_replay::Limits {
            tcp_max_streams: 1000,
            ..fqdnd_replay::Limits::default()
        },
    );
    let mut reader = fqdnd_replay::CaptureReader::new(std::io::Cursor::new(bytes)).unwrap();
    let mut peak = 0;
    reader
        .for_each(|f| {
            extractor.frame(f, &mut |_| {});
            peak = peak.max(extractor.state_size().0);
        })
        .unwrap();
    assert!(peak <= 1000, "{peak}");
    assert!(extractor.counters().tcp_streams_evicted >= 2000);
}
