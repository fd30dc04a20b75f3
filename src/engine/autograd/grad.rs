//! `torch.autograd.grad(output, input)`: the graph task with an
//! `exec_info` (engine.cpp's `init_to_execute`): only the nodes from which
//! the input is reached run, each computing only the gradients that lead
//! there; the input's gradient is captured from its node's input buffer,
//! and that node (the leaf's AccumulateGrad, or the grad_fn of a tensor
//! with a history) does not run. Nothing is accumulated into any `.grad`;
//! the nodes that did not run keep their saved tensors.

use rustc_hash::FxHashSet;

use crate::engine::autograd::{Edge, NodeId};
use crate::engine::error::{EngineError, Result};
use crate::engine::tag::Category;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;
use crate::trace::Phase;

/// What one `autograd.grad` call runs and captures.
#[derive(Debug, Clone)]
pub(crate) struct GradOnly {
    /// Per input, its gradient edge: its gradient is taken from here
    /// (None: no graph holds the input, nothing runs toward it).
    targets: Vec<Option<Edge>>,
    /// Nodes from which a target is reached (they run), the targets included.
    needed: FxHashSet<u32>,
    /// Per input, its gradient once captured.
    captured: Vec<Option<TensorId>>,
}

/// PyTorch's words for an input no gradient reached (engine.cpp).
const UNUSED: &str = "One of the differentiated Tensors appears to not have been used in the \
     graph. Set allow_unused=True if this is the desired behavior.";

impl Engine {
    /// `torch.autograd.grad(root, input, retain_graph=retain)[0]`, as a
    /// local: the gradient of `root` with respect to `input`.
    pub fn autograd_grad(
        &mut self,
        root: TensorId,
        input: TensorId,
        retain: bool,
    ) -> Result<TensorId> {
        let g = self.autograd_grad_all(root, &[input], retain, false)?;
        g.into_iter()
            .next()
            .flatten()
            .ok_or_else(|| EngineError::Runtime(UNUSED.into()))
    }

    /// `torch.autograd.grad(root, inputs, retain_graph=retain,
    /// allow_unused=allow_unused)`, each gradient a local (None: an unused
    /// input, where `allow_unused` lets it be).
    pub fn autograd_grad_all(
        &mut self,
        root: TensorId,
        inputs: &[TensorId],
        retain: bool,
        allow_unused: bool,
    ) -> Result<Vec<Option<TensorId>>> {
        let prev_phase = self.phase_begin(Phase::Backward);
        let prev_op = self.op_begin("autograd.grad");
        let r = self.scoped(|e| {
            let mut task = Vec::new();
            let r = e.run_grad(root, inputs, retain, &mut task);
            // Nodes the task did not run keep the dependency counts it gave them.
            for n in &task {
                if let Some(node) = e.nodes.get_mut(n.0) {
                    node.deps = 0;
                }
            }
            let captured = e.grad_only.take().map(|g| g.captured).unwrap_or_default();
            let unused = captured.len() < inputs.len() || captured.iter().any(Option::is_none);
            let r = match r {
                Ok(()) if unused && !allow_unused => Err(EngineError::Runtime(UNUSED.into())),
                r => r,
            };
            if r.is_err() {
                for n in &task {
                    if let Some(node) = e.nodes.get_mut(n.0) {
                        let buf = std::mem::take(&mut node.buf);
                        for t in buf.into_iter().flatten() {
                            e.decref(t);
                        }
                    }
                }
                for c in captured.iter().flatten() {
                    e.decref(*c);
                }
            }
            r.map(|()| captured)
        });
        let end = self.op_end(prev_op);
        self.phase_end(Phase::Backward, prev_phase);
        let captured = r?;
        end?;
        let mut out = captured;
        out.resize(inputs.len(), None);
        self.locals.extend(out.iter().flatten().copied());
        Ok(out)
    }

