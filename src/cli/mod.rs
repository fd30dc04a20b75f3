//! Subcommands. Each returns the process exit status: 0 success, 1 the
//! run's own expectations failed, 2 bad input, 3 no GPU driver.

mod demo;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub const EXIT_BAD_INPUT: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "vramscope",
    version,
    about = "Where GPU memory goes in a PyTorch training loop, and who leaks it"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Walk through PyTorch's caching allocator on a 100 MiB device: splits,
    /// merges, a fragmentation OOM and what empty_cache() releases.
    Demo {
        /// PYTORCH_CUDA_ALLOC_CONF for the walkthrough, e.g. "expandable_segments:True".
        #[arg(long, default_value = "")]
        conf: String,
    },
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        None => demo::run(""),
        Some(Command::Demo { conf }) => demo::run(&conf),
    }
}
