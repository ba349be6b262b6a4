//! fqdnd: a transparent DNS proxy and FQDN policy enforcer.
//!
//! This binary wires the library crates (config → namemgr → ipcache → datapath) into the
//! command-line tools. It is the only place `anyhow` is used.

#![forbid(unsafe_code)]

mod engine;
mod policy_cmd;
mod simulate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// fqdnd lets workloads reach only the IPs that DNS answered for the names their policy
/// allows. Policies are CiliumNetworkPolicy YAML (cilium.io/v2), taken as they are.
#[derive(Parser)]
#[command(name = "fqdnd", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate policies and test FQDN patterns.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Run DNS answers from a text file through the engine on a virtual clock and print the
    /// identities, ipcache and per-endpoint policy they produce.
    ///
    /// With no arguments it uses the bundled example policy and answers (no network needed).
    /// Answers file lines: `seconds client-ip name ttl address...`; `#` starts a comment.
    Simulate {
        /// Policy and configuration files or directories (default: the bundled example).
        #[arg(long = "config", short = 'c', value_name = "PATH")]
        config: Vec<PathBuf>,
        /// Answers file (default: the bundled example answers).
        #[arg(long, value_name = "FILE")]
        answers: Option<PathBuf>,
        /// Run a final GC at this virtual time (seconds), to show expiry.
        #[arg(long, value_name = "SECONDS")]
        end: Option<f64>,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Load policy and configuration files (or directories of them) and print every error
    /// as `file:line:column: message`. Exits 1 if there is any.
    Check {
        /// Files or directories (`*.yaml`, `*.yml`, `*.json`).
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
    /// Tell for each NAME whether the FQDN PATTERN (`matchPattern` syntax) matches it.
    ///
    /// Names are canonicalised as the DNS proxy does: lowercased, trailing dot added.
    /// Pattern semantics are Cilium's: `*` matches within one label, a leading `**.` spans
    /// one or more labels, a lone `*` matches every name.
    Match {
        /// Print `[{"name": ..., "matches": true|false}, ...]` in input order.
        #[arg(long)]
        json: bool,
        /// The pattern, e.g. `*.cilium.io` or `**.example.com`.
        pattern: String,
        /// Names to test.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FQDND_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Policy(PolicyCommand::Check { paths }) => policy_cmd::check(&paths),
        Command::Policy(PolicyCommand::Match {
            json,
            pattern,
            names,
        }) => policy_cmd::matches(&pattern, &names, json),
        Command::Simulate {
            config,
            answers,
            end,
        } => simulate::run(&config, answers.as_deref(), end).map(|out| {
            print!("{out}");
            ExitCode::SUCCESS
        }),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fqdnd: {e:#}");
            ExitCode::FAILURE
        }
    }
}
