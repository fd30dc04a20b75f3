//! `vramscope sweep` as a script runs it (no terminal): the JSON's shape,
//! the errors that name their flag, the search for the largest batch, and
//! the shipped `resnet50-batch-sweep` scenario's narration held to the
//! sweep's own figures.

mod common;

use common::{json, vramscope, VALID};
use serde_json::Value;

const MIB: f64 = 1_048_576.0;

fn sweep_json(args: &[&str]) -> Value {
    let mut all = vec!["sweep"];
    all.extend_from_slice(args);
    all.push("--json");
    let (code, out, err) = vramscope(&all);
    assert_eq!(code, 0, "{err}");
    json(&out)
}

#[test]
fn json_has_a_point_per_batch_with_its_peaks() {
    let v = sweep_json(&["resnet50-batch-sweep", "--batch", "4,1,2"]);
    let points = v["points"].as_array().expect("points");
    let batches: Vec<u64> = points.iter().filter_map(|p| p["batch"].as_u64()).collect();
    assert_eq!(
        batches,
        vec![1, 2, 4],
        "ascending, whatever the flag's order"
    );
    for p in points {
        for key in ["batch", "seq", "peak_allocated", "peak_reserved", "oom"] {
            assert!(p.get(key).is_some(), "no {key} in {p}");
        }
        assert!(p["seq"].is_null(), "a ResNet has no sequence length");
        assert_eq!(p["oom"], Value::Bool(false));
        assert!(p["peak_reserved"].as_u64() >= p["peak_allocated"].as_u64());
    }
    // The input alone is 3 × 224 × 224 × 4 B = 602,112 B per image (a
    // multiple of 512 B). Above 1 MiB it takes a large-pool block, which
    // keeps a remainder of up to 1 MiB unsplit (allocator.md §4.1).
    let input = |i: usize| {
        points[i]["at_peak"]["by_category"]["input"]
            .as_u64()
            .unwrap_or(0)
    };
    assert_eq!(input(0), 602_112);
    assert!(
        (4 * 602_112..=4 * 602_112 + (1 << 20)).contains(&input(2)),
        "{}",
        input(2)
    );
    assert!(v["fits"][0]["allocated"]["slope"].as_f64().is_some());
    assert!(
        v["max_batch"].is_null(),
        "no search without --find-max-batch"
    );
}

#[test]
fn the_scenario_s_own_points_run_without_batch() {
    let v = sweep_json(&["resnet50-batch-sweep"]);
    let batches: Vec<u64> = v["points"]
        .as_array()
        .expect("points")
        .iter()
        .filter_map(|p| p["batch"].as_u64())
        .collect();
    assert_eq!(batches, vec![1, 2, 4, 8, 16, 32, 64]);
    assert_eq!(v["narration"].as_array().map(Vec::len), Some(3));
}

fn error_of(args: &[&str]) -> String {
    let (code, out, err) = vramscope(args);
    assert_eq!(code, 2, "{args:?}: {out}");
    err
}

#[test]
fn bad_flags_are_errors_that_name_the_flag() {
    let err = error_of(&["sweep", "resnet50-batch-sweep", "--batch", "1,x"]);
    assert!(
        err.contains("--batch 1,x: `x` is not a whole number"),
        "{err}"
    );
    let err = error_of(&["sweep", "resnet50-batch-sweep", "--batch", "0,2"]);
    assert!(err.contains("--batch 0,2: 0 is not a size"), "{err}");
    let err = error_of(&["sweep", "resnet50-batch-sweep", "--seq", "512"]);
    assert!(
        err.contains("--seq: this model has no sequence length"),
        "{err}"
    );
    let err = error_of(&["sweep", "tour"]);
    assert!(
        err.contains("give --batch") && err.contains("\"tour\""),
        "{err}"
    );
    let err = error_of(&["sweep", "no-such-scenario", "--batch", "1"]);
    assert!(err.contains("no built-in scenario or file named"), "{err}");
}

#[test]
fn a_sequence_longer_than_the_block_names_the_point() {
    let err = error_of(&["sweep", "checkpoint-none", "--batch", "1", "--seq", "1024"]);
    assert!(
        err.contains("batch 1, seq 1024") && err.contains("block_size 512"),
        "{err}"
    );
}

