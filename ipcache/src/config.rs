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
    /// Per-IP identities, as Cilium ≤ 1.15 gave them: a prefix that carries `fqdn:` labels
    /// also carries its own `cidr:<prefix>` label, so every selected IP gets an identity of
    /// its own while selectors still select by their `fqdn:` label (and CIDR selectors that
    /// contain the IP select it too, as they did then). For measuring and comparing (`fqdnd
    /// replay --identity-mode per-ip`), not for production: each such host label is interned
    /// and never freed, and every new IP creates an identity (the FQDN identity breaker trips
    /// accordingly). Default false.
    pub identity_per_prefix: bool,
    /// Room in the datapath's ipcache, per address family (the kernel map's size; `None`: no
    /// limit, as in memory). A DNS-driven change that needs a new prefix past it is rejected
    /// before anything changes ([`crate::Error::DatapathFull`]): the answer fails closed and
    /// the IpCache never believes in an entry the kernel refused. Default `None`.
    pub datapath_prefixes: Option<usize>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_fqdn_identities: 2048,
            preallocate_fqdn_identities: true,
            identity_per_prefix: false,
            datapath_prefixes: None,
        }
    }
}
