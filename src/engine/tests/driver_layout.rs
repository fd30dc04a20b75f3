//! The engine tells the device where its kernels start (past the model's
//! `.to()`, or at a bitsandbytes weight's quantisation), so a card whose
//! driver layout is modelled
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

/// The segment addresses among `evs`, in order.
fn segment_addrs(evs: &[EngineEvent]) -> Vec<u64> {
    alloc_events(evs)
        .iter()
        .filter(|a| a.action == Action::SegmentAlloc)
        .map(|a| a.addr)
        .collect()
}

#[test]
fn a_bitsandbytes_weights_quantisation_is_the_programs_first_kernel() {
    use super::super::bnb::QuantType;
    use super::super::model_lang::{LangModel, ModelInput, Module};
    use super::super::DType;
    // A Linear4bit(4096, 4096) in bf16: the weight's 32 MiB copy (a host-to-
    // device copy: no kernel) takes the first segment, then quantize_4bit's
    // CUDA op makes its absmax (1 MiB: a 2 MiB small segment) and packed
    // weight (8 MiB: a 20 MiB segment) and launches bitsandbytes' kernel
    // (backends/cuda/ops.py:391-418). Kernels started there, so those two
    // open the held range from its bottom (488 MiB below the first
    // segment) instead of taking the free page 74 MiB below it and a chunk
    // below the range.
    let net = Module::Linear4bit {
        input: 4096,
        out: 4096,
        bias: false,
        quant_type: QuantType::NF4,
        blocksize: 64,
        double_quant: false,
        compute_dtype: Some(DType::BF16),
    };
    let model = ModelConfig {
        param_dtype: DType::BF16,
        ..ModelConfig::modules(LangModel::new(ModelInput::Features(4096), net), 8)
    };
    let cfg = EngineConfig {
        placement: Placement::H100Driver,
        ..EngineConfig::default()
    };
    let mut e = engine_with(model, OptimizerConfig::adamw(), cfg);
    let segs = segment_addrs(&e.take_events());
    assert!(segs.len() >= 3, "{segs:x?}");
    let mib = |n: u64| n << 20;
    let first = segs[0];
    assert_eq!(segs[1], first - mib(488), "the absmax's small segment");
    assert_eq!(segs[2], first - mib(486), "the packed weight's segment");
}
