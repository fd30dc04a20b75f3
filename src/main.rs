//! The `vramscope` command line: parses arguments and hands over to the library.
#![deny(clippy::unwrap_used)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    end_quietly_on_closed_pipe();
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("vramscope: {err:#}");
            ExitCode::from(cli::EXIT_BAD_INPUT)
        }
    }
}

/// `vramscope scenarios | head`: Rust ignores SIGPIPE, so the next print to
/// the closed pipe would panic. With the default action back, the process
/// ends quietly there, as a Unix filter does.
#[cfg(unix)]
fn end_quietly_on_closed_pipe() {
    // SAFETY: first thing in `main`, before any other thread exists, and
    // SIG_DFL is always a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn end_quietly_on_closed_pipe() {}
