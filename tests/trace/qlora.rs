//! Issue 42's rule for the QLoRA fine-tune: tests/fixtures/pytorch/
//! qlora_finetune.py traced (real bitsandbytes, transformers and peft on the
//! CPU; bitsandbytes' CUDA kernels run on the simulated GPU, docs/trace.md)
//! against the built-in `qlora-finetune` (the engine's model of
//! bitsandbytes, docs/spec-models-13-bitsandbytes.md, transformers 5.x's
//! loading and forward). Everything up to the logits agrees request for
//! request (the forward's packed-sequence check reads True on the arange
//! positions, whose values the trace knows), and so does what bitsandbytes
//! asks for throughout, and everything after: the two make the same
//! requests to the end (docs/trace.md, "QLoRA").

use std::path::{Path, PathBuf};
use std::process::Command;

use vramscope::alloc::Action;
use vramscope::trace::snapshot::import_file;

use super::captures::requests;
use super::{trace, Scratch};

/// The releases the scenario follows and the test installs.
pub const NEEDS_QLORA: &str = "needs PyTorch, bitsandbytes, transformers and peft \
     (pip install torch==2.11.* bitsandbytes==0.50.2 transformers==5.16.1 peft==0.21.2)";

/// The Python with all four, or a failure saying what to install.
fn qlora_python() -> String {
    super::python_that_runs(
        "import torch, bitsandbytes, transformers, peft",
        &format!("{NEEDS_QLORA}, or point VRAMSCOPE_PYTHON at a Python that has them"),
    )
}

/// A frame: file, line, function.
pub(crate) type Frame = (String, i64, String);

/// A snapshot's allocations in order: (size, its stack).
pub(crate) fn allocations(path: &Path) -> Vec<(u64, Vec<Frame>)> {
    let snap = import_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let trace = snap.device_traces.first().expect("device 0's trace");
    trace
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .map(|e| {
            let frames = snap
                .frames
                .resolve(e.frames)
                .map(|f| (f.filename.to_string(), f.line, f.name.to_string()))
                .collect();
            (e.size, frames)
        })
        .collect()
}

/// What bitsandbytes asked for, by kind: the forward's `gemm_4bit`
/// temporaries, the backward's dequantisation, and each weight's
/// quantisation at load (one list per weight).
#[derive(Default)]
struct Bnb {
    forward: Vec<u64>,
    backward: Vec<u64>,
    quantize: Vec<Vec<u64>>,
}

impl Bnb {
    fn push_quantize(&mut self, size: u64, open: &mut bool) {
        if !*open {
            self.quantize.push(Vec::new());
            *open = true;
        }
        if let Some(g) = self.quantize.last_mut() {
            g.push(size);
        }
    }
}

/// The traced program's: by bitsandbytes 0.50.2's own frames. The
/// fallback's temporaries are lines 911, 913 and 914 of
/// backends/cuda/ops.py (`absmax_dq`, `absmax_dq + absmax_offset`, `B_dq`;
/// 916 is `F.linear`, which the scenario names `linear`).
fn traced_bnb(path: &Path) -> Bnb {
    let mut out = Bnb::default();
    let (mut open, mut in_op) = (false, false);
    for (size, frames) in allocations(path) {
        let own = |f: &&Frame| !f.0.contains("vramscope_trace") && !f.0.contains("/torch/");
        let top = frames.iter().find(own);
        let in_fallback = top.is_some_and(|f| {
            f.2 == "_dequant_linear_fallback"
                && f.0.ends_with("bitsandbytes/backends/cuda/ops.py")
                && [911, 913, 914].contains(&f.1)
        });
        let in_backward = frames
            .iter()
            .any(|f| f.2 == "backward" && f.0.ends_with("bitsandbytes/autograd/_functions.py"));
        let in_quantize = frames
            .iter()
            .any(|f| f.2 == "_quantize" && f.0.ends_with("bitsandbytes/nn/modules.py"));
        if in_quantize {
            // A weight's quantisation begins with `quantize_4bit`'s CUDA
            // op (its absmax, then the packed weight).
            let mut own_frames = frames.iter().filter(own);
            let op = own_frames
                .next()
                .is_some_and(|f| f.0.ends_with("bitsandbytes/backends/cuda/ops.py"))
                && own_frames
                    .next()
                    .is_some_and(|f| f.2 == "quantize_4bit" && f.0.ends_with("functional.py"));
            if op && !in_op {
                open = false;
            }
            in_op = op;
            out.push_quantize(size, &mut open);
            continue;
        }
        open = false;
        in_op = false;
        if in_fallback {
            out.forward.push(size);
        } else if in_backward {
            out.backward.push(size);
        }
    }
    out
}

