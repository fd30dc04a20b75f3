//! Autograd, grad modes, optimizers, AMP, checkpointing and pitfalls (engine.md §2–§9).

use super::super::error::INFERENCE_TENSOR_SAVED;
use super::super::{DType, EngineError, GradContext, KeepWhat, Shape, Step, BACKWARD_TWICE};
use super::*;

fn train_steps() -> Vec<Step> {
    let mut v = vec![Step::ZeroGrad { set_to_none: None }];
    v.extend(forward_steps());
    v.push(Step::Backward {
        loss: s("loss"),
        retain_graph: false,
    });
    v.push(Step::OptimizerStep);
    v
}

fn mlp() -> Engine {
    engine(ModelConfig::mlp_mnist())
}

fn param_bytes(e: &Engine) -> u64 {
    e.parameters().iter().map(|p| e.nbytes(*p)).sum()
}

#[test]
fn second_backward_raises_pytorch_text() {
    let mut e = mlp();
    run(&mut e, &program(forward_steps(), 1));
    let loss = e.binding_tensor("loss").expect("loss");
    e.backward(loss, false).expect("first backward");
    let err = e.backward(loss, false).expect_err("second backward");
    assert_eq!(err, EngineError::Runtime(BACKWARD_TWICE.to_string()));
    assert!(err
        .to_string()
        .starts_with("RuntimeError: Trying to backward through the graph a second time"));
}

#[test]
fn backward_frees_saved_tensors_and_retain_graph_keeps_them() {
    let mut e = mlp();
    run(&mut e, &program(forward_steps(), 1));
    let loss = e.binding_tensor("loss").expect("loss");
    let saved = e.saved_storage_bytes();
    assert!(saved > 0);
    e.backward(loss, true).expect("retained backward");
    assert_eq!(
        e.saved_storage_bytes(),
        saved,
        "retain_graph keeps every slot (§2.5)"
    );
    e.backward(loss, false)
        .expect("second backward allowed after retain");
    assert_eq!(
        e.saved_storage_bytes(),
        0,
        "a non-retaining backward releases all slots (§2.3.1)"
    );
    // A spent graph still exists on the host while `loss` lives (§2.3.5).
    assert!(e.live_nodes() > 0);
}

#[test]
fn spent_graph_of_save_free_nodes_backwards_again() {
    // §2.4: add/sum/mean nodes save nothing, so a second pass does not raise.
    let mut e = Engine::bare(EngineConfig::default()).expect("engine");
    let w = e
        .factory(
            Shape::new(&[4, 4]),
            DType::F32,
            super::super::Category::Parameter,
        )
        .expect("w");
    e.t_mut(w).requires_grad = true;
    let s1 = e.sum(w).expect("sum");
    let s2 = e.add(s1, s1).expect("add");
    e.backward(s2, false).expect("first");
    e.backward(s2, false)
        .expect("second pass through save-free nodes");
}

#[test]
fn no_grad_saves_nothing_and_eval_alone_still_records() {
    let mut e = mlp();
    let mut steps = vec![Step::Eval {
        grad: GradContext::NoGrad,
    }];
    steps.extend(forward_steps());
    run(&mut e, &program(steps, 1));
    assert_eq!(e.saved_storage_bytes(), 0);
    assert_eq!(e.live_nodes(), 0);
    let mut e = mlp();
    let mut steps = vec![Step::Eval {
        grad: GradContext::Enabled,
    }];
    steps.extend(forward_steps());
    run(&mut e, &program(steps, 1));
    assert!(
        e.saved_storage_bytes() >= 2 * 256 * 1024 * 4,
        "eval() alone records the graph (§4)"
    );
    assert!(e.live_nodes() > 0);
}

#[test]
fn inference_mode_saves_nothing() {
    let mut e = mlp();
    let mut steps = vec![Step::Eval {
        grad: GradContext::InferenceMode,
    }];
    steps.extend(forward_steps());
    run(&mut e, &program(steps, 1));
    assert_eq!(e.saved_storage_bytes(), 0);
}

