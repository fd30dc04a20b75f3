//! `scaled_dot_product_attention` (tables 1.7 and 2.2).

use super::super::amp::CastPolicy;
use super::super::config::SdpaBackend;
use super::super::dtype::DType;
use super::super::error::{EngineError, Result};
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::{Layout, TensorId};
use super::super::Engine;
use super::sdpa_select::SdpaCall;
use crate::engine::autograd::{BwdKind, SdpaScratch};
use crate::engine::torch_rules::EngineRules;

impl Engine {
    /// SDPA on q, k, v of shape [B, h, T, hd] (`is_causal` as given), as
    /// `F.scaled_dot_product_attention` with no mask: the backend is the one
    /// `sdpa_backend` forces, or the one PyTorch's dispatcher picks
    /// (`select_sdp_backend`, models.md §4.4; [`SdpaCall`]).
    pub fn sdpa(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        dropout: f64,
        causal: bool,
    ) -> Result<TensorId> {
        let prev = self.op_begin("scaled_dot_product_attention");
        let r = self.sdpa_dispatch(q, k, v, dropout, causal);
        self.op_end(prev)?;
        r
    }

    /// SDPA as Hugging Face calls it (models.md §4.1): k and v may carry
    /// fewer heads (`enable_gqa=True`); otherwise [`Engine::sdpa`].
    pub fn sdpa_hf(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        dropout: f64,
        causal: bool,
    ) -> Result<TensorId> {
        self.sdpa(q, k, v, dropout, causal)
    }

    fn sdpa_dispatch(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        dropout: f64,
        causal: bool,
    ) -> Result<TensorId> {
        let [qc, kc, vc] = self.autocast_all([q, k, v], CastPolicy::Lower)?;
        // autocast's cast (`_to_copy`, `memory_format=preserve_format`) keeps
        // a dense input's strides: a rotated q stays laid out [B, T, h, d].
        for (x, c) in [(q, qc), (k, kc), (v, vc)] {
            if c != x {
                let layout = self.layout(x);
                self.t_mut(c).layout = layout;
            }
        }
        let dtype = self.dtype(qc);
        let p = if self.ctx.training { dropout } else { 0.0 };
        let gqa = self.shape(kc).dim(1) != self.shape(qc).dim(1);
        let backend = match self.cfg.sdpa_backend {
            // Flash and cuDNN need fp16/bf16 (§1.7); fall back to memory-efficient.
            Some(SdpaBackend::Flash | SdpaBackend::Cudnn) if !dtype.is_half() => {
                SdpaBackend::Efficient
            }
            Some(b) => b,
            None => SdpaCall {
                dtype,
                mask: false,
                dropout: p,
                head_dim: self.shape(qc).last(),
                gqa,
            }
            .backend(self.cfg.sdpa_priority()),
        };
        // 2.11's memory-efficient kernel takes no `enable_gqa` (sdpa_select.rs):
        // forced with grouped heads, the dispatcher finds no kernel at all.
        if gqa && backend == SdpaBackend::Efficient && self.cfg.sdpa_backend.is_some() {
            for t in [qc, kc, vc] {
                self.release(t);
            }
            self.warn(
                "Memory efficient kernel not used because: enable_gqa=True (k and v have fewer \
                 heads than q) is not supported by the memory-efficient kernel",
            );
            return Err(EngineError::Runtime(
                "No available kernel. Aborting execution.".into(),
            ));
        }
        let out = match backend {
            SdpaBackend::Math if gqa => self.sdpa_math_gqa(qc, kc, vc, p, causal),
            SdpaBackend::Math => self.sdpa_math(qc, kc, vc, p, causal),
            _ => {
                self.count_attention(qc, kc, causal);
                self.sdpa_fused(qc, kc, vc, backend, causal)
            }
        };
        for t in [qc, kc, vc] {
            self.release(t);
        }
        out
    }

    /// The math backend with `enable_gqa`: k and v repeated to q's heads
    /// (`repeat_interleave`, copies) before the composite runs.
    fn sdpa_math_gqa(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        p: f64,
        causal: bool,
    ) -> Result<TensorId> {
        let heads = self.shape(q).dim(1);
        let kr = self.repeat_kv(k, heads)?;
        let vr = match self.repeat_kv(v, heads) {
            Ok(v) => v,
            Err(e) => {
                self.release(kr);
                return Err(e);
            }
        };
        let out = self.sdpa_math(q, kr, vr, p, causal);
        self.release(kr);
        self.release(vr);
        out
    }

