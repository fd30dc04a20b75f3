//! Autograd, grad modes, optimizers and pitfalls (engine.md §2–§5, §8, §9).

use super::super::error::INFERENCE_TENSOR_SAVED;
use super::super::{DType, EngineError, GradContext, KeepWhat, Shape, Step, BACKWARD_TWICE};
use super::*;
use crate::engine::BatchAssign;

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
            assign: BatchAssign::Together,
        },
        Step::SetGrad {
            grad: GradContext::Enabled,
        },
    ];
    steps.extend(forward_steps().into_iter().skip(1));
    let err = run_program(&mut e, &program(steps, 1)).expect_err("saved an inference tensor");
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
    let err = run_program(&mut e, &p).expect_err("`fc` is no module path");
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
        run_program(e, &program(vec![Step::Delete { name: s("out") }], 1)).expect("del out");
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
        nodes.push(e.held_state().root("total_loss").expect("acc").nodes.len());
    }
    assert_eq!(alloc[1], alloc[2]);
    assert_eq!(alloc[2], alloc[3]);
    assert!(nodes[1] < nodes[2] && nodes[2] < nodes[3]);
    let per_iter = nodes[3] - nodes[2];
    assert_eq!(nodes[2] - nodes[1], per_iter);
    let root = e.held_state();
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
fn rnn_hidden_not_detached_raises_at_iteration_2() {
    // §8.3: without repackage_hidden the second backward reaches batch 1's graph.
    let mut e = engine(ModelConfig::lstm_lm_ptb());
    let p = program(train_steps(), 1);
    e.run_iteration(&p).expect("iteration 1");
    let err = e.run_iteration(&p).expect_err("iteration 2");
    assert_eq!(err, EngineError::Runtime(BACKWARD_TWICE.into()));
    // With detach it trains.
    let mut e = engine(ModelConfig::lstm_lm_ptb());
    let mut steps = vec![Step::CarryHidden {
        detach: true,
        part: Default::default(),
    }];
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
            e.tag_info(a.tag).expect("every alloc has a tag");
        }
    }
}

#[test]
fn a_node_releases_saved_inputs_then_outputs_each_by_name() {
    // gen_autograd_functions.py resets saved inputs sorted by name, then
    // saved outputs sorted by name: the memory-efficient attention backward
    // frees its log_sumexp [B, h, T] before its output [B, h, T, hd].
    let (b, h, t, hd) = (2u64, 4u64, 64u64, 32u64);
    let mut e = Engine::bare(EngineConfig::default()).expect("engine");
    let shape = Shape::new(&[b, h, t, hd]);
    let qkv: Vec<_> = (0..3)
        .map(|_| {
            let x = e
                .factory(shape, DType::F32, super::super::Category::Parameter)
                .expect("q, k, v");
            e.t_mut(x).requires_grad = true;
            x
        })
        .collect();
    let out = e.sdpa(qkv[0], qkv[1], qkv[2], 0.0, false).expect("sdpa");
    let loss = e.sum(out).expect("sum");
    e.release(out);
    e.take_events();
    e.backward(loss, false).expect("backward");
    let frees: Vec<i64> = requests(&e.take_events())
        .into_iter()
        .filter(|r| *r < 0)
        .map(|r| -r)
        .collect();
    // The saved tensors are the last frees of their sizes (scratch of the
    // same sizes goes earlier, inside the kernel call).
    let at = |bytes: u64| {
        frees
            .iter()
            .rposition(|f| *f as u64 == bytes)
            .unwrap_or_else(|| panic!("no free of {bytes} B in {frees:?}"))
    };
    let lse = round512(b * h * t.div_ceil(32) * 32 * 4);
    assert!(at(lse) < at(b * h * t * hd * 4), "frees {frees:?}");
}

