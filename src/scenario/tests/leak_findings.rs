//! Pitfall programs (engine.md §9) through the detector: each buggy pattern
//! is flagged with the right root and kind and bytes within 1% of the §9.1
//! formula; each fixed pattern gives no finding.

use crate::engine::tests::{engine, forward_steps, mlp, program, s, train_steps};
use crate::engine::{Engine, GradContext, KeepWhat, ModelConfig, Program, Step};
use crate::leak::{findings_json, findings_text, Detector, Finding, FindingKind};
use crate::scenario::ScenarioRun;

/// `p` through the one scenario loop (the detector after every iteration, an
/// error as evidence); its findings at the end, and the engine.
fn run_detected(engine: Engine, p: &Program) -> (Vec<Finding>, Engine) {
    let mut run = ScenarioRun::new(Ok(engine), p, &[], p.iterations);
    run.run_to_end(false);
    let findings = run.findings().to_vec();
    let engine = run.into_engine().expect("the engine was built");
    (findings, engine)
}

fn analyze_run(engine: Engine, p: &Program) -> Vec<Finding> {
    run_detected(engine, p).0
}

fn eval_steps(grad: GradContext) -> Vec<Step> {
    let mut v = vec![Step::Eval { grad }];
    v.extend(forward_steps());
    v
}

/// The allocator's block for one request (engine.md §1.2).
fn round512(bytes: u64) -> u64 {
    bytes.div_ceil(512).max(1) * 512
}

/// S_iter of mlp-mnist at B = 256 (engine.md §10.1 table, §9 symbols): the
/// saved relu1/relu2 outputs, log-probs, total_weight, and — once the names
/// are rebound — the batch x (fc1's mat1) and the int64 target (nll_loss).
fn mlp_s_iter() -> u64 {
    round512(256 * 1024 * 4) * 2
        + round512(256 * 10 * 4)
        + round512(4)
        + round512(256 * 784 * 4)
        + round512(256 * 8)
}

fn within_1pct(actual: u64, expected: u64) -> bool {
    let d = actual.abs_diff(expected) as f64;
    d <= expected as f64 * 0.01
}

fn leaks(f: &[Finding]) -> Vec<&Finding> {
    f.iter().filter(|f| f.kind.is_leak()).collect()
}

fn only<'a>(f: &'a [Finding], root: &str, kind: FindingKind) -> &'a Finding {
    let hits: Vec<_> = f
        .iter()
        .filter(|x| x.root == root && x.kind == kind)
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "expected one {kind:?} on {root}, got:\n{}",
        findings_text(f)
    );
    hits[0]
}

fn with(mut base: Vec<Step>, extra: Step) -> Vec<Step> {
    base.push(extra);
    base
}

#[test]
fn eval_total_loss_tensor_is_a_gpu_retained_graph_growing_by_s_iter() {
    // §9 pitfall 1b, §9.1.
    let n = 6;
    let steps = with(
        eval_steps(GradContext::Enabled),
        Step::AccumulateLoss {
            from: s("loss"),
            into: s("total_loss"),
            what: KeepWhat::Tensor,
        },
    );
    let e = mlp();
    let f = analyze_run(e, &program(steps, n));
    let x = only(&f, "total_loss", FindingKind::RetainedGraphGpu);
    let s_iter = mlp_s_iter();
    assert!(
        within_1pct(x.growth_per_iter as u64, s_iter),
        "growth {} vs S_iter {s_iter}",
        x.growth_per_iter
    );
    // The current iteration's graph is shared with `loss`/`out` (normal);
    // every earlier one is held by total_loss alone: (n−1)·S_iter, plus the
    // 0-dim accumulator itself (512 B).
    let expected = (n as u64 - 1) * s_iter + 512;
    assert!(within_1pct(x.bytes, expected), "{} vs {expected}", x.bytes);
    assert_eq!(x.iterations, n);
    assert_eq!(x.fix, "with torch.no_grad(): total_loss += loss.item()");
    assert_eq!(x.path.first().map(String::as_str), Some("total_loss"));
    assert!(
        x.path.iter().any(|p| p.starts_with("AddBackward0")),
        "{:?}",
        x.path
    );
    let last = x.path.last().expect("path");
    assert!(last.starts_with("saved "), "{last}");
    assert!(
        x.path.iter().any(|p| p.contains("(iter 1)")),
        "oldest graph: {:?}",
        x.path
    );
    assert!(x.full_at_iteration.is_some_and(|it| it > n as u64));
    assert!(!x.blocks.is_empty());
    assert_eq!(x.by_category.first().map(|c| c.0), Some("autograd_saved"));
    assert_eq!(leaks(&f).len(), 1, "{}", findings_text(&f));
}

