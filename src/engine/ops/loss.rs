//! softmax / log_softmax and the losses (tables 1.7 and 2.2, autocast §6.1).

use super::super::amp::CastPolicy;
use super::super::dtype::DType;
use super::super::error::{EngineError, Result};
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::{Layout, TensorId};
use super::super::Engine;
use crate::engine::autograd::BwdKind;

impl Engine {
    /// `softmax(x, dim, dtype=…)`: saves its result. Under autocast the output is
    /// fp32 (§6.1 "fp32 output via dtype argument"): fp16 input goes straight to a
    /// float output, any other dtype change first makes a full converted copy.
    pub fn softmax(&mut self, x: TensorId, log: bool) -> Result<TensorId> {
        let prev = self.op_begin(if log { "log_softmax" } else { "softmax" });
        let r = self.softmax_inner(x, log, false);
        self.op_end(prev)?;
        r
    }

    /// `softmax(x, dim, dtype)`; autocast's fp32 output applies only when
    /// `dtype` is not given (its `fp32_set_opt_dtype` policy), and
    /// `cross_entropy` gives the input's own.
    fn softmax_inner(&mut self, x: TensorId, log: bool, dtype_given: bool) -> Result<TensorId> {
        let in_dtype = self.dtype(x);
        let out_dtype = if !dtype_given && self.amp.active(self.ctx.inference).is_some() {
            DType::F32
        } else {
            in_dtype
        };
        let shape = self.shape(x);
        if out_dtype != in_dtype && in_dtype != DType::F16 {
            // bf16 → fp32: `input.to(float)` first, a transient full-size copy (§1.7).
            let tmp = self.transient(
                shape.numel().saturating_mul(out_dtype.size()),
                Category::Temporary,
            )?;
            let out = self.act(shape, out_dtype);
            self.free_transient(tmp);
            let out = out?;
            self.k_unary(x, out);
            self.softmax_node(x, out, log);
            return Ok(out);
        }
        let out = self.act(shape, out_dtype)?;
        self.k_unary(x, out);
        self.softmax_node(x, out, log);
        Ok(out)
    }

    fn softmax_node(&mut self, x: TensorId, out: TensorId, log: bool) {
        if self.records(&[x]) {
            let name = if log {
                "LogSoftmaxBackward0"
            } else {
                "SoftmaxBackward0"
            };
            // SoftmaxBackward0 takes a temporary of the gradient's size
            // after it (the H100 sweep); LogSoftmaxBackward0 does not.
            let kind = if log {
                BwdKind::Alloc
            } else {
                BwdKind::AllocWithTemp { temp_first: false }
            };
            let node = self.new_node(name, kind, &[Some(x)]);
            self.set_grad_fn(out, node, 0);
            self.save(node, "result", out, true);
        }
    }

    /// `nll_loss(logp [N, C], target [N])` (mean): 0-dim loss and 0-dim
    /// total_weight; saves the log-probs, the target and total_weight.
    pub fn nll_loss(&mut self, logp: TensorId, target: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("nll_loss");
        let r = self.nll_inner(logp, target);
        self.op_end(prev)?;
        r
    }

    fn nll_inner(&mut self, logp: TensorId, target: TensorId) -> Result<TensorId> {
        let lc = self.autocast_arg(logp, CastPolicy::Fp32)?;
        let dtype = self.dtype(lc);
        let out = self.act(Shape::scalar(), dtype)?;
        let total_weight = self.aux(Shape::scalar(), dtype)?;
        self.k_sum(lc, out);
        self.k_fill(total_weight, 1.0);
        if self.records(&[lc]) {
            // The gradient is the full zero-filled [N, C] (table 2.2).
            let node = self.new_node("NllLossBackward0", BwdKind::Alloc, &[Some(lc)]);
            self.save(node, "self", lc, false);
            self.save(node, "target", target, false);
            self.save(node, "total_weight", total_weight, true);
            self.set_grad_fn(out, node, 0);
        }
        self.release(total_weight);
        self.release(lc);
        Ok(out)
    }

    /// `cross_entropy(logits [N, C], target)` = log_softmax then nll_loss (§1.7):
    /// net new saved bytes are one [N, C] log-prob tensor (fp32 under autocast).
    pub fn cross_entropy(&mut self, logits: TensorId, target: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("cross_entropy");
        let r = (|| {
            // `at::log_softmax(self, class_dim, self.scalar_type())` (LossNLL.cpp):
            // under autocast the log-probs keep the logits' dtype, and
            // nll_loss (fp32 list) takes an fp32 copy of them. Seen on
            // PyTorch 2.11 (tests/fixtures/pytorch/captured/amp_fp16).
            let prev = self.op_begin("log_softmax");
            let logp = self.softmax_inner(logits, true, true);
            self.op_end(prev)?;
            let logp = logp?;
            let loss = self.nll_loss(logp, target);
            self.release(logp);
            loss
        })();
        self.op_end(prev)?;
        r
    }