#[test]
fn seq_sweeps_every_batch_at_every_length() {
    let v = sweep_json(&["checkpoint-none", "--batch", "1,2", "--seq", "128,256"]);
    let pairs: Vec<(u64, u64)> = v["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| {
            (
                p["batch"].as_u64().unwrap_or(0),
                p["seq"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(pairs, vec![(1, 128), (2, 128), (1, 256), (2, 256)]);
    assert_eq!(
        v["fits"].as_array().map(Vec::len),
        Some(2),
        "one line per length"
    );
}

#[test]
fn the_largest_batch_found_fits_and_the_next_does_not() {
    let dir = common::temp_dir("sweep-max");
    let file = dir.join("small.ron");
    std::fs::write(&file, VALID).expect("write");
    let path = file.to_str().expect("utf-8");
    let v = sweep_json(&[path, "--find-max-batch"]);
    let m = &v["max_batch"];
    let best = m["batch"].as_u64().expect("a batch fits");
    assert_eq!(m["first_oom"].as_u64(), Some(best + 1));
    assert_eq!(
        m["runs"].as_u64(),
        m["tried"].as_array().map(|t| t.len() as u64)
    );
    let next = (best + 1).to_string();
    let check = sweep_json(&[path, "--batch", &format!("{best},{next}")]);
    let ooms: Vec<bool> = check["points"]
        .as_array()
        .expect("points")
        .iter()
        .filter_map(|p| p["oom"].as_bool())
        .collect();
    assert_eq!(ooms, vec![false, true], "{check}");
    let (code, out, _) = vramscope(&["sweep", path, "--find-max-batch"]);
    assert_eq!(code, 0);
    assert!(
        out.contains(&format!(
            "Largest batch that fits: {best} (batch {next} runs out of memory)"
        )),
        "{out}"
    );
}

/// The built-in's narration quotes its sweep: every figure it gives is the
/// sweep's own, rounded as written.
#[test]
fn resnet50_batch_sweep_narration_tells_the_truth() {
    let v = sweep_json(&["resnet50-batch-sweep"]);
    let said = v["narration"]
        .as_array()
        .expect("narration")
        .iter()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join(" ");
    let fit = &v["fits"][0];
    let line = &fit["allocated"];
    let num = |x: &Value| x.as_f64().expect("a number");
    let claim = format!(
        "≈ {:.0} MiB + {:.0} MiB per image (R² {:.5})",
        num(&line["intercept"]) / MIB,
        num(&line["slope"]) / MIB,
        num(&line["r_squared"])
    );
    assert!(said.contains(&claim), "narration lacks {claim:?}: {said}");
    assert_eq!(fit["linear"], Value::Bool(false), "it says: not exactly");
    let worst = fit["residuals"]
        .as_array()
        .expect("residuals")
        .iter()
        .max_by(|a, b| {
            num(&a["relative"])
                .abs()
                .total_cmp(&num(&b["relative"]).abs())
        })
        .expect("a residual");
    assert_eq!(worst["batch"].as_u64(), Some(1));
    assert!(num(&worst["bytes"]) > 0.0, "above the line");
    let above = format!(
        "batch 1 sits {:.0} % above the line",
        num(&worst["relative"]) * 100.0
    );
    assert!(said.contains(&above), "narration lacks {above:?}: {said}");
    // Where the peak comes: layer3 at batch 1, layer4.2's ReLU from 32 on.
    let points = v["points"].as_array().expect("points");
    let moment = |b: u64| {
        let p = points
            .iter()
            .find(|p| p["batch"].as_u64() == Some(b))
            .expect("point");
        (
            p["at_peak"]["module"].as_str().unwrap_or("").to_string(),
            p["at_peak"]["op"].as_str().unwrap_or("").to_string(),
        )
    };
    assert!(moment(1).0.starts_with("layer3."), "{:?}", moment(1));
    let grads = |b: u64| {
        let p = points
            .iter()
            .find(|p| p["batch"].as_u64() == Some(b))
            .expect("point");
        p["at_peak"]["by_category"]["gradient"]
            .as_u64()
            .unwrap_or(0)
    };
    for b in [32, 64] {
        assert_eq!(moment(b), ("layer4.2".into(), "ReluBackward0".into()));
        assert!(
            grads(1) > grads(b),
            "more gradients written at batch 1's peak"
        );
    }
    // 25,557,032 parameters (torchvision's ResNet-50) × 4 B = 97.5 MiB, in
    // 161 tensors each rounded up to 512 B.
    let params = points[0]["at_peak"]["by_category"]["parameter"]
        .as_u64()
        .expect("parameters");
    assert!(
        (102_228_128..102_228_128 + 161 * 511).contains(&params),
        "{params}"
    );
    assert!(said.contains(&format!("{:.1} MiB of weights", 102_228_128.0 / MIB)));
    // engine.md §1.6: on Hopper each cuBLAS handle keeps a 33,554,432 B
    // workspace (forward's thread and the autograd thread each have one),
    // and from 2.11 a 1 MiB cuBLASLt one is kept for addmm with bias.
    for p in points {
        let ws = p["at_peak"]["by_category"]["workspace"]
            .as_u64()
            .unwrap_or(0);
        assert!(
            ws >= 2 * 33_554_432 + 1_048_576,
            "batch {}: {ws}",
            p["batch"]
        );
    }
    assert!(said.contains("cuBLAS's 32 MiB per handle"), "{said}");
}

#[test]
fn the_text_report_has_a_table_and_the_fit_in_words() {
    let (code, out, err) = vramscope(&["sweep", "resnet50-batch-sweep"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("sweep resnet50-batch-sweep: 7 points"),
        "{out}"
    );
    let rows = out
        .lines()
        .filter(|l| l.trim_end().ends_with("fits"))
        .count();
    assert_eq!(rows, 7, "{out}");
    assert!(out.contains("Peak allocated ≈ "), "{out}");
    assert!(out.contains("the scenario says:"), "{out}");
}

/// The scenario `text` run as `vramscope run` runs it, its `data_line`
/// replaced by `batch` × `seq` (in its own text, not through the sweep's
/// code): whether it ran out of memory.
fn runs_out_of_memory(text: &str, data_line: &str, batch: u64, seq: u64) -> bool {
    let with_data = format!("    data: (batch: {batch}, seq: {seq}),");
    let variant = text.replace(data_line, &with_data);
    assert_ne!(variant, text, "the scenario has no {data_line:?}");
    let (scenario, built) = vramscope::scenario::load_str(&variant, "variant.ron").expect("loads");
    assert_eq!(scenario.data.batch, Some(batch));
    let r = vramscope::scenario::run(
        &scenario,
        &built,
        &vramscope::scenario::RunOptions::default(),
    );
    assert!(r.error.is_none(), "batch {batch}, seq {seq}: {:?}", r.error);
    r.oom.is_some()
}

/// `--find-max-batch` with several `--seq`: a search at each length, each
/// result true of a plain run at that batch and length, and a longer
/// sequence never fitting a larger batch.
#[test]
fn the_largest_batch_is_searched_at_every_sequence_length() {
    // The LSTM scenario runs at the preset's own data (B 20, BPTT 35): the
    // same written out, so that the variants below can replace it.
    let model = "    model: Preset(\"lstm-lm-ptb\"),";
    let lstm_data = "    data: (batch: 20, seq: 35),";
    let lstm = include_str!("../scenarios/rnn-hidden-fixed.ron")
        .replace(model, &format!("{model}\n{lstm_data}"));
    let gpt = include_str!("../scenarios/checkpoint-none.ron").to_string();
    let gpt_data = "    data: (batch: 8, seq: 512),";
    for (name, text, data_line, seqs) in [
        ("rnn-hidden-fixed", lstm, lstm_data, [35u64, 70, 140]),
        ("checkpoint-none", gpt, gpt_data, [128, 256, 512]),
    ] {
        let list = seqs.map(|t| t.to_string()).join(",");
        let v = sweep_json(&[name, "--seq", &list, "--find-max-batch"]);
        let found = v["max_batch_by_seq"].as_array().expect("max_batch_by_seq");
        assert_eq!(found.len(), seqs.len(), "{name}: {v}");
        assert_eq!(v["max_batch"], found[0], "max_batch is the first length's");
        let mut previous = u64::MAX;
        for (m, seq) in found.iter().zip(seqs) {
            assert_eq!(m["seq"].as_u64(), Some(seq), "{name}: in --seq's order");
            assert!(m["error"].is_null(), "{name}: {m}");
            let best = m["batch"].as_u64().expect("a batch fits");
            assert_eq!(m["first_oom"].as_u64(), Some(best + 1), "{name}: {m}");
            assert!(m["runs"].as_u64() > Some(0), "{name}: searched, {m}");
            assert!(
                best <= previous,
                "{name}: seq {seq} fits batch {best}, more than a shorter one ({previous})"
            );
            previous = best;
            let oom = |b: u64| runs_out_of_memory(&text, data_line, b, seq);
            assert!(!oom(best), "{name}: batch {best} at seq {seq} fits");
            assert!(
                oom(best + 1),
                "{name}: batch {} at seq {seq} runs out",
                best + 1
            );
        }
        let (code, out, err) = vramscope(&["sweep", name, "--seq", &list, "--find-max-batch"]);
        assert_eq!(code, 0, "{err}");
        for (m, seq) in found.iter().zip(seqs) {
            let best = m["batch"].as_u64().unwrap_or(0);
            let said = format!(
                "Largest batch that fits at sequence length {seq}: {best} (batch {} runs out of memory)",
                best + 1
            );
            assert!(out.contains(&said), "{name}: no {said:?} in\n{out}");
        }
        assert!(
            out.contains("Largest batch that fits by sequence length: "),
            "{out}"
        );
    }
}

/// A Hugging Face config.json where a scenario belongs: the error says what
/// the file is and shows a scenario naming it; that scenario, saved beside
/// the config, sweeps.
#[test]
fn a_config_json_is_told_how_to_become_a_scenario_and_the_advice_works() {
    let dir = common::temp_dir("sweep-config-json");
    let config = dir.join("config.json");
    let hf = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf/qwen2.5-0.5b/config.json");
    std::fs::copy(&hf, &config).expect("copy the config");
    let (code, _, err) = vramscope(&["sweep", config.to_str().expect("utf-8")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("config.json:1:1: this is JSON"), "{err}");
    assert!(!err.contains("Expected opening"), "{err}");
    let shown = err
        .split_once("e.g.\n")
        .and_then(|(_, rest)| rest.split_once("\nsaved as"))
        .map(|(text, _)| text.to_string())
        .unwrap_or_else(|| panic!("a scenario to copy: {err}"));
    let fit = dir.join("fit.ron");
    std::fs::write(&fit, shown).expect("write");
    let v = sweep_json(&[fit.to_str().expect("utf-8"), "--batch", "1,2"]);
    let points = v["points"].as_array().expect("points");
    assert_eq!(points.len(), 2, "{v}");
    assert!(points.iter().all(|p| p["oom"] == false), "{v}");
}

/// The README's quick-start scenario (the ```ron block) is a valid scenario
/// that sweeps, with a Hugging Face config beside it.
#[test]
fn the_readme_s_fit_scenario_sweeps() {
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .expect("README.md");
    let block = readme
        .split_once("```ron\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(text, _)| text.to_string())
        .expect("a ```ron block in the README");
    let dir = common::temp_dir("readme-fit");
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/hf/qwen2.5-0.5b/config.json"),
        dir.join("config.json"),
    )
    .expect("copy the config");
    let fit = dir.join("fit.ron");
    std::fs::write(&fit, block).expect("write");
    let (code, out, err) = vramscope(&["check", fit.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{out}{err}");
    let v = sweep_json(&[fit.to_str().expect("utf-8"), "--batch", "1,2"]);
    let peaks: Vec<u64> = v["points"]
        .as_array()
        .expect("points")
        .iter()
        .filter_map(|p| p["peak_allocated"].as_u64())
        .collect();
    assert_eq!(peaks.len(), 2, "{v}");
    assert!(
        peaks[1] > peaks[0],
        "a larger batch peaks higher: {peaks:?}"
    );
}