#[test]
fn projection_names_the_iteration_the_device_fills() {
    let steps = with(
        eval_steps(GradContext::Enabled),
        Step::AccumulateLoss {
            from: s("loss"),
            into: s("total_loss"),
            what: KeepWhat::Tensor,
        },
    );
    let p = program(steps, 5);
    let (f, e) = run_detected(mlp(), &p);
    let x = only(&f, "total_loss", FindingKind::RetainedGraphGpu);
    let cap = 16u64 << 30;
    let free = cap - e.allocated_bytes();
    let expected = 5 + free.div_ceil(x.growth_per_iter as u64);
    assert_eq!(x.full_at_iteration, Some(expected));
}

#[test]
fn eval_total_loss_item_or_no_grad_is_not_a_leak() {
    for (grad, what) in [
        (GradContext::Enabled, KeepWhat::Item),
        (GradContext::NoGrad, KeepWhat::Item),
        (GradContext::NoGrad, KeepWhat::Tensor),
        (GradContext::InferenceMode, KeepWhat::Detach),
    ] {
        let steps = with(
            eval_steps(grad),
            Step::AccumulateLoss {
                from: s("loss"),
                into: s("total_loss"),
                what,
            },
        );
        let f = analyze_run(mlp(), &program(steps, 6));
        assert!(
            leaks(&f).is_empty(),
            "{grad:?}/{what:?}:\n{}",
            findings_text(&f)
        );
        if grad != GradContext::Enabled {
            assert!(f.is_empty(), "{grad:?}/{what:?}:\n{}", findings_text(&f));
        }
    }
}

#[test]
fn eval_without_no_grad_is_at_most_a_one_off_peak() {
    // §9 pitfall 4: outputs discarded; the previous out/loss keep one graph.
    let f = analyze_run(mlp(), &program(eval_steps(GradContext::Enabled), 6));
    assert!(leaks(&f).is_empty(), "{}", findings_text(&f));
    assert_eq!(f.len(), 1, "{}", findings_text(&f));
    let x = &f[0];
    assert_eq!(x.kind, FindingKind::OneOffPeak);
    assert_eq!(x.severity, crate::leak::Severity::Info);
    assert_eq!(x.growth_per_iter, 0);
    // The graph of one iteration: everything but x and y, which the
    // variables still reference themselves.
    let one_graph = mlp_s_iter() - round512(256 * 784 * 4) - round512(256 * 8);
    assert!(
        within_1pct(x.bytes, one_graph),
        "{} vs {one_graph}",
        x.bytes
    );
    assert!(x.fix.contains("torch.no_grad()"));
    // With no_grad: nothing at all.
    let f = analyze_run(mlp(), &program(eval_steps(GradContext::NoGrad), 6));
    assert!(f.is_empty(), "{}", findings_text(&f));
}

#[test]
fn train_total_loss_tensor_grows_the_host_graph_not_the_gpu() {
    // §9 pitfall 1: +0 B GPU, + Nodes per iteration on the host.
    let steps = with(
        train_steps(),
        Step::AccumulateLoss {
            from: s("loss"),
            into: s("total_loss"),
            what: KeepWhat::Tensor,
        },
    );
    let f = analyze_run(mlp(), &program(steps, 6));
    let x = only(&f, "total_loss", FindingKind::RetainedGraphHost);
    assert_eq!(x.growth_per_iter, 0, "GPU flat");
    assert_eq!(x.bytes, 512, "only the 0-dim accumulator's block");
    assert_eq!(x.iterations, 6, "the chain spans every iteration");
    assert!(x.evidence.contains("host"));
    assert_eq!(x.fix, "total_loss += loss.item()");
    assert!(x.full_at_iteration.is_none());
    assert!(
        !f.iter().any(|f| f.kind == FindingKind::RetainedGraphGpu),
        "{}",
        findings_text(&f)
    );
    // Fixed: .item() and .detach() accumulate nothing.
    for what in [KeepWhat::Item, KeepWhat::Detach] {
        let steps = with(
            train_steps(),
            Step::AccumulateLoss {
                from: s("loss"),
                into: s("total_loss"),
                what,
            },
        );
        let f = analyze_run(mlp(), &program(steps, 6));
        assert!(f.is_empty(), "{what:?}:\n{}", findings_text(&f));
    }
}

