//! Dtypes and mixed precision (engine.md §1.1, §6): autocast, GradScaler,
//! models converted to another dtype, and the losses autocast treats apart.

use super::super::{DType, EngineError, Shape, Step};
use super::*;

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
        .held_state()
        .roots
        .iter()
        .filter(|r| matches!(r.kind, super::super::RootKind::AmpCache))
        .map(|r| r.bytes)
        .sum::<u64>();
    assert_eq!(cache, (768 * 256 + 768) * 2);
    e.autocast_exit();
    assert!(e
        .held_state()
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
    let ls = e.held_state();
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
        Step::ZeroGrad {
            set_to_none: None,
            optimizer: None,
        },
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
    let err = run_program(&mut e, &program(steps, 1)).expect_err("fp16 grads");
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
            fill: crate::engine::Fill::Empty,
        },
        Step::Forward {
            input: s("x"),
            output: s("out"),
            model: None,
        },
    ];
    let err = run_program(&mut e, &program(steps, 1)).expect_err("fp32 input");
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
    let err = run_program(&mut e, &program(amp_forward(), 1)).expect_err("banned");
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
    let ls = e.held_state();
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
        fill: crate::engine::Fill::Empty,
    });
    steps.push(Step::Loss {
        output: s("out"),
        target: s("labels"),
        into: s("loss"),
        divide_by: None,
    });
    let err = run_program(&mut e, &program(steps, 1)).expect_err("shape");
    assert!(
        err.to_string().contains(
            "Target size (torch.Size([256])) must be the same as input size (torch.Size([256, 10]))"
        ),
        "{err}"
    );
}

/// tests/fixtures/layernorm/h100_sweep.tsv, row `f32 65537 256 1`: what the
/// H100 requested in the backward of layer_norm over [65537, 256].
fn h100_layer_norm_65537x256() -> Vec<i64> {
    let rows = sweep_rows("layernorm/h100_sweep.tsv");
    let row = rows
        .iter()
        .find(|f| f[..4] == ["f32", "65537", "256", "1"])
        .expect("the row");
    signed_requests(&row[4])
}

#[test]
fn a_layer_norm_over_many_rows_sums_its_weight_gradients_in_parts() {
    let cfg = h100_reductions();
    let mut e = engine_with(ModelConfig::gpt_tiny(), OptimizerConfig::adamw(), cfg);
    let x = e
        .factory(
            Shape::new(&[65537, 256]),
            DType::F32,
            super::super::Category::Input,
        )
        .expect("x");
    let ps = e.parameters();
    let (ln_w, ln_b) = (ps[2], ps[3]);
    let y = e.layer_norm(x, Some(ln_w), Some(ln_b)).expect("ln");
    let simulated = node_requests_in_backward(&mut e, y, "NativeLayerNormBackward0");
    // x needs no gradient here: the H100's first request (dX) is not made.
    // Between the partial sums and the saved mean and rstd, the engine also
    // frees the incoming gradient, which the sweep's caller kept.
    let real = h100_layer_norm_65537x256();
    let (body, saved) = real[1..].split_at(real.len() - 3);
    assert_eq!(simulated[..body.len()], *body, "{simulated:?}");
    assert_eq!(simulated[simulated.len() - 2..], *saved, "{simulated:?}");
    assert!(
        body.contains(&(2049 * 256 * 4)),
        "partial sums of 2,049 rows"
    );
}

