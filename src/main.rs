//! The `vramscope` command line: parses arguments and hands over to the library.
#![deny(clippy::unwrap_used)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

/// `print!` for text that may hold an input's bytes (a frame name, a file
/// name, a scenario's narration): control characters are shown escaped,
/// never sent to the terminal (`units::escape_controls`).
macro_rules! say {
    ($($arg:tt)*) => {
        print!("{}", vramscope::units::escape_controls(&format!($($arg)*)))
    };
}

/// [`say!`] with a newline.
macro_rules! sayln {
    ($($arg:tt)*) => {
        println!("{}", vramscope::units::escape_controls(&format!($($arg)*)))
    };
}

/// A value as pretty JSON on stdout, every control character escaped (serde
/// leaves DEL and C1 raw).
macro_rules! sayjson {
    ($value:expr) => {
        println!(
            "{}",
            vramscope::units::escape_json_controls(serde_json::to_string_pretty($value)?)
        )
    };
}

/// `eprintln!` with control characters escaped, as [`say!`].
macro_rules! warn {
    ($($arg:tt)*) => {
        eprintln!("{}", vramscope::units::escape_controls(&format!($($arg)*)))
    };
}

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    end_quietly_on_closed_pipe();
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            warn!("vramscope: {err:#}");
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
