//! The DNS proxy's settings from the configuration: config's types mapped onto the proxy's,
//! each variant by name (a new one on either side fails to compile here).

use fqdnd_config::{self as config, Daemon};
use fqdnd_dnsproxy as proxy;

/// The proxy's settings from `Settings` and the mode's `Daemon` options, over the mode's
/// listen addresses, upstreams and transparent mode.
pub fn proxy_config(
    settings: &config::Settings,
    daemon: &Daemon,
    base: proxy::Config,
) -> proxy::Config {
    proxy::Config {
        upstream_timeout: daemon.upstream_timeout,
        on_upstream_timeout: match daemon.on_upstream_timeout {
            config::UpstreamTimeoutAction::ServFail => proxy::UpstreamTimeoutAction::ServFail,
            config::UpstreamTimeoutAction::NoReply => proxy::UpstreamTimeoutAction::NoReply,
        },
        response_max_delay: settings.proxy_response_max_delay,
        on_hold_timeout: match daemon.on_hold_timeout {
            config::HoldFallback::Release => proxy::HoldFallback::Release,
            config::HoldFallback::ServFail => proxy::HoldFallback::ServFail,
        },
        on_truncated: match daemon.on_truncated {
            config::TruncatedAction::RetryTcp => proxy::TruncatedAction::RetryTcp,
            config::TruncatedAction::PassThrough => proxy::TruncatedAction::PassThrough,
        },
        randomize_case: daemon.randomize_case,
        reject_code: match settings.reject_response_code {
            config::RejectCode::Refused => proxy::RejectCode::Refused,
            config::RejectCode::NxDomain => proxy::RejectCode::NxDomain,
        },
        concurrency_limit: settings.concurrency_limit,
        udp_threads: settings.dns_threads.unwrap_or(base.udp_threads),
        udp_sockets_per_address: settings.dns_threads.unwrap_or(base.udp_sockets_per_address),
        rate_limit_qps: daemon.rate_limit.map_or(0, |r| r.qps),
        rate_limit_burst: daemon.rate_limit.map_or(0, |r| r.burst),
        rate_limit_clients: daemon.rate_limit.map_or(65_536, |r| r.clients),
        rate_limit_action: match daemon.rate_limit.map(|r| r.action).unwrap_or_default() {
            config::RateLimitAction::Drop => proxy::RateLimitAction::Drop,
            config::RateLimitAction::Refused => proxy::RateLimitAction::Refused,
        },
        ..base
    }
}

/// The proxy's answer cache from the `cache` block (`None`: off).
pub fn answer_cache(cache: Option<config::AnswerCache>) -> Option<proxy::CacheConfig> {
    cache.map(|c| proxy::CacheConfig {
        max_entries: c.max_entries,
        min_ttl: c.min_ttl,
        max_ttl: c.max_ttl,
        max_negative_ttl: c.max_negative_ttl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_reaches_the_proxy() {
        let config = config::load_str(
            "apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: [\"127.0.0.1:53\"]
  upstreams: [\"192.0.2.1:53\"]
  onUpstreamTimeout: noReply
  onHoldTimeout: servfail
  onTruncated: passThrough
  rateLimit: {qps: 5, action: refused}
  cache: {size: 7, maxTTL: 60s}
---
apiVersion: fqdnd.io/v1
kind: Settings
spec:
  dns:
    rejectResponseCode: nameError
    threads: 3
",
            "gw.yaml".as_ref(),
        )
        .unwrap();
        let gateway = config.gateway.unwrap();
        let p = proxy_config(&config.settings, &gateway.daemon, proxy::Config::default());
        assert_eq!(p.on_upstream_timeout, proxy::UpstreamTimeoutAction::NoReply);
        assert_eq!(p.on_hold_timeout, proxy::HoldFallback::ServFail);
        assert_eq!(p.on_truncated, proxy::TruncatedAction::PassThrough);
        assert_eq!(p.reject_code, proxy::RejectCode::NxDomain);
        assert_eq!(p.rate_limit_action, proxy::RateLimitAction::Refused);
        assert_eq!(p.rate_limit_qps, 5);
        assert_eq!((p.udp_threads, p.udp_sockets_per_address), (3, 3));
        let cache = answer_cache(gateway.cache).unwrap();
        assert_eq!((cache.max_entries, cache.max_ttl), (7, 60));
        assert_eq!(
            cache.max_negative_ttl,
            config::AnswerCache::default().max_negative_ttl
        );
    }

    #[test]
    fn the_defaults_of_config_and_proxy_agree() {
        assert_eq!(
            answer_cache(Some(config::AnswerCache::default())),
            Some(proxy::CacheConfig::default())
        );
        let d = Daemon::default();
        let p = proxy_config(&config::Settings::default(), &d, proxy::Config::default());
        let base = proxy::Config::default();
        assert_eq!(p.on_upstream_timeout, base.on_upstream_timeout);
        assert_eq!(p.on_hold_timeout, base.on_hold_timeout);
        assert_eq!(p.on_truncated, base.on_truncated);
        assert_eq!(p.reject_code, base.reject_code);
        assert_eq!(p.rate_limit_action, base.rate_limit_action);
        assert_eq!(p.udp_threads, base.udp_threads);
        assert_eq!(p.udp_sockets_per_address, base.udp_sockets_per_address);
    }
}
