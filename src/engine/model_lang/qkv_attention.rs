//! `QkvAttention`: the causal self-attention with one fused `qkv`
//! projection and SDPA that small hand-written models use (the MoE capture's
//! blocks). `kinds.rs` calls what is here, one function per concern.

use super::build::display;
use super::check::Problem;
use super::count::params;
use super::kinds::{Args, Fault};
use super::shape::{attention_input, Sig};
use super::spec::join;
use crate::engine::config::SdpaBackend;
use crate::engine::error::{EngineError, Result};
use crate::engine::modules::Linear;
use crate::engine::shape::Shape;
use crate::engine::tensor::{Layout, TensorId};
use crate::engine::Engine;

/// A built `QkvAttention`.
#[derive(Debug)]
pub(crate) struct QkvAttn {
    pub module: u32,
    pub qkv: Linear,
    pub proj: Linear,
    pub heads: u64,
}

/// Concern 1: `QkvAttention`'s arguments: `qkv` and `proj` with biases.
pub(crate) fn qkv_args(hidden: u64, heads: u64) -> Args {
    let n = hidden
        .saturating_mul(hidden)
        .saturating_mul(4)
        .saturating_add(hidden.saturating_mul(4));
    Args {
        dims: vec![("hidden", hidden, 1), ("heads", heads, 1)],
        probabilities: Vec::new(),
        counts: params(n),
        modules: 3,
    }
}

/// Concern 3: `qkv`, then `proj`.
pub(crate) fn build_qkv(
    e: &mut Engine,
    path: &str,
    hidden: u64,
    heads: u64,
    params: &mut Vec<TensorId>,
) -> Result<QkvAttn> {
    let module = e.tags.module(path);
    let qkv = e.new_linear(
        &join(path, "qkv"),
        hidden,
        hidden.saturating_mul(3),
        true,
        params,
    )?;
    let proj = e.new_linear(&join(path, "proj"), hidden, hidden, true, params)?;
    if heads == 0 {
        return Err(EngineError::Program(format!(
            "{}: QkvAttention needs at least one head",
            display(path)
        )));
    }
    Ok(QkvAttn {
        module,
        qkv,
        proj,
        heads,
    })
}

/// Concern 4: `q, k, v = self.qkv(x).split(D, dim=-1)`, each
/// `.view(b, t, H, D // H).transpose(1, 2)`, `F.scaled_dot_product_attention(
/// q, k, v, is_causal=True)`, `self.proj(att.transpose(1, 2).reshape(b, t, D))`
/// (nanoGPT's `CausalSelfAttention` without dropout, as `modules/gpt2.rs`
/// runs it).
pub(crate) fn qkv_attention(e: &mut Engine, a: &QkvAttn, x: TensorId) -> Result<TensorId> {
    e.in_module(a.module, |e| {
        let s = e.shape(x);
        let (b, t, d) = (s.dim(0), s.dim(1), s.last());
        let hd = d / a.heads.max(1);
        let qkv = e.apply_linear(&a.qkv, x)?;
        let parts = e.split_last(qkv, 3);
        // The math backend hands q's and v's gradients back laid out
        // [B, h, T, hd], so view()'s backward copies them (modules/gpt2.rs).
        let math = e.cfg.sdpa_backend == Some(SdpaBackend::Math);
        let relayout = math && a.heads > 1 && t > 1;
        let heads_shape = Shape::new(&[b, t, a.heads, hd]);
        let mut heads = Vec::with_capacity(3);
        for (i, p) in parts.into_iter().enumerate() {
            let v = if relayout && i != 1 {
                e.view_with_node(
                    p,
                    heads_shape,
                    Layout::Strided,
                    "ViewBackward0",
                    crate::engine::autograd::BwdKind::Alloc,
                )
            } else {
                e.view_as(p, heads_shape, Layout::Strided)
            };
            e.release(p);
            heads.push(e.transpose(v, 1, 2));
            e.release(v);
        }
        let y = e.sdpa(heads[0], heads[1], heads[2], 0.0, true);
        for h in heads {
            e.release(h);
        }
        let y = match y {
            Ok(y) => y,
            Err(err) => {
                e.release(qkv);
                return Err(err);
            }
        };
        let yt = if relayout {
            let tv = e.transpose(y, 1, 2);
            let c = e.contiguous(tv);
            e.release(tv);
            c
        } else {
            Ok(e.view_as(y, heads_shape, Layout::Contiguous))
        };
        e.release(y);
        let r = yt.and_then(|yt| {
            let yv = e.view_as(yt, Shape::new(&[b, t, d]), Layout::Contiguous);
            e.release(yt);
            let o = e.apply_linear(&a.proj, yv);
            e.release(yv);
            o
        });
        // q, k, v (views of qkv's output) are the forward's locals until it returns.
        e.release(qkv);
        r
    })
}

/// Concern 2: `QkvAttention` takes `[B, T, hidden]`, `hidden` a multiple of `heads`.
pub(crate) fn qkv_out_shape(hidden: u64, heads: u64, x: &Sig) -> std::result::Result<Sig, Fault> {
    if !hidden.is_multiple_of(heads.max(1)) {
        return Err((
            Some("heads"),
            Problem::HiddenNotMultipleOfHeads { hidden, heads },
        ));
    }
    attention_input("QkvAttention", hidden, x).map_err(|e| (None, Problem::Shape(e)))
}
