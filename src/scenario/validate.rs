//! Checks serde cannot make: names used before any step binds them, steps that
//! need a backward first, sizes that make no sense. Each error points at the
//! step in the file.

use std::collections::HashSet;

use super::format::Scenario;
use crate::engine::{DType, Step};

/// A problem with one step: its position among the steps named `label` (0 for
/// the first `Backward`, 1 for the second, …) lets the loader find it in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepProblem {
    pub variant: &'static str,
    pub occurrence: usize,
    pub message: String,
}

/// The RON variant name of a step, as written in the file.
fn variant(s: &Step) -> &'static str {
    match s {
        Step::LoadBatch { .. } => "LoadBatch",
        Step::Forward { .. } => "Forward",
        Step::Loss { .. } => "Loss",
        Step::Backward { .. } => "Backward",
        Step::OptimizerStep => "OptimizerStep",
        Step::ZeroGrad { .. } => "ZeroGrad",
        Step::Keep { .. } => "Keep",
        Step::Append { .. } => "Append",
        Step::AccumulateLoss { .. } => "AccumulateLoss",
        Step::CarryHidden { .. } => "CarryHidden",
        Step::Delete { .. } => "Delete",
        Step::Train => "Train",
        Step::Eval { .. } => "Eval",
        Step::SetGrad { .. } => "SetGrad",
        Step::AutocastEnter { .. } => "AutocastEnter",
        Step::AutocastExit => "AutocastExit",
        Step::ScalerScale { .. } => "ScalerScale",
        Step::ScalerUnscale => "ScalerUnscale",
        Step::ScalerStep => "ScalerStep",
        Step::ScalerUpdate => "ScalerUpdate",
        Step::ClipGradNorm => "ClipGradNorm",
        Step::ClipGradNormNoForeach => "ClipGradNormNoForeach",
        Step::EmptyCache => "EmptyCache",
        Step::ClearCublasWorkspaces => "ClearCublasWorkspaces",
        Step::AllocateBuffer { .. } => "AllocateBuffer",
        Step::ResetPeakStats => "ResetPeakStats",
        Step::SetRequiresGrad { .. } => "SetRequiresGrad",
        Step::RetainGrad { .. } => "RetainGrad",
        Step::Repeat { .. } => "Repeat",
    }
}

/// Names a step reads (must be bound before) and binds.
fn reads_binds(s: &Step) -> (Vec<&str>, Vec<&str>) {
    match s {
        Step::LoadBatch { x, y } => (vec![], vec![x, y]),
        Step::Forward { input, output } => (vec![input], vec![output]),
        Step::Loss {
            output,
            target,
            into,
            ..
        } => (vec![output, target], vec![into]),
        Step::Backward { loss, .. } => (vec![loss], vec![]),
        Step::Keep { from, into, .. } => (vec![from], vec![into]),
        Step::Append { from, list, .. } => (vec![from], vec![list]),
        Step::AccumulateLoss { from, into, .. } => (vec![from], vec![into]),
        Step::ScalerScale { loss, into } => (vec![loss], vec![into]),
        Step::AllocateBuffer { name, .. } => (vec![], vec![name]),
        Step::RetainGrad { name } => (vec![name], vec![]),
        _ => (vec![], vec![]),
    }
}

struct Walk<'a> {
    bound: HashSet<&'a str>,
    backward_seen: bool,
    counts: std::collections::HashMap<&'static str, usize>,
    problems: Vec<StepProblem>,
}

impl<'a> Walk<'a> {
    fn step(&mut self, s: &'a Step, in_loop: bool) {
        let v = variant(s);
        let occurrence = *self.counts.entry(v).and_modify(|c| *c += 1).or_insert(0);
        let mut problem = |message: String| {
            self.problems.push(StepProblem {
                variant: v,
                occurrence,
                message,
            })
        };
        let (reads, binds) = reads_binds(s);
        for name in reads {
            // The target of a loss may be absent for models that have none.
            let optional = matches!(s, Step::Loss { target, .. } if target == name);
            if !optional && !self.bound.contains(name) {
                problem(format!("{v} uses `{name}`, which no earlier step binds"));
            }
        }
        match s {
            Step::OptimizerStep
            | Step::ScalerStep
            | Step::ScalerUnscale
            | Step::ClipGradNorm
            | Step::ClipGradNormNoForeach
                if in_loop && !self.backward_seen =>
            {
                problem(format!("{v} needs a Backward before it in the loop: without one there are no gradients"));
            }
            Step::Backward { .. } => self.backward_seen = true,
            Step::AllocateBuffer { shape, .. } if shape.contains(&0) => {
                problem(format!("{v} has a zero-sized dimension"))
            }
            // The guard unbinds the name whether or not it was bound.
            Step::Delete { name } if !self.bound.remove(name.as_str()) => {
                problem(format!(
                    "Delete removes `{name}`, which no earlier step binds"
                ));
            }
            Step::Repeat { times, steps } => {
                if *times == 0 {
                    problem("Repeat needs times ≥ 1".to_string());
                }
                for inner in steps {
                    self.step(inner, in_loop);
                }
            }
            _ => {}
        }
        self.bound.extend(binds);
    }
}

/// Iterations a run may have, epochs included: a typo of 1,048,576 made a
/// tiny model run for minutes and would fill memory with its events in the UI.
pub const MAX_ITERATIONS: u32 = 100_000;

pub(crate) fn validate(s: &Scenario) -> (Vec<String>, Vec<StepProblem>) {
    let mut general = Vec::new();
    if s.device.capacity.0 == 0 {
        general.push("device.capacity: must be more than 0 bytes".to_string());
    }
    if s.device.overhead.0 >= s.device.capacity.0 && s.device.capacity.0 > 0 {
        general.push("device.overhead: must be less than the capacity".to_string());
    }
    if s.iterations == 0 {
        general.push("iterations: must be at least 1".to_string());
    }
    let total = u64::from(s.iterations) * u64::from(s.epochs.unwrap_or(1).max(1));
    if total > u64::from(MAX_ITERATIONS) {
        general.push(format!(
            "iterations: {total} in all (iterations × epochs) is more than {MAX_ITERATIONS}, the most a run keeps: the UI holds every event of a run"
        ));
    }
    if s.steps.is_empty() {
        general.push("steps: the loop has no steps".to_string());
    }
    general.extend(super::dims::problems(&s.model, &s.data));
    if let Some(d) = s.model_dtype {
        if !matches!(d, DType::F64 | DType::F32 | DType::F16 | DType::BF16) {
            general.push(format!(
                "model_dtype: {d:?} is not a dtype a model trains in here; F32, F16 (model.half()), BF16 (model.to(torch.bfloat16)) or F64 (model.double())"
            ));
        }
    }
    let mut walk = Walk {
        bound: HashSet::from(["hidden"]),
        backward_seen: false,
        counts: Default::default(),
        problems: Vec::new(),
    };
    for step in &s.setup {
        walk.step(step, false);
    }
    // The loop's first pass sees only what setup bound: a name bound late in
    // the loop is unbound for the steps before it.
    let mut first = Walk {
        problems: Vec::new(),
        counts: walk.counts.clone(),
        ..walk
    };
    for step in &s.steps {
        first.step(step, true);
    }
    (general, first.problems)
}