/// Every row of tests/fixtures/batchnorm/h100_sweep.tsv (an H100, PyTorch
/// 2.11) against the engine: the training forward, the backward (inside its
/// node; the engine also frees the incoming gradient there, which the
/// sweep's caller kept, before the saved statistics) and the eval forward
/// under no_grad. A half module takes ATen's own kernel, whose [C] fp32
/// statistics exist (and die at once) in eval too; an fp32 one takes cuDNN.
#[test]
fn batch_norm_requests_are_the_h100_s() {
    let rows = sweep_rows("batchnorm/h100_sweep.tsv");
    let mut checked = 0;
    for chunk in rows.chunks(3) {
        let dtype = match chunk[0][0].as_str() {
            "f32" => DType::F32,
            "f16" => DType::F16,
            other => panic!("unknown dtype {other}"),
        };
        let dims: Vec<u64> = chunk[0][1..5]
            .iter()
            .map(|d| d.parse().expect("dim"))
            .collect();
        let real = |phase: &str| {
            let row = chunk.iter().find(|r| r[5] == phase).expect("phase row");
            signed_requests(&row[6])
        };
        let mut e = Engine::bare(EngineConfig::default()).expect("engine");
        let mut make = |dims: &[u64], grad: bool| {
            let t = e
                .factory(Shape::new(dims), dtype, super::super::Category::Parameter)
                .expect("tensor");
            e.t_mut(t).requires_grad = grad;
            t
        };
        let x = make(&dims, true);
        let c = dims[1];
        let (w, b) = (make(&[c], true), make(&[c], true));
        let running = (make(&[c], false), make(&[c], false));
        e.ctx.training = true;
        e.take_events();
        let y = e.batch_norm(x, w, b, running).expect("bn");
        assert_eq!(
            requests(&e.take_events()),
            real("train_forward"),
            "{:?}",
            chunk[0]
        );
        let simulated = node_requests_in_backward(&mut e, y, "BatchNormBackward0");
        let backward = real("train_backward");
        let (grads, stats) = backward.split_at(backward.len() - 2);
        assert_eq!(simulated[..grads.len()], *grads, "{:?}", chunk[0]);
        assert_eq!(simulated[simulated.len() - 2..], *stats, "{:?}", chunk[0]);
        e.ctx.training = false;
        e.ctx.grad_enabled = false;
        let y = e.batch_norm(x, w, b, running).expect("bn");
        assert_eq!(
            requests(&e.take_events()),
            real("eval_forward"),
            "{:?}",
            chunk[0]
        );
        e.release(y);
        checked += 1;
    }
    assert_eq!(checked, 10);
}

/// Every loss of tests/fixtures/loss/h100_sweep.tsv (an H100, PyTorch 2.11)
/// against the engine, with the H100's SMs for the means' reduction
/// scratch: cross-entropy, MSE (whose 0-dim mean lies in a full-size
/// buffer) and BCE with logits over [N, C], fp32 and fp16, forward and
/// `loss.backward()`.
#[test]
fn loss_requests_are_the_h100_s() {
    let rows = sweep_rows("loss/h100_sweep.tsv");
    let mut checked = 0;
    for pair in rows.chunks(2) {
        let (name, dtype) = (pair[0][0].as_str(), pair[0][1].as_str());
        let dtype = if dtype == "f32" {
            DType::F32
        } else {
            DType::F16
        };
        let (n, c): (u64, u64) = (
            pair[0][2].parse().expect("N"),
            pair[0][3].parse().expect("C"),
        );
        let cfg = h100_reductions();
        let mut e = Engine::bare(cfg).expect("engine");
        let x = e
            .factory(
                Shape::new(&[n, c]),
                dtype,
                super::super::Category::Parameter,
            )
            .expect("x");
        e.t_mut(x).requires_grad = true;
        let (target_shape, target_dtype) = if name == "cross_entropy" {
            (Shape::new(&[n]), DType::I64)
        } else {
            (Shape::new(&[n, c]), dtype)
        };
        let t = e
            .factory(target_shape, target_dtype, super::super::Category::Input)
            .expect("target");
        e.take_events();
        let loss = match name {
            "cross_entropy" => e.cross_entropy(x, t),
            "mse" => e.mse_loss(x, t),
            "bce_with_logits" => e.binary_cross_entropy_with_logits(x, t),
            other => panic!("unknown loss {other}"),
        }
        .expect("loss");
        assert_eq!(
            requests(&e.take_events()),
            signed_requests(&pair[0][5]),
            "{:?}",
            pair[0]
        );
        e.backward(loss, false).expect("backward");
        assert_eq!(
            requests(&e.take_events()),
            signed_requests(&pair[1][5]),
            "{:?}",
            pair[1]
        );
        checked += 1;
    }
    assert_eq!(checked, 30);
}

