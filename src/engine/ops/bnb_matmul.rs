//! bitsandbytes' Linear forward and backward (models.md §13.2–§13.3): the
//! custom autograd Functions `MatMul4Bit` and `MatMul8bitLt` as bitsandbytes
//! 0.50.2 writes them. A Function's forward runs without recording, so the
//! dequantised weight and the int8 copies are temporaries that no Node
//! saves; what the Function keeps for backward it keeps as plain `ctx`
//! attributes (`ctx.tensors`), which live as long as its Node, not until
//! its backward has run, and which a checkpoint region cannot drop.

use super::super::bnb::{blocks, BnbGemm4bit, Quant4, QuantLayer, FUSED_MAX_ROWS};
use super::super::dtype::DType;
use super::super::error::{EngineError, Result};
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::TensorId;
use super::super::Engine;
use crate::engine::autograd::{BnbBwd, BwdKind, NodeId};

impl Engine {
    /// `F.linear(x, W, b)` on a bitsandbytes weight: its layer's forward.
    pub(crate) fn bnb_linear(
        &mut self,
        x: TensorId,
        w: TensorId,
        b: Option<TensorId>,
    ) -> Result<TensorId> {
        let Some(q) = self.bnb.weights.get(&w).cloned() else {
            return Err(EngineError::Program("not a bitsandbytes weight".into()));
        };
        if self.shape(x).last() != q.input {
            let rows = self.shape(x).numel() / q.input.max(1);
            return Err(EngineError::Runtime(format!(
                "mat1 and mat2 shapes cannot be multiplied ({rows}x{} and {}x{})",
                self.shape(x).last(),
                q.input,
                q.out
            )));
        }
        match q.layer {
            QuantLayer::FourBit(q4) => self.linear_4bit(x, w, b, &q4),
            QuantLayer::EightBit => self.linear_8bit(x, w, b),
        }
    }

    /// `Linear4bit.forward` (nn/modules.py:609-637): the input cast to the
    /// compute dtype (set from the first input when none was given), a bias
    /// of another dtype cast for good (`bias.data = bias.data.to(x.dtype)`),
    /// `matmul_4bit`, and its result cast back to the input's dtype.
    fn linear_4bit(
        &mut self,
        x: TensorId,
        w: TensorId,
        b: Option<TensorId>,
        q4: &Quant4,
    ) -> Result<TensorId> {
        let inp = self.dtype(x);
        let compute = self.compute_dtype(w, q4, inp);
        let xc = match compute {
            Some(d) => self.to_dtype(x, d)?,
            None => self.local_ref(x),
        };
        let r = self.bias_to(b, self.dtype(xc));
        let out = r.and_then(|()| self.matmul_4bit(xc, w, b, q4));
        // `return matmul_4bit(x, …).to(inp_dtype)`: the product goes as the
        // expression ends, the rebound `x` (the cast copy) as the frame
        // returns, both after the result's cast (traced, docs/trace.md QLoRA).
        let y = out.and_then(|out| {
            let y = self.to_dtype(out, inp);
            self.release(out);
            y
        });
        self.release(xc);
        y
    }

    /// `set_compute_type` (nn/modules.py:575-590) on the first call: an fp32
    /// or bf16 input sets the compute dtype, an fp16 one leaves it unset.
    fn compute_dtype(&mut self, w: TensorId, q4: &Quant4, inp: DType) -> Option<DType> {
        let q = self.bnb.weights.get_mut(&w)?;
        if q4.compute_dtype.is_some() {
            return q4.compute_dtype;
        }
        if q.compute.is_none() && matches!(inp, DType::F32 | DType::BF16) {
            q.compute = Some(inp);
        }
        q.compute
    }

    fn bias_to(&mut self, b: Option<TensorId>, dtype: DType) -> Result<()> {
        match b {
            Some(b) if self.dtype(b) != dtype => self.param_data_to(b, dtype),
            _ => Ok(()),
        }
    }