    /// `mse_loss(a, b)` (mean): a transient full-size elementwise loss, then a
    /// 0-dim out; saves self and target (always).
    pub fn mse_loss(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("mse_loss");
        let r = self.mse_inner(a, b);
        self.op_end(prev)?;
        r
    }

    fn mse_inner(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.pointwise_loss(a, b, 1, "MseLossBackward0", true)
    }

    /// `F.binary_cross_entropy(p, target)` (mean) on probabilities: banned
    /// under autocast (§6.1); otherwise a transient elementwise loss, a 0-dim
    /// out, and it saves self and target.
    pub fn binary_cross_entropy(&mut self, p: TensorId, target: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("binary_cross_entropy");
        let r = if self.amp.active(self.ctx.inference).is_some() {
            Err(EngineError::Runtime(BCE_UNSAFE_TO_AUTOCAST.into()))
        } else {
            self.pointwise_loss(p, target, 1, "BinaryCrossEntropyBackward0", false)
        };
        self.op_end(prev)?;
        r
    }

    /// `F.binary_cross_entropy_with_logits(x, target)` (mean): fp32 under
    /// autocast (§6.1); `log_sigmoid(x)` and `(1 - target) * x - …` are two
    /// full-size temporaries before the mean; saves self and target (§2.2).
    pub fn binary_cross_entropy_with_logits(
        &mut self,
        x: TensorId,
        target: TensorId,
    ) -> Result<TensorId> {
        let prev = self.op_begin("binary_cross_entropy_with_logits");
        let r = self.pointwise_loss(x, target, 2, "BinaryCrossEntropyWithLogitsBackward0", false);
        self.op_end(prev)?;
        r
    }

    /// A mean-reduced elementwise loss: `temporaries` full-size buffers
    /// alive together, a 0-dim out, self and target saved. With
    /// `full_size_out` the 0-dim out lies in a buffer of the input's size, as
    /// `mse_loss`'s does on PyTorch 2.11 (`loss.untyped_storage().nbytes()`
    /// is N·C elements on the H100): a kept loss keeps all of it.
    fn pointwise_loss(
        &mut self,
        a: TensorId,
        b: TensorId,
        temporaries: usize,
        node_name: &'static str,
        full_size_out: bool,
    ) -> Result<TensorId> {
        let [ac, bc] = self.autocast_all([a, b], CastPolicy::Fp32)?;
        let dtype = self.dtype(ac);
        let bytes = self.shape(ac).numel().saturating_mul(dtype.size());
        let mut tmps = Vec::with_capacity(temporaries);
        let mut out = Ok(());
        for _ in 0..temporaries {
            match self.transient(bytes, Category::Temporary) {
                Ok(t) => tmps.push(t),
                Err(e) => {
                    out = Err(e);
                    break;
                }
            }
        }
        let out = out.and_then(|()| {
            if full_size_out {
                let category = if self.ckpt.rebuilding() {
                    Category::Recompute
                } else {
                    Category::Activation
                };
                let s = self.new_storage(bytes, category)?;
                Ok(self.wrap_storage(s, Shape::scalar(), dtype, Layout::Contiguous, false))
            } else {
                self.act(Shape::scalar(), dtype)
            }
        });
        // The mean over the elementwise loss, with its scratch, before the
        // temporaries go.
        let out = out.and_then(|o| {
            let shape = self.full_reduction(ac);
            self.scratch_after(o, shape)
        });
        for t in tmps.into_iter().rev() {
            self.free_transient(t);
        }
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                self.release(ac);
                self.release(bc);
                return Err(e);
            }
        };
        self.k_sum(ac, out);
        if self.records(&[ac, bc]) {
            let node = self.new_node(node_name, BwdKind::Alloc, &[Some(ac), Some(bc)]);
            self.save(node, "self", ac, false);
            self.save(node, "target", bc, false);
            self.set_grad_fn(out, node, 0);
        }
        self.release(ac);
        self.release(bc);
        Ok(out)
    }
}

/// `binary_cross_entropy_banned` in ATen's autocast_mode.cpp, verbatim.
pub(crate) const BCE_UNSAFE_TO_AUTOCAST: &str =
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n\
Many models use a sigmoid layer right before the binary cross entropy layer.\n\
In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n\
or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n\
safe to autocast.";
