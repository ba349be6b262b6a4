//! What `ip -details link` says of a network interface in this process's network namespace
//! (sysfs may show another namespace's links): its kind and, for a port, its master. The CNI
//! plugin picks the host-side interface with it; the node agent finds the bridge of an
//! endpoint whose interface is a bridge's port.

use serde_json::Value;

/// One link's kind and master.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LinkInfo {
    /// `veth`, `bridge`, …
    pub kind: Option<String>,
    /// `bridge` when the link is a bridge's port.
    pub port_of: Option<String>,
    /// The master's name (the bridge of a bridge's port).
    pub master: Option<String>,
}

impl LinkInfo {
    /// The bridge this link is a port of.
    pub(crate) fn bridge(&self) -> Option<&str> {
        match self.port_of.as_deref() {
            Some("bridge") => self.master.as_deref(),
            _ => None,
        }
    }
}

/// What `ip -j -d link show dev NAME` says of `name`; empty when it cannot say (no such link,
/// no `ip`).
pub(crate) fn link_info(name: &str) -> LinkInfo {
    let Some(out) = std::process::Command::new("ip")
        .args(["-j", "-d", "link", "show", "dev", name])
        .output()
        .ok()
        .filter(|o| o.status.success())
    else {
        return LinkInfo::default();
    };
    parse(&out.stdout)
}

fn parse(json: &[u8]) -> LinkInfo {
    let links: Value = serde_json::from_slice(json).unwrap_or_default();
    let link = links.get(0);
    let info = link.and_then(|l| l.get("linkinfo"));
    let text = |v: Option<&Value>, key: &str| {
        v.and_then(|i| i.get(key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    LinkInfo {
        kind: text(info, "info_kind"),
        port_of: text(info, "info_slave_kind"),
        master: text(link, "master"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bridge_port_names_its_bridge() {
        // What iproute2 6.1 prints for a veth enslaved to a bridge (trimmed).
        let port = parse(
            br#"[{"ifindex":5,"ifname":"veth1","flags":["UP"],"master":"cni0",
                 "linkinfo":{"info_kind":"veth","info_slave_kind":"bridge",
                 "info_slave_data":{"state":"forwarding"}}}]"#,
        );
        assert_eq!(port.kind.as_deref(), Some("veth"));
        assert_eq!(port.bridge(), Some("cni0"));
        let routed = parse(br#"[{"ifindex":6,"ifname":"veth2","linkinfo":{"info_kind":"veth"}}]"#);
        assert_eq!(routed.bridge(), None);
        // A bond's port is no bridge's.
        let bonded =
            parse(br#"[{"ifname":"eth1","master":"bond0","linkinfo":{"info_slave_kind":"bond"}}]"#);
        assert_eq!(bonded.bridge(), None);
        assert_eq!(parse(b"not json"), LinkInfo::default());
    }
}
