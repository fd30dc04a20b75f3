//! `attach --replay` against `open` on the same data: a recording made from
//! a snapshot (`job::synth::recording_of`) must give the same `devices`
//! report as the snapshot file itself.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use vramscope::trace::snapshot::import_file;

use common::{capture, devices_without_boundaries, real, temp_dir, Scratch};

const FIXTURE: &str = "tests/fixtures/live/peak-inside-step-synth.vslive";
/// The project's H100 capture both recordings are made from.
const FIXTURE_SOURCE: &str = "peak_inside_step";
/// The same job as recorded by `python/vramscope_live` itself (poll
/// mode, the stand-in torch replaying the snapshot: python/tests/make_recording.py).
const HELPER_FIXTURE: &str = "tests/fixtures/live/peak-inside-step.vslive";

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

fn recording_for(file: &Path, dir: &Scratch) -> PathBuf {
    let snap = import_file(file).expect("snapshot");
    let bytes = vramscope::job::synth::recording_of(&snap);
    let name = file.file_name().expect("a file").to_string_lossy();
    let path = dir.join(format!("{name}.vslive"));
    std::fs::write(&path, bytes).expect("write");
    path
}

/// `rec` reports what `open` reports on snapshot `file`, but for the
/// entries the job made before the recording began (part of its start state).
fn assert_same(file: &Path, rec: &Path, before_start: u64) -> Value {
    let name = file.display();
    let mut open = json_of(&["open", "--json", file.to_str().expect("utf-8")]);
    let live = json_of(&["attach", "--replay", rec.to_str().expect("utf-8"), "--json"]);
    for d in open["devices"].as_array_mut().expect("devices") {
        let n = d["trace_entries"].as_u64().expect("trace_entries");
        d["trace_entries"] = (n - before_start).into();
    }
    assert_eq!(
        devices_without_boundaries(&live),
        devices_without_boundaries(&open),
        "{name}"
    );
    live
}

#[test]
fn replaying_the_committed_fixture_reports_what_open_reports() {
    let live = assert_same(&capture(FIXTURE_SOURCE), Path::new(FIXTURE), 0);
    assert_eq!(live["live"]["ended"], "the recording ends");
}

/// The Python helper's own recording of the job (its log, its steps, its
/// closing resync state and `bye`) reads back to the snapshot's report: the
/// two sides of the protocol agree.
#[test]
fn the_python_helper_s_recording_reports_what_open_reports() {
    // Three entries came before start() (tests/fixtures/live/README.md), and
    // the stand-in torch does not replay the capture's own `snapshot` marks.
    let source = capture(FIXTURE_SOURCE);
    let unseen = 3 + common::snapshot_marks(&source);
    let live = assert_same(&source, Path::new(HELPER_FIXTURE), unseen);
    let facts = &live["live"];
    assert_eq!(facts["mode"], "poll");
    assert_eq!(facts["stacks"], true);
    assert_eq!(facts["ended"], "the job finished");
    assert_eq!(facts["lost"], serde_json::json!([]));
    assert_eq!(facts["started_over"], serde_json::json!([]));
    // tests/fixtures/live/README.md: a mark_step, then the capture's three Optimizer.steps.
    assert_eq!(facts["steps_seen"], 4);
    assert_eq!(live["layout"], "Live");
    let conclusion = live["devices"][0]["leaks"]["conclusion"]
        .as_str()
        .expect("conclusion");
    assert!(
        conclusion.contains("delimited by the job's own steps")
            && !conclusion.contains("Pass a step marker"),
        "a live job is not told to add markers it already sends: {conclusion}"
    );
    let text = bin()
        .args(["attach", "--replay", HELPER_FIXTURE, "--headless"])
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.starts_with(&format!("{HELPER_FIXTURE} (a live job's stream)")),
        "{text}"
    );
}

