//! Capture programs written before their capture: each pair below is a test
//! scenario beside the programs (`tests/fixtures/pytorch/<name>.ron`) and
//! the program that captures it (`<stem>.py`, listed in `capture.sh`). Until
//! `captured/<stem>.json` exists the checks here are the pair's own: the
//! program is there and `capture.sh` runs it, it sets the environment the
//! scenario carries and names the scenario it captures, and the scenario
//! loads, names the stem as its capture and runs in the simulation with
//! its own expectations met. Once captured, the pair is checked like every
//! other capture, exactly ([`check`] with [`EXACT`]); a difference then is
//! what the capture came to find, and the pair moves to `scenarios.rs` with
//! its cause named.

use std::path::Path;

use vramscope::scenario::{check as check_expectations, resolve, run, RunOptions};

use crate::harness::{captured, check, EXACT};

/// (scenario file, capture stem).
const AWAITING: [(&str, &str); 11] = [
    (
        "tests/fixtures/pytorch/default-workspaces.ron",
        "default_workspaces",
    ),
    (
        "tests/fixtures/pytorch/sdpa-default-fp32.ron",
        "sdpa_default_fp32",
    ),
    (
        "tests/fixtures/pytorch/sdpa-default-fp16.ron",
        "sdpa_default_fp16",
    ),
    (
        "tests/fixtures/pytorch/resnet18-train.ron",
        "resnet18_train",
    ),
    ("tests/fixtures/pytorch/adamw-forloop.ron", "adamw_forloop"),
    ("tests/fixtures/pytorch/adamw-fused.ron", "adamw_fused"),
    (
        "tests/fixtures/pytorch/clip-grad-norm.ron",
        "clip_grad_norm",
    ),
    ("tests/fixtures/pytorch/lstm-medium.ron", "lstm_medium"),
    ("tests/fixtures/pytorch/gpt-dropout.ron", "gpt_dropout"),
    ("tests/fixtures/pytorch/resnet50-sum.ron", "resnet50_sum"),
    (
        "tests/fixtures/pytorch/deep-mlp-checkpoint-train.ron",
        "deep_mlp_checkpoint_train",
    ),
];

/// The workspace variables `_capture.set_env(alloc_conf)` sets (its
/// `WORKSPACE_ENV`), in the scenario's (sorted) order;
/// `set_env(..., workspaces=False)` sets none.
const WORKSPACE_ENV: [(&str, &str); 3] = [
    ("CUBLASLT_WORKSPACE_SIZE", "1024"),
    ("CUBLAS_WORKSPACE_CONFIG", ":4096:2:16:8"),
    ("TORCH_CUBLAS_WORKSPACE_CACHE", "1"),
];

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch")
}

