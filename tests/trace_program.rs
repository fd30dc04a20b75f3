//! `vramscope trace` on real PyTorch (issue 38): small programs written
//! here, and every capture program of tests/fixtures/pytorch against the
//! H100 figures it recorded (`captures`). They need PyTorch in the Python
//! they run (`VRAMSCOPE_PYTHON`, else `python3`): ignored by default, run
//! by CI with `cargo test --test trace_program -- --ignored` after
//! `pip install torch==2.11.*`; a missing torch fails them, saying so.

#[path = "trace/captures.rs"]
mod captures;
mod common;
#[path = "trace/hf_families.rs"]
mod hf_families;
#[path = "trace/known_values.rs"]
mod known_values;
#[path = "trace/qlora.rs"]
mod qlora;
#[path = "trace/scenario_requests.rs"]
mod scenario_requests;
#[path = "trace/stack_lines.rs"]
mod stack_lines;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

pub const NEEDS_TORCH: &str = "needs PyTorch (pip install torch==2.11.*)";

/// A scratch folder removed on drop.
pub struct Scratch(pub common::Scratch);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        Scratch(common::temp_dir(&format!("trace-{tag}")))
    }
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("scratch file");
        p
    }
}

/// The Python with PyTorch, or a failure saying what to install.
pub fn python() -> String {
    python_that_runs(
        "import torch",
        "install torch (pip install torch==2.11.*), or point VRAMSCOPE_PYTHON at a Python that has it",
    )
}

/// `$VRAMSCOPE_PYTHON` (else python3) when it runs `code` successfully;
/// otherwise the test fails, saying what to do (`install`).
pub fn python_that_runs(code: &str, install: &str) -> String {
    let py = std::env::var("VRAMSCOPE_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", code])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "`{py} -c '{code}'` failed: {install}");
    py
}