#[test]
fn a_run_past_its_event_budget_stops_with_a_clear_error() {
    let mut e = mlp();
    let p = program(train_steps(), 1);
    e.events_out = crate::engine::MAX_RUN_EVENTS - 1;
    // Within the budget a step runs (and makes events)...
    let err = run_program(&mut e, &p).expect_err("the budget runs out mid-iteration");
    assert!(e.events_made() > crate::engine::MAX_RUN_EVENTS);
    assert!(
        err.to_string()
            .contains("more than the 5,000,000 one run may make"),
        "{err}"
    );
    // ...past it, none does.
    let made = e.events_made();
    assert!(run_program(&mut e, &p).is_err());
    assert_eq!(
        e.events_made(),
        made + 1,
        "only the iteration's begin marker"
    );
}

/// The leak view's bytes of a storage are the allocator's block for it,
/// under the run's own config: with `roundup_power2_divisions:4` a 5.2 MB
/// request takes a 5 MiB block (allocator.md §2.2), not its 512 B rounding.
#[test]
fn a_storages_block_is_the_allocators_under_the_runs_config() {
    let cfg = EngineConfig {
        alloc_conf: "roundup_power2_divisions:4".into(),
        ..EngineConfig::default()
    };
    let mut e = super::engine_with(ModelConfig::mlp_mnist(), OptimizerConfig::adamw(), cfg);
    let t = e
        .factory(
            Shape::new(&[1_300_000]),
            crate::engine::DType::F32,
            crate::engine::Category::Activation,
        )
        .expect("tensor");
    let (addr, _) = e.span(t).expect("on the GPU");
    let ls = e.held_state();
    let s = ls
        .storages
        .iter()
        .find(|s| s.addr == Some(addr))
        .expect("its storage");
    assert_eq!(s.bytes, 5_200_000);
    let block = e
        .allocator()
        .snapshot()
        .iter()
        .flat_map(|g| g.blocks.clone())
        .find(|b| b.address == addr)
        .map(|b| b.size);
    assert_eq!(Some(s.block), block);
    assert_eq!(s.block, 5 << 20);
    assert_ne!(s.block, 5_200_000u64.div_ceil(512) * 512);
}

/// An AccumulateGrad holds its leaf strongly, and the leaf its `.grad`
/// (§0.3): a `requires_grad` input that no name holds any more is kept by
/// the graphs that reach its accumulator, and the live state says so (the
/// leak detector charges it to them). A parameter's accumulator holds a
/// tensor the model holds too; a bound input is its name's: neither is.
#[test]
fn a_leaf_only_its_accumulator_holds_is_kept_by_the_graph() {
    use super::super::Category;
    let mut e = mlp();
    let mut steps = forward_steps();
    steps.insert(1, Step::RequiresGrad { name: s("x") });
    steps.push(Step::Append {
        from: s("loss"),
        list: s("kept"),
        what: KeepWhat::Tensor,
    });
    let mut p = program(steps, 2);
    p.setup = vec![Step::NewList { name: s("kept") }];
    e.run_step(&p.setup[0], 0, &p).expect("setup");
    e.run_iteration(&p).expect("iteration 1");
    let first_x = e.t(e.binding_tensor("x").expect("x")).storage;
    e.run_iteration(&p).expect("iteration 2");
    let bound_x = e.t(e.binding_tensor("x").expect("x")).storage;
    let ls = e.held_state();
    let kept0 = ls.root("kept[0]").expect("kept[0]");
    let reached: Vec<_> = kept0
        .saved_storages
        .iter()
        .chain(&kept0.leaf_storages)
        .collect();
    assert!(reached.contains(&&first_x), "{reached:?}");
    let info = |id| ls.storage(id).expect("storage");
    assert!(info(first_x).graph_leaf);
    assert!(!info(bound_x).graph_leaf);
    assert_eq!(
        ls.storages
            .iter()
            .filter(|s| s.graph_leaf && s.category == Category::Parameter)
            .count(),
        0
    );
    let acc = ls
        .nodes
        .iter()
        .find(|n| n.held.iter().any(|h| h.storage == Some(first_x)))
        .expect("the accumulator that holds iteration 1's x");
    assert_eq!(acc.name, "AccumulateGrad");
    assert_eq!(acc.held[0].name, "variable");
}
