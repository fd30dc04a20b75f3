//! Forward ops with their allocation (engine.md table 1.7) and saved-for-backward
//! (table 2.2) rules. Every op returns *local* handles (see `tensor.rs`).

pub mod attention;
mod attention_math;
mod bnb_matmul;
pub mod clamp;
pub mod conv;
pub mod elementwise;
mod grouped_mm;
pub mod handwritten;
pub mod hf_loss;
pub mod loss;
pub mod matmul;
pub mod moe;
pub mod norm;
mod penalty;
pub mod pointwise_hf;
pub(crate) mod reduce_input;
pub mod repeat_kv;
pub mod rms_norm;
pub mod rotary;
pub mod sdpa_select;
pub mod shape_ops;

use super::dtype::DType;
use super::error::{EngineError, Result};
use super::shape::Shape;
use super::tag::Category;
use super::tensor::TensorId;
use super::Engine;

impl Engine {
    /// A new op output.
    pub(crate) fn act(&mut self, shape: Shape, dtype: DType) -> Result<TensorId> {
        let cat = if self.ckpt.rebuilding() {
            Category::Recompute
        } else {
            Category::Activation
        };
        self.empty(shape, dtype, cat)
    }

    /// A tensor an op creates only for autograd (statistics, masks, reserve).
    pub(crate) fn aux(&mut self, shape: Shape, dtype: DType) -> Result<TensorId> {
        let cat = if self.ckpt.rebuilding() {
            Category::Recompute
        } else {
            Category::AutogradSaved
        };
        self.empty(shape, dtype, cat)
    }

    /// One more local handle on the same tensor (an op that returns its input).
    pub(crate) fn local_ref(&mut self, t: TensorId) -> TensorId {
        self.retain(t);
        self.locals.push(t);
        t
    }

    /// In-place ops on a leaf that requires grad are refused while recording (§2.6).
    pub(crate) fn check_inplace(&self, t: TensorId) -> Result<()> {
        let x = &self.tensors[t.0];
        if self.ctx.grad_enabled && x.requires_grad && x.grad_fn.is_none() {
            return Err(EngineError::Runtime(
                "a leaf Variable that requires grad is being used in an in-place operation.".into(),
            ));
        }
        Ok(())
    }

    /// Factory (`zeros`, `ones`, `randn`, `empty`, …): one storage (table 1.7).
    pub fn factory(&mut self, shape: Shape, dtype: DType, category: Category) -> Result<TensorId> {
        let prev = self.op_begin("factory");
        let r = self.empty(shape, dtype, category);
        self.op_end(prev)?;
        r
    }
}
