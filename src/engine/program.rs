//! Programs: the engine operations a scenario is made of (one `Step` per
//! scenario statement, serde-ready), repeated for N iterations.

use serde::{Deserialize, Serialize};

use super::bindings::Value;
use super::dtype::DType;
use super::error::{EngineError, Result};
use super::events::EngineEvent;
use super::loop_steps::{DictKey, EveryUnit, HiddenPart};
use super::shape::Shape;
use super::tag::Category;
use super::Engine;
use crate::trace::Phase;

/// What a `Keep`/`Append`/`AccumulateLoss` stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeepWhat {
    /// The tensor itself (keeps its graph alive).
    Tensor,
    /// `.item()`: a Python float; a host sync, holds nothing (§1.3).
    Item,
    /// `.detach()`: a view without history; keeps the storage (§1.3).
    Detach,
    /// `.detach().cpu()`: a host copy.
    Cpu,
}

/// What an `AllocateBuffer` fills its tensor with: no allocation but the
/// tensor's own (a fill or a random-number kernel on CUDA).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fill {
    /// `torch.empty`.
    #[default]
    Empty,
    /// `torch.zeros`.
    Zeros,
    /// `torch.ones`.
    Ones,
    /// `torch.randn` (floating dtypes only).
    Randn,
}

/// The shape of a second model (`BuildModel(model: …)`), when it is not
/// the scenario's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum SecondModel {
    /// `nn.Sequential(Linear, ReLU, …, Linear)` of these widths, as the
    /// scenario's `Mlp(dims: …)`.
    Mlp {
        dims: Vec<u64>,
        #[serde(default)]
        inplace_relu: bool,
    },
}

