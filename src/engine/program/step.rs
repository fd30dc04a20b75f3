//! The statements a program is made of: one [`Step`] per scenario
//! statement (serde-ready), and what some of them take.

use serde::{Deserialize, Serialize};

use crate::engine::dtype::DType;
use crate::engine::loop_steps::{DictKey, EveryUnit, HiddenPart};

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

/// How `LoadBatch` binds a new batch to names that hold the last one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchAssign {
    /// `x, y = next(batches)`: both are made, then the last `x` and the
    /// last `y` are freed.
    #[default]
    Together,
    /// `x = ...` then `y = ...`: the last `x` is freed as soon as the new
    /// one is made, before `y` is made.
    InTurn,
}

impl BatchAssign {
    pub fn is_together(&self) -> bool {
        *self == BatchAssign::Together
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Step {
    /// `x, y = next(batches)`: allocate the model's input (and target).
    LoadBatch {
        x: String,
        y: String,
        /// How the program binds them over the last batch's names.
        #[serde(default, skip_serializing_if = "BatchAssign::is_together")]
        assign: BatchAssign,
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
    /// `into = torch.autograd.grad(output, model.parameters(), …)`: a tuple,
    /// one gradient per parameter in `parameters()` order (`None` for one
    /// no gradient reaches, where `allow_unused=True` lets it be). With
    /// `create_graph=True` each gradient has a graph of its own, whose
    /// nodes save what the formulas read (a Hessian-vector product's first
    /// step); only the nodes that lead to a parameter run.
    AutogradGradParams {
        output: String,
        into: String,
        retain_graph: bool,
        #[serde(default)]
        create_graph: bool,
        #[serde(default)]
        allow_unused: bool,
    },
    /// `into = [torch.randn_like(p) for p in model.parameters()]`: one probe
    /// vector per parameter (Hutchinson's estimator, a Hessian-vector
    /// product's `v`).
    ProbeVectors {
        into: String,
    },
    /// `into = sum((x * y).sum() for x, y in zip(a, b) if x is not None)`:
    /// the dot product of two tuples of tensors (`g · v`); each product
    /// records MulBackward0, which saves the factor of the other side.
    GradDot {
        a: String,
        b: String,
        into: String,
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
            Step::AutogradGrad { .. } | Step::AutogradGradParams { .. } => "autograd.grad",
            Step::ProbeVectors { .. } => "randn_like",
            Step::GradDot { .. } => "grad_dot",
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
