//! `vramscope trace` on real PyTorch (issue 38): small programs written
//! in tests/trace/ by subject, and every capture program of
//! tests/fixtures/pytorch against the H100 figures it recorded
//! (`captures`); the helpers that run them are here. They need PyTorch in the Python
//! they run (`VRAMSCOPE_PYTHON`, else `python3`): ignored by default, run
//! by CI with `cargo test --test trace_program -- --ignored` after
//! `pip install torch==2.11.*`; a missing torch fails them, saying so.

#[path = "trace/captures.rs"]
mod captures;
mod common;
#[path = "trace/hf_families.rs"]
mod hf_families;
#[path = "trace/holders.rs"]
mod holders;
#[path = "trace/known_values.rs"]
mod known_values;
#[path = "trace/ops.rs"]
mod ops;
#[path = "trace/qlora.rs"]
mod qlora;
#[path = "trace/recordings.rs"]
mod recordings;
#[path = "trace/scenario_requests.rs"]
mod scenario_requests;
#[path = "trace/simulated_gpu.rs"]
mod simulated_gpu;
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