/// The scenario's: by the op names the engine gives them. Its
/// `Params4bit._quantize` begins with the weight's copy to the device,
/// which transformers 5.x makes before it builds the Params4bit
/// (`core_model_loading.py`'s `_materialize_copy`): left out here, as the
/// trace's grouping leaves it out.
fn scenario_bnb(path: &Path) -> Bnb {
    let mut out = Bnb::default();
    let (mut open, mut weight) = (false, String::new());
    for (size, frames) in allocations(path) {
        let name = frames.first().map(|f| f.2.as_str()).unwrap_or("");
        if name.contains("(Params4bit._quantize in ") {
            // One weight's quantisation: the frames name its module.
            if !open || name != weight {
                open = true;
                weight = name.to_string();
                out.quantize.push(Vec::new());
                continue; // the weight's copy
            }
            out.push_quantize(size, &mut open);
            continue;
        }
        open = false;
        if name.contains("(MatMul4Bit in ") {
            out.forward.push(size);
        } else if name.contains("(MatMul4BitBackward in ") {
            out.backward.push(size);
        }
    }
    out
}

/// A snapshot's segment calls in order: (a new segment?, its size, its
/// address relative to the first segment's, in MiB).
fn segments(path: &Path) -> Vec<(bool, u64, i64)> {
    let snap = import_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let trace = snap.device_traces.first().expect("device 0's trace");
    let mut first = None;
    trace
        .iter()
        .filter(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentFree))
        .map(|e| {
            let base = *first.get_or_insert(e.addr);
            let mib = (e.addr as i128 - base as i128) >> 20;
            (e.action == Action::SegmentAlloc, e.size, mib as i64)
        })
        .collect()
}

fn peak(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} in the report"))
}

