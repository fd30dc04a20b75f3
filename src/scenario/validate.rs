//! Checks serde cannot make: names used before any step binds them, steps that
//! need a backward first, sizes that make no sense. Each error points at the
//! step in the file.

use std::collections::HashMap;

use super::format::Scenario;
use super::value_kinds::{self, Kind};
use crate::engine::{DType, DictKey, EveryUnit, Fill, KeepWhat, SecondModel, Step};
use crate::units::format_count;

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
        Step::OptimizerStepOf { .. } => "OptimizerStepOf",
        Step::BuildOptimizer { .. } => "BuildOptimizer",
        Step::Add { .. } => "Add",
        Step::Sub { .. } => "Sub",
        Step::Interpolate { .. } => "Interpolate",
        Step::GradPenalty { .. } => "GradPenalty",
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
        Step::Every { .. } => "Every",
        Step::Assign { .. } => "Assign",
        Step::CountCorrect { .. } => "CountCorrect",
        Step::NewDict { .. } => "NewDict",
        Step::NewList { .. } => "NewList",
        Step::NewDeque { .. } => "NewDeque",
        Step::SetItem { .. } => "SetItem",
        Step::AllocateBuffers { .. } => "AllocateBuffers",
        Step::DeleteEvery { .. } => "DeleteEvery",
        Step::MakeCycle { .. } => "MakeCycle",
        Step::GcCollect => "GcCollect",
        Step::RegisterForwardHook { .. } => "RegisterForwardHook",
        Step::RemoveForwardHooks { .. } => "RemoveForwardHooks",
        Step::AutogradGrad { .. } => "AutogradGrad",
        Step::AutogradGradParams { .. } => "AutogradGradParams",
        Step::ProbeVectors { .. } => "ProbeVectors",
        Step::GradDot { .. } => "GradDot",
        Step::EmaCopy { .. } => "EmaCopy",
        Step::RecreateModel => "RecreateModel",
        Step::BuildModel { .. } => "BuildModel",
        Step::Argmax { .. } => "Argmax",
        Step::RecreateOptimizer => "RecreateOptimizer",
        Step::EmaUpdate { .. } => "EmaUpdate",
        Step::RegisterFullBackwardHook { .. } => "RegisterFullBackwardHook",
        Step::RemoveBackwardHooks { .. } => "RemoveBackwardHooks",
        Step::RequiresGrad { .. } => "RequiresGrad",
        Step::GradSignStep { .. } => "GradSignStep",
    }
}

/// Names a step reads (must be bound before) and binds.
fn reads_binds(s: &Step) -> (Vec<&str>, Vec<&str>) {
    match s {
        Step::LoadBatch { x, y, .. } => (vec![], vec![x, y]),
        Step::Forward {
            input,
            output,
            model,
        } => {
            let mut reads = vec![input.as_str()];
            reads.extend(model.as_deref());
            (reads, vec![output])
        }
        Step::BuildModel { name, .. } => (vec![], vec![name]),
        Step::BuildOptimizer { name, model } => (vec![model], vec![name]),
        Step::Add { a, b, into } | Step::Sub { a, b, into } => (vec![a, b], vec![into]),
        // `eps = torch.rand(…)` is bound too.
        Step::Interpolate { a, b, into } => (vec![a, b], vec![into, "eps"]),
        Step::GradPenalty { grad, into } => (vec![grad], vec![into]),
        Step::ZeroGrad {
            optimizer: Some(o), ..
        } => (vec![o], vec![]),
        Step::OptimizerStepOf { optimizer } => (vec![optimizer], vec![]),
        Step::Argmax { from, into } => (vec![from], vec![into]),
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
        Step::Assign { name, .. } => (vec![], vec![name]),
        Step::CountCorrect {
            output,
            target,
            into,
            ..
        } => (vec![output, target], vec![into]),
        Step::NewDict { name } | Step::NewList { name } | Step::NewDeque { name, .. } => {
            (vec![], vec![name])
        }
        Step::SetItem { dict, from, .. } => (vec![from, dict], vec![]),
        Step::AllocateBuffers { list, .. } => (vec![], vec![list]),
        Step::DeleteEvery { list, .. } => (vec![list], vec![]),
        Step::MakeCycle { from, into, .. } => (vec![from], vec![into]),
        Step::RegisterForwardHook { list, .. } | Step::RegisterFullBackwardHook { list, .. } => {
            (vec![list], vec![])
        }
        Step::RequiresGrad { name } => (vec![name], vec![]),
        Step::EmaCopy { into } => (vec![], vec![into]),
        Step::EmaUpdate { ema, .. } => (vec![ema], vec![]),
        Step::AutogradGrad {
            output,
            input,
            into,
            ..
        } => (vec![output, input], vec![into]),
        Step::AutogradGradParams { output, into, .. } => (vec![output], vec![into]),
        Step::ProbeVectors { into } => (vec![], vec![into]),
        Step::GradDot { a, b, into } => (vec![a, b], vec![into]),
        Step::GradSignStep { input, grad, .. } => {
            let mut reads = vec![input.as_str()];
            reads.extend(grad.as_deref());
            (reads, vec![input])
        }
        _ => (vec![], vec![]),
    }
}

