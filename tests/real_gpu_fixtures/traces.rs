//! What the captured traces show beyond the figures: where annotated
//! iterations begin (the leak analysis), and every request in order.

use crate::harness::*;
use vramscope::trace::snapshot::import_file;

/// The real var-batch trace grows its batch 2 → 16 twice: the batch's
/// blocks at the embedding grow at every step and fall back when the
/// schedule starts over, which is reuse, not a leak; the stored-outputs bug
/// keeps one more 8 MiB logits block at every step, which is.
#[test]
fn a_batch_schedule_starting_over_is_not_a_leak_but_stored_outputs_are() {
    use vramscope::leak::analyze_snapshot;
    let var = import_file(&captured("var_batch_fragmentation_bug", "pickle")).expect("imports");
    let report = analyze_snapshot(&var, 0, None);
    assert!(report.boundaries.len() > 20, "{:?}", report.boundary_source);
    assert!(report.survivors.is_empty(), "{:?}", report.survivors);
    let stored = import_file(&captured("store_outputs_bug", "pickle")).expect("imports");
    let report = analyze_snapshot(&stored, 0, None);
    let logits: Vec<_> = report
        .survivors
        .iter()
        .filter(|s| s.growth_per_iter == 8 << 20)
        .collect();
    assert_eq!(logits.len(), 1, "{:?}", report.survivors);
    assert!(logits[0].allocations >= 50, "one block per stored batch");
}

/// The captures ask the allocator for what the scenarios ask, request for
/// request, in order: the embedding backward's sort and segment buffers (up
/// to CUB's temporaries), the order nodes release their saved tensors, and
/// non-reentrant checkpointing's early stop (before the op whose saved
/// inputs complete the region) and its recomputed tensors dying with the
/// node's `apply()` included. The one liberty is a place either way, which
/// the programs' two-statement batch (`x = ...` frees the old `x` before
/// `y` is made) takes against the scenario's `x, y = batch`. Not listed:
/// the mixed-precision runs (the autocast cache empties in hash-map order),
/// the LSTM runs (the next test) and
/// `adam_first_step_oom_bug`, whose OOM falls where the H100's addresses
/// put it (11.8 MB later in the simulation).
#[test]
fn captured_requests_are_the_h100_s_in_order() {
    let mut failed = Vec::new();
    for (scenario, stem) in [
        ("accumulate-loss-eval-bug", "accumulate_loss_eval_bug"),
        ("accumulate-loss-eval-fixed", "accumulate_loss_eval_fixed"),
        ("accumulate-loss-train-bug", "accumulate_loss_train_bug"),
        ("accumulate-loss-train-fixed", "accumulate_loss_train_fixed"),
        ("adam-first-step-sgd", "adam_first_step_sgd"),
        ("amp-fp32", "amp_fp32"),
        ("amp-half-model-bug", "amp_half_model_bug"),
        ("attention-math-fallback", "attention_math_fallback"),
        (
            "tests/fixtures/pytorch/attention-math-bf16.ron",
            "attention_math_bf16",
        ),
        (
            "tests/fixtures/pytorch/checkpoint-math.ron",
            "checkpoint_math",
        ),
        ("bf16-model", "bf16_model"),
        ("buffer-in-loop-bug", "buffer_in_loop_bug"),
        ("buffer-preallocated-fixed", "buffer_preallocated_fixed"),
        ("checkpoint-every-layer", "checkpoint_every_layer"),
        ("checkpoint-none", "checkpoint_none"),
        (
            "checkpoint-reentrant-frozen-bug",
            "checkpoint_reentrant_frozen_bug",
        ),
        (
            "checkpoint-reentrant-frozen-fixed",
            "checkpoint_reentrant_frozen_fixed",
        ),
        ("checkpoint-sqrt-segments", "checkpoint_sqrt_segments"),
        ("eval-inference-mode-fixed", "eval_inference_mode_fixed"),
        ("eval-no-grad-bug", "eval_no_grad_bug"),
        ("eval-no-grad-fixed", "eval_no_grad_fixed"),
        ("finetune-frozen-layers", "finetune_frozen_layers"),
        ("fragmentation-oom-bug", "fragmentation_oom_bug"),
        (
            "fragmentation-oom-empty-cache",
            "fragmentation_oom_empty_cache",
        ),
        (
            "fragmentation-oom-expandable-fixed",
            "fragmentation_oom_expandable_fixed",
        ),
        ("gpt2-small-fits", "gpt2_small_fits"),
        ("gpt2-small-oom", "gpt2_small_oom"),
        ("grad-accum-big-batch-oom", "grad_accum_big_batch_oom"),
        ("grad-accum-fixed", "grad_accum_fixed"),
        ("grad-accum-sum-bug", "grad_accum_sum_bug"),
        ("loss-list-train-bug", "loss_list_train_bug"),
        ("optimizer-cpu-offload", "optimizer_cpu_offload"),
        ("store-outputs-bug", "store_outputs_bug"),
        ("store-outputs-detach-bug", "store_outputs_detach_bug"),
        ("store-outputs-fixed", "store_outputs_fixed"),
        ("tour", "tour"),
        ("var-batch-expandable-fixed", "var_batch_expandable_fixed"),
        ("var-batch-fragmentation-bug", "var_batch_fragmentation_bug"),
        ("var-batch-gc-threshold", "var_batch_gc_threshold"),
        ("var-batch-max-split", "var_batch_max_split"),
        ("zero-grad-fixed", "zero_grad_fixed"),
        ("zero-grad-keep-grads", "zero_grad_keep_grads"),
        ("zero-grad-missing-bug", "zero_grad_missing_bug"),
    ] {
        let (real, sim) = (real_requests(stem), simulated_requests(scenario, stem));
        let off = out_of_place(&real, &sim);
        println!(
            "{scenario}: {} requests, {} out of place",
            real.len(),
            off.len()
        );
        if !off.is_empty() {
            failed.push(format!(
                "{scenario}:\n{}",
                off[..off.len().min(6)].join("\n")
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The LSTM training program asks for what its scenario asks, in order, with
/// cuDNN's measured workspace, dropout state and reserve, which the LSTM
/// scenarios carry: the dropout mask
/// before its output, the dropout state's 8-byte seed, and in the cuDNN
/// backward the zeros for the hidden states' missing gradients, freed with
/// the unneeded dhx and dcx before the incoming gradient. `rnn_hidden_bug`
/// also ends in "backward through the graph a second time": the graph
/// task's buffers go, then the seed. `rnn_hidden_retain_graph_bug`'s
/// backward copies the kept graph's reserve before the cuDNN call
/// (`retain_variables ? result3.clone() : result3`); `rnn_hidden_eval_bug`'s
/// OOM unwinds the model's forward frame, whose locals go in co_varnames
/// order (hidden, emb, output, decoded).
#[test]
fn lstm_requests_are_the_h100_s_in_order() {
    let runs = [
        ("rnn-hidden-fixed", "rnn_hidden_fixed"),
        ("rnn-hidden-bug", "rnn_hidden_bug"),
        ("rnn-hidden-retain-graph-bug", "rnn_hidden_retain_graph_bug"),
        ("rnn-hidden-eval-bug", "rnn_hidden_eval_bug"),
    ];
    for (scenario, stem) in runs {
        requests_in_place(scenario, stem);
    }
}
