//! Issue 39's leaks through gradients that keep graphs: `autograd.grad`
//! toward an input, create_graph gradients kept (a frozen MLP's, a trained
//! critic's, WGAN-GP's), a kept Hessian-vector product, and a GAN logging
//! its discriminator's loss as a tensor.

use super::*;

/// `torch.autograd.grad(loss, x)` in the input attack of kept_state.rs: it
/// stops at `x`, so the earlier steps' clamps never run again: no error,
/// and each keeps its saved input; the finding says so and its fix asks no
/// retain_graph change. The fixed twin is flat and clean. An input no
/// graph reaches is PyTorch's "appears to not have been used in the
/// graph"; one that needs no grad, its "does not require grad".
#[test]
fn autograd_grad_runs_only_toward_its_input() {
    use vramscope::leak::FindingKind;
    let r = run_variant("pgd-autograd-grad-bug", |t| t);
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(
        growth_per_iteration(&r),
        (256 * 784 * 4) as f64,
        "{:?}",
        steady(&r)
    );
    let f = &r.findings[0];
    assert_eq!(
        (f.root.as_str(), f.kind),
        ("x", FindingKind::RetainedGraphGpu)
    );
    assert!(
        f.evidence
            .contains("torch.autograd.grad(…, x) stops at `x`"),
        "{}",
        f.evidence
    );
    assert!(!f.fix.contains("retain_graph"), "{}", f.fix);

    let fixed = run_variant("pgd-autograd-grad-fixed", |t| t);
    assert_flat(&fixed);
    assert!(
        fixed.findings.iter().all(|f| !f.kind.is_leak()),
        "{:?}",
        fixed.findings
    );

    let unused = run_variant("pgd-autograd-grad-fixed", |t| {
        t.replace("input: \"x\", into: \"g\"", "input: \"y2\", into: \"g\"")
            .replace(
                "        RequiresGrad(name: \"x\"),",
                "        RequiresGrad(name: \"x\"),\n        LoadBatch(x: \"y2\", y: \"t2\"),\n        RequiresGrad(name: \"y2\"),",
            )
    });
    assert!(
        unused
            .error
            .as_deref()
            .is_some_and(|e| e.contains("appears to not have been used in the graph")),
        "{:?}",
        unused.error
    );
    let no_grad = run_variant("pgd-autograd-grad-fixed", |t| {
        t.replace("input: \"x\", into: \"g\"", "input: \"y\", into: \"g\"")
    });
    assert!(
        no_grad
            .error
            .as_deref()
            .is_some_and(|e| e.contains("does not require grad")),
        "{:?}",
        no_grad.error
    );
}
/// `torch.autograd.grad(loss, x, create_graph=True)` on a frozen MLP, the
/// gradient kept in a list: create_graph keeps the forward graph, and the
/// gradient's own graph reaches into it, so each kept map holds its batch
/// (x, and the target NllLossBackwardBackward0 saves), both ReLU results,
/// the log-probs, the incoming gradient LogSoftmaxBackwardDataBackward0
/// saves, and the map itself: exactly their bytes per iteration. Detached
/// on the host, flat and clean. A node without a second-order rule (a
/// Linear whose weight requires grad) stops the run, named.
#[test]
fn create_graph_gradients_kept_keep_their_forward_graphs() {
    use vramscope::leak::FindingKind;
    let (b, d, h, c) = (256u64, 784u64, 1024u64, 10u64);
    let per_map = 4 * (b * d + 2 * b * h + 2 * b * c + b * d) + 8 * b;
    let bug = get("input-grad-create-graph-bug");
    let points = &bug.per_iteration;
    assert_each_iteration_adds(&points[1..], |p| p.requested, per_map);
    let f = finding_on(bug, "maps");
    assert_eq!(f.kind, FindingKind::RetainedGraphGpu);
    // The input x, saved and a leaf its AccumulateGrad holds, counted too.
    assert_eq!(f.growth_per_iter as f64, growth_per_iteration(bug));
    assert!(f.evidence.contains("create_graph=True"), "{}", f.evidence);
    assert!(
        f.fix.starts_with("maps.append(g.detach().cpu())"),
        "{}",
        f.fix
    );
    let fixed = get("input-grad-create-graph-detach-fixed");
    assert_flat(fixed);
    assert!(
        fixed.findings.iter().all(|f| !f.kind.is_leak()),
        "{:?}",
        fixed.findings
    );
    // The model trained: each MmBackward0 saves the incoming gradient too
    // (for its weight's gradient), the two ReLUs' gradients and the
    // logits' one.
    let trained = run_variant("input-grad-create-graph-bug", |t| {
        t.replace(
            "SetRequiresGrad(modules: [\"\"], requires_grad: false),",
            "",
        )
    });
    assert!(trained.error.is_none(), "{:?}", trained.error);
    let incoming = 4 * (2 * b * h + b * c);
    assert_each_iteration_adds(
        &trained.per_iteration[1..],
        |p| p.requested,
        per_map + incoming,
    );
}
/// A WGAN-GP critic's gradient (784 → 1024 → 1, the score `out.sum()`),
/// `torch.autograd.grad(score, x_hat, create_graph=True)` with the
/// critic's weights requiring grad, kept: each `g` keeps `x_hat`, the
/// ReLU's result, the ReLU's incoming gradient and the seed (both saved by
/// MmBackward0 for its weight's gradient) and itself.
#[test]
fn a_trained_critics_create_graph_gradient_keeps_its_incoming_gradients() {
    use vramscope::leak::FindingKind;
    let (b, d, h) = (256u64, 784u64, 1024u64);
    let text = r#"Scenario(
    name: "critic", description: "a trained critic's input gradient with create_graph=True, kept",
    device: (gpu: "H100-SXM-80GB"), torch: "2.11",
    model: Mlp(dims: [784, 1024, 1]), criterion: Sum,
    setup: [NewList(name: "gs")],
    steps: [
        LoadBatch(x: "x_hat", y: "y"),
        RequiresGrad(name: "x_hat"),
        Forward(input: "x_hat", output: "out"),
        Loss(output: "out", target: "y", into: "score"),
        AutogradGrad(output: "score", input: "x_hat", into: "g", retain_graph: false, create_graph: true),
        Append(from: "g", list: "gs", what: Tensor),
    ],
    iterations: 6,
)"#;
    let (s, built) = vramscope::scenario::load_str(text, "critic.ron").expect("loads");
    let r = run(&s, &built, &RunOptions::default());
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_each_iteration_adds(
        &r.per_iteration,
        |p| p.requested,
        4 * (2 * b * d + 2 * b * h) + 4,
    );
    let f = finding_on(&r, "gs");
    assert_eq!(f.kind, FindingKind::RetainedGraphGpu);
    assert!(f.evidence.contains("create_graph=True"), "{}", f.evidence);
}
/// WGAN-GP (issue 39: a penalty's backward through the graph
/// create_graph=True recorded): `grad_maps.append(g)` keeps each batch's
/// `g` and, through its spent graph (the AccumulateGrad it reaches holds
/// its leaf), `x_hat` and `x_hat.grad`: three [256, 784] fp32 tensors per
/// iteration, exactly. The finding names `grad_maps` with the host-copy
/// fix and without "create_graph=False" (a penalty needs it), charges it
/// what the run's allocated figures grow by (the leaf and its gradient
/// too, not `g` alone) and leads to the accumulator; the fixed twin is
/// flat and clean. A penalty on a classifier's input gradient
/// reaches a recorded node with no backward rule (the loss's
/// double-backward nodes): refused by name.
#[test]
fn wgan_gp_keeps_each_kept_gradients_input() {
    use vramscope::leak::FindingKind;
    let (b, d) = (256u64, 784u64);
    let bug = get("wgan-gp-grad-maps-bug");
    assert_each_iteration_adds(&bug.per_iteration, |p| p.requested, 3 * 4 * b * d);
    let f = finding_on(bug, "grad_maps");
    assert_eq!(f.kind, FindingKind::RetainedGraphGpu);
    assert_eq!(f.fix, "grad_maps.append(g.detach().cpu())");
    assert_eq!(f.growth_per_iter as f64, growth_per_iteration(bug));
    assert!(
        f.path.iter().any(|p| p.starts_with("AccumulateGrad"))
            && f.path.last().is_some_and(|p| p.contains("variable.grad")),
        "{:?}",
        f.path
    );
    assert!(f.evidence.contains("`x_hat`"), "{}", f.evidence);
    let fixed = get("wgan-gp-grad-maps-cpu-fixed");
    assert_flat(fixed);
    assert!(fixed.findings.is_empty(), "{:?}", fixed.findings);

    let classifier = run_variant("input-grad-create-graph-bug", |t| {
        t.replace(
            "        Append(from: \"g\", list: \"maps\", what: Tensor),",
            "        GradPenalty(grad: \"g\", into: \"gp\"),\n        \
             Backward(loss: \"gp\", retain_graph: false),",
        )
        .replace("AllocatedGrowsAtLeast(\"2MiB\"),", "")
        .replace("Leak(root: \"maps\", kind: \"retained_graph_gpu\"),", "")
    });
    let e = classifier
        .error
        .expect("the loss's recorded nodes are refused");
    assert!(
        e.contains("BackwardBackward0") && e.contains("not modelled"),
        "{e}"
    );
}
/// A Hessian-vector product (issue 39): `g = torch.autograd.grad(loss,
/// model.parameters(), create_graph=True)`, then the gradient of `g · v`
/// with retain_graph=True (PyHessian's idiom), `g` kept whole in a list.
/// Each kept `g` holds its four gradients, and through its graph the ReLU's
/// result (ThresholdBackwardBackward0 saves it), the batch `x` (the first
/// weight's MmBackward0 saves it) and the seed (the second weight's saves
/// the expanded seed): exactly their blocks per iteration. The finding
/// names `g_hist`, charges it what the run grows by, says the
/// Hessian-vector product's retain_graph=True kept the graph, and fixes a
/// tuple element by element; without retain_graph=True only `g` itself is
/// kept; host copies are flat and clean.
#[test]
fn a_kept_hvp_gradient_keeps_its_graph_and_its_batch() {
    use vramscope::leak::FindingKind;
    let (b, d, h) = (256u64, 784u64, 1024u64);
    let block = |bytes: u64| bytes.div_ceil(512) * 512;
    let g = block(4 * h * d) + block(4 * h) + block(4 * h) + block(4);
    let graph = block(4 * b * h) + block(4 * b * d) + block(4);
    let bug = get("hvp-grad-history-bug");
    assert!(bug.error.is_none(), "{:?}", bug.error);
    assert_each_iteration_adds(&bug.per_iteration, |p| p.allocated, g + graph);
    let f = finding_on(bug, "g_hist");
    assert_eq!(f.kind, FindingKind::RetainedGraphGpu);
    assert_eq!(f.growth_per_iter as f64, growth_per_iteration(bug));
    assert_eq!(f.fix, "g_hist.append([t.detach().cpu() for t in g])");
    assert!(f.evidence.contains("retain_graph=True"), "{}", f.evidence);
    let fixed = get("hvp-grad-history-cpu-fixed");
    assert_flat(fixed);
    assert!(fixed.findings.is_empty(), "{:?}", fixed.findings);

    let no_retain = run_variant("hvp-grad-history-bug", |t| {
        t.replace(
            "retain_graph: true, allow_unused: true",
            "retain_graph: false, allow_unused: true",
        )
        .replace("Leak(root: \"g_hist\", kind: \"retained_graph_gpu\"),", "")
    });
    assert_growth_within_1pct(&no_retain, g);
    // The last bias's second derivative is zero: no gradient reaches it.
    let unused = run_variant("hvp-grad-history-bug", |t| {
        t.replace(", allow_unused: true", "")
    });
    let e = unused.error.expect("an unused input without allow_unused");
    assert!(e.contains("appears to not have been used"), "{e}");
}
/// A GAN (issue 39: two models of their own shapes, two optimizers): the
/// discriminator trained on `fake` without `.detach()`, patched with
/// `retain_graph=True`, and `errD` logged as a tensor. Each kept `errD`
/// holds out_fake's retained graph: the fake batch D's first Linear saved
/// ([256, 784] fp32), D's ReLU result ([256, 1024] fp32) its second Linear
/// saved, the log-probs ([256, 2] fp32) and nll_loss's total_weight (0-dim),
/// and `errD` itself (0-dim): exactly those bytes per iteration. The finding
/// names `d_losses`, the `.item()` fix, and why the graph was kept (the
/// retain_graph backward, needed only for the missing `.detach()`). The
/// fixed twin is flat and clean; in it `netG`'s gradients and its
/// optimizer's state are an optimizer's own (no stray-gradient finding).
/// Without retain_graph the bug is PyTorch's backward-twice error.
#[test]
fn a_gan_logging_its_d_loss_keeps_each_fake_batchs_graph() {
    use vramscope::leak::FindingKind;
    let (b, d, h, c) = (256u64, 784u64, 1024u64, 2u64);
    let per_iteration = 4 * (b * d + b * h + b * c) + 4 + 4;
    let bug = get("gan-retain-graph-log-bug");
    assert_each_iteration_adds(&bug.per_iteration, |p| p.requested, per_iteration);
    let f = finding_on(bug, "d_losses");
    assert_eq!(f.kind, FindingKind::RetainedGraphGpu);
    assert_eq!(f.fix, "d_losses.append(errD.item())");
    for said in [
        "errD_fake.backward(retain_graph=True)",
        "`model(fake)` runs without .detach()",
        "`netG`",
        "model(fake.detach())",
    ] {
        assert!(f.evidence.contains(said), "{said}: {}", f.evidence);
    }
    assert_eq!(
        bug.findings.iter().filter(|f| f.kind.is_leak()).count(),
        1,
        "{:?}",
        bug.findings
    );
    let fixed = get("gan-detach-item-fixed");
    assert_flat(fixed);
    assert!(fixed.findings.is_empty(), "{:?}", fixed.findings);

    // optimizerG steps netG: without its step, no Adam state for netG's
    // parameters (exp_avg, exp_avg_sq; `step` lives on the host).
    let g_params = 4 * (64 * h + h + h * d + d);
    let unstepped = run_variant("gan-detach-item-fixed", |t| {
        t.replace("        OptimizerStepOf(optimizer: \"optimizerG\"),", "")
    });
    for (x, u) in fixed.per_iteration.iter().zip(&unstepped.per_iteration) {
        assert_eq!(
            x.requested,
            u.requested + 2 * g_params,
            "iteration {}",
            x.iteration
        );
    }

    let no_retain = run_variant("gan-retain-graph-log-bug", |t| {
        t.replace(
            "Backward(loss: \"errD_fake\", retain_graph: true)",
            "Backward(loss: \"errD_fake\", retain_graph: false)",
        )
    });
    let e = no_retain.error.expect("G's backward reaches a spent graph");
    assert!(
        e.contains("backward through the graph a second time"),
        "{e}"
    );
    assert_eq!(no_retain.iterations_run, 0, "{e}");
}
