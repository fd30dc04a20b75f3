//! `compare` and plain output as a script runs them: no terminal, output
//! piped.

use std::process::{Command, Stdio};

mod common;

use common::{json, real, vramscope};

#[test]
fn compare_without_a_terminal_prints_both_sides() {
    let (code, out, err) = vramscope(&[
        "compare",
        "accumulate-loss-train-bug",
        "accumulate-loss-train-fixed",
    ]);
    assert_eq!(code, 0, "{err}");
    let table: Vec<&str> = out.lines().take_while(|l| !l.is_empty()).collect();
    let findings = table
        .iter()
        .find(|l| l.starts_with("findings"))
        .expect("a findings row");
    assert_eq!(
        findings.split_whitespace().skip(1).collect::<Vec<_>>(),
        ["1", "0"],
        "{out}"
    );
    assert!(
        table.iter().any(|l| l.contains("total_loss")),
        "the buggy side's leak is named: {out}"
    );
    assert!(
        out.contains("── first: accumulate-loss-train-bug ──"),
        "{out}"
    );
    assert!(
        out.contains("── second: accumulate-loss-train-fixed ──"),
        "{out}"
    );
}

#[test]
fn compare_json_has_each_sides_figures_and_report() {
    let file = common::capture("peak_inside_step");
    let snapshot = file.to_str().expect("utf-8 path");
    let (code, out, err) = vramscope(&["compare", "tour", snapshot, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let (first, second) = (&v["first"]["figures"], &v["second"]["figures"]);
    assert_eq!(first["kind"], "scenario");
    assert_eq!(second["kind"], "snapshot");
    // A trace's peaks are PyTorch's own max_memory_allocated/reserved (the
    // capture recorded from the program's start, and wrote them beside it).
    let measured: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(file.with_extension("json")).expect("the capture's figures"),
    )
    .expect("json");
    assert_eq!(second["peak_allocated"], measured["max_memory_allocated"]);
    assert_eq!(second["peak_reserved"], measured["max_memory_reserved"]);
    // The same snapshot opened on its own says the same.
    let (_, opened, _) = vramscope(&["open", snapshot, "--json"]);
    let opened = json(&opened);
    let allocated: u64 = opened["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| d["allocated"].as_u64().expect("bytes"))
        .sum();
    assert_eq!(second["allocated"].as_u64(), Some(allocated));
    assert_eq!(v["second"]["report"], opened);
    // The tour ends in its OOM; its own run report says where.
    assert_eq!(first["ooms"], 1);
    assert!(v["first"]["report"]["oom"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("Tried to allocate")));
}

#[test]
fn compare_names_the_input_it_cannot_find() {
    let (code, out, err) = vramscope(&["compare", "tour", "no-such-scenario"]);
    assert_eq!(code, 2);
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("no-such-scenario"), "{err}");
}

#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .arg("scenarios")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    // The reader is gone before the first line is written, as after `| head -0`.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_ne!(out.status.code(), Some(101), "a panic's exit status");
}