#[test]
fn losses_append_loss_keeps_graphs_on_host_and_512_bytes_per_entry() {
    // §9 pitfall 2 (training, backward each step).
    let n = 6;
    let steps = with(
        train_steps(),
        Step::Append {
            from: s("loss"),
            list: s("losses"),
            what: KeepWhat::Tensor,
        },
    );
    let f = analyze_run(mlp(), &program(steps, n));
    let x = only(&f, "losses", FindingKind::RetainedGraphHost);
    assert_eq!(x.growth_per_iter, 512, "+512 B GPU per entry (small pool)");
    // The current loss is shared with `loss`; the others are the list's alone.
    assert_eq!(x.bytes, (n as u64 - 1) * 512);
    assert_eq!(x.fix, "losses.append(loss.item())");
    let f = analyze_run(
        mlp(),
        &program(
            with(
                train_steps(),
                Step::Append {
                    from: s("loss"),
                    list: s("losses"),
                    what: KeepWhat::Item,
                },
            ),
            n,
        ),
    );
    assert!(f.is_empty(), "{}", findings_text(&f));
}

#[test]
fn stored_outputs_detach_on_gpu_item_and_cpu_hold_nothing() {
    // §9 pitfall 5 (training): +A_out per iteration, A_out = logits [256,10] fp32.
    let n = 6;
    let a_out = round512(256 * 10 * 4);
    for what in [KeepWhat::Detach, KeepWhat::Tensor] {
        let steps = with(
            train_steps(),
            Step::Append {
                from: s("out"),
                list: s("preds"),
                what,
            },
        );
        let f = analyze_run(mlp(), &program(steps, n));
        let x = only(&f, "preds", FindingKind::StoredTensors);
        assert_eq!(x.growth_per_iter as u64, a_out, "{what:?}");
        assert!(x.path[0].starts_with("preds"));
        assert!(x.fix.contains(".cpu()"), "{}", x.fix);
        assert_eq!(leaks(&f).len(), 1, "{}", findings_text(&f));
        // The detached list is not a graph.
        assert!(!f.iter().any(|f| f.kind == FindingKind::RetainedGraphGpu));
        // All but the current output (shared with `out`) are the list's alone.
        assert_eq!(x.bytes, (n as u64 - 1) * a_out, "{what:?}");
        assert_eq!(x.blocks.len(), n as usize - 1);
    }
    for what in [KeepWhat::Item, KeepWhat::Cpu] {
        let steps = with(
            train_steps(),
            Step::Append {
                from: s("out"),
                list: s("preds"),
                what,
            },
        );
        let f = analyze_run(mlp(), &program(steps, n));
        assert!(f.is_empty(), "{what:?}:\n{}", findings_text(&f));
    }
}

#[test]
fn missing_zero_grad_is_flagged_without_calling_it_a_leak() {
    // §9 pitfall 6, §3.1: grads accumulate in place, memory flat.
    let mut steps = forward_steps();
    steps.push(Step::Backward {
        loss: s("loss"),
        retain_graph: false,
    });
    steps.push(Step::OptimizerStep);
    let f = analyze_run(mlp(), &program(steps, 5));
    assert!(leaks(&f).is_empty(), "{}", findings_text(&f));
    let x = only(&f, "gradients", FindingKind::MissingZeroGrad);
    assert_eq!(x.growth_per_iter, 0);
    // G: one grad per parameter (§10.1 shapes), each its own block.
    let g: u64 = [1024 * 784, 1024, 1024 * 1024, 1024, 10 * 1024, 10]
        .iter()
        .map(|n| round512(n * 4))
        .sum();
    assert_eq!(x.bytes, g);
    assert!(x.fix.contains("optimizer.zero_grad()"));
    // Present (either flavour): nothing.
    for set_to_none in [None, Some(false)] {
        let mut steps = train_steps();
        steps[0] = Step::ZeroGrad {
            set_to_none,
            optimizer: None,
        };
        let f = analyze_run(mlp(), &program(steps, 5));
        assert!(f.is_empty(), "{set_to_none:?}:\n{}", findings_text(&f));
    }
}

