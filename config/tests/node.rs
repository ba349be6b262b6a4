//! `kind: Node` and Endpoint interfaces.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use fqdnd_config::{DEFAULT_DNS_PROXY_PORT, load_str};
use fqdnd_ipcache::EndpointId;

fn file() -> &'static Path {
    Path::new("/etc/fqdnd/node.yaml")
}

fn endpoint(id: u16, name: &str, addr: &str, interface: &str) -> String {
    format!(
        "apiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata: {{name: {name}}}\nspec:\n  id: {id}\n  addresses: [{addr}]\n  interface: {interface}\n"
    )
}

#[test]
fn node_fields_are_read_with_defaults_for_the_rest() {
    let text = "apiVersion: fqdnd.io/v1\nkind: Node\nspec:\n  dnsProxyPort: 5300\n  pinDir: pins\n  conntrackIdleTimeout: 90s\n  adminSocket: admin.sock\n  onHoldTimeout: servfail\n  randomizeCase: true\n";
    let node = load_str(text, file()).unwrap().node.unwrap();
    assert!(node.daemon.randomize_case);
    assert_eq!(node.dns_proxy_port, 5300);
    assert_eq!(node.pin_dir, Some(PathBuf::from("/etc/fqdnd/pins")));
    assert_eq!(node.conntrack_idle_timeout, Some(Duration::from_secs(90)));
    // the deprecated single timeout is every conntrack lifetime
    assert_eq!(
        node.daemon.conntrack.tcp_established,
        Duration::from_secs(90)
    );
    assert_eq!(node.daemon.conntrack.tcp_closing, Duration::from_secs(90));
    assert_eq!(
        node.daemon.admin_socket,
        PathBuf::from("/etc/fqdnd/admin.sock")
    );
    assert_eq!(
        node.daemon.on_hold_timeout,
        fqdnd_config::HoldFallback::ServFail
    );

    let bare = load_str("apiVersion: fqdnd.io/v1\nkind: Node\n", file()).unwrap();
    let bare = bare.node.unwrap();
    assert_eq!(bare.dns_proxy_port, DEFAULT_DNS_PROXY_PORT);
    assert!(!bare.daemon.randomize_case, "0x20 is off by default");
}

#[test]
fn run_time_endpoints_are_kept_in_the_state_dir_or_beside_the_pins_path() {
    let node = |extra: &str| {
        load_str(
            &format!("apiVersion: fqdnd.io/v1\nkind: Node\nspec:\n{extra}"),
            file(),
        )
        .unwrap()
        .node
        .unwrap()
    };
    let pins = Path::new("/sys/fs/bpf/fqdnd/v3");
    assert_eq!(
        node("  stateDir: /var/lib/x\n").endpoints_file(pins),
        PathBuf::from("/var/lib/x/endpoints.yaml")
    );
    // No stateDir: still kept, one file per pin directory.
    assert_eq!(
        node("  dnsProxyPort: 5300\n").endpoints_file(pins),
        PathBuf::from("/var/lib/fqdnd/pins/sys/fs/bpf/fqdnd/v3/endpoints.yaml")
    );
    assert_ne!(
        fqdnd_config::default_endpoints_file(Path::new("/sys/fs/bpf/a")),
        fqdnd_config::default_endpoints_file(Path::new("/sys/fs/bpf/b"))
    );
    assert_eq!(
        fqdnd_config::default_endpoints_file(Path::new("/sys/fs/bpf/x/../../../../a")),
        PathBuf::from("/var/lib/fqdnd/pins/a/endpoints.yaml"),
        "never outside the root"
    );
}

