//! The encrypted listeners' connection limits: in all, and per client address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use super::EncryptedError;

/// Connections open, in all and per client address.
#[derive(Debug)]
pub(crate) struct Slots {
    max: usize,
    max_per_client: usize,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_client: HashMap<IpAddr, usize>,
}

/// One open connection's place; given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    slots: Arc<Slots>,
    client: IpAddr,
}

impl Slots {
    pub(crate) fn new(max: usize, max_per_client: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            max_per_client,
            open: Mutex::new(Open::default()),
        })
    }

    /// A place for a new connection from `client`, or why there is none.
    pub(crate) fn take(self: &Arc<Self>, client: IpAddr) -> Result<Slot, EncryptedError> {
        let mut open = self
            .open
            .lock()
            .map_err(|_| EncryptedError::MaxConnections)?;
        if open.total >= self.max {
            return Err(EncryptedError::MaxConnections);
        }
        let mine = open.by_client.entry(client).or_insert(0);
        if *mine >= self.max_per_client {
            return Err(EncryptedError::MaxConnectionsPerClient);
        }
        *mine += 1;
        open.total += 1;
        Ok(Slot {
            slots: self.clone(),
            client,
        })
    }

    /// Connections open now.
    #[cfg(test)]
    fn total(&self) -> usize {
        self.open.lock().map(|o| o.total).unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Ok(mut open) = self.slots.open.lock() else {
            return;
        };
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                open.by_client.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_hold_in_all_and_per_client_and_places_come_back() {
        let slots = Slots::new(3, 2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let a1 = slots.take(a).unwrap();
        let _a2 = slots.take(a).unwrap();
        assert_eq!(
            slots.take(a).unwrap_err(),
            EncryptedError::MaxConnectionsPerClient
        );
        let _b1 = slots.take(b).unwrap();
        assert_eq!(slots.take(b).unwrap_err(), EncryptedError::MaxConnections);
        drop(a1);
        assert_eq!(slots.total(), 2);
        let _b2 = slots.take(b).unwrap();
        assert_eq!(slots.total(), 3);
    }
}