#[test]
fn an_inference_tensor_met_by_a_recording_op_raises_pytorch_text() {
    // §4: the batch is loaded under inference_mode, the forward runs with
    // grad enabled; fc1 saves its input for backward, which PyTorch refuses.
    let mut e = mlp();
    let mut steps = vec![
        Step::SetGrad {
            grad: GradContext::InferenceMode,
        },
        Step::LoadBatch {
            x: s("x"),
            y: s("y"),
        },
        Step::SetGrad {
            grad: GradContext::Enabled,
        },
    ];
    steps.extend(forward_steps().into_iter().skip(1));
    let err = e
        .run_program(&program(steps, 1))
        .expect_err("saved an inference tensor");
    assert_eq!(err, EngineError::Runtime(INFERENCE_TENSOR_SAVED.into()));
    assert!(err
        .to_string()
        .contains("Inference tensors cannot be saved for backward"));
}

#[test]
fn frozen_layers_get_no_grad_no_state_and_save_nothing_upstream() {
    // §4: requires_grad_(False) on fc1. Nothing upstream of fc2 requires
    // grad, so fc1 and relu1 record no nodes and save nothing (§2.2 guards);
    // fc1 gets no .grad and AdamW no state for it (§5.1: state per param
    // with a grad).
    let freeze = |modules: &[&str]| Step::SetRequiresGrad {
        modules: modules.iter().map(|m| m.to_string()).collect(),
        requires_grad: false,
    };
    let trained = |setup: Vec<Step>| {
        let mut e = mlp();
        let mut forward = program(forward_steps(), 1);
        forward.setup = setup.clone();
        run(&mut e, &forward);
        let saved = e.saved_storage_bytes();
        let mut e = mlp();
        let mut p = program(train_steps(), 1);
        p.setup = setup;
        run(&mut e, &p);
        (e, saved)
    };
    let (full, full_saved) = trained(Vec::new());
    let (frozen, frozen_saved) = trained(vec![freeze(&["fc1"])]);
    // fc1 saves x [256, 784] f32 no more, and fc2 its weight [1024, 1024]
    // f32 (kept only for the grad of its input, which needs none now).
    assert_eq!(full_saved - frozen_saved, 256 * 784 * 4 + 1024 * 1024 * 4);

    let fc1: Vec<_> = frozen
        .parameters()
        .into_iter()
        .filter(|p| &*frozen.param_module(*p) == "fc1")
        .collect();
    assert_eq!(fc1.len(), 2, "fc1.weight and fc1.bias");
    for p in frozen.parameters() {
        assert_eq!(frozen.grad(p).is_none(), fc1.contains(&p));
    }
    let fc1_numel: u64 = fc1.iter().map(|p| frozen.shape(*p).numel()).sum();
    assert_eq!(
        full.optimizer_state_bytes() - frozen.optimizer_state_bytes(),
        2 * 4 * fc1_numel,
        "exp_avg and exp_avg_sq of fc1 never created"
    );

    let mut e = mlp();
    let mut p = program(train_steps(), 1);
    p.setup = vec![freeze(&["fc"])];
    let err = e.run_program(&p).expect_err("`fc` is no module path");
    assert!(
        err.to_string().contains("no parameter under module `fc`"),
        "{err}"
    );
}

