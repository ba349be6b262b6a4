//! `fqdnd-cni`: a chained CNI plugin (spec 0.3.0–1.1.0) that makes each attachment of a
//! container an endpoint of the running node agent. The `fqdnd` binary runs as the plugin when
//! it is called through a link named `fqdnd-cni` (in the runtime's CNI plugin directory).
//!
//! It runs after the plugin that creates the interface — the routed `ptp` plugin's veth or a
//! `bridge` plugin's port (see [`host_interface`]): on ADD it reads the host-side interface
//! and the container's addresses from the previous result, labels from its configuration
//! (`labels`, and the conventions' `args.cni.labels`) and the runtime's `CNI_ARGS`
//! (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`), and registers the endpoint of the attachment
//! (`CNI_CONTAINERID`, `CNI_IFNAME`) with the agent through its admin socket (`adminSocket`,
//! default the node's). If the agent is down, ADD fails: a container never runs without
//! enforcement. DEL removes that attachment's endpoint and succeeds whatever happens (it must
//! be idempotent). CHECK asks the agent for the endpoint (unknown: code 3; agent down: 11);
//! STATUS whether the agent answers; VERSION the versions it speaks. Errors are CNI error
//! objects on stdout with the spec's codes.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::admin::client;
use crate::links::{LinkInfo, link_info};
use crate::node::{CniAttachment, EndpointRow};

/// The CNI versions this plugin speaks (0.3.0 and 0.3.1 results have one format; CHECK came
/// with 0.4.0, STATUS with 1.1.0).
const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// CNI error codes (spec, "Error").
mod code {
    pub(super) const INCOMPATIBLE_VERSION: u32 = 1;
    pub(super) const UNKNOWN_CONTAINER: u32 = 3;
    pub(super) const INVALID_ENVIRONMENT: u32 = 4;
    pub(super) const IO: u32 = 5;
    pub(super) const DECODE: u32 = 6;
    pub(super) const INVALID_CONFIG: u32 = 7;
    pub(super) const TRY_AGAIN_LATER: u32 = 11;
    pub(super) const NOT_AVAILABLE: u32 = 50;
    /// Plugin-specific: the agent refused the endpoint.
    pub(super) const REFUSED: u32 = 100;
}

/// A CNI error, printed as the spec's error object.
#[derive(Debug)]
struct CniError {
    code: u32,
    msg: String,
    details: String,
}

fn error(code: u32, msg: impl Into<String>, details: impl Into<String>) -> CniError {
    CniError {
        code,
        msg: msg.into(),
        details: details.into(),
    }
}

/// The plugin's network configuration (the runtime adds `name`, `cniVersion`, `prevResult`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetConf {
    cni_version: String,
    #[serde(default)]
    prev_result: Option<Value>,
    /// The agent's admin socket.
    #[serde(default)]
    admin_socket: Option<PathBuf>,
    /// Labels every container of this network gets.
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// The conventions' `args.cni.labels`.
    #[serde(default)]
    args: Option<Args>,
}

#[derive(Debug, Deserialize)]
struct Args {
    #[serde(default)]
    cni: Option<CniArgs>,
}

#[derive(Debug, Deserialize)]
struct CniArgs {
    #[serde(default)]
    labels: Vec<KeyValue>,
}

#[derive(Debug, Deserialize)]
struct KeyValue {
    key: String,
    value: String,
}

/// The parts of a previous result the plugin reads.
#[derive(Debug, Deserialize)]
struct PrevResult {
    #[serde(default)]
    interfaces: Vec<Interface>,
    #[serde(default)]
    ips: Vec<Ip>,
}

#[derive(Debug, Deserialize)]
struct Interface {
    name: String,
    #[serde(default)]
    sandbox: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Ip {
    address: String,
    #[serde(default)]
    interface: Option<usize>,
}

/// Runs the plugin: reads the environment and stdin, prints the result or the error.
pub fn main() -> ExitCode {
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let mut bytes = Vec::new();
    let read = std::io::stdin().read_to_end(&mut bytes);
    let stdin = String::from_utf8(bytes);
    let version = stdin
        .as_ref()
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| "1.0.0".to_owned());
    let outcome = match (read, &stdin) {
        (Err(e), _) => Err(error(
            code::IO,
            "reading the configuration from stdin",
            e.to_string(),
        )),
        (Ok(_), Ok(text)) => run(&command, text),
        // VERSION needs no configuration.
        (Ok(_), Err(_)) if command == "VERSION" => run(&command, ""),
        (Ok(_), Err(e)) => Err(error(
            code::DECODE,
            "the network configuration is not UTF-8 text (it must be JSON)",
            e.to_string(),
        )),
    };
    match outcome {
        Ok(Some(out)) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            let object = json!({
                "cniVersion": version,
                "code": e.code,
                "msg": e.msg,
                "details": e.details,
            });
            println!("{object}");
            ExitCode::FAILURE
        }
    }
}

