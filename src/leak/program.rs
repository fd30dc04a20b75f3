//! What the detector reads from a [`Program`]: which step binds each root,
//! whether `zero_grad` is called, whether evaluation runs with grad enabled.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::engine::{DictKey, EveryUnit, Fill, GradContext, HiddenPart, KeepWhat, Program, Step};

/// Where a step sits: inside how many passes of inner loops per iteration,
/// and under which schedule.
#[derive(Debug, Clone, Copy)]
struct Nest {
    repeat: u64,
    every: Option<(u32, EveryUnit)>,
}

impl Default for Nest {
    fn default() -> Nest {
        Nest {
            repeat: 1,
            every: None,
        }
    }
}

/// How a root gets its value in the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Binder {
    Accumulate {
        from: String,
        what: KeepWhat,
    },
    Append {
        from: String,
        what: KeepWhat,
    },
    /// `dict[key] = from …`, the key as the statement writes it.
    SetItem {
        from: String,
        what: KeepWhat,
        key: String,
    },
    Keep {
        from: String,
        what: KeepWhat,
    },
    Forward,
    Loss,
    /// A hook on a module appends what it keeps of its output (a forward
    /// hook) or of its output's gradient (a full backward hook).
    Hook {
        module: String,
        what: KeepWhat,
        backward: bool,
    },
    /// `e.mul_(d).add_(p, alpha=1 - d)` over an EMA copy of the
    /// parameters, outside `torch.no_grad()` when `no_grad` is false.
    Ema {
        no_grad: bool,
    },
    /// `x = (x + eps * G.sign())…` on the input itself: without
    /// `.detach()` its history reaches every earlier step's.
    SignStep {
        grad: Option<String>,
        clamp: bool,
    },
}

/// `output = model(input)` through a second model (`BuildModel`), and
/// whether grad was enabled there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NamedForward {
    pub model: String,
    pub input: String,
    pub output: String,
    pub grad: bool,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ProgramFacts {
    pub known: bool,
    pub has_zero_grad: bool,
    /// The loop steps an optimizer (`optimizer.step()` or `scaler.step`).
    pub steps_optimizer: bool,
    /// `model = Net().cuda()` in the program (`RecreateModel`), and
    /// whether the optimizer is re-created too (`RecreateOptimizer`).
    pub recreates_model: bool,
    pub recreates_optimizer: bool,
    /// Forwards through second models, in program order.
    pub named_forwards: Vec<NamedForward>,
    /// Second models an optimizer of their own trains (`BuildOptimizer`:
    /// a GAN's generator): their gradients are meant, their graphs are
    /// backpropagated.
    pub trained_models: FxHashSet<String>,
    /// Losses backpropagated with `retain_graph=True`, in program order.
    pub retained_losses: Vec<String>,
    /// Inputs of the model's own `Forward`s in the loop, in order (a GAN's
    /// `fake` twice: D's step and G's).
    model_inputs: Vec<String>,
    /// The setup leaves a `with torch.autocast(...)` block open around the
    /// whole loop, of this dtype.
    pub autocast_around_loop: Option<crate::engine::DType>,
    pub has_backward: bool,
    pub retain_graph: bool,
    /// Names `torch.autograd.grad` differentiates with respect to.
    pub grad_inputs: FxHashSet<String>,
    /// Names bound to a gradient computed with `create_graph=True` (it
    /// has a graph of its own, reaching into the forward one).
    pub create_graph_grads: FxHashSet<String>,
    /// Per gradient `torch.autograd.grad` binds, the name it is taken with
    /// respect to (`g` → `x_hat`).
    pub grad_of: FxHashMap<String, String>,
    /// Names bound to a tuple of gradients (`torch.autograd.grad(loss,
    /// model.parameters())`): a fix keeps each element.
    pub tuples: FxHashSet<String>,
    /// `torch.autograd.grad(output, model.parameters(), retain_graph=True)`
    /// calls, as (into, output): a Hessian-vector product that keeps what
    /// the graphs it ran through saved.
    pub retained_grad_calls: Vec<(String, String)>,
    /// Gradients a penalty is computed from (`GradPenalty`): a backward
    /// runs through their graphs, so create_graph=True is needed.
    pub penalized_grads: FxHashSet<String>,
    /// `model.eval()` (or a grad switch) with grad still enabled somewhere.
    pub eval_with_grad: bool,
    /// `CarryHidden { detach }` if the program has one.
    pub carry_hidden_detach: Option<bool>,
    /// Per root, its binders (each once) and whether each binds while
    /// evaluating with grad enabled. Looked up by name: a program may bind
    /// thousands of names.
    pub binders: FxHashMap<String, Vec<(Binder, bool)>>,
    /// Names the loop allocates a buffer into while they still hold the last
    /// one (`buf = torch.empty(...)` each iteration, no `del buf` first), in
    /// program order.
    pub rebound_buffers: Vec<String>,
    rebound: FxHashSet<String>,
    /// Names bound to a `deque(maxlen=…)`, with the bound: whatever they
    /// hold, they hold at most `maxlen` of it, so their growth stops by
    /// itself — a leak only where the bound does not fit in the memory.
    pub bounded: FxHashMap<String, u32>,
    /// Containers filled inside an inner loop (`Repeat`): how many items a
    /// pass of the loop's body adds to each (the product of the loops' times).
    pub inner_fills: FxHashMap<String, u64>,
    /// Names bound on a schedule (`Every`): (n, unit) of the innermost one.
    pub scheduled: FxHashMap<String, (u32, EveryUnit)>,
    /// The batch sizes and sequence lengths per iteration, cycled (empty: fixed).
    pub batch_sizes: Vec<u64>,
    pub seq_lens: Vec<u64>,
    /// The first forward that runs in eval mode with grad enabled, as
    /// (input, output): what a `torch.no_grad()` fix wraps.
    pub eval_forward: Option<(String, String)>,
}

