//! `attach --replay` on recordings of a real job on an H100 (PyTorch
//! 2.11.0+cu130; tests/fixtures/live/README.md): the job of
//! `python/gpu/live_oom_check.py`, recorded once by the C++ agent and once by
//! polling. What the job does is known by construction: eight AdamW steps
//! that each keep 2 MiB (line 83), then 64 MiB allocations to an OOM.

use std::process::Command;

use serde_json::Value;

const MIB: u64 = 1 << 20;

fn replay(file: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["attach", "--replay", file, "--json"])
        .output()
        .expect("run vramscope");
    assert!(
        out.status.success(),
        "{file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

fn check_job(file: &str, mode: &str) -> Value {
    let v = replay(file);
    let live = &v["live"];
    assert_eq!(live["mode"], mode, "{file}");
    assert!(live["torch"]
        .as_str()
        .is_some_and(|t| t.starts_with("2.11")));
    assert_eq!(live["steps_seen"], 8, "{file}");
    assert_eq!(live["step_source"], "Optimizer.step", "{file}");
    assert_eq!(live["started_over"], serde_json::json!([]), "{file}");
    assert_eq!(live["lost"], serde_json::json!([]), "{file}");

    // Live bytes at each step boundary grow by the 2 MiB kept, nothing else.
    let growth: Vec<u64> = live["growth"][0]["growth_per_step"]
        .as_array()
        .expect("growth")
        .iter()
        .map(|g| g.as_u64().expect("growth is positive"))
        .collect();
    assert_eq!(growth, vec![2 * MIB; 7], "{file}");

    // The job's own memory_stats() at its steps show the same creep; the
    // stats read at the OOM (mid-step, 1 GiB allocated) are no step's.
    let trend = &live["memory_per_step"][0];
    assert_eq!(trend["allocated_per_step"], 2 * MIB, "{file}: {trend}");

    // The leak analysis names the line that keeps them.
    let findings = v["devices"][0]["leaks"]["findings"]
        .as_array()
        .expect("findings");
    let kept = findings
        .iter()
        .find(|f| {
            f["root"]
                .as_str()
                .is_some_and(|r| r.contains("live_oom_check.py:83"))
        })
        .unwrap_or_else(|| panic!("{file}: line 83 is flagged: {findings:?}"));
    assert_eq!(kept["growth_per_iter"], 2 * MIB, "{file}");

    // The OOM, with PyTorch's own message after the observer's record.
    let ooms = live["ooms"].as_array().expect("ooms");
    assert_eq!(ooms.len(), 1, "{file}");
    assert_eq!(ooms[0]["alloc_size"], 64 * MIB, "{file}");
    let message = ooms[0]["pytorch_message"]
        .as_str()
        .expect("PyTorch's message");
    assert!(
        message.starts_with("CUDA out of memory. Tried to allocate 64.00 MiB."),
        "{file}: {message}"
    );
    assert_eq!(v["devices"][0]["oom_count"], 1, "{file}");
    v
}

#[test]
fn the_agent_s_recording_of_a_real_job_flags_its_leak_and_its_oom() {
    check_job("tests/fixtures/live/leak-oom-h100-agent.vslive", "agent");
}

#[test]
fn the_poll_mode_recording_of_the_same_job_ends_in_the_same_map() {
    let agent = check_job("tests/fixtures/live/leak-oom-h100-agent.vslive", "agent");
    let poll = check_job("tests/fixtures/live/leak-oom-h100-poll.vslive", "poll");
    for key in ["reserved", "allocated", "segments", "largest_free_block"] {
        assert_eq!(
            agent["devices"][0][key], poll["devices"][0][key],
            "{key}: both modes rebuild the job's map"
        );
    }
}

/// The line of `python/gpu/holders_job.py` where the loop's frame is at
/// each walk: the optimizer's step, the boundary the helper walks at.
fn step_line() -> usize {
    let src = std::fs::read_to_string("python/gpu/holders_job.py").expect("the job's source");
    1 + src
        .lines()
        .position(|l| l.contains("self.opt.step()"))
        .expect("the step's line")
}

/// The chain of a holders walk `w` that names `self.val_history`.
fn val_history_chain<'a>(w: &'a Value, file: &str) -> &'a Value {
    w["chains"]
        .as_array()
        .expect("chains")
        .iter()
        .find(|c| c["path"] == serde_json::json!(["self", ".val_history"]))
        .unwrap_or_else(|| panic!("{file}: self.val_history is named: {w}"))
}