    /// `MatMul4Bit.forward` (autograd/_functions.py:300-362) on the
    /// dequantise-then-`F.linear` path (`_dequant_linear_fallback`,
    /// backends/cuda/ops.py:904-916): under double quantisation the absmax is
    /// dequantised (fp32, then `+ offset`, a second fp32), then the weight
    /// [out, in] in the compute dtype, then `F.linear`; the three go as the
    /// call returns. bitsandbytes 0.50 takes a fused kernel instead for at
    /// most 1,536 rows where its per-GPU table says so (ops.py:584-640,
    /// 934-985): no weight temporary then; the engine follows the fallback,
    /// which is also what every release before 0.50 did.
    fn matmul_4bit(
        &mut self,
        xc: TensorId,
        w: TensorId,
        b: Option<TensorId>,
        q4: &Quant4,
    ) -> Result<TensorId> {
        let (out, input) = self.linear_dims(w);
        let dtype = self.dtype(xc);
        let records = self.ctx.grad_enabled
            && (self.requires_grad(xc) || b.is_some_and(|b| self.requires_grad(b)));
        let prev = self.op_begin("MatMul4Bit");
        let grad = std::mem::replace(&mut self.ctx.grad_enabled, false);
        let r = self.dequant_linear(xc, b, [out, input], dtype, q4);
        self.ctx.grad_enabled = grad;
        let end = self.op_end(prev);
        let y = r?;
        end?;
        if records {
            let node = self.new_node(
                "MatMul4BitBackward",
                BwdKind::Bnb(BnbBwd::FourBit {
                    absmax: absmax_bytes(out * input, q4),
                    weight_dtype: self.bnb.weights.get(&w).map_or(dtype, |q| q.orig_dtype),
                    out,
                    input,
                }),
                &[Some(xc), b],
            );
            // `ctx.tensors = (None, B)` since bitsandbytes 0.43.2 (PR #1270,
            // July 2024); `(A, B)` before, which kept every frozen layer's
            // input until the graph went.
            if self.cfg.bnb_keeps_input {
                self.keep_on_ctx(node, xc);
            }
            self.set_grad_fn(y, node, 0);
        }
        Ok(y)
    }

    fn dequant_linear(
        &mut self,
        xc: TensorId,
        b: Option<TensorId>,
        [out, input]: [u64; 2],
        dtype: DType,
        q4: &Quant4,
    ) -> Result<TensorId> {
        let xs = self.shape(xc);
        let rows = xs.numel() / input.max(1);
        if self.cfg.bnb_gemm_4bit == BnbGemm4bit::Fused && rows <= FUSED_MAX_ROWS {
            // `_gemm_4bit_kernel_impl` (ops.py:846-901): the output, the
            // bias added in the kernel.
            // (No kernel is launched for it on a real GPU run: its work is
            // counted, its memory is the output's.)
            let y = self.act(xs.with_last(out), dtype)?;
            let matmul = crate::engine::work::FlopKind::Matmul;
            self.count_gemm(matmul, xc, xs.numel() / input.max(1) * out, input);
            return Ok(y);
        }
        let nested = if q4.double_quant {
            let len = Shape::new(&[blocks(out * input, q4.blocksize)]);
            let dq = self.empty(len, DType::F32, Category::Temporary)?;
            let sum = self.empty(len, DType::F32, Category::Temporary);
            match sum {
                Ok(s) => Some((s, dq)),
                Err(e) => {
                    self.release(dq);
                    return Err(e);
                }
            }
        } else {
            None
        };
        let wdq = self.empty(Shape::new(&[out, input]), dtype, Category::Temporary);
        wdq.and_then(|wdq| {
            let y = self.linear(xc, wdq, b);
            // The frame's locals go in order: the absmax (argument) slots,
            // then `absmax_dq`, then `B_dq`.
            if let Some((sum, dq)) = nested {
                self.release(sum);
                self.release(dq);
            }
            self.release(wdq);
            y
        })
    }

    /// `Linear8bitLt.forward` (nn/modules.py:1180-1194) and
    /// `MatMul8bitLt.forward` (autograd/_functions.py:101-196) with
    /// `threshold = 0` (`int8_scaled_mm`): the input cast to fp16 (unless it
    /// is), quantised by rows (fp32 scales, int8 rows; the fp16 copy goes),
    /// the int32 product, its fp16 dequantisation, that cast to the input's
    /// dtype; then the int8 input and its scales go. `ctx.tensors = (CAt,
    /// subA, A)` keeps the input itself whenever it needs a gradient, in
    /// every release.
    fn linear_8bit(&mut self, x: TensorId, w: TensorId, b: Option<TensorId>) -> Result<TensorId> {
        let dtype = self.dtype(x);
        self.bias_to(b, dtype)?;
        let (out, input) = self.linear_dims(w);
        let xs = self.shape(x);
        let rows = xs.numel() / input.max(1);
        let records = self.ctx.grad_enabled
            && (self.requires_grad(x) || b.is_some_and(|b| self.requires_grad(b)));
        let prev = self.op_begin("MatMul8bitLt");
        let r = self.int8_forward(x, rows, [out, input]);
        let end = self.op_end(prev);
        let y = r?;
        end?;
        if records {
            let node = self.new_node(
                "MatMul8bitLtBackward",
                BwdKind::Bnb(BnbBwd::EightBit { out, input }),
                &[Some(x), b],
            );
            self.keep_on_ctx(node, x);
            self.set_grad_fn(y, node, 0);
        }
        Ok(y)
    }

