//! The hand-written Transformer (issue 42), captured on an H100 on
//! 2026-12-05 (tests/fixtures/pytorch/handwritten_transformer.py: its own
//! softmax, `h * torch.sigmoid(h)`, a `masked_fill` causal mask, a learned
//! position table), against the built-in scenario that writes it op for op
//! in the module language (`Softmax(Manual)`, `SigmoidMul`, `CausalMask`,
//! `MaskedAttention`, `Positions`, `Frame`). Its trace replays address for
//! address and ends with PyTorch's own `memory_stats()` (`replay_checks`,
//! inside `check`).

use crate::harness::*;

#[test]
fn handwritten_transformer_matches_the_h100() {
    check("handwritten-transformer", "handwritten_transformer", EXACT);
}

/// Every request and free of the scenario's run where the capture has it:
/// each hand-written op saves what PyTorch's autograd saves (the softmax's
/// exp result twice over, max's indices, the row sums, the sigmoid beside
/// its input) and its backward makes what the H100 made, in order.
#[test]
fn handwritten_transformer_requests_what_the_h100_requested() {
    requests_in_place("handwritten-transformer", "handwritten_transformer");
}

/// What writing the ops by hand costs, from PyTorch's saved-tensor rules:
/// the same model with `F.softmax` and `nn.SiLU` keeps, per layer at the
/// peak (backward's start, everything saved), neither exp's result
/// [4, 8, 256, 256] fp32 (the fused softmax saves only its output, which
/// both keep as the `@ v` operand), max's int64 indices [4, 8, 256, 1],
/// the row sums [4, 8, 256, 1] fp32, nor sigmoid's output [4, 256, 2048]
/// fp32. The figures are the engine's (the fused program was not captured).
#[test]
fn writing_the_softmax_and_silu_by_hand_costs_their_saved_tensors() {
    use vramscope::scenario::{load_str, run, RunOptions};
    let source = vramscope::scenario::builtin("handwritten-transformer")
        .expect("built in")
        .source;
    let fused = source
        .replace("softmax: Manual", "softmax: Fused")
        .replace("(\"act\", SigmoidMul)", "(\"act\", SiLU)");
    assert_ne!(fused, source);
    let peak = |text: &str| {
        let (s, built) = load_str(text, "handwritten-transformer.ron").expect("loads");
        let opts = RunOptions {
            iterations: None,
            record_events: false,
        };
        run(&s, &built, &opts).peak_allocated
    };
    let (layers, b, h, t, ff) = (6, 4, 8, 256, 2048);
    let per_layer = b * h * t * t * 4 + b * h * t * 8 + b * h * t * 4 + b * t * ff * 4;
    assert_eq!(peak(source) - peak(&fused), layers * per_layer);
}
