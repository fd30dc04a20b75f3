//! RMSNorm three ways (models.md §1): Hugging Face's `LlamaRMSNorm`
//! composite, `torch.nn.RMSNorm`'s fused `_fused_rms_norm` and ATen's
//! `rms_norm_composite`, chosen by the `hf_rmsnorm` switch.

use super::super::config::HfRmsNorm;
use super::super::dtype::DType;
use super::super::error::Result;
use super::super::tensor::TensorId;
use super::super::Engine;
use crate::engine::autograd::BwdKind;

/// layer_norm.cpp's warning when `rms_norm` cannot take the fused kernel.
pub(crate) const RMS_NORM_MISMATCH: &str =
    "Mismatch dtype between input and module: Can not dispatch to fused implementation";

impl Engine {
    /// An RMSNorm over the last dim with weight `w` [H], as `hf_rmsnorm` says.
    pub fn rms_norm(&mut self, x: TensorId, w: TensorId) -> Result<TensorId> {
        match self.cfg.hf_rmsnorm {
            HfRmsNorm::HfComposite => self.rms_norm_hf(x, w),
            HfRmsNorm::TorchFused if self.dtype(x) == self.dtype(w) => self.rms_norm_fused(x, w),
            HfRmsNorm::TorchFused => {
                if !self.warned.contains(&RMS_NORM_MISMATCH) {
                    self.warned.push(RMS_NORM_MISMATCH);
                }
                self.rms_norm_aten_composite(x, w)
            }
            HfRmsNorm::TorchComposite => self.rms_norm_aten_composite(x, w),
        }
    }

    /// `LlamaRMSNorm.forward` (models.md §1.1):
    /// `h = x.to(f32); variance = h.pow(2).mean(-1, keepdim=True);
    /// h = h * rsqrt(variance + eps); return weight * h.to(input_dtype)`.
    /// `variance` is a local: it lives until the function returns.
    pub fn rms_norm_hf(&mut self, x: TensorId, w: TensorId) -> Result<TensorId> {
        self.in_op("LlamaRMSNorm", |e| e.rms_norm_hf_inner(x, w))
    }

    fn rms_norm_hf_inner(&mut self, x: TensorId, w: TensorId) -> Result<TensorId> {
        let input_dtype = self.dtype(x);
        let h32 = self.to_dtype(x, DType::F32)?;
        let sq = self.pow2(h32)?;
        let variance = self.mean_last_keepdim(sq);
        self.release(sq);
        let variance = variance?;
        let e = self.add_scalar(variance)?;
        let r = self.rsqrt(e);
        self.release(e);
        let r = r?;
        let normed32 = self.mul(h32, r);
        self.release(r);
        let normed32 = self.rebind(h32, normed32)?;
        let normed = self.to_dtype(normed32, input_dtype)?;
        let y = self.mul(w, normed);
        self.release(normed);
        // The frame's locals go at return: `hidden_states`, then `variance`.
        self.release(normed32);
        self.release(variance);
        y
    }

    /// `Gemma2RMSNorm.forward` (transformers 5.16.1 modeling_gemma2.py:55-63,
    /// `Gemma3RMSNorm` the same): `output = self._norm(x.float())` with
    /// `_norm(x) = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) +
    /// self.eps)`, one expression, so the mean and the sum go as soon as
    /// used; `output = output * (1.0 + self.weight.float())`, fp32 (its
    /// MulBackward0 saves the normed input and `1 + weight`; the weight's
    /// fp32 copy goes once added); `return output.type_as(x)`: in a
    /// half-precision model a cast, the fp32 product gone.
    pub fn rms_norm_gemma(&mut self, x: TensorId, w: TensorId) -> Result<TensorId> {
        self.in_op("Gemma2RMSNorm", |e| e.rms_norm_gemma_inner(x, w))
    }

    fn rms_norm_gemma_inner(&mut self, x: TensorId, w: TensorId) -> Result<TensorId> {
        let input_dtype = self.dtype(x);
        let xf = self.to_dtype(x, DType::F32)?;
        let sq = self.pow2(xf)?;
        let mean = self.mean_last_keepdim(sq);
        self.release(sq);
        let mean = mean?;
        let sum = self.add_scalar(mean);
        self.release(mean);
        let sum = sum?;
        let r = self.rsqrt(sum);
        self.release(sum);
        let r = r?;
        let normed = self.mul(xf, r);
        self.release(r);
        // `_norm` returns: its argument goes (saved by pow and the product).
        self.release(xf);
        let normed = normed?;
        let wf = self.to_dtype(w, DType::F32)?;
        let one_plus = self.add_scalar(wf);
        self.release(wf);
        let one_plus = one_plus?;
        let product = self.mul(normed, one_plus);
        self.release(one_plus);
        self.release(normed);
        let product = product?;
        let y = self.to_dtype(product, input_dtype);
        self.release(product);
        y
    }

    /// `_fused_rms_norm` (models.md §1.2): Y in the input's dtype, then rstd
    /// fp32 with one value per row; saves input, weight and rstd.
    pub fn rms_norm_fused(&mut self, x: TensorId, w: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("_fused_rms_norm");
        let r = (|| {
            let shape = self.shape(x);
            let y = self.act(shape, self.dtype(x))?;
            let rstd = match self.aux(shape.with_last(1), DType::F32) {
                Ok(r) => r,
                Err(e) => {
                    self.release(y);
                    return Err(e);
                }
            };
            self.k_sum(x, rstd);
            self.k_unary(x, y);
            if self.records(&[x, w]) {
                let node =
                    self.new_node("FusedRmsNormBackward0", BwdKind::Alloc, &[Some(x), Some(w)]);
                self.save(node, "input", x, false);
                self.save(node, "weight", w, false);
                self.save(node, "result1", rstd, true);
                self.set_grad_fn(y, node, 0);
            }
            self.release(rstd);
            Ok(y)
        })();
        self.op_end(prev)?;
        r
    }

    /// ATen's `rms_norm_composite` (models.md §1.2): upcast, pow, mean,
    /// `add_(eps)` in place, rsqrt, `* rstd`, `* weight`, `type_as(input)`.
    pub fn rms_norm_aten_composite(&mut self, x: TensorId, w: TensorId) -> Result<TensorId> {
        self.in_op("rms_norm", |e| {
            let input_dtype = e.dtype(x);
            let up = e.to_dtype(x, DType::F32)?;
            let sq = e.pow2(up)?;
            let rstd = e.mean_last_keepdim(sq);
            e.release(sq);
            // `.add_(eps)` on the mean's own result: no new storage.
            let var = rstd?;
            let rstd = e.rsqrt(var);
            e.release(var);
            let rstd = rstd?;
            let normed = e.mul(up, rstd);
            e.release(rstd);
            e.release(up);
            let normed = normed?;
            let weighted = e.mul(normed, w);
            e.release(normed);
            let weighted = weighted?;
            let y = e.to_dtype(weighted, input_dtype);
            e.release(weighted);
            y
        })
    }
}
