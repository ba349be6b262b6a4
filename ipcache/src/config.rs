//! The IPCache's own settings, passed in at construction.

/// Settings of identity allocation and its circuit breaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Circuit breaker: identities that DNS answers may create (live at once). Past it a DNS
    /// upsert that needs a new identity is rejected (fail closed). Default 2048.
    pub max_fqdn_identities: usize,
    /// Allocate `{fqdn:<sel>, world-ipvX}` as soon as an FQDN selector is added
    /// (`tofqdns-preallocate-identities`, default true).
    pub preallocate_fqdn_identities: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_fqdn_identities: 2048,
            preallocate_fqdn_identities: true,
        }
    }
}
