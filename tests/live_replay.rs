//! `attach --replay` against `open` on the same data: a recording made from
//! a real snapshot (`live::synth::recording_of`) must give the same
//! `devices` report as the snapshot file itself.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use vramscope::trace::snapshot::import_file;

use common::real;

const FIXTURE: &str = "tests/fixtures/live/adam-step-synth.vslive";
const FIXTURE_SOURCE: &str = "adam-step_closed-trace_annotations.pickle";

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
}

fn json_of(args: &[&str]) -> Value {
    let out = bin().args(args).output().expect("run vramscope");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

fn recording_for(name: &str) -> PathBuf {
    let snap = import_file(&real(name)).expect("snapshot");
    let bytes = vramscope::live::synth::recording_of(&snap);
    let dir = std::env::temp_dir().join(format!("vramscope-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let path = dir.join(format!("{name}.vslive"));
    std::fs::write(&path, bytes).expect("write");
    path
}

/// Each device's report with the fields that legitimately differ taken out:
/// where the boundaries come from (annotations found by time in the file,
/// the job's own markers live) and the words built from them.
fn comparable(report: &Value) -> Vec<Value> {
    let mut devices = report["devices"].as_array().expect("devices").clone();
    for d in &mut devices {
        if let Some(l) = d.get_mut("leaks").and_then(Value::as_object_mut) {
            for k in [
                "boundary_source",
                "conclusion",
                "boundaries",
                "live_at_boundary",
            ] {
                l.remove(k);
            }
        }
    }
    devices
}

fn assert_same(name: &str, rec: &Path) {
    let file = real(name);
    let open = json_of(&["open", "--json", file.to_str().expect("utf-8")]);
    let live = json_of(&["attach", "--replay", rec.to_str().expect("utf-8"), "--json"]);
    assert_eq!(comparable(&live), comparable(&open), "{name}");
    assert_eq!(live["live"]["ended"], "the recording ends");
}

#[test]
fn replaying_the_committed_fixture_reports_what_open_reports() {
    assert_same(FIXTURE_SOURCE, Path::new(FIXTURE));
}

#[test]
fn the_committed_fixture_is_what_the_generator_makes() {
    let snap = import_file(&real(FIXTURE_SOURCE)).expect("snapshot");
    let made = vramscope::live::synth::recording_of(&snap);
    if std::env::var_os("VRAMSCOPE_REGENERATE_FIXTURES").is_some() {
        std::fs::write(FIXTURE, &made).expect("write fixture");
    }
    let committed =
        std::fs::read(FIXTURE).expect("fixture (VRAMSCOPE_REGENERATE_FIXTURES=1 writes it)");
    assert!(committed.len() <= 1 << 20, "the fixture stays under 1 MB");
    assert_eq!(
        committed, made,
        "regenerate with VRAMSCOPE_REGENERATE_FIXTURES=1"
    );
}

#[test]
fn closed_real_traces_replay_to_the_same_report() {
    for name in [
        "cs336-silmont_tiny-closed-trace_cpp-frames.pickle",
        "code-location_expandable_3gpu_oom.pickle",
    ] {
        assert_same(name, &recording_for(name));
    }
}
