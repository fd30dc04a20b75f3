//! `SparseMoe` as transformers 5.x builds and runs it (model_lang/moe/grouped.rs):
//! the 3-D experts in `__init__`'s order and `grouped_mm_experts_forward`'s
//! requests. Each expected sequence is written from the transformers
//! 5.16.1 line it cites (modeling_mixtral.py, modeling_qwen2_moe.py,
//! modeling_qwen3_moe.py, integrations/moe.py), not from the engine.

use super::super::model_lang::moe::{Dispatch, ExpertKind, Routing};
use super::super::model_lang::{ModelInput, Module};
use super::super::transformers_release::TransformersVersion;
use super::super::{DType, LossKind};
use super::*;

/// A block of hidden 8, 4 experts of width 16, top 2, on `batch` rows of
/// bf16 features.
fn moe(expert: ExpertKind, shared: Option<u64>, experts_first: bool, norm: bool) -> Module {
    moe_on(Dispatch::Hf, expert, shared, experts_first, norm)
}

fn moe_on(
    dispatch: Dispatch,
    expert: ExpertKind,
    shared: Option<u64>,
    experts_first: bool,
    norm: bool,
) -> Module {
    Module::SparseMoe {
        hidden: 8,
        intermediate: 16,
        experts: 4,
        top_k: 2,
        expert,
        norm_topk_prob: norm,
        shared_expert: shared,
        routing: Routing::Balanced,
        dispatch,
        router: "gate".into(),
        experts_first,
    }
}

fn v5() -> EngineConfig {
    EngineConfig {
        transformers: Some(TransformersVersion::new(5, 16)),
        ..EngineConfig::default()
    }
}

fn build_and_forward(net: Module, cfg: EngineConfig) -> (Vec<i64>, Vec<i64>) {
    let model = ModelConfig {
        param_dtype: DType::BF16,
        ..super::lang::lang(net, ModelInput::Features(8), 4, LossKind::Sum)
    };
    let mut e = engine_with(model, OptimizerConfig::adamw(), cfg);
    let built = requests(&e.take_events());
    run(&mut e, &program(forward_steps(), 1));
    (built, requests(&e.take_events()))
}

#[test]
fn v5_experts_are_two_3d_parameters_in_init_order() {
    // bf16. MixtralSparseMoeBlock registers gate, then experts
    // (modeling_mixtral.py:104-105): gate.weight [4, 8], then
    // gate_up_proj [4, 32, 8] and down_proj [4, 8, 16] (65-66).
    let (built, _) = build_and_forward(moe(ExpertKind::Mixtral, None, false, true), v5());
    assert_eq!(built, vec![64, 2048, 1024]);
    // Qwen3MoeSparseMoeBlock registers experts first (modeling_qwen3_moe.py:273-274).
    let (built, _) = build_and_forward(moe(ExpertKind::Qwen, None, true, true), v5());
    assert_eq!(built, vec![2048, 1024, 64]);
    // Qwen2MoeSparseMoeBlock: gate, experts, shared_expert (gate_proj,
    // up_proj, down_proj of width 32), shared_expert_gate [1, 8]
    // (modeling_qwen2_moe.py:342-345, 136-138).
    let (built, _) = build_and_forward(moe(ExpertKind::Qwen, Some(32), false, false), v5());
    assert_eq!(built, vec![64, 2048, 1024, 512, 512, 512, 16]);
    // 4.x: per-expert Linears w1 [16, 8], w2 [8, 16], w3 [16, 8], the same bytes.
    let (built, _) = build_and_forward(
        moe(ExpertKind::Mixtral, None, false, true),
        EngineConfig::default(),
    );
    assert_eq!(built.len(), 1 + 4 * 3);
    assert_eq!(built.iter().sum::<i64>(), 64 + 2048 + 1024);
}

#[test]
fn v5_mixtral_block_makes_grouped_mm_experts_forward_requests() {
    let (_, fwd) = build_and_forward(moe(ExpertKind::Mixtral, None, false, true), v5());
    // N = 4 rows, S = N·top_k = 8 routed rows, bf16 activations.
    let expected = vec![
        64, // the batch [4, 8] bf16
        // MixtralTopKRouter.forward (modeling_mixtral.py:96-101)
        32,        // router_logits = F.linear [4, 4] bf16
        8_519_680, // the first GEMM's cuBLAS workspace (H100's default)
        64,        // router_logits.float()
        64,        // softmax
        -64,       // the fp32 copy (SoftmaxBackward0 keeps the result)
        32,        // topk values [4, 2] fp32
        64,        // topk indices int64
        16,        // .sum(dim=-1, keepdim=True) [4, 1] fp32
        32,        // /= in place: DivBackward0's original_self clone
        // grouped_mm_experts_forward (integrations/moe.py:383-478)
        64,   // sort: expert_ids_g int64 [8]
        64,   // sort: perm
        64,   // perm // num_top_k
        128,  // hidden_states[...] [8, 8] bf16
        -64,  // perm // num_top_k: the batch needs no gradient, so no IndexBackward0 keeps it
        32,   // sample_weights[perm] [8] fp32
        32,   // expert_ids_g.int()
        16,   // histc [4] int32
        16,   // cumsum: offsets
        8,    // expert_ids_g >= num_experts [8] bool
        512,  // _grouped_mm(x, gate_up_proj.T) [8, 32] bf16
        256,  // act_fn(gate) [8, 16]
        256,  // * up
        128,  // _grouped_mm(h, down_proj.T) [8, 8] bf16
        256,  // * sample_weights_g.unsqueeze(-1): fp32 [8, 8]
        64,   // inv_perm = torch.empty_like(perm)
        64,   // torch.arange(S)
        -64,  // the arange, once index_put_ has it
        256,  // weighted_out[inv_perm]
        -256, // the first weighted_out (nothing saved it)
        128,  // .view(4, 2, 8).sum(dim=1) fp32 [4, 8]
        64,   // .to(bf16)
        // the function's locals: expert_ids_g, histc_input,
        // tokens_per_expert, weighted_out, the sum
        -64, -32, -16, -256, -128, // the block's: router_logits, top_k_weights
        -32, -32,
    ];
    assert_eq!(&fwd[..expected.len()], &expected[..], "{fwd:?}");
}

#[test]
fn grouped_mm_dispatch_refuses_an_ungated_expert_by_field() {
    let net = moe_on(Dispatch::GroupedMm, ExpertKind::Gelu, None, false, true);
    let model = super::super::model_lang::LangModel::new(ModelInput::Features(8), net);
    let err = model
        .check(4, None)
        .expect_err("no gate_up_proj for a Gelu expert");
    assert_eq!(err.field, Some("dispatch"));
    assert!(err.to_string().contains("gated expert"), "{err}");
    // 4.x's `Hf` keeps a Gelu expert's per-expert Linears, under 5.x too.
    let (built, _) = build_and_forward(moe(ExpertKind::Gelu, None, false, true), v5());
    assert_eq!(built.len(), 1 + 4 * 4);
}
