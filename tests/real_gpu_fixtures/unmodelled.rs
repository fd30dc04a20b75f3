//! Captures of models the scenario language cannot write yet (issue 42),
//! made on an H100 on 2026-12-05: a hand-written Transformer (its own
//! softmax, `x * torch.sigmoid(x)`) and a small top-2 mixture of experts.
//! No scenario describes them; their traces replay address for address and
//! end with PyTorch's own `memory_stats()`, so they are ground truth for the
//! models to come (and `vramscope trace` holds the Transformer to its
//! capture: tests/trace_program.rs).

use crate::harness::replay_checks;

#[test]
fn handwritten_transformer_replays_as_on_the_h100() {
    let m = replay_checks("handwritten_transformer");
    assert_eq!(m["oom"], serde_json::Value::Null);
}

#[test]
fn moe_small_replays_as_on_the_h100() {
    let m = replay_checks("moe_small");
    assert_eq!(m["iterations_run"], 3);
}
