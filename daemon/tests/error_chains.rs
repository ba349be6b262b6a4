//! The convention every crate follows: an error's message says what failed, and its cause is
//! printed once — either in its message (then it is not its `source()`) or as its `source()`
//! (then not in its message). Here every error with a cause that the CLI can print, from each
//! crate, wrapped as the daemon wraps it, is rendered the way `fqdnd` prints errors, and no
//! segment may repeat.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::error::Error as StdError;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use fqdnd_daemon::Context;

/// A cause no message repeats by accident.
fn os(n: i32) -> io::Error {
    io::Error::from_raw_os_error(n)
}

fn addr() -> SocketAddr {
    "127.0.0.1:53".parse().unwrap()
}

/// Every error with a cause the crates return, one per variant.
fn errors() -> Vec<Box<dyn StdError + Send + Sync>> {
    use fqdnd_dnsproxy::{Error as Proxy, Transport};
    let bad_name = fqdnd_namemgr::DnsName::canonical("a..b").unwrap_err();
    let bad_pattern = fqdnd_namemgr::FqdnSelector::match_pattern("a b").unwrap_err();
    let datapath = || {
        fqdnd_ipcache::Error::Datapath(fqdnd_ipcache::DatapathError::Io {
            operation: "update",
            error: os(28),
        })
    };
    let journal = || fqdnd_checkpoint::Error::Io {
        path: PathBuf::from("/var/lib/fqdnd/journal.0001"),
        op: "fdatasync",
        error: Arc::new(os(5)),
    };
    vec![
        Box::new(Proxy::Bind {
            transport: Transport::Udp,
            addr: addr(),
            error: os(98),
        }),
        Box::new(Proxy::MissingCapability {
            what: "set IP_TRANSPARENT on the UDP listener",
            addr: addr(),
            capability: "CAP_NET_ADMIN",
            error: os(1),
        }),
        Box::new(Proxy::UpstreamSocket {
            upstream: addr(),
            error: os(101),
        }),
        Box::new(Proxy::Listener {
            transport: Transport::Tcp,
            addr: addr(),
            error: os(24),
        }),
        Box::new(Proxy::Upstream {
            upstream: addr(),
            error: os(111),
        }),
        Box::new(fqdnd_namemgr::Error::InvalidName {
            name: "a..b".into(),
            error: bad_name,
        }),
        Box::new(fqdnd_namemgr::Error::from(bad_pattern.clone())),
        Box::new(fqdnd_engine::Error::Selector(bad_pattern)),
        Box::new(datapath()),
        Box::new(fqdnd_engine::Error::Datapath {
            rolled_back: true,
            source: datapath(),
        }),
        Box::new(fqdnd_engine::Error::Policy(datapath())),
        Box::new(fqdnd_engine::Error::Journal(journal())),
        Box::new(journal()),
        Box::new(fqdnd_checkpoint::Error::Full {
            path: PathBuf::from("/var/lib/fqdnd/journal.0001"),
            op: "write",
            error: Arc::new(os(28)),
        }),
        Box::new(fqdnd_privileges::Error::Sys {
            call: "capset",
            error: os(1),
        }),
        Box::new(fqdnd_privileges::Error::Proc {
            path: "/proc/self/task".into(),
            error: os(2),
        }),
        Box::new(fqdnd_cluster::Error::State {
            op: "writing",
            path: PathBuf::from("/var/lib/fqdnd/cluster.state"),
            error: os(30),
        }),
        Box::new(fqdnd_ebpf::Error::Io {
            what: "mounting bpffs at /sys/fs/bpf".into(),
            error: os(19),
        }),
        Box::new(fqdnd_config::Error::Io {
            path: PathBuf::from("/etc/fqdnd/gateway.yaml"),
            error: os(13),
        }),
    ]
}

/// `e` as `fqdnd` prints it (anyhow's `{:#}`: each message, `: `-joined), by segment.
fn rendered(e: &(dyn StdError + 'static)) -> Vec<String> {
    let mut segments = vec![e.to_string()];
    let mut next = e.source();
    while let Some(cause) = next {
        segments.push(cause.to_string());
        next = cause.source();
    }
    segments
}

/// The first segment printed twice, if any (a later segment already inside an earlier one).
fn repeated(e: &(dyn StdError + 'static)) -> Option<String> {
    let segments = rendered(e);
    for (i, later) in segments.iter().enumerate().skip(1) {
        if let Some(earlier) = segments[..i].iter().find(|s| s.contains(later.as_str())) {
            return Some(format!(
                "{later:?} is already in {earlier:?} (whole: {})",
                segments.join(": ")
            ));
        }
    }
    None
}

fn assert_each_cause_once(e: &(dyn StdError + 'static)) {
    if let Some(twice) = repeated(e) {
        panic!("printed twice: {twice}");
    }
}

#[test]
fn every_cause_is_printed_once_alone_and_wrapped_by_the_daemon() {
    for e in errors() {
        assert_each_cause_once(e.as_ref());
        // As the daemon wraps it: a step, in a step.
        let wrapped = Err::<(), _>(fqdnd_daemon::Error::Other(e))
            .context("applying the configuration")
            .context("reloading")
            .unwrap_err();
        assert_each_cause_once(&wrapped);
        let text = fqdnd_daemon::chain(&wrapped);
        assert!(
            text.starts_with("reloading: applying the configuration: "),
            "{text}"
        );
    }
}

#[test]
fn the_check_finds_a_cause_printed_twice() {
    #[derive(Debug, thiserror::Error)]
    #[error("opening the journal: {source}")]
    struct Twice {
        source: io::Error,
    }
    let twice = Twice { source: os(2) };
    assert!(
        repeated(&twice).is_some(),
        "a message that repeats its source must fail the check"
    );
    assert_eq!(repeated(&os(2)), None);
}