/// `python/gpu/holders_job.py` run for real on an H100 (2026-12-05,
/// PyTorch 2.11.0+cu130) under `python -m vramscope_live --record`, once in
/// each mode: ten steps that each keep the validation score, with its graph,
/// in `self.val_history`. The helper's walks name that attribute from the
/// frame that runs the loop, with one more item at each walk, and the fix.
fn check_holders_job(file: &str, mode: &str) -> Value {
    let v = replay(file);
    let live = &v["live"];
    assert_eq!(live["mode"], mode, "{file}");
    assert_eq!(live["steps_seen"], 10, "{file}");
    assert_eq!(live["step_source"], "Optimizer.step", "{file}");
    let walks = live["holders"].as_array().expect("holders");
    assert!(walks.len() >= 3, "{file}: {walks:?}");
    let mut items = Vec::new();
    for w in walks {
        assert_eq!(w["reason"], "grew", "{file}");
        let chain = val_history_chain(w, file);
        assert_eq!(
            chain["where"],
            format!("holders_job.py:{} in train", step_line()),
            "{file}"
        );
        assert_eq!(chain["holder"], "list", "{file}");
        assert!(
            chain["fix"]
                .as_str()
                .is_some_and(|f| f.contains("self.val_history.append(x.item())")),
            "{file}: {chain}"
        );
        items.push(chain["items"].as_u64().expect("items"));
    }
    assert!(
        items.windows(2).all(|w| w[0] < w[1]),
        "{file}: the list grows between walks: {items:?}"
    );
    // Each step keeps one more score: 4 MiB and 20 KiB of saved tensors
    // (the batch, the ReLU's result, the last Linear's output) and the
    // 0-dim score itself, 4 bytes.
    let growth = live["growth"][0]["growth_per_step"]
        .as_array()
        .expect("growth");
    assert!(
        growth
            .iter()
            .all(|g| g.as_u64() == Some(4 * MIB + 20 * 1024 + 4)),
        "{file}: {growth:?}"
    );
    v
}

#[test]
fn a_real_job_s_recordings_name_the_variable_that_keeps_what_grew() {
    let agent = check_holders_job("tests/fixtures/live/holders-job-h100-agent.vslive", "agent");
    let poll = check_holders_job("tests/fixtures/live/holders-job-h100-poll.vslive", "poll");
    assert_eq!(agent["live"]["growth"], poll["live"]["growth"]);
}