#[test]
fn retain_grad_keeps_a_copy_of_a_non_leaf_gradient_while_the_tensor_lives() {
    // §3.3: `out.retain_grad()` stores out's gradient like a leaf grad, at
    // the cost of out's size ([256, 10] f32 = 10,240 B, one block); without
    // it, non-leaf grads die inside backward.
    let after_backward = |retain: bool| {
        let mut e = mlp();
        run(&mut e, &program(forward_steps(), 1));
        let out = e.binding_tensor("out").expect("out");
        if retain {
            e.retain_grad(out).expect("out requires grad");
        }
        let loss = e.binding_tensor("loss").expect("loss");
        e.backward(loss, true).expect("backward");
        (e, out)
    };
    let (plain, out) = after_backward(false);
    assert!(plain.grad(out).is_none());
    let (kept, out) = after_backward(true);
    let g = kept.grad(out).expect("retained grad");
    assert_eq!(kept.shape(g), kept.shape(out));
    assert_eq!(
        kept.allocated_bytes() - plain.allocated_bytes(),
        256 * 10 * 4
    );

    // A second backward sums into a fresh tensor: still one grad's worth.
    let (mut plain, mut kept) = (plain, kept);
    for e in [&mut plain, &mut kept] {
        let loss = e.binding_tensor("loss").expect("loss");
        e.backward(loss, false)
            .expect("second backward (graph retained)");
    }
    assert_ne!(kept.grad(out), Some(g), "summed out of place");
    assert_eq!(
        kept.allocated_bytes() - plain.allocated_bytes(),
        256 * 10 * 4
    );
    // The grad dies with the tensor: `del out` leaves both runs equal.
    let params = kept.parameters();
    for e in [&mut plain, &mut kept] {
        e.run_program(&program(vec![Step::Delete { name: s("out") }], 1))
            .expect("del out");
    }
    assert_eq!(kept.allocated_bytes(), plain.allocated_bytes());
    assert!(
        params.iter().all(|p| kept.grad(*p).is_some()),
        "leaf grads stay"
    );

    // On a leaf it is a no-op; on a tensor without grad, PyTorch's error.
    let mut e = mlp();
    e.retain_grad(params[0]).expect("leaf: no-op");
    run(&mut e, &program(forward_steps(), 1));
    let y = e.binding_tensor("y").expect("y");
    let err = e.retain_grad(y).expect_err("targets do not require grad");
    assert_eq!(
        err,
        EngineError::Runtime("can't retain_grad on Tensor that has requires_grad=False".into())
    );
}

#[test]
fn set_to_none_frees_grads_and_zeroing_keeps_them() {
    for set_to_none in [true, false] {
        let mut e = mlp();
        run(&mut e, &program(train_steps(), 1));
        let before = e.allocated_bytes();
        e.take_events();
        e.zero_grad(set_to_none).expect("zero_grad");
        let evs = e.take_events();
        let freed = before - e.allocated_bytes();
        // §3.2: set_to_none drops G — every grad storage, in parameter order —
        // and nothing else; zeroing in place frees nothing.
        let expected: Vec<i64> = if set_to_none {
            e.parameters()
                .iter()
                .map(|p| -(e.nbytes(*p) as i64))
                .collect()
        } else {
            vec![]
        };
        assert_eq!(requests(&evs), expected);
        let blocks: u64 = alloc_events(&evs)
            .iter()
            .filter(|a| a.action == crate::alloc::Action::FreeRequested)
            .map(|a| a.block_size)
            .sum();
        assert_eq!(freed, blocks);
    }
}

#[test]
fn adam_state_appears_at_the_first_step() {
    let mut e = mlp();
    let mut steps = train_steps();
    steps.pop();
    run(&mut e, &program(steps, 1));
    assert_eq!(
        e.optimizer_state_bytes(),
        0,
        "no state before step() (§5.1)"
    );
    e.optimizer_step().expect("step");
    // exp_avg + exp_avg_sq = 2 × param bytes; `step` stays on the CPU (§1.5).
    assert_eq!(e.optimizer_state_bytes(), 2 * param_bytes(&e));
    assert_eq!(e.optimizer_state_bytes(), 14_909_520); // §10.1 "Adam state"
}

#[test]
fn missing_zero_grad_does_not_grow_memory() {
    // §3.1 / §9 pitfall 6: grads accumulate in place.
    let mut e = mlp();
    let mut steps = forward_steps();
    steps.push(Step::Backward {
        loss: s("loss"),
        retain_graph: false,
    });
    steps.push(Step::OptimizerStep);
    let p = program(steps, 1);
    let mut after = Vec::new();
    for _ in 0..4 {
        e.run_iteration(&p).expect("iteration");
        after.push(e.allocated_bytes());
    }
    assert_eq!(after[1], after[2]);
    assert_eq!(after[2], after[3]);
}

