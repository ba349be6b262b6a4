//! Resource owners: who claims prefixes (the NameManager's names, policy CIDRs, endpoints,
//! the node, other nodes and their endpoints), registered by value or by id, given up once
//! they claim nothing, and looked up by value or id.

use super::IpCache;
use crate::datapath::Datapath;
use crate::error::Error;
use crate::labels::{Label, LabelId};
use crate::metadata::{OwnerId, OwnerKind, ResourceOwner};

impl<D: Datapath> IpCache<D> {
    /// The interned `fqdn:<key>` label, for owners that label prefixes with it.
    pub fn fqdn_label(&mut self, key: &str) -> LabelId {
        self.labels.intern(Label::fqdn(key))
    }

    /// Registers a resource owner: prefix metadata names it by the returned id. Each call
    /// makes a distinct owner, whatever its value (the NameManager makes one per cached name
    /// and keeps the id); [`IpCache::remove_owner`] gives it up once it claims nothing.
    ///
    /// # Errors
    /// [`Error::OwnersExhausted`] past 2²⁹ owners at once.
    pub fn add_owner(&mut self, owner: ResourceOwner) -> Result<OwnerId, Error> {
        self.meta
            .owners
            .add(owner.kind, Some(owner.name))
            .ok_or(Error::OwnersExhausted)
    }

    /// Registers an owner whose name the IpCache does not keep: the registrant keeps it and
    /// renders the owner itself (the NameManager, one owner per cached name it already
    /// holds the name of: eight bytes here instead of a second reference to the name).
    /// [`IpCache::owner`] gives `None` for it and [`IpCache::prefixes`] lists it by id.
    ///
    /// # Errors
    /// [`Error::OwnersExhausted`] past 2²⁹ owners at once.
    pub fn add_owner_without_name(&mut self, kind: OwnerKind) -> Result<OwnerId, Error> {
        self.meta
            .owners
            .add(kind, None)
            .ok_or(Error::OwnersExhausted)
    }

    /// Gives up an owner registered with [`IpCache::add_owner`].
    ///
    /// # Errors
    /// [`Error::OwnerInUse`] while it still has labels on some prefix (it stays registered).
    pub fn remove_owner(&mut self, owner: OwnerId) -> Result<(), Error> {
        self.meta
            .owners
            .remove(owner)
            .map_err(|claims| Error::OwnerInUse { claims })
    }

    /// [`IpCache::remove_owner`] for many owners at once (a GC pass's names).
    ///
    /// # Errors
    /// [`Error::OwnerInUse`] for the first that still has labels on some prefix; the ones
    /// before it are removed.
    pub fn remove_owners(&mut self, owners: &[OwnerId]) -> Result<(), Error> {
        self.meta.owners.reserve_free(owners.len());
        owners
            .iter()
            .try_for_each(|owner| self.remove_owner(*owner))
    }

    /// The interned owner of a value the IpCache names itself: a policy CIDR, an endpoint,
    /// one of the node's addresses, another node or its endpoint.
    pub(super) fn owner_by_value(&mut self, owner: &ResourceOwner) -> Result<OwnerId, Error> {
        self.meta.owners.intern(owner).ok_or(Error::OwnersExhausted)
    }
}

impl<D> IpCache<D> {
    /// Registered owners with this value (registered with their name), in id order (a scan:
    /// for tests and tools, not for a per-answer path).
    pub fn find_owners(&self, owner: &ResourceOwner) -> Vec<OwnerId> {
        self.meta.owners.find(owner)
    }

    /// The owner behind an id, if registered with its name.
    pub fn owner(&self, owner: OwnerId) -> Option<ResourceOwner> {
        self.meta.owners.get(owner)
    }

    /// How many prefixes `owner` has labels on (`None`: not registered); what keeps it from
    /// being removed while it has some.
    pub fn owner_claims(&self, owner: OwnerId) -> Option<u32> {
        self.meta.owners.claims_of(owner)
    }
}