fn lstm_steps(detach: bool, retain_graph: bool, step: bool) -> Vec<Step> {
    let mut v = vec![Step::CarryHidden {
        detach,
        part: Default::default(),
    }];
    v.push(Step::ZeroGrad {
        set_to_none: None,
        optimizer: None,
    });
    v.extend(forward_steps());
    v.push(Step::Backward {
        loss: s("loss"),
        retain_graph,
    });
    if step {
        v.push(Step::OptimizerStep);
    }
    v
}

/// Retained growth per batch for a carried LSTM hidden state, by §9.1's
/// definition (saved slots reachable from the surviving `hidden`), with
/// lstm-lm-ptb's sizes (§10.3: T = 35, B = 20, E = H = 200, L = 2, reserve
/// k = 6). h_k's graph reaches its CudnnRnn node and everything *upstream*:
/// the input dropout (output saved by the LSTM, bool mask), the embedding's
/// int64 indices, the LSTM output and reserve, and the previous (h, c) saved
/// as hx, cx. The output dropout, decoder and log-probs hang off the output
/// side: `loss` holds them until it is rebound, then they die — so §8.3's
/// "reserve + output + log-probs" overstates the per-batch growth.
fn lstm_retained_per_batch() -> u64 {
    let (t, b, h, l) = (35u64, 20u64, 200u64, 2u64);
    let act = t * b * h * 4; // 560,000
    let mask = t * b * h; // 140,000 (bool)
    let reserve = l * t * b * h * 6 * 4; // 6,720,000
    let hc = l * b * h * 4; // 32,000 each
    let ids = t * b * 8; // 5,600
    round512(act)
        + round512(mask)
        + round512(act)
        + round512(reserve)
        + 2 * round512(hc)
        + round512(ids)
}

#[test]
fn lstm_hidden_carried_with_retain_graph_chains_iterations() {
    // §8.3, §9 pitfall 3b: +S_iter per iteration, chain over all batches.
    // (Without optimizer.step(): with it, the in-place update of weights that
    // earlier graphs saved stops the run at iteration 2 — see below.)
    let n = 5;
    let e = engine(ModelConfig::lstm_lm_ptb());
    let f = analyze_run(e, &program(lstm_steps(false, true, false), n));
    let x = only(&f, "hidden", FindingKind::CarriedHiddenState);
    let s_iter = lstm_retained_per_batch();
    assert!(
        within_1pct(x.growth_per_iter as u64, s_iter),
        "growth {} vs retained per batch {s_iter}",
        x.growth_per_iter
    );
    assert_eq!(x.iterations, n);
    assert!(x.fix.contains("detach()"));
    assert_eq!(x.severity, crate::leak::Severity::Critical);
    assert!(
        x.path.iter().any(|p| p.contains("(iter 1)")),
        "{:?}",
        x.path
    );
    // With optimizer.step() the run stops at iteration 2 (saved weights were
    // modified in place); the carried hidden state is still named.
    let e = engine(ModelConfig::lstm_lm_ptb());
    let f = analyze_run(e, &program(lstm_steps(false, true, true), n));
    let x = only(&f, "hidden", FindingKind::CarriedHiddenState);
    assert!(x.evidence.contains("inplace operation"), "{}", x.evidence);
}

#[test]
fn lstm_hidden_not_detached_stops_at_iteration_2_and_is_named() {
    // §8.3: plain backward → backward-twice error at iteration 2.
    let e = engine(ModelConfig::lstm_lm_ptb());
    let f = analyze_run(e, &program(lstm_steps(false, false, true), 4));
    let x = only(&f, "hidden", FindingKind::CarriedHiddenState);
    assert!(x.evidence.contains("second time"), "{}", x.evidence);
    // Detached: nothing.
    let e = engine(ModelConfig::lstm_lm_ptb());
    let f = analyze_run(e, &program(lstm_steps(true, false, true), 5));
    assert!(f.is_empty(), "{}", findings_text(&f));
}

#[test]
fn variable_batch_sizes_grow_the_cache_not_a_leak() {
    // §9 pitfall 11: reserved grows while allocated stays flat.
    let mut p = program(train_steps(), 10);
    p.batch_sizes = vec![64, 96, 160, 224, 288, 352, 416, 480, 544, 608];
    let e = mlp();
    let f = analyze_run(e, &p);
    assert!(leaks(&f).is_empty(), "{}", findings_text(&f));
    let x = only(&f, "allocator cache", FindingKind::CacheFragmentation);
    assert!(x.fix.contains("expandable_segments:True"));
    assert!(x.growth_per_iter > 0);
    // Fixed shapes: nothing.
    let f = analyze_run(mlp(), &program(train_steps(), 10));
    assert!(f.is_empty(), "{}", findings_text(&f));
}

