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
        let chain = w["chains"]
            .as_array()
            .expect("chains")
            .iter()
            .find(|c| c["path"] == serde_json::json!(["self", ".val_history"]))
            .unwrap_or_else(|| panic!("{file}: self.val_history is named: {w}"));
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