fn env(name: &str) -> Result<String, CniError> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| error(code::INVALID_ENVIRONMENT, format!("{name} is not set"), ""))
}

fn run(command: &str, stdin: &str) -> Result<Option<String>, CniError> {
    if command == "VERSION" {
        return Ok(Some(
            json!({"cniVersion": "1.1.0", "supportedVersions": SUPPORTED}).to_string(),
        ));
    }
    let conf: NetConf = serde_json::from_str(stdin).map_err(|e| {
        error(
            code::DECODE,
            "the network configuration is not valid JSON for fqdnd-cni",
            e.to_string(),
        )
    })?;
    if !SUPPORTED.contains(&conf.cni_version.as_str()) {
        return Err(error(
            code::INCOMPATIBLE_VERSION,
            format!("CNI version {} is not supported", conf.cni_version),
            format!("supported: {}", SUPPORTED.join(", ")),
        ));
    }
    let socket = conf
        .admin_socket
        .clone()
        .unwrap_or_else(|| PathBuf::from(fqdnd_config::DEFAULT_NODE_ADMIN_SOCKET));
    match command {
        "ADD" => add(&conf, &socket),
        "DEL" => {
            del(&socket);
            Ok(None)
        }
        "CHECK" => check(&conf, &socket),
        "STATUS" => client::get::<Value>(&socket, "/v1/status")
            .map(|_| None)
            .map_err(|e| {
                error(
                    code::NOT_AVAILABLE,
                    "the fqdnd node agent does not answer",
                    crate::chain(&e),
                )
            }),
        other => Err(error(
            code::INVALID_ENVIRONMENT,
            format!("unknown CNI_COMMAND {other:?}"),
            "expected ADD, DEL, CHECK, STATUS or VERSION",
        )),
    }
}

/// The previous result, required by ADD and CHECK.
fn prev_result(conf: &NetConf) -> Result<(&Value, PrevResult), CniError> {
    let raw = conf.prev_result.as_ref().ok_or_else(|| {
        error(
            code::INVALID_CONFIG,
            "no prevResult: fqdnd-cni is a chained plugin and runs after the one that creates the interface (bridge, ptp)",
            "",
        )
    })?;
    let parsed: PrevResult = serde_json::from_value(raw.clone()).map_err(|e| {
        error(
            code::DECODE,
            "prevResult is not a CNI result",
            e.to_string(),
        )
    })?;
    Ok((raw, parsed))
}

/// The host-side interface of the previous result: the one outside the container that is not
/// a bridge (`kind` tells a link's kind) — the `ptp` plugin's veth or a `bridge` plugin's
/// port (the agent then also redirects DNS at the bridge: see `kernel.rs`).
fn host_interface(prev: &PrevResult, info: impl Fn(&str) -> LinkInfo) -> Result<String, CniError> {
    let candidates: Vec<(&str, LinkInfo)> = prev
        .interfaces
        .iter()
        .filter(|i| i.sandbox.as_deref().is_none_or(str::is_empty))
        .map(|i| (i.name.as_str(), info(&i.name)))
        .filter(|(_, l)| l.kind.as_deref() != Some("bridge"))
        .collect();
    match candidates.as_slice() {
        [(one, _)] => Ok((*one).to_owned()),
        [] => Err(error(
            code::INVALID_CONFIG,
            "the previous result has no host-side interface (one outside the container that is not a bridge)",
            "",
        )),
        many => Err(error(
            code::INVALID_CONFIG,
            "the previous result has several host-side interfaces",
            many.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
        )),
    }
}

/// The container's addresses: those of interfaces in the sandbox (or with no interface named).
fn addresses(prev: &PrevResult) -> Result<Vec<IpAddr>, CniError> {
    let mut out = Vec::new();
    for ip in &prev.ips {
        let in_container = ip.interface.is_none_or(|i| {
            prev.interfaces
                .get(i)
                .is_some_and(|iface| iface.sandbox.as_deref().is_some_and(|s| !s.is_empty()))
        });
        if !in_container {
            continue;
        }
        let addr = ip.address.split('/').next().unwrap_or_default();
        let addr: IpAddr = addr.parse().map_err(|_| {
            error(
                code::DECODE,
                format!("prevResult address {:?} is not an address", ip.address),
                "",
            )
        })?;
        out.push(addr);
    }
    if out.is_empty() {
        return Err(error(
            code::INVALID_CONFIG,
            "the previous result gives the container no address",
            "",
        ));
    }
    Ok(out)
}

