//! `kind: Settings`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::time::Duration;

use common::{find, ok, one_err, pos};
use fqdnd_config::RejectCode;
use fqdnd_config::Settings;

fn settings(spec: &str) -> String {
    format!("apiVersion: fqdnd.io/v1\nkind: Settings\nspec:\n{spec}")
}

#[test]
fn defaults_are_ciliums() {
    let s = Settings::default();
    assert_eq!(s.min_ttl, 0);
    assert_eq!(s.max_ips_per_hostname, 1000);
    assert_eq!(s.max_deferred_connection_deletes, 10_000);
    assert_eq!(s.proxy_response_max_delay, Duration::from_millis(100));
    assert_eq!(s.reject_response_code, RejectCode::Refused);
    assert_eq!(s.concurrency_limit, 0);
    assert!(s.preallocate_identities);
    assert_eq!(s.max_fqdn_identities, 2048);
    assert_eq!(s.max_ips_per_name, 2000);
    assert_eq!(s.max_names_per_endpoint, 50_000);
    assert_eq!(s.gc_interval, Duration::from_secs(60));
    // The defaults agree with the components' own.
    assert_eq!(s.namemgr(), fqdnd_namemgr::Config::default());
    assert_eq!(s.ipcache(), fqdnd_ipcache::Config::default());
}

#[test]
fn absent_settings_and_empty_settings_give_the_defaults() {
    let policy_only = "apiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata: {name: a}\nspec: {id: 1, addresses: [10.0.0.1]}\n";
    assert_eq!(ok(policy_only).settings, Settings::default());
    assert_eq!(
        ok("apiVersion: fqdnd.io/v1\nkind: Settings\n").settings,
        Settings::default()
    );
    assert_eq!(
        ok(&settings("  dns: {}\n  breakers: {}\n")).settings,
        Settings::default()
    );
    let with_meta = "apiVersion: fqdnd.io/v1\nkind: Settings\nmetadata: {name: fqdnd}\nspec: {}\n";
    assert_eq!(ok(with_meta).settings, Settings::default());
}

#[test]
fn every_field() {
    let text = settings(
        "  dns:\n    minTTL: 3600\n    maxIPsPerHostname: 50\n    maxDeferredConnectionDeletes: 0\n    proxyResponseMaxDelay: 1s 500ms\n    rejectResponseCode: nameError\n    concurrencyLimit: 64\n    threads: 4\n    preallocateIdentities: false\n  breakers:\n    maxFQDNIdentities: 10\n    maxIPsPerName: 20\n    maxNamesPerEndpoint: 30\n    maxCacheEntries: 40\n  gcInterval: 2m30s\n",
    );
    let s = ok(&text).settings;
    assert_eq!(
        s,
        Settings {
            min_ttl: 3600,
            max_ips_per_hostname: 50,
            max_deferred_connection_deletes: 0,
            proxy_response_max_delay: Duration::from_millis(1500),
            reject_response_code: RejectCode::NxDomain,
            concurrency_limit: 64,
            dns_threads: Some(4),
            preallocate_identities: false,
            max_fqdn_identities: 10,
            max_ips_per_name: 20,
            max_names_per_endpoint: 30,
            max_cache_entries: 40,
            gc_interval: Duration::from_secs(150),
        }
    );
    assert_eq!(
        s.namemgr(),
        fqdnd_namemgr::Config {
            min_ttl: 3600,
            max_ips_per_hostname: 50,
            max_zombies: 0,
            max_ips_per_name: 20,
            max_names_per_endpoint: 30,
            max_cache_entries: 40,
        }
    );
    assert_eq!(
        s.ipcache(),
        fqdnd_ipcache::Config {
            max_fqdn_identities: 10,
            preallocate_fqdn_identities: false,
            identity_per_prefix: false,
            datapath_prefixes: None,
        }
    );
}

#[test]
fn out_of_range_and_malformed_values_are_located() {
    let cases = [
        (
            "  dns: {minTTL: -1}\n",
            "-1",
            "`minTTL` must be a whole number from 0 to 4294967295, not -1",
        ),
        (
            "  dns: {minTTL: 4294967296}\n",
            "4294967296",
            "not 4294967296",
        ),
        (
            "  dns: {minTTL: 1h}\n",
            "1h",
            "`minTTL` must be a whole number",
        ),
        (
            "  dns: {maxIPsPerHostname: 0}\n",
            "0}",
            "`maxIPsPerHostname` must be a whole number from 1",
        ),
        (
            "  dns: {maxDeferredConnectionDeletes: -5}\n",
            "-5",
            "maxDeferredConnectionDeletes",
        ),
        (
            "  dns: {threads: 0}\n",
            "0}",
            "`threads` must be a whole number from 1",
        ),
        (
            "  dns: {concurrencyLimit: 2.5}\n",
            "2.5",
            "`concurrencyLimit` must be a whole number from 0 to 4294967295, not a fractional number",
        ),
        (
            "  dns: {proxyResponseMaxDelay: 100}\n",
            "100",
            "`proxyResponseMaxDelay`: \"100\" is not a duration",
        ),
        (
            "  dns: {proxyResponseMaxDelay: 11s}\n",
            "11s",
            "too long: at most 10s",
        ),
        (
            "  dns: {proxyResponseMaxDelay: soon}\n",
            "soon",
            "is not a duration",
        ),
        (
            "  dns: {rejectResponseCode: NXDOMAIN}\n",
            "NXDOMAIN",
            "expected `refused` or `nameError`",
        ),
        (
            "  dns: {rejectResponseCode: Refused}\n",
            "Refused",
            "expected `refused` or `nameError`",
        ),
        (
            "  dns: {preallocateIdentities: sometimes}\n",
            "sometimes",
            "",
        ),
        (
            "  breakers: {maxFQDNIdentities: 0}\n",
            "0}",
            "`maxFQDNIdentities` must be a whole number from 1",
        ),
        ("  breakers: {maxIPsPerName: 0}\n", "0}", "`maxIPsPerName`"),
        (
            "  breakers: {maxNamesPerEndpoint: 0}\n",
            "0}",
            "`maxNamesPerEndpoint`",
        ),
        (
            "  gcInterval: 10ms\n",
            "10ms",
            "`gcInterval` must be at least 1s",
        ),
        (
            "  gcInterval: 60\n",
            "60",
            "`gcInterval`: \"60\" is not a duration",
        ),
        (
            "  dns: {minTtl: 5}\n",
            "minTtl",
            "unknown field `minTtl`: expected one of `minTTL`, `maxIPsPerHostname`",
        ),
        (
            "  gcinterval: 5s\n",
            "gcinterval",
            "unknown field `gcinterval`: expected one of `dns`, `breakers`, `gcInterval`",
        ),
        (
            "  breakers: {maxIpsPerName: 5}\n",
            "maxIpsPerName",
            "expected one of `maxFQDNIdentities`, `maxIPsPerName`, `maxNamesPerEndpoint`, `maxCacheEntries`",
        ),
    ];
    for (spec, at, expected) in cases {
        let text = settings(spec);
        let e = one_err(&text);
        assert_eq!(pos(&e), find(&text, at), "{spec}: {e}");
        assert!(
            e.to_string().contains(expected),
            "{spec}: expected {expected:?} in {e}"
        );
    }
}

#[test]
fn several_bad_settings_are_all_reported() {
    let text = settings("  dns: {minTTL: -1, maxIPsPerHostname: 0}\n  gcInterval: 0s\n");
    assert_eq!(common::errs(&text).len(), 3);
}