impl ProgramFacts {
    pub fn from_program(p: &Program) -> ProgramFacts {
        let mut f = ProgramFacts {
            known: true,
            ..ProgramFacts::default()
        };
        let mut state = (true, true); // (training, grad enabled)
        for s in p.setup.iter().chain(p.steps.iter()) {
            f.walk(s, &mut state, Nest::default());
        }
        let mut open = Vec::new();
        for s in &p.setup {
            match s {
                Step::AutocastEnter { dtype } => open.push(*dtype),
                Step::AutocastExit => {
                    open.pop();
                }
                _ => {}
            }
        }
        f.autocast_around_loop = open.first().copied();
        f.batch_sizes = p.batch_sizes.clone();
        f.seq_lens = p.seq_lens.clone();
        let mut deleted = FxHashSet::default();
        for s in &p.steps {
            f.walk_buffers(s, &mut deleted);
        }
        f
    }

    /// The loop's buffer allocations into a name not deleted before them in
    /// the same iteration: the previous iteration's buffer is still bound.
    fn walk_buffers(&mut self, s: &Step, deleted: &mut FxHashSet<String>) {
        match s {
            Step::Delete { name } => {
                deleted.insert(name.clone());
            }
            // Fresh noise each iteration (`z = torch.randn(...)`) is new
            // data, as a batch is: not a buffer to allocate once.
            Step::AllocateBuffer { fill, .. } if *fill == Fill::Randn => {}
            Step::AllocateBuffer { name, .. }
                if !deleted.remove(name) && self.rebound.insert(name.clone()) =>
            {
                self.rebound_buffers.push(name.clone());
            }
            _ if s.children().is_some() => {
                for s in s.children().unwrap_or_default() {
                    self.walk_buffers(s, deleted);
                }
            }
            _ => {}
        }
    }

