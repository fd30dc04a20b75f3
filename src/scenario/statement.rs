//! The PyTorch statement each scenario step stands for (the step table of
//! `scenarios/README.md`), written out with the step's own names, so a block
//! made by a step can say which line of a training loop it is.

use crate::engine::{
    BatchAssign, DType, DictKey, EveryUnit, Fill, GradContext, HiddenPart, KeepWhat, SecondModel,
    Step,
};

fn kept(from: &str, what: KeepWhat) -> String {
    // The RNN's carried state is a tuple (h, c): detached element-wise.
    if from == "hidden" {
        match what {
            KeepWhat::Detach => return format!("tuple(h.detach() for h in {from})"),
            KeepWhat::Cpu => return format!("tuple(h.detach().cpu() for h in {from})"),
            _ => {}
        }
    }
    match what {
        KeepWhat::Tensor => from.to_string(),
        KeepWhat::Item => format!("{from}.item()"),
        KeepWhat::Detach => format!("{from}.detach()"),
        KeepWhat::Cpu => format!("{from}.detach().cpu()"),
    }
}

fn grad_context(g: GradContext) -> &'static str {
    match g {
        GradContext::Enabled => "torch.set_grad_enabled(True)",
        GradContext::NoGrad => "torch.no_grad()",
        GradContext::InferenceMode => "torch.inference_mode()",
    }
}

fn dtype(d: DType) -> &'static str {
    match d {
        DType::F64 => "torch.float64",
        DType::F32 => "torch.float32",
        DType::F16 => "torch.float16",
        DType::BF16 => "torch.bfloat16",
        DType::F8 => "torch.float8_e4m3fn",
        DType::I64 => "torch.int64",
        DType::I32 => "torch.int32",
        DType::I16 => "torch.int16",
        DType::U8 => "torch.uint8",
        DType::Bool => "torch.bool",
    }
}

/// What of the model changes how the loop's statements read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoopShape {
    /// The model takes no target (`criterion: Sum`): `x = next(batches)`
    /// and `loss = out.sum()`.
    pub targetless: bool,
    /// The model carries a hidden state (an LSTM): `out, hidden =
    /// model(x, hidden)`.
    pub recurrent: bool,
}

/// The statement of `step` in a loop of this `shape`; every other step as
/// [`statement`] writes it.
pub fn statement_in(step: &Step, shape: LoopShape) -> String {
    match step {
        Step::LoadBatch { x, .. } if shape.targetless => format!("{x} = next(batches)"),
        Step::Loss {
            output,
            into,
            divide_by,
            ..
        } if shape.targetless => match divide_by {
            Some(d) => format!("{into} = {output}.sum() / {d}"),
            None => format!("{into} = {output}.sum()"),
        },
        Step::Forward {
            input,
            output,
            model: None,
        } if shape.recurrent => {
            format!("{output}, hidden = model({input}, hidden)")
        }
        _ => statement(step),
    }
}

/// `torch.empty(dims, dtype=…, device="cuda")`.
fn empty(shape: &[u64], d: DType) -> String {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    format!(
        "torch.empty({}, dtype={}, device=\"cuda\")",
        dims.join(", "),
        dtype(d)
    )
}

