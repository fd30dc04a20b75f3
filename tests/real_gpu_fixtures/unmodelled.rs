//! Captures of models the scenario language cannot write yet (issue 42),
//! made on an H100 on 2026-12-05: a small top-2 mixture of experts. No
//! scenario describes it; its trace replays address for address and ends
//! with PyTorch's own `memory_stats()`, so it is ground truth for the model
//! to come. (The hand-written Transformer captured beside it is written in
//! the module language now: handwritten.rs.)

use crate::harness::replay_checks;

#[test]
fn moe_small_replays_as_on_the_h100() {
    let m = replay_checks("moe_small");
    assert_eq!(m["iterations_run"], 3);
}
