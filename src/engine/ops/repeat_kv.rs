//! `repeat_kv` (models.md §4.2): `x[:, :, None].expand(B, g, n_rep, T, d)`
//! then `reshape(B, g·n_rep, T, d)`, which cannot merge the stride-0 dim
//! and copies. Also the math backend's `repeat_interleave` for `enable_gqa`.

use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tensor::TensorId;
use super::super::Engine;
use crate::engine::autograd::BwdKind;

impl Engine {
    /// x [B, g, T, d] → a new contiguous [B, heads, T, d]; nothing saved.
    /// Backward sums the n_rep copies into a new [B, g, T, d] gradient.
    pub fn repeat_kv(&mut self, x: TensorId, heads: u64) -> Result<TensorId> {
        let s = self.shape(x);
        if s.dim(1) == heads {
            return Ok(self.local_ref(x));
        }
        let prev = self.op_begin("repeat_kv");
        let shape = Shape::new(&[s.dim(0), heads, s.dim(2), s.dim(3)]);
        let out = self.act(shape, self.dtype(x));
        let r = out.inspect(|&out| {
            self.k_unary(x, out);
            if self.records(&[x]) {
                let node = self.new_node("ExpandBackward0", BwdKind::Alloc, &[Some(x)]);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.op_end(prev)?;
        r
    }
}