/// The endpoint's labels: the configuration's, the conventions' `args.cni.labels`, and the
/// runtime's `CNI_ARGS`.
fn labels(conf: &NetConf, cni_args: &str) -> BTreeMap<String, String> {
    let mut out = conf.labels.clone();
    for kv in conf
        .args
        .iter()
        .filter_map(|a| a.cni.as_ref())
        .flat_map(|c| &c.labels)
    {
        out.insert(kv.key.clone(), kv.value.clone());
    }
    for pair in cni_args.split(';') {
        match pair.split_once('=') {
            Some(("K8S_POD_NAMESPACE", ns)) if !ns.is_empty() => {
                out.insert("k8s:io.kubernetes.pod.namespace".to_owned(), ns.to_owned());
            }
            Some(("K8S_POD_NAME", name)) if !name.is_empty() => {
                out.insert("cni:name".to_owned(), name.to_owned());
            }
            _ => {}
        }
    }
    out
}

/// `CNI_CONTAINERID` and `CNI_IFNAME`: the attachment (each is an endpoint of its own).
fn attachment_env() -> Result<(String, String), CniError> {
    let (container_id, ifname) = (env("CNI_CONTAINERID")?, env("CNI_IFNAME")?);
    fqdnd_engine::endpoints::containers::attachment_name(&container_id, &ifname)
        .map_err(|e| error(code::INVALID_ENVIRONMENT, fqdnd_engine::error_chain(&e), ""))?;
    Ok((container_id, ifname))
}

fn add(conf: &NetConf, socket: &Path) -> Result<Option<String>, CniError> {
    let (raw, prev) = prev_result(conf)?;
    let (container_id, ifname) = attachment_env()?;
    let attachment = CniAttachment {
        container_id,
        ifname,
        interface: host_interface(&prev, link_info)?,
        addresses: addresses(&prev)?,
        labels: labels(conf, &std::env::var("CNI_ARGS").unwrap_or_default()),
    };
    client::post_json::<EndpointRow>(socket, "/v1/cni", &attachment).map_err(|e| {
        let text = crate::chain(&e);
        if e.answered().is_some() {
            error(
                code::REFUSED,
                "the fqdnd node agent refused the endpoint",
                text,
            )
        } else {
            error(
                code::TRY_AGAIN_LATER,
                "the fqdnd node agent does not answer",
                text,
            )
        }
    })?;
    let mut result = raw.clone();
    if let Some(object) = result.as_object_mut() {
        object.insert(
            "cniVersion".to_owned(),
            Value::String(conf.cni_version.clone()),
        );
    }
    Ok(Some(result.to_string()))
}

/// DEL never fails: what can be removed is, the rest is logged (stderr). It removes the
/// endpoint of the attachment `CNI_IFNAME` names, or without it every one of the container.
fn del(socket: &Path) {
    use fqdnd_engine::endpoints::containers::{attachment_name, container_prefix};
    let container_id = std::env::var("CNI_CONTAINERID").unwrap_or_default();
    let ifname = std::env::var("CNI_IFNAME").unwrap_or_default();
    // Checked: both go into the request's path.
    let path = if ifname.is_empty() {
        container_prefix(&container_id).map(|_| format!("/v1/cni/{container_id}"))
    } else {
        attachment_name(&container_id, &ifname).map(|_| format!("/v1/cni/{container_id}/{ifname}"))
    };
    let path = match path {
        Ok(path) => path,
        Err(e) => {
            eprintln!(
                "fqdnd-cni: DEL: {}: nothing to remove",
                fqdnd_engine::error_chain(&e)
            );
            return;
        }
    };
    if let Err(e) = client::delete(socket, &path) {
        eprintln!("fqdnd-cni: DEL {path}: {}", crate::chain(&e));
    }
}

