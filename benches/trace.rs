//! `cargo bench --bench trace` (issue 38): `vramscope trace`'s figures on
//! this machine, with PyTorch (`VRAMSCOPE_PYTHON`, else `python3`; without
//! torch it fails, saying what to install).
//!
//! - GPT-2 small (nanoGPT's GPT, batch 4 × 1,024, AdamW) traced:
//!   `benches/trace/gpt2_step.py` under `vramscope trace --headless`, each
//!   training step's wall time (target ≤ 2 s), the whole run's, and the
//!   traced process's resident memory; beside it, in turn, the same
//!   program on PyTorch's plain meta device, untraced (`--meta`), and
//!   under two Python modes that only call the function (`--modes`: the
//!   floor of any tracer built on them). The trace's cost per aten op
//!   (target ≤ 5 µs) is the step's time above plain meta over its aten ops.
//! - The same per op, for a view, a factory and a GEMM apart:
//!   `benches/trace/op_cost.py`, traced and with the helper's modes paused,
//!   in wall time and in CPU time (the program's thread; vramscope's own
//!   process apart).
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

/// Alternate rounds of the program on plain meta and traced, so that a
/// slow moment of the host falls on both.
const ROUNDS: usize = 3;
const STEPS: &str = "10";

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// Step times (the first apart) and the last run's lines, over rounds.
#[derive(Default)]
struct Runs {
    first: Vec<f64>,
    steps: Vec<f64>,
    lines: Vec<String>,
    wall: f64,
}

impl Runs {
    fn add(&mut self, (lines, wall): (Vec<String>, f64)) {
        let (first, rest) = steps(&lines);
        self.first.extend(first);
        self.steps.extend(rest);
        self.lines = lines;
        self.wall = wall;
    }

    fn say(&self, name: &str, extra: &[&str]) {
        let best = self.steps.iter().copied().fold(f64::INFINITY, f64::min);
        let worst = self.steps.iter().copied().fold(0.0, f64::max);
        let mut parts = vec![
            format!(
                "steps {best:.3}-{worst:.3} s, median {:.3} s, mean {:.3} s (first {:.3} s)",
                median(&self.steps),
                mean(&self.steps),
                median(&self.first)
            ),
            line(&self.lines, "build").to_string(),
            format!("whole run {:.1} s", self.wall),
        ];
        parts.extend(extra.iter().map(|p| line(&self.lines, p).to_string()));
        println!("  {name:<16}: {}", parts.join("; "));
    }
}

fn gpt2(py: &str) {
    let script = root().join("benches/trace/gpt2_step.py");
    let (mut meta, mut floor, mut tr) = (Runs::default(), Runs::default(), Runs::default());
    for _ in 0..ROUNDS {
        meta.add(run(Command::new(py).arg(&script).args([STEPS, "--meta"])));
        floor.add(run(Command::new(py)
            .arg(&script)
            .args([STEPS, "--meta", "--modes"])));
        tr.add(traced(py, &script, &[STEPS]));
    }
    println!(
        "GPT-2 small training step (batch 4 x 1,024, AdamW foreach), {STEPS} steps after a \
         first, {ROUNDS} rounds of the three in turn:"
    );
    tr.say("traced", &["resident"]);
    meta.say("plain meta", &["aten ops per step", "resident"]);
    floor.say("no-op modes", &[]);
    let ops = line(&meta.lines, "aten ops per step: ")
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    let per_op = |a: &[f64], b: &[f64], at: fn(&[f64]) -> f64| (at(a) - at(b)) / ops * 1e6;
    let traced_median = per_op(&tr.steps, &meta.steps, median);
    println!(
        "  per aten op, above plain meta: traced {traced_median:.1} µs at the median step, {:.1} \
         µs at the mean (Python's full collections included); the no-op modes alone {:.1} µs \
         (median)",
        per_op(&tr.steps, &meta.steps, mean),
        per_op(&floor.steps, &meta.steps, median),
    );
    println!(
        "  per aten op, above the no-op modes: traced {:.1} µs (median step)",
        per_op(&tr.steps, &floor.steps, median)
    );
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    let worst = tr.steps.iter().copied().fold(0.0, f64::max);
    println!(
        "  target ≤ 2 s per traced step: {}; ≤ 5 µs per aten op above plain meta (median \
         step): {}",
        verdict(worst <= 2.0),
        verdict(traced_median <= 5.0)
    );
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