#[test]
fn total_loss_tensor_accumulation_grows_host_graph_not_gpu() {
    // §9 pitfall 1: backward each step → +0 B GPU, + nodes per iteration.
    let mut e = mlp();
    let mut steps = train_steps();
    steps.push(Step::AccumulateLoss {
        from: s("loss"),
        into: s("total_loss"),
        what: KeepWhat::Tensor,
    });
    let p = program(steps, 1);
    let mut alloc = Vec::new();
    let mut nodes = Vec::new();
    for _ in 0..4 {
        e.run_iteration(&p).expect("iteration");
        alloc.push(e.allocated_bytes());
        nodes.push(e.live_state().root("total_loss").expect("acc").nodes.len());
    }
    assert_eq!(alloc[1], alloc[2]);
    assert_eq!(alloc[2], alloc[3]);
    assert!(nodes[1] < nodes[2] && nodes[2] < nodes[3]);
    let per_iter = nodes[3] - nodes[2];
    assert_eq!(nodes[2] - nodes[1], per_iter);
    let root = e.live_state();
    let r = root.root("total_loss").expect("acc");
    assert_eq!(
        r.exclusive_saved_bytes, 0,
        "spent graphs hold no GPU memory"
    );
    assert_eq!(
        r.oldest_node_iteration,
        Some(1),
        "the chain spans iterations (§11.2)"
    );
    // A later total_loss.backward() hits the backward-twice error (§9 pitfall 1).
    let acc = e.binding_tensor("total_loss").expect("acc");
    assert_eq!(
        e.backward(acc, false),
        Err(EngineError::Runtime(BACKWARD_TWICE.into()))
    );
}

#[test]
fn total_loss_without_backward_grows_by_s_iter() {
    // §9 pitfall 1b, §9.1: eval without no_grad keeps every batch's graph.
    let mut e = mlp();
    let mut steps = vec![Step::Eval {
        grad: GradContext::Enabled,
    }];
    steps.extend(forward_steps());
    steps.push(Step::AccumulateLoss {
        from: s("loss"),
        into: s("total_loss"),
        what: KeepWhat::Tensor,
    });
    let p = program(steps, 1);
    let mut alloc = Vec::new();
    for _ in 0..4 {
        e.run_iteration(&p).expect("iteration");
        alloc.push(e.allocated_bytes());
    }
    // S_iter of mlp-mnist (§10.1): relu1, relu2 outs, log-probs, total_weight,
    // and — once rebound — the batch x and target that fc1/nll saved.
    let s_iter = round512(256 * 1024 * 4) * 2
        + round512(256 * 10 * 4)
        + round512(4)
        + round512(256 * 784 * 4)
        + round512(256 * 8);
    assert_eq!(alloc[2] - alloc[1], s_iter);
    assert_eq!(alloc[3] - alloc[2], s_iter);
    // The .item() fix holds nothing.
    let mut e = mlp();
    let mut steps = vec![Step::Eval {
        grad: GradContext::Enabled,
    }];
    steps.extend(forward_steps());
    steps.push(Step::AccumulateLoss {
        from: s("loss"),
        into: s("total_loss"),
        what: KeepWhat::Item,
    });
    let p = program(steps, 1);
    let mut alloc = Vec::new();
    for _ in 0..3 {
        e.run_iteration(&p).expect("iteration");
        alloc.push(e.allocated_bytes());
    }
    assert_eq!(alloc[1], alloc[2]);
}

#[test]
fn autocast_halves_matmul_outputs_and_keeps_layer_norm_fp32() {
    let mut e = engine(ModelConfig::gpt_tiny());
    let x = e
        .factory(
            Shape::new(&[2, 8, 256]),
            DType::F32,
            super::super::Category::Input,
        )
        .expect("x");
    let ps = e.parameters();
    let (ln_w, ln_b, w, b) = (ps[2], ps[3], ps[4], ps[5]);
    e.autocast_enter(DType::F16);
    let y = e.layer_norm(x, Some(ln_w), Some(ln_b)).expect("ln");
    assert_eq!(
        e.dtype(y),
        DType::F32,
        "layer_norm runs in fp32 under autocast (§6.1)"
    );
    let o = e.linear(y, w, Some(b)).expect("linear");
    assert_eq!(e.dtype(o), DType::F16);
    assert_eq!(e.nbytes(o), 2 * 8 * 768 * 2, "half the fp32 bytes");
    // The weight-cast cache holds W and b in fp16 until the outermost exit (§6.2).
    let cache = e
        .live_state()
        .roots
        .iter()
        .filter(|r| matches!(r.kind, super::super::RootKind::AmpCache))
        .map(|r| r.bytes)
        .sum::<u64>();
    assert_eq!(cache, (768 * 256 + 768) * 2);
    e.autocast_exit();
    assert!(e
        .live_state()
        .roots
        .iter()
        .all(|r| !matches!(r.kind, super::super::RootKind::AmpCache)));
}

