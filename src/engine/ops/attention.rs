//! `scaled_dot_product_attention` (tables 1.7 and 2.2).

use super::super::amp::CastPolicy;
use super::super::autograd::{BwdKind, SdpaScratch};
use super::super::config::SdpaBackend;
use super::super::dtype::DType;
use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tensor::{Layout, TensorId};
use super::super::Engine;

impl Engine {
    /// SDPA on q, k, v of shape [B, h, T, hd]. The backend is the configured
    /// one, or automatic: flash for fp16/bf16, memory-efficient for fp32.
    pub fn sdpa(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        dropout: f64,
    ) -> Result<TensorId> {
        let prev = self.op_begin("scaled_dot_product_attention");
        let r = self.sdpa_inner(q, k, v, dropout);
        self.op_end(prev)?;
        r
    }

    fn sdpa_inner(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        dropout: f64,
    ) -> Result<TensorId> {
        let [qc, kc, vc] = self.autocast_all([q, k, v], CastPolicy::Lower)?;
        let dtype = self.dtype(qc);
        let backend = match self.cfg.sdpa_backend {
            // Flash needs fp16/bf16 (§1.7); fall back to memory-efficient.
            Some(SdpaBackend::Flash) if !dtype.is_half() => SdpaBackend::Efficient,
            Some(b) => b,
            None if dtype.is_half() => SdpaBackend::Flash,
            None => SdpaBackend::Efficient,
        };
        let p = if self.ctx.training { dropout } else { 0.0 };
        let out = match backend {
            SdpaBackend::Math => self.sdpa_math(qc, kc, vc, p),
            _ => self.sdpa_fused(qc, kc, vc, p, backend),
        };
        for t in [qc, kc, vc] {
            self.release(t);
        }
        out
    }

    /// Flash / memory-efficient: out laid out [B, T, h, hd] (a [B, h, T, hd] view),
    /// logsumexp [B, h, T] fp32 (T padded to a multiple of 32 for mem-eff), and
    /// the RNG state (see below).
    fn sdpa_fused(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        p: f64,
        backend: SdpaBackend,
    ) -> Result<TensorId> {
        let s = self.shape(q);
        let (b, h, t, hd) = (s.dim(0), s.dim(1), s.dim(2), s.dim(3));
        let dtype = self.dtype(q);
        let out_base = self.act(Shape::new(&[b, t, h, hd]), dtype)?;
        // Fused attention as one GEMM stand-in: out[rows, hd] = q[rows, hd] · v[hd, hd].
        self.k_matmul(q, v, out_base, b * h * t, hd, hd);
        let tl = if backend == SdpaBackend::Flash {
            t
        } else {
            t.div_ceil(32) * 32
        };
        // Memory-efficient attention computes logsumexp only for backward
        // (`compute_log_sumexp`); flash always does.
        let recording = self.records(&[q, k, v]);
        let lse = if recording || backend == SdpaBackend::Flash {
            Some(self.aux(Shape::new(&[b, h, tl]), DType::F32)?)
        } else {
            None
        };
        // Flash (FlashAttention-2 in ATen) always returns its philox state as
        // a [2] int64 tensor and an `unused` int64 scalar, both saved for
        // backward; memory-efficient attention only with dropout. Seen on
        // PyTorch 2.11 (tests/fixtures/pytorch/captured/amp_fp16).
        let rng = if p > 0.0 || backend == SdpaBackend::Flash {
            Some(self.aux(Shape::new(&[2]), DType::I64)?)
        } else {
            None
        };
        let unused = if backend == SdpaBackend::Flash {
            Some(self.aux(Shape::new(&[]), DType::I64)?)
        } else {
            None
        };
        let out = self.view_as(out_base, s, Layout::Strided);
        self.release(out_base);
        if recording {
            let (name, scratch) = if backend == SdpaBackend::Flash {
                (
                    "ScaledDotProductFlashAttentionBackward0",
                    flash_scratch(b, h, t, hd),
                )
            } else if dtype == DType::F32 {
                (
                    "ScaledDotProductEfficientAttentionBackward0",
                    efficient_f32_scratch(b, h, t, hd),
                )
            } else {
                (
                    "ScaledDotProductEfficientAttentionBackward0",
                    SdpaScratch::Delta(b * h * tl * 4),
                )
            };
            let node = self.new_node(
                name,
                BwdKind::Sdpa { scratch },
                &[Some(q), Some(k), Some(v)],
            );
            self.save(node, "query", q, false);
            self.save(node, "key", k, false);
            self.save(node, "value", v, false);
            self.save(node, "output", out, true);
            if let Some(l) = lse {
                self.save(node, "logsumexp", l, true);
            }
            if let Some(r) = rng {
                self.save(node, "rng_state", r, true);
            }
            if let Some(u) = unused {
                self.save(node, "unused", u, true);
            }
            self.set_grad_fn(out, node, 0);
        }
        for t in [lse, rng, unused].into_iter().flatten() {
            self.release(t);
        }
        Ok(out)
    }

    /// Math fallback: scores = q @ kᵀ (copies of head-split q and k), softmax
    /// probs (saved, fp32 under autocast), optional dropout mask, out = probs @ v.
    fn sdpa_math(&mut self, q: TensorId, k: TensorId, v: TensorId, p: f64) -> Result<TensorId> {
        let kt = self.transpose(k, 2, 3);
        let scores = self.matmul(q, kt);
        self.release(kt);
        let scores = scores?;
        let probs = self.softmax(scores, false);
        self.release(scores);
        let probs = probs?;
        let dropped = self.dropout(probs, p);
        self.release(probs);
        let dropped = dropped?;
        let pc = if self.amp.active(self.ctx.inference).is_some() {
            self.to_dtype(dropped, self.dtype(v))?
        } else {
            self.local_ref(dropped)
        };
        self.release(dropped);
        let out = self.matmul(pc, v);
        self.release(pc);
        out
    }
}

/// The fp32 memory-efficient backward's scratch for q of [B, h, T, hd]
/// (`_efficient_attention_backward` on sm80 and later): delta through ATen
/// ops, then the kernel's workspace, B·h·(T·⌈hd⌉₆₄ + 4·⌈T/64⌉) fp32 (its
/// gQ accumulator across key splits, and per-block counters). The workspace
/// formula is read off the kernel's parameters and matches every fp32
/// attention backward of the H100 captures (T 256 to 1024, hd 64 and 96,
/// B 2 to 16, h 4 to 12).
fn efficient_f32_scratch(b: u64, h: u64, t: u64, hd: u64) -> SdpaScratch {
    let rows = b * t * h * 4;
    SdpaScratch::EfficientF32 {
        product: rows * hd,
        rows,
        workspace: b * h * (t * hd.div_ceil(64) * 64 + 4 * t.div_ceil(64)) * 4,
    }
}

/// FlashAttention-2's backward scratch for q of [B, h, T, hd] (`mha_bwd`):
/// rows rounded to 128 and the head to 32 (64 past 128); `dq_accum` only
/// when the keys loop over blocks (T above 256, or 128 past hd 64).
fn flash_scratch(b: u64, h: u64, t: u64, hd: u64) -> SdpaScratch {
    let t_rounded = t.div_ceil(128) * 128;
    let hd_rounded = if hd <= 128 {
        hd.div_ceil(32) * 32
    } else {
        hd.div_ceil(64) * 64
    };
    let key_block = if hd > 64 { 128 } else { 256 };
    SdpaScratch::Flash {
        softmax_d: b * h * t_rounded * 4,
        dq_accum: if t > key_block {
            b * t_rounded * h * hd_rounded * 4
        } else {
            0
        },
    }
}
