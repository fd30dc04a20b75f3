//! The work counter behind compute-time estimates: GEMM FLOPs from the
//! layer shapes (2 per multiply-add), and what checkpointing recomputes.

use super::super::work::{MathUnit, WorkPart};
use super::*;

#[test]
fn mlp_gemm_flops_follow_the_layer_shapes() {
    // mlp-mnist: 784 → 1024 → 1024 → 10 at B = 256, fp32 (engine.md §10.1).
    let mut e = mlp();
    run(&mut e, &program(train_steps(), 1));
    let first = e.work();
    run(&mut e, &program(train_steps(), 1));
    let w = e.work().since(&first);
    let b = 256u64;
    let macs = 784 * 1024 + 1024 * 1024 + 1024 * 10;
    assert_eq!(w.flops(WorkPart::Forward, MathUnit::Fp32), 2 * b * macs);
    // Every weight gets its gradient; the input (no grad) gets none, so the
    // first layer computes no data gradient.
    let backward_macs = macs + 1024 * 1024 + 1024 * 10;
    assert_eq!(
        w.flops(WorkPart::Backward, MathUnit::Fp32),
        2 * b * backward_macs
    );
    // fp32 matmuls stay off the tensor cores by PyTorch's default.
    assert_eq!(w.flops(WorkPart::Forward, MathUnit::Tf32), 0);
    assert_eq!(w.flops(WorkPart::Forward, MathUnit::Half), 0);
    // The optimizer moves bytes only: AdamW reads p, g, exp_avg, exp_avg_sq
    // and writes p and both moments back (7 parameter-sized passes); its
    // first step also zero-fills the two moments it creates.
    let params: u64 = param_bytes(&e);
    assert_eq!(w.bytes(WorkPart::Optimizer), 7 * params);
    assert_eq!(first.bytes(WorkPart::Optimizer), 9 * params);
    assert_eq!(w.flops(WorkPart::Recompute, MathUnit::Fp32), 0);
}

#[test]
fn checkpointing_recomputes_the_blocks_forward_and_changes_nothing_else() {
    let run_gpt = |checkpoint: bool| {
        let mut cfg = ModelConfig::gpt(4, 4, 256, 8192, 256, 2, 64);
        if let super::super::ModelKind::Gpt2 { checkpoint: c, .. } = &mut cfg.kind {
            *c = checkpoint;
        }
        let mut e = engine(cfg);
        run(&mut e, &program(train_steps(), 1));
        e.work()
    };
    let (plain, ckpt) = (run_gpt(false), run_gpt(true));
    let flops = |w: &super::super::work::WorkTally, p| -> u64 {
        MathUnit::ALL.iter().map(|u| w.flops(p, *u)).sum()
    };
    assert_eq!(flops(&plain, WorkPart::Recompute), 0);
    assert_eq!(
        flops(&ckpt, WorkPart::Forward),
        flops(&plain, WorkPart::Forward)
    );
    assert_eq!(
        flops(&ckpt, WorkPart::Backward),
        flops(&plain, WorkPart::Backward)
    );
    // The blocks' GEMMs again: per block and row, qkv 3d², attention proj d²
    // and fc 4d² multiply-adds (d = 256, B·T = 128 rows, 4 blocks), plus the
    // causal attention (4·T·d per row, half of it masked: 2·T·d). The MLP's
    // output projection is not re-run: nothing saved needs its output, and
    // the recomputation stops early once every saved tensor is back
    // (`torch.utils.checkpoint`'s default early stop, engine.md §7).
    let (d, rows, t) = (256u64, 128u64, 64u64);
    let gemm = 2 * rows * 8 * d * d;
    let attention = rows * 2 * t * d;
    assert_eq!(flops(&ckpt, WorkPart::Recompute), 4 * (gemm + attention));
}