#[test]
fn gpt_amp_training_step_runs() {
    let mut e = engine(ModelConfig::gpt_tiny());
    run(&mut e, &program(scaled_training_steps(), 2));
    // Grads of fp32 params are fp32 (§3.1) and the scaler keeps 2 scalars (§6.3).
    assert!(e
        .parameters()
        .iter()
        .all(|p| e.grad(*p).is_some_and(|g| e.dtype(g) == DType::F32)));
    let ls = e.live_state();
    let scal = ls
        .roots
        .iter()
        .filter(|r| matches!(r.kind, super::super::RootKind::ScalerState))
        .count();
    assert_eq!(scal, 2);
}

/// fp16 autocast with GradScaler: zero_grad, forward, scale, backward, step, update.
fn scaled_training_steps() -> Vec<Step> {
    let mut steps = vec![
        Step::ZeroGrad { set_to_none: None },
        Step::AutocastEnter { dtype: DType::F16 },
    ];
    steps.extend(forward_steps());
    steps.push(Step::AutocastExit);
    steps.push(Step::ScalerScale {
        loss: s("loss"),
        into: s("scaled"),
    });
    steps.push(Step::Backward {
        loss: s("scaled"),
        retain_graph: false,
    });
    steps.push(Step::ScalerStep);
    steps.push(Step::ScalerUpdate);
    steps
}

#[test]
fn an_overflowing_iteration_skips_the_step_and_delays_adam_state() {
    // §6.3: scaler.step skips optimizer.step() when found_inf is set, and
    // AdamW's state is lazy (§5.1), so it first appears at the first real step.
    let overflow_at = |iterations: Vec<u32>| {
        let cfg = EngineConfig {
            grad_overflow_iterations: iterations,
            ..EngineConfig::default()
        };
        engine_with(ModelConfig::gpt_tiny(), OptimizerConfig::adamw(), cfg)
    };
    let mut both = overflow_at(vec![1, 2]);
    run(&mut both, &program(scaled_training_steps(), 2));
    assert_eq!(both.optimizer_state_bytes(), 0, "both steps skipped");

    let mut first = overflow_at(vec![1]);
    run(&mut first, &program(scaled_training_steps(), 2));
    let mut plain = engine(ModelConfig::gpt_tiny());
    run(&mut plain, &program(scaled_training_steps(), 1));
    assert!(plain.optimizer_state_bytes() > 0);
    assert_eq!(first.optimizer_state_bytes(), plain.optimizer_state_bytes());
}

#[test]
fn sequence_lengths_follow_the_schedule_and_change_activation_bytes() {
    // §9 pitfall 11: variable-length batches. Iteration i loads a [B, T_i]
    // batch, and the saved activations scale with T.
    let saved_after = |seq_lens: Vec<u64>, iterations: u32| {
        let mut e = engine(ModelConfig::gpt_tiny());
        let mut p = program(forward_steps(), iterations);
        p.seq_lens = seq_lens;
        run(&mut e, &p);
        let x = e.binding_tensor("x").expect("x");
        (e.shape(x).dim(1), e.saved_storage_bytes())
    };
    let (t1, short) = saved_after(vec![64, 128], 1);
    let (t2, long) = saved_after(vec![64, 128], 2);
    let (t3, again) = saved_after(vec![64, 128], 3);
    assert_eq!((t1, t2, t3), (64, 128, 64), "cycled per iteration");
    assert!(long > short, "{long} vs {short}");
    assert_eq!(again, short, "the same T saves the same bytes");
    let (t_default, _) = saved_after(Vec::new(), 1);
    assert_eq!(t_default, 256, "empty schedule: the model's own T");
}