#[test]
fn a_flat_loss_held_to_the_next_iteration_is_never_reported() {
    let f = analyze_run(mlp(), &program(train_steps(), 8));
    assert!(f.is_empty(), "{}", findings_text(&f));
}

#[test]
fn too_few_iterations_are_not_enough_evidence() {
    let steps = with(
        eval_steps(GradContext::Enabled),
        Step::AccumulateLoss {
            from: s("loss"),
            into: s("total_loss"),
            what: KeepWhat::Tensor,
        },
    );
    let f = analyze_run(mlp(), &program(steps, 2));
    assert!(leaks(&f).is_empty(), "{}", findings_text(&f));
}

#[test]
fn on_demand_observation_replaces_the_iteration_sample() {
    let steps = with(
        eval_steps(GradContext::Enabled),
        Step::AccumulateLoss {
            from: s("loss"),
            into: s("total_loss"),
            what: KeepWhat::Tensor,
        },
    );
    let p = program(steps, 5);
    let mut e = mlp();
    let mut d = Detector::for_engine(&e).with_program(&p);
    for _ in 0..5 {
        e.run_iteration(&p).expect("iteration");
        let ls = e.held_state();
        d.observe(&ls, e.allocated_bytes(), e.reserved_bytes());
        // A second query at the same frame must not count as growth.
        d.observe(&ls, e.allocated_bytes(), e.reserved_bytes());
    }
    assert_eq!(d.history().count(), 5);
    assert_eq!(d.group_history("total_loss").len(), 5);
    assert!(d
        .findings()
        .iter()
        .any(|f| f.root == "total_loss" && f.kind == FindingKind::RetainedGraphGpu));
}

#[test]
fn json_and_text_carry_the_fields() {
    let steps = with(
        eval_steps(GradContext::Enabled),
        Step::AccumulateLoss {
            from: s("loss"),
            into: s("total_loss"),
            what: KeepWhat::Tensor,
        },
    );
    let f = analyze_run(mlp(), &program(steps, 5));
    let j = findings_json(&f);
    let a = j.as_array().expect("array");
    let x = &a[0];
    for k in [
        "root",
        "kind",
        "bytes",
        "growth_per_iter",
        "iterations",
        "path",
        "fix",
        "severity",
    ] {
        assert!(x.get(k).is_some(), "missing {k}");
    }
    assert_eq!(x["root"], "total_loss");
    assert_eq!(x["kind"], "retained_graph_gpu");
    assert_eq!(x["severity"], "critical");
    let t = findings_text(&f);
    assert!(t.contains("total_loss"));
    assert!(t.contains("fix: with torch.no_grad(): total_loss += loss.item()"));
    assert!(t.contains("device is full at iteration"));
    assert!(findings_text(&[]).contains("no finding"));
}

#[test]
fn a_buffer_rebuilt_while_still_bound_is_a_one_off_peak() {
    // §9 pitfall 12: `buf = torch.empty(...)` each iteration.
    let buffer = Step::AllocateBuffer {
        name: s("buf"),
        shape: vec![4, 1024, 1024],
        dtype: crate::engine::DType::F32,
        fill: crate::engine::Fill::Empty,
    };
    let f = analyze_run(mlp(), &program(with(train_steps(), buffer.clone()), 5));
    let x = only(&f, "buf", FindingKind::OneOffPeak);
    assert_eq!(x.bytes, 16 << 20);
    assert!(x.fix.contains("del buf"), "{}", x.fix);
    assert!(leaks(&f).is_empty(), "{}", findings_text(&f));
    // `del buf` first, or the buffer made once in setup: nothing to say.
    let mut steps = vec![Step::Delete { name: s("buf") }];
    steps.extend(with(train_steps(), buffer.clone()));
    let mut p = program(steps, 5);
    p.setup.push(buffer.clone());
    let f = analyze_run(mlp(), &p);
    assert!(f.is_empty(), "{}", findings_text(&f));
    let mut p = program(train_steps(), 5);
    p.setup.push(buffer);
    let f = analyze_run(mlp(), &p);
    assert!(f.is_empty(), "{}", findings_text(&f));
}