/// Grad-mode context (§4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GradContext {
    Enabled,
    NoGrad,
    InferenceMode,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Step {
    /// `x, y = next(batches)`: allocate the model's input (and target).
    LoadBatch {
        x: String,
        y: String,
    },
    /// `output = model(input)`; recurrent models read and rebind `hidden`.
    /// `model` names a second model (`BuildModel`) to run instead.
    Forward {
        input: String,
        output: String,
        #[serde(default)]
        model: Option<String>,
    },
    /// `into = criterion(output, target)` (optionally `/ divide_by`).
    Loss {
        output: String,
        target: String,
        into: String,
        divide_by: Option<u32>,
    },
    /// `loss.backward(retain_graph=…)`.
    Backward {
        loss: String,
        retain_graph: bool,
    },
    OptimizerStep,
    /// `optimizer.zero_grad(set_to_none=…)`; None = the version default (§0.4).
    /// `optimizer` names a second optimizer (`BuildOptimizer`) instead.
    ZeroGrad {
        set_to_none: Option<bool>,
        #[serde(default)]
        optimizer: Option<String>,
    },
    /// `optimizer.step()` of a second optimizer `BuildOptimizer` made
    /// (`optimizerG.step()`).
    OptimizerStepOf {
        optimizer: String,
    },
    /// `into = from` (or `.item()`, `.detach()`, `.cpu()`).
    Keep {
        from: String,
        into: String,
        what: KeepWhat,
    },
    /// `list.append(from …)`.
    Append {
        from: String,
        list: String,
        what: KeepWhat,
    },
    /// `into += from …` (pitfall 1, §9).
    AccumulateLoss {
        from: String,
        into: String,
        what: KeepWhat,
    },
    /// Before the forward: `hidden = repackage_hidden(hidden)` when `detach`
    /// (`part` H or C: only that element, `hidden = (h.detach(), c)`).
    CarryHidden {
        detach: bool,
        #[serde(default)]
        part: HiddenPart,
    },
    /// `del name`.
    Delete {
        name: String,
    },
    /// `model.train()` with grad enabled.
    Train,
    /// `model.eval()` plus a grad context (eval alone still records, §4).
    Eval {
        grad: GradContext,
    },
    /// Change the grad context without touching the module flags.
    SetGrad {
        grad: GradContext,
    },
    AutocastEnter {
        dtype: DType,
    },
    AutocastExit,
    /// `into = scaler.scale(loss)`.
    ScalerScale {
        loss: String,
        into: String,
    },
    ScalerUnscale,
    ScalerStep,
    ScalerUpdate,
    /// `torch.nn.utils.clip_grad_norm_(model.parameters(), …)`: foreach,
    /// PyTorch's default on CUDA.
    ClipGradNorm,
    /// The same with `foreach=False`: one `vector_norm` per gradient.
    ClipGradNormNoForeach,
    EmptyCache,
    /// `torch._C._cuda_clearCublasWorkspaces()`.
    ClearCublasWorkspaces,
    /// `name = torch.empty(shape, dtype)` (a pre-allocated buffer), or
    /// `torch.zeros`/`torch.ones`/`torch.randn` with `fill` (labels, noise).
    AllocateBuffer {
        name: String,
        shape: Vec<u64>,
        dtype: DType,
        #[serde(default)]
        fill: Fill,
    },
    ResetPeakStats,
    /// `name.retain_grad()`: the next backward keeps the gradient of this
    /// non-leaf tensor in its `.grad` (a copy the size of the tensor), which
    /// lives as long as the tensor does (engine.md §3.3).
    RetainGrad {
        name: String,
    },
    /// `for p in model.<m>.parameters(): p.requires_grad_(requires_grad)` for
    /// each module path prefix in `modules` (`""`: the whole model). Frozen
    /// parameters get no grad and no optimizer state, and layers that see no
    /// grad-requiring input save nothing for backward (engine.md §4).
    SetRequiresGrad {
        modules: Vec<String>,
        requires_grad: bool,
    },
    /// Micro-batches: the inner steps `times` times.
    Repeat {
        times: u32,
        steps: Vec<Step>,
    },
    /// `if it % n == offset:` (or, per epoch, `if epoch % n == offset:` at
    /// the epoch's last batch): the inner steps on a schedule.
    Every {
        n: u32,
        #[serde(default)]
        offset: u32,
        #[serde(default)]
        unit: EveryUnit,
        steps: Vec<Step>,
    },
    /// `name = 0`: a Python number (a metric reset).
    Assign {
        name: String,
        value: i64,
    },
    /// `into += (output.argmax(1) == target).sum()` (`.item()` with `Item`):
    /// an int64 [B] argmax, a bool [B] comparison, an int64 0-dim sum, none
    /// of them differentiable.
    CountCorrect {
        output: String,
        target: String,
        into: String,
        what: KeepWhat,
    },
    /// `name = {}`.
    NewDict {
        name: String,
    },
    /// `name = []`: an empty list (a metric's state reset, a cache emptied).
    NewList {
        name: String,
    },
    /// `name = collections.deque(maxlen=maxlen)`: `Append` to it drops the
    /// oldest element once it holds `maxlen`.
    NewDeque {
        name: String,
        maxlen: u32,
    },
    /// `dict[key] = from …`.
    SetItem {
        dict: String,
        key: DictKey,
        from: String,
        what: KeepWhat,
    },
    /// `list = [torch.empty(shape, dtype) for _ in range(count)]`.
    AllocateBuffers {
        list: String,
        count: u32,
        shape: Vec<u64>,
        dtype: DType,
    },
    /// `del list[offset::step]`: every `step`-th element from `offset`.
    DeleteEvery {
        list: String,
        step: u32,
        #[serde(default)]
        offset: u32,
    },
    /// `into = {"from": from …}; into["self"] = into`: an object in a
    /// reference cycle. Once `into` is rebound or deleted, CPython's
    /// reference counting cannot free it: what it holds stays alive until
    /// the cyclic collector runs (`GcCollect`).
    MakeCycle {
        from: String,
        into: String,
        what: KeepWhat,
    },
    /// `gc.collect()`: frees every unreachable reference cycle.
    GcCollect,
    /// `model.<module>.register_forward_hook(lambda m, i, o: list.append(o …))`
    /// on a Linear of the model (its module path, e.g. `fc1`): from now on
    /// every forward through it appends what `what` keeps of its output to
    /// `list` (which must be bound), until `RemoveForwardHooks`.
    RegisterForwardHook {
        module: String,
        list: String,
        what: KeepWhat,
    },
    /// `handle.remove()` for every hook registered on `module`.
    RemoveForwardHooks {
        module: String,
    },
    /// `model.<module>.register_full_backward_hook(lambda m, gi, go:
    /// list.append(go[0] …))` on a Linear: from now on every backward
    /// through it appends what `what` keeps of the gradient of its output,
    /// until `RemoveBackwardHooks`.
    RegisterFullBackwardHook {
        module: String,
        list: String,
        what: KeepWhat,
    },
    /// `handle.remove()` for every backward hook registered on `module`.
    RemoveBackwardHooks {
        module: String,
    },
    /// `into = [p.detach().clone() for p in model.parameters()]`: an EMA
    /// copy of the model's parameters (a second model's weights).
    EmaCopy {
        into: String,
    },
    /// `for e, p in zip(ema, model.parameters()): e.mul_(d).add_(p,
    /// alpha=1 - d)`, inside `with torch.no_grad():` when `no_grad`.
    EmaUpdate {
        ema: String,
        no_grad: bool,
    },
    /// `into = torch.autograd.grad(output, input, retain_graph=…)[0]`: only
    /// the nodes that lead to `input` run, and only toward it; the gradient
    /// is returned, no `.grad` is touched, and the nodes that did not run
    /// keep their saved tensors.
    AutogradGrad {
        output: String,
        input: String,
        into: String,
        retain_graph: bool,
        /// `create_graph=True`: the gradient is computed with its own graph
        /// (the double-backward one, which reaches into the first), and the
        /// first graph is kept (retain_graph defaults to create_graph).
        #[serde(default)]
        create_graph: bool,
    },
    /// `into = from.argmax(1)`: an int64 tensor of class indices, with no
    /// history (a teacher's hard labels).
    Argmax {
        from: String,
        into: String,
    },
    /// `name = Net().cuda()`: a second model of the scenario's
    /// configuration under its own name (a teacher, a target network), its
    /// parameters allocated in `.to("cuda")` order after the model's; no
    /// optimizer holds them unless `BuildOptimizer` builds one. `model`
    /// gives it its own shape (a GAN's generator). `Forward(model: name)`
    /// runs it.
    BuildModel {
        name: String,
        #[serde(default)]
        model: Option<SecondModel>,
    },
    /// `name = <the scenario's optimizer>(model.parameters(), …)` over a
    /// second model (`optimizerG` over `netG`): stepped by
    /// `OptimizerStepOf(optimizer: name)`, zeroed by `ZeroGrad(optimizer:
    /// name)`.
    BuildOptimizer {
        name: String,
        model: String,
    },
    /// `into = ((grad.norm(2, dim=1) - 1) ** 2).mean() * 10`: WGAN-GP's
    /// gradient penalty on a critic's input gradient (`torch.autograd.grad
    /// (…, create_graph=True)`), whose backward runs through the gradient's
    /// recorded graph into the critic's weights.
    GradPenalty {
        grad: String,
        into: String,
    },
    /// `into = a - b` (a critic's Wasserstein estimate).
    Sub {
        a: String,
        b: String,
        into: String,
    },
    /// `eps = torch.rand(B, 1); into = (eps * a + (1 - eps) * b)
    /// .requires_grad_(True)`: WGAN-GP's points between real and fake
    /// samples (`a`, `b` without history), a leaf that requires grad.
    Interpolate {
        a: String,
        b: String,
        into: String,
    },
    /// `into = a + b` (two losses summed: `errD = errD_real + errD_fake`).
    Add {
        a: String,
        b: String,
        into: String,
    },
    /// `model = Net().cuda()`: a new model of the scenario's configuration
    /// inside the loop. An optimizer built before keeps the old model's
    /// parameters (with their `.grad` and state) and goes on stepping them,
    /// unless it is re-created too (`RecreateOptimizer`).
    RecreateModel,
    /// `optimizer = <the scenario's optimizer>(model.parameters(), …)`: a
    /// new optimizer over the current model's parameters; the old one, and
    /// what only it held, goes.
    RecreateOptimizer,
    /// `name.requires_grad_()` on a leaf tensor (an input the loop
    /// differentiates: an adversarial example); a tensor with a history is
    /// refused with PyTorch's words.
    RequiresGrad {
        name: String,
    },
    /// `input = (input + eps * input.grad.sign()).clamp(0, 1)`: a
    /// sign-gradient step on the input (FGSM, PGD); `grad` names a bound
    /// tensor to take the sign of instead of `input.grad` (the result of
    /// `torch.autograd.grad`). Without `clamp`, no `.clamp(0, 1)`; with
    /// `detach`, `.detach().requires_grad_()` at the end: a fresh leaf,
    /// where without it the new input's history reaches every earlier one.
    GradSignStep {
        input: String,
        #[serde(default)]
        grad: Option<String>,
        clamp: bool,
        detach: bool,
    },
}

