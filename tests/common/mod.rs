//! What the integration tests share: the real snapshots and the binary run
//! as a script runs it.

// Each test crate uses a part of this module.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

pub mod live_job;
mod real_snapshots;
mod scratch;
#[allow(unused_imports)] // each test crate uses a part of it
pub use real_snapshots::{real, real_dir};
#[allow(unused_imports)]
pub use scratch::{temp_dir, Scratch};

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

/// The `snapshot` marks in a file's device-0 trace (the capture program's own
/// `_snapshot()` calls): the stand-in torch of `python/tests` does not replay
/// them, it records its own as the helper asks.
pub fn snapshot_marks(file: &std::path::Path) -> u64 {
    let snap = vramscope::trace::snapshot::import_file(file).expect("a snapshot");
    snap.device_traces.first().map_or(0, |t| {
        t.iter()
            .filter(|e| e.action == vramscope::trace::snapshot::Action::Snapshot)
            .count() as u64
    })
}

/// One of the project's own H100 captures (`tests/fixtures/pytorch/captured/STEM.pickle`):
/// part of the repository, so tests on them run on a bare clone.
pub fn capture(stem: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pytorch/captured")
        .join(format!("{stem}.pickle"))
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
