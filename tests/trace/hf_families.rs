//! Issue 42's families traced against their scenarios: for each
//! `model_type` `HfConfig` reads, a tiny config of that family
//! (tests/fixtures/hf-trace/<family>/config.json: 2 layers, hidden 64, vocab
//! 256, bf16, the family's own fields kept) trained two steps by
//! tests/fixtures/hf-trace/train.py (`AutoModelForCausalLM.from_config`,
//! `.to("cuda")`, AdamW, `model(input_ids, labels=labels).loss`, backward,
//! step) under `vramscope trace` with transformers 5.16.1, against the
//! scenario beside the config (`HfConfig("config.json")`, `transformers:
//! "5.16"`, `hf_use_cache: true` as `from_config`'s `use_cache` default
//! makes a `DynamicCache` in training). Each test holds the two equal from
//! the first request to the last, and where they part names the first
//! difference and the traced line that made it (docs/trace.md, "Hugging
//! Face families").

use std::path::{Path, PathBuf};
use std::process::Command;

use super::captures::requests;
use super::{trace, Scratch};

pub const NEEDS_TRANSFORMERS: &str =
    "needs PyTorch and transformers 5.16.1 (pip install torch==2.11.* transformers==5.16.1)";

/// The Python with torch and transformers 5.16.1 (the release the
/// scenarios name and whose lines the expectations cite), or a failure
/// saying what to install.
fn transformers_python() -> String {
    super::python_that_runs(
        "import sys, torch, transformers; sys.exit(transformers.__version__ != \"5.16.1\")",
        &format!("{NEEDS_TRANSFORMERS}, or point VRAMSCOPE_PYTHON at a Python that has it"),
    )
}

/// Each allocation of a traced snapshot: its size and the first frame of
/// the program's (not the trace helper's, not torch's) as `file:line`.
fn traced_allocations(path: &Path) -> Vec<(u64, String)> {
    super::qlora::allocations(path)
        .into_iter()
        .map(|(size, frames)| {
            let own = frames
                .iter()
                .find(|(file, _, _)| !file.contains("vramscope_trace") && !file.contains("/torch/"))
                .map(|(file, line, _)| {
                    let file = file.rsplit('/').next().unwrap_or_default();
                    format!("{file}:{line}")
                })
                .unwrap_or_default();
            (size, own)
        })
        .collect()
}

/// [`requests`]' groups: (an allocation?, its sizes).
type Requests = Vec<(bool, Vec<u64>)>;

/// The family traced (train.py with `args` after the config) and the
/// scenario file beside its config exported: (traced, scenario) requests
/// and the traced allocations.
fn run(family: &str, scenario: &str, args: &[&str]) -> (Requests, Requests, Vec<(u64, String)>) {
    transformers_python();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf-trace");
    let scratch = Scratch::new(&format!("hf-{family}"));
    let traced = scratch.0.join("traced.pickle");
    let config = dir.join(family).join("config.json");
    let config = config.to_string_lossy();
    let mut program_args = vec![config.as_ref()];
    program_args.extend_from_slice(args);
    let (code, _, err) = trace(
        &[
            "--json",
            "--steps",
            "0",
            "--export",
            &traced.to_string_lossy(),
        ],
        &dir.join("train.py"),
        &program_args,
    );
    assert_eq!(code, 0, "{family}: the trace failed: {err}");
    assert!(traced.exists(), "{family}: traced nothing: {err}");
    let exported = scratch.0.join("scenario.pickle");
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .arg("export")
        .arg(dir.join(family).join(scenario))
        .arg("-o")
        .arg(&exported)
        .output()
        .expect("vramscope runs");
    assert!(
        out.status.success(),
        "{family}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        requests(&traced),
        requests(&exported),
        traced_allocations(&traced),
    )
}

/// The family traced and its scenario make the same requests from the
/// first to the last (two steps: loading, forward, loss, backward, AdamW),
/// byte for byte and in order; where they part, the first difference and
/// the traced line that made it.
fn equal(family: &str) {
    equal_to(family, "scenario.ron", &[]);
}

