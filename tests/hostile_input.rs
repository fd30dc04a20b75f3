//! Input an adversary writes, through the binary as a user runs it: each
//! gets a clear refusal (exit 2, the file and position or the argument) or
//! a bounded run, never a signal, a hang, a blow-up, a replaced file or a
//! control byte on the terminal. The shared helpers are here, the tests by
//! subject in tests/hostile_input/ (what a run reads, snapshots and
//! exports).

mod common;
#[path = "hostile_input/run_files.rs"]
mod run_files;
#[path = "hostile_input/snapshots.rs"]
mod snapshots;

use common::{temp_dir, vramscope, VALID};

/// `VALID` with its loop replaced by `steps`.
fn with_steps(steps: &str) -> String {
    let start = VALID.find("    steps: [").expect("VALID has steps");
    let end = VALID[start..].find("    ],\n").expect("steps end") + start + "    ],\n".len();
    format!(
        "{}    steps: [\n{steps}\n    ],\n{}",
        &VALID[..start],
        &VALID[end..]
    )
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path.to_str().expect("utf-8").to_string()
}

#[cfg(unix)]
fn mkfifo(path: &std::path::Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(status.success());
}

/// `tests/fixtures/hostile/`: inputs that once crashed, hung or spoke to the
/// terminal (`make.py` writes the pickles).
fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hostile")
        .join(name);
    path.to_str().expect("utf-8").to_string()
}

/// No byte that drives a terminal: control characters other than newline
/// and tab (C0, DEL and C1).
fn assert_no_controls(what: &str, text: &str) {
    let bad: Vec<char> = text
        .chars()
        .filter(|c| c.is_control() && *c != '\n' && *c != '\t')
        .collect();
    assert!(bad.is_empty(), "{what}: {bad:?} in\n{text}");
}
