//! The cgroup socket programs' maps: endpoints by cgroup (`fqdnd_cgroups`) and their settings
//! (`fqdnd_sock_cfg`).

use aya::maps::MapError;
use fqdnd_ipcache::{DatapathError, EndpointId};

use super::{EndpointFlags, KernelDatapath, ignore_absent, map_err};
use crate::error::Error;
use crate::sys::{self, EndpointValue, SockCfg};

impl KernelDatapath {
    /// Makes the sockets of cgroup `cgroup_id` (a cgroup v2 id: [`crate::cgroup::cgroup_id`]) and
    /// of every cgroup below it endpoint `id` with `flags` for the cgroup socket programs
    /// (`enforce_egress`: default deny for what they send; `enforce_ingress`: what they receive
    /// from anywhere but loopback goes through the endpoint's ingress entries; `redirect_dns`:
    /// their DNS goes to the proxy set by [`Self::set_dns_proxy`]). `check_source` means
    /// nothing there (host processes share the host's addresses). A socket belongs to the deepest such cgroup above it.
    pub fn set_cgroup_endpoint(
        &mut self,
        cgroup_id: u64,
        id: EndpointId,
        flags: EndpointFlags,
    ) -> Result<(), DatapathError> {
        let v = EndpointValue {
            endpoint: id.0,
            flags: flags.bits() & !sys::EP_CHECK_SOURCE,
            pad: 0,
        };
        self.cgroups
            .insert(cgroup_id, v, 0)
            .map_err(|e| map_err("fqdnd_cgroups", "cgroup endpoint upsert", e))
    }

    /// Forgets a cgroup endpoint entry (absent is fine): its sockets are left alone again.
    pub fn remove_cgroup_endpoint(&mut self, cgroup_id: u64) -> Result<(), DatapathError> {
        ignore_absent(self.cgroups.remove(&cgroup_id))
            .map_err(|e| map_err("fqdnd_cgroups", "cgroup endpoint delete", e))
    }

    /// Every `fqdnd_cgroups` entry: (cgroup id, endpoint, flags), sorted.
    pub fn cgroup_entries(&self) -> Result<Vec<(u64, EndpointId, EndpointFlags)>, Error> {
        let mut out = Vec::new();
        for r in self.cgroups.iter() {
            match r {
                Ok((k, v)) => {
                    out.push((k, EndpointId(v.endpoint), EndpointFlags::from_bits(v.flags)));
                }
                Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
        out.sort();
        Ok(out)
    }

    /// The socket programs' settings: the network namespace whose sockets the redirect
    /// applies to (the proxy's: [`crate::sys::netns_cookie`]; `0` = every namespace), and how
    /// many cgroup endpoints there are (while 0, every socket program returns at once, so the
    /// programs can stay attached for nothing but a lookup per call or packet).
    pub fn set_sock_settings(
        &mut self,
        netns_cookie: u64,
        endpoints: u32,
    ) -> Result<(), DatapathError> {
        let v = SockCfg {
            netns_cookie,
            endpoints,
            pad: 0,
        };
        self.sock_cfg
            .set(0, v, 0)
            .map_err(|e| map_err("fqdnd_sock_cfg", "socket settings update", e))
    }
}
