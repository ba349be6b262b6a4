//! `fqdnd generate man|completions DIR` (hidden; the package build runs it): the man pages
//! (`fqdnd.1`, one per subcommand such as `fqdnd-gateway.1`) or the bash, zsh and fish
//! completions (`fqdnd.bash`, `_fqdnd`, `fqdnd.fish`), from the clap definition itself.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap_complete::Shell;

/// What to write.
#[derive(clap::ValueEnum, Clone, Copy)]
pub(crate) enum What {
    Man,
    Completions,
}

pub(crate) fn run(mut cmd: clap::Command, what: What, dir: &Path) -> Result<ExitCode> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let written = match what {
        What::Man => clap_mangen::generate_to(cmd, dir),
        What::Completions => [Shell::Bash, Shell::Zsh, Shell::Fish]
            .into_iter()
            .try_for_each(|shell| {
                clap_complete::generate_to(shell, &mut cmd, "fqdnd", dir).map(drop)
            }),
    };
    written.with_context(|| format!("writing into {}", dir.display()))?;
    Ok(ExitCode::SUCCESS)
}
