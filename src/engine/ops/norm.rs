//! layer_norm and batch_norm (tables 1.7 and 2.2).

use super::super::amp::CastPolicy;
use super::super::dtype::DType;
use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tensor::TensorId;
use super::super::Engine;
use crate::engine::autograd::BwdKind;
use crate::engine::scratch::layer_norm::gamma_beta_partial_rows;

impl Engine {
    /// `native_layer_norm`: out (input dtype), mean [M] and rstd [M] fp32, with
    /// M the product of the leading dims. Saves input, weight, bias, mean, rstd —
    /// not the output. Runs in fp32 under autocast (§6.1).
    pub fn layer_norm(
        &mut self,
        x: TensorId,
        w: Option<TensorId>,
        b: Option<TensorId>,
    ) -> Result<TensorId> {
        let prev = self.op_begin("layer_norm");
        let r = self.layer_norm_inner(x, w, b);
        self.op_end(prev)?;
        r
    }

    fn layer_norm_inner(
        &mut self,
        x: TensorId,
        w: Option<TensorId>,
        b: Option<TensorId>,
    ) -> Result<TensorId> {
        // layer_norm is on autocast's fp32 list: every floating argument is
        // cast, right to left (an fp16 model's weight and bias included).
        let [xc, w, b] = self.autocast_args([Some(x), w, b], CastPolicy::Fp32)?;
        let xc = xc.unwrap_or_else(|| self.local_ref(x));
        let shape = self.shape(xc);
        let m = Shape::new(&[shape.leading()]);
        let out = self.act(shape, self.dtype(xc))?;
        let mean = self.aux(m, DType::F32)?;
        let rstd = self.aux(m, DType::F32)?;
        self.k_sum(xc, mean);
        self.k_unary(xc, out);
        let mut ins = vec![xc];
        ins.extend(w);
        ins.extend(b);
        if self.records(&ins) {
            let partial_rows = self.cfg.reduce_device.and_then(|d| {
                let n = shape.dims().last().copied().unwrap_or(1);
                gamma_beta_partial_rows(shape.leading(), n, d.sm_count)
            });
            let node = self.new_node(
                "NativeLayerNormBackward0",
                BwdKind::LayerNorm { partial_rows },
                &[Some(xc), w, b],
            );
            self.save(node, "input", xc, false);
            if let Some(w) = w {
                self.save(node, "weight", w, false);
            }
            if let Some(b) = b {
                self.save(node, "bias", b, false);
            }
            self.save(node, "result1", mean, true);
            self.save(node, "result2", rstd, true);
            self.set_grad_fn(out, node, 0);
        }
        self.release(mean);
        self.release(rstd);
        self.release(xc);
        for cast in [w, b].into_iter().flatten() {
            self.release(cast);
        }
        Ok(out)
    }

    /// `batch_norm` over [N, C, …]. Training: out, save_mean [C], save_invstd [C]
    /// (fp32); the cuDNN reserve is taken as 0 bytes [unc]. Eval: statistics are
    /// empty (0 bytes). Saves input, weight, running stats, save_mean/invstd.
    pub fn batch_norm(
        &mut self,
        x: TensorId,
        w: TensorId,
        b: TensorId,
        running: (TensorId, TensorId),
    ) -> Result<TensorId> {
        let prev = self.op_begin("batch_norm");
        let r = self.batch_norm_inner(x, w, b, running);
        self.op_end(prev)?;
        r
    }

    fn batch_norm_inner(
        &mut self,
        x: TensorId,
        w: TensorId,
        b: TensorId,
        running: (TensorId, TensorId),
    ) -> Result<TensorId> {
        let shape = self.shape(x);
        let c = if shape.rank() > 1 {
            shape.dim(1)
        } else {
            shape.numel()
        };
        // `_batch_norm_impl_index` takes cuDNN unless the input is bfloat16
        // or half with a half weight; ATen's own kernel returns [C] fp32
        // statistics in eval too, which die at once (a .half() model on the
        // H100), where cuDNN's are empty.
        let native = match self.dtype(x) {
            DType::BF16 => true,
            DType::F16 => self.dtype(w) != DType::F32,
            _ => false,
        };
        let stat = if self.ctx.training || native {
            Shape::new(&[c])
        } else {
            Shape::new(&[0])
        };
        let out = self.act(shape, self.dtype(x))?;
        let save_mean = self.aux(stat, DType::F32)?;
        let save_invstd = self.aux(stat, DType::F32)?;
        self.k_sum(x, save_mean);
        self.k_unary(x, out);
        if self.records(&[x, w, b]) {
            let name = if native {
                "NativeBatchNormBackward0"
            } else {
                "CudnnBatchNormBackward0"
            };
            let node = self.new_node(name, BwdKind::Alloc, &[Some(x), Some(w), Some(b)]);
            self.save(node, "input", x, false);
            self.save(node, "weight", w, false);
            self.save(node, "running_mean", running.0, false);
            self.save(node, "running_var", running.1, false);
            self.save(node, "result1", save_mean, true);
            self.save(node, "result2", save_invstd, true);
            self.set_grad_fn(out, node, 0);
        }
        self.release(save_mean);
        self.release(save_invstd);
        Ok(out)
    }
}
