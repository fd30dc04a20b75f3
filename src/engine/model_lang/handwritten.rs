//! The forward of the modules a student writes op for op (issue 42):
//! `Softmax(Manual)`, `SigmoidMul`, `CausalMask`, `MaskedAttention`,
//! `Positions`, and the `Frame` whose end frees what their ops keep as
//! Python locals. Each op is one of the engine's (ops/handwritten.rs,
//! ops/elementwise.rs), so it saves what PyTorch's autograd saves for it.

use std::cell::RefCell;

use super::build::LangNet;
use super::spec::SoftmaxKind;
use crate::engine::autograd::BwdKind;
use crate::engine::error::{EngineError, Result};
use crate::engine::modules::Linear;
use crate::engine::ops::elementwise::Unary;
use crate::engine::shape::Shape;
use crate::engine::tensor::{Layout, TensorId};
use crate::engine::Engine;

/// A built `MaskedAttention`.
#[derive(Debug)]
pub(crate) struct MaskedAttn {
    pub module: u32,
    pub qkv: Linear,
    pub proj: Linear,
    pub heads: u64,
    pub softmax: SoftmaxKind,
}

/// Per-forward state of the hand-written modules.
#[derive(Debug, Default)]
pub(crate) struct HandRun {
    /// This forward's causal mask (a `CausalMask` made it).
    pub mask: RefCell<Option<TensorId>>,
    /// The locals of each open `Frame`, innermost last.
    pub frames: RefCell<Vec<Vec<TensorId>>>,
}

impl LangNet {
    /// `mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)` for this
    /// forward; `x` (ids or activations [B, T, …]) passes through.
    pub(super) fn causal_mask(&self, e: &mut Engine, module: u32, x: TensorId) -> Result<TensorId> {
        let t = e.shape(x).dim(1);
        let mask = e.in_module(module, |e| e.causal_bool_mask(t))?;
        e.keep(mask);
        if let Some(old) = self.hand.mask.replace(Some(mask)) {
            e.decref(old);
        }
        Ok(e.local_ref(x))
    }

    /// The end of a forward: the model's `mask` local goes (the
    /// `masked_fill`s that saved it keep it for backward).
    pub(crate) fn end_mask(&self, e: &mut Engine) {
        if let Some(m) = self.hand.mask.take() {
            e.decref(m);
        }
    }

    /// A `Frame` opens: the locals of the ops inside it are its own.
    pub(super) fn open_frame(&self) {
        self.hand.frames.borrow_mut().push(Vec::new());
    }

    /// A `Frame` returns: its locals go in the order they were bound
    /// (Python clears a frame's fast locals in declaration order).
    pub(super) fn close_frame(&self, e: &mut Engine) {
        let locals = self.hand.frames.borrow_mut().pop().unwrap_or_default();
        for t in locals {
            e.release(t);
        }
    }

    /// Locals a hand-written module keeps: the innermost frame's until it
    /// returns, or freed now without one.
    fn hold(&self, e: &mut Engine, locals: Vec<TensorId>) {
        match self.hand.frames.borrow_mut().last_mut() {
            Some(f) => f.extend(locals),
            None => {
                for t in locals {
                    e.release(t);
                }
            }
        }
    }

    /// `MaskedAttention`'s forward on `x` [B, T, hidden] (spec.rs).
    pub(super) fn masked_attention(
        &self,
        e: &mut Engine,
        a: &MaskedAttn,
        x: TensorId,
    ) -> Result<TensorId> {
        let mask = (*self.hand.mask.borrow()).ok_or_else(|| {
            EngineError::Program("a MaskedAttention needs a CausalMask before it".into())
        })?;
        let s = e.shape(x);
        let (b, t, d) = (s.dim(0), s.dim(1), s.last());
        let hd = d / a.heads.max(1);
        let mut locals = Vec::new();
        let r = e.in_module(a.module, |e| {
            attention_body(e, a, x, mask, [b, t, d, hd], &mut locals)
        });
        self.hold(e, locals);
        r
    }

    /// `x + self.pos[:t]`: a slice of the model's own parameter, added. Its
    /// SliceBackward0 (2.11's generated Functions.h line 6060, saving sizes
    /// only) makes a zeros of the parameter's shape and copies the (summed)
    /// gradient into it: `slice_backward` in derivatives.yaml `slice.Tensor`.
    pub(super) fn positions(
        &self,
        e: &mut Engine,
        slot: usize,
        module: u32,
        x: TensorId,
    ) -> Result<TensorId> {
        let pos = *self
            .own_params
            .get(slot)
            .ok_or_else(|| EngineError::Program("Positions: its parameter was not built".into()))?;
        let s = e.shape(x);
        let rows = Shape::new(&[s.dim(1), s.last()]);
        e.in_module(module, |e| {
            let v = e.view_with_node(
                pos,
                rows,
                Layout::Contiguous,
                "SliceBackward0",
                BwdKind::Alloc,
            );
            let out = e.add(x, v);
            e.release(v);
            out
        })
    }
}

