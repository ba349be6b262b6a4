//! Helpers shared by the integration tests.

#![allow(dead_code, reason = "each test binary uses a different subset")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::path::Path;

use fqdnd_config::{Config, Error, Errors, load_str};

/// The file name every inline test text is loaded as.
pub(crate) const FILE: &str = "test.yaml";

/// Loads `text`, expecting success.
#[track_caller]
pub(crate) fn ok(text: &str) -> Config {
    match load_str(text, Path::new(FILE)) {
        Ok(config) => config,
        Err(errors) => panic!("expected no errors, got:\n{errors}"),
    }
}

/// Loads `text`, expecting errors.
#[track_caller]
pub(crate) fn errs(text: &str) -> Errors {
    match load_str(text, Path::new(FILE)) {
        Ok(config) => panic!("expected errors, got {config:#?}"),
        Err(errors) => errors,
    }
}

/// Loads `text`, expecting exactly one error, and returns it.
#[track_caller]
pub(crate) fn one_err(text: &str) -> Error {
    let errors = errs(text).into_vec();
    assert_eq!(errors.len(), 1, "expected one error, got: {errors:#?}");
    errors.into_iter().next().unwrap()
}

/// The rendered errors of `text`, one string per error.
#[track_caller]
pub(crate) fn messages(text: &str) -> Vec<String> {
    errs(text).iter().map(ToString::to_string).collect()
}

/// A CiliumNetworkPolicy named `p` whose single rule has the given body (YAML at the
/// indentation of `spec`'s fields, i.e. two spaces), with `endpointSelector: {}` unless the
/// body has its own.
pub(crate) fn cnp(body: &str) -> String {
    policy("CiliumNetworkPolicy", "", body)
}

/// As [`cnp`], for a CiliumClusterwideNetworkPolicy.
pub(crate) fn ccnp(body: &str) -> String {
    policy("CiliumClusterwideNetworkPolicy", "", body)
}

/// A CiliumNetworkPolicy in namespace `ns`.
pub(crate) fn cnp_in(ns: &str, body: &str) -> String {
    policy("CiliumNetworkPolicy", &format!("  namespace: {ns}\n"), body)
}

fn policy(kind: &str, meta: &str, body: &str) -> String {
    let selector = if body.contains("endpointSelector") {
        ""
    } else {
        "  endpointSelector: {}\n"
    };
    format!(
        "apiVersion: cilium.io/v2\nkind: {kind}\nmetadata:\n  name: p\n{meta}spec:\n{selector}{body}"
    )
}

/// An egress rule allowing port 443/TCP to `api.example.com`, for bodies that need a valid
/// egress section besides what they test.
pub(crate) const EGRESS: &str = "  egress:\n    - toFQDNs:\n        - matchName: api.example.com\n";

/// `(line, column)` of an error, which must point into the file.
#[track_caller]
pub(crate) fn pos(error: &Error) -> (u64, u64) {
    error.position().expect("error has a position")
}

/// The 1-based `(line, column)` of the first occurrence of `needle` in `text`.
#[track_caller]
pub(crate) fn find(text: &str, needle: &str) -> (u64, u64) {
    let offset = text
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in text"));
    let before = &text[..offset];
    let line = before.matches('\n').count() as u64 + 1;
    let column = before.rsplit('\n').next().unwrap().chars().count() as u64 + 1;
    (line, column)
}

/// A whole valid policy file: one CiliumNetworkPolicy with [`EGRESS`].
pub(crate) const EGRESS_POLICY: &str = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata:\n  name: p\nspec:\n  endpointSelector: {}\n  egress:\n    - toFQDNs:\n        - matchName: api.example.com\n";