/// `python/gpu/holders_job.py` traced on the CPU (`vramscope trace --steps 0
/// --record`, PyTorch 2.11.0 on the meta device:
/// tests/fixtures/trace/holders-job.vslive; `tests/trace_program.rs`
/// regenerates it). The trace's own walk names the same variable as the
/// H100 job's helper, at every step after the first (no clock in a trace),
/// with what each score's graph really keeps: the H100 recordings were made
/// by a helper that undercounted it, but their growth per step, from the
/// allocator's own entries, is the trace's too.
#[test]
fn a_traced_run_names_the_variable_with_what_its_graphs_keep() {
    let file = "tests/fixtures/trace/holders-job.vslive";
    let v = replay(file);
    let live = &v["live"];
    assert_eq!(live["mode"], "trace");
    assert_eq!(live["steps_seen"], 10);
    // The program's shapes: each validation score's graph saves the input
    // (512 × 1024 fp32), the ReLU's result (the same) and the last
    // Linear's output (512 × 10 fp32), for `square`.
    let per_score: u64 = 2 * 512 * 1024 * 4 + 512 * 10 * 4;
    let score = 4; // a 0-dim float32
    let h100 = replay("tests/fixtures/live/holders-job-h100-agent.vslive");
    assert_eq!(
        live["growth"], h100["live"]["growth"],
        "the trace grows as the H100 job did, step by step"
    );
    let growth: Vec<u64> = live["growth"][0]["growth_per_step"]
        .as_array()
        .expect("growth")
        .iter()
        .map(|g| g.as_u64().expect("a growth"))
        .collect();
    assert_eq!(growth, vec![per_score + score; 9]);

    let walks = live["holders"].as_array().expect("holders");
    assert_eq!(walks.len(), 9, "a walk at steps 2..=10 (1 is the baseline)");
    for (i, w) in walks.iter().enumerate() {
        assert_eq!(w["reason"], "grew");
        assert_eq!(w["complete"], true);
        assert_eq!(w["step"], i as u64 + 2);
        assert!(w["spent_ms"].as_f64() <= w["budget_ms"].as_f64(), "{w}");
        let chain = val_history_chain(w, file);
        assert_eq!(
            chain["where"],
            format!("holders_job.py:{} in train", step_line())
        );
        // One more score at each step, kept with its graph.
        let items = i as u64 + 1;
        assert_eq!(chain["holder"], "list");
        assert_eq!(chain["items"], items);
        assert_eq!(chain["bytes"], items * score);
        assert_eq!(chain["graph_bytes"], items * per_score);
        assert_eq!(chain["graph_complete"], true);
        assert_eq!(chain["example"]["graph_bytes"], per_score);
        assert_eq!(chain["grew_bytes"], growth[i], "what grew is the holder's");
        assert!(chain["fix"]
            .as_str()
            .is_some_and(|f| f.contains("self.val_history.append(x.item())")));
    }
    // The last walk is the list alone: nothing else the job names grew.
    assert_eq!(walks[8]["chains"].as_array().map(Vec::len), Some(1));
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["attach", "--replay", file, "--headless"])
        .output()
        .expect("run vramscope");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "holders_job.py:{} in train: self.val_history (list, 9 items) → [8]: 0-dim tensor \
             float32, grad_fn=MeanBackward0, its graph keeps 4.02 MiB of saved tensors",
            step_line()
        )),
        "{text}"
    );
}

/// `python/gpu/oom_holders_job.py` traced (tests/fixtures/trace/oom-holders-job.vslive):
/// under a 1 GiB fraction it keeps every evaluation output, with its graph,
/// in `outputs` until the simulated GPU runs out. At that request the
/// trace's walk names the list with what it keeps.
#[test]
fn a_traced_oom_names_what_held_the_memory_when_the_request_failed() {
    let file = "tests/fixtures/trace/oom-holders-job.vslive";
    let v = replay(file);
    let live = &v["live"];
    assert_eq!(live["ooms"].as_array().map(Vec::len), Some(1));
    let walks = live["holders"].as_array().expect("holders");
    assert_eq!(walks.len(), 1, "{walks:?}");
    let w = &walks[0];
    assert_eq!(w["reason"], "oom");
    assert_eq!(w["step"], serde_json::Value::Null);
    let chain = &w["chains"][0];
    assert_eq!(chain["path"], serde_json::json!(["outputs"]));
    assert_eq!(chain["holder"], "list");
    let src = std::fs::read_to_string("python/gpu/oom_holders_job.py").expect("the job");
    let line = 1 + src
        .lines()
        .position(|l| l.contains("batch = torch.randn"))
        .expect("the batch's line");
    assert_eq!(
        chain["where"],
        format!("oom_holders_job.py:{line} in evaluate")
    );
    // Each output (256 × 1024 fp32) keeps its batch (the same) and the
    // ReLU's result (256 × 4096 fp32).
    let items = chain["items"].as_u64().expect("items");
    assert_eq!(chain["bytes"], items * MIB);
    assert_eq!(chain["graph_bytes"], items * 5 * MIB);
    // They are most of the 1 GiB the job may use.
    let allocated = w["allocated"].as_u64().expect("allocated");
    assert!(allocated <= 1 << 30 && 6 * MIB * items > allocated * 9 / 10);
    assert!(chain["fix"]
        .as_str()
        .is_some_and(|f| f.starts_with("outputs.append(")));
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["attach", "--replay", file, "--headless"])
        .output()
        .expect("run vramscope");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("holders (when the allocation failed: out of memory"),
        "{text}"
    );
}
