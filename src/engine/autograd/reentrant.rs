//! Reentrant activation checkpointing, `checkpoint(f, x, use_reentrant=True)`
//! (engine.md §7, §9 pitfall 9): `CheckpointFunction` runs the region under
//! `no_grad` and saves only its input; its backward re-runs the region with
//! grad enabled and back-propagates through it in a nested backward. With no
//! input requiring grad the output needs no grad either: PyTorch warns and
//! the region's parameters silently get no gradients.

use std::ops::Range;

use crate::engine::autograd::{BwdKind, NodeId};
use crate::engine::error::{EngineError, Result};
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

/// `check_backward_validity` in torch/utils/checkpoint.py.
pub(crate) const NO_INPUT_REQUIRES_GRAD: &str =
    "None of the inputs have requires_grad=True. Gradients will be None";

impl Engine {
    /// `CheckpointFunction.apply(run_blocks, x)`: `run` is the region's
    /// forward (blocks `blocks` from `x`).
    pub(crate) fn reentrant_region(
        &mut self,
        blocks: Range<usize>,
        x: TensorId,
        run: impl FnOnce(&mut Engine, TensorId) -> Result<TensorId>,
    ) -> Result<TensorId> {
        let needs_grad = self.requires_grad(x);
        if !needs_grad {
            self.warn(NO_INPUT_REQUIRES_GRAD);
        }
        let saved_grad = std::mem::replace(&mut self.ctx.grad_enabled, false);
        let out = run(self, x);
        self.ctx.grad_enabled = saved_grad;
        let out = out?;
        if needs_grad && self.ctx.grad_enabled {
            let kind = BwdKind::Reentrant {
                start: blocks.start as u32,
                end: blocks.end as u32,
                amp: self.amp.dtype,
            };
            let node = self.new_node("CheckpointFunctionBackward", kind, &[Some(x)]);
            // ctx.save_for_backward(x); the node also keeps x itself to re-run from.
            self.save(node, "input", x, false);
            self.retain(x);
            self.nodes[node.0].extra.push(x);
            self.set_grad_fn(out, node, 0);
        }
        Ok(out)
    }

    /// `CheckpointFunction.backward`: the gradient for the region's input.
    pub(crate) fn reentrant_backward(
        &mut self,
        n: NodeId,
        (start, end): (u32, u32),
        amp: Option<crate::engine::dtype::DType>,
        grad: TensorId,
    ) -> Result<TensorId> {
        let Some(&x) = self.nodes[n.0].extra.first() else {
            self.spent_reached = Some(n);
            return Err(EngineError::Runtime(
                crate::engine::error::BACKWARD_TWICE.into(),
            ));
        };
        let Some(model) = self.model.take() else {
            return Err(EngineError::Program(
                "checkpoint recompute without a model".into(),
            ));
        };
        // detach_variable(inputs): leaves that require grad.
        let xd = self.detach(x);
        self.t_mut(xd).requires_grad = true;
        let saved_amp = std::mem::take(&mut self.amp);
        if let Some(dt) = amp {
            self.autocast_enter(dt);
        }
        let saved_grad = std::mem::replace(&mut self.ctx.grad_enabled, true);
        self.ckpt.reentrant += 1;
        let out = model.run_blocks(self, start as usize..end as usize, xd);
        self.ckpt.reentrant -= 1;
        self.ctx.grad_enabled = saved_grad;
        if amp.is_some() {
            self.autocast_exit();
        }
        self.amp = saved_amp;
        self.model = Some(model);
        let out = out?;
        // torch.autograd.backward(outputs, grads): a nested graph task.
        self.retain(grad);
        let r = self.nested_backward(out, grad);
        self.release(out);
        r?;
        let gx = self.tensors[xd.0].grad.take();
        self.release(xd);
        gx.ok_or_else(|| EngineError::Runtime(NO_INPUT_REQUIRES_GRAD.into()))
    }

    /// Emit a Python warning once per run, as the `warnings` module shows one
    /// per call site.
    pub(crate) fn warn(&mut self, text: &'static str) {
        if !self.warned.contains(&text) {
            self.warned.push(text);
            self.events
                .push(crate::engine::events::EngineEvent::Warning(text));
        }
    }
}