/// The name the engine keeps an RNN's carried state under.
pub(crate) const HIDDEN: &str = "hidden";

struct Walk<'a> {
    bound: HashMap<&'a str, Kind>,
    /// The model carries `hidden` through `Forward` (an LSTM).
    recurrent: bool,
    backward_seen: bool,
    /// `with torch.autocast(...)` blocks open, and which AutocastEnter
    /// opened the innermost (its occurrence).
    autocast: Vec<usize>,
    counts: std::collections::HashMap<&'static str, usize>,
    problems: Vec<StepProblem>,
}

impl<'a> Walk<'a> {
    /// Every autocast block opened in this part (setup, or one pass of the
    /// loop) is closed in it, as a `with` block is.
    fn autocast_closed(&mut self) {
        for occurrence in std::mem::take(&mut self.autocast) {
            self.problems.push(StepProblem {
                variant: "AutocastEnter",
                occurrence,
                message: "AutocastEnter is never closed: end the `with torch.autocast(...)` block \
                          with AutocastExit in the same loop"
                    .to_string(),
            });
        }
    }

    fn step(&mut self, s: &'a Step, in_loop: bool) {
        let v = variant(s);
        let occurrence = *self.counts.entry(v).and_modify(|c| *c += 1).or_insert(0);
        let mut problems = Vec::new();
        let mut problem = |message: String| problems.push(message);
        let (reads, _) = reads_binds(s);
        for name in reads {
            // The target of a loss may be absent for models that have none.
            let optional = matches!(s, Step::Loss { target, .. } if target == name);
            if !optional && !self.bound.contains_key(name) {
                problem(format!("{v} uses `{name}`, which no earlier step binds"));
            }
        }
        for (name, allowed, why) in value_kinds::needs(s) {
            if let Some(k) = self.bound.get(name) {
                if !allowed.contains(k) {
                    problem(format!("{v} uses `{name}`, which is {}: {why}", k.noun()));
                }
            }
        }
        if let Step::Append { list, .. } = s {
            if let Some(k) = self.bound.get(list.as_str()) {
                if !matches!(k, Kind::List | Kind::Deque) {
                    problem(format!(
                        "Append adds to `{list}`, which is {}: only a list or a deque has .append()",
                        k.noun()
                    ));
                }
            }
        }
        let bound = &self.bound;
        let binds = value_kinds::binds(s, |n| bound.get(n).copied(), self.recurrent);
        if self.recurrent {
            for (name, kind) in &binds {
                if *name == HIDDEN && *kind != Kind::Pair {
                    problem(format!(
                        "{v} binds `{HIDDEN}` to {}: the LSTM's Forward reads `{HIDDEN}` as its \
                         (h, c) state",
                        kind.noun()
                    ));
                }
            }
        }
        match s {
            Step::OptimizerStep
            | Step::OptimizerStepOf { .. }
            | Step::ScalerStep
            | Step::ScalerUnscale
            | Step::ClipGradNorm
            | Step::ClipGradNormNoForeach
                if in_loop && !self.backward_seen =>
            {
                problem(format!("{v} needs a Backward before it in the loop: without one there are no gradients"));
            }
            Step::Backward { .. } => self.backward_seen = true,
            // autocast's cast cache keeps a weak reference to each cached
            // weight and the cast itself until the outermost block exits:
            // what it does with a model's weights that die inside the block
            // is not modelled.
            Step::BuildModel { name, .. } if name == "model" => problem(
                "BuildModel names the scenario's own model `model`: re-create it with \
                 RecreateModel"
                    .to_string(),
            ),
            Step::Forward { model: Some(m), .. } if self.recurrent => problem(format!(
                "Forward through `{m}`: a second recurrent model (its own hidden state) is not \
                 modelled"
            )),
            Step::RecreateModel | Step::RecreateOptimizer if !self.autocast.is_empty() => {
                problem(format!(
                    "{v} inside a `with torch.autocast(...)` block is not modelled (the block's \
                     cast cache would keep the casts of the old model's weights): close the \
                     block with AutocastExit before it"
                ))
            }
            Step::AutocastEnter { .. } => self.autocast.push(occurrence),
            Step::AutocastExit if self.autocast.pop().is_none() => problem(
                "AutocastExit closes no AutocastEnter: a `with torch.autocast(...)` block opens \
                 with AutocastEnter before it"
                    .to_string(),
            ),
            Step::AllocateBuffer { shape, .. } | Step::AllocateBuffers { shape, .. }
                if shape.contains(&0) =>
            {
                problem(format!("{v} has a zero-sized dimension"))
            }
            Step::BuildModel {
                model: Some(SecondModel::Mlp { dims, .. }),
                ..
            } if dims.len() < 2 || dims.contains(&0) => problem(
                "BuildModel's Mlp needs at least two widths (input and output), none of them 0"
                    .to_string(),
            ),
            Step::BuildOptimizer { name, .. } if name == "optimizer" => problem(
                "BuildOptimizer names the scenario's own `optimizer`: re-create it with \
                 RecreateOptimizer"
                    .to_string(),
            ),
            Step::AllocateBuffer {
                fill: Fill::Randn,
                dtype,
                ..
            } if !dtype.is_floating() => problem(format!(
                "AllocateBuffer fills {dtype:?} with Randn: torch.randn makes floating-point \
                 tensors only"
            )),
            Step::AllocateBuffers { count: 0, .. } => {
                problem("AllocateBuffers needs count ≥ 1".to_string())
            }
            Step::DeleteEvery { step: 0, .. } => problem(
                "DeleteEvery needs step ≥ 1: Python's slice step cannot be zero".to_string(),
            ),
            Step::CountCorrect { what, .. }
                if !matches!(what, KeepWhat::Tensor | KeepWhat::Item) =>
            {
                problem(format!(
                    "CountCorrect keeps a count as Tensor or Item, not {what:?}"
                ))
            }
            Step::SetItem {
                key: DictKey::Name(k),
                ..
            } if k.is_empty() || k.contains(['[', ']', '\'', '"', '\\']) => problem(format!(
                "SetItem's key {k:?} must be a plain word (no brackets or quotes)"
            )),
            // The guard unbinds the name whether or not it was bound.
            Step::Delete { name } if self.bound.remove(name.as_str()).is_none() => {
                problem(format!(
                    "Delete removes `{name}`, which no earlier step binds"
                ));
            }
            _ => {}
        }
        for message in problems {
            self.problems.push(StepProblem {
                variant: v,
                occurrence,
                message,
            });
        }
        match s {
            Step::Repeat { times, steps } => {
                if *times == 0 {
                    self.problem(v, occurrence, "Repeat needs times ≥ 1".to_string());
                }
                for inner in steps {
                    self.step(inner, in_loop);
                }
            }
            Step::Every {
                n,
                offset,
                unit,
                steps,
            } => self.every(occurrence, (*n, *offset, *unit), steps, in_loop),
            _ => {}
        }
        self.bound.extend(binds);
    }