/// The programs `capture.sh` runs when given none: its `programs=(…)` list.
fn capture_sh_programs() -> Vec<String> {
    let path = fixtures().join("capture.sh");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("programs=("))
        .expect("capture.sh: a programs=(…) line");
    line.trim_end()
        .trim_end_matches(')')
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn awaiting_captures_are_ready_to_capture_and_check() {
    let listed = capture_sh_programs();
    let mut waiting = Vec::new();
    for (scenario, stem) in AWAITING {
        // The program, and capture.sh runs it.
        let program = fixtures().join(format!("{stem}.py"));
        let source = std::fs::read_to_string(&program)
            .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
        assert!(
            listed.iter().any(|p| p == stem),
            "{stem}: not in capture.sh's programs"
        );

        // The scenario loads and names this capture.
        let (sc, built) = resolve(scenario).unwrap_or_else(|e| panic!("{scenario}: {e}"));
        assert_eq!(
            built.conditions.capture.as_deref(),
            Some(stem),
            "{scenario}: capture"
        );
        assert_eq!(
            Path::new(scenario).file_stem().and_then(|s| s.to_str()),
            Some(sc.name.as_str()),
            "{scenario}: the file is named after the scenario"
        );
        assert_eq!(sc.name.replace('-', "_"), stem, "{scenario}: the stem");
        // The capture's JSON records the scenario's name (`Capture(scenario,
        // …)`), which the check compares with this file's.
        assert!(
            source.contains(&format!("\"{}\"", sc.name)),
            "{stem}.py does not name the scenario \"{}\"",
            sc.name
        );
        // The environment the program sets is the one the scenario carries.
        let unset = source.contains("workspaces=False");
        if unset {
            assert!(
                sc.env.is_empty(),
                "{scenario}: {stem}.py sets no workspace variable, so the scenario has no env"
            );
        } else {
            let env: Vec<(&str, &str)> = sc
                .env
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            assert_eq!(env, WORKSPACE_ENV, "{scenario}: env as set_env sets it");
        }
        assert!(
            built
                .conditions
                .gpu
                .is_some_and(|g| g.name == "H100-SXM-80GB"),
            "{scenario}: the H100 the captures run on"
        );
        assert_eq!(built.conditions.torch, "2.11", "{scenario}: release");

        // It runs, to its own expectations.
        let sim = run(
            &sc,
            &built,
            &RunOptions {
                iterations: None,
                record_events: false,
            },
        );
        assert!(sim.error.is_none(), "{scenario}: {:?}", sim.error);
        assert_eq!(
            sim.iterations_run, built.program.iterations,
            "{scenario}: every iteration"
        );
        for r in check_expectations(&sc.expect, &sim) {
            assert!(
                r.passed,
                "{scenario}: expects {} but the simulation shows {}",
                r.expectation, r.observed
            );
        }

        if captured(stem, "json").exists() {
            check(scenario, stem, EXACT);
        } else {
            println!("awaiting capture: {stem}");
            waiting.push(stem);
        }
    }
    println!(
        "{} of {} pairs awaiting their capture",
        waiting.len(),
        AWAITING.len()
    );
}

/// Built-in scenarios whose PyTorch program is written but not yet captured:
/// (built-in name, capture stem). Until `captured/<stem>.json` exists they
/// name no `capture:`, so their reports say "not checked against a capture".
const AWAITING_BUILTINS: [(&str, &str); 13] = [
    ("fragmentation-experiment", "fragmentation_experiment"),
    (
        "fragmentation-experiment-oom",
        "fragmentation_experiment_oom",
    ),
    ("peak-inside-step", "peak_inside_step"),
    ("cuda-context", "cuda_context"),
    ("batch-moves-peak-small", "batch_moves_peak_small"),
    ("batch-moves-peak-large", "batch_moves_peak_large"),
    ("amp-raises-peak", "amp_raises_peak"),
    ("amp-raises-peak-fp32", "amp_raises_peak_fp32"),
    ("inplace-ops", "inplace_ops"),
    ("inplace-ops-out-of-place", "inplace_ops_out_of_place"),
    ("inplace-ops-error", "inplace_ops_error"),
    ("reference-cycle-gc", "reference_cycle_gc"),
    ("reference-cycle-bug", "reference_cycle_bug"),
];

#[test]
fn builtins_awaiting_their_capture_have_their_program_and_claim_no_check() {
    let listed = capture_sh_programs();
    for (name, stem) in AWAITING_BUILTINS {
        let program = fixtures().join(format!("{stem}.py"));
        let source = std::fs::read_to_string(&program)
            .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
        assert!(
            listed.iter().any(|p| p == stem),
            "{stem}: not in capture.sh's programs"
        );
        assert!(
            source.contains(&format!("\"{name}\"")),
            "{stem}.py does not name the scenario \"{name}\""
        );
        let (sc, built) = resolve(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(sc.name.replace('-', "_"), stem, "{name}: the stem");
        assert_eq!(
            built.conditions.capture, None,
            "{name}: names no capture until captured/{stem}.json exists"
        );
        let env: Vec<(&str, &str)> = sc
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(env, WORKSPACE_ENV, "{name}: env as set_env sets it");
        assert!(
            built
                .conditions
                .gpu
                .is_some_and(|g| g.name == "H100-SXM-80GB"),
            "{name}: the H100 the captures run on"
        );
        assert_eq!(built.conditions.torch, "2.11", "{name}: release");
        assert!(
            !captured(stem, "json").exists(),
            "{stem} is captured: add `capture: \"{stem}\"` to {name} and check it in scenarios.rs"
        );
    }
}