    /// Flash / memory-efficient / cuDNN: out laid out [B, T, h, hd] (a
    /// [B, h, T, hd] view), logsumexp [B, h, T] fp32 (T padded to a multiple
    /// of 32 for mem-eff), and the RNG state (see below).
    fn sdpa_fused(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        backend: SdpaBackend,
        causal: bool,
    ) -> Result<TensorId> {
        let s = self.shape(q);
        let (b, h, t, hd) = (s.dim(0), s.dim(1), s.dim(2), s.dim(3));
        let dtype = self.dtype(q);
        let flash = backend == SdpaBackend::Flash;
        let cudnn = backend == SdpaBackend::Cudnn;
        // cuDNN (`_cudnn_attention_forward`, attention.cu): the dropout seed
        // and offset, `at::zeros({1}, kLong)` each, before
        // `run_cudnn_SDP_fprop` makes the output and the stats.
        let (seed, offset) = if cudnn {
            let seed = self.aux(Shape::new(&[1]), DType::I64)?;
            match self.aux(Shape::new(&[1]), DType::I64) {
                Ok(o) => (Some(seed), Some(o)),
                Err(e) => {
                    self.release(seed);
                    return Err(e);
                }
            }
        } else {
            (None, None)
        };
        let out_base = match self.act(Shape::new(&[b, t, h, hd]), dtype) {
            Ok(o) => o,
            Err(e) => {
                for t in [seed, offset].into_iter().flatten() {
                    self.release(t);
                }
                return Err(e);
            }
        };
        // Fused attention as one GEMM stand-in: out[rows, hd] = q[rows, hd] · v[hd, hd].
        self.k_matmul(q, v, out_base, b * h * t, hd, hd);
        let tl = if flash || cudnn {
            t
        } else {
            t.div_ceil(32) * 32
        };
        // Memory-efficient attention computes logsumexp only for backward
        // (`compute_log_sumexp`), cuDNN its stats only in training; flash
        // always does.
        let recording = self.records(&[q, k, v]);
        let lse = if recording || flash {
            Some(self.aux(Shape::new(&[b, h, tl]), DType::F32)?)
        } else {
            None
        };
        if cudnn {
            // The plan's workspace from the caching allocator, freed when
            // `run_cudnn_SDP_fprop` returns (MHA.cpp).
            let ws = self.transient(CUDNN_PLAN_WORKSPACE, Category::Workspace)?;
            self.free_transient(ws);
        }
        // Flash (FlashAttention-2 in ATen) always returns its philox state as
        // a [2] int64 tensor and an `unused` int64 scalar, both saved for
        // backward. Seen on PyTorch 2.11 (tests/fixtures/pytorch/captured/
        // amp_fp16). Memory-efficient attention's seed and offset are CPU
        // scalars outside CUDA graph capture, dropout or not
        // (`_efficient_attention_forward`, "Note [Seed and Offset Device]";
        // captured/gpt_dropout).
        // Before 2.7 flash's state is made on the CPU (PR #146372).
        let (rng, unused) = if flash && self.cfg.torch().flash_rng_on_gpu() {
            let rng = self.aux(Shape::new(&[2]), DType::I64)?;
            (Some(rng), Some(self.aux(Shape::scalar(), DType::I64)?))
        } else if flash {
            (None, None)
        } else {
            (seed, offset)
        };
        // Flash and cuDNN lay their output out as q is laid out (flash_api.cpp
        // `mha_fwd`: `out = at::empty_like(q_padded)` of q transposed to
        // [B, T, h, d]; cuDNN's MHA.cpp `alloc_with_matching_layout(q, o, …)`):
        // [B, T, h, d] in memory for q a transposed projection (or its
        // rotation), [B, h, T, d] for a contiguous q (Phi-3's rotary `cat`),
        // which `attn_output.transpose(1, 2).contiguous()` then copies. The
        // memory-efficient kernel always makes [B, T, h, d]
        // (`_efficient_attention_forward`'s `at::empty({B, M, num_heads, Kv})`).
        let layout = if (flash || cudnn) && self.layout(q) == Layout::Contiguous {
            Layout::Contiguous
        } else {
            Layout::Strided
        };
        let out = self.view_as(out_base, s, layout);
        self.release(out_base);
        if recording {
            let kv_heads = self.shape(k).dim(1);
            let name = match backend {
                SdpaBackend::Flash => "ScaledDotProductFlashAttentionBackward0",
                SdpaBackend::Cudnn => "ScaledDotProductCudnnAttentionBackward0",
                _ => "ScaledDotProductEfficientAttentionBackward0",
            };
            let scratch = sdpa_backward_scratch(backend, dtype, [b, h, t, hd], kv_heads);
            let node = self.new_node(
                name,
                BwdKind::Sdpa { scratch, causal },
                &[Some(q), Some(k), Some(v)],
            );
            self.save(node, "query", q, false);
            self.save(node, "key", k, false);
            self.save(node, "value", v, false);
            self.save(node, "output", out, true);
            if let Some(l) = lse {
                self.save(node, "logsumexp", l, true);
            }
            let (rng_name, unused_name) = if cudnn {
                ("philox_seed", "philox_offset")
            } else {
                ("rng_state", "unused")
            };
            if let Some(r) = rng {
                self.save(node, rng_name, r, true);
            }
            if let Some(u) = unused {
                self.save(node, unused_name, u, true);
            }
            self.set_grad_fn(out, node, 0);
        }
        for t in [lse, rng, unused].into_iter().flatten() {
            self.release(t);
        }
        Ok(out)
    }
}

