//! The command-line tools other than the daemons: clients of the admin API (`status`, the
//! listings, `policy reload`, `endpoint`, `service`, `monitor`), readers of the pinned maps
//! (`bpf … list`) and of state directories (`checkpoint`), and the offline tools (`policy
//! check|match`, `simulate`, `replay`), and the cluster's (`operator`, `policy
//! apply|delete|list` against etcd).

pub(crate) mod checkpoint;
pub(crate) mod cluster;
pub(crate) mod generate;
pub(crate) mod list;
pub(crate) mod node;
pub(crate) mod policy;
pub(crate) mod record;
pub(crate) mod replay;
pub(crate) mod service;
pub(crate) mod simulate;

use std::path::PathBuf;

/// Where a command finds the daemon (the `--admin-socket`, `--config` options).
#[derive(clap::Args, Clone, Debug, Default)]
pub(crate) struct Target {
    /// The admin API socket [default: the `adminSocket` of the `--config` files, else the
    /// default socket of the gateway or node agent that is running].
    #[arg(long, value_name = "PATH", env = "FQDND_ADMIN_SOCKET")]
    pub(crate) admin_socket: Option<PathBuf>,
    /// The daemon's configuration files: the command uses the admin socket they name.
    #[arg(long = "config", short = 'c', value_name = "PATH")]
    pub(crate) config: Vec<PathBuf>,
}

impl Target {
    /// The socket to talk to (see [`fqdnd_daemon::admin::client::socket`]).
    pub(crate) fn socket(&self) -> fqdnd_daemon::Result<PathBuf> {
        fqdnd_daemon::admin::client::socket(self.admin_socket.as_deref(), &self.config)
    }
}