#[test]
fn checkpointing_keeps_only_block_inputs() {
    // §10.2: per-block checkpointing keeps each block's input x (4d per B·T row).
    let (b, t, d) = (2u64, 64u64, 256u64);
    let mut cfg = ModelConfig::gpt(4, 4, d, 8192, 256, b, t);
    if let super::super::ModelKind::Gpt2 { checkpoint, .. } = &mut cfg.kind {
        *checkpoint = true;
    }
    let mut e = engine(cfg);
    // x, y = next(batches); out = model(x)
    let mut steps = forward_steps()[..2].to_vec();
    run(&mut e, &program(steps.clone(), 1));
    let ls = e.live_state();
    let inputs: u64 = ls
        .roots
        .iter()
        .filter(|r| matches!(r.kind, super::super::RootKind::CheckpointInput))
        .map(|r| r.bytes)
        .sum();
    assert_eq!(inputs, 4 * 4 * d * b * t);
    // Inside the regions nothing is saved: only ln_f and the head save tensors.
    let saved_in_blocks: u64 = ls
        .nodes
        .iter()
        .filter(|n| n.module.starts_with("transformer.h."))
        .flat_map(|n| n.saved.iter())
        .filter_map(|s| s.storage)
        .count() as u64;
    assert_eq!(saved_in_blocks, 0);
    // Backward recomputes the regions and trains normally.
    steps.push(Step::Loss {
        output: s("out"),
        target: s("y"),
        into: s("loss"),
        divide_by: None,
    });
    steps.push(Step::Backward {
        loss: s("loss"),
        retain_graph: false,
    });
    steps.push(Step::OptimizerStep);
    let mut e2 = engine(match &e.model {
        Some(m) => m.cfg.clone(),
        None => unreachable!(),
    });
    run(&mut e2, &program(steps, 2));
    assert!(e2.parameters().iter().all(|p| e2.grad(*p).is_some()));
    assert_eq!(e2.saved_storage_bytes(), 0);
    // `out` and `loss` still hold the graph, but backward released every
    // saved slot, and with them the regions' frames and inputs.
    assert!(e2.binding_tensor("loss").is_ok());
    assert_eq!(checkpoint_input_bytes(&e2), 0);
}

fn checkpoint_input_bytes(e: &Engine) -> u64 {
    e.live_state()
        .roots
        .iter()
        .filter(|r| matches!(r.kind, super::super::RootKind::CheckpointInput))
        .map(|r| r.bytes)
        .sum()
}

#[test]
fn checkpoint_sequential_checkpoints_all_segments_but_the_last() {
    let (b, t, d) = (2u64, 64u64, 256u64);
    let mut cfg = ModelConfig::gpt(4, 4, d, 8192, 256, b, t);
    if let super::super::ModelKind::Gpt2 {
        checkpoint_segments,
        ..
    } = &mut cfg.kind
    {
        *checkpoint_segments = Some(2);
    }
    // x, y = next(batches); out = model(x)
    let mut steps = forward_steps()[..2].to_vec();
    let mut e = engine(cfg.clone());
    run(&mut e, &program(steps.clone(), 1));
    // Blocks 0–1 are one region (one input kept); blocks 2–3 save as usual.
    assert_eq!(checkpoint_input_bytes(&e), 4 * d * b * t);
    let ls = e.live_state();
    let saved_in = |block: &str| {
        ls.nodes
            .iter()
            .filter(|n| n.module.starts_with(block))
            .flat_map(|n| n.saved.iter())
            .filter(|s| s.storage.is_some())
            .count()
    };
    assert_eq!(saved_in("transformer.h.0."), 0);
    assert_eq!(saved_in("transformer.h.1."), 0);
    assert!(saved_in("transformer.h.2.") > 0);
    assert!(saved_in("transformer.h.3.") > 0);
    steps.extend([
        Step::Loss {
            output: s("out"),
            target: s("y"),
            into: s("loss"),
            divide_by: None,
        },
        Step::Backward {
            loss: s("loss"),
            retain_graph: false,
        },
    ]);
    let mut e = engine(cfg);
    run(&mut e, &program(steps, 2));
    assert!(e.parameters().iter().all(|p| e.grad(*p).is_some()));
    assert_eq!(e.saved_storage_bytes(), 0);
    assert_eq!(checkpoint_input_bytes(&e), 0);
}

#[test]
fn rnn_hidden_not_detached_raises_at_iteration_2() {
    // §8.3: without repackage_hidden the second backward reaches batch 1's graph.
    let mut e = engine(ModelConfig::lstm_lm_ptb());
    let p = program(train_steps(), 1);
    e.run_iteration(&p).expect("iteration 1");
    let err = e.run_iteration(&p).expect_err("iteration 2");
    assert_eq!(err, EngineError::Runtime(BACKWARD_TWICE.into()));
    // With detach it trains.
    let mut e = engine(ModelConfig::lstm_lm_ptb());
    let mut steps = vec![Step::CarryHidden { detach: true }];
    steps.extend(train_steps());
    run(&mut e, &program(steps, 3));
}

