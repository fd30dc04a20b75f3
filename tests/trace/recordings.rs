//! What a trace keeps and replays: the recording and its export, saved
//! requests replayed here and elsewhere, sweeps (a program's own and the
//! loss sweep's H100 table), the requests a live H100 run made, and the
//! shipped traced recordings.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::{common, python, trace, traced_json, Scratch, MLP};

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_recording_replays_to_the_same_figures_and_the_export_opens() {
    let s = Scratch::new("record");
    let prog = s.file("mlp.py", MLP);
    let rec = s.0.join("run.vslive");
    let pickle = s.0.join("run.pickle");
    let (r, e) = (
        rec.to_string_lossy().into_owned(),
        pickle.to_string_lossy().into_owned(),
    );
    let (v, _) = traced_json(&prog, &["--steps", "0", "--record", &r, "--export", &e]);
    let (code, out, err) = common::vramscope(&["attach", "--replay", &r, "--json"]);
    assert_eq!(code, 0, "{err}");
    let replay = common::json(&out);
    assert_eq!(replay["live"]["mode"], "trace");
    for key in ["allocated", "reserved", "trace_entries"] {
        assert_eq!(replay["devices"][0][key], v["devices"][0][key], "{key}");
    }
    let (code, out, err) = common::vramscope(&["open", &e, "--json"]);
    assert_eq!(code, 0, "{err}");
    let opened = common::json(&out);
    assert_eq!(
        opened["devices"][0]["trace_entries"], v["devices"][0]["trace_entries"],
        "the export holds the whole trace"
    );
}
const BIG: &str = r#"
import torch
x = torch.empty(30 << 28, device="cuda")  # 30 GiB of fp32
print("BIG", torch.cuda.max_memory_allocated())
"#;
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn saved_requests_replay_to_the_same_figures_and_elsewhere_say_where_they_part() {
    let s = Scratch::new("replay");
    let prog = s.file("mlp.py", MLP);
    let saved = s.0.join("mlp.vsreqs");
    let saved_s = saved.to_string_lossy().into_owned();
    let (live, _) = traced_json(&prog, &["--steps", "0", "--save-requests", &saved_s]);
    // The same GPU and config: the same run, request for request.
    let (code, out, err) = common::vramscope(&["trace", "--from", &saved_s, "--json"]);
    assert!(code == 0 || code == 1, "exit {code}: {err}");
    let again = common::json(&out);
    for key in ["peak_allocated", "peak_reserved"] {
        assert_eq!(again[key], live[key], "{key}");
    }
    assert_eq!(again["trace"]["ooms"], live["trace"]["ooms"]);
    assert!(again["trace"]["replay"]["stopped"].is_null());
    assert_eq!(again["trace"]["replay"]["answers_differ"], 0);
    // Another allocator config: the requests are the program's, the
    // segments the config's.
    let (_, out, _) = common::vramscope(&[
        "trace",
        "--from",
        &saved_s,
        "--json",
        "--conf",
        "expandable_segments:True",
    ]);
    let expandable = common::json(&out);
    assert_eq!(
        expandable["trace"]["alloc_conf"],
        "expandable_segments:True"
    );
    assert_eq!(
        expandable["trace"]["allocations"],
        live["trace"]["allocations"]
    );
    // An A100: PyTorch's own cuBLAS workspace is 4 MiB there, 32 MiB on
    // Hopper, and the program saw the H100's properties: said.
    let (_, out, _) = common::vramscope(&[
        "trace",
        "--from",
        &saved_s,
        "--json",
        "--gpu",
        "A100-SXM-80GB",
    ]);
    let a100 = common::json(&out);
    assert!(
        a100["peak_allocated"].as_u64() < live["peak_allocated"].as_u64(),
        "{} against {}",
        a100["peak_allocated"],
        live["peak_allocated"]
    );
    let notes = a100["trace"]["replay"]["notes"].to_string();
    assert!(notes.contains("H100-SXM-80GB"), "{notes}");
    // A program whose 30 GiB fit the H100 but not a T4: the replay stops
    // where the program would have met its OOM.
    let big = s.file("big.py", BIG);
    let big_saved = s.0.join("big.vsreqs").to_string_lossy().into_owned();
    let (ok, _) = traced_json(&big, &["--steps", "0", "--save-requests", &big_saved]);
    assert_eq!(ok["trace"]["ooms"], 0);
    let (_, out, _) = common::vramscope(&["trace", "--from", &big_saved, "--json", "--gpu", "T4"]);
    let t4 = common::json(&out);
    let stopped = t4["trace"]["replay"]["stopped"].as_str().expect("stopped");
    assert!(stopped.contains("ran out of memory"), "{stopped}");
    assert!(stopped.contains("big.py:3"), "{stopped}");
}
const SIZED: &str = r#"
import sys, torch, torch.nn as nn
bs = int(sys.argv[1])
model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(2):
    model(torch.randn(bs, 1024, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
"#;
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_sweep_traces_the_program_at_each_value_and_fits_a_line() {
    let s = Scratch::new("sweep");
    let prog = s.file("sized.py", SIZED);
    let py = python();
    let prog_s = prog.to_string_lossy().into_owned();
    let (code, out, err) = common::vramscope(&[
        "trace",
        "--json",
        "--steps",
        "0",
        "--sweep",
        "BATCH=256,512,1024",
        "--",
        &py,
        &prog_s,
        "{BATCH}",
    ]);
    assert_eq!(code, 0, "{err}");
    let v = common::json(&out);
    let points = v["points"].as_array().expect("points");
    let peaks: Vec<u64> = points
        .iter()
        .map(|p| p["peak_allocated"].as_u64().expect("a peak"))
        .collect();
    assert_eq!(points.len(), 3);
    assert!(peaks.windows(2).all(|w| w[0] < w[1]), "{peaks:?}");
    // The activations of a [B, 4096] hidden layer: the slope per sample is
    // at least one fp32 row of it.
    let slope = v["fits"][0]["allocated"]["slope"]
        .as_f64()
        .expect("a slope");
    assert!(slope >= 4096.0 * 4.0, "{slope}");
    // A point is the program's own trace at that value.
    let (code, out, err) = trace(&["--json", "--steps", "0"], &prog, &["512"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        common::json(&out)["peak_allocated"],
        points[1]["peak_allocated"]
    );
}
/// Live against traced (issue 38): `python/gpu/holders_job.py` ran for
/// real on an H100 under `python -m vramscope_live --record`
/// (tests/fixtures/live/holders-job-h100-agent.vslive); traced on the CPU,
/// the same program makes the same requests: the same growth at every step,
/// the job's own `memory_stats()` at each step, and the same map at the end.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_traced_program_makes_the_requests_its_live_run_made_on_an_h100() {
    let program = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/gpu/holders_job.py");
    let (traced, err) = traced_json(&program, &["--steps", "100"]);
    assert_eq!(traced["trace"]["steps"], 10, "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "attach",
            "--replay",
            "tests/fixtures/live/holders-job-h100-agent.vslive",
            "--json",
        ])
        .output()
        .expect("vramscope runs");
    assert!(out.status.success());
    let live = common::json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(traced["live"]["growth"], live["live"]["growth"]);
    assert_eq!(
        traced["live"]["memory_per_step"],
        live["live"]["memory_per_step"]
    );
    for key in [
        "allocated",
        "reserved",
        "segments",
        "active_allocated",
        "inactive",
        "largest_free_block",
    ] {
        assert_eq!(
            traced["devices"][0][key], live["devices"][0][key],
            "{key} at the end"
        );
    }
}
/// `attach --replay FILE --json`.
fn replayed(file: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["attach", "--replay"])
        .arg(file)
        .arg("--json")
        .output()
        .expect("vramscope runs");
    assert!(
        out.status.success(),
        "{}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    common::json(&String::from_utf8_lossy(&out.stdout))
}
/// A replay's facts that do not depend on the clock: the holder walks
/// without the time each took, growth, the job's stats per step, OOMs,
/// and the map at the end.
fn timeless(v: &Value) -> Value {
    let mut walks = v["live"]["holders"].clone();
    for w in walks.as_array_mut().into_iter().flatten() {
        if let Some(o) = w.as_object_mut() {
            o.remove("spent_ms");
        }
    }
    let ooms: Vec<Value> = v["live"]["ooms"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| serde_json::json!([o["alloc_size"], o["pytorch_message"]]))
        .collect();
    let d = &v["devices"][0];
    serde_json::json!({
        "holders": walks,
        "growth": v["live"]["growth"],
        "memory_per_step": v["live"]["memory_per_step"],
        "steps_seen": v["live"]["steps_seen"],
        "ooms": ooms,
        "end": [d["allocated"], d["reserved"], d["segments"], d["largest_free_block"]],
    })
}
/// The traced recordings tests/fixtures/trace/*.vslive (read without torch
/// by tests/live_real_gpu.rs) are what `vramscope trace --record` makes of
/// their programs now: the same holder walks (the time each took aside),
/// growth, stats, OOMs and end. `VRAMSCOPE_REGENERATE_FIXTURES=1` writes
/// them again.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn the_shipped_traced_recordings_are_what_the_trace_records_now() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let regenerate = std::env::var_os("VRAMSCOPE_REGENERATE_FIXTURES").is_some();
    for (program, fixture) in [
        (
            "python/gpu/holders_job.py",
            "tests/fixtures/trace/holders-job.vslive",
        ),
        (
            "python/gpu/oom_holders_job.py",
            "tests/fixtures/trace/oom-holders-job.vslive",
        ),
    ] {
        let dir = Scratch::new("holders");
        let rec = dir.0.join("run.vslive");
        let rec_arg = rec.to_str().expect("a utf-8 path");
        let (code, _, err) = trace(
            &["--steps", "0", "--headless", "--record", rec_arg],
            &root.join(program),
            &[],
        );
        assert!(code == 0 || code == 1, "{program}: exit {code}: {err}");
        if regenerate {
            std::fs::copy(&rec, root.join(fixture)).expect("the fixture is written");
            continue;
        }
        assert_eq!(
            timeless(&replayed(&rec)),
            timeless(&replayed(&root.join(fixture))),
            "{program} against {fixture}"
        );
    }
}
/// tests/fixtures/loss/loss_sweep.py measures itself with
/// `torch.cuda.memory._record_memory_history` around each call (off in
/// between, which clears PyTorch's buffer) and ran on an H100
/// (h100_sweep.tsv). Traced on the CPU it writes the same table: the
/// program's own snapshots hold what PyTorch's would, the losses whose
/// CUDA kernels take buffers meta does not show (mse_loss's and
/// binary_cross_entropy_with_logits' forwards) are planned as on the H100,
/// and BCE with logits' backward takes its formula's in-place CUDA branch.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn the_loss_sweep_traced_writes_the_h100s_table() {
    let s = Scratch::new("loss-sweep");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/loss");
    let out = s.0.join("traced.tsv");
    let out_arg = out.to_string_lossy().into_owned();
    let (code, _, err) = trace(
        &["--headless", "--steps", "0"],
        &fixtures.join("loss_sweep.py"),
        &[&out_arg],
    );
    assert_eq!(code, 0, "{err}");
    let rows = |p: &Path| -> Vec<String> {
        std::fs::read_to_string(p)
            .expect("a table")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(String::from)
            .collect()
    };
    let (h100, traced) = (rows(&fixtures.join("h100_sweep.tsv")), rows(&out));
    assert_eq!(h100.len(), traced.len());
    // Every row, BCE with logits' backward too: its formula's CUDA branch
    // (in place; the dispatch mode would make it take the out-of-place one).
    for (want, got) in h100.iter().zip(&traced) {
        assert_eq!(got, want);
    }
}
