//! The daemon's error: what step failed, and why, each segment printed once.
//!
//! The daemon wires many crates together, so its errors are mostly "this step failed because
//! of that crate's error". [`Error::Step`] carries the step in its message and the cause only
//! as its `source()`; [`Error::Refused`] is fqdnd's own refusal, with no cause; the crates'
//! errors pass through as [`Error::Other`], whose message and source are the crate error's own
//! (transparent). Render a whole chain with [`chain`] (or `{:#}` once it is an
//! `crate::Error` in the binary): every segment appears once.

use std::fmt::{self, Display};

/// The daemon's `Result`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A boxed cause: any error of the crates the daemon wires.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong in the daemon.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `what` failed; `source` says why.
    #[error("{what}")]
    Step {
        /// The step, e.g. "opening the state directory /var/lib/fqdnd".
        what: String,
        /// Why it failed.
        #[source]
        source: Cause,
    },
    /// fqdnd refused or could not do something, and says why in the message.
    #[error("{0}")]
    Refused(String),
    /// The admin API answered a request with an error: the daemon was reached and refused it.
    #[error("admin API answered {status}: {body}")]
    Answered {
        /// The HTTP status.
        status: hyper::StatusCode,
        /// What the daemon said.
        body: String,
    },
    /// An error of a crate the daemon wires, as that crate renders it.
    #[error(transparent)]
    Other(Cause),
}

impl Error {
    /// An error of a crate the daemon wires.
    pub fn other(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Other(Box::new(e))
    }

    /// The admin API's answer, when this error (or one of its causes) is one.
    pub fn answered(&self) -> Option<(hyper::StatusCode, &str)> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = next {
            if let Some(Self::Answered { status, body }) = e.downcast_ref::<Self>() {
                return Some((*status, body));
            }
            next = e.source();
        }
        None
    }
}

/// Adds the step that failed to an error, as `anyhow::Context` does.
pub trait Context<T> {
    /// The step that failed.
    ///
    /// # Errors
    /// The error, with `what` as its message and the error as its cause.
    fn context<C: Display>(self, what: C) -> Result<T>;

    /// The step that failed, computed only on error.
    ///
    /// # Errors
    /// The error, with `what()` as its message and the error as its cause.
    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context<C: Display>(self, what: C) -> Result<T> {
        self.map_err(|e| Error::Step {
            what: what.to_string(),
            source: Box::new(e.into()),
        })
    }

    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T> {
        self.map_err(|e| Error::Step {
            what: what().to_string(),
            source: Box::new(e.into()),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context<C: Display>(self, what: C) -> Result<T> {
        self.ok_or_else(|| Error::Refused(what.to_string()))
    }

    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T> {
        self.ok_or_else(|| Error::Refused(what().to_string()))
    }
}

/// The crates' errors that `?` turns into [`Error::Other`].
macro_rules! other_errors {
    ($($t:ty),* $(,)?) => {
        $(impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Self::other(e)
            }
        })*
    };
}

other_errors!(
    std::io::Error,
    fmt::Error,
    std::net::AddrParseError,
    std::num::ParseIntError,
    std::string::FromUtf8Error,
    std::str::Utf8Error,
    std::time::SystemTimeError,
    tokio::task::JoinError,
    serde_json::Error,
    hyper::Error,
    hyper::http::Error,
    nix::Error,
    fqdnd_config::Errors,
    fqdnd_config::Error,
    fqdnd_checkpoint::Error,
    fqdnd_cluster::Error,
    fqdnd_dnsproxy::Error,
    fqdnd_ebpf::Error,
    fqdnd_engine::Error,
    fqdnd_ipcache::Error,
    fqdnd_ipcache::DatapathError,
    fqdnd_cluster::StoreError,
    hickory_proto::ProtoError,
    hickory_proto::serialize::binary::DecodeError,
    tokio::time::error::Elapsed,
    hickory_proto::serialize::txt::ParseError,
    fqdnd_lb::Error,
    fqdnd_privileges::Error,
);

impl From<Cause> for Error {
    fn from(e: Cause) -> Self {
        Self::Other(e)
    }
}

/// Returns early with an [`Error::Refused`] of a formatted message (as `anyhow::bail!`).
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::Error::Refused(format!($($arg)*)))
    };
}

/// An [`Error::Refused`] of a formatted message (as `anyhow::anyhow!`).
#[macro_export]
macro_rules! refused {
    ($($arg:tt)*) => {
        $crate::Error::Refused(format!($($arg)*))
    };
}

/// An error and its causes, joined by ": ", each segment once.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    Chain(e).to_string()
}

struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::NotFound)
    }

    #[test]
    fn a_step_prints_its_cause_once() {
        let e: Result<()> = Err(io()).context("opening /x");
        let e = e.context("starting").unwrap_err();
        assert_eq!(e.to_string(), "starting");
        assert_eq!(chain(&e), "starting: opening /x: entity not found");
    }

    #[test]
    fn a_refusal_has_no_cause() {
        let e: Result<u8> = None.context("no such endpoint");
        let e = e.unwrap_err();
        assert!(std::error::Error::source(&e).is_none());
        assert_eq!(chain(&e), "no such endpoint");
    }

    #[test]
    fn the_admin_answer_is_found_under_steps() {
        let answered = Error::Answered {
            status: hyper::StatusCode::CONFLICT,
            body: "taken".into(),
        };
        let e = Err::<(), _>(answered).context("adding").unwrap_err();
        assert_eq!(e.answered(), Some((hyper::StatusCode::CONFLICT, "taken")));
        assert_eq!(Error::Refused("x".into()).answered(), None);
    }
}
