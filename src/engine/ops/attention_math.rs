//! SDPA's math fallback as PyTorch 2.11 runs it: `_scaled_dot_product_attention_math`
//! (aten/src/ATen/native/transformers/attention.cpp), request for request as
//! an H100 showed it (`tests/fixtures/attention/math_h100_sweep.tsv`).
//!
//! Half inputs are first copied to fp32; q and kᵀ are each scaled by
//! √scale into new tensors laid out like their inputs, so the batched
//! matmuls copy them (and v) when `[B, h]` cannot merge into one batch
//! dimension; a causal mask is built as a bool tril and then an fp32
//! additive mask; `_safe_softmax` takes a bool `== -inf` mask and its
//! per-row `all` besides the softmax; half results are cast back.

use super::super::dtype::DType;
use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::{Layout, TensorId};
use super::super::Engine;
use crate::engine::autograd::BwdKind;
use crate::engine::scratch::softmax::safe_softmax_scratch;

/// The function's C++ locals that own memory, destroyed in reverse
/// declaration order as it returns or unwinds: `attn`, `query`,
/// `attn_mask`, `value_acc`, `key_acc`, `query_acc`.
#[derive(Default)]
struct Frame {
    acc: Vec<TensorId>,
    mask: Option<TensorId>,
    query: Option<TensorId>,
    attn: Option<TensorId>,
}

impl Engine {
    /// q, k, v of [B, h, T, hd] and [B, h, S, hd].
    pub(super) fn sdpa_math(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        p: f64,
        causal: bool,
    ) -> Result<TensorId> {
        let mut frame = Frame::default();
        let r = self.sdpa_math_body([q, k, v], p, causal, &mut frame);
        for t in [frame.attn, frame.query, frame.mask].into_iter().flatten() {
            self.release(t);
        }
        for t in frame.acc.into_iter().rev() {
            self.release(t);
        }
        // The second result (`attn.to(origin_dtype)`) dies in the caller.
        let (out, weights) = r?;
        self.release(weights);
        Ok(out)
    }

    /// The body, with its locals in `frame`; returns the output and the
    /// second result (the attention weights, cast back for half inputs).
    fn sdpa_math_body(
        &mut self,
        qkv: [TensorId; 3],
        p: f64,
        causal: bool,
        frame: &mut Frame,
    ) -> Result<(TensorId, TensorId)> {
        let origin = self.dtype(qkv[0]);
        // allowFP16BF16ReductionMathSDP is off by default.
        let upcast = origin.is_half();
        let mut acc = qkv;
        if upcast {
            for x in &mut acc {
                let c = self.to_dtype(*x, DType::F32)?;
                self.t_mut(c).layout = self.layout(*x);
                frame.acc.push(c);
                *x = c;
            }
        }
        let [qa, ka, va] = acc;
        let query = self.scaled_like(qa, self.layout(qa))?;
        frame.query = Some(query);
        if causal {
            let (t, s) = (self.shape(qa).dim(2), self.shape(ka).dim(2));
            frame.mask = Some(self.causal_additive_mask(t, s, self.dtype(query))?);
        }
        // `key.transpose(-2, -1) * scaling_factor`, a temporary of the statement.
        let kt = self.transpose(ka, 2, 3);
        let key_scaled = self.scaled_like(kt, Layout::Strided);
        self.release(kt);
        let key_scaled = key_scaled?;
        let attn = self.bmm_4d(query, qa, key_scaled, ka);
        self.release(key_scaled);
        let attn = attn?;
        frame.attn = Some(attn);
        if let Some(mask) = frame.mask {
            self.add_inplace(attn, mask)?;
        }
        let probs = self.safe_softmax(attn)?;
        self.release(attn);
        frame.attn = Some(probs);
        let attn = if p > 0.0 {
            let dropped = self.dropout(probs, p)?;
            self.release(probs);
            frame.attn = Some(dropped);
            dropped
        } else {
            probs
        };
        // `make_tuple(matmul(attn, v).to(origin), attn.to(origin))`: GCC
        // evaluates the arguments right to left. The second result is a
        // cast copy, or `attn` itself: either way it outlives the frame.
        let weights = if upcast {
            self.to_dtype(attn, origin)?
        } else {
            self.local_ref(attn)
        };
        let out = match self.bmm_4d(attn, attn, va, va) {
            Ok(out) if upcast => {
                let cast = self.to_dtype(out, origin);
                self.release(out);
                cast
            }
            r => r,
        };
        match out {
            Ok(out) => Ok((out, weights)),
            Err(e) => {
                self.release(weights);
                Err(e)
            }
        }
    }

