//! What the integration tests share: the real snapshots and the binary run
//! as a script runs it.

// Each test crate uses a part of this module.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

pub mod live_job;
mod real_snapshots;
#[allow(unused_imports)] // each test crate uses a part of it
pub use real_snapshots::{real, real_dir};

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

/// A fresh directory under the system's temp dir for one test's files.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vramscope-tests-{tag}-{}", std::process::id()));
    // A run whose process had this id before left its files here.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A fresh directory removed when it is dropped (panics included): the
/// scratch of one test, leaving nothing in the temp dir.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        Scratch(temp_dir(tag))
    }
}

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A small scenario that loads and runs: tests derive broken ones from it.
pub const VALID: &str = r#"Scenario(
    name: "ok",
    description: "a valid file",
    device: (name: "sim", capacity: "1GiB", overhead: "100MiB"),
    model: Preset("mlp-mnist"),
    steps: [
        ZeroGrad(set_to_none: true),
        LoadBatch(x: "x", y: "y"),
        Forward(input: "x", output: "out"),
        Loss(output: "out", target: "y", into: "loss"),
        Backward(loss: "loss", retain_graph: false),
        OptimizerStep,
    ],
    iterations: 3,
    expect: [AllocatedFlat, NoOom],
)
"#;

/// The crate's `scenarios/` folder.
pub fn scenarios_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// A live report's devices beside `open --json`'s: with the fields that
/// legitimately differ taken out (where the iteration boundaries come from:
/// annotations found by time in a file, the job's own step markers live,
/// and what is derived from them).
pub fn devices_without_boundaries(report: &serde_json::Value) -> Vec<serde_json::Value> {
    let mut devices = report["devices"].as_array().cloned().unwrap_or_default();
    for d in &mut devices {
        if let Some(l) = d
            .get_mut("leaks")
            .and_then(serde_json::Value::as_object_mut)
        {
            for k in [
                "boundary_source",
                "conclusion",
                "boundaries",
                "live_at_boundary",
                // Whether a backward ran between the first and last boundary.
                "backward_seen",
            ] {
                l.remove(k);
            }
        }
    }
    devices
}