    fn walk(&mut self, s: &Step, st: &mut (bool, bool), nest: Nest) {
        let eval_grad = !st.0 && st.1;
        let filled = match s {
            Step::Append { list, .. } => Some(list),
            Step::SetItem {
                dict,
                key: DictKey::Iteration,
                ..
            } => Some(dict),
            _ => None,
        };
        if let Some(name) = filled {
            if nest.repeat > 1 {
                self.inner_fills.insert(name.clone(), nest.repeat);
            }
            if let Some(every) = nest.every {
                self.scheduled.insert(name.clone(), every);
            }
        }
        match s {
            Step::Repeat { times, steps } => {
                let inner = Nest {
                    repeat: nest.repeat.saturating_mul(u64::from(*times)),
                    ..nest
                };
                for s in steps {
                    self.walk(s, st, inner);
                }
                return;
            }
            Step::Every { n, unit, steps, .. } => {
                let inner = Nest {
                    every: Some((*n, *unit)),
                    ..nest
                };
                for s in steps {
                    self.walk(s, st, inner);
                }
                return;
            }
            _ => {}
        }
        match s {
            Step::ZeroGrad { .. } => self.has_zero_grad = true,
            Step::OptimizerStep | Step::ScalerStep | Step::OptimizerStepOf { .. } => {
                self.steps_optimizer = true
            }
            Step::GradPenalty { grad, into } => {
                self.penalized_grads.insert(grad.clone());
                self.bind(into, Binder::Loss, eval_grad);
            }
            Step::BuildOptimizer { model, .. } => {
                self.trained_models.insert(model.clone());
            }
            Step::RecreateModel => self.recreates_model = true,
            Step::RecreateOptimizer => self.recreates_optimizer = true,
            Step::AutogradGrad {
                input,
                into,
                retain_graph,
                create_graph,
                ..
            } => {
                self.grad_inputs.insert(input.clone());
                self.grad_of.insert(into.clone(), input.clone());
                self.retain_graph |= *retain_graph || *create_graph;
                if *create_graph {
                    self.create_graph_grads.insert(into.clone());
                }
            }
            Step::AutogradGradParams {
                output,
                into,
                retain_graph,
                create_graph,
                ..
            } => {
                self.retain_graph |= *retain_graph || *create_graph;
                self.tuples.insert(into.clone());
                if *create_graph {
                    self.create_graph_grads.insert(into.clone());
                }
                if *retain_graph && !*create_graph {
                    self.retained_grad_calls
                        .push((into.clone(), output.clone()));
                }
            }
            Step::ProbeVectors { into } => {
                self.tuples.insert(into.clone());
            }
            // `g · v` is differentiated again (a Hessian-vector product):
            // `g` needs its graph.
            Step::GradDot { a, b, .. } => {
                self.penalized_grads.insert(a.clone());
                self.penalized_grads.insert(b.clone());
            }
            Step::Backward { loss, retain_graph } => {
                self.has_backward = true;
                self.retain_graph |= *retain_graph;
                if *retain_graph && !self.retained_losses.contains(loss) {
                    self.retained_losses.push(loss.clone());
                }
            }
            Step::Train => *st = (true, true),
            Step::Eval { grad } => {
                *st = (false, *grad == GradContext::Enabled);
                self.eval_with_grad |= *grad == GradContext::Enabled;
            }
            Step::SetGrad { grad } => {
                st.1 = *grad == GradContext::Enabled;
                self.eval_with_grad |= !st.0 && st.1;
            }
            // Detaching one of (h, c) still carries the other's graph.
            Step::NewDeque { name, maxlen } => {
                self.bounded.insert(name.clone(), *maxlen);
            }
            Step::CarryHidden { detach, part } => {
                self.carry_hidden_detach = Some(*detach && *part == HiddenPart::Both)
            }
            Step::AccumulateLoss { from, into, what } => self.bind(
                into,
                Binder::Accumulate {
                    from: from.clone(),
                    what: *what,
                },
                eval_grad,
            ),
            Step::Append { from, list, what } => self.bind(
                list,
                Binder::Append {
                    from: from.clone(),
                    what: *what,
                },
                eval_grad,
            ),
            Step::Keep { from, into, what } => self.bind(
                into,
                Binder::Keep {
                    from: from.clone(),
                    what: *what,
                },
                eval_grad,
            ),
            Step::Forward {
                input,
                output,
                model: Some(m),
            } => {
                self.named_forwards.push(NamedForward {
                    model: m.clone(),
                    input: input.clone(),
                    output: output.clone(),
                    grad: st.1,
                });
                self.bind(output, Binder::Forward, eval_grad)
            }
            Step::Forward { input, output, .. } => {
                self.model_inputs.push(input.clone());
                if eval_grad && self.eval_forward.is_none() {
                    self.eval_forward = Some((input.clone(), output.clone()));
                }
                self.bind(output, Binder::Forward, eval_grad)
            }
            Step::Loss { into, .. } | Step::Add { into, .. } | Step::Sub { into, .. } => {
                self.bind(into, Binder::Loss, eval_grad)
            }
            Step::RegisterForwardHook { module, list, what }
            | Step::RegisterFullBackwardHook { module, list, what } => self.bind(
                list,
                Binder::Hook {
                    module: module.clone(),
                    what: *what,
                    backward: matches!(s, Step::RegisterFullBackwardHook { .. }),
                },
                eval_grad,
            ),
            Step::ScalerScale { into, .. } => self.bind(into, Binder::Loss, eval_grad),
            Step::EmaUpdate { ema, no_grad } => {
                self.bind(ema, Binder::Ema { no_grad: *no_grad }, eval_grad)
            }
            Step::GradSignStep {
                input, grad, clamp, ..
            } => self.bind(
                input,
                Binder::SignStep {
                    grad: grad.clone(),
                    clamp: *clamp,
                },
                eval_grad,
            ),
            Step::SetItem {
                dict,
                from,
                what,
                key,
            } => self.bind(
                dict,
                Binder::SetItem {
                    from: from.clone(),
                    what: *what,
                    key: match key {
                        DictKey::Iteration => "it".to_string(),
                        DictKey::Name(k) => format!("{k:?}"),
                    },
                },
                eval_grad,
            ),
            _ => {}
        }
    }

