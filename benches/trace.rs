//! `cargo bench --bench trace` (issue 38): `vramscope trace`'s figures on
//! this machine, with PyTorch (`VRAMSCOPE_PYTHON`, else `python3`; without
//! torch it fails, saying what to install).
//!
//! - GPT-2 small (nanoGPT's GPT, batch 4 × 1,024, AdamW) traced:
//!   `benches/trace/gpt2_step.py` under `vramscope trace --headless`, each
//!   training step's wall time (target ≤ 2 s), the whole run's, and the
//!   traced process's resident memory; beside it the same program on
//!   PyTorch's plain meta device, untraced (`--meta`).
//! - The trace's own cost per aten op (target ≤ 5 µs):
//!   `benches/trace/op_cost.py`, a view, a factory and a GEMM, traced and
//!   with the helper's modes paused, in wall time and in CPU time (the
//!   program's thread; vramscope's own process apart).
//!
//! A process's timings are its own lines (the programs print them); this
//! command runs them, collects the lines and prints one report.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

fn python() -> String {
    let py = std::env::var("VRAMSCOPE_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", "import torch"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "`{py} -c 'import torch'` failed: install torch (pip install torch==2.11.*), \
             or point VRAMSCOPE_PYTHON at a Python that has it"
        );
        std::process::exit(2);
    }
    py
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a command; its stderr lines and its wall time in seconds.
fn run(cmd: &mut Command) -> (Vec<String>, f64) {
    let t = Instant::now();
    let out = cmd
        .current_dir(root())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let wall = t.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{cmd:?} failed:\n{err}");
    (err.lines().map(String::from).collect(), wall)
}

fn traced(py: &str, script: &Path, args: &[&str]) -> (Vec<String>, f64) {
    run(Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["trace", "--headless", "--steps", "0", "--"])
        .arg(py)
        .arg(script)
        .args(args))
}

/// The seconds of `step N: S s` lines, the first step apart.
fn steps(lines: &[String]) -> (Option<f64>, Vec<f64>) {
    let mut first = None;
    let mut rest = Vec::new();
    for l in lines {
        let Some(s) = l.strip_prefix("step ") else {
            continue;
        };
        let Some(secs) = s
            .rsplit(": ")
            .next()
            .and_then(|v| v.trim_end_matches(" s").parse::<f64>().ok())
        else {
            continue;
        };
        if s.contains("(first)") {
            first = Some(secs);
        } else {
            rest.push(secs);
        }
    }
    (first, rest)
}

fn line<'a>(lines: &'a [String], prefix: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.starts_with(prefix))
        .map(String::as_str)
        .unwrap_or("(not printed)")
}

fn gpt2(py: &str) {
    let script = root().join("benches/trace/gpt2_step.py");
    let (meta, meta_wall) = run(Command::new(py).arg(&script).args(["3", "--meta"]));
    let (tr, tr_wall) = traced(py, &script, &["3"]);
    let (mf, ms) = steps(&meta);
    let (tf, ts) = steps(&tr);
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let worst = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    println!("GPT-2 small training step (batch 4 x 1,024, AdamW), 3 steps after a first:");
    println!(
        "  traced      : steps {:.3}-{:.3} s (first {:.3} s); {}; whole run {:.1} s; {}",
        best(&ts),
        worst(&ts),
        tf.unwrap_or(f64::NAN),
        line(&tr, "build"),
        tr_wall,
        line(&tr, "resident")
    );
    println!(
        "  plain meta  : steps {:.3}-{:.3} s (first {:.3} s); {}; whole run {:.1} s; {}; {}",
        best(&ms),
        worst(&ms),
        mf.unwrap_or(f64::NAN),
        line(&meta, "build"),
        meta_wall,
        line(&meta, "aten ops per step"),
        line(&meta, "resident")
    );
    let verdict = if worst(&ts) <= 2.0 { "met" } else { "NOT met" };
    println!("  target ≤ 2 s per traced step: {verdict}");
}

fn op_cost(py: &str) {
    let (lines, _) = traced(py, &root().join("benches/trace/op_cost.py"), &["20000"]);
    println!("The trace's own cost per aten op (best of 5 x 20,000 calls):");
    for l in lines.iter().filter(|l| l.contains("µs")) {
        println!("  {l}");
    }
}

fn main() {
    // `cargo bench` passes `--bench` (and a filter, if given): run what the
    // filter names, or both.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let py = python();
    if wanted("gpt2_step") {
        gpt2(&py);
    }
    if wanted("op_cost") {
        op_cost(&py);
    }
}