#[test]
fn every_allocation_is_tagged() {
    let mut e = mlp();
    run(&mut e, &program(train_steps(), 2));
    let evs = e.take_events();
    for a in alloc_events(&evs) {
        if a.action == crate::alloc::Action::Alloc {
            let info = e.tag_info(a.tag).expect("every alloc has a tag");
            assert!(!info.frames.is_empty());
        }
    }
}

fn half_mlp(dtype: DType) -> Engine {
    let mut cfg = ModelConfig::mlp_mnist();
    cfg.param_dtype = dtype;
    engine(cfg)
}

#[test]
fn a_half_model_trains_in_half_and_its_state_follows_the_params() {
    let fp32 = {
        let mut e = mlp();
        run(&mut e, &program(train_steps(), 1));
        (param_bytes(&e), e.optimizer_state_bytes())
    };
    let mut e = half_mlp(DType::BF16);
    run(&mut e, &program(train_steps(), 1));
    let params = e.parameters();
    assert!(params.iter().all(|p| e.dtype(*p) == DType::BF16));
    assert!(params
        .iter()
        .all(|p| e.grad(*p).is_some_and(|g| e.dtype(g) == DType::BF16)));
    // Parameters and AdamW's exp_avg/exp_avg_sq are half fp32's bytes (the
    // per-parameter 0-dim `step` counters are fp32 in both).
    assert_eq!(2 * param_bytes(&e), fp32.0);
    assert!(
        e.optimizer_state_bytes() < fp32.1 * 6 / 10,
        "{}",
        e.optimizer_state_bytes()
    );
}

#[test]
fn grad_scaler_refuses_fp16_grads_and_linear_refuses_a_mismatched_input() {
    let mut e = half_mlp(DType::F16);
    let mut steps = train_steps();
    steps.pop(); // OptimizerStep
    steps.push(Step::ScalerStep);
    let err = e.run_program(&program(steps, 1)).expect_err("fp16 grads");
    assert_eq!(
        err,
        EngineError::Value("Attempting to unscale FP16 gradients.".into())
    );

    let mut e = half_mlp(DType::F16);
    let steps = vec![
        Step::AllocateBuffer {
            name: s("x"),
            shape: vec![4, 784],
            dtype: DType::F32,
        },
        Step::Forward {
            input: s("x"),
            output: s("out"),
        },
    ];
    let err = e.run_program(&program(steps, 1)).expect_err("fp32 input");
    assert!(
        err.to_string()
            .contains("expected m1 and m2 to have the same dtype, but got: float != c10::Half"),
        "{err}"
    );
}

fn bce_mlp(loss: super::super::LossKind) -> Engine {
    let mut cfg = ModelConfig::mlp_mnist();
    cfg.loss = loss;
    engine(cfg)
}

#[test]
fn binary_cross_entropy_is_banned_under_autocast_and_with_logits_runs_in_fp32() {
    use super::super::LossKind;
    let amp_forward = || {
        let mut v = forward_steps()[..2].to_vec();
        v.insert(1, Step::AutocastEnter { dtype: DType::F16 });
        v.push(Step::Loss {
            output: s("out"),
            target: s("y"),
            into: s("loss"),
            divide_by: None,
        });
        v.push(Step::AutocastExit);
        v
    };
    let mut e = bce_mlp(LossKind::Bce);
    let err = e
        .run_program(&program(amp_forward(), 1))
        .expect_err("banned");
    assert!(
        err.to_string().starts_with(
            "RuntimeError: torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast."
        ),
        "{err}"
    );
    // Outside autocast the same loss runs.
    let mut e = bce_mlp(LossKind::Bce);
    run(&mut e, &program(train_steps(), 1));

    let mut e = bce_mlp(LossKind::BceWithLogits);
    run(&mut e, &program(amp_forward(), 1));
    let ls = e.live_state();
    let node = ls
        .nodes
        .iter()
        .find(|n| n.name == "BinaryCrossEntropyWithLogitsBackward0")
        .expect("the loss's node");
    // fp16 logits [256, 10] and the fp32 target, both saved as fp32 [256, 10].
    let saved: Vec<(&str, DType, Vec<u64>)> = node
        .saved
        .iter()
        .map(|x| (x.name, x.dtype, x.shape.clone()))
        .collect();
    assert_eq!(
        saved,
        [
            ("self", DType::F32, vec![256, 10]),
            ("target", DType::F32, vec![256, 10])
        ]
    );
}

