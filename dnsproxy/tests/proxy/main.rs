//! The proxy end to end over real loopback sockets, against a programmable upstream.
//! One test binary (faster to link); each module covers one concern.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod harness;
mod upstream;

mod answers;
mod cache;
mod encrypted;
mod exported_metrics;
mod faults;
mod health;
mod hold;
mod lifecycle;
mod limits;
mod logs;
mod policy;
mod recording;
mod redirect;
mod runts;
mod spoofing;
mod tcp;
mod transparent;
mod truncation;
mod upstream_tls;
mod zones;