/// What a fused SDPA backward allocates after its q, k, v gradients, for q
/// of `[B, h, T, hd]` in `dtype` and k, v of `kv_heads` heads (the engine's
/// attention and a traced program's both ask here).
pub(crate) fn sdpa_backward_scratch(
    backend: SdpaBackend,
    dtype: DType,
    [b, h, t, hd]: [u64; 4],
    kv_heads: u64,
) -> SdpaScratch {
    match backend {
        SdpaBackend::Flash => flash_scratch(b, h, t, hd, kv_heads, dtype.size()),
        SdpaBackend::Cudnn => SdpaScratch::Cudnn {
            workspace: cudnn_backward_workspace(b, h, t, hd, kv_heads, dtype.size()),
        },
        _ if dtype == DType::F32 => efficient_f32_scratch(b, h, t, hd),
        _ => SdpaScratch::Delta(b * h * t.div_ceil(32) * 32 * 4),
    }
}

/// The fp32 memory-efficient backward's scratch for q of [B, h, T, hd]
/// (`_efficient_attention_backward` on sm80 and later): delta through ATen
/// ops, then the kernel's workspace, B·h·(T′·⌈hd⌉₆₄ + 4·T′/64) fp32 with
/// the queries rounded to the kernel's block, T′ = ⌈T⌉₆₄ up to hd 64 and
/// ⌈T⌉₁₂₈ past it (its gQ accumulator across key splits and per-block
/// counters). Matches 324 backwards swept on an H100 (hd 32 to 128) and
/// every one of the captures (`tests/fixtures/attention/`).
fn efficient_f32_scratch(b: u64, h: u64, t: u64, hd: u64) -> SdpaScratch {
    let rows = b * t * h * 4;
    let block = if hd <= 64 { 64 } else { 128 };
    let queries = t.div_ceil(block) * block;
    SdpaScratch::EfficientF32 {
        product: rows * hd,
        rows,
        copy_delta: h > 1 && t > 1,
        workspace: b * h * (queries * hd.div_ceil(64) * 64 + 4 * (queries / 64)) * 4,
    }
}

/// What cuDNN's attention plans take from the caching allocator beyond
/// the frontend's own buffers, forward and backward: 256 B on the H100 with
/// PyTorch 2.11's cuDNN, for every shape captured (GPT d 64, B 8, h 8,
/// T 512; Qwen2.5 d 64, h 14, GQA; `tests/fixtures/pytorch/captured/
/// sdpa_default_fp16`, `llama_lora_finetune`). cuDNN's engine sizes it:
/// measured, not derived.
pub(crate) const CUDNN_PLAN_WORKSPACE: u64 = 256;

/// cuDNN attention's backward workspace for q of [B, h, T, hd] and k, v of
/// `kv_heads` heads (`run_cudnn_SDP_bprop` takes the graph's
/// `get_workspace_size()` from the caching allocator): the cuDNN frontend's
/// non-virtual tensors (`CompositeSDPABackwardNode::get_fe_workspace_size_node`:
/// `dQ_accum` [B, h, T, hd] fp32 and `softmax_sum` [B, h, T] fp32), then the
/// plan's. With fewer key/value heads the plan also holds the full-head dK
/// and dV [B, h, T, hd] in q's dtype that the graph reduces to `kv_heads`
/// (`dK_fullhead`, `dV_fullhead`, virtual in the frontend's graph) [inf:
/// the Qwen2.5 capture's 2·B·h·T·hd·2 bytes more].
fn cudnn_backward_workspace(b: u64, h: u64, t: u64, hd: u64, kv_heads: u64, elem: u64) -> u64 {
    let frontend = 4 * b * h * t * hd + 4 * b * h * t;
    let full_heads = if kv_heads != h {
        2 * b * h * t * hd * elem
    } else {
        0
    };
    frontend + full_heads + CUDNN_PLAN_WORKSPACE
}

