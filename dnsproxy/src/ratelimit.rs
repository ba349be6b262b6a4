//! Per-client rate limit, as dnsdist's `MaxQPSIPRule`: a token bucket per client address,
//! refilled at `qps` up to `burst`. The table is bounded: buckets that have refilled completely
//! carry no information and are forgotten first; when every bucket of a shard is still in use,
//! a client not yet tracked is limited too (a flood of new sources cannot evict the clients
//! being limited).

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Mutex;

use tokio::time::Instant;

/// Shards, so two listener tasks seldom wait for the same lock.
const SHARDS: usize = 16;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Token buckets per client address.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    qps: f64,
    burst: f64,
    per_shard: usize,
    hasher: RandomState,
    shards: Vec<Mutex<HashMap<IpAddr, Bucket>>>,
}

impl RateLimiter {
    /// A limiter of `qps` queries per second per client with bursts of `burst`, tracking at
    /// most about `clients` clients; `None` when `qps` is 0 (no limit).
    pub(crate) fn new(qps: u32, burst: u32, clients: usize) -> Option<Self> {
        if qps == 0 {
            return None;
        }
        let burst = if burst == 0 { qps } else { burst };
        Some(Self {
            qps: f64::from(qps),
            burst: f64::from(burst),
            per_shard: clients.div_ceil(SHARDS).max(1),
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        })
    }

    /// Takes a token for `client` at `now`; false when it has none left.
    pub(crate) fn allow(&self, client: IpAddr, now: Instant) -> bool {
        let shard = (self.hasher.hash_one(client) as usize) % SHARDS;
        let Ok(mut buckets) = self.shards[shard].lock() else {
            return false;
        };
        let refill = |b: &Bucket| {
            (b.tokens + now.saturating_duration_since(b.last).as_secs_f64() * self.qps)
                .min(self.burst)
        };
        if let Some(bucket) = buckets.get_mut(&client) {
            bucket.tokens = refill(bucket);
            bucket.last = now;
            if bucket.tokens >= 1.0 {
                bucket.tokens -= 1.0;
                return true;
            }
            return false;
        }
        if buckets.len() >= self.per_shard {
            buckets.retain(|_, b| refill(b) < self.burst);
            if buckets.len() >= self.per_shard {
                return false;
            }
        }
        buckets.insert(
            client,
            Bucket {
                tokens: self.burst - 1.0,
                last: now,
            },
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_bucket_allows_the_burst_then_the_rate() {
        let limiter = RateLimiter::new(10, 5, 100).unwrap();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let t0 = Instant::now();
        let allowed = (0..20).filter(|_| limiter.allow(a, t0)).count();
        assert_eq!(allowed, 5);
        assert!(limiter.allow(b, t0), "another client has its own bucket");
        // 0.5 s later: 5 more tokens at 10 qps.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!((0..20).filter(|_| limiter.allow(a, t1)).count(), 5);
        assert!(RateLimiter::new(0, 0, 10).is_none());
    }

    #[test]
    fn the_table_is_bounded_and_forgets_refilled_buckets_first() {
        let limiter = RateLimiter::new(1, 1, SHARDS).unwrap();
        let t0 = Instant::now();
        let clients: Vec<IpAddr> = (0..200u32)
            .map(|i| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)))
            .collect();
        let admitted = clients.iter().filter(|c| limiter.allow(**c, t0)).count();
        assert!(admitted < 200, "a saturated table limits new clients");
        let total: usize = limiter.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(total <= SHARDS, "{total}");
        // Once the buckets have refilled they are forgotten and new clients get in.
        let later = t0 + Duration::from_secs(5);
        assert!(clients.iter().filter(|c| limiter.allow(**c, later)).count() >= admitted);
    }
}
