//! The `vramscope` command line: parses arguments and hands over to the library.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("vramscope: {err:#}");
            ExitCode::from(cli::EXIT_BAD_INPUT)
        }
    }
}