#[test]
fn gateway_fields_in_a_node_and_node_fields_in_a_gateway_are_errors() {
    let err = load_str(
        "apiVersion: fqdnd.io/v1\nkind: Node\nspec:\n  upstreams: [\"192.0.2.1:53\"]\n",
        file(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("original destination"), "{err}");
    let err = load_str(
        "apiVersion: fqdnd.io/v1\nkind: Gateway\nspec:\n  listen: [\"127.0.0.1:53\"]\n  upstreams: [\"192.0.2.1:53\"]\n  dnsProxyPort: 53\n",
        file(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("kind: Node"), "{err}");
    let err = load_str(
        "apiVersion: fqdnd.io/v1\nkind: Node\nspec:\n  dnsProxyPort: 0\n",
        file(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("node.yaml:4:17"), "{err}");
}

#[test]
fn endpoint_interfaces_are_collected_and_must_be_unique() {
    let text = format!(
        "{}---\n{}",
        endpoint(1, "a", "10.0.0.2", "veth-a"),
        endpoint(2, "b", "10.0.0.3", "veth-b")
    );
    let config = load_str(&text, file()).unwrap();
    assert_eq!(config.interfaces.get(&EndpointId(1)).unwrap(), "veth-a");
    assert_eq!(config.interfaces.get(&EndpointId(2)).unwrap(), "veth-b");

    let text = format!(
        "{}---\n{}",
        endpoint(1, "a", "10.0.0.2", "veth-a"),
        endpoint(2, "b", "10.0.0.3", "veth-a")
    );
    let err = load_str(&text, file()).unwrap_err().to_string();
    assert!(err.contains("interface veth-a"), "{err}");

    let err = load_str(&endpoint(1, "a", "10.0.0.2", "bad/name"), file())
        .unwrap_err()
        .to_string();
    assert!(err.contains("not an interface name"), "{err}");

    let group = "apiVersion: fqdnd.io/v1\nkind: ClientGroup\nmetadata: {name: lan}\nspec:\n  id: 3\n  addresses: [10.1.0.0/16]\n  interface: lan0\n";
    let err = load_str(group, file()).unwrap_err().to_string();
    assert!(err.contains("enforceInterfaces"), "{err}");
}

fn host_endpoint(id: u16, name: &str, spec: &str) -> String {
    format!(
        "apiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata: {{name: {name}}}\nspec:\n  id: {id}\n  labels: {{app: {name}}}\n{spec}"
    )
}

#[test]
fn endpoints_of_host_processes_name_a_cgroup_or_a_unit() {
    use fqdnd_config::Cgroup;
    let text = format!(
        "{}---\n{}---\n{}---\n{}",
        host_endpoint(1, "runner", "  cgroup: ci/runner/\n"),
        host_endpoint(2, "web", "  unit: web-frontend@1.service\n"),
        host_endpoint(3, "jobs", "  cgroup: /jobs\n  addresses: []\n"),
        endpoint(4, "pod", "10.0.0.2", "veth-a"),
    );
    let config = load_str(&text, file()).unwrap();
    assert_eq!(
        config.cgroups.get(&EndpointId(1)),
        Some(&Cgroup::Path("/ci/runner".into())),
        "written relative, with a trailing slash: canonical"
    );
    assert_eq!(
        config.cgroups.get(&EndpointId(2)),
        Some(&Cgroup::Unit("web-frontend@1.service".into()))
    );
    assert_eq!(
        config.cgroups.get(&EndpointId(3)),
        Some(&Cgroup::Path("/jobs".into()))
    );
    assert!(!config.cgroups.contains_key(&EndpointId(4)));
    assert!(!config.interfaces.contains_key(&EndpointId(1)));
    // No addresses of their own: host processes share the host's.
    assert!(config.endpoints[0].addresses.is_empty());
    assert_eq!(config.endpoints.len(), 4);
    assert_eq!(
        Cgroup::Unit("x.service".into()).to_string(),
        "unit x.service"
    );
}

#[test]
fn a_host_endpoint_has_one_cgroup_no_interface_and_no_address() {
    let cases = [
        (
            "  cgroup: /a\n  interface: veth-a\n",
            "`spec.cgroup` with `spec.interface`",
        ),
        (
            "  cgroup: /a\n  unit: a.service\n",
            "`spec.unit` with `spec.cgroup`",
        ),
        (
            "  cgroup: /a\n  addresses: [10.0.0.2]\n",
            "has no addresses of its own",
        ),
        ("  cgroup: /a/../b\n", "without `.` or `..`"),
        (
            "  cgroup: /\n",
            "`spec.cgroup` is `/`: the root cgroup holds every process",
        ),
        ("  cgroup: //\n", "the root cgroup"),
        ("  cgroup: \"\"\n", "is not a cgroup v2 path"),
        ("  unit: web\n", "ending in .service, .scope or .slice"),
        ("  unit: \"we b.service\"\n", "is not a systemd unit name"),
        ("  unit: .service\n", "is not a systemd unit name"),
    ];
    for (spec, expected) in cases {
        let err = load_str(&host_endpoint(1, "x", spec), file())
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{spec}: {err}");
    }
    // A ClientGroup is no host process.
    let err = load_str(
        "apiVersion: fqdnd.io/v1\nkind: ClientGroup\nmetadata: {name: g}\nspec: {id: 1, addresses: [10.0.0.0/8], cgroup: /a}\n",
        file(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("a ClientGroup has no `cgroup`"), "{err}");
    // One Endpoint per cgroup (and per unit).
    let text = format!(
        "{}---\n{}",
        host_endpoint(1, "a", "  cgroup: /ci\n"),
        host_endpoint(2, "b", "  cgroup: ci\n")
    );
    let err = load_str(&text, file()).unwrap_err().to_string();
    assert!(
        err.contains("cgroup /ci (one Endpoint per cgroup)"),
        "{err}"
    );
}

#[test]
fn host_processes_is_a_node_setting() {
    let node = load_str(
        "apiVersion: fqdnd.io/v1\nkind: Node\nspec:\n  hostProcesses: true\n",
        file(),
    )
    .unwrap()
    .node
    .unwrap();
    assert!(node.host_processes);
    let bare = load_str("apiVersion: fqdnd.io/v1\nkind: Node\n", file()).unwrap();
    assert!(!bare.node.unwrap().host_processes, "off by default");
    let err = load_str(
        "apiVersion: fqdnd.io/v1\nkind: Gateway\nspec:\n  listen: [\"127.0.0.1:53\"]\n  upstreams: [\"192.0.2.1:53\"]\n  hostProcesses: true\n",
        file(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("`hostProcesses` belong to a `kind: Node`"),
        "{err}"
    );
}