    fn problem(&mut self, variant: &'static str, occurrence: usize, message: String) {
        self.problems.push(StepProblem {
            variant,
            occurrence,
            message,
        });
    }

    /// An `Every`: its steps see what is bound before it; after it, a name
    /// bound inside counts as bound only if the block runs in the first
    /// iteration (`it % n == 0`), else a later read could fail with NameError.
    fn every(
        &mut self,
        occurrence: usize,
        (n, offset, unit): (u32, u32, EveryUnit),
        steps: &'a [Step],
        in_loop: bool,
    ) {
        let v = "Every";
        if !in_loop {
            let m = "Every belongs in the loop's steps: setup runs once".to_string();
            self.problem(v, occurrence, m);
        }
        if n == 0 {
            self.problem(v, occurrence, "Every needs n ≥ 1".to_string());
        } else if offset >= n {
            let m = format!("Every's offset {offset} is never reached: `% {n}` is below {n}");
            self.problem(v, occurrence, m);
        }
        let before = self.bound.clone();
        for inner in steps {
            self.step(inner, in_loop);
        }
        let runs_first = unit == EveryUnit::Iteration && offset == 0;
        if !runs_first {
            self.bound.retain(|name, _| before.contains_key(name));
        }
    }
}

/// Iterations a run may have, epochs included: a typo of 1,048,576 made a
/// tiny model run for minutes and would fill memory with its events in the UI.
pub const MAX_ITERATIONS: u32 = 100_000;