#[test]
fn binary_cross_entropy_needs_a_target_shaped_like_the_output() {
    use super::super::LossKind;
    let mut e = bce_mlp(LossKind::BceWithLogits);
    let mut steps = forward_steps()[..2].to_vec();
    steps.push(Step::AllocateBuffer {
        name: s("labels"),
        shape: vec![256],
        dtype: DType::F32,
    });
    steps.push(Step::Loss {
        output: s("out"),
        target: s("labels"),
        into: s("loss"),
        divide_by: None,
    });
    let err = e.run_program(&program(steps, 1)).expect_err("shape");
    assert!(
        err.to_string().contains(
            "Target size (torch.Size([256])) must be the same as input size (torch.Size([256, 10]))"
        ),
        "{err}"
    );
}

fn reentrant_gpt(frozen_embeddings: bool) -> (Engine, Program) {
    let (b, t, d) = (2u64, 64u64, 256u64);
    let mut cfg = ModelConfig::gpt(3, 4, d, 8192, 256, b, t);
    if let super::super::ModelKind::Gpt2 {
        checkpoint,
        checkpoint_reentrant,
        ..
    } = &mut cfg.kind
    {
        *checkpoint = true;
        *checkpoint_reentrant = true;
    }
    let mut p = program(train_steps(), 2);
    if frozen_embeddings {
        p.setup.push(Step::SetRequiresGrad {
            modules: vec![s("transformer.wte"), s("transformer.wpe")],
            requires_grad: false,
        });
    }
    (engine(cfg), p)
}

#[test]
fn reentrant_checkpointing_trains_every_block_through_a_nested_backward() {
    let (mut e, p) = reentrant_gpt(false);
    run(&mut e, &p);
    assert!(e.parameters().iter().all(|p| e.grad(*p).is_some()));
    assert_eq!(e.saved_storage_bytes(), 0);
    assert!(e.warned.is_empty());
    // Forward alone: each block saved only its input (4d per row), via its
    // CheckpointFunctionBackward node; nothing inside the blocks.
    let (mut e, _) = reentrant_gpt(false);
    run(&mut e, &program(forward_steps()[..2].to_vec(), 1));
    let ls = e.live_state();
    let ckpt: Vec<_> = ls
        .nodes
        .iter()
        .filter(|n| n.name == "CheckpointFunctionBackward")
        .collect();
    assert_eq!(ckpt.len(), 3);
    assert!(ckpt
        .iter()
        .all(|n| n.saved.len() == 1 && n.saved[0].bytes == 4 * 256 * 2 * 64));
    assert!(!ls
        .nodes
        .iter()
        .any(|n| n.module.starts_with("transformer.h.") && n.name != "CheckpointFunctionBackward"));
}

#[test]
fn reentrant_checkpointing_with_frozen_inputs_warns_and_leaves_blocks_without_grads() {
    let (mut e, p) = reentrant_gpt(true);
    run(&mut e, &p);
    assert_eq!(e.warned, [super::super::reentrant::NO_INPUT_REQUIRES_GRAD]);
    let warnings = e
        .take_events()
        .into_iter()
        .filter(|ev| matches!(ev, super::super::EngineEvent::Warning(_)))
        .count();
    assert_eq!(warnings, 1, "a Python warning shows once");
    let model = e.model.as_ref().expect("model");
    let trained: Vec<bool> = e
        .parameters()
        .iter()
        .map(|p| e.grad(*p).is_some())
        .collect();
    // Only ln_f (the last two parameters) trains.
    let n = trained.len();
    assert!(trained[n - 2..].iter().all(|t| *t), "{:?}", model.cfg.kind);
    assert!(trained[..n - 2].iter().all(|t| !*t));
}
