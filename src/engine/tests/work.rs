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

/// Σ over layers of 2·4H·(I_l + H)·B·T: the LSTM's gate GEMMs in one pass.
fn lstm_pass_flops(cfg: &ModelConfig) -> u64 {
    let super::super::ModelKind::LstmLm {
        emb,
        hidden,
        layers,
        bptt,
        ..
    } = cfg.kind
    else {
        panic!("not an LSTM")
    };
    (0..layers)
        .map(|l| {
            let input = if l == 0 { emb } else { hidden };
            2 * 4 * hidden * (input + hidden) * cfg.batch * bptt
        })
        .sum()
}

/// The second of two training iterations (the hidden state detached
/// between them) of `cfg`.
fn lstm_iteration_work(cfg: &ModelConfig) -> super::super::work::WorkTally {
    let mut e = engine(cfg.clone());
    let mut steps = vec![Step::CarryHidden {
        detach: true,
        part: Default::default(),
    }];
    steps.extend(train_steps());
    let p = program(steps, 1);
    run(&mut e, &p);
    let first = e.work();
    run(&mut e, &p);
    e.work().since(&first)
}

#[test]
fn the_cudnn_lstm_counts_its_gate_gemms_forward_and_twice_backward() {
    use super::super::work::FlopKind;
    let cfg = ModelConfig::lstm_lm_ptb();
    let w = lstm_iteration_work(&cfg);
    let pass = lstm_pass_flops(&cfg);
    // 2 layers of 200/200 at B 20, T 35: 2 · 448,000,000.
    assert_eq!(pass, 896_000_000);
    // fp32 on cuDNN's default math: TF32 tensor cores (the engine's sm80).
    let rnn = |p| w.kind_flops(p, FlopKind::Rnn, MathUnit::Tf32);
    assert_eq!(rnn(WorkPart::Forward), pass);
    // dx, dhx, dcx, then the weights' gradients: a pass each.
    assert_eq!(rnn(WorkPart::Backward), 2 * pass);
    for part in WorkPart::ALL {
        assert_eq!(w.kind_flops(part, FlopKind::Rnn, MathUnit::Fp32), 0);
    }
    // The decoder's GEMM is the only matmul: 200 → 10,000 on B·T rows; the
    // LSTM is not counted there as well.
    let rows = 20 * 35;
    assert_eq!(
        w.kind_flops(WorkPart::Forward, FlopKind::Matmul, MathUnit::Fp32),
        2 * rows * 200 * 10_000
    );
}

#[test]
fn the_unfused_lstm_counts_the_same_forward_flops_as_cudnn() {
    let cudnn = ModelConfig::lstm_lm_ptb();
    let mut unfused = cudnn.clone();
    if let super::super::ModelKind::LstmLm { cudnn: c, .. } = &mut unfused.kind {
        *c = false;
    }
    let total = |w: &super::super::work::WorkTally| -> u64 {
        MathUnit::ALL
            .iter()
            .map(|u| w.flops(WorkPart::Forward, *u))
            .sum()
    };
    let (a, b) = (lstm_iteration_work(&cudnn), lstm_iteration_work(&unfused));
    assert_eq!(total(&a), total(&b));
    assert!(total(&a) > lstm_pass_flops(&cudnn));
}
