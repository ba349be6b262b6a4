//! Replays captures through the engine and prints the summary, without the CLI:
//! `cargo run --release -p fqdnd-replay --example replay_file -- POLICY.yaml TRACE...`
//! (for profiling the library alone). `--no-engine` as the first argument reads and decodes
//! only (no engine run), to see what the engine costs on top.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a developer tool")]

use fqdnd_replay::{IdentityMode, Limits, Options, SettingsOverrides, replay};

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    let engine = args.next_if(|a| a == "--no-engine").is_none();
    let policy = args
        .next()
        .expect("usage: replay_file POLICY.yaml TRACE...");
    let options = Options {
        traces: args.map(Into::into).collect(),
        policy: vec![policy.into()],
        endpoints: vec![],
        ports: vec![53],
        modes: if engine {
            vec![IdentityMode::Selector]
        } else {
            vec![]
        },
        settings: SettingsOverrides::default(),
        limits: Limits::default(),
        csv_timeseries: None,
        progress_interval: None,
    };
    let (report, _) = replay(&options, &mut |p| eprintln!("{p}")).unwrap();
    print!("{}", fqdnd_replay::report::summary(&report));
}
