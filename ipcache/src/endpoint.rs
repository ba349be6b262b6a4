//! Endpoints: the local workloads (node mode) or client groups (gateway mode) whose egress
//! fqdnd enforces. Each has a numeric id, addresses, and labels that policy selects.

use ipnet::IpNet;

/// Numeric endpoint id, as the datapath's per-endpoint policy map knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointId(pub u16);

impl std::fmt::Display for EndpointId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A label on an endpoint: `source:key=value` (source `k8s` unless given).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointLabel {
    /// Label source, e.g. `k8s`.
    pub source: String,
    /// Label key, e.g. `app` or `io.kubernetes.pod.namespace`.
    pub key: String,
    /// Label value (may be empty).
    pub value: String,
}

/// An endpoint or client group as declared in the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Numeric id, unique among endpoints.
    pub id: EndpointId,
    /// Human name, for listings and logs.
    pub name: String,
    /// Addresses: host prefixes for endpoints, any prefix for client groups.
    pub addresses: Vec<IpNet>,
    /// Labels that `endpointSelector` and `toEndpoints` select on.
    pub labels: Vec<EndpointLabel>,
}