    fn int8_forward(&mut self, x: TensorId, rows: u64, [out, input]: [u64; 2]) -> Result<TensorId> {
        let dtype = self.dtype(x);
        let xs = self.shape(x);
        let temp = |e: &mut Engine, dims: &[u64], d: DType| {
            e.transient(Shape::new(dims).numel() * d.size(), Category::Temporary)
        };
        let half = if dtype == DType::F16 {
            None
        } else {
            temp(self, &[rows, input], DType::F16)?
        };
        let sca = temp(self, &[rows], DType::F32);
        let ca = sca
            .as_ref()
            .ok()
            .map(|_| temp(self, &[rows, input], DType::U8));
        self.free_transient(half);
        let (sca, ca) = match (sca, ca) {
            (Ok(s), Some(Ok(c))) => (s, c),
            (s, c) => {
                if let Ok(s) = s {
                    self.free_transient(s);
                }
                return Err(match c {
                    Some(Err(e)) => e,
                    _ => EngineError::Program("int8 quantisation failed".into()),
                });
            }
        };
        let i32 = temp(self, &[rows, out], DType::I32);
        let f16 = i32
            .as_ref()
            .ok()
            .map(|_| self.empty(xs.with_last(out), DType::F16, Category::Activation));
        let y = match f16 {
            Some(Ok(h)) if dtype == DType::F16 => Ok(h),
            Some(Ok(h)) => {
                let y = self.act(xs.with_last(out), dtype);
                self.release(h);
                y
            }
            Some(Err(e)) => Err(e),
            None => Err(EngineError::Program("int8 matmul failed".into())),
        };
        if let Ok(i) = i32 {
            self.free_transient(i);
        }
        self.free_transient(ca);
        self.free_transient(sca);
        y
    }

    /// `ctx.<attr> = t`: the Function's Node keeps `t` until the Node goes.
    pub(crate) fn keep_on_ctx(&mut self, node: NodeId, t: TensorId) {
        self.retain(t);
        self.nodes[node.0].ctx_attrs.push(t);
    }

    /// The gradient `MatMul4Bit` / `MatMul8bitLt.backward` gives their input
    /// `A` (the incoming gradient `g` in the compute dtype): 4-bit
    /// (autograd/_functions.py:364-386) dequantises again — the absmax under
    /// double quantisation (fp32, gone as `dequantize_4bit` returns,
    /// functional.py:1052-1070), the weight in the dtype it was quantised
    /// from, a copy in the gradient's dtype when they differ — then
    /// `torch.matmul(grad_output, W)`; 8-bit (autograd/_functions.py:229-240)
    /// makes `CB.to(dtype_A, copy=True)` scaled in place by a [out, 1] fp32
    /// `SCB / 127`, then the matmul. The weight copies go after the matmul.
    pub(crate) fn bnb_input_grad(
        &mut self,
        kind: BnbBwd,
        shape: Shape,
        dtype: DType,
        g: Option<TensorId>,
    ) -> Result<TensorId> {
        let w = match kind {
            BnbBwd::FourBit {
                absmax,
                weight_dtype,
                out,
                input,
            } => {
                let a = self.transient(absmax, Category::Temporary)?;
                let w = self.transient(out * input * weight_dtype.size(), Category::Temporary);
                self.free_transient(a);
                let w = w?;
                if weight_dtype == dtype {
                    w
                } else {
                    let c = self.transient(out * input * dtype.size(), Category::Temporary);
                    self.free_transient(w);
                    c?
                }
            }
            BnbBwd::EightBit { out, input } => {
                let cb = self.transient(out * input * dtype.size(), Category::Temporary)?;
                let scale = self.transient(out * DType::F32.size(), Category::Temporary);
                match scale {
                    Ok(s) => self.free_transient(s),
                    Err(e) => {
                        self.free_transient(cb);
                        return Err(e);
                    }
                }
                cb
            }
        };
        let r = self.gemm_grad(shape, dtype, g);
        self.free_transient(w);
        r
    }
}

/// The fp32 absmax that dequantising a double-quantised weight of `n`
/// values makes (0 without double quantisation: the state's own is used).
fn absmax_bytes(n: u64, q4: &Quant4) -> u64 {
    if q4.double_quant {
        blocks(n, q4.blocksize) * DType::F32.size()
    } else {
        0
    }
}