#[test]
#[ignore = "needs PyTorch, bitsandbytes, transformers and peft (pip install torch==2.11.* bitsandbytes==0.50.2 transformers==5.16.1 peft==0.21.2)"]
fn qlora_traced_makes_the_scenarios_bitsandbytes_requests() {
    qlora_python();
    let scratch = Scratch::new("qlora");
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch");
    let traced = scratch.0.join("qlora_finetune.pickle");
    let (code, out, err) = trace(
        &["--json", "--steps", "0"],
        &fixtures.join("qlora_finetune.py"),
        &[&traced.to_string_lossy()],
    );
    assert!(traced.exists(), "traced nothing (exit {code}): {err}");
    let sidecar: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(traced.with_extension("json")).expect("the program's JSON"),
    )
    .expect("JSON");
    assert_eq!(
        sidecar["bitsandbytes"], "0.50.2",
        "the scenario follows bitsandbytes 0.50.2: {NEEDS_QLORA}"
    );
    assert_eq!(sidecar["iterations_run"], 3, "{err}");
    let report = super::common::json(&out);

    let exported = scratch.0.join("qlora-finetune.pickle");
    let run = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["export", "qlora-finetune", "-o"])
        .arg(&exported)
        .output()
        .expect("vramscope runs");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let (rc, scen_out, scen_err) = super::common::vramscope(&["run", "qlora-finetune", "--json"]);
    assert!(rc == 0 || rc == 1, "run qlora-finetune: {scen_err}");
    let scenario = super::common::json(&scen_out);

    let (t, s) = (traced_bnb(&traced), scenario_bnb(&exported));
    // 24 layers x 7 projections, three iterations, each layer's forward
    // run twice (checkpointing recomputes it in backward): 3 temporaries a call.
    assert_eq!(
        t.forward.len(),
        168 * 3 * 2 * 3,
        "forward's gemm_4bit temporaries traced"
    );
    assert_eq!(t.forward, s.forward, "the forward's gemm_4bit fallback");
    assert_eq!(
        t.backward.len(),
        168 * 3 * 3,
        "backward's dequantisations traced"
    );
    assert_eq!(t.backward, s.backward, "MatMul4Bit's backward");
    // Loading quantises in the checkpoint's key order (transformers 5.x,
    // `dot_natural_key`), the scenario too.
    assert_eq!(t.quantize.len(), 168, "one quantisation per 4-bit weight");
    assert_eq!(
        t.quantize, s.quantize,
        "what quantisation asks for, weight by weight"
    );

    // Everything, request for request: loading (the warm-up block, the
    // checkpoint's keys in order), prepare_model_for_kbit_training, LoRA,
    // the optimizer, three iterations of the forward (past
    // find_packed_sequence_indices' `.all()`, True on the arange positions
    // as on a GPU: the trace knows their values), the loss (the final
    // norm's fp32 output held by Qwen2ForCausalLM.forward until its loss
    // is made), each layer's reentrant-checkpoint backward (its incoming
    // gradients summed out of place: the caller and the nested backward's
    // GraphRoot hold them; q's and k's head views copying their gradients)
    // and AdamW's step.
    let (tr, sr) = (requests(&traced), requests(&exported));
    assert!(tr.len() > 70_000, "only {} request groups traced", tr.len());
    if let Some(at) = tr.iter().zip(&sr).position(|(a, b)| a != b) {
        panic!(
            "the requests part at group {at} of {}: traced {:?}, scenario {:?}",
            tr.len(),
            tr[at],
            sr[at]
        );
    }
    assert_eq!(
        tr.len(),
        sr.len(),
        "one run makes more requests after the other's last"
    );
    assert!(
        !allocations(&traced).iter().any(|(_, frames)| frames
            .iter()
            .any(|f| f.2 == "sdpa_mask" && f.0.ends_with("transformers/masking_utils.py"))),
        "no causal mask is built: the packed-sequence check reads True"
    );

    // The figures: the same requests on the same driver layout, so every
    // figure is equal. Both sides tell the H100 driver model that kernels
    // started at the first weight's quantisation (bitsandbytes'
    // quantize_4bit, backends/cuda/ops.py:391-418), not at the warm-up
    // block or a checkpoint tensor's copy (transformers 5.x's
    // caching_allocator_warmup and _materialize_copy launch no kernel),
    // so both put the first small segment 74 MiB below the first segment
    // and open the held range at the same request (docs/driver_addresses.md).
    let (ts, ss) = (segments(&traced), segments(&exported));
    assert_eq!(
        ts.get(1),
        Some(&(true, 2 << 20, -74)),
        "the first small segment"
    );
    if let Some(at) = ts.iter().zip(&ss).position(|(a, b)| a != b) {
        panic!(
            "segment call {at} of {}: traced {:?}, scenario {:?} (new?, bytes, MiB from the first)",
            ts.len(),
            ts[at],
            ss[at]
        );
    }
    assert_eq!(ts.len(), ss.len(), "segment calls");
    assert_eq!(
        peak(&report, "peak_allocated"),
        peak(&scenario, "peak_allocated"),
        "peak allocated"
    );
    assert_eq!(
        peak(&report, "peak_reserved"),
        peak(&scenario, "peak_reserved"),
        "peak reserved"
    );
    let ends = sidecar["per_iteration"].as_array().expect("per_iteration");
    let scen_ends = scenario["per_iteration"].as_array().expect("per_iteration");
    assert_eq!(ends.len(), scen_ends.len());
    for (a, b) in ends.iter().zip(scen_ends) {
        assert_eq!(
            peak(a, "allocated"),
            peak(b, "allocated"),
            "allocated at an iteration's end"
        );
    }
}
