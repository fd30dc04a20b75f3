//! Steps checked at the step: unbound and deleted names, an optimizer step
//! without a backward, input gradients, re-created models, a second model,
//! Hessian-vector products and GANs.

use super::*;

#[test]
fn unbound_name_points_at_the_step() {
    let text = VALID.replace(
        "Forward(input: \"x\", output: \"out\")",
        "Forward(input: \"xs\", output: \"out\")", // line 9
    );
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (9, 9), "at `Forward`");
    assert!(message.contains("`xs`"), "{message}");
}
#[test]
fn deleting_an_unbound_name_or_reading_a_deleted_one_points_at_the_step() {
    // Python: `del nope` before any `nope = ...` raises NameError.
    let text = VALID.replace(
        "        ZeroGrad(set_to_none: true),\n",
        "        ZeroGrad(set_to_none: true),\n        Delete(name: \"nope\"),\n", // line 8
    );
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (8, 9), "at `Delete`");
    assert!(message.contains("`nope`"), "{message}");

    let text = VALID.replace(
        "        Loss(output: \"out\", target: \"y\", into: \"loss\"),\n",
        "        Delete(name: \"out\"),\n        Loss(output: \"out\", target: \"y\", into: \"loss\"),\n",
    ); // Loss moves to line 11
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (11, 9), "at the `Loss` that reads `out`");
    assert!(message.contains("`out`"), "{message}");
}
#[test]
fn optimizer_step_without_backward_points_at_it() {
    let text = VALID.replace(
        "        Backward(loss: \"loss\", retain_graph: false),\n",
        "",
    ); // OptimizerStep moves up to line 11
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (11, 9), "at `OptimizerStep`");
    assert!(message.contains("needs a Backward"), "{message}");
}
/// Issue 39's input steps are checked like every other: the gradient a
/// `GradSignStep` takes the sign of, and the name `RequiresGrad` flags,
/// must be bound tensors, else the step's line and column.
#[test]
fn input_gradient_steps_point_at_what_they_read() {
    let text = VALID.replace(
        "        OptimizerStep,\n",
        "        OptimizerStep,\n        GradSignStep(input: \"x\", grad: \"g\", clamp: true, detach: true),\n",
    ); // line 13
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (13, 9), "at `GradSignStep`: {message}");
    assert!(message.contains("`g`"), "{message}");

    let text = VALID.replace(
        "        OptimizerStep,\n",
        "        OptimizerStep,\n        NewList(name: \"xs\"),\n        RequiresGrad(name: \"xs\"),\n",
    ); // line 14
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (14, 9), "at `RequiresGrad`: {message}");
    assert!(message.contains("requires_grad_"), "{message}");

    let text = VALID.replace(
        "        Forward(input: \"x\", output: \"out\"),\n",
        "        RequiresGrad(name: \"x\"),\n        Forward(input: \"x\", output: \"out\"),\n",
    );
    load_str(&text, "ok.ron").expect("a bound tensor is fine");
}
/// Issue 39's re-created model and optimizer are steps without fields,
/// checked like every other: a field is refused at the step with the
/// variant's name, and so is one inside a `with torch.autocast(...)`
/// block, whose cast cache would keep the old weights' casts (not
/// modelled); the plain statements load.
#[test]
fn recreate_steps_are_checked_at_the_step() {
    let text = VALID.replace(
        "        OptimizerStep,\n",
        "        OptimizerStep,\n        RecreateModel(model: \"teacher\"),\n",
    ); // line 13
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (13, 22), "at `RecreateModel(`: {message}");
    assert!(
        message.contains("`RecreateModel` takes no fields"),
        "{message}"
    );

    let text = VALID.replace(
        "        OptimizerStep,\n",
        "        OptimizerStep,\n        AutocastEnter(dtype: F16),\n        RecreateOptimizer,\n        AutocastExit,\n",
    ); // line 14
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (14, 9), "at `RecreateOptimizer`: {message}");
    assert!(message.contains("autocast"), "{message}");

    let text = VALID.replace(
        "        OptimizerStep,\n",
        "        OptimizerStep,\n        RecreateModel,\n        RecreateOptimizer,\n",
    );
    load_str(&text, "ok.ron").expect("re-creating the model and the optimizer is fine");
}
/// A second model's statements are checked at the step: `Forward` through
/// a model no `BuildModel` made, or through a tensor, and a `BuildModel`
/// that names the scenario's own `model`.
#[test]
fn second_model_steps_are_checked_at_the_step() {
    let forward = "        Forward(input: \"x\", output: \"out\"),\n";
    let text = VALID.replace(
        forward,
        &format!(
            "{forward}        Forward(input: \"x\", output: \"t_out\", model: \"teacher\"),\n"
        ),
    ); // line 10
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (10, 9), "at the second Forward: {message}");
    assert!(message.contains("`teacher`"), "{message}");

    let text = VALID.replace(
        forward,
        &format!("{forward}        Forward(input: \"x\", output: \"t_out\", model: \"out\"),\n"),
    );
    let (line, _, message) = at(&text);
    assert_eq!(line, 10, "{message}");
    assert!(message.contains("only a model"), "{message}");

    let text = VALID.replace(
        "        ZeroGrad(set_to_none: true),\n",
        "        ZeroGrad(set_to_none: true),\n        BuildModel(name: \"model\"),\n",
    ); // line 8
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (8, 9), "at `BuildModel`: {message}");
    assert!(message.contains("RecreateModel"), "{message}");

    let text = VALID
        .replace(
            "        ZeroGrad(set_to_none: true),\n",
            "        ZeroGrad(set_to_none: true),\n        BuildModel(name: \"teacher\"),\n",
        )
        .replace(
            forward,
            &format!(
                "{forward}        Forward(input: \"x\", output: \"t_out\", model: \"teacher\"),\n"
            ),
        );
    load_str(&text, "ok.ron").expect("a teacher built, then run");
}
/// A Hessian-vector product's statements are checked where they stand: a
/// gradient of an unbound name, a dot product of a tensor (zip() pairs
/// tuples), `.item()` of the tuple `torch.autograd.grad` returns; the
/// statements as PyHessian's loop writes them load.
#[test]
fn hvp_steps_are_checked_at_the_step() {
    let step = "        OptimizerStep,\n";
    let cases: &[(&str, usize, &str)] = &[
        (
            "        AutogradGradParams(output: \"gv\", into: \"hv\", retain_graph: true),\n",
            13,
            "`gv`, which no earlier step binds",
        ),
        (
            "        ProbeVectors(into: \"v\"),\n        GradDot(a: \"loss\", b: \"v\", into: \"gv\"),\n",
            14,
            "zip() pairs a tuple of tensors",
        ),
        (
            "        AutogradGradParams(output: \"loss\", into: \"g\", retain_graph: false, create_graph: true),\n        \
             NewList(name: \"kept\"),\n        Append(from: \"g\", list: \"kept\", what: Item),\n",
            15,
            "only a tensor has .item()",
        ),
    ];
    refused_after(step, cases);
    let text = VALID.replace(
        step,
        &format!(
            "{step}        AutogradGradParams(output: \"loss\", into: \"g\", retain_graph: false, create_graph: true),\n\
             \x20       ProbeVectors(into: \"v\"),\n\
             \x20       GradDot(a: \"g\", b: \"v\", into: \"gv\"),\n\
             \x20       AutogradGradParams(output: \"gv\", into: \"hv\", retain_graph: true, allow_unused: true),\n\
             \x20       NewList(name: \"g_hist\"),\n\
             \x20       Append(from: \"g\", list: \"g_hist\", what: Cpu),\n"
        ),
    );
    load_str(&text, "ok.ron").expect("a Hessian-vector product as PyHessian writes it");
}
/// Issue 39's GAN statements are checked at the step, as Python would
/// refuse them: an optimizer step or zero_grad of a name no
/// `BuildOptimizer` bound (or of a tensor), an optimizer built over a
/// tensor or named as the scenario's own `optimizer`, noise of an integer
/// dtype (torch.randn makes floats only), a second model's `Mlp` with one
/// width, a sum of an unbound name; the statements as DCGAN writes them load.
#[test]
fn gan_steps_are_checked_at_the_step() {
    let step = "        OptimizerStep,\n";
    // Each case adds lines after OptimizerStep (line 12): the last one is
    // the faulty step.
    let cases: &[(&str, usize, &str)] = &[
        (
            "        OptimizerStepOf(optimizer: \"optimizerG\"),\n",
            13,
            "`optimizerG`, which no earlier step binds",
        ),
        (
            "        ZeroGrad(set_to_none: true, optimizer: \"out\"),\n",
            13,
            "only an optimizer has .zero_grad()",
        ),
        (
            "        BuildOptimizer(name: \"optimizerG\", model: \"out\"),\n",
            13,
            "an optimizer is built over a model's .parameters()",
        ),
        (
            "        BuildModel(name: \"netG\"),\n        BuildOptimizer(name: \"optimizer\", model: \"netG\"),\n",
            14,
            "RecreateOptimizer",
        ),
        (
            "        AllocateBuffer(name: \"z\", shape: [256, 64], dtype: I64, fill: Randn),\n",
            13,
            "floating-point tensors only",
        ),
        (
            "        BuildModel(name: \"netG\", model: Mlp(dims: [64])),\n",
            13,
            "at least two widths",
        ),
        (
            "        Add(a: \"loss\", b: \"loss_fake\", into: \"total\"),\n",
            13,
            "`loss_fake`, which no earlier step binds",
        ),
        (
            "        Sub(a: \"loss\", b: \"score\", into: \"wdist\"),\n",
            13,
            "`score`, which no earlier step binds",
        ),
        (
            "        NewList(name: \"gs\"),\n        GradPenalty(grad: \"gs\", into: \"gp\"),\n",
            14,
            "only a tensor has .norm()",
        ),
        (
            "        Interpolate(a: \"x\", b: \"fake\", into: \"x_hat\"),\n",
            13,
            "`fake`, which no earlier step binds",
        ),
    ];
    refused_after(step, cases);

    let text = VALID.replace(
        step,
        &format!(
            "{step}        BuildModel(name: \"netG\", model: Mlp(dims: [64, 128, 784])),\n\
             \x20       BuildOptimizer(name: \"optimizerG\", model: \"netG\"),\n\
             \x20       AllocateBuffer(name: \"z\", shape: [256, 64], dtype: F32, fill: Randn),\n\
             \x20       Forward(input: \"z\", output: \"fake\", model: \"netG\"),\n\
             \x20       Forward(input: \"fake\", output: \"out_g\"),\n\
             \x20       Loss(output: \"out_g\", target: \"y\", into: \"errG\"),\n\
             \x20       Add(a: \"loss\", b: \"errG\", into: \"total\"),\n\
             \x20       ZeroGrad(set_to_none: true, optimizer: \"optimizerG\"),\n\
             \x20       Backward(loss: \"errG\", retain_graph: false),\n\
             \x20       OptimizerStepOf(optimizer: \"optimizerG\"),\n\
             \x20       AllocateBuffer(name: \"x2\", shape: [256, 784], dtype: F32, fill: Randn),\n\
             \x20       Interpolate(a: \"x\", b: \"x2\", into: \"x_hat\"),\n\
             \x20       Keep(from: \"eps\", into: \"e\", what: Detach),\n"
        ),
    );
    load_str(&text, "ok.ron").expect("a generator with its own optimizer, eps bound");
}