    /// `x * scaling_factor`: a new tensor laid out like `x` (TensorIterator
    /// keeps its input's memory order); MulBackward1 saves nothing.
    fn scaled_like(&mut self, x: TensorId, layout: Layout) -> Result<TensorId> {
        let out = self.mul_scalar(x)?;
        self.t_mut(out).layout = layout;
        Ok(out)
    }

    /// The causal mask: `ones([T, S], bool).tril()`, then
    /// `where(mask, 0.0, scalar_tensor(-inf))` in `dtype`.
    fn causal_additive_mask(&mut self, t: u64, s: u64, dtype: DType) -> Result<TensorId> {
        let prev = self.op_begin("tril");
        let square = Shape::new(&[t, s]);
        let ones = self.empty(square, DType::Bool, Category::Temporary);
        let tril = ones.and_then(|ones| {
            let tril = self.empty(square, DType::Bool, Category::Temporary);
            self.release(ones);
            tril
        });
        self.op_end(prev)?;
        let tril = tril?;
        let prev = self.op_begin("where");
        // The -inf scalar tensor, then the wrapped 0.0, then the result.
        let mut scalars = Vec::with_capacity(2);
        let mut mask = Ok(tril);
        for _ in 0..2 {
            match self.empty(Shape::scalar(), dtype, Category::Temporary) {
                Ok(s) => scalars.push(s),
                Err(e) => {
                    mask = Err(e);
                    break;
                }
            }
        }
        if mask.is_ok() {
            mask = self.empty(square, dtype, Category::Temporary);
        }
        for s in scalars.into_iter().rev() {
            self.release(s);
        }
        self.release(tril);
        self.op_end(prev)?;
        mask
    }

    /// `matmul` of [B, h, M, K] by [B, h, K, N]: each operand is reshaped to
    /// [B·h, ·, ·], a copy when its `origin` (the tensor whose layout it
    /// inherits) is not contiguous and neither B nor h is 1 (a transposed
    /// [B, T, h, hd] view cannot merge B and h); the copies are what
    /// BmmBackward0 saves.
    pub(crate) fn bmm_4d(
        &mut self,
        a: TensorId,
        a_origin: TensorId,
        b: TensorId,
        b_origin: TensorId,
    ) -> Result<TensorId> {
        let prev = self.op_begin("matmul");
        let r = (|| {
            let a2 = self.bmm_operand(a, a_origin)?;
            let b2 = match self.bmm_operand(b, b_origin) {
                Ok(b2) => b2,
                Err(e) => {
                    self.release(a2);
                    return Err(e);
                }
            };
            let shape = self.shape(a).with_last(self.shape(b).last());
            let out = self.gemm(a2, b2, shape, "BmmBackward0", false);
            self.release(a2);
            self.release(b2);
            let out = out?;
            // `_unsafe_view(bmm(…), [B, h, M, N])`: its backward reshapes a
            // strided gradient with a copy unless B, h or M is 1.
            let merge_fails = shape.dim(0) > 1 && shape.dim(1) > 1 && shape.dim(2) > 1;
            let view = self.view_with_node(
                out,
                shape,
                Layout::Contiguous,
                "UnsafeViewBackward0",
                BwdKind::UnsafeView { merge_fails },
            );
            self.release(out);
            Ok(view)
        })();
        self.op_end(prev)?;
        r
    }

    fn bmm_operand(&mut self, x: TensorId, origin: TensorId) -> Result<TensorId> {
        let s = self.shape(origin);
        let merges = self.layout(origin) == Layout::Contiguous || s.dim(0) == 1 || s.dim(1) == 1;
        if merges {
            Ok(self.local_ref(x))
        } else {
            self.contiguous(x)
        }
    }

    /// `_safe_softmax(x, -1)`: the softmax, a bool `x == -inf` mask, its
    /// per-row `all`, and a 0-dim zero, the last three freed before it
    /// returns; SafeSoftmaxBackward0 saves the result and, like softmax's,
    /// takes a temporary of the gradient's size after it.
    fn safe_softmax(&mut self, x: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("_safe_softmax");
        let r = self.safe_softmax_inner(x);
        self.op_end(prev)?;
        r
    }