/// Steps a run may execute, every `Repeat` and iteration counted: a
/// `Repeat(times: 1000000000, …)` asked for a billion and filled memory.
pub const MAX_STEPS: u64 = 1_000_000;

/// Steps a run of `s` executes with `iterations` iterations (epochs included).
pub fn steps_executed(s: &Scenario, iterations: u64) -> u64 {
    executed(&s.setup).saturating_add(iterations.saturating_mul(executed(&s.steps)))
}

/// Steps `steps` execute once through, each `Repeat` as often as it says.
fn executed(steps: &[Step]) -> u64 {
    steps
        .iter()
        .map(|s| match s {
            Step::Repeat { times, steps } => u64::from(*times).saturating_mul(executed(steps)),
            // At most once an iteration.
            Step::Every { steps, .. } => 1 + executed(steps),
            _ => 1,
        })
        .fold(0, u64::saturating_add)
}

/// The outermost `Repeat` that executes the most steps, as (its occurrence
/// among the file's `Repeat`s, the steps it executes once through).
fn largest_repeat(setup: &[Step], steps: &[Step]) -> Option<(usize, u64)> {
    fn visit(steps: &[Step], seen: &mut usize, best: &mut Option<(usize, u64)>, outer: bool) {
        for s in steps {
            if let Step::Repeat { steps: inner, .. } = s {
                let here = *seen;
                *seen += 1;
                let n = executed(std::slice::from_ref(s));
                if outer && best.is_none_or(|(_, m)| n > m) {
                    *best = Some((here, n));
                }
                visit(inner, seen, best, false);
            } else if let Some(inner) = s.children() {
                visit(inner, seen, best, outer);
            }
        }
    }
    let (mut seen, mut best) = (0, None);
    visit(setup, &mut seen, &mut best, true);
    visit(steps, &mut seen, &mut best, true);
    best
}

/// Where a run that executes too many steps is fixed.
enum TooManySteps {
    /// At the `Repeat` that asks for the most.
    AtRepeat(StepProblem),
    /// At `iterations` (no `Repeat` to blame): the message.
    AtIterations(String),
}

/// More steps in the run than [`MAX_STEPS`]: the problem, at the `Repeat`
/// that asks for the most, or at `iterations`.
fn too_many_steps(s: &Scenario, iterations: u64) -> Option<TooManySteps> {
    let total = steps_executed(s, iterations);
    if total <= MAX_STEPS {
        return None;
    }
    let most = format!(
        "a run may execute at most {} steps (every Repeat and iteration counted); this one asks for {}",
        format_count(MAX_STEPS),
        format_count(total)
    );
    Some(match largest_repeat(&s.setup, &s.steps) {
        Some((occurrence, n)) => TooManySteps::AtRepeat(StepProblem {
            variant: "Repeat",
            occurrence,
            message: format!(
                "Repeat runs {} steps each time through: {most}",
                format_count(n)
            ),
        }),
        None => TooManySteps::AtIterations(format!("iterations: {most}")),
    })
}