/// The attention's statements; every tensor a Python local names goes to
/// `locals` (qkv's output through q, k, v; the masked scores; `att`).
fn attention_body(
    e: &mut Engine,
    a: &MaskedAttn,
    x: TensorId,
    mask: TensorId,
    [b, t, d, hd]: [u64; 4],
    locals: &mut Vec<TensorId>,
) -> Result<TensorId> {
    // q, k, v = self.qkv(h).split(D, dim=-1)
    let qkv = e.apply_linear(&a.qkv, x)?;
    let parts = e.split_last(qkv, 3);
    e.release(qkv);
    // (z.view(b, t, H, hd).transpose(1, 2) for z in (q, k, v))
    // q's and v's gradients come back laid out [B, h, T, hd] (bmm's, through
    // the transposes), so view()'s backward copies them to reshape them to
    // [B, T, h·hd] unless h or T is 1; k's comes back as kᵀ's, whose strides
    // merge (as GPT's math path, modules/gpt2.rs).
    let heads = Shape::new(&[b, t, a.heads, hd]);
    let relayout = a.heads > 1 && t > 1;
    let mut qkv_heads = Vec::with_capacity(3);
    for (i, p) in parts.into_iter().enumerate() {
        let v = if relayout && i != 1 {
            e.view_with_node(p, heads, Layout::Strided, "ViewBackward0", BwdKind::Alloc)
        } else {
            e.view_as(p, heads, Layout::Strided)
        };
        e.release(p);
        qkv_heads.push(e.transpose(v, 1, 2));
        e.release(v);
    }
    let (q, k, v) = (qkv_heads[0], qkv_heads[1], qkv_heads[2]);
    locals.extend([q, k, v]);
    // scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
    let kt = e.transpose(k, 2, 3);
    let raw = e.bmm_4d(q, q, kt, k);
    e.release(kt);
    let raw = raw?;
    let scaled = e.div_scalar(raw);
    e.release(raw);
    // scores = scores.masked_fill(mask, float("-inf"))
    let scaled = scaled?;
    let scores = e.masked_fill(scaled, mask);
    e.release(scaled);
    let scores = scores?;
    locals.push(scores);
    // att = softmax(scores) @ v
    let probs = softmax(e, a.softmax, scores)?;
    let att = e.bmm_4d(probs, probs, v, v);
    e.release(probs);
    let att = att?;
    locals.push(att);
    // self.proj(att.transpose(1, 2).reshape(b, t, D))
    let at = e.transpose(att, 1, 2);
    let flat = e.reshape(at, Shape::new(&[b, t, d]));
    e.release(at);
    let flat = flat?;
    let y = e.apply_linear(&a.proj, flat);
    e.release(flat);
    y
}

/// A softmax over the last dimension, fused or written by hand.
pub(super) fn softmax(e: &mut Engine, kind: SoftmaxKind, x: TensorId) -> Result<TensorId> {
    match kind {
        SoftmaxKind::Fused => e.softmax(x, false),
        SoftmaxKind::Manual => manual_softmax(e, x),
    }
}

/// `e = torch.exp(x - x.max(dim=-1, keepdim=True).values)`; `e / e.sum(dim=-1, keepdim=True)`.
fn manual_softmax(e: &mut Engine, x: TensorId) -> Result<TensorId> {
    let m = e.max_last_keepdim(x)?;
    let shifted = e.sub(x, m);
    e.release(m);
    let shifted = shifted?;
    let ex = e.unary(Unary::Exp, shifted);
    e.release(shifted);
    let ex = ex?;
    let s = match e.sum_last_keepdim(ex) {
        Ok(s) => s,
        Err(err) => {
            e.release(ex);
            return Err(err);
        }
    };
    let out = e.div(ex, s);
    e.release(s);
    e.release(ex);
    out
}

/// `x * torch.sigmoid(x)`.
pub(super) fn sigmoid_mul(e: &mut Engine, x: TensorId) -> Result<TensorId> {
    let s = e.unary(Unary::Sigmoid, x)?;
    let y = e.mul(x, s);
    e.release(s);
    y
}