/// A device given where a file belongs: read forever once; now refused at once.
#[cfg(unix)]
#[test]
fn an_endless_device_is_refused_not_read_forever() {
    let (code, _, err) = vramscope(&["check", "/dev/zero"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("/dev/zero") && err.contains("not a scenario file"),
        "{err}"
    );
    let (code, _, err) = vramscope(&["open", "/dev/zero", "--headless"]);
    assert_eq!(code, 2);
    assert!(err.contains("/dev/zero: not a regular file"), "{err}");
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn compare_one_input_under_another_allocator_config() {
    let (code, out, err) = vramscope(&[
        "compare",
        "var-batch-fragmentation-bug",
        "--conf",
        "expandable_segments:True",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let (a, b) = (&v["first"]["figures"], &v["second"]["figures"]);
    assert_eq!(a["label"], "var-batch-fragmentation-bug");
    assert_eq!(
        b["label"],
        "var-batch-fragmentation-bug · expandable_segments:True"
    );
    // The same requests: what is allocated does not change, what is reserved does.
    assert_eq!(a["peak_allocated"], b["peak_allocated"]);
    let reserved = |f: &serde_json::Value| f["peak_reserved"].as_u64().expect("bytes");
    assert!(reserved(b) < reserved(a), "{a} {b}");
    // Narration and expectations speak of the scenario's own config only.
    let report = |side: &str| &v[side]["report"];
    assert!(report("first")["narration"]
        .as_array()
        .is_some_and(|n| !n.is_empty()));
    assert_eq!(report("second")["narration"], serde_json::json!([]));
    assert_eq!(report("second")["expectations"], serde_json::json!([]));

    // A snapshot: both sides replayed, one config against the other.
    let snapshot = real("code-location_expandable_3gpu_oom.pickle");
    let snapshot = snapshot.to_str().expect("utf-8 path");
    let (code, out, err) = vramscope(&[
        "compare",
        snapshot,
        "--conf",
        "expandable_segments:True",
        "--conf",
        "",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert!(v["second"]["figures"]["label"]
        .as_str()
        .is_some_and(|l| l.ends_with("· default")));
}

#[test]
fn compare_says_how_to_call_it() {
    for (args, expected) in [
        (vec!["compare", "tour"], "give a second input, or --conf"),
        (
            vec![
                "compare",
                "tour",
                "tour",
                "--conf",
                "expandable_segments:True",
            ],
            "with two inputs leave it out",
        ),
        (
            vec!["compare", "tour", "--conf", "bogus:1"],
            "--conf: invalid PYTORCH_CUDA_ALLOC_CONF",
        ),
    ] {
        let (code, out, err) = vramscope(&args);
        assert_eq!(code, 2, "{args:?}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

#[test]
fn checkpointing_shows_its_recompute_cost_beside_its_memory_saving() {
    let (code, out, err) = vramscope(&["compare", "checkpoint-none", "checkpoint-every-layer"]);
    assert_eq!(code, 0, "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with("compute (est.)"))
        .unwrap_or_else(|| panic!("a compute row: {out}"));
    assert!(row.contains("% recompute"), "{row}");
    let change = row.split_whitespace().last().unwrap_or_default();
    assert!(change.starts_with('+'), "checkpointing costs time: {row}");
    assert!(
        out.contains("not measured"),
        "labelled as an estimate: {out}"
    );
    // The report's JSON splits the same estimate by part.
    let (code, out, err) = vramscope(&["run", "checkpoint-every-layer", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let est = &v["compute_estimate"]["estimate"];
    assert!(est["label"]
        .as_str()
        .is_some_and(|l| l.contains("estimate")));
    let parts: Vec<&str> = est["parts"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["part"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        parts.contains(&"recompute") && parts.contains(&"backward"),
        "{est}"
    );
    let (_, plain, _) = vramscope(&["run", "checkpoint-none", "--json"]);
    let plain = json(&plain);
    let flops = |v: &serde_json::Value| v["compute_estimate"]["estimate"]["flops"].as_u64();
    assert!(flops(&v) > flops(&plain), "recompute adds FLOPs");
}

/// The deep-MLP scenarios' narration quotes the compute estimate: it must be
/// the one their runs make (≈ 249 ms without, ≈ 334 ms with, ≈ 33 % more FLOPs).
#[test]
fn deep_mlp_narration_quotes_the_runs_own_compute_estimate() {
    let estimate = |name: &str| {
        let (code, out, err) = vramscope(&["run", name, "--json"]);
        assert_eq!(code, 0, "{err}");
        let v = json(&out);
        let e = &v["compute_estimate"]["estimate"];
        (
            e["milliseconds"].as_f64().unwrap_or(0.0),
            e["flops"].as_u64().unwrap_or(0) as f64,
        )
    };
    let (plain_ms, plain_flops) = estimate("deep-mlp-no-checkpoint");
    for name in ["deep-mlp-checkpoint", "deep-mlp-checkpoint-segments"] {
        let (ms, flops) = estimate(name);
        assert_eq!(plain_ms.round(), 249.0, "{name}");
        assert_eq!(ms.round(), 334.0, "{name}");
        let more = flops / plain_flops - 1.0;
        assert!((0.30..0.37).contains(&more), "{name}: {more}");
    }
}

/// The LSTM scenario's estimate counts cuDNN's LSTM: its gate GEMMs, a pass
/// forward and two backward (data, weights), from the scenario's own sizes.
#[test]
fn the_lstm_scenario_s_estimate_counts_the_lstm() {
    use vramscope::engine::ModelKind;
    let (scenario, built) = vramscope::scenario::resolve("rnn-hidden-fixed").expect("built-in");
    let ModelKind::LstmLm {
        emb,
        hidden,
        layers,
        bptt,
        cudnn,
        ..
    } = built.model.kind
    else {
        panic!("an LSTM model: {:?}", built.model.kind)
    };
    assert!(cudnn, "the cuDNN path");
    let batch = scenario.data.batch.unwrap_or(built.model.batch);
    let seq = scenario.data.seq.unwrap_or(bptt);
    let pass: u64 = (0..layers)
        .map(|l| {
            let input = if l == 0 { emb } else { hidden };
            2 * 4 * hidden * (input + hidden) * batch * seq
        })
        .sum();
    let (code, out, err) = vramscope(&["run", "rnn-hidden-fixed", "--json"]);
    assert_eq!(code, 0, "{err}");
    let est = &json(&out)["compute_estimate"]["estimate"];
    let lstm = est["kinds"]
        .as_array()
        .and_then(|k| k.iter().find(|k| k["kind"] == "cuDNN LSTM"))
        .unwrap_or_else(|| panic!("no cuDNN LSTM in {est}"));
    assert_eq!(lstm["flops"].as_u64(), Some(3 * pass), "{est}");
    let kinds_total: u64 = est["kinds"]
        .as_array()
        .map(|k| k.iter().filter_map(|k| k["flops"].as_u64()).sum())
        .unwrap_or(0);
    assert_eq!(est["flops"].as_u64(), Some(kinds_total), "the kinds add up");
    let (_, text, _) = vramscope(&["run", "rnn-hidden-fixed"]);
    assert!(text.contains("cuDNN LSTM "), "the text names it: {text}");
}
