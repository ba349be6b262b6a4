//! The final summary as text: a fixed-label "Statistics:" block in the style of dnsperf, so
//! that it can be grepped; with two runs, their figures side by side.

use std::fmt::Write as _;

use crate::engine::RunReport;
use crate::run::Report;

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

fn micros(ns: u64) -> String {
    format!("{:.2} us", ns as f64 / 1000.0)
}

/// A labelled line of the per-run table.
type Line = (&'static str, fn(&RunReport) -> String);

/// The summary block.
pub fn summary(report: &Report) -> String {
    let mut out = String::new();
    let i = &report.input;
    let x = &report.extract;
    let w = &mut out;
    let _ = writeln!(w, "Statistics:\n");
    let _ = writeln!(
        w,
        "  Files read:            {} ({} damaged)",
        i.files.len(),
        i.capture_errors.len()
    );
    for e in &i.capture_errors {
        let _ = writeln!(w, "    damaged:             {e}");
    }
    let _ = writeln!(w, "  Packets read:          {}", i.packets);
    let _ = writeln!(w, "  Capture time:          {:.3} s", i.capture_seconds);
    let _ = writeln!(
        w,
        "  DNS messages:          {} (UDP {}, TCP {}), {} malformed, {} other opcodes",
        i.dns_messages, x.udp_messages, x.tcp_messages, i.dns_malformed, i.dns_other_opcode
    );
    let _ = writeln!(w, "  Queries:               {}", i.queries);
    let _ = writeln!(
        w,
        "  Responses:             {} (TCP {}, TC=1 {})",
        i.responses, i.responses_tcp, i.responses_truncated
    );
    for (rcode, n) in &i.rcodes {
        let _ = writeln!(w, "    {rcode:<20} {n} ({:.2}%)", pct(*n, i.responses));
    }
    let _ = writeln!(
        w,
        "  Responses with addresses: {} ({:.2}%)",
        i.responses_with_addresses,
        pct(i.responses_with_addresses, i.responses)
    );
    let _ = writeln!(
        w,
        "  Responses skipped:     {} (rcode {}, no address {}, answer off its CNAME chain {})",
        i.responses_skipped,
        i.responses - i.responses_with_addresses - i.responses_nodata - i.responses_invalid_answer,
        i.responses_nodata,
        i.responses_invalid_answer
    );
    let _ = writeln!(
        w,
        "  Names:                 {} ({} with addresses)",
        i.names, i.names_with_addresses
    );
    let _ = writeln!(w, "  IPs:                   {}", i.ips);
    let _ = writeln!(
        w,
        "  Frames skipped:        truncated {}, malformed IP {}, not DNS {}, not IP {}, unsupported link {}",
        x.truncated, x.malformed_ip, x.not_dns, x.not_ip, x.unsupported_link
    );
    let _ = writeln!(
        w,
        "  IP fragments:          {} ({} datagrams reassembled, {} dropped)",
        x.ip_fragments, x.ip_datagrams_reassembled, x.ip_fragments_dropped
    );
    let _ = writeln!(
        w,
        "  TCP:                   {} streams ({} without SYN), {} segments, {} out of order, {} retransmitted, {} gaps ({} bytes), {} bytes skipped",
        x.tcp_streams,
        x.tcp_streams_without_syn,
        x.tcp_segments,
        x.tcp_out_of_order_segments,
        x.tcp_retransmitted_segments,
        x.tcp_gaps,
        x.tcp_gap_bytes,
        x.tcp_skipped_bytes
    );
    let _ = writeln!(w);
    let runs: Vec<&RunReport> = std::iter::once(&report.run)
        .chain(report.compare.as_ref())
        .collect();
    let _ = write!(w, "  {:<34}", "Identity mode:");
    for r in &runs {
        let _ = write!(w, "{:>16}", r.identity_mode);
    }
    let _ = writeln!(w);
    let rows: [Line; 24] = [
        ("Answers learned:", |r| r.responses_learned.to_string()),
        ("Answers from no endpoint:", |r| {
            r.responses_without_endpoint.to_string()
        }),
        ("Answers with invalid names:", |r| {
            r.invalid_names.to_string()
        }),
        ("New (name, IP) mappings:", |r| r.new_mappings.to_string()),
        ("Selected IPs (end):", |r| r.selected_ips.to_string()),
        ("Identities allocated (total):", |r| {
            r.identities_allocated_total.to_string()
        }),
        ("Identities peak:", |r| r.identities_peak.to_string()),
        ("Identities live (end):", |r| {
            r.identities_live_end.to_string()
        }),
        ("FQDN identities live (end):", |r| {
            r.fqdn_identities_live_end.to_string()
        }),
        ("FQDN label sets (end):", |r| {
            r.label_sets_live_end.to_string()
        }),
        ("IPCache upserts:", |r| r.ipcache_upserts.to_string()),
        ("IPCache deletes:", |r| r.ipcache_deletes.to_string()),
        ("Policy map upserts/deletes:", |r| {
            format!("{}/{}", r.policy_upserts, r.policy_deletes)
        }),
        ("Selector updates:", |r| r.selector_updates.to_string()),
        ("Breaker trips (FQDN identities):", |r| {
            format!("{} ({})", r.breaker_trips, r.breaker_trips_fqdn_identities)
        }),
        ("GC runs / evictions:", |r| {
            format!("{}/{}", r.gc_runs, r.gc_evictions)
        }),
        ("DNS cache names (end):", |r| r.cache_names_end.to_string()),
        ("DNS cache IPs (end / peak):", |r| {
            format!("{}/{}", r.cache_ips_end, r.cache_ips_peak)
        }),
        ("DNS cache mappings (end):", |r| {
            r.cache_mappings_end.to_string()
        }),
        ("Engine errors:", |r| r.engine_errors.to_string()),
        ("Engine time per answer p50:", |r| {
            micros(r.processing_ns_p50)
        }),
        ("Engine time per answer p99:", |r| {
            micros(r.processing_ns_p99)
        }),
        ("Engine time per answer max:", |r| {
            micros(r.processing_ns_max)
        }),
        ("Engine time total:", |r| {
            format!("{:.3} s", r.engine_seconds)
        }),
    ];
    for (label, value) in rows {
        let _ = write!(w, "  {label:<34}");
        for r in &runs {
            let _ = write!(w, "{:>16}", value(r));
        }
        let _ = writeln!(w);
    }
    let _ = writeln!(w);
    let _ = writeln!(w, "  Run time (s):          {:.3}", i.wall_seconds);
    let _ = writeln!(w, "  Responses per second:  {:.0}", i.responses_per_second);
    out
}
