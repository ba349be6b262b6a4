//! `fqdnd replay`: captured DNS traffic through the real policy engine, on the capture's clock.
//!
//! A capture (pcap or pcapng, gzip-compressed or not) is read as a stream of frames; the
//! [`extract`] module turns frames into DNS messages (link layers, IP fragments, UDP, TCP
//! streams); every response with addresses goes through the NameManager and IpCache exactly as
//! the daemon would learn it ([`engine`]), with TTL expiry and GC on a virtual clock driven by
//! the capture's timestamps; the [`run`] module counts what happened and [`report`] prints it.
//! [`live`] instead sends the capture's queries to a running server and compares its answers
//! with the captured ones.
//!
//! Memory follows the live state (DNS cache, identities, bounded reassembly buffers), not the
//! length of the capture. Nothing here reads the wall clock except `wall`, which only measures.
//!
//! ```no_run
//! use fqdnd_replay::{Options, replay, IdentityMode, SettingsOverrides, Limits};
//! let options = Options {
//!     traces: vec!["trace.pcap".into()],
//!     policy: vec!["policy.yaml".into()],
//!     endpoints: vec![],
//!     ports: vec![53],
//!     modes: vec![IdentityMode::Selector],
//!     settings: SettingsOverrides::default(),
//!     limits: Limits::default(),
//!     csv_timeseries: None,
//!     progress_interval: None,
//! };
//! let (report, _series) = replay(&options, &mut |_| {}).expect("replays");
//! println!("{}", fqdnd_replay::report::summary(&report));
//! ```

#![forbid(unsafe_code)]

pub mod capture;
mod defrag;
mod distinct;
/// The DNS decoder replay reads every message with (the proxy reads answers with it too).
pub use fqdnd_dnswire as dns;
pub mod engine;
pub mod extract;
#[doc(hidden)]
pub mod fuzz;
mod histogram;
pub mod live;
pub mod plot;
pub mod preview;
pub mod record;
pub mod report;
pub mod run;
pub mod synth;
mod tcp;
pub mod timeseries;
mod wall;

use std::path::PathBuf;

pub use capture::{CaptureError, CaptureReader, Frame};
pub use engine::{Clients, EngineRun, IdentityMode, RunReport};
pub use extract::{Counters, DnsPayload, Extractor, Limits, Transport, extract_bytes};
pub use live::{LiveOptions, LiveReport, live};
pub use preview::{PreviewOptions, PreviewReport, preview};
pub use run::{InputReport, Options, Progress, Replay, Report, SettingsOverrides, replay};

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Policy, settings or endpoint files did not load.
    #[error("{errors}")]
    Config {
        /// Every problem, each located in its file.
        errors: fqdnd_config::Errors,
    },
    /// A capture could not be opened or is not a capture.
    #[error("{}", path.display())]
    Capture {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: CaptureError,
    },
    /// A file could not be written.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The engine refused the policy or endpoints.
    #[error("the engine refused the policy or endpoints")]
    Engine {
        /// Why.
        #[source]
        source: fqdnd_engine::Error,
    },
    /// Live replay could not reach the server.
    #[error("{what} {server}")]
    Live {
        /// What was being done.
        what: &'static str,
        /// The server.
        server: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}
