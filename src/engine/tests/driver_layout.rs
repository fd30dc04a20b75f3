//! The engine tells the device where its kernels start (past the model's
//! `.to()`), so a card whose driver layout is modelled
//! (`Placement::H100Driver`) puts the parameters' segments below the range
//! the context holds and the step's own into it, as the H100 captures show
//! (docs/driver_addresses.md).

use super::*;
use crate::device::Placement;

#[test]
fn parameters_go_below_the_held_range_and_the_steps_segments_into_it() {
    let cfg = EngineConfig {
        placement: Placement::H100Driver,
        ..EngineConfig::default()
    };
    // 64 MiB weights: one segment each; the activations take 20 MiB ones.
    let model = ModelConfig::mlp(&[4096, 4096, 4096, 10], false);
    let mut e = engine_with(model, OptimizerConfig::adamw(), cfg);
    let setup = e.take_events();
    run(&mut e, &program(train_steps(), 1));
    let step = e.take_events();
    let segments = |evs: &[EngineEvent]| -> Vec<u64> {
        alloc_events(evs)
            .iter()
            .filter(|a| a.action == Action::SegmentAlloc)
            .map(|a| a.addr)
            .collect()
    };
    let (params, ours) = (segments(&setup), segments(&step));
    assert!(
        params.len() >= 2 && !ours.is_empty(),
        "{params:x?} {ours:x?}"
    );
    let first = params[0];
    let lowest_param = params[1..].iter().copied().min().unwrap_or(first);
    assert!(
        ours[0] > lowest_param && ours[0] < first,
        "the step's first segment {:#x} lies in the held range, above the \
         parameters' {lowest_param:#x} and below the first segment {first:#x}",
        ours[0]
    );
}