/// The elementwise rows of tests/fixtures/elementwise/h100_sweep.tsv (an
/// H100, PyTorch 2.11) whose backward node computes something: the forward
/// exactly, and inside the node the sweep's requests (the engine then also
/// frees the incoming gradient, which the sweep's caller kept). sqrt and
/// softmax take a temporary of the gradient's size; the others one
/// gradient per input.
#[test]
fn elementwise_requests_are_the_h100_s() {
    use super::super::ops::elementwise::Unary;
    let rows = sweep_rows("elementwise/h100_sweep.tsv");
    let mut checked = 0;
    for pair in rows.chunks(2) {
        let (op, n, c) = (
            pair[0][0].as_str(),
            pair[0][1].parse::<u64>().expect("N"),
            pair[0][2].parse::<u64>().expect("C"),
        );
        let unary = match op {
            "relu" => Some(Unary::Relu),
            "gelu" => Some(Unary::Gelu),
            "silu" => Some(Unary::Silu),
            "sigmoid" => Some(Unary::Sigmoid),
            "tanh" => Some(Unary::Tanh),
            "exp" => Some(Unary::Exp),
            "log" => Some(Unary::Log),
            "sqrt" => Some(Unary::Sqrt),
            _ => None,
        };
        let node = match (op, unary) {
            (_, Some(u)) => u.node(),
            ("mul", _) => "MulBackward0",
            ("mul_scalar", _) => "MulBackward1",
            ("softmax", _) => "SoftmaxBackward0",
            ("log_softmax", _) => "LogSoftmaxBackward0",
            // add, add_scalar and cat hand the gradient on; the sweep's
            // allocations there are AccumulateGrad's copies of a gradient
            // the caller still holds.
            _ => continue,
        };
        let mut e = Engine::bare(EngineConfig::default()).expect("engine");
        let mut leaf = || {
            let t = e
                .factory(
                    Shape::new(&[n, c]),
                    DType::F32,
                    super::super::Category::Parameter,
                )
                .expect("leaf");
            e.t_mut(t).requires_grad = true;
            t
        };
        let (a, b) = (leaf(), leaf());
        e.take_events();
        let y = match (op, unary) {
            (_, Some(u)) => e.unary(u, a),
            ("mul", _) => e.mul(a, b),
            ("mul_scalar", _) => e.mul_scalar(a),
            ("softmax", _) => e.softmax(a, false),
            _ => e.softmax(a, true),
        }
        .expect("op");
        assert_eq!(
            requests(&e.take_events()),
            signed_requests(&pair[0][4]),
            "{:?}",
            pair[0]
        );
        let simulated = node_requests_in_backward(&mut e, y, node);
        let real = signed_requests(&pair[1][4]);
        assert_eq!(simulated[..real.len()], real[..], "{:?}", pair[1]);
        assert!(
            simulated[real.len()..].iter().all(|r| *r < 0),
            "{simulated:?}"
        );
        checked += 1;
    }
    assert_eq!(checked, 24);
}

/// `x.sum()` of a [65536, 50257] fp16 tensor on the H100
/// (tests/fixtures/reduce/h100_sweep.tsv: `2 4 25132 4 25132 4 25132 4
/// 25132 4`): too large for 32-bit indexing, so four launches over quarters
/// of it, each with its staging buffer and semaphores, around an fp32
/// accumulation buffer that outlives them.
#[test]
fn a_half_sum_too_large_for_32_bit_indexing_accumulates_in_fp32() {
    let mut e = Engine::bare(h100_reductions()).expect("engine");
    let x = e
        .factory(
            Shape::new(&[65_536, 50_257]),
            DType::F16,
            super::super::Category::Input,
        )
        .expect("x");
    e.take_events();
    let s = e.sum(x).expect("sum");
    let mut want = vec![2, 4];
    for _ in 0..4 {
        want.extend([25_132, 4, -4, -25_132]);
    }
    want.push(-4);
    assert_eq!(requests(&e.take_events()), want);
    e.release(s);
}
