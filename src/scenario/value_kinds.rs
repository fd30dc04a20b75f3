//! What each name holds at check time (a tensor, the RNN's `(h, c)` tuple, a
//! list, a dict, a deque, a Python number), so `check` refuses what Python
//! would refuse at run time: `hidden.item()`, `history.append(…)` on a dict,
//! `del xs[::2]` on a tensor.

use crate::engine::{KeepWhat, Step};

/// What a name holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Tensor,
    /// The RNN's carried `(h, c)`, or a copy of it.
    Pair,
    List,
    Dict,
    Deque,
    Number,
    /// An object in a reference cycle (`MakeCycle`).
    Cycle,
    /// A second model (`BuildModel`).
    Model,
    /// A second optimizer (`BuildOptimizer`).
    Optimizer,
}

impl Kind {
    pub(crate) fn noun(self) -> &'static str {
        match self {
            Kind::Tensor => "a tensor",
            Kind::Pair => "a tuple (h, c)",
            Kind::List => "a list",
            Kind::Dict => "a dict",
            Kind::Deque => "a deque",
            Kind::Number => "a Python number",
            Kind::Cycle => "a dict that holds itself",
            Kind::Model => "a model",
            Kind::Optimizer => "an optimizer",
        }
    }
}

/// The kinds a step needs of the names it reads, as (name, allowed kinds,
/// what Python would say).
pub(crate) fn needs(s: &Step) -> Vec<(&str, &'static [Kind], &'static str)> {
    const TENSOR: &[Kind] = &[Kind::Tensor];
    match s {
        Step::Forward {
            input,
            model: Some(m),
            ..
        } => vec![
            (input, TENSOR, "model() takes a tensor"),
            (
                m,
                &[Kind::Model],
                "only a model (BuildModel) is called as a model",
            ),
        ],
        Step::Forward { input, .. } => vec![(input, TENSOR, "model() takes a tensor")],
        Step::Argmax { from, .. } => vec![(from, TENSOR, "only a tensor has .argmax()")],
        Step::Add { a, b, .. } | Step::Sub { a, b, .. } | Step::Interpolate { a, b, .. } => vec![
            (a, TENSOR, "`+` here adds two tensors"),
            (b, TENSOR, "`+` here adds two tensors"),
        ],
        Step::GradPenalty { grad, .. } => vec![(grad, TENSOR, "only a tensor has .norm()")],
        Step::BuildOptimizer { model, .. } => vec![(
            model,
            &[Kind::Model],
            "an optimizer is built over a model's .parameters()",
        )],
        Step::ZeroGrad {
            optimizer: Some(o), ..
        } => vec![(o, &[Kind::Optimizer], "only an optimizer has .zero_grad()")],
        Step::OptimizerStepOf { optimizer } => vec![(
            optimizer,
            &[Kind::Optimizer],
            "only an optimizer has .step()",
        )],
        Step::Loss { output, target, .. } => vec![
            (output, TENSOR, "the criterion takes tensors"),
            (target, TENSOR, "the criterion takes tensors"),
        ],
        Step::Backward { loss, .. } => vec![(loss, TENSOR, "only a tensor has .backward()")],
        Step::ScalerScale { loss, .. } => vec![(loss, TENSOR, "scaler.scale takes a tensor")],
        Step::RetainGrad { name } => vec![(name, TENSOR, "only a tensor has .retain_grad()")],
        Step::CountCorrect { output, target, .. } => vec![
            (output, TENSOR, "only a tensor has .argmax()"),
            (target, TENSOR, "the comparison needs a tensor"),
        ],
        Step::SetItem {
            dict, from, what, ..
        } => vec![
            kept_from(from, *what),
            (dict, &[Kind::Dict], "item assignment here needs a dict"),
        ],
        Step::Keep { from, what, .. }
        | Step::Append { from, what, .. }
        | Step::MakeCycle { from, what, .. } => {
            vec![kept_from(from, *what)]
        }
        Step::AccumulateLoss { from, .. } => {
            vec![(from, TENSOR, "`+=` here adds a tensor")]
        }
        Step::DeleteEvery { list, .. } => {
            vec![(list, &[Kind::List], "`del x[::n]` needs a list")]
        }
        Step::RegisterForwardHook { list, .. } | Step::RegisterFullBackwardHook { list, .. } => {
            vec![(
                list,
                &[Kind::List, Kind::Deque],
                "the hook calls its .append()",
            )]
        }
        Step::RequiresGrad { name } => {
            vec![(name, TENSOR, "only a tensor has .requires_grad_()")]
        }
        Step::EmaUpdate { ema, .. } => vec![(ema, &[Kind::List], "zip() pairs a list")],
        Step::AutogradGrad { output, input, .. } => vec![
            (
                output,
                TENSOR,
                "torch.autograd.grad differentiates a tensor",
            ),
            (
                input,
                TENSOR,
                "torch.autograd.grad differentiates with respect to a tensor",
            ),
        ],
        Step::AutogradGradParams { output, .. } => vec![(
            output,
            TENSOR,
            "torch.autograd.grad differentiates a tensor",
        )],
        Step::GradDot { a, b, .. } => vec![
            (a, &[Kind::List], "zip() pairs a tuple of tensors"),
            (b, &[Kind::List], "zip() pairs a tuple of tensors"),
        ],
        Step::GradSignStep { input, grad, .. } => {
            let mut v = vec![(input.as_str(), TENSOR, "only a tensor has .grad")];
            if let Some(g) = grad {
                v.push((g.as_str(), TENSOR, "only a tensor has .sign()"));
            }
            v
        }
        _ => vec![],
    }
}