fn check(conf: &NetConf, socket: &Path) -> Result<Option<String>, CniError> {
    let (_, prev) = prev_result(conf)?;
    let (container_id, ifname) = attachment_env()?;
    let interface = host_interface(&prev, link_info)?;
    let (_, row): (_, EndpointRow) =
        client::get(socket, &format!("/v1/cni/{container_id}/{ifname}")).map_err(|e| {
            let details = crate::chain(&e);
            match e.answered() {
                // It will not clear by itself: the runtime should ADD again.
                Some((status, _)) if status == hyper::StatusCode::NOT_FOUND => error(
                    code::UNKNOWN_CONTAINER,
                    format!("the fqdnd node agent has no endpoint for the container on {ifname}"),
                    details,
                ),
                Some(_) => error(
                    code::REFUSED,
                    "the fqdnd node agent refused the request",
                    details,
                ),
                None => error(
                    code::TRY_AGAIN_LATER,
                    "the fqdnd node agent does not answer",
                    details,
                ),
            }
        })?;
    if row.interface != interface || row.ifindex.is_none() {
        return Err(error(
            code::REFUSED,
            format!(
                "the attachment's endpoint is on {} (attached: {}), not {interface}",
                row.interface,
                row.ifindex.is_some()
            ),
            "",
        ));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prev(json: &str) -> PrevResult {
        serde_json::from_str(json).unwrap()
    }

    const BRIDGE: &str = r#"{
        "interfaces": [
            {"name": "cni-test0", "mac": "aa:bb:cc:dd:ee:ff"},
            {"name": "veth12345", "mac": "aa:bb:cc:dd:ee:01"},
            {"name": "eth0", "mac": "aa:bb:cc:dd:ee:02", "sandbox": "/run/netns/c1"}
        ],
        "ips": [{"address": "198.51.100.7/24", "gateway": "198.51.100.1", "interface": 2},
                {"address": "2001:db8::7/64", "interface": 2}]
    }"#;

    #[test]
    fn the_host_veth_and_container_addresses_come_from_a_bridge_result() {
        let link = |kind: &str, port_of: Option<&str>| LinkInfo {
            kind: Some(kind.to_owned()),
            port_of: port_of.map(str::to_owned),
            master: port_of.map(|_| "cni-test0".to_owned()),
        };
        let routed = |name: &str| {
            link(
                if name == "cni-test0" {
                    "bridge"
                } else {
                    "veth"
                },
                None,
            )
        };
        let p = prev(BRIDGE);
        assert_eq!(host_interface(&p, routed).unwrap(), "veth12345");
        // A bridge's port: the port (the agent redirects DNS at its bridge too).
        let bridged = |name: &str| {
            if name == "cni-test0" {
                link("bridge", None)
            } else {
                link("veth", Some("bridge"))
            }
        };
        assert_eq!(host_interface(&p, bridged).unwrap(), "veth12345");
        assert_eq!(
            addresses(&p).unwrap(),
            [
                "198.51.100.7".parse::<IpAddr>().unwrap(),
                "2001:db8::7".parse().unwrap()
            ]
        );
        // Without knowing the bridge for one, two interfaces are outside: ambiguous.
        assert_eq!(
            host_interface(&p, |_| LinkInfo::default())
                .unwrap_err()
                .code,
            code::INVALID_CONFIG
        );
    }

    #[test]
    fn labels_come_from_the_configuration_the_conventions_and_cni_args() {
        let conf: NetConf = serde_json::from_str(
            r#"{"cniVersion": "1.0.0", "labels": {"app": "web"},
                "args": {"cni": {"labels": [{"key": "tier", "value": "front"}]}}}"#,
        )
        .unwrap();
        let l = labels(
            &conf,
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1",
        );
        assert_eq!(l["app"], "web");
        assert_eq!(l["tier"], "front");
        assert_eq!(l["k8s:io.kubernetes.pod.namespace"], "shop");
        assert_eq!(l["cni:name"], "web-1");
    }

    #[test]
    fn add_needs_a_previous_result_and_a_known_version() {
        let no_prev = run(
            "ADD",
            r#"{"cniVersion": "1.0.0", "name": "n", "type": "fqdnd-cni"}"#,
        );
        assert!(matches!(
            no_prev,
            Err(CniError {
                code: code::INVALID_CONFIG,
                ..
            })
        ));
        let old = run(
            "ADD",
            r#"{"cniVersion": "0.1.0", "name": "n", "type": "fqdnd-cni"}"#,
        );
        assert!(matches!(
            old,
            Err(CniError {
                code: code::INCOMPATIBLE_VERSION,
                ..
            })
        ));
        assert!(matches!(
            run("ADD", "not json"),
            Err(CniError {
                code: code::DECODE,
                ..
            })
        ));
        assert!(matches!(
            run("FROB", r#"{"cniVersion": "1.0.0"}"#),
            Err(CniError {
                code: code::INVALID_ENVIRONMENT,
                ..
            })
        ));
        let version: Value = serde_json::from_str(&run("VERSION", "").unwrap().unwrap()).unwrap();
        assert!(
            version["supportedVersions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v == "1.0.0")
        );
    }
}
