//! Programs: the engine operations a scenario is made of (one `Step` per
//! scenario statement, serde-ready), repeated for N iterations.

use serde::{Deserialize, Serialize};

use super::bindings::Value;
use super::error::{EngineError, Result};
use super::events::EngineEvent;
use super::loop_steps::HiddenPart;
use super::shape::Shape;
use super::tag::Category;
use super::Engine;
use crate::trace::Phase;

mod step;

pub use step::{BatchAssign, Fill, GradContext, KeepWhat, SecondModel, Step};

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
                assign: BatchAssign::Together,
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
            Step::LoadBatch { x, y, assign } => {
                let b = self.batch_size(p);
                let seq = scheduled(&p.seq_lens, self.ctx.iteration);
                let model = self.take_model()?;
                let prev = self.phase_begin(Phase::User);
                let in_turn = *assign == BatchAssign::InTurn;
                let r = model.make_batch(self, b, seq, &mut |e: &mut Engine, xt| {
                    if in_turn {
                        e.bind(x, Value::Tensor(xt));
                    }
                });
                self.phase_end(Phase::User, prev);
                self.model = Some(model);
                let (xt, yt) = r?;
                if !in_turn {
                    self.bind(x, Value::Tensor(xt));
                }
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
            Step::AutogradGradParams {
                output,
                into,
                retain_graph,
                create_graph,
                allow_unused,
            } => self.autograd_grad_params(
                output,
                into,
                *retain_graph,
                *create_graph,
                *allow_unused,
            )?,
            Step::ProbeVectors { into } => self.probe_vectors(into)?,
            Step::GradDot { a, b, into } => self.grad_dot(a, b, into)?,
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
