//! The command-line tools other than the daemons: clients of the admin API (`status`, the
//! listings, `policy reload`, `endpoint`, `service`, `monitor`), readers of the pinned maps
//! (`bpf … list`) and of state directories (`checkpoint`), and the offline tools (`policy
//! check|match`, `simulate`, `replay`, the demo), and the cluster's (`operator`, `policy
//! apply|delete|list` against etcd).

pub(crate) mod checkpoint;
pub(crate) mod cluster;
pub(crate) mod demo;
pub(crate) mod list;
pub(crate) mod node;
pub(crate) mod policy;
pub(crate) mod record;
pub(crate) mod replay;
pub(crate) mod service;
pub(crate) mod simulate;
