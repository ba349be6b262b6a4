//! Local delivery of packets assigned to the DNS proxy.
//!
//! `fqdnd_from_ep` assigns DNS packets to the proxy's socket (`bpf_sk_assign`) and marks them
//! `0x200/0xf00`; routing would still forward them towards their original destination (and
//! drop them), so a policy route sends marked packets to the local table:
//!
//! ```text
//! ip rule add fwmark 0x200/0xf00 pref 9 lookup 2004
//! ip route add local 0.0.0.0/0 dev lo table 2004
//! ip -6 rule add fwmark 0x200/0xf00 pref 9 lookup 2004
//! ip -6 route add local ::/0 dev lo table 2004
//! ```
//!
//! (Cilium's values: mark, table 2004 and rule preference 9.)
//!
//! Decision: these run the `ip` binary (iproute2, installed by scripts/install-deps.sh) rather
//! than speaking rtnetlink: four idempotent commands at start-up do not justify a netlink
//! dependency, and the commands are the same an operator reads in this doc and types to check.

use std::process::Command;

use crate::error::Error;
use crate::sys::{MARK_MASK, MARK_TO_PROXY, PROXY_TABLE};

fn mark() -> String {
    format!("{MARK_TO_PROXY:#x}/{MARK_MASK:#x}")
}

/// The rule preference (before `main` at 32766, after `local` at 0), as Cilium.
const RULE_PREF: &str = "9";

/// Runs `ip <args>`; `Ok(Err(stderr))` when it ran and failed.
fn ip(args: &[&str]) -> Result<Result<String, String>, Error> {
    let command = format!("ip {}", args.join(" "));
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| Error::Command {
            command: command.clone(),
            message: format!("cannot run `ip` (is iproute2 installed?): {e}"),
        })?;
    if out.status.success() {
        Ok(Ok(String::from_utf8_lossy(&out.stdout).into_owned()))
    } else {
        Ok(Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()))
    }
}

fn must(args: &[&str]) -> Result<String, Error> {
    ip(args)?.map_err(|message| Error::Command {
        command: format!("ip {}", args.join(" ")),
        message,
    })
}

/// `-4` / `-6` with the catch-all prefix of the family.
const FAMILIES: [(&str, &str); 2] = [("-4", "0.0.0.0/0"), ("-6", "::/0")];

fn rule_present(family: &str) -> Result<bool, Error> {
    let out = must(&[family, "rule", "show"])?;
    let want = format!("fwmark {} lookup {PROXY_TABLE}", mark());
    Ok(out.lines().any(|l| l.contains(&want)))
}

fn route_present(family: &str) -> Result<bool, Error> {
    let table = PROXY_TABLE.to_string();
    let args = [family, "route", "show", "table", &table, "type", "local"];
    let out = match ip(&args)? {
        Ok(out) => out,
        // an empty table does not exist yet
        Err(message) if message.contains("does not exist") => return Ok(false),
        Err(message) => {
            return Err(Error::Command {
                command: format!("ip {}", args.join(" ")),
                message,
            });
        }
    };
    Ok(out
        .lines()
        .any(|l| l.contains("default") && l.contains("dev lo")))
}

/// Whether both rules and both routes are installed.
pub fn local_delivery_installed() -> Result<bool, Error> {
    for (family, _) in FAMILIES {
        if !rule_present(family)? || !route_present(family)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Installs the rules and routes for IPv4 and IPv6 unless present (idempotent; "File exists"
/// from a concurrent install is fine). Errors name the command and its stderr.
pub fn install_local_delivery() -> Result<(), Error> {
    let mark = mark();
    let table = PROXY_TABLE.to_string();
    for (family, all) in FAMILIES {
        if !route_present(family)? {
            let args = [
                family, "route", "add", "local", all, "dev", "lo", "table", &table,
            ];
            tolerate(&args, "File exists")?;
        }
        if !rule_present(family)? {
            let args = [
                family, "rule", "add", "fwmark", &mark, "pref", RULE_PREF, "lookup", &table,
            ];
            tolerate(&args, "File exists")?;
        }
    }
    Ok(())
}

/// Removes the rules and routes (every copy of the rule); absent ones are fine.
pub fn remove_local_delivery() -> Result<(), Error> {
    let mark = mark();
    let table = PROXY_TABLE.to_string();
    for (family, all) in FAMILIES {
        // every copy (bounded, in case a delete succeeds without removing what `show` lists)
        for _ in 0..16 {
            if !rule_present(family)? {
                break;
            }
            let args = [family, "rule", "del", "fwmark", &mark, "lookup", &table];
            tolerate(&args, "No such file")?;
        }
        if route_present(family)? {
            let args = [
                family, "route", "del", "local", all, "dev", "lo", "table", &table,
            ];
            tolerate(&args, "No such")?;
        }
    }
    Ok(())
}

/// Runs `ip <args>`, treating a failure whose stderr contains `benign` as success.
fn tolerate(args: &[&str], benign: &str) -> Result<(), Error> {
    match ip(args)? {
        Ok(_) => Ok(()),
        Err(message) if message.contains(benign) => Ok(()),
        Err(message) => Err(Error::Command {
            command: format!("ip {}", args.join(" ")),
            message,
        }),
    }
}