    fn run_grad(
        &mut self,
        root: TensorId,
        inputs: &[TensorId],
        retain: bool,
        task: &mut Vec<NodeId>,
    ) -> Result<()> {
        let Some(edge) = self.edge_of(root) else {
            return Err(EngineError::Runtime(
                "element 0 of tensors does not require grad and does not have a grad_fn".into(),
            ));
        };
        if inputs.iter().any(|&i| !self.requires_grad(i)) {
            return Err(EngineError::Runtime(
                "One of the differentiated Tensors does not require grad".into(),
            ));
        }
        // A leaf no graph holds has no accumulator: nothing reaches it.
        let targets: Vec<Option<Edge>> = inputs
            .iter()
            .map(|&i| {
                let x = self.t(i);
                match (x.grad_fn, x.grad_acc) {
                    (Some(node), _) => Some(Edge {
                        node,
                        nr: x.output_nr,
                    }),
                    (None, Some(node)) if self.nodes.get(node.0).is_some() => {
                        Some(Edge { node, nr: 0 })
                    }
                    _ => None,
                }
            })
            .collect();
        let mut needed = FxHashSet::default();
        for t in targets.iter().flatten() {
            needed.extend(self.reaching(edge.node, t.node));
        }
        self.grad_only = Some(GradOnly {
            captured: vec![None; targets.len()],
            targets,
            needed,
        });
        // The seed `ones_like(output)`, alive until the task ends (§2.5).
        let (shape, dtype) = (self.shape(root), self.dtype(root));
        let seed = self.empty(shape, dtype, Category::Gradient)?;
        self.k_fill(seed, 1.0);
        self.retain(seed);
        let r = self.traverse(edge, seed, retain, task);
        if r.is_err() {
            self.abandon_task(task);
        }
        self.decref(seed);
        r
    }

    /// The nodes reachable from `from` from which `to` is reached.
    fn reaching(&self, from: NodeId, to: NodeId) -> FxHashSet<u32> {
        // Post-order over the DAG: a node is needed when it is `to` or one
        // of its next edges leads to a needed node.
        let mut needed = FxHashSet::default();
        let mut done = FxHashSet::default();
        let mut stack = vec![(from, false)];
        while let Some((n, expanded)) = stack.pop() {
            if expanded {
                let hit = n == to
                    || self.nodes[n.0]
                        .inputs
                        .iter()
                        .filter_map(|m| m.edge)
                        .any(|e| needed.contains(&e.node.0));
                if hit {
                    needed.insert(n.0);
                }
                continue;
            }
            if !done.insert(n.0) {
                continue;
            }
            stack.push((n, true));
            if n == to {
                continue;
            }
            for e in self.nodes[n.0].inputs.iter().filter_map(|m| m.edge) {
                if !done.contains(&e.node.0) {
                    stack.push((e.node, false));
                }
            }
        }
        needed
    }

    /// Under `autograd.grad`, whether the node just made ready does not run:
    /// the input's node hands its gradient to the caller, and a node that
    /// does not lead to it is skipped (its buffer dropped).
    pub(super) fn grad_only_skips(&mut self, n: NodeId) -> bool {
        let Some(g) = &self.grad_only else {
            return false;
        };
        let captures: Vec<(usize, usize)> = g
            .targets
            .iter()
            .enumerate()
            .filter_map(|(j, t)| t.filter(|t| t.node == n).map(|t| (j, usize::from(t.nr))))
            .collect();
        if captures.is_empty() && g.needed.contains(&n.0) {
            return false;
        }
        let buf = std::mem::take(&mut self.nodes[n.0].buf);
        for (i, t) in buf.into_iter().enumerate() {
            let Some(t) = t else { continue };
            let mut kept = false;
            for &(j, _) in captures.iter().filter(|(_, nr)| *nr == i) {
                // The same gradient for two inputs: one more reference.
                if kept {
                    self.retain(t);
                }
                kept = true;
                if let Some(g) = &mut self.grad_only {
                    g.captured[j] = Some(t);
                }
            }
            if !kept {
                self.decref(t);
            }
        }
        true
    }

    /// Under `autograd.grad`, a node made while the task runs (a forward
    /// `weight.t()` made a node of its own) runs when `next`, where it
    /// leads, does.
    pub(super) fn grad_only_also_needs(&mut self, node: NodeId, next: NodeId) {
        if let Some(g) = &mut self.grad_only {
            if g.needed.contains(&next.0) {
                g.needed.insert(node.0);
            }
        }
    }

    /// Whether a gradient for `node` is computed: always, but under
    /// `autograd.grad` only for nodes that lead to its input.
    pub(super) fn grad_only_needs(&self, node: NodeId) -> bool {
        self.grad_only
            .as_ref()
            .is_none_or(|g| g.needed.contains(&node.0))
    }
}