/// [`equal`] with `args` after the config and the scenario file `scenario`.
fn equal_to(family: &str, scenario: &str, args: &[&str]) {
    let (t, s, allocs) = run(family, scenario, args);
    assert!(t.len() > 500, "{family}: only {} groups traced", t.len());
    if let Some(at) = t.iter().zip(&s).position(|(a, b)| a != b) {
        // requests(): a free group before each allocation, so group 2i + 1
        // is allocation i.
        let (size, line) = &allocs[at.saturating_sub(1) / 2];
        panic!(
            "{family}: the requests part at group {at} of {}: traced {:?}, scenario {:?} \
             (the last traced allocation at or before it: {size} B at {line})",
            t.len(),
            t[at],
            s[at]
        );
    }
    assert_eq!(
        t.len(),
        s.len(),
        "{family}: one run makes more requests after the other's last"
    );
}

// B 2, T 32, hidden 64, bf16. What made each family equal to the end
// (docs/trace.md, "Hugging Face families"): the head views' ViewBackward0
// copies (q and k after the rotation, v after the cache's cat), in-place
// gradient sums into a dense (not only contiguous) buffer, SDPA's output
// laid out as q (Phi-3's contiguous q is copied back), Phi-3's node order,
// Gemma 3's two rotary tables and its (1 + weight) q/k norms.

#[test]
#[ignore = "needs PyTorch and transformers 5.16.1 (pip install torch==2.11.* transformers==5.16.1)"]
fn qwen3_traced_makes_the_scenarios_requests() {
    equal("qwen3");
}

#[test]
#[ignore = "needs PyTorch and transformers 5.16.1 (pip install torch==2.11.* transformers==5.16.1)"]
fn phi3_traced_makes_the_scenarios_requests() {
    equal("phi3");
}

#[test]
#[ignore = "needs PyTorch and transformers 5.16.1 (pip install torch==2.11.* transformers==5.16.1)"]
fn gemma2_traced_makes_the_scenarios_requests() {
    equal("gemma2");
}

#[test]
#[ignore = "needs PyTorch and transformers 5.16.1 (pip install torch==2.11.* transformers==5.16.1)"]
fn gemma3_traced_makes_the_scenarios_requests() {
    equal("gemma3");
}

/// 5.16's MoE families as 5.16.1 builds them (the scenario's `transformers:
/// "5.16"`): 3-D experts (`gate_up_proj` [E, 2·I, H], modeling_mixtral.py:65-66),
/// the router's fp32 softmax and in-place `/=`, and `grouped_mm_experts_forward`
/// (integrations/moe.py:377-478) with what autograd saves of it; with the
/// dense families' attention rules above, equal to the end.
#[test]
#[ignore = "needs PyTorch and transformers 5.16.1 (pip install torch==2.11.* transformers==5.16.1)"]
fn mixtral_traced_makes_the_scenarios_requests() {
    equal("mixtral");
}

#[test]
#[ignore = "needs PyTorch and transformers 5.16.1 (pip install torch==2.11.* transformers==5.16.1)"]
fn qwen3_moe_traced_makes_the_scenarios_requests() {
    equal("qwen3_moe");
}

/// Qwen2-MoE as 5.16.1 runs it: the MoE rules above, the shared expert and
/// its gate, and the sliding-window mask of window 0 its forward builds and
/// no layer takes (`use_sliding_window` false, configuration_qwen2_moe.py:111;
/// modeling_qwen2_moe.py:493-496; `sdpa_mask`'s aranges and `and_masks`,
/// masking_utils.py:54-56, 507-516), freed as the forward returns.
#[test]
#[ignore = "needs PyTorch and transformers 5.16.1 (pip install torch==2.11.* transformers==5.16.1)"]
fn qwen2_moe_traced_makes_the_scenarios_requests() {
    equal("qwen2_moe");
}

/// The same without a cache (`use_cache=False`, `hf_use_cache: false`):
/// both masks' `_preprocess_mask_arguments` check the positions for packed
/// sequences (masking_utils.py:854), the sliding mask's after the causal
/// one's, before `sdpa_mask` builds it.
#[test]
#[ignore = "needs PyTorch and transformers 5.16.1 (pip install torch==2.11.* transformers==5.16.1)"]
fn qwen2_moe_traced_without_a_cache_makes_the_scenarios_requests() {
    equal_to(
        "qwen2_moe",
        "scenario-no-cache.ron",
        &["2", "32", "2", "no-cache"],
    );
}
