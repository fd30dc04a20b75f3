//! `module.register_full_backward_hook(lambda m, gi, go: grads.append(go[0]
//! …))` on a Linear (issue 39: hooks that keep gradients). As
//! `Module._call_impl` does it: after the forward (and its forward hooks)
//! the output goes through `BackwardHookFunction`, an identity whose
//! backward node (`BackwardHookFunctionBackward`) hands the gradient on
//! unchanged and carries the hook; an input that requires grad goes
//! through one too. No allocation: what the hook keeps is the gradient
//! of the module's output itself, one per backward.

use super::super::bindings::Value;
use super::super::error::{EngineError, Result};
use super::super::program::KeepWhat;
use super::super::tensor::TensorId;
use super::super::Engine;
use crate::engine::autograd::{BwdKind, NodeId};

/// PyTorch's warning when the hooked module's inputs need no gradient
/// (torch/utils/hooks.py).
const OUTPUTS_ONLY: &str = "Full backward hook is firing when gradients are computed with \
     respect to module outputs since no inputs require gradients. See \
     https://docs.pytorch.org/docs/main/generated/torch.nn.Module.html#torch.nn.Module.register_full_backward_hook \
     for more details.";

/// A `BackwardHookFunctionBackward` node that runs a module's backward hooks.
#[derive(Debug, Clone)]
pub(crate) struct GradHook {
    pub node: NodeId,
    /// Each hook's list and what it keeps of the gradient.
    hooks: Vec<(String, KeepWhat)>,
    /// No input of the module required grad (PyTorch then warns).
    outputs_only: bool,
}

impl Engine {
    /// `register_full_backward_hook` on the Linear at `path`, appending
    /// what `what` keeps of the output's gradient to `list`.
    pub(crate) fn register_backward_hook(
        &mut self,
        path: &str,
        list: &str,
        what: KeepWhat,
    ) -> Result<()> {
        let module = self.hookable_linear(path, list, "register a full backward hook on")?;
        self.backward_hooks.push((module, list.to_string(), what));
        Ok(())
    }

    /// `handle.remove()` for the backward hooks on the module at `path`.
    pub(crate) fn remove_backward_hooks(&mut self, path: &str) {
        let module = self.tags.module(path);
        self.backward_hooks.retain(|(m, _, _)| *m != module);
    }

    /// The Linear's input through `BackwardHookFunction` when it requires
    /// grad and a backward hook is on the module (`setup_input_hook`).
    pub(crate) fn backward_hook_input(&mut self, module: u32, x: TensorId) -> TensorId {
        if !self.backward_hooks.iter().any(|(m, _, _)| *m == module) || !self.records(&[x]) {
            return self.local_ref(x);
        }
        self.identity_node(x).0
    }

    /// The Linear's output through `BackwardHookFunction`
    /// (`setup_output_hook`): its backward node runs the hooks.
    pub(crate) fn backward_hook_output(
        &mut self,
        module: u32,
        y: TensorId,
        input_wrapped: bool,
    ) -> TensorId {
        let hooks: Vec<(String, KeepWhat)> = self
            .backward_hooks
            .iter()
            .filter(|(m, _, _)| *m == module)
            .map(|(_, l, w)| (l.clone(), *w))
            .collect();
        if hooks.is_empty() || !self.records(&[y]) {
            return y;
        }
        let (out, node) = self.identity_node(y);
        self.release(y);
        self.grad_hooks.push(GradHook {
            node,
            hooks,
            outputs_only: !input_wrapped,
        });
        out
    }

    /// `BackwardHookFunction.apply(t)`: a view of `t` whose grad_fn hands
    /// the gradient on.
    fn identity_node(&mut self, t: TensorId) -> (TensorId, NodeId) {
        let node = self.new_node(
            "BackwardHookFunctionBackward",
            BwdKind::PassThrough,
            &[Some(t)],
        );
        let x = self.t(t).clone();
        let v = self.wrap_storage(x.storage, x.shape, x.dtype, x.layout, true);
        self.set_grad_fn(v, node, 0);
        (v, node)
    }

    /// The hooks on `n`, run after it hands its gradient on: each appends
    /// what it keeps of the gradient of the module's output.
    pub(crate) fn run_backward_hooks(&mut self, n: NodeId, g: TensorId) -> Result<()> {
        let Some(h) = self.grad_hooks.iter().find(|h| h.node == n) else {
            return Ok(());
        };
        let (hooks, outputs_only) = (h.hooks.clone(), h.outputs_only);
        if outputs_only {
            self.warn(OUTPUTS_ONLY);
        }
        for (list, what) in hooks {
            let v = match what {
                KeepWhat::Tensor => Value::Tensor(self.local_ref(g)),
                KeepWhat::Detach => Value::Tensor(self.detach(g)),
                KeepWhat::Cpu => Value::Tensor(self.cpu(g)),
                KeepWhat::Item => {
                    return Err(EngineError::Runtime(format!(
                        "a Tensor with {} elements cannot be converted to Scalar",
                        self.shape(g).numel()
                    )))
                }
            };
            self.append_value(&list, v)?;
        }
        Ok(())
    }

    /// The Linear at `path` a hook may go on, appending to the bound `list`.
    pub(crate) fn hookable_linear(&mut self, path: &str, list: &str, verb: &str) -> Result<u32> {
        let is_linear = self
            .parameters()
            .iter()
            .any(|p| &*self.param_module(*p) == path && self.shape(*p).dims().len() == 2);
        if !is_linear {
            return Err(EngineError::Program(format!(
                "no Linear module `{path}` in the model to {verb}"
            )));
        }
        match self.bindings.vars.get(list) {
            Some(Value::List(_) | Value::Deque { .. }) => Ok(self.tags.module(path)),
            _ => Err(EngineError::Program(format!(
                "the hook appends to `{list}`, which is not a list"
            ))),
        }
    }
}
