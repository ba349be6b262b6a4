//! Containers' attachments (what a CNI plugin reports): each attachment of a container to a
//! network — which the CNI spec identifies by the container id and the interface name inside
//! the container (`CNI_IFNAME`) — is an endpoint of its own, named
//! `cni-<first 16 characters of the container id>-<interface>` (`cni-3db53262e852fe2c-eth0`),
//! with an id the registry picks from [`CNI_FIRST_ID`] up. A container on two networks is two
//! endpoints, each with its own network's labels, host-side interface and addresses; `podman
//! network connect` adds one and `disconnect` removes that one.
//!
//! An endpoint named `cni-<16 characters>` alone was a whole container's before attachments
//! had endpoints of their own (saved by an earlier version): it stands for every attachment
//! of its container until one of them is deleted.

use std::net::IpAddr;

use fqdnd_ipcache::EndpointId;

use super::{Added, Attachment, Registry, document};
use crate::Error;

/// Endpoints of containers get ids from here up (those below are left to the files and to
/// `fqdnd endpoint add`).
pub const CNI_FIRST_ID: u16 = 32_768;

/// One attachment of a container, as the CNI plugin reports it on ADD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerAttachment {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`: the interface inside the container.
    pub ifname: String,
    /// The host-side interface the previous plugin created.
    pub interface: String,
    /// The container's addresses on this interface.
    pub addresses: Vec<IpAddr>,
    /// Its labels (`key` or `source:key` → value).
    pub labels: Vec<(String, String)>,
}

/// What a CNI ADD changes.
#[derive(Debug, Clone, PartialEq)]
pub enum AddPlan {
    /// The attachment's endpoint is there as asked (a retried ADD): nothing.
    Unchanged(EndpointId),
    /// Add this endpoint (a new attachment, or the attachment's endpoint again under its id
    /// when its interface, addresses or labels changed).
    Add(Added),
}

/// `cni-` and the first 16 characters of a container id, which the CNI spec restricts to
/// letters, digits, `_`, `.` and `-`: what its endpoints' names start with.
///
/// # Errors
/// The container id is not one.
pub fn container_prefix(container_id: &str) -> Result<String, Error> {
    if container_id.is_empty()
        || !container_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return Err(Error::ContainerId {
            id: container_id.to_owned(),
        });
    }
    let short: String = container_id.chars().take(16).collect();
    Ok(format!("cni-{short}"))
}

/// The endpoint name of a container's attachment through interface `ifname` (a Linux
/// interface name of letters, digits, `_`, `.` and `-`, at most 15 characters).
///
/// # Errors
/// The container id or the interface name is not one.
pub fn attachment_name(container_id: &str, ifname: &str) -> Result<String, Error> {
    let prefix = container_prefix(container_id)?;
    if ifname.is_empty()
        || ifname.len() > 15
        || matches!(ifname, "." | "..")
        || !ifname
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return Err(Error::ContainerInterface {
            name: ifname.to_owned(),
        });
    }
    Ok(format!("{prefix}-{ifname}"))
}

impl Registry {
    /// What a CNI ADD of `attachment` changes: nothing when its endpoint is there with the
    /// same interface, addresses and labels (a runtime retrying); else the endpoint to
    /// [`Registry::add`], under the attachment's id if it has one, or the lowest free id from
    /// [`CNI_FIRST_ID`] up. The container's other attachments are not touched.
    ///
    /// # Errors
    /// The container id or interface name is not one, no id is free, or the document does
    /// not load.
    pub fn container_add(&self, attachment: &ContainerAttachment) -> Result<AddPlan, Error> {
        let name = attachment_name(&attachment.container_id, &attachment.ifname)?;
        let existing = self.added_named(&name);
        let id = match existing {
            Some(e) => e.endpoint.id,
            None => self
                .free_id(CNI_FIRST_ID)
                .ok_or(Error::NoFreeEndpointId { from: CNI_FIRST_ID })?,
        };
        let mut addresses = attachment.addresses.clone();
        addresses.sort();
        addresses.dedup();
        let mut labels = attachment.labels.clone();
        labels.sort();
        let text = document(
            &name,
            id,
            &Attachment::Interface(attachment.interface.clone()),
            &addresses,
            &labels,
        );
        if let Some(e) = existing
            && e.document == text.trim()
        {
            return Ok(AddPlan::Unchanged(id));
        }
        Added::parse(&text).map(AddPlan::Add)
    }

