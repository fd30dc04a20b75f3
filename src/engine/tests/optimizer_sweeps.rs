//! The optimizers' and `clip_grad_norm_`'s requests against the H100's
//! sweeps (tests/fixtures/optimizer, tests/fixtures/clip), and what an OOM
//! inside the clip leaves behind.

use super::*;

/// Every optimizer step of tests/fixtures/optimizer/h100_sweep.tsv (an
/// H100, PyTorch 2.11): SGD (plain, momentum, momentum with decay), Adam
/// (with and without decay) and AdamW (with and without amsgrad), each
/// foreach, for-loop and fused, and Adam and AdamW capturable (all three
/// forms), over the MLP's parameters; the first step (lazy state) and the
/// second.
#[test]
fn optimizer_steps_request_what_the_h100_s_did() {
    use super::super::config::OptimImpl;
    use super::super::optim::OptimizerKind;
    let rows = sweep_rows("optimizer/h100_sweep.tsv");
    let mut checked = 0;
    for pair in rows.chunks(2) {
        let kind = match pair[0][0].as_str() {
            "sgd" => OptimizerKind::Sgd {
                momentum: 0.0,
                weight_decay: 0.0,
            },
            "sgd_momentum" => OptimizerKind::Sgd {
                momentum: 0.9,
                weight_decay: 0.0,
            },
            "sgd_momentum_wd" => OptimizerKind::Sgd {
                momentum: 0.9,
                weight_decay: 0.01,
            },
            "adam" => OptimizerKind::Adam {
                weight_decay: 0.0,
                amsgrad: false,
            },
            "adam_wd" => OptimizerKind::Adam {
                weight_decay: 0.01,
                amsgrad: false,
            },
            "adamw" => OptimizerKind::AdamW {
                weight_decay: 0.01,
                amsgrad: false,
            },
            "adamw_amsgrad" => OptimizerKind::AdamW {
                weight_decay: 0.01,
                amsgrad: true,
            },
            "adam_capturable" => OptimizerKind::Adam {
                weight_decay: 0.0,
                amsgrad: false,
            },
            "adamw_capturable" => OptimizerKind::AdamW {
                weight_decay: 0.01,
                amsgrad: false,
            },
            other => panic!("unknown optimizer {other}"),
        };
        let implementation = match pair[0][1].as_str() {
            "foreach" => OptimImpl::Foreach,
            "forloop" => OptimImpl::ForLoop,
            "fused" => OptimImpl::Fused,
            other => panic!("unknown implementation {other}"),
        };
        let opt = OptimizerConfig {
            kind,
            implementation,
            capturable: pair[0][0].ends_with("_capturable"),
            ..OptimizerConfig::default()
        };
        let mut e = engine_with(ModelConfig::mlp_mnist(), opt, EngineConfig::default());
        run(&mut e, &program(forward_steps(), 1));
        let loss = e.binding_tensor("loss").expect("loss");
        e.backward(loss, false).expect("backward");
        for row in pair {
            e.take_events();
            e.optimizer_step().expect("step");
            assert_eq!(
                requests(&e.take_events()),
                signed_requests(&row[3]),
                "{row:?}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 54);
}

/// `clip_grad_norm_(params, 1.0)` over the MLP's gradients, foreach and
/// not, as tests/fixtures/clip/h100_sweep.tsv has it (an H100, PyTorch
/// 2.11): the foreach norm's partials buffer, or one `vector_norm` per grad
/// with the two large weights' reduction scratch; then the norms, the stack
/// and total, the coefficient through a reciprocal, the clamp. Run as the
/// scenario steps `ClipGradNorm` and `ClipGradNormNoForeach`, which drop
/// the total.
#[test]
fn clip_grad_norm_requests_what_the_h100_did() {
    let rows = sweep_rows("clip/h100_sweep.tsv");
    for (step, flag) in [
        (Step::ClipGradNorm, "1"),
        (Step::ClipGradNormNoForeach, "0"),
    ] {
        let row = rows.iter().find(|r| r[0] == flag).expect("the row");
        let (mut e, p) = mlp_after_backward();
        let allocated = e.allocated_bytes();
        e.take_events();
        e.run_step(&step, 0, &p).expect("clip");
        // The sweep's window closes while the returned total norm lives; the
        // step is a statement that drops it.
        let mut want = signed_requests(&row[2]);
        want.push(-4);
        assert_eq!(requests(&e.take_events()), want, "{step:?}");
        assert_eq!(e.allocated_bytes(), allocated, "{step:?} leaves nothing");
    }
}

/// The MLP (AdamW, the H100's reduction scratch) after one forward and
/// backward, with the program that ran them.
fn mlp_after_backward() -> (Engine, Program) {
    let mut e = engine_with(
        ModelConfig::mlp_mnist(),
        OptimizerConfig::adamw(),
        h100_reductions(),
    );
    let p = program(forward_steps(), 1);
    run(&mut e, &p);
    let loss = e.binding_tensor("loss").expect("loss");
    e.backward(loss, false).expect("backward");
    (e, p)
}

/// [`mlp_after_backward`] with the small pool full except for `free`
/// blocks of 512 B and no room for another segment: the `free + 1`-th
/// 512 B block the next step asks for is refused.
fn mlp_with_room_for(free: usize) -> (Engine, Program) {
    let (mut e, p) = mlp_after_backward();
    e.alloc.empty_cache();
    let mut fillers = Vec::new();
    while e.alloc.would_reuse_cached(512, 0) {
        fillers.push(
            e.alloc
                .malloc(512, 0, crate::alloc::Tag::NONE)
                .expect("cached"),
        );
    }
    let reserved = e.alloc.reserved_total();
    e.alloc.set_allowed_memory(reserved);
    for addr in fillers.drain(fillers.len().saturating_sub(free)..) {
        e.alloc.free(addr).expect("a filler");
    }
    e.pull_alloc_events();
    e.take_events();
    (e, p)
}

/// An OOM anywhere inside `clip_grad_norm_` leaves nothing behind: every
/// norm, buffer and coefficient made so far dies with the exception, for
/// every point of refusal until the clip fits.
#[test]
fn an_oom_inside_clip_grad_norm_frees_what_it_made() {
    for step in [Step::ClipGradNorm, Step::ClipGradNormNoForeach] {
        let mut refusals = 0;
        for free in 0.. {
            let (mut e, p) = mlp_with_room_for(free);
            let before = e.allocated_bytes();
            let r = e.run_step(&step, 0, &p);
            assert_eq!(e.allocated_bytes(), before, "{step:?} with room for {free}");
            if r.is_ok() {
                break;
            }
            refusals += 1;
        }
        assert!(refusals >= 3, "{step:?}: {refusals} refusals");
    }
}

/// `_foreach_norm` refused its third norm: the C++ unwinding frees the two
/// norms it made in the order it made them (a `std::vector`), then the
/// partials buffer.
#[test]
fn an_oom_inside_foreach_norm_frees_its_norms_first_to_last() {
    let (mut e, p) = mlp_with_room_for(3);
    assert!(e.run_step(&Step::ClipGradNorm, 0, &p).is_err());
    let evs = e.take_events();
    let allocs: Vec<u64> = alloc_events(&evs)
        .iter()
        .filter(|a| a.action == crate::alloc::Action::Alloc)
        .map(|a| a.addr)
        .collect();
    let frees: Vec<u64> = alloc_events(&evs)
        .iter()
        .filter(|a| a.action == crate::alloc::Action::FreeRequested)
        .map(|a| a.addr)
        .collect();
    assert_eq!(allocs.len(), 3, "partials and two norms");
    assert_eq!(frees, vec![allocs[1], allocs[2], allocs[0]]);
}