pub(crate) fn validate(s: &Scenario) -> (Vec<String>, Vec<StepProblem>) {
    let mut general = Vec::new();
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
    let mut work = Vec::new();
    match too_many_steps(s, total) {
        Some(TooManySteps::AtRepeat(p)) => work.push(p),
        Some(TooManySteps::AtIterations(m)) => general.push(m),
        None => {}
    }
    work.extend(super::buffers::too_many_buffers(s, total));
    general.extend(super::dims::problems(&s.model, &s.data));
    if let Some(sweep) = &s.sweep {
        general.extend(sweep_problems(sweep));
    }
    if let Some(d) = s.model_dtype {
        if !matches!(d, DType::F64 | DType::F32 | DType::F16 | DType::BF16) {
            general.push(format!(
                "model_dtype: {d:?} is not a dtype a model trains in here; F32, F16 (model.half()), BF16 (model.to(torch.bfloat16)) or F64 (model.double())"
            ));
        }
    }
    // Only a model whose dimensions passed is built (a `freeze` builds it).
    let recurrent = general.is_empty()
        && super::build::model_config(s)
            .is_ok_and(|m| matches!(m.kind, crate::engine::ModelKind::LstmLm { .. }));
    let mut walk = Walk {
        bound: HashMap::new(),
        recurrent,
        backward_seen: false,
        autocast: Vec::new(),
        counts: Default::default(),
        problems: Vec::new(),
    };
    for step in &s.setup {
        walk.step(step, false);
    }
    // An autocast block the setup leaves open wraps the whole loop (`with
    // torch.autocast(...):` around `for it in range(N):`): allowed, as
    // Python allows it; the loop's own blocks must still close in each pass.
    walk.autocast.clear();
    work.append(&mut walk.problems);
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
    first.autocast_closed();
    work.extend(first.problems);
    (general, work)
}

/// The `sweep:` section's lists: batch sizes to run, and lengths that make sense.
fn sweep_problems(sweep: &super::format::SweepSpec) -> Vec<String> {
    use super::dims::MAX_DIM;
    let mut out = Vec::new();
    if sweep.batch.is_empty() {
        out.push(
            "sweep.batch: the list is empty: give the batch sizes to run, e.g. [1, 2, 4, 8]"
                .to_string(),
        );
    }
    for (field, values) in [("sweep.batch", &sweep.batch), ("sweep.seq", &sweep.seq)] {
        for &v in values {
            if v == 0 {
                out.push(format!("{field}: 0 is not a size: each must be at least 1"));
            } else if v > MAX_DIM {
                out.push(format!(
                    "{field}: {v} is larger than {MAX_DIM}, the largest dimension modelled"
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod autocast_tests {
    fn check(setup: &str, steps: &str) -> Result<(), String> {
        let text = format!(
            r#"Scenario(name: "t", description: "t", device: (capacity: "1GiB"),
                model: Preset("mlp-mnist"), setup: {setup}, steps: {steps}, iterations: 2)"#
        );
        crate::scenario::load_str(&text, "t.ron")
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// `with torch.autocast(...):` around the whole loop is Python that runs:
    /// the setup may leave a block open; the loop's own blocks still close
    /// in each pass, as a `with` inside the loop does.
    #[test]
    fn the_setup_may_open_an_autocast_block_around_the_loop() {
        let train = r#"[LoadBatch(x: "x", y: "y"), Forward(input: "x", output: "out"),
            Loss(output: "out", target: "y", into: "loss"), Backward(loss: "loss", retain_graph: false),
            OptimizerStep]"#;
        assert_eq!(check("[AutocastEnter(dtype: F16)]", train), Ok(()));
        let open_in_loop = r#"[AutocastEnter(dtype: F16), LoadBatch(x: "x", y: "y")]"#;
        let err = check("[]", open_in_loop).expect_err("refused");
        assert!(err.contains("AutocastEnter is never closed"), "{err}");
        // The loop cannot close what the setup opened (every pass would).
        let err = check("[AutocastEnter(dtype: F16)]", "[AutocastExit]").expect_err("refused");
        assert!(
            err.contains("AutocastExit closes no AutocastEnter"),
            "{err}"
        );
    }
}
