//! Issue 39's leaks through what a loop keeps, each held to the bytes it
//! keeps per iteration with its fixed twin flat: an input fed back without
//! `.detach()` (with and without a clamp), a full backward hook's kept
//! gradient, an EMA updated with grad, a model re-created under an old
//! optimizer, and a teacher run without `no_grad`.

use super::*;

/// Issue 39, an input fed back without `.detach()`: with
/// retain_graph=True each step keeps its clamp's saved input ([256, 784]
/// fp32) and the finding names `x` with the detach fix; without it the
/// third backward reaches the second step's spent clamp and the run stops
/// with PyTorch's error, traced back to `x`; the fixed twin is a fresh
/// leaf each step. `x.grad` of a non-leaf without `retain_grad()` is
/// Python's AttributeError, and `requires_grad_()` of a computed tensor
/// PyTorch's refusal.
#[test]
fn an_input_fed_back_without_detach_chains_every_step() {
    use vramscope::leak::FindingKind;
    let input = (256 * 784 * 4) as f64;
    let r = run_variant("adversarial-input-graph-bug", |t| t);
    assert_eq!(growth_per_iteration(&r), input, "{:?}", steady(&r));
    let f = &r.findings[0];
    assert_eq!(
        (f.root.as_str(), f.kind),
        ("x", FindingKind::RetainedGraphGpu)
    );
    assert!(
        f.fix
            .starts_with("x = (x + eps * x.grad.sign()).clamp(0, 1).detach().requires_grad_()"),
        "{}",
        f.fix
    );
    assert!(
        f.evidence.contains("fed back as the next input"),
        "{}",
        f.evidence
    );

    let fixed = run_variant("adversarial-input-detach-fixed", |t| t);
    assert_flat(&fixed);
    assert!(
        fixed.findings.iter().all(|f| !f.kind.is_leak()),
        "{:?}",
        fixed.findings
    );

    let twice = run_variant("adversarial-input-graph-bug", |t| {
        t.replace("retain_graph: true", "retain_graph: false")
    });
    assert!(
        twice
            .error
            .as_deref()
            .is_some_and(|e| e.contains("Trying to backward through the graph a second time")),
        "{:?}",
        twice.error
    );
    assert_eq!(twice.per_iteration.len(), 2, "the third backward raises");
    assert!(
        twice.findings.iter().any(|f| f.root == "x"),
        "{:?}",
        twice.findings
    );

    let no_grad = run_variant("adversarial-input-graph-bug", |t| {
        t.replace("        RetainGrad(name: \"x\"),", "")
    });
    assert!(
        no_grad
            .error
            .as_deref()
            .is_some_and(|e| e.contains("'NoneType' object has no attribute 'sign'")
                && e.contains("retain_grad")),
        "{:?}",
        no_grad.error
    );

    let not_leaf = run_variant("adversarial-input-detach-fixed", |t| {
        t.replace(
            "        GradSignStep(",
            "        RequiresGrad(name: \"out\"),\n        GradSignStep(",
        )
    });
    assert!(
        not_leaf
            .error
            .as_deref()
            .is_some_and(|e| e.contains("only change requires_grad flags of leaf variables")),
        "{:?}",
        not_leaf.error
    );
}
/// A full backward hook on fc2 that keeps the gradient of its output adds
/// exactly that gradient ([256, 1024] fp32) per iteration, and the finding
/// names the hook and its handle; the fixed twin is flat and clean. On fc1,
/// whose input needs no grad, PyTorch warns that the hook fires with
/// respect to the outputs only; on a module that is no Linear the run stops.
#[test]
fn a_full_backward_hook_keeps_its_module_s_output_gradient() {
    let r = run_variant("backward-hook-grads-bug", |t| t);
    assert_eq!(
        growth_per_iteration(&r),
        (256 * 1024 * 4) as f64,
        "{:?}",
        steady(&r)
    );
    let f = &r.findings[0];
    assert_eq!(f.root, "grads");
    assert!(
        f.evidence.contains("A full backward hook on `fc2`"),
        "{}",
        f.evidence
    );
    assert!(f.fix.starts_with("bhandle_fc2.remove()"), "{}", f.fix);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);

    let fixed = run_variant("backward-hook-removed-fixed", |t| t);
    assert_flat(&fixed);
    assert!(
        fixed.findings.iter().all(|f| !f.kind.is_leak()),
        "{:?}",
        fixed.findings
    );

    let fc1 = run_variant("backward-hook-grads-bug", |t| {
        t.replace("module: \"fc2\", list", "module: \"fc1\", list")
    });
    assert_eq!(growth_per_iteration(&fc1), (256 * 1024 * 4) as f64);
    assert!(
        fc1.warnings
            .iter()
            .any(|w| w.contains("Full backward hook is firing when gradients are computed with respect to module outputs")),
        "{:?}",
        fc1.warnings
    );
    let relu = run_variant("backward-hook-grads-bug", |t| {
        t.replace("module: \"fc2\", list", "module: \"relu1\", list")
    });
    assert!(
        relu.error
            .as_deref()
            .is_some_and(|e| e.contains("no Linear module `relu1`")),
        "{:?}",
        relu.error
    );
}
/// Without the clamp, `x = x + eps * x.grad.sign()` saves nothing: the
/// chain of AddBackward0 grows on the host only, and the finding says so
/// (no GPU growth) with the detach fix.
#[test]
fn an_input_fed_back_without_a_clamp_grows_on_the_host() {
    use vramscope::leak::FindingKind;
    let r = run_variant("adversarial-input-graph-bug", |t| {
        t.replace("clamp: true", "clamp: false")
            .replace(
                "        Leak(root: \"x\", kind: \"retained_graph_gpu\"),\n",
                "",
            )
            .replace("        AllocatedGrowsAtLeast(\"784KiB\"),\n", "")
    });
    assert_eq!(growth_per_iteration(&r), 0.0, "{:?}", steady(&r));
    let f = finding_on(&r, "x");
    assert_eq!(f.kind, FindingKind::RetainedGraphHost);
    assert!(
        f.evidence.contains("runs that whole history again"),
        "{}",
        f.evidence
    );
    assert!(
        f.fix
            .starts_with("x = (x + eps * x.grad.sign()).detach().requires_grad_()"),
        "{}",
        f.fix
    );
}
/// An EMA of the weights updated in place outside `torch.no_grad()`: the
/// GPU is flat, every update adds one AddBackward0 and one MulBackward1
/// per parameter on the host, and the finding says so with the no_grad
/// fix; inside no_grad nothing is recorded.
#[test]
fn an_ema_updated_with_grad_grows_its_history_on_the_host() {
    use vramscope::leak::FindingKind;
    let r = run_variant("ema-update-grad-bug", |t| t);
    assert_flat(&r);
    let f = finding_on(&r, "ema");
    assert_eq!(f.kind, FindingKind::RetainedGraphHost);
    // 6 parameters, 2 Nodes each per update, 40 updates.
    assert!(f.evidence.contains("480 Nodes"), "{}", f.evidence);
    assert!(
        f.fix
            .starts_with("with torch.no_grad(): for e, p in zip(ema"),
        "{}",
        f.fix
    );
    let fixed = run_variant("ema-update-no-grad-fixed", |t| t);
    assert_flat(&fixed);
    assert!(
        fixed.findings.iter().all(|f| !f.kind.is_leak()),
        "{:?}",
        fixed.findings
    );
}
/// A model re-created inside the loop while the optimizer built before it
/// stays: the optimizer keeps the first model's parameters and their
/// momentum buffers (one model's blocks each), the finding names the
/// optimizer with the fix that re-creates it, and from the first
/// re-creation on the bug holds exactly one model's parameters more than
/// the fixed twin at every iteration end (its momentum buffers take the
/// place of the new model's, which the stale optimizer never makes).
#[test]
fn a_model_recreated_under_an_old_optimizer_keeps_the_old_model() {
    use vramscope::leak::FindingKind;
    // mlp-mnist's parameters: fc1 784→1024, fc2 1024→1024, fc3 1024→10,
    // fp32, each in the allocator's blocks (512-byte multiples).
    let block = |elems: u64| (elems * 4).div_ceil(512) * 512;
    let model: u64 = [(784, 1024), (1024, 1024), (1024, 10)]
        .iter()
        .map(|&(i, o)| block(i * o) + block(o))
        .sum();
    let bug = get("model-recreated-stale-optimizer-bug");
    let fixed = get("model-recreated-with-optimizer-fixed");
    let f = finding_on(bug, "optimizer");
    assert_eq!(f.kind, FindingKind::StaleOptimizerParams);
    assert_eq!(f.bytes, 2 * model, "parameters and momentum: {f:?}");
    assert!(
        f.fix
            .starts_with("optimizer = type(optimizer)(model.parameters()"),
        "{}",
        f.fix
    );
    assert!(f.evidence.contains("6 parameters"), "{}", f.evidence);
    assert!(
        fixed.findings.iter().all(|f| !f.kind.is_leak()),
        "{:?}",
        fixed.findings
    );
    // From the first re-creation (iteration 1's end) on, one model's
    // requested bytes apart (the bug's first model where the fixed twin
    // has momentum buffers), but at the end of each later re-creation,
    // where the fixed twin has just dropped its old optimizer's momentum
    // buffers: two.
    let requested: u64 = [(784, 1024), (1024, 1024), (1024, 10)]
        .iter()
        .map(|&(i, o)| (i * o + o) * 4)
        .sum();
    let (b, x) = (&bug.per_iteration, &fixed.per_iteration);
    assert_eq!(b.len(), x.len());
    for (pb, px) in b.iter().zip(x) {
        let models = match pb.iteration {
            it if it > 1 && it % 10 == 1 => 2,
            _ => 1,
        };
        assert_eq!(
            pb.requested,
            px.requested + models * requested,
            "iteration {}",
            pb.iteration
        );
    }
}
/// A teacher (a second model, `BuildModel`) run without `torch.no_grad()`:
/// its parameters require grad, so its forward saves its two ReLU
/// results, which `t_out` holds at every iteration's end (the hard labels
/// `t_out.argmax(1)` have no history, no backward frees them): exactly
/// their bytes above the fixed twin, flat, named as a one-off peak with
/// the no_grad fix. When the loss does reach the teacher (MSE against
/// `t_out`), its parameters get gradients no optimizer zeroes: named too.
#[test]
fn a_teacher_without_no_grad_keeps_its_activations_or_gets_gradients() {
    use vramscope::leak::FindingKind;
    let relu_results = 2 * 256 * 1024 * 4;
    let bug = get("teacher-forward-grad-bug");
    let fixed = get("teacher-forward-no-grad-fixed");
    assert_flat(bug);
    assert_flat(fixed);
    for (b, x) in bug.per_iteration.iter().zip(&fixed.per_iteration) {
        assert_eq!(
            b.requested,
            x.requested + relu_results,
            "iteration {}",
            b.iteration
        );
    }
    let f = finding_on(bug, "t_out");
    assert_eq!(f.kind, FindingKind::OneOffPeak);
    assert_eq!(f.bytes, relu_results);
    assert_eq!(f.fix, "with torch.no_grad(): t_out = teacher(x)");
    assert!(
        bug.findings.iter().all(|f| !f.kind.is_leak()),
        "{:?}",
        bug.findings
    );
    assert!(fixed.findings.is_empty(), "{:?}", fixed.findings);

    let mse = run_variant("teacher-forward-grad-bug", |t| {
        t.replace("    optimizer: (", "    criterion: Mse,\n    optimizer: (")
            .replace("        Argmax(from: \"t_out\", into: \"t_label\"),", "")
            .replace("target: \"t_label\"", "target: \"t_out\"")
            .replace("Finding(\"one_off_peak\"),", "")
            .replace("NoLeak,", "")
    });
    assert!(mse.error.is_none(), "{:?}", mse.error);
    let params: u64 = [(784u64, 1024u64), (1024, 1024), (1024, 10)]
        .iter()
        .map(|&(i, o)| (i * o * 4).div_ceil(512) * 512 + (o * 4).div_ceil(512) * 512)
        .sum();
    let f = finding_on(&mse, "teacher");
    assert_eq!(f.kind, FindingKind::StrayGradients);
    assert_eq!(f.bytes, params, "the teacher's gradients: {f:?}");
    assert_eq!(f.fix, "with torch.no_grad(): t_out = teacher(x)");
}
/// `del teacher` lets the second model go: its parameters are freed with
/// nothing else holding them, and a later `teacher(x)` is Python's
/// NameError.
#[test]
fn a_deleted_teacher_frees_its_parameters() {
    let params: u64 = [(784u64, 1024u64), (1024, 1024), (1024, 10)]
        .iter()
        .map(|&(i, o)| (i * o + o) * 4)
        .sum();
    let kept = get("teacher-forward-no-grad-fixed");
    let deleted = run_variant("teacher-forward-no-grad-fixed", |t| {
        t.replace(
            "        BuildModel(name: \"teacher\"),",
            "        BuildModel(name: \"teacher\"),\n        Delete(name: \"teacher\"),",
        )
        .replace("        SetGrad(grad: NoGrad),", "")
        .replace(
            "        Forward(input: \"x\", output: \"t_out\", model: \"teacher\"),",
            "",
        )
        .replace("        SetGrad(grad: Enabled),", "")
        .replace("Argmax(from: \"t_out\"", "Argmax(from: \"out\"")
    });
    assert!(deleted.error.is_none(), "{:?}", deleted.error);
    // Without the teacher: its parameters gone, and no t_out (10 × 256 fp32).
    let t_out = 256 * 10 * 4;
    for (k, d) in kept.per_iteration.iter().zip(&deleted.per_iteration) {
        assert_eq!(
            k.requested,
            d.requested + params + t_out,
            "iteration {}",
            k.iteration
        );
    }
    // A Forward through the deleted name is refused by check, at the step.
    let text = std::fs::read_to_string(scenarios_dir().join("teacher-forward-no-grad-fixed.ron"))
        .expect("the built-in's file")
        .replace(
            "        BuildModel(name: \"teacher\"),",
            "        BuildModel(name: \"teacher\"),\n        Delete(name: \"teacher\"),",
        );
    let err = vramscope::scenario::load_str(&text, "variant.ron")
        .expect_err("check refuses a Forward through a deleted model");
    assert!(err.to_string().contains("`teacher`"), "{err}");
}
