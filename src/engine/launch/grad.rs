//! The kernels of backward and of the optimizer step (see `launch.rs`):
//! gradients computed from the incoming gradient, GEMM gradients from the
//! incoming gradient and the saved other operand, parameter updates.

use crate::engine::autograd::NodeId;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

impl Engine {
    /// A gradient `t` computed elementwise from the incoming gradient `g`
    /// (relu/gelu/softmax/… backward), or zero-filled when `g` does not cover it
    /// (a 0-dim loss gradient spread over the input).
    pub(crate) fn k_grad_from(&mut self, g: Option<TensorId>, t: TensorId) {
        let read = g.map_or(0, |g| self.gpu_bytes(g).min(self.gpu_bytes(t)));
        self.count_bytes(read.saturating_add(self.gpu_bytes(t)));
        if self.launcher.is_none() {
            return;
        }
        let (gs, ts) = (g.and_then(|g| self.span(g)), self.span(t));
        match (g, gs, ts) {
            (Some(g), Some((_, ng)), Some((_, nt))) if ng >= nt => self.launch_unary(g, t),
            _ => self.launch_fill(t, 0.0),
        }
    }

    /// The gradient `out` of a GEMM input: `g · other` for the first operand
    /// (`dX[M,K] = dY[M,N] · W`), `gᵀ · other` for the second (`dW = dYᵀ · X`),
    /// where `other` is the operand the node saved for exactly this gradient
    /// (`mat2` for the first, `self`/`mat1` for the second, table 2.2).
    pub(crate) fn k_gemm_grad(
        &mut self,
        n: NodeId,
        first: bool,
        g: Option<TensorId>,
        out: TensorId,
    ) {
        if self.launcher.is_none() {
            return;
        }
        let Some(g) = g else { return };
        let want: &[&str] = if first { &["mat2"] } else { &["self", "mat1"] };
        let other = self.nodes[n.0]
            .saved
            .iter()
            .find(|s| want.contains(&s.name))
            .and_then(|s| Some((s.storage?, s.shape.numel())));
        let Some((other, numel)) = other else { return };
        let (Some(gs), Some(os), Some(cs)) = (
            self.span(g),
            self.storage_span(other, numel),
            self.span(out),
        ) else {
            return;
        };
        let (shape_g, shape_out) = (self.shape(g), self.shape(out));
        let cols = shape_out.last().max(1);
        let rows = shape_out.numel() / cols;
        let glast = shape_g.last().max(1);
        let inner = if first {
            glast
        } else {
            shape_g.numel() / glast
        };
        self.k_matmul_spans(gs, os, cs, (rows, cols, inner));
    }

    /// The optimizer's update of one parameter from its gradient (`p += g`
    /// stands in for the SGD/Adam arithmetic; its traffic is counted by the
    /// step, which knows the state it reads and writes).
    pub(crate) fn k_update(&mut self, p: TensorId) {
        if self.launcher.is_none() {
            return;
        }
        if let Some(g) = self.grad(p) {
            self.launch_binary(p, g, p);
        }
    }
}
