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