impl Step {
    pub fn label(&self) -> &'static str {
        match self {
            Step::LoadBatch { .. } => "load_batch",
            Step::Forward { .. } => "forward",
            Step::Loss { .. } => "loss",
            Step::Backward { .. } => "backward",
            Step::OptimizerStep | Step::OptimizerStepOf { .. } => "optimizer.step",
            Step::ZeroGrad { .. } => "zero_grad",
            Step::Keep { .. } => "keep",
            Step::Append { .. } => "append",
            Step::AccumulateLoss { .. } => "accumulate",
            Step::CarryHidden { .. } => "carry_hidden",
            Step::Delete { .. } => "del",
            Step::Train => "train",
            Step::Eval { .. } => "eval",
            Step::SetGrad { .. } => "grad_mode",
            Step::AutocastEnter { .. } => "autocast.__enter__",
            Step::AutocastExit => "autocast.__exit__",
            Step::ScalerScale { .. } => "scaler.scale",
            Step::ScalerUnscale => "scaler.unscale_",
            Step::ScalerStep => "scaler.step",
            Step::ScalerUpdate => "scaler.update",
            Step::ClipGradNorm | Step::ClipGradNormNoForeach => "clip_grad_norm_",
            Step::EmptyCache => "empty_cache",
            Step::ClearCublasWorkspaces => "clear_cublas_workspaces",
            Step::AllocateBuffer { .. } => "allocate_buffer",
            Step::ResetPeakStats => "reset_peak_memory_stats",
            Step::SetRequiresGrad { .. } => "requires_grad_",
            Step::RetainGrad { .. } => "retain_grad",
            Step::Repeat { .. } => "repeat",
            Step::Every { .. } => "every",
            Step::Assign { .. } => "assign",
            Step::CountCorrect { .. } => "count_correct",
            Step::NewDict { .. } => "dict",
            Step::NewList { .. } => "list",
            Step::NewDeque { .. } => "deque",
            Step::SetItem { .. } => "setitem",
            Step::AllocateBuffers { .. } => "allocate_buffers",
            Step::DeleteEvery { .. } => "del_slice",
            Step::MakeCycle { .. } => "make_cycle",
            Step::GcCollect => "gc.collect",
            Step::RegisterForwardHook { .. } => "register_forward_hook",
            Step::RemoveForwardHooks { .. } => "handle.remove",
            Step::AutogradGrad { .. } => "autograd.grad",
            Step::EmaCopy { .. } => "ema_copy",
            Step::EmaUpdate { .. } => "ema_update",
            Step::RecreateModel => "recreate_model",
            Step::BuildModel { .. } => "build_model",
            Step::BuildOptimizer { .. } => "build_optimizer",
            Step::Add { .. } => "add",
            Step::GradPenalty { .. } => "grad_penalty",
            Step::Sub { .. } => "sub",
            Step::Interpolate { .. } => "interpolate",
            Step::Argmax { .. } => "argmax",
            Step::RecreateOptimizer => "recreate_optimizer",
            Step::RegisterFullBackwardHook { .. } => "register_full_backward_hook",
            Step::RemoveBackwardHooks { .. } => "handle.remove",
            Step::RequiresGrad { .. } => "requires_grad_",
            Step::GradSignStep { .. } => "sign_step",
        }
    }

    /// The steps nested in this one (`Repeat`'s and `Every`'s).
    pub fn children(&self) -> Option<&[Step]> {
        match self {
            Step::Repeat { steps, .. } | Step::Every { steps, .. } => Some(steps),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Program {
    /// Steps run once before the loop (iteration 0).
    #[serde(default)]
    pub setup: Vec<Step>,
    pub steps: Vec<Step>,
    pub iterations: u32,
    /// Batch size per iteration, cycled; empty = the model's default.
    #[serde(default)]
    pub batch_sizes: Vec<u64>,
    /// Sequence length per iteration, cycled (a GPT's T, an LSTM's BPTT
    /// length); empty = the model's own.
    #[serde(default)]
    pub seq_lens: Vec<u64>,
    /// Iterations per epoch (an `Every` counting epochs); 0 = the whole
    /// run is one epoch.
    #[serde(default)]
    pub epoch_len: u32,
}

impl Program {
    /// `x, y = next(batches); out = model(x); loss = criterion(out, y)`.
    pub fn forward_steps() -> Vec<Step> {
        vec![
            Step::LoadBatch {
                x: "x".into(),
                y: "y".into(),
            },
            Step::Forward {
                input: "x".into(),
                output: "out".into(),
                model: None,
            },
            Step::Loss {
                output: "out".into(),
                target: "y".into(),
                into: "loss".into(),
                divide_by: None,
            },
        ]
    }

    /// The classic loop: zero_grad, batch, forward, loss, backward, step.
    pub fn training(iterations: u32) -> Program {
        let mut steps = vec![Step::ZeroGrad {
            set_to_none: None,
            optimizer: None,
        }];
        steps.extend(Program::forward_steps());
        steps.push(Step::Backward {
            loss: "loss".into(),
            retain_graph: false,
        });
        steps.push(Step::OptimizerStep);
        Program {
            setup: Vec::new(),
            steps,
            iterations,
            batch_sizes: Vec::new(),
            seq_lens: Vec::new(),
            epoch_len: 0,
        }
    }
}

/// How many numbers `steps` take in the program's step numbering: one per
/// step, a `Repeat`'s own steps numbered after it.
pub fn preorder_len(steps: &[Step]) -> u32 {
    steps
        .iter()
        .map(|s| 1 + s.children().map_or(0, preorder_len))
        .sum()
}

/// `steps` with their numbers, the first numbered `first`: the setup's steps
/// from 0, the loop's after every setup step, a `Repeat`'s after it. The
/// number tags every allocation a step makes, so it leads back to the step
/// in the scenario file.
pub fn numbered(steps: &[Step], first: u32) -> impl Iterator<Item = (u32, &Step)> {
    steps.iter().scan(first, |next, s| {
        let index = *next;
        *next += preorder_len(std::slice::from_ref(s));
        Some((index, s))
    })
}

/// Events one run may make. The UI keeps every event (~90 B each), so this
/// bounds its memory near 450 MB; a GPT-2 small iteration makes ~2,300.
pub const MAX_RUN_EVENTS: u64 = 5_000_000;

impl Engine {
    /// One iteration of the program's steps (iterations count from 1).
    pub fn run_iteration(&mut self, p: &Program) -> Result<()> {
        self.ctx.iteration += 1;
        let it = self.ctx.iteration;
        let work_before = self.work;
        self.events.push(EngineEvent::IterationBegin(it));
        for (index, s) in numbered(&p.steps, preorder_len(&p.setup)) {
            self.run_step(s, index, p)?;
        }
        self.events.push(EngineEvent::IterationEnd {
            iter: it,
            allocated: self.allocated_bytes(),
            requested: self.alloc.stats().requested_bytes(),
            reserved: self.reserved_bytes(),
            peak_allocated: self.peak_allocated_bytes(),
            work: Box::new(self.work.since(&work_before)),
        });
        Ok(())
    }

    /// Run one step. On failure, the temporaries it created unwind (Python's
    /// exception propagation) and the error is returned.
    pub fn run_step(&mut self, s: &Step, index: u32, p: &Program) -> Result<()> {
        if self.events_made() > MAX_RUN_EVENTS {
            return Err(EngineError::Program(format!(
                "{} events made, more than the {} one run may make (the UI keeps every event \
                 of a run): run fewer iterations or fewer steps",
                crate::units::format_count(self.events_made()),
                crate::units::format_count(MAX_RUN_EVENTS)
            )));
        }
        let mark = self.locals.len();
        self.ctx.step = index;
        self.events.push(EngineEvent::StepBegin {
            index,
            label: s.label(),
        });
        let r = self.step_inner(s, index, p);
        self.unwind_locals(mark);
        if r.is_err() {
            // The exception leaves every open `with torch.autocast(...)`
            // block: each `__exit__` runs, and the outermost clears the
            // cast cache (amp_bce_bug on the H100).
            while self.amp.depth > 0 {
                self.autocast_exit();
            }
        }
        r
    }

    fn model_phase(&self) -> Phase {
        if self.ctx.training && self.ctx.grad_enabled {
            Phase::Forward
        } else {
            Phase::Eval
        }
    }

    fn step_inner(&mut self, s: &Step, index: u32, p: &Program) -> Result<()> {
        match s {
            Step::LoadBatch { x, y } => {
                let b = self.batch_size(p);
                let seq = scheduled(&p.seq_lens, self.ctx.iteration);
                let model = self.take_model()?;
                let prev = self.phase_begin(Phase::User);
                let r = model.make_batch(self, b, seq);
                self.phase_end(Phase::User, prev);
                self.model = Some(model);
                let (xt, yt) = r?;
                self.bind(x, Value::Tensor(xt));
                if let Some(yt) = yt {
                    self.bind(y, Value::Tensor(yt));
                }
            }
            Step::Forward {
                input,
                output,
                model: Some(name),
            } => {
                let xt = self.binding_tensor(input)?;
                let out = self.named_model_forward(name, xt)?;
                self.bind(output, Value::Tensor(out));
            }
            Step::Forward { input, output, .. } => {
                let xt = self.binding_tensor(input)?;
                let hidden = match self.bindings.vars.get("hidden") {
                    Some(Value::Pair(h, c)) => Some((*h, *c)),
                    _ => None,
                };
                let model = self.take_model()?;
                let phase = self.model_phase();
                let prev = self.phase_begin(phase);
                let r = model.forward(self, xt, hidden);
                self.phase_end(phase, prev);
                self.model = Some(model);
                let (out, h) = r?;
                self.bind(output, Value::Tensor(out));
                if let Some((h, c)) = h {
                    self.bind("hidden", Value::Pair(h, c));
                }
            }
            Step::Loss {
                output,
                target,
                into,
                divide_by,
            } => {
                let out = self.binding_tensor(output)?;
                let tgt = self.binding_tensor(target).ok();
                let model = self.take_model()?;
                let phase = self.model_phase();
                let prev = self.phase_begin(phase);
                let r = model.loss(self, out, tgt);
                let r = match (r, divide_by) {
                    (Ok(l), Some(_)) => {
                        let d = self.mul_scalar(l);
                        self.release(l);
                        d
                    }
                    (r, _) => r,
                };
                self.phase_end(phase, prev);
                self.model = Some(model);
                self.bind(into, Value::Tensor(r?));
            }
            Step::Backward { loss, retain_graph } => {
                let l = self.binding_tensor(loss)?;
                self.backward(l, *retain_graph)?;
            }
            Step::OptimizerStep => self.optimizer_step()?,
            Step::OptimizerStepOf { optimizer } => {
                self.with_named_optimizer(optimizer, |e| e.optimizer_step())?
            }
            Step::ZeroGrad {
                set_to_none,
                optimizer,
            } => {
                let set_to_none = set_to_none.unwrap_or(self.cfg.zero_grad_default_set_to_none);
                let prev = self.phase_begin(Phase::Optimizer);
                let r = match optimizer {
                    Some(o) => self.with_named_optimizer(o, |e| e.zero_grad(set_to_none)),
                    None => self.zero_grad(set_to_none),
                };
                self.phase_end(Phase::Optimizer, prev);
                r?;
            }
            Step::Keep { from, into, what } => {
                let v = self.derive(from, *what)?;
                self.bind(into, v);
            }
            Step::Append { from, list, what } => {
                let v = self.derive(from, *what)?;
                self.append_value(list, v)?;
            }
            Step::AccumulateLoss { from, into, what } => self.accumulate(from, into, *what)?,
            Step::CarryHidden { detach, part } => {
                if *detach {
                    if let Some(Value::Pair(h, c)) = self.bindings.vars.get("hidden").cloned() {
                        // The tuple is new; an element kept as it is gets
                        // one more reference, as the tuple holds it.
                        let mut element = |t, detached: bool| {
                            if detached {
                                self.detach(t)
                            } else {
                                self.local_ref(t)
                            }
                        };
                        let hd = element(h, *part != HiddenPart::C);
                        let cd = element(c, *part != HiddenPart::H);
                        self.bind("hidden", Value::Pair(hd, cd));
                    }
                }
            }
            Step::Delete { name } if self.named_models.iter().any(|(n, _)| n == name) => {
                self.delete_named_model(name)
            }
            Step::Delete { name } => {
                // Python's `del` of an unbound name raises NameError.
                let Some(v) = self.bindings.vars.remove(name.as_str()) else {
                    return Err(EngineError::Program(format!(
                        "name '{name}' is not defined"
                    )));
                };
                self.bindings.order.retain(|n| n != name);
                self.drop_binding(name, v);
            }
            Step::Train => {
                self.ctx.training = true;
                self.set_grad(GradContext::Enabled);
            }
            Step::Eval { grad } => {
                self.ctx.training = false;
                self.set_grad(*grad);
            }
            Step::SetGrad { grad } => self.set_grad(*grad),
            Step::AutocastEnter { dtype } => self.autocast_enter(*dtype),
            Step::AutocastExit => self.autocast_exit(),
            Step::ScalerScale { loss, into } => {
                let l = self.binding_tensor(loss)?;
                let s = self.scaler_scale(l)?;
                self.bind(into, Value::Tensor(s));
            }
            Step::ScalerUnscale => self.scaler_unscale()?,
            Step::ScalerStep => self.scaler_step()?,
            Step::ScalerUpdate => self.scaler_update(),
            Step::ClipGradNorm | Step::ClipGradNormNoForeach => {
                let foreach = matches!(s, Step::ClipGradNorm);
                let t = self.clip_grad_norm(foreach)?;
                self.release(t);
            }
            Step::EmptyCache => self.empty_cache(),
            Step::ClearCublasWorkspaces => self.clear_cublas_workspaces(),
            Step::AllocateBuffer {
                name,
                shape,
                dtype,
                fill,
            } => {
                let t = self.factory(Shape::new(shape), *dtype, Category::Activation)?;
                match fill {
                    Fill::Empty => {}
                    Fill::Zeros => self.k_fill(t, 0.0),
                    Fill::Ones | Fill::Randn => self.k_fill(t, 1.0),
                }
                self.bind(name, Value::Tensor(t));
            }
            Step::ResetPeakStats => self.alloc.reset_peak_stats(),
            Step::SetRequiresGrad {
                modules,
                requires_grad,
            } => self.set_requires_grad(modules, *requires_grad)?,
            Step::RetainGrad { name } => {
                let t = self.binding_tensor(name)?;
                self.retain_grad(t)?;
            }
            Step::Repeat { times, steps } => {
                for _ in 0..*times {
                    for (inner, s) in numbered(steps, index + 1) {
                        self.run_step(s, inner, p)?;
                    }
                }
            }
            Step::Every {
                n,
                offset,
                unit,
                steps,
            } => {
                if self.every_due(p, *n, *offset, *unit) {
                    for (inner, s) in numbered(steps, index + 1) {
                        self.run_step(s, inner, p)?;
                    }
                }
            }
            Step::Assign { name, value } => self.bind(name, Value::Float(*value as f64)),
            Step::CountCorrect {
                output,
                target,
                into,
                what,
            } => self.count_correct(output, target, into, *what)?,
            Step::NewDict { name } => self.bind(name, Value::Dict(Vec::new())),
            Step::NewList { name } => self.bind(name, Value::List(Vec::new())),
            Step::NewDeque { name, maxlen } => {
                self.bind(name, super::loop_steps::new_deque(*maxlen))
            }
            Step::SetItem {
                dict,
                key,
                from,
                what,
            } => {
                let v = self.derive(from, *what)?;
                self.set_item(dict, key, v)?;
            }
            Step::AllocateBuffers {
                list,
                count,
                shape,
                dtype,
            } => self.allocate_buffers(list, *count, shape, *dtype)?,
            Step::DeleteEvery { list, step, offset } => self.delete_every(list, *step, *offset)?,
            Step::MakeCycle { from, into, what } => {
                let v = self.derive(from, *what)?;
                self.bind(
                    into,
                    Value::Cycle {
                        key: from.clone(),
                        value: Box::new(v),
                    },
                );
            }
            Step::GcCollect => self.gc_collect(),
            Step::RegisterForwardHook { module, list, what } => {
                self.register_forward_hook(module, list, *what)?
            }
            Step::RemoveForwardHooks { module } => self.remove_forward_hooks(module),
            Step::RegisterFullBackwardHook { module, list, what } => {
                self.register_backward_hook(module, list, *what)?
            }
            Step::RemoveBackwardHooks { module } => self.remove_backward_hooks(module),
            Step::AutogradGrad {
                output,
                input,
                into,
                retain_graph,
                create_graph,
            } => {
                let (o, i) = (self.binding_tensor(output)?, self.binding_tensor(input)?);
                self.create_graph = *create_graph;
                let g = self.autograd_grad(o, i, *retain_graph || *create_graph);
                self.create_graph = false;
                let g = g?;
                self.bind(into, Value::Tensor(g));
            }
            Step::RequiresGrad { name } => self.requires_grad_leaf(name)?,
            Step::EmaCopy { into } => self.ema_copy(into)?,
            Step::EmaUpdate { ema, no_grad } => self.ema_update(ema, *no_grad)?,
            Step::RecreateModel => self.recreate_model()?,
            Step::BuildModel { name, model } => self.build_named_model(name, model.as_ref())?,
            Step::BuildOptimizer { name, model } => self.build_named_optimizer(name, model)?,
            Step::GradPenalty { grad, into } => {
                let g = self.binding_tensor(grad)?;
                let phase = self.model_phase();
                let prev = self.phase_begin(phase);
                let r = self.grad_penalty(g);
                self.phase_end(phase, prev);
                self.bind(into, Value::Tensor(r?));
            }
            Step::Interpolate { a, b, into } => {
                let (ta, tb) = (self.binding_tensor(a)?, self.binding_tensor(b)?);
                let prev = self.phase_begin(Phase::User);
                let r = self.interpolate(ta, tb);
                self.phase_end(Phase::User, prev);
                self.bind(into, Value::Tensor(r?));
            }
            Step::Add { a, b, into } | Step::Sub { a, b, into } => {
                let (ta, tb) = (self.binding_tensor(a)?, self.binding_tensor(b)?);
                let prev = self.phase_begin(Phase::User);
                let r = match s {
                    Step::Sub { .. } => self.sub(ta, tb),
                    _ => self.add(ta, tb),
                };
                self.phase_end(Phase::User, prev);
                self.bind(into, Value::Tensor(r?));
            }
            Step::Argmax { from, into } => {
                let t = self.binding_tensor(from)?;
                let prev = self.phase_begin(Phase::User);
                let r = self.argmax_1(t);
                self.phase_end(Phase::User, prev);
                self.bind(into, Value::Tensor(r?));
            }
            Step::RecreateOptimizer => self.recreate_optimizer()?,
            Step::GradSignStep {
                input,
                grad,
                clamp,
                detach,
            } => self.grad_sign_step(input, grad.as_deref(), *clamp, *detach)?,
        }
        Ok(())
    }

    fn take_model(&mut self) -> Result<Box<super::modules::Model>> {
        self.model
            .take()
            .ok_or_else(|| EngineError::Program("no model".into()))
    }

    fn batch_size(&self, p: &Program) -> u64 {
        scheduled(&p.batch_sizes, self.ctx.iteration)
            .unwrap_or_else(|| self.model.as_ref().map_or(1, |m| m.cfg.batch))
    }

    pub(crate) fn set_grad(&mut self, g: GradContext) {
        self.ctx.grad_enabled = g == GradContext::Enabled;
        self.ctx.inference = g == GradContext::InferenceMode;
    }
}

/// This iteration's entry of a per-iteration schedule, cycled (iterations
/// count from 1; the setup, iteration 0, takes the first); None when empty.
fn scheduled(schedule: &[u64], iteration: u32) -> Option<u64> {
    let it = iteration.saturating_sub(1) as usize;
    (!schedule.is_empty()).then(|| schedule[it % schedule.len()])
}