    fn safe_softmax_inner(&mut self, x: TensorId) -> Result<TensorId> {
        let (shape, dtype) = (self.shape(x), self.dtype(x));
        let out = self.act(shape, dtype)?;
        self.k_unary(x, out);
        let scratch = safe_softmax_scratch(shape, dtype);
        let mut made = Vec::with_capacity(scratch.len());
        let mut failed = None;
        for (s, d) in scratch {
            match self.empty(s, d, Category::Temporary) {
                Ok(t) => made.push(t),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        for t in made.into_iter().rev() {
            self.release(t);
        }
        if let Some(e) = failed {
            self.release(out);
            return Err(e);
        }
        if self.records(&[x]) {
            let node = self.new_node(
                "SafeSoftmaxBackward0",
                BwdKind::AllocWithTemp { temp_first: false },
                &[Some(x)],
            );
            self.set_grad_fn(out, node, 0);
            self.save(node, "result", out, true);
        }
        Ok(out)
    }
}

/// Every row of `tests/fixtures/attention/math_h100_sweep.tsv` (an H100,
/// PyTorch 2.11): `F.scaled_dot_product_attention` under
/// `sdpa_kernel(MATH)`, causal and not, fp32 and fp16, on q, k, v leaves
/// laid out as `[B, T, h, hd]` tensors transposed to `[B, h, T, hd]`; the
/// forward's requests, then `o.backward(g)`'s.
#[cfg(test)]
mod h100_sweep {
    use super::*;
    use crate::engine::config::{EngineConfig, SdpaBackend};
    use crate::engine::tests::{requests, signed_requests, sweep_rows};

    /// The forward's and the backward's requests for one swept case.
    fn simulate(dtype: DType, causal: bool, dims: [u64; 4]) -> (Vec<i64>, Vec<i64>) {
        let [b, h, t, hd] = dims;
        let cfg = EngineConfig {
            sdpa_backend: Some(SdpaBackend::Math),
            ..EngineConfig::default()
        };
        let mut e = Engine::bare(cfg).expect("engine");
        let shape = Shape::new(&[b, h, t, hd]);
        let leaves: Vec<TensorId> = (0..3)
            .map(|_| {
                let x = e
                    .factory(shape, dtype, Category::Parameter)
                    .expect("q, k, v");
                let leaf = e.t_mut(x);
                leaf.requires_grad = true;
                // A transposed [B, T, h, hd] tensor: contiguous only with one head.
                if h > 1 {
                    leaf.layout = Layout::Strided;
                }
                x
            })
            .collect();
        let g = e.factory(shape, dtype, Category::Input).expect("g");
        // As the sweep does, take each thread's cuBLAS workspace first.
        let warm = e
            .factory(Shape::new(&[8, 8]), DType::F32, Category::Parameter)
            .expect("warm");
        e.t_mut(warm).requires_grad = true;
        let product = e.mm(warm, warm).expect("mm");
        let loss = e.sum(product).expect("sum");
        e.backward(loss, false).expect("warm-up backward");
        e.take_events();
        let out = e
            .sdpa(leaves[0], leaves[1], leaves[2], 0.0, causal)
            .expect("sdpa");
        let forward = requests(&e.take_events());
        // `o.backward(g)`: the caller keeps g.
        e.retain(g);
        e.nested_backward(out, g).expect("backward");
        (forward, requests(&e.take_events()))
    }

    #[test]
    fn every_swept_math_attention_requests_what_the_h100_did() {
        let rows = sweep_rows("attention/math_h100_sweep.tsv");
        let mut checked = 0;
        for pair in rows.chunks(2) {
            let (fwd, bwd) = (&pair[0], &pair[1]);
            assert_eq!((fwd[6].as_str(), bwd[6].as_str()), ("forward", "backward"));
            let dtype = match fwd[0].as_str() {
                "f32" => DType::F32,
                "f16" => DType::F16,
                other => panic!("unknown dtype {other}"),
            };
            let causal = fwd[1] == "1";
            let dims: Vec<u64> = fwd[2..6]
                .iter()
                .map(|d| d.parse().expect("a dim"))
                .collect();
            let dims = [dims[0], dims[1], dims[2], dims[3]];
            let (forward, backward) = simulate(dtype, causal, dims);
            assert_eq!(forward, signed_requests(&fwd[7]), "forward {fwd:?}");
            let want = signed_requests(&bwd[7]);
            if dims[1] > 1 {
                assert_eq!(backward, want, "backward {bwd:?}");
            } else {
                // With one head the leaves' gradients are kept or copied by
                // strides the engine does not track (the layout contract);
                // everything up to them matches.
                let upto = want.len().min(backward.len()) - 4;
                assert_eq!(backward[..upto], want[..upto], "backward {bwd:?}");
            }
            checked += 1;
        }
        assert_eq!(checked, 16);
    }
}
