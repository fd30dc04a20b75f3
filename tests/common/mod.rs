//! What the integration tests share: the real snapshots and the binary run
//! as a script runs it.

// Each test crate uses a part of this module.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A file of `../shared/snapshots/real`.
pub fn real(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/snapshots/real");
    let dir = if dir.exists() {
        dir
    } else {
        PathBuf::from("/work/shared/snapshots/real")
    };
    dir.join(name)
}

/// `vramscope ARGS` with no terminal: (exit status, stdout, stderr).
pub fn vramscope(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("vramscope runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}