#[test]
fn the_committed_fixture_is_what_the_generator_makes() {
    let snap = import_file(&capture(FIXTURE_SOURCE)).expect("snapshot");
    let made = vramscope::job::synth::recording_of(&snap);
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
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn closed_real_traces_replay_to_the_same_report() {
    for name in [
        "cs336-silmont_tiny-closed-trace_cpp-frames.pickle",
        "code-location_expandable_3gpu_oom.pickle",
    ] {
        let dir = temp_dir("live-replay");
        let file = real(name);
        let live = assert_same(&file, &recording_for(&file, &dir), 0);
        assert_eq!(live["live"]["ended"], "the recording ends");
    }
}

/// A job keeping 2 MiB more at every step: `attach --replay --json` flags
/// the line that keeps it, with its growth per step, within 20 steps; the
/// same job without the leak gets no finding.
#[test]
fn a_job_leaking_2_mib_a_step_is_flagged_by_the_line_that_keeps_it() {
    let dir = temp_dir("live-leak");
    let write = |name: &str, leak: u64| {
        let path = dir.join(name);
        let job = vramscope::job::synth::training_job(20, leak, 3).bytes;
        let mut rec = vramscope::job::MAGIC.to_vec();
        rec.extend_from_slice(&job);
        std::fs::write(&path, rec).expect("write");
        path
    };
    let leaking = write("leak.vslive", 2 << 20);
    let v = json_of(&[
        "attach",
        "--replay",
        leaking.to_str().expect("utf-8"),
        "--json",
    ]);
    let leaks = &v["devices"][0]["leaks"];
    let findings = leaks["findings"].as_array().expect("findings");
    let growth = |f: &Value| f["growth_per_iter"].as_u64();
    let kept = findings.iter().find(|f| {
        f["root"]
            .as_str()
            .is_some_and(|s| s.contains("train.py:41"))
    });
    let Some(kept) = kept else {
        panic!("train.py:41 is flagged: {leaks}");
    };
    assert_eq!(growth(kept), Some(2 << 20), "{kept}");
    // The job's own steps are training iterations: a warning, not the
    // "may be layers of one forward pass" caveat of found boundaries.
    assert_eq!(kept["severity"], "warning", "{kept}");
    assert!(
        !findings.iter().any(|f| f["root"]
            .as_str()
            .is_some_and(|s| s.contains("model.py:12"))),
        "the freed temporaries are no leak: {leaks}"
    );
    let clean = write("clean.vslive", 0);
    let v = json_of(&[
        "attach",
        "--replay",
        clean.to_str().expect("utf-8"),
        "--json",
    ]);
    assert_eq!(v["devices"][0]["leaks"]["findings"], serde_json::json!([]));
}

/// Past `--keep-entries` the view drops its history and starts over from
/// the job's map, and says so; the map stays right (the same reserved and
/// allocated as when everything is kept).
#[test]
fn past_the_entries_kept_the_history_starts_over_and_says_so() {
    let dir = temp_dir("live-keep");
    let path = dir.join("long.vslive");
    let mut rec = vramscope::job::MAGIC.to_vec();
    // 100 steps of 3 × 100 temporaries and 1 kept block: about 30,000 entries.
    rec.extend_from_slice(&vramscope::job::synth::training_job(100, 1 << 20, 100).bytes);
    std::fs::write(&path, rec).expect("write");
    let path = path.to_str().expect("utf-8");
    let all = json_of(&["attach", "--replay", path, "--json"]);
    let kept = json_of(&[
        "attach",
        "--replay",
        path,
        "--json",
        "--keep-entries",
        "10000",
    ]);
    assert_eq!(all["live"]["started_over"], serde_json::json!([]));
    let overs = kept["live"]["started_over"]
        .as_array()
        .expect("started_over");
    assert!((2..=3).contains(&overs.len()), "{overs:?}");
    assert!(
        overs[0]
            .as_str()
            .is_some_and(|w| w.contains("over the 10000 kept (attach --keep-entries)")),
        "{overs:?}"
    );
    for key in ["reserved", "allocated"] {
        assert_eq!(kept["devices"][0][key], all["devices"][0][key], "{key}");
    }
    assert!(
        kept["devices"][0]["trace_entries"].as_u64() < all["devices"][0]["trace_entries"].as_u64()
    );
}

/// The helper's `holders` messages travel in a recording: `attach --replay`
/// prints the chain that names the variable, and the JSON carries it (a
/// traced job: python/tests/make_holders_recording.py keeps six losses,
/// each with x and relu's result, 512 KiB each, in `self.history`).
#[test]
fn a_recording_names_the_variable_that_holds_what_grew() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/live/history-leak.vslive");
    let out = bin()
        .args([
            "attach",
            "--replay",
            path.to_str().expect("utf-8"),
            "--headless",
        ])
        .output()
        .expect("run vramscope");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(
            "in train: self.history (list, 6 items) → [5]: 0-dim tensor float32, \
             grad_fn=SumBackward0, its graph keeps 1024.00 KiB of saved tensors (+1.00 MiB since \
             the last look)"
        ),
        "{text}"
    );
    assert!(
        text.contains("fix: self.history.append(x.item())"),
        "{text}"
    );
    let json = json_of(&[
        "attach",
        "--replay",
        path.to_str().expect("utf-8"),
        "--json",
    ]);
    let holders = json["live"]["holders"].as_array().expect("holders");
    // A walk at every step after the first (the baseline).
    assert_eq!(holders.len(), 5, "{json}");
    let chain = &holders[4]["chains"][0];
    assert_eq!(chain["path"], serde_json::json!(["self", ".history"]));
    assert_eq!(chain["items"], 6);
    assert_eq!(chain["graph_bytes"], 6 * (1 << 20));
    // One more 0-dim float32 loss, and its graph's x and relu result.
    assert_eq!(chain["grew_bytes"], 4 + (1 << 20));
}