/// `vramscope trace ARGS -- python PROGRAM PROGRAM_ARGS`: (status, stdout, stderr).
pub fn trace(args: &[&str], program: &Path, program_args: &[&str]) -> (i32, String, String) {
    let py = python();
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .arg("trace")
        .args(args)
        .arg("--")
        .arg(&py)
        .arg(program)
        .args(program_args)
        .stdin(Stdio::null())
        .output()
        .expect("vramscope runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn traced_json(program: &Path, extra: &[&str]) -> (Value, String) {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let (code, out, err) = trace(&args, program, &[]);
    assert!(code == 0 || code == 1, "exit {code}: {err}");
    (common::json(&out), err)
}

const MLP: &str = r#"
import json, torch, torch.nn as nn
assert torch.cuda.is_available()
props = torch.cuda.get_device_properties(0)
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for it in range(4):
    opt.zero_grad(set_to_none=True)
    x = torch.randn(256, 784, device="cuda")
    y = torch.randint(0, 10, (256,)).to("cuda")
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
seen = {"peak": torch.cuda.max_memory_allocated(), "reserved_peak": torch.cuda.max_memory_reserved(),
        "allocated": torch.cuda.memory_allocated(), "device": str(x.device), "is_cuda": x.is_cuda,
        "item": loss.item(), "name": torch.cuda.get_device_name(0), "total": props.total_memory,
        "stats_peak": torch.cuda.memory_stats()["allocated_bytes.all.peak"]}
torch.cuda.set_per_process_memory_fraction(0.01)
try:
    big = torch.empty(1 << 30, device="cuda")
    seen["oom"] = None
except torch.cuda.OutOfMemoryError as e:
    seen["oom"] = str(e)
print("SEEN " + json.dumps(seen))
"#;

fn seen(stderr: &str) -> Value {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("SEEN "))
        .unwrap_or_else(|| panic!("the program printed nothing: {stderr}"));
    common::json(line)
}

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_program_sees_the_simulated_gpu_and_its_own_questions_are_answered_by_it() {
    let s = Scratch::new("mlp");
    let prog = s.file("mlp.py", MLP);
    let (v, err) = traced_json(&prog, &["--steps", "0"]);
    let seen = seen(&err);
    assert_eq!(seen["device"], "cuda:0");
    assert_eq!(seen["is_cuda"], true);
    assert_eq!(seen["item"], 0.0, "no data on the simulated GPU: zeros");
    assert_eq!(seen["name"], "NVIDIA H100 80GB HBM3");
    assert_eq!(seen["total"], 85_017_493_504u64);
    // What the program asked is what vramscope reports.
    assert_eq!(v["peak_allocated"], seen["peak"]);
    assert_eq!(v["peak_allocated"], seen["stats_peak"]);
    assert_eq!(v["peak_reserved"], seen["reserved_peak"]);
    assert_eq!(v["trace"]["steps"], 4);
    // The OOM was raised in the program with PyTorch's message, and caught there.
    let oom = seen["oom"].as_str().expect("an OOM");
    assert!(
        oom.starts_with("CUDA out of memory. Tried to allocate 4.00 GiB."),
        "{oom}"
    );
    assert_eq!(v["trace"]["ooms"], 1);
    assert_eq!(v["live"]["ooms"][0]["pytorch_message"], oom);
    // The report's by-line view names the program's own lines.
    let text = v.to_string();
    assert!(text.contains("mlp.py"), "the program's lines in the report");
}

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn the_trace_stops_after_the_steps_asked() {
    let s = Scratch::new("steps");
    let prog = s.file(
        "loop.py",
        "import torch\nw = torch.nn.Linear(64, 64).cuda()\nopt = torch.optim.AdamW(w.parameters())\n\
         for i in range(1000):\n    w(torch.randn(8, 64, device='cuda')).sum().backward()\n    opt.step()\n\
         raise SystemExit('the loop ran to its end')\n",
    );
    let (v, _) = traced_json(&prog, &["--steps", "2"]);
    assert_eq!(v["trace"]["steps"], 2);
    let ended = v["trace"]["ended"].as_str().expect("why it ended");
    assert!(ended.contains("stopped after 2 optimizer steps"), "{ended}");
    assert_eq!(v["trace"]["exit_status"], 0);
}

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

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_workspace_that_no_longer_fits_after_a_clear_is_the_programs_oom() {
    // `_cuda_clearCublasWorkspaces` (and the cache emptied) means the next
    // GEMM takes its workspace again; where that does not fit, the program
    // gets its OOM at that line (a GEMM sent without waiting could not).
    let s = Scratch::new("clear-ws");
    let prog = s.file(
        "ws.py",
        "import torch\na = torch.randn(512, 512, device='cuda')\nb = torch.randn(512, 512, device='cuda')\n\
         for _ in range(3):\n    c = a @ b\ndel c\ntorch._C._cuda_clearCublasWorkspaces()\n\
         torch.cuda.empty_cache()\n\
         torch.cuda.set_per_process_memory_fraction(24 * 2**20 / torch.cuda.get_device_properties(0).total_memory)\n\
         try:\n    c = a @ b\n    print('NO OOM')\nexcept torch.cuda.OutOfMemoryError as e:\n    print('CAUGHT', e)\n",
    );
    let (v, err) = traced_json(&prog, &["--steps", "0"]);
    assert!(err.contains("CAUGHT CUDA out of memory"), "{err}");
    assert_eq!(v["trace"]["ooms"], 1, "{v}");
    let untraced = v["trace"]["untraced"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !untraced
            .iter()
            .any(|u| u.to_string().contains("sent without waiting")),
        "{untraced:?}"
    );
}