/// The statement `step` stands for, e.g. `out = model(x)`.
pub fn statement(step: &Step) -> String {
    match step {
        Step::LoadBatch {
            x,
            y,
            assign: BatchAssign::Together,
        } => format!("{x}, {y} = next(batches)"),
        Step::LoadBatch {
            x,
            y,
            assign: BatchAssign::InTurn,
        } => format!("{x} = next(inputs); {y} = next(targets)"),
        Step::Forward {
            input,
            output,
            model,
        } => format!(
            "{output} = {}({input})",
            model.as_deref().unwrap_or("model")
        ),
        Step::Loss {
            output,
            target,
            into,
            divide_by,
        } => match divide_by {
            Some(d) => format!("{into} = criterion({output}, {target}) / {d}"),
            None => format!("{into} = criterion({output}, {target})"),
        },
        Step::Backward { loss, retain_graph } => match retain_graph {
            true => format!("{loss}.backward(retain_graph=True)"),
            false => format!("{loss}.backward()"),
        },
        Step::OptimizerStep => "optimizer.step()".into(),
        Step::OptimizerStepOf { optimizer } => format!("{optimizer}.step()"),
        Step::ZeroGrad {
            set_to_none,
            optimizer,
        } => {
            let o = optimizer.as_deref().unwrap_or("optimizer");
            match set_to_none {
                Some(true) => format!("{o}.zero_grad(set_to_none=True)"),
                Some(false) => format!("{o}.zero_grad(set_to_none=False)"),
                None => format!("{o}.zero_grad()"),
            }
        }
        Step::Keep { from, into, what } => format!("{into} = {}", kept(from, *what)),
        Step::Append { from, list, what } => format!("{list}.append({})", kept(from, *what)),
        Step::AccumulateLoss { from, into, what } => format!("{into} += {}", kept(from, *what)),
        Step::CarryHidden { detach: false, .. } => "hidden carried as it is (no detach)".into(),
        Step::CarryHidden { part, .. } => match part {
            HiddenPart::Both => "hidden = repackage_hidden(hidden)".into(),
            HiddenPart::H => "hidden = (hidden[0].detach(), hidden[1])".into(),
            HiddenPart::C => "hidden = (hidden[0], hidden[1].detach())".into(),
        },
        Step::Delete { name } => format!("del {name}"),
        Step::Train => "model.train()".into(),
        Step::Eval { grad } => match grad {
            GradContext::Enabled => "model.eval()".into(),
            g => format!("model.eval(); with {}:", grad_context(*g)),
        },
        Step::SetGrad { grad } => format!("with {}:", grad_context(*grad)),
        Step::AutocastEnter { dtype: d } => {
            format!("with torch.autocast(\"cuda\", dtype={}):", dtype(*d))
        }
        Step::AutocastExit => "the end of the `with torch.autocast(...)` block".into(),
        Step::ScalerScale { loss, into } => format!("{into} = scaler.scale({loss})"),
        Step::ScalerUnscale => "scaler.unscale_(optimizer)".into(),
        Step::ScalerStep => "scaler.step(optimizer)".into(),
        Step::ScalerUpdate => "scaler.update()".into(),
        Step::ClipGradNorm => "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)".into(),
        Step::ClipGradNormNoForeach => {
            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=False)".into()
        }
        Step::EmptyCache => "torch.cuda.empty_cache()".into(),
        Step::ClearCublasWorkspaces => "torch._C._cuda_clearCublasWorkspaces()".into(),
        Step::AllocateBuffer {
            name,
            shape,
            dtype: d,
            fill,
        } => {
            let made = empty(shape, *d);
            let made = match fill {
                Fill::Empty => made,
                Fill::Zeros => made.replacen("torch.empty", "torch.zeros", 1),
                Fill::Ones => made.replacen("torch.empty", "torch.ones", 1),
                Fill::Randn => made.replacen("torch.empty", "torch.randn", 1),
            };
            format!("{name} = {made}")
        }
        Step::AllocateBuffers {
            list,
            count,
            shape,
            dtype: d,
        } => format!("{list} = [{} for _ in range({count})]", empty(shape, *d)),
        Step::DeleteEvery { list, step, offset } => {
            let start = if *offset == 0 {
                String::new()
            } else {
                offset.to_string()
            };
            format!("del {list}[{start}::{step}]")
        }
        Step::Every {
            n, offset, unit, ..
        } => match unit {
            EveryUnit::Iteration => format!("if it % {n} == {offset}:"),
            EveryUnit::Epoch => {
                format!("if epoch % {n} == {offset}:  # at the epoch's last batch")
            }
        },
        Step::Assign { name, value } => format!("{name} = {value}"),
        Step::CountCorrect {
            output,
            target,
            into,
            what,
        } => {
            let item = if *what == KeepWhat::Item {
                ".item()"
            } else {
                ""
            };
            format!("{into} += ({output}.argmax(1) == {target}).sum(){item}")
        }
        Step::NewDict { name } => format!("{name} = {{}}"),
        Step::NewList { name } => format!("{name} = []"),
        Step::RegisterForwardHook { module, list, what } => {
            let kept = match what {
                KeepWhat::Tensor => "o",
                KeepWhat::Detach => "o.detach()",
                KeepWhat::Cpu => "o.detach().cpu()",
                KeepWhat::Item => "o.item()",
            };
            format!(
                "handle_{} = model.{module}.register_forward_hook(lambda m, i, o: {list}.append({kept}))",
                module.replace('.', "_")
            )
        }
        Step::RemoveForwardHooks { module } => {
            format!("handle_{}.remove()", module.replace('.', "_"))
        }
        Step::RequiresGrad { name } => format!("{name}.requires_grad_()"),
        Step::RecreateModel => "model = Net().cuda()".into(),
        Step::BuildModel { name, model: None } => format!("{name} = Net().cuda()"),
        Step::BuildModel {
            name,
            model: Some(SecondModel::Mlp { dims, .. }),
        } => {
            let widths: Vec<String> = dims.iter().map(u64::to_string).collect();
            format!("{name} = Mlp([{}]).cuda()", widths.join(", "))
        }
        Step::BuildOptimizer { name, model } => {
            format!("{name} = type(optimizer)({model}.parameters(), **optimizer.defaults)")
        }
        Step::Add { a, b, into } => format!("{into} = {a} + {b}"),
        Step::Sub { a, b, into } => format!("{into} = {a} - {b}"),
        Step::Interpolate { a, b, into } => format!(
            "eps = torch.rand({a}.size(0), 1, device=\"cuda\"); \
             {into} = (eps * {a} + (1 - eps) * {b}).requires_grad_(True)"
        ),
        Step::GradPenalty { grad, into } => {
            format!("{into} = (({grad}.norm(2, dim=1) - 1) ** 2).mean() * 10")
        }
        Step::Argmax { from, into } => format!("{into} = {from}.argmax(1)"),
        Step::RecreateOptimizer => {
            "optimizer = type(optimizer)(model.parameters(), **optimizer.defaults)".into()
        }
        Step::EmaCopy { into } => {
            format!("{into} = [p.detach().clone() for p in model.parameters()]")
        }
        Step::EmaUpdate { ema, no_grad } => {
            let update = format!(
                "for e, p in zip({ema}, model.parameters()): e.mul_(0.999).add_(p, alpha=0.001)"
            );
            match no_grad {
                true => format!("with torch.no_grad(): {update}"),
                false => update,
            }
        }
        Step::RegisterFullBackwardHook { module, list, what } => {
            let kept = match what {
                KeepWhat::Tensor => "go[0]",
                KeepWhat::Detach => "go[0].detach()",
                KeepWhat::Cpu => "go[0].detach().cpu()",
                KeepWhat::Item => "go[0].item()",
            };
            format!(
                "bhandle_{} = model.{module}.register_full_backward_hook(lambda m, gi, go: {list}.append({kept}))",
                module.replace('.', "_")
            )
        }
        Step::RemoveBackwardHooks { module } => {
            format!("bhandle_{}.remove()", module.replace('.', "_"))
        }
        Step::AutogradGrad {
            output,
            input,
            into,
            retain_graph,
            create_graph,
        } => {
            let mut args = format!("{output}, {input}");
            if *retain_graph {
                args.push_str(", retain_graph=True");
            }
            if *create_graph {
                args.push_str(", create_graph=True");
            }
            format!("{into} = torch.autograd.grad({args})[0]")
        }
        Step::AutogradGradParams {
            output,
            into,
            retain_graph,
            create_graph,
            allow_unused,
        } => {
            let mut args = format!("{output}, model.parameters()");
            for (on, kw) in [
                (*retain_graph, "retain_graph"),
                (*create_graph, "create_graph"),
                (*allow_unused, "allow_unused"),
            ] {
                if on {
                    args.push_str(&format!(", {kw}=True"));
                }
            }
            format!("{into} = torch.autograd.grad({args})")
        }
        Step::ProbeVectors { into } => {
            format!("{into} = [torch.randn_like(p) for p in model.parameters()]")
        }
        Step::GradDot { a, b, into } => {
            format!("{into} = sum((x * y).sum() for x, y in zip({a}, {b}) if x is not None)")
        }
        Step::GradSignStep {
            input,
            grad,
            clamp,
            detach,
        } => {
            let g = grad.clone().unwrap_or_else(|| format!("{input}.grad"));
            let sum = format!("{input} + eps * {g}.sign()");
            let mut e = match clamp | detach {
                true => format!("({sum})"),
                false => sum,
            };
            if *clamp {
                e.push_str(".clamp(0, 1)");
            }
            if *detach {
                e.push_str(".detach().requires_grad_()");
            }
            format!("{input} = {e}")
        }
        Step::MakeCycle { from, into, what } => {
            format!(
                "{into} = {{{from:?}: {}}}; {into}[\"self\"] = {into}",
                kept(from, *what)
            )
        }
        Step::GcCollect => "gc.collect()".into(),
        Step::NewDeque { name, maxlen } => {
            format!("{name} = collections.deque(maxlen={maxlen})")
        }
        Step::SetItem {
            dict,
            key,
            from,
            what,
        } => {
            let key = match key {
                DictKey::Iteration => "it".to_string(),
                DictKey::Name(k) => format!("{k:?}"),
            };
            format!("{dict}[{key}] = {}", kept(from, *what))
        }
        Step::ResetPeakStats => "torch.cuda.reset_peak_memory_stats()".into(),
        Step::RetainGrad { name } => format!("{name}.retain_grad()"),
        Step::SetRequiresGrad {
            modules,
            requires_grad,
        } => {
            let value = if *requires_grad { "True" } else { "False" };
            let paths: Vec<String> = modules
                .iter()
                .map(|m| match m.as_str() {
                    "" => "model".to_string(),
                    m => format!("model.{}", m.trim_end_matches('.')),
                })
                .collect();
            format!(
                "for p in {}.parameters(): p.requires_grad_({value})",
                paths.join(", ")
            )
        }
        Step::Repeat { times, .. } => format!("for _ in range({times}):"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_use_the_steps_own_names() {
        let s = Step::AccumulateLoss {
            from: "vloss".into(),
            into: "val_total".into(),
            what: KeepWhat::Tensor,
        };
        assert_eq!(statement(&s), "val_total += vloss");
        let s = Step::Forward {
            input: "vx".into(),
            output: "vout".into(),
            model: None,
        };
        assert_eq!(statement(&s), "vout = model(vx)");
        let s = Step::Backward {
            loss: "loss".into(),
            retain_graph: true,
        };
        assert_eq!(statement(&s), "loss.backward(retain_graph=True)");
    }

    #[test]
    fn loop_statements_read_as_python() {
        let cases = [
            (
                "DeleteEvery(list: \"xs\", step: 2)",
                "del xs[::2]",
            ),
            (
                "DeleteEvery(list: \"xs\", step: 3, offset: 1)",
                "del xs[1::3]",
            ),
            (
                "Every(n: 5, offset: 4, unit: Epoch, steps: [])",
                "if epoch % 5 == 4:  # at the epoch's last batch",
            ),
            ("Every(n: 2, steps: [])", "if it % 2 == 0:"),
            (
                "CountCorrect(output: \"vout\", target: \"vy\", into: \"correct\", what: Tensor)",
                "correct += (vout.argmax(1) == vy).sum()",
            ),
            (
                "CountCorrect(output: \"o\", target: \"y\", into: \"n\", what: Item)",
                "n += (o.argmax(1) == y).sum().item()",
            ),
            ("Assign(name: \"correct\", value: 0)", "correct = 0"),
            ("NewDict(name: \"history\")", "history = {}"),
            ("NewList(name: \"preds\")", "preds = []"),
            (
                "RegisterForwardHook(module: \"fc1\", list: \"acts\", what: Cpu)",
                "handle_fc1 = model.fc1.register_forward_hook(lambda m, i, o: acts.append(o.detach().cpu()))",
            ),
            ("RemoveForwardHooks(module: \"fc1\")", "handle_fc1.remove()"),
            ("RequiresGrad(name: \"x\")", "x.requires_grad_()"),
            ("RecreateModel", "model = Net().cuda()"),
            ("BuildModel(name: \"teacher\")", "teacher = Net().cuda()"),
            (
                "BuildModel(name: \"netG\", model: Some(Mlp(dims: [64, 1024, 784])))",
                "netG = Mlp([64, 1024, 784]).cuda()",
            ),
            (
                "BuildOptimizer(name: \"optimizerG\", model: \"netG\")",
                "optimizerG = type(optimizer)(netG.parameters(), **optimizer.defaults)",
            ),
            (
                "ZeroGrad(set_to_none: Some(true), optimizer: Some(\"optimizerG\"))",
                "optimizerG.zero_grad(set_to_none=True)",
            ),
            (
                "OptimizerStepOf(optimizer: \"optimizerG\")",
                "optimizerG.step()",
            ),
            (
                "AllocateBuffer(name: \"z\", shape: [256, 64], dtype: F32, fill: Randn)",
                "z = torch.randn(256, 64, dtype=torch.float32, device=\"cuda\")",
            ),
            (
                "AllocateBuffer(name: \"real_label\", shape: [256], dtype: I64, fill: Ones)",
                "real_label = torch.ones(256, dtype=torch.int64, device=\"cuda\")",
            ),
            (
                "Add(a: \"errD_real\", b: \"errD_fake\", into: \"errD\")",
                "errD = errD_real + errD_fake",
            ),
            (
                "Sub(a: \"score_fake\", b: \"score_real\", into: \"wdist\")",
                "wdist = score_fake - score_real",
            ),
            (
                "GradPenalty(grad: \"g\", into: \"gp\")",
                "gp = ((g.norm(2, dim=1) - 1) ** 2).mean() * 10",
            ),
            (
                "Interpolate(a: \"real\", b: \"fake_d\", into: \"x_hat\")",
                "eps = torch.rand(real.size(0), 1, device=\"cuda\"); \
                 x_hat = (eps * real + (1 - eps) * fake_d).requires_grad_(True)",
            ),
            (
                "Argmax(from: \"t_out\", into: \"t_label\")",
                "t_label = t_out.argmax(1)",
            ),
            (
                "Forward(input: \"x\", output: \"t_out\", model: Some(\"teacher\"))",
                "t_out = teacher(x)",
            ),
            (
                "RecreateOptimizer",
                "optimizer = type(optimizer)(model.parameters(), **optimizer.defaults)",
            ),
            (
                "EmaCopy(into: \"ema\")",
                "ema = [p.detach().clone() for p in model.parameters()]",
            ),
            (
                "EmaUpdate(ema: \"ema\", no_grad: true)",
                "with torch.no_grad(): for e, p in zip(ema, model.parameters()): e.mul_(0.999).add_(p, alpha=0.001)",
            ),
            (
                "RegisterFullBackwardHook(module: \"fc2\", list: \"grads\", what: Tensor)",
                "bhandle_fc2 = model.fc2.register_full_backward_hook(lambda m, gi, go: grads.append(go[0]))",
            ),
            ("RemoveBackwardHooks(module: \"fc2\")", "bhandle_fc2.remove()"),
            (
                "AutogradGrad(output: \"loss\", input: \"x\", into: \"g\", retain_graph: false)",
                "g = torch.autograd.grad(loss, x)[0]",
            ),
            (
                "AutogradGrad(output: \"loss\", input: \"x\", into: \"g\", retain_graph: false, create_graph: true)",
                "g = torch.autograd.grad(loss, x, create_graph=True)[0]",
            ),
            (
                "AutogradGradParams(output: \"loss\", into: \"g\", retain_graph: false, create_graph: true)",
                "g = torch.autograd.grad(loss, model.parameters(), create_graph=True)",
            ),
            (
                "ProbeVectors(into: \"v\")",
                "v = [torch.randn_like(p) for p in model.parameters()]",
            ),
            (
                "GradDot(a: \"g\", b: \"v\", into: \"gv\")",
                "gv = sum((x * y).sum() for x, y in zip(g, v) if x is not None)",
            ),
            (
                "GradSignStep(input: \"x\", clamp: true, detach: false)",
                "x = (x + eps * x.grad.sign()).clamp(0, 1)",
            ),
            (
                "GradSignStep(input: \"x\", clamp: true, detach: true)",
                "x = (x + eps * x.grad.sign()).clamp(0, 1).detach().requires_grad_()",
            ),
            (
                "GradSignStep(input: \"x\", grad: Some(\"g\"), clamp: false, detach: true)",
                "x = (x + eps * g.sign()).detach().requires_grad_()",
            ),
            (
                "NewDeque(name: \"recent\", maxlen: 5)",
                "recent = collections.deque(maxlen=5)",
            ),
            (
                "SetItem(dict: \"history\", key: Iteration, from: \"out\", what: Detach)",
                "history[it] = out.detach()",
            ),
            (
                "SetItem(dict: \"best\", key: Name(\"loss\"), from: \"loss\", what: Item)",
                "best[\"loss\"] = loss.item()",
            ),
            (
                "AllocateBuffers(list: \"xs\", count: 100, shape: [1000, 1000], dtype: F32)",
                "xs = [torch.empty(1000, 1000, dtype=torch.float32, device=\"cuda\") for _ in range(100)]",
            ),
            (
                "CarryHidden(detach: true, part: H)",
                "hidden = (hidden[0].detach(), hidden[1])",
            ),
            (
                "Keep(from: \"hidden\", into: \"h0\", what: Detach)",
                "h0 = tuple(h.detach() for h in hidden)",
            ),
            (
                "MakeCycle(from: \"out\", into: \"rec\", what: Tensor)",
                "rec = {\"out\": out}; rec[\"self\"] = rec",
            ),
            (
                "MakeCycle(from: \"out\", into: \"rec\", what: Detach)",
                "rec = {\"out\": out.detach()}; rec[\"self\"] = rec",
            ),
            ("GcCollect", "gc.collect()"),
        ];
        for (ron_text, python) in cases {
            let step: Step = ron::from_str(ron_text).expect(ron_text);
            assert_eq!(statement(&step), python);
        }
    }
}
