//! linear / addmm / mm / bmm / matmul (tables 1.7 and 2.2, workspaces §1.6).

use super::super::amp::CastPolicy;
use super::super::config::CublasLtWorkspace;
use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::{Layout, TensorId};
use super::super::Engine;
use crate::engine::autograd::BwdKind;

/// Whether cuBLAS takes a 2-D operand of these sizes and strides as it is,
/// or PyTorch first copies it contiguous (`prepare_matrix_for_cublas`,
/// aten/src/ATen/native/cuda/Blas.cpp): a dense matrix, or one column- or
/// row-major with a leading dimension at least its rows or columns, goes as
/// it is; anything else (a broadcast gradient, stride 0) is cloned for the
/// call and freed after it. The engine's GEMM backward copies an expanded
/// gradient by the same rule (`gemm_grad`).
pub(crate) fn cublas_takes_as_is(sizes: [u64; 2], strides: [u64; 2]) -> bool {
    let [rows, cols] = sizes;
    // Non-overlapping and dense: row- or column-major with no gaps (a size-1
    // dimension's stride does not matter).
    let dense = (cols <= 1 || strides[1] == 1) && (rows <= 1 || strides[0] == cols.max(1))
        || (rows <= 1 || strides[0] == 1) && (cols <= 1 || strides[1] == rows.max(1));
    dense
        || strides[0] == 1 && strides[1] >= rows.max(1)
        || strides[1] == 1 && strides[0] >= cols.max(1)
}

impl Engine {
    /// `F.linear(x, W, b)` (W is [out, in]). With a bias and a contiguous input it
    /// lowers to one addmm on a 2-D view (cuBLASLt epilogue); otherwise to
    /// `matmul(x, W.t())` followed by an in-place `add_(b)` (Linear.cpp, §1.7).
    pub fn linear(&mut self, x: TensorId, w: TensorId, b: Option<TensorId>) -> Result<TensorId> {
        if self.bnb.weights.contains_key(&w) {
            return self.bnb_linear(x, w, b);
        }
        let prev = self.op_begin("linear");
        let r = self.linear_inner(x, w, b);
        self.op_end(prev)?;
        r
    }

    fn linear_inner(&mut self, x: TensorId, w: TensorId, b: Option<TensorId>) -> Result<TensorId> {
        let [xc, wc, bc] = self.autocast_args([Some(x), Some(w), b], CastPolicy::Lower)?;
        let (xc, wc) = (xc.unwrap_or(x), wc.unwrap_or(w));
        if self.dtype(xc) != self.dtype(wc) {
            // Outside autocast, F.linear multiplies only equal dtypes (an fp32
            // norm's output into a bf16 Linear, a bf16 input into fp32 weights).
            let msg = format!(
                "expected m1 and m2 to have the same dtype, but got: {} != {}",
                self.dtype(xc).scalar_name(),
                self.dtype(wc).scalar_name()
            );
            for t in [Some(xc), Some(wc), bc].into_iter().flatten() {
                self.release(t);
            }
            return Err(crate::engine::EngineError::Runtime(msg));
        }
        let contiguous = self.layout(xc) == Layout::Contiguous;
        let out = if bc.is_some() && contiguous {
            self.addmm_nd(bc, xc, wc)
        } else {
            self.mm_linear(xc, wc, bc)
        };
        for t in [Some(xc), Some(wc), bc].into_iter().flatten() {
            self.release(t);
        }
        out
    }

    /// addmm(bias, x2d, W.t()) with the output viewed back to x's leading dims.
    fn addmm_nd(&mut self, b: Option<TensorId>, x: TensorId, w: TensorId) -> Result<TensorId> {
        let xs = self.shape(x);
        let nout = self.shape(w).dim(0);
        let dtype = self.dtype(x);
        let records = self.records(&[x, w])
            || b.is_some_and(|b| self.requires_grad(b)) && self.ctx.grad_enabled;
        // mat1 is saved only if mat2 requires grad and vice versa (§2.2 guards).
        let saves = self.guarded_saves(records, [("mat1", x, w), ("mat2", w, x)]);
        self.ckpt_stop_before(&saves.iter().map(|s| s.1).collect::<Vec<_>>())?;
        let out = self.act(xs.with_last(nout), dtype)?;
        self.k_gemm_forward(x, w, out);
        if let Some(b) = b {
            self.k_binary(out, b, out);
        }
        // gemm_and_bias: the Lt workspace is alive for the call (§1.6, §12 #5).
        let lt = if self.cfg.lt_workspace() == CublasLtWorkspace::Transient {
            let bytes = self.cfg.cublaslt_workspace_bytes();
            self.transient(bytes, Category::Workspace)?
        } else {
            None
        };
        let ws = self.cublas_workspace()?;
        if self.cfg.lt_workspace() == CublasLtWorkspace::Cached {
            self.cublaslt_workspace()?;
        }
        self.free_transient(ws);
        self.free_transient(lt);
        if records {
            let node = self.new_node(
                "AddmmBackward0",
                BwdKind::Gemm {
                    has_bias: true,
                    weight_transposed: true,
                },
                &[b, Some(x), Some(w)],
            );
            for (name, t) in saves {
                self.save(node, name, t, false);
            }
            self.set_grad_fn(out, node, 0);
        }
        Ok(out)
    }

