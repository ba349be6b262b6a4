//! Errors of the NameManager.

use crate::name::NameError;
use crate::pattern::PatternError;

/// Which NameManager circuit breaker tripped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Breaker {
    /// An endpoint has too many names live in the cache.
    NamesPerEndpoint,
    /// A name holds too many IPs, live and zombie together.
    IpsPerName,
    /// The whole cache holds too many (name, IP) mappings.
    CacheEntries,
}

/// What can go wrong in the NameManager.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The answer's name is not one fqdnd stores.
    #[error("not storing {name:?}: {error}")]
    InvalidName {
        /// The name as received.
        name: String,
        /// Why it is invalid (in the message, so not a `source`).
        error: NameError,
    },
    /// An FQDN selector is invalid.
    #[error("invalid FQDN selector: {0}")]
    InvalidSelector(PatternError),
    /// A circuit breaker rejected the whole answer; existing state is untouched.
    #[error("circuit breaker {breaker:?} tripped at {limit} for {name}: answer not learned")]
    BreakerTripped {
        /// The breaker.
        breaker: Breaker,
        /// Its configured limit.
        limit: usize,
        /// The name of the rejected answer.
        name: String,
    },
    /// The IpCache failed for a reason other than a breaker.
    #[error(transparent)]
    IpCache(#[from] fqdnd_ipcache::Error),
}

impl From<PatternError> for Error {
    fn from(e: PatternError) -> Self {
        Self::InvalidSelector(e)
    }
}
