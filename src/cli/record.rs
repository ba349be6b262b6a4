//! `fqdnd record start|stop|status`: the running daemon's DNS traffic into rotating pcapng
//! files (through the admin API), for `fqdnd replay` and policy previews.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::cli::Target;
use fqdnd_daemon::admin::client;
use fqdnd_daemon::skeleton::record::{RecordRequest, RecordStatus};

/// What `fqdnd record start` is told.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct StartArgs {
    /// The directory for the files (created if missing; files are 0600).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// Start a new file past this many bytes (suffixes K, M, G: powers of 1024).
    #[arg(long, value_name = "SIZE", default_value = "100M", value_parser = parse_size)]
    max_file_size: u64,
    /// Keep at most this many files; the oldest is deleted when a new one starts.
    #[arg(long, value_name = "N", default_value_t = 10)]
    max_files: usize,
}

/// `123`, `64K`, `100M`, `2G`.
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, shift) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 10),
        Some('M' | 'm') => (&text[..text.len() - 1], 20),
        Some('G' | 'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 4096, 64K, 100M, 2G)"))?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| format!("{text:?} is too large"))
}

fn print(status: &RecordStatus, json: bool, body: &str) -> Result<ExitCode> {
    if json {
        println!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    let dir = status
        .dir
        .as_ref()
        .map_or_else(|| "-".to_owned(), |d| d.display().to_string());
    println!(
        "recording: {} ({dir})",
        if status.recording { "on" } else { "off" }
    );
    println!(
        "messages:  {} taken, {} dropped (writer behind), {} written, {} skipped",
        status.taken, status.dropped, status.packets, status.skipped
    );
    println!(
        "files:     {} kept, {} rotated out, {} bytes",
        status.files.len(),
        status.rotated_out,
        status.bytes
    );
    for f in &status.files {
        println!("  {}", f.display());
    }
    if let Some(e) = &status.error {
        println!("error:     {e}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `fqdnd record start`.
pub(crate) fn start(target: &Target, args: &StartArgs, json: bool) -> Result<ExitCode> {
    let dir = std::path::absolute(&args.dir)
        .with_context(|| format!("resolving {}", args.dir.display()))?;
    let request = RecordRequest {
        dir,
        max_file_bytes: args.max_file_size,
        max_files: args.max_files,
    };
    let (text, status): (_, RecordStatus) =
        client::post_json(&target.socket()?, "/v1/record", &request)?;
    print(&status, json, &text)
}

/// `fqdnd record stop`: returns once every message taken is written.
pub(crate) fn stop(target: &Target, json: bool) -> Result<ExitCode> {
    let text = client::request(&target.socket()?, hyper::Method::DELETE, "/v1/record", "")?;
    let status: RecordStatus = serde_json::from_str(&text).context("decoding the answer")?;
    print(&status, json, &text)
}

/// `fqdnd record status`.
pub(crate) fn status(target: &Target, json: bool) -> Result<ExitCode> {
    let (text, status): (_, RecordStatus) = client::get(&target.socket()?, "/v1/record")?;
    print(&status, json, &text)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_overflow() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("100m"), Ok(100 << 20));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999G").is_err());
    }
}