/// What a `Keep`-like step needs of the name it keeps.
fn kept_from(from: &str, what: KeepWhat) -> (&str, &'static [Kind], &'static str) {
    match what {
        KeepWhat::Item => (from, &[Kind::Tensor], "only a tensor has .item()"),
        _ => (
            from,
            &[Kind::Tensor, Kind::Pair, Kind::List],
            "only a tensor, the hidden state or a tuple of tensors can be kept",
        ),
    }
}

/// The kind a name holds after `s` binds it; `current` says what a name
/// holds before, `recurrent` whether `Forward` carries `hidden`.
pub(crate) fn binds(
    s: &Step,
    current: impl Fn(&str) -> Option<Kind>,
    recurrent: bool,
) -> Vec<(&str, Kind)> {
    let kept = |from: &str, what: KeepWhat| match what {
        KeepWhat::Item => Kind::Number,
        _ if current(from) == Some(Kind::Pair) => Kind::Pair,
        _ if current(from) == Some(Kind::List) => Kind::List,
        _ => Kind::Tensor,
    };
    match s {
        Step::LoadBatch { x, y, .. } => vec![(x, Kind::Tensor), (y, Kind::Tensor)],
        Step::Forward { output, .. } if recurrent => {
            vec![
                (output, Kind::Tensor),
                (super::validate::HIDDEN, Kind::Pair),
            ]
        }
        Step::Forward { output, .. } => vec![(output, Kind::Tensor)],
        Step::Loss { into, .. } | Step::ScalerScale { into, .. } => vec![(into, Kind::Tensor)],
        Step::Keep { from, into, what } => vec![(into, kept(from, *what))],
        Step::Append { list, .. } => match current(list) {
            Some(Kind::Deque) => vec![(list, Kind::Deque)],
            _ => vec![(list, Kind::List)],
        },
        Step::AccumulateLoss { into, what, .. } | Step::CountCorrect { into, what, .. } => {
            match (what, current(into)) {
                (KeepWhat::Item, Some(Kind::Tensor)) => vec![(into, Kind::Tensor)],
                (KeepWhat::Item, _) => vec![(into, Kind::Number)],
                _ => vec![(into, Kind::Tensor)],
            }
        }
        Step::AllocateBuffer { name, .. } => vec![(name, Kind::Tensor)],
        Step::AllocateBuffers { list, .. } => vec![(list, Kind::List)],
        Step::Assign { name, .. } => vec![(name, Kind::Number)],
        Step::NewDict { name } => vec![(name, Kind::Dict)],
        Step::NewList { name } => vec![(name, Kind::List)],
        Step::NewDeque { name, .. } => vec![(name, Kind::Deque)],
        Step::MakeCycle { into, .. } => vec![(into, Kind::Cycle)],
        Step::GradSignStep { input, .. } => vec![(input, Kind::Tensor)],
        Step::AutogradGrad { into, .. } => vec![(into, Kind::Tensor)],
        Step::AutogradGradParams { into, .. } | Step::ProbeVectors { into } => {
            vec![(into, Kind::List)]
        }
        Step::GradDot { into, .. } => vec![(into, Kind::Tensor)],
        Step::EmaCopy { into } => vec![(into, Kind::List)],
        Step::BuildModel { name, .. } => vec![(name, Kind::Model)],
        Step::BuildOptimizer { name, .. } => vec![(name, Kind::Optimizer)],
        Step::Interpolate { into, .. } => vec![(into, Kind::Tensor), ("eps", Kind::Tensor)],
        Step::Add { into, .. } | Step::Sub { into, .. } | Step::GradPenalty { into, .. } => {
            vec![(into, Kind::Tensor)]
        }
        Step::Argmax { into, .. } => vec![(into, Kind::Tensor)],
        _ => vec![],
    }
}