/// An op whose output size depends on the data runs with a size vramscope
/// assumes, named with its line and the assumption (`trace.assumed`): a
/// mask that is no router's counts as all true. An op meta has no kernel
/// for (`unique`) is named untraced with its line, and the program gets
/// `NotImplementedError`.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn an_op_that_needs_data_is_named_with_its_line() {
    let s = Scratch::new("nonzero");
    let prog = s.file(
        "nz.py",
        "import torch\nx = torch.randn(100, device='cuda')\nidx = torch.nonzero(x > 0)\n\
         print('ROWS', idx.shape[0])\ntry:\n    u = torch.unique(x)\n\
         except NotImplementedError as e:\n    print('CAUGHT', e)\n",
    );
    let (v, err) = traced_json(&prog, &["--steps", "0"]);
    assert!(err.contains("ROWS 100"), "every element true: {err}");
    let a = &v["trace"]["assumed"][0];
    assert_eq!(a["what"], "aten.nonzero", "{a}");
    assert!(
        a["at"].as_str().is_some_and(|at| at.contains("nz.py:3")),
        "{a}"
    );
    assert!(
        a["assumption"]
            .as_str()
            .is_some_and(|w| w.contains("upper bound")),
        "{a}"
    );
    assert!(
        err.contains("CAUGHT vramscope trace: aten._unique2"),
        "{err}"
    );
    let u = &v["trace"]["untraced"][0];
    assert!(
        u["what"].as_str().is_some_and(|w| w.contains("unique")),
        "{u}"
    );
    assert!(
        u["at"].as_str().is_some_and(|at| at.contains("nz.py:6")),
        "{u}"
    );
}

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_program_that_never_imports_torch_is_said_to_be_untraced() {
    let s = Scratch::new("notorch");
    let prog = s.file("hello.py", "print('hello')\n");
    let (code, out, _) = trace(&["--headless"], &prog, &[]);
    assert_eq!(code, 2);
    assert!(out.contains("nothing was traced"), "{out}");
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

const CHECKPOINTED_GRAD: &str = r#"
import torch, torch.nn as nn
from torch.utils.checkpoint import checkpoint
layer = nn.Linear(256, 256).cuda()
x = torch.randn(64, 256, device="cuda", requires_grad=True)
y = checkpoint(layer, x, use_reentrant=False).sum()
(gx,) = torch.autograd.grad(y, x)
print("GRAD", gx.device, tuple(gx.shape))
compiled = torch.compile(layer)
print("COMPILED", compiled is layer)
"#;

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn autograd_grad_recomputes_on_the_simulated_gpu_and_compile_runs_eagerly() {
    let s = Scratch::new("grad");
    let prog = s.file("grad.py", CHECKPOINTED_GRAD);
    let (v, err) = traced_json(&prog, &["--steps", "0"]);
    assert!(err.contains("GRAD cuda:0 (64, 256)"), "{err}");
    assert!(err.contains("COMPILED True"), "{err}");
    let untraced = v["trace"]["untraced"].to_string();
    assert!(untraced.contains("torch.compile"), "said: {untraced}");
    assert!(untraced.contains("eagerly"), "{untraced}");
}

/// A backward called inside `torch.autocast` runs under it (the engine
/// carries the caller's thread-local state): AddBackward0's `sum_to` of a
/// half bias gradient is a `sum`, on autocast's fp32_set_opt_dtype list, so
/// it sums into fp32 (16 KiB for 4,096 elements) and validate_outputs casts
/// it back to half (8 KiB). Called after the region, the sum stays half.
/// (autocast_around_loop_bug's H100 capture has both.)
const BACKWARD_UNDER_AUTOCAST: &str = r#"
import json, torch
x = torch.zeros(256, 4096, device="cuda", dtype=torch.half, requires_grad=True)
b = torch.zeros(4096, device="cuda", dtype=torch.half, requires_grad=True)
torch.cuda.memory._record_memory_history()
def backward_allocations(inside):
    x.grad = b.grad = None
    start = len(torch.cuda.memory._snapshot()["device_traces"][0])
    with torch.autocast("cuda", dtype=torch.float16):
        loss = (x + b).sum()
        if inside:
            loss.backward()
    if not inside:
        loss.backward()
    trace = torch.cuda.memory._snapshot()["device_traces"][0][start:]
    return {"sizes": [e["size"] for e in trace if e["action"] == "alloc"], "grad": str(b.grad.dtype)}
print("SEEN " + json.dumps({"inside": backward_allocations(True), "outside": backward_allocations(False)}))
"#;

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_backward_called_inside_autocast_runs_under_it() {
    let s = Scratch::new("bwautocast");
    let prog = s.file("bw.py", BACKWARD_UNDER_AUTOCAST);
    let (_, err) = traced_json(&prog, &["--steps", "0"]);
    let seen = seen(&err);
    let sizes = |k: &str| -> Vec<u64> {
        seen[k]["sizes"]
            .as_array()
            .unwrap_or_else(|| panic!("{k}: {seen}"))
            .iter()
            .filter_map(Value::as_u64)
            .collect()
    };
    let (inside, outside) = (sizes("inside"), sizes("outside"));
    // The bias gradient: 4,096 fp32 sums, then their half cast.
    let fp32_sum = inside.windows(2).any(|w| w == [16_384, 8_192]);
    assert!(fp32_sum, "inside autocast: {inside:?}");
    assert!(!outside.contains(&16_384), "after autocast: {outside:?}");
    assert_eq!(inside.len(), outside.len() + 1, "{inside:?} / {outside:?}");
    for k in ["inside", "outside"] {
        assert_eq!(seen[k]["grad"], "torch.float16", "{k}");
    }
}

const CONV_AND_LSTM: &str = r#"
import torch, torch.nn as nn
conv = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()).cuda()
conv(torch.randn(4, 3, 32, 32, device="cuda")).sum().backward()
lstm = nn.LSTM(32, 64, 2, dropout=0.1).cuda()
out, _ = lstm(torch.randn(10, 4, 32, device="cuda"))
out.sum().backward()
print("NODE", type(out.grad_fn).__name__)
"#;

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn cudnn_layers_run_cudnn_s_path_and_unmeasured_sizes_are_named_estimates() {
    let s = Scratch::new("cudnn");
    let prog = s.file("cudnn.py", CONV_AND_LSTM);
    let (v, err) = traced_json(&prog, &["--steps", "0"]);
    assert!(err.contains("NODE CudnnRnnBackward0"), "{err}");
    let estimates = v["trace"]["estimates"].as_array().expect("estimates");
    let said = v["trace"]["estimates"].to_string();
    assert!(said.contains("convolution"), "{said}");
    assert!(said.contains("RNN workspace"), "{said}");
    // The dropout state is measured per GPU (the H100's), whatever the shape.
    assert!(!said.contains("dropout state"), "{said}");
    assert!(estimates.iter().all(|e| e["calls"].as_u64() >= Some(1)));
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

/// `--holders-budget` is milliseconds, 0 or more; refused before anything runs.
#[test]
fn a_holder_budget_that_is_no_time_is_refused() {
    for bad in ["-1", "NaN", "inf"] {
        let (code, _, err) = common::vramscope(&[
            "trace",
            &format!("--holders-budget={bad}"),
            "--",
            "python3",
            "-c",
            "pass",
        ]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains("--holders-budget"), "{bad}: {err}");
    }
}

/// `--holders-budget 0`: the program runs as before, and no walk is made.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_holder_budget_of_zero_makes_no_walk() {
    let program = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/gpu/holders_job.py");
    let (off, err) = traced_json(&program, &["--steps", "4", "--holders-budget", "0"]);
    assert_eq!(off["trace"]["steps"], 4, "{err}");
    assert_eq!(off["live"]["holders"], serde_json::json!([]), "{err}");
    let (on, err) = traced_json(&program, &["--steps", "4"]);
    assert_eq!(
        on["live"]["holders"].as_array().map(Vec::len),
        Some(3),
        "{err}"
    );
    assert_eq!(on["live"]["growth"], off["live"]["growth"]);
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

/// An extension op (bitsandbytes' way: `torch.library.define`, a fake
/// kernel, a CUDA kernel written in Python that allocates through torch and
/// then calls native code through ctypes) runs its CUDA kernel on the
/// simulated GPU: its scratch is counted (the fake kernel shows only the
/// output) and its native call is skipped (here `abort()`: had it run, the
/// program would have died). The program's own meta device (transformers'
/// deferred init) holds no GPU memory and stays `meta`; `torch.tensor(…,
/// device="cuda")` is counted as it is made. A kernel that needs what the
/// simulation has not is named and its fake kernel runs instead.
const EXTENSION_OP: &str = r#"
import ctypes, json, torch
torch.library.define("vstest::scale", "(Tensor a) -> Tensor")

@torch.library.register_fake("vstest::scale")
def _(a):
    return torch.empty_like(a)

libc = ctypes.CDLL(None)

@torch.library.register_kernel("vstest::scale", "cuda")
def _(a):
    scratch = torch.empty(1 << 20, dtype=torch.uint8, device=a.device)
    out = torch.empty_like(a)
    libc.abort()
    return out

seen = {}
with torch.device("meta"):
    big = torch.nn.Linear(8192, 8192)
seen["own_device"] = str(big.weight.device)
seen["own_bytes"] = torch.cuda.memory_allocated()
a = torch.empty(1 << 18, device="cuda")
torch.cuda.reset_peak_memory_stats()
b = torch.ops.vstest.scale(a)
seen["peak"] = torch.cuda.max_memory_allocated()
seen["after"] = torch.cuda.memory_allocated()
code = torch.tensor([1.0, 2.0, 3.0, 4.0], device="cuda")
seen["tensor"] = torch.cuda.memory_allocated() - seen["after"]
seen["device"] = str(code.device)
print("SEEN " + json.dumps(seen))

torch.library.define("vstest::asks_more", "(Tensor a) -> Tensor")

@torch.library.register_fake("vstest::asks_more")
def _(a):
    return torch.empty_like(a)

@torch.library.register_kernel("vstest::asks_more", "cuda")
def _(a):
    torch.cuda.get_device_properties(0).not_simulated
    return torch.empty_like(a)

c = torch.ops.vstest.asks_more(a)
"#;

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn an_extensions_cuda_kernel_runs_on_the_simulated_gpu_and_the_programs_meta_is_its_own() {
    let s = Scratch::new("extension");
    let prog = s.file("extension.py", EXTENSION_OP);
    let (v, err) = traced_json(&prog, &["--steps", "0"]);
    let seen = seen(&err);
    const MIB: u64 = 1 << 20;
    // A kernel that asks for what the simulation lacks: named, then the
    // fake kernel (the program goes on).
    let untraced = v["trace"]["untraced"].to_string();
    assert!(untraced.contains("vstest.asks_more"), "{untraced}");
    assert!(untraced.contains("fake kernel"), "{untraced}");
    assert_eq!(seen["own_device"], "meta", "{err}");
    assert_eq!(
        seen["own_bytes"], 0,
        "the program's own meta tensors are not GPU memory"
    );
    assert_eq!(
        seen["peak"].as_u64(),
        Some(3 * MIB),
        "the input, the kernel's scratch and its output"
    );
    assert_eq!(
        seen["after"].as_u64(),
        Some(2 * MIB),
        "the scratch goes as the kernel returns"
    );
    assert_eq!(
        seen["tensor"], 512,
        "torch.tensor on the device, counted as made"
    );
    assert_eq!(seen["device"], "cuda:0");
}

/// BCE with logits with a weight and a pos_weight: the backward takes the
/// formula's CUDA branch (FunctionsManual.cpp
/// `binary_cross_entropy_with_logits_backward`: `t = pos_weight.mul(target)`,
/// then `t.add(1).sub_(target).mul_(input.sigmoid()).sub_(t)`, `mul_(grad)`,
/// `mul_(weight)`, `div_`): at most `t`, `t + 1` (the gradient) and the
/// sigmoid at once, three full-size buffers. Under `create_graph` it takes
/// the out-of-place branch and the gradient has a graph of its own.
const BCE_WEIGHTED: &str = r#"
import json, torch
import torch.nn.functional as F
N, C = 1024, 256
full = N * C * 4
x = torch.randn(N, C, device="cuda", requires_grad=True)
t = torch.rand(N, C, device="cuda")
w = torch.rand(C, device="cuda")
pw = torch.rand(C, device="cuda")
seen = {}
loss = F.binary_cross_entropy_with_logits(x, t, weight=w, pos_weight=pw)
base = torch.cuda.memory_allocated()
torch.cuda.reset_peak_memory_stats()
loss.backward()
seen["backward_peak_over"] = (torch.cuda.max_memory_allocated() - base) / full
seen["grad_kept"] = (torch.cuda.memory_allocated() - base) / full
x.grad = None
loss = F.binary_cross_entropy_with_logits(x, t)
(g,) = torch.autograd.grad(loss, x, create_graph=True)
seen["double"] = g.grad_fn is not None
g.sum().backward()
seen["x_grad"] = list(x.grad.shape)
print("SEEN " + json.dumps(seen))
"#;

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn bce_with_logits_backward_takes_the_cuda_branch_of_its_formula() {
    let s = Scratch::new("bce");
    let prog = s.file("bce.py", BCE_WEIGHTED);
    let (_, err) = traced_json(&prog, &["--steps", "0"]);
    let seen = seen(&err);
    let peak = seen["backward_peak_over"].as_f64().expect("a peak");
    // Three full-size buffers and the 4-byte incoming gradient's block.
    assert!((3.0..3.01).contains(&peak), "{peak}: {err}");
    assert_eq!(seen["grad_kept"], 1.0, "the gradient stays, in x.grad");
    assert_eq!(seen["double"], true, "{err}");
    assert_eq!(seen["x_grad"], serde_json::json!([1024, 256]));
}

/// A program that holds a tensor in a named variable and runs ops, with no
/// optimizer step (so no walk of its own), until told to stop.
const HOLDS_AND_RUNS: &str = r#"
import os, sys, time, torch
kept_weights = torch.empty(1 << 22, device="cuda")
deadline = time.time() + 60
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    y = kept_weights[:1024] * 2
    torch.cuda.memory_allocated()
"#;

/// A shared sink for the trace's live stream.
#[derive(Clone, Default)]
struct Stream(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Stream {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }

    fn wait_for(&self, what: &str) -> bool {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < until {
            if self.text().contains(what) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        false
    }
}

/// `H` in a trace's view: the view's request (PROTOCOL.md `find_holders`,
/// through the same `Requester` `attach` writes to) reaches the traced
/// program's helper ahead of its next answer, which walks at its next op
/// boundary: the stream gets a `holders` message, `reason: "requested"`,
/// naming the variable that holds the tensor, as `attach` shows a job's.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_walk_asked_by_the_view_reaches_the_traced_program() {
    let s = Scratch::new("walk-asked");
    let prog = s.file("holds.py", HOLDS_AND_RUNS);
    let stop = s.0.join("stop");
    let opts = vramscope::traced::TraceOptions {
        gpu: vramscope::device::profile("H100-SXM-80GB").expect("H100"),
        steps: None,
        conf: None,
        command: vec![
            python(),
            prog.to_string_lossy().into_owned(),
            stop.to_string_lossy().into_owned(),
        ],
        output: vramscope::traced::ChildOutput::Capture,
        want_snapshot: false,
        save_requests: None,
        holders_budget_ms: vramscope::traced::HOLDERS_BUDGET_MS,
    };
    let stream = Stream::default();
    let run = vramscope::traced::start(opts, Box::new(stream.clone())).expect("the trace starts");
    let running = stream.wait_for("\"entries\"");
    let asked = running && run.requester().find_holders().is_ok();
    let walked = asked && stream.wait_for("\"requested\"");
    std::fs::write(&stop, b"").expect("the stop file");
    let output = String::from_utf8_lossy(&run.output()).into_owned();
    let (outcome, _) = run.join().expect("the trace ends");
    assert!(running, "the program never ran: {output}");
    assert!(walked, "no walk came: {}", stream.text());
    assert_eq!(
        outcome.steps, 0,
        "no optimizer step: the walk was asked for"
    );
    let bytes = stream.0.lock().expect("not poisoned").clone();
    let mut frames = vramscope::job::FrameReader::new(bytes.as_slice(), "the stream");
    let mut holders = Vec::new();
    while let Some((_, b)) = frames.next_frame().expect("framed") {
        let v: Value = serde_json::from_slice(b).expect("JSON");
        if v["t"] == "holders" {
            holders.push(v);
        }
    }
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0]["reason"], "requested");
    assert!(
        holders[0].to_string().contains("kept_weights"),
        "{}",
        holders[0]
    );
}