/// FlashAttention-2's backward scratch for q of [B, h, T, hd] and k, v of
/// `kv_heads` heads (`mha_bwd`); see [`flash_scratch_mha`]. With fewer
/// key/value heads (GQA) `dk_expanded` and `dv_expanded` [B, T, h, hd] in
/// the inputs' dtype come first, summed into dk and dv at the end
/// (models.md §4.5).
fn flash_scratch(b: u64, h: u64, t: u64, hd: u64, kv_heads: u64, elem: u64) -> SdpaScratch {
    let mha = flash_scratch_mha(b, h, t, hd);
    match mha {
        SdpaScratch::Flash {
            softmax_d,
            dq_accum,
        } if kv_heads != h => SdpaScratch::FlashGqa {
            expanded: b * t * h * hd * elem,
            softmax_d,
            dq_accum,
        },
        other => other,
    }
}

/// FlashAttention-2's backward scratch for q of [B, h, T, hd] (`mha_bwd`):
/// rows rounded to 128 and the head to 32 (64 past 128). Matches 324
/// backwards swept on an H100 and the AMP captures.
fn flash_scratch_mha(b: u64, h: u64, t: u64, hd: u64) -> SdpaScratch {
    let t_rounded = t.div_ceil(128) * 128;
    let hd_rounded = if hd <= 128 {
        hd.div_ceil(32) * 32
    } else {
        hd.div_ceil(64) * 64
    };
    SdpaScratch::Flash {
        softmax_d: b * h * t_rounded * 4,
        dq_accum: b * t_rounded * h * hd_rounded * 4,
    }
}

/// Every backward of `tests/fixtures/attention/h100_sweep.tsv` (captured on
/// an H100) against the model: what it allocates after the q, k, v
/// gradients, in order.
#[cfg(test)]
mod h100_sweep {
    use super::*;
    use crate::engine::tests::sweep_rows;

    fn sequence(s: SdpaScratch) -> Vec<u64> {
        match s {
            SdpaScratch::Delta(bytes) => vec![bytes],
            SdpaScratch::Cudnn { workspace } => vec![workspace],
            SdpaScratch::FlashGqa {
                expanded,
                softmax_d,
                dq_accum,
            } => vec![expanded, expanded, softmax_d, dq_accum],
            SdpaScratch::Flash {
                softmax_d,
                dq_accum,
            } => vec![softmax_d, dq_accum],
            SdpaScratch::EfficientF32 {
                product,
                rows,
                copy_delta,
                workspace,
            } => {
                let mut v = vec![product, rows];
                if copy_delta {
                    v.push(rows);
                }
                v.push(workspace);
                v
            }
        }
    }

    #[test]
    fn every_swept_attention_backward_takes_the_modelled_scratch() {
        let mut checked = [0usize; 2];
        for f in sweep_rows("attention/h100_sweep.tsv") {
            let dims: Vec<u64> = f[1..5].iter().map(|d| d.parse().expect("a dim")).collect();
            let (b, h, t, hd) = (dims[0], dims[1], dims[2], dims[3]);
            let allocs: Vec<u64> = f[5]
                .split(' ')
                .map(|a| a.parse().expect("a size"))
                .collect();
            let (scratch, k) = match f[0].as_str() {
                "efficient_f32" => (efficient_f32_scratch(b, h, t, hd), 0),
                "flash_f16" => (flash_scratch_mha(b, h, t, hd), 1),
                other => panic!("unknown kernel {other}"),
            };
            // The q, k, v gradients first (each of q's size), then the scratch.
            let grad = b * h * t * hd * if k == 0 { 4 } else { 2 };
            assert_eq!(allocs[..3], [grad; 3], "{f:?}");
            assert_eq!(allocs[3..], sequence(scratch)[..], "{f:?}");
            checked[k] += 1;
        }
        assert_eq!(checked, [324, 324]);
    }
}
