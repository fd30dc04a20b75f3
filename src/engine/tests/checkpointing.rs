//! Activation checkpointing (engine.md §7): per block, checkpoint_sequential
//! and reentrant regions, and what each keeps alive.

use super::super::Step;
use super::*;

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
    let ls = e.held_state();
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
    e.held_state()
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
    let ls = e.held_state();
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
    let ls = e.held_state();
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
    assert_eq!(
        e.warned,
        [crate::engine::autograd::reentrant::NO_INPUT_REQUIRES_GRAD]
    );
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