    fn bind(&mut self, root: &str, b: Binder, eval_grad: bool) {
        let binders = self.binders.entry(root.to_string()).or_default();
        if !binders.iter().any(|(x, _)| *x == b) {
            binders.push((b, eval_grad));
        }
    }

    pub fn binder(&self, root: &str) -> Option<(&Binder, bool)> {
        // The container/accumulator binding is the telling one; fall back to any.
        self.binders
            .get(root)?
            .iter()
            .min_by_key(|(b, _)| match b {
                Binder::Hook { .. } | Binder::SignStep { .. } | Binder::Ema { .. } => 0,
                Binder::Accumulate { .. } | Binder::Append { .. } | Binder::SetItem { .. } => 0,
                Binder::Keep { .. } => 1,
                _ => 2,
            })
            .map(|(b, e)| (b, *e))
    }

    /// What `name` is, as a container: "dict" when a `SetItem` fills it,
    /// else "list".
    pub fn container_noun(&self, name: &str) -> &'static str {
        let dict = self
            .binders
            .get(name)
            .is_some_and(|b| b.iter().any(|(b, _)| matches!(b, Binder::SetItem { .. })));
        if dict {
            "dict"
        } else {
            "list"
        }
    }

    /// The create_graph=True gradient `name` keeps as it is (appended,
    /// kept, set, accumulated: the tensor with its graph), if it keeps one.
    pub fn keeps_create_graph_grad(&self, name: &str) -> Option<&str> {
        self.binders.get(name)?.iter().find_map(|(b, _)| match b {
            Binder::Append { from, what }
            | Binder::Keep { from, what }
            | Binder::SetItem { from, what, .. }
            | Binder::Accumulate { from, what }
                if *what == KeepWhat::Tensor && self.create_graph_grads.contains(from) =>
            {
                Some(from.as_str())
            }
            _ => None,
        })
    }

    /// Whether a sign-gradient step rebinds `name` from itself (an input
    /// fed back as the next one).
    pub fn fed_back(&self, name: &str) -> bool {
        self.binders
            .get(name)
            .is_some_and(|b| b.iter().any(|(b, _)| matches!(b, Binder::SignStep { .. })))
    }

    /// Whether `name` is an EMA copy of the parameters updated outside
    /// `torch.no_grad()`.
    pub fn ema_with_grad(&self, name: &str) -> bool {
        self.binders
            .get(name)
            .is_some_and(|b| b.iter().any(|(b, _)| *b == Binder::Ema { no_grad: false }))
    }

    /// The module whose hook fills `name`, if one does, and whether it is
    /// a backward hook.
    pub fn hooked_by(&self, name: &str) -> Option<(&str, bool)> {
        self.binders.get(name)?.iter().find_map(|(b, _)| match b {
            Binder::Hook {
                module, backward, ..
            } => Some((module.as_str(), *backward)),
            _ => None,
        })
    }

    /// A trained second model's output the model runs on twice as it is
    /// (a GAN's `fake`: D's step without `.detach()`, then G's), as
    /// (output, second model).
    pub fn undetached_twice(&self) -> Option<(&str, &str)> {
        self.named_forwards
            .iter()
            .filter(|f| f.grad && self.trained_models.contains(&f.model))
            .find(|f| self.model_inputs.iter().filter(|i| **i == f.output).count() > 1)
            .map(|f| (f.output.as_str(), f.model.as_str()))
    }

    /// Whether `name` holds a loss (a 0-dim tensor: `.item()` applies).
    pub fn is_loss(&self, name: &str) -> bool {
        self.binders
            .get(name)
            .is_some_and(|b| b.iter().any(|(b, _)| *b == Binder::Loss))
    }

    /// Whether every step that binds `name` makes a new value from this
    /// iteration's forward (`out = model(x)`, `loss = criterion(...)`): the
    /// name is rebound every iteration and holds no history of its own.
    pub fn rebound_each_iteration(&self, name: &str) -> bool {
        self.binders.get(name).is_some_and(|b| {
            b.iter()
                .all(|(b, _)| matches!(b, Binder::Forward | Binder::Loss))
        })
    }
}