    /// The endpoints of container `container_id`: that of its attachment through `ifname`,
    /// or (`None`: a DEL without `CNI_IFNAME`) of every attachment — and an endpoint an
    /// earlier version gave the whole container.
    ///
    /// # Errors
    /// The container id or interface name is not one.
    pub fn container_endpoints(
        &self,
        container_id: &str,
        ifname: Option<&str>,
    ) -> Result<Vec<EndpointId>, Error> {
        let prefix = container_prefix(container_id)?;
        let one = ifname
            .map(|i| attachment_name(container_id, i))
            .transpose()?;
        let every = format!("{prefix}-");
        Ok(self
            .added()
            .filter(|a| {
                let name = a.endpoint.name.as_str();
                name == prefix
                    || match &one {
                        Some(one) => name == one,
                        None => name.starts_with(&every),
                    }
            })
            .map(|a| a.endpoint.id)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const ID: &str = "3db53262e852fe2c7567686437afaa1be0da9cd2ae11ccc755dd73419644efb2";

    fn attachment(ifname: &str, interface: &str, address: &str, app: &str) -> ContainerAttachment {
        ContainerAttachment {
            container_id: ID.to_owned(),
            ifname: ifname.to_owned(),
            interface: interface.to_owned(),
            addresses: vec![address.parse().unwrap()],
            labels: vec![("app".to_owned(), app.to_owned())],
        }
    }

    /// A registry whose files declare endpoint 1 only.
    fn registry() -> Registry {
        let files = "apiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata: {name: web}\n\
                     spec: {id: 1, interface: veth-web, addresses: [\"10.0.0.1/32\"]}\n";
        Registry::new(fqdnd_config::load_str(files, Path::new("files.yaml")).unwrap())
    }

    /// Applies a CNI ADD as the node does: the plan, then [`Registry::add`].
    fn add(r: &mut Registry, a: &ContainerAttachment) -> EndpointId {
        match r.container_add(a).unwrap() {
            AddPlan::Unchanged(id) => id,
            AddPlan::Add(new) => {
                let id = new.endpoint.id;
                r.add(new).unwrap();
                id
            }
        }
    }

    fn names(r: &Registry) -> Vec<String> {
        r.added().map(|a| a.endpoint.name.clone()).collect()
    }

    #[test]
    fn a_container_on_two_networks_is_two_endpoints_each_with_its_networks_labels() {
        let mut r = registry();
        let eth0 = add(
            &mut r,
            &attachment("eth0", "veth-a", "198.51.100.2", "front"),
        );
        let eth1 = add(
            &mut r,
            &attachment("eth1", "veth-b", "198.51.100.130", "back"),
        );
        assert_eq!((eth0, eth1), (EndpointId(32_768), EndpointId(32_769)));
        assert_eq!(
            names(&r),
            ["cni-3db53262e852fe2c-eth0", "cni-3db53262e852fe2c-eth1"]
        );
        let merged = r.merged();
        assert_eq!(merged.interfaces[&eth0], "veth-a");
        assert_eq!(merged.interfaces[&eth1], "veth-b");
        let app = |id| {
            merged
                .endpoints
                .iter()
                .find(|e| e.id == id)
                .and_then(|e| e.labels.iter().find(|l| l.key == "app"))
                .map(|l| l.value.clone())
        };
        assert_eq!(app(eth0).as_deref(), Some("front"));
        assert_eq!(app(eth1).as_deref(), Some("back"));
        assert_eq!(
            r.container_endpoints(ID, None).unwrap(),
            [eth0, eth1],
            "a DEL without CNI_IFNAME: every attachment"
        );
    }

    #[test]
    fn attachments_come_and_go_one_by_one() {
        let mut r = registry();
        let first = attachment("eth0", "veth-a", "198.51.100.2", "web");
        let eth0 = add(&mut r, &first);
        // `podman network connect`: a second endpoint; the first stays as it was.
        let before = r.added_named("cni-3db53262e852fe2c-eth0").cloned();
        let eth1 = add(
            &mut r,
            &attachment("eth1", "veth-b", "198.51.100.130", "web"),
        );
        assert_ne!(eth0, eth1);
        assert_eq!(r.added_named("cni-3db53262e852fe2c-eth0").cloned(), before);
        // `podman network disconnect`: its DEL names eth1; eth0's endpoint stays.
        assert_eq!(
            r.container_endpoints(ID, Some("eth1")).unwrap(),
            [eth1],
            "the disconnected attachment only"
        );
        r.remove(eth1).unwrap();
        assert_eq!(names(&r), ["cni-3db53262e852fe2c-eth0"]);
        assert_eq!(r.container_endpoints(ID, Some("eth1")).unwrap(), []);
        // Connected again: a free id (its old one is), eth0 untouched.
        let again = add(
            &mut r,
            &attachment("eth1", "veth-c", "198.51.100.131", "web"),
        );
        assert_eq!(again, EndpointId(32_769));
        assert_eq!(r.added_named("cni-3db53262e852fe2c-eth0").cloned(), before);
        // Another container's attachments are its own.
        let other = "0fa1e164b118cf77aaaa";
        assert_eq!(r.container_endpoints(other, None).unwrap(), []);
    }

    #[test]
    fn a_retried_add_changes_nothing_and_a_changed_one_keeps_the_attachments_id() {
        let mut r = registry();
        let a = attachment("eth0", "veth-a", "198.51.100.2", "web");
        let id = add(&mut r, &a);
        assert_eq!(r.container_add(&a).unwrap(), AddPlan::Unchanged(id));
        // Addresses in another order, labels in another order: the same attachment.
        let mut shuffled = a.clone();
        shuffled.addresses.insert(0, "2001:db8::2".parse().unwrap());
        add(&mut r, &shuffled);
        shuffled.addresses.reverse();
        assert_eq!(r.container_add(&shuffled).unwrap(), AddPlan::Unchanged(id));
        // A new host-side interface (the runtime recreated it): same id, replaced.
        let moved = attachment("eth0", "veth-z", "198.51.100.2", "web");
        let AddPlan::Add(new) = r.container_add(&moved).unwrap() else {
            panic!("a changed attachment must be added again");
        };
        assert_eq!(new.endpoint.id, id);
        assert_eq!(new.attachment, Attachment::Interface("veth-z".into()));
    }

    #[test]
    fn an_endpoint_of_a_whole_container_from_an_earlier_version_is_each_attachments() {
        let mut r = registry();
        let legacy = Added::parse(&document(
            "cni-3db53262e852fe2c",
            EndpointId(32_768),
            &Attachment::Interface("veth-a".into()),
            &["198.51.100.2".parse().unwrap()],
            &[],
        ))
        .unwrap();
        r.add(legacy).unwrap();
        assert_eq!(
            r.container_endpoints(ID, Some("eth0")).unwrap(),
            [EndpointId(32_768)]
        );
        assert_eq!(
            r.container_endpoints(ID, None).unwrap(),
            [EndpointId(32_768)]
        );
    }

    #[test]
    fn container_ids_and_interface_names_are_checked() {
        let r = registry();
        for bad in ["", "a/b", "a b", "x\n"] {
            assert!(matches!(
                attachment_name(bad, "eth0"),
                Err(Error::ContainerId { .. })
            ));
        }
        for bad in ["", ".", "..", "eth0/x", "a-name-of-16-chr", "eth 0"] {
            assert!(
                matches!(
                    attachment_name(ID, bad),
                    Err(Error::ContainerInterface { .. })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            attachment_name("short_id.1", "net1").unwrap(),
            "cni-short_id.1-net1"
        );
        let mut full = attachment("eth0", "veth-a", "198.51.100.2", "web");
        full.container_id = "bad id".to_owned();
        assert!(matches!(
            r.container_add(&full),
            Err(Error::ContainerId { .. })
        ));
    }
}
