//! engine.md §12: the real adam-step trace, request for request.

use crate::alloc::Action;

use super::super::{EngineConfig, OptimizerConfig, Step};
use super::*;

#[test]
fn adamw_step_reproduces_the_real_trace() {
    let model = ModelConfig::linear(10_000, 1_000, 16);
    let mut e = engine_with(model, OptimizerConfig::adamw(), EngineConfig::default());
    let mut steps = forward_steps();
    steps.push(Step::Backward {
        loss: s("loss"),
        retain_graph: false,
    });
    steps.push(Step::OptimizerStep);
    let p = program(steps, 1);
    run(&mut e, &p);
    let evs = e.take_events();
    let w = 1_000 * 10_000 * 4; // 40,000,000
    let b = 1_000 * 4; // 4,000
    let ws = 2 * 4096 * 1024 + 8 * 16 * 1024; // 8,519,680 (§1.6)
    let lt = 1 << 20; // transient cuBLASLt workspace, 1 MiB (§1.6)
    let expected: Vec<i64> = vec![
        w,
        b,                 // 1, 2: parameters
        16 * 10_000 * 4,   // 3: x
        16 * 1_000 * 4,    // 4: addmm output
        lt,                // 5: Lt workspace …
        ws,                // 6: cuBLAS workspace, never freed
        -lt,               // 5: … freed at the end of the call
        4,                 // 7: loss
        4,                 // 8: seed
        w,                 // 9: grad of W
        16 * 1_000 * 4,    // 10: contiguous copy of the expanded sum gradient …
        ws,                // 11: backward-thread workspace
        -(16 * 1_000 * 4), // 10: … freed right after
        b,                 // 12: bias grad
        -4,                // 13: seed freed
        w,
        w,
        b,
        b, // 14–17: exp_avg / exp_avg_sq
        w,
        b, // 18–19: foreach sqrt list
        -b,
        -w, // 20–21: freed at the end of step (list dies last-first)
    ];
    assert_eq!(requests(&evs), expected);
    // Segment layout: W gets 40,000,000 rounded up to 2 MiB; the bias a 2 MiB small segment.
    let segs: Vec<u64> = alloc_events(&evs)
        .iter()
        .filter(|a| a.action == Action::SegmentAlloc)
        .map(|a| a.size)
        .collect();
    assert_eq!(segs[0], 40_000_000u64.div_ceil(2 << 20) * (2 << 20));
    assert_eq!(segs[1], 2 << 20);
    // Final state: 13 live blocks (W, b, x, out, ws, loss, gW, ws2, gb, 4 × state).
    assert_eq!(e.allocator().active_blocks(), 13);
    // Every request carries its attribution.
    let first = alloc_events(&evs)[0];
    let info = e.tag_info(first.tag).expect("tagged");
    assert_eq!(info.category, super::super::Category::Parameter);
    // Peak of the iteration (§11.3): at the end of the foreach sqrt list.
    // Block sizes follow §1.2 (multiples of 512; these large requests are split
    // off their segments): 5 × W (param, grad, 2 state, sqrt), 5 × b (4,000 →
    // 4,096), x, out, two workspaces and the 0-dim loss (512).
    let peak =
        5 * 40_000_000 + 5 * round512(4_000) + 640_000 + 64_000 + 2 * 8_519_680 + round512(4);
    assert_eq!(e.peak_allocated_bytes(), peak);
}