    /// matmul(x, W.t()) (+ in-place bias add): copies x if its reshape cannot merge.
    fn mm_linear(&mut self, x: TensorId, w: TensorId, b: Option<TensorId>) -> Result<TensorId> {
        let xs = self.shape(x);
        let x2 = if self.layout(x) != Layout::Contiguous && xs.rank() > 2 {
            self.contiguous(x)?
        } else {
            self.local_ref(x)
        };
        let out = self.gemm(
            x2,
            w,
            xs.with_last(self.shape(w).dim(0)),
            "MmBackward0",
            true,
        )?;
        self.release(x2);
        if let Some(b) = b {
            self.add_inplace(out, b)?;
        }
        Ok(out)
    }

    /// `mm(a, b)`: out of `shape`; saves b if a requires grad and a if b does.
    /// `b_transposed`: b is a Linear's weight, multiplied as `W.t()`.
    pub(crate) fn gemm(
        &mut self,
        a: TensorId,
        b: TensorId,
        shape: Shape,
        node_name: &'static str,
        b_transposed: bool,
    ) -> Result<TensorId> {
        let dtype = self.dtype(a);
        let records = self.records(&[a, b]);
        let saves = self.guarded_saves(records, [("self", a, b), ("mat2", b, a)]);
        self.ckpt_stop_before(&saves.iter().map(|s| s.1).collect::<Vec<_>>())?;
        let out = self.act(shape, dtype)?;
        self.k_gemm_forward(a, b, out);
        let ws = self.cublas_workspace()?;
        self.free_transient(ws);
        if records {
            let node = self.new_node(
                node_name,
                BwdKind::Gemm {
                    has_bias: false,
                    weight_transposed: b_transposed,
                },
                &[Some(a), Some(b)],
            );
            for (name, t) in saves {
                self.save(node, name, t, false);
            }
            self.set_grad_fn(out, node, 0);
        }
        Ok(out)
    }

    /// A product's saved inputs: each `(name, saved, other)` is saved only if
    /// `other` requires grad (§2.2 guards), and nothing when not recording.
    fn guarded_saves<const N: usize>(
        &self,
        records: bool,
        candidates: [(&'static str, TensorId, TensorId); N],
    ) -> Vec<(&'static str, TensorId)> {
        candidates
            .into_iter()
            .filter(|&(_, _, other)| records && self.requires_grad(other))
            .map(|(name, saved, _)| (name, saved))
            .collect()
    }

    /// `torch.mm(a, b)` for 2-D tensors.
    pub fn mm(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("mm");
        let r = self.mm_inner(a, b, "MmBackward0");
        self.op_end(prev)?;
        r
    }

    /// `torch.bmm` / `matmul` of batched operands: non-mergeable (strided)
    /// operands are copied first, and the copies are what autograd saves (§1.3).
    pub fn matmul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("matmul");
        let r = self.mm_inner(a, b, "BmmBackward0");
        self.op_end(prev)?;
        r
    }

    fn mm_inner(&mut self, a: TensorId, b: TensorId, name: &'static str) -> Result<TensorId> {
        let [ac, bc] = self.autocast_all([a, b], CastPolicy::Lower)?;
        let a2 = if self.layout(ac) == Layout::Contiguous {
            self.local_ref(ac)
        } else {
            self.contiguous(ac)?
        };
        let b2 = if self.layout(bc) == Layout::Contiguous || self.shape(bc).rank() <= 2 {
            self.local_ref(bc)
        } else {
            self.contiguous(bc)?
        };
        let (sa, sb) = (self.shape(a2), self.shape(b2));
        let shape = sa.with_last(sb.last());
        let out = self.gemm(a2, b2, shape, name, false);
        for t in [a2, b2, ac, bc] {
            self.release(t);
        }
        out
    }
}

#[cfg(test)]
mod cublas_operands {
    use super::cublas_takes_as_is;

    #[test]
    fn a_broadcast_matrix_is_copied_and_strided_layouts_are_not() {
        // sum().backward()'s gradient of a [16, 1000] output: stride 0.
        assert!(!cublas_takes_as_is([16, 1000], [0, 0]));
        assert!(!cublas_takes_as_is([1000, 16], [0, 0]));
        // Contiguous, transposed, and a column slice with a long leading dim.
        assert!(cublas_takes_as_is([16, 1000], [1000, 1]));
        assert!(cublas_takes_as_is([1000, 16], [1, 1000]));
        assert!(cublas_takes_as_is([16, 100], [1000, 1]));
        // Every other row: neither dense nor a plain leading dimension.
        assert!(!cublas_takes_as_is([16, 100], [200, 2]));
    }
}
