//! What transformers 5.x's `LlamaModel`/`MistralModel`/`Qwen2Model.forward`
//! makes before the layers where 4.x made something else (transformers
//! 5.16.1's source; from 5.0 [inf: only 5.16.1 was read]), and how its
//! checkpointed layers hold the rotary tables.
//!
//! - `position_ids = torch.arange(T) + past_seen_tokens` then `unsqueeze(0)`
//!   (`modeling_qwen2.py:362-364`, `modeling_llama.py:388`,
//!   `modeling_mistral.py:361`): two int64 [T] tensors, the first gone at
//!   once; no `cache_position`.
//! - `create_causal_mask` (`masking_utils.py:935-937`, `_preprocess_mask_arguments`
//!   at 849-855): with no attention mask and no cache (training) it calls
//!   `find_packed_sequence_indices(position_ids.expand(B, -1))`
//!   (`masking_utils.py:749-757`): `position_ids[:, :1] - 1` [B, 1], the
//!   `prepend` cat [B, T+1] and `diff` [B, T] (int64), `!= 1` (bool) and its
//!   `cumsum` (int64), `[:, -1] == 0` [B] and `.all()` (bool), read on the
//!   host. On a GPU the positions of one unpacked sequence give `True`: it
//!   returns None and its locals go, and `sdpa_mask` returns None
//!   (`_ignore_causal_mask_sdpa`, `masking_utils.py:268-269`), so no mask is
//!   made and attention stays causal.
//! - Qwen2-MoE's forward also calls `create_sliding_window_causal_mask`
//!   (`modeling_qwen2_moe.py:493-496`) with `sliding_window` 0 when
//!   `use_sliding_window` is false (`configuration_qwen2_moe.py:111`), a
//!   mask no layer takes (every layer is `full_attention`). Its
//!   `_preprocess_mask_arguments` runs the packed-sequence check again
//!   without a cache (`masking_utils.py:854`); `sdpa_mask` cannot skip it,
//!   since the keys are at least the window (`_ignore_causal_mask_sdpa`,
//!   262-263), so it makes the four aranges (507-510: [B], [1], and
//!   `arange(T) + offset` twice, each arange gone once summed) and runs
//!   `and_masks(sliding_window_overlay(0), causal_mask_function)` on them
//!   (54-56): a 0-dim bool `new_ones`, `q_idx - 0` [T] int64 and `kv_idx >`
//!   it [T, T] bool (99; the difference gone), `result &` it (the overlay
//!   gone, then the 0-dim), `kv_idx <= q_idx` (80) and `result &` it (the
//!   comparison gone, then the first `&`); returning, its aranges go in
//!   their order. The [1, 1, T, T] bool it returns (expanded, a view) stays
//!   in `causal_mask_mapping`, a local of the model's forward, and goes as
//!   that forward returns, before `inputs_embeds` (the dict before
//!   `mask_kwargs` in the frame's locals).
//! - `GradientCheckpointingLayer.__call__` (`modeling_layers.py:113`) hands
//!   `torch.utils.checkpoint` a `partial` holding the keyword arguments
//!   (`position_embeddings`, `position_ids`): the recomputation reuses them
//!   instead of making its own, and they live while any checkpoint frame
//!   does (non-reentrant `recompute_fn` holds the partial), which is until
//!   backward releases the last region's saved tensors.

use super::build::LangNet;
use crate::engine::dtype::DType;
use crate::engine::error::Result;
use crate::engine::shape::Shape;
use crate::engine::tag::Category;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

impl Engine {
    /// `torch.arange(T) + past_seen_tokens`: the sum, [T] int64 (the arange
    /// gone).
    pub(super) fn v5_position_ids(&mut self, t: u64) -> Result<TensorId> {
        let arange = self.factory(Shape::new(&[t]), DType::I64, Category::Activation)?;
        let sum = self.act(Shape::new(&[t]), DType::I64);
        if let Ok(s) = sum {
            self.k_unary(arange, s);
        }
        self.release(arange);
        sum
    }

    /// `find_packed_sequence_indices` on [b, t] positions that hold one
    /// sequence each (see the module's notes): its temporaries, all gone
    /// when it returns None.
    pub(super) fn v5_find_packed(&mut self, b: u64, t: u64) -> Result<()> {
        self.in_op("find_packed_sequence_indices", |e| {
            e.v5_find_packed_inner(b, t)
        })
    }

    fn v5_find_packed_inner(&mut self, b: u64, t: u64) -> Result<()> {
        let i64s = |e: &mut Engine, dims: &[u64]| e.act(Shape::new(dims), DType::I64);
        let bools = |e: &mut Engine, dims: &[u64]| e.act(Shape::new(dims), DType::Bool);
        let first = i64s(self, &[b, 1])?;
        let cat = i64s(self, &[b, t + 1])?;
        let diff = i64s(self, &[b, t]);
        self.release(cat);
        let diff = diff?;
        let ne = bools(self, &[b, t])?;
        let cumsum = i64s(self, &[b, t]);
        self.release(ne);
        let cumsum = cumsum?;
        let last = bools(self, &[b])?;
        let all = self.act(Shape::scalar(), DType::Bool);
        self.release(last);
        self.release(all?);
        // `return None`: the frame's locals in co_varnames order.
        for local in [first, diff, cumsum] {
            self.release(local);
        }
        Ok(())
    }
}

impl Engine {
    /// `create_sliding_window_causal_mask` of `window` on [b, t] that no
    /// layer takes (see the module's notes): the packed-sequence check
    /// without a cache, then, where the keys are at least the window,
    /// `sdpa_mask`'s temporaries and the mask it returns (kept: the
    /// caller's). None when `sdpa_mask` skips it.
    pub(super) fn v5_unused_sliding_mask(
        &mut self,
        b: u64,
        t: u64,
        window: u64,
    ) -> Result<Option<TensorId>> {
        if !self.cfg.hf_use_cache {
            self.v5_find_packed(b, t)?;
        }
        if t < window {
            return Ok(None);
        }
        let op = self.op_begin("create_sliding_window_causal_mask");
        let mark = self.locals.len();
        let r = self.v5_sliding_mask_inner(b, t);
        if r.is_err() {
            self.unwind_locals(mark);
        }
        let end = self.op_end(op);
        let mask = r?;
        if let Err(err) = end {
            self.release(mask);
            return Err(err);
        }
        self.keep(mask);
        Ok(Some(mask))
    }

    fn v5_sliding_mask_inner(&mut self, b: u64, t: u64) -> Result<TensorId> {
        let i64s = |e: &mut Engine, n: u64| e.act(Shape::new(&[n]), DType::I64);
        let square = |e: &mut Engine| e.act(Shape::new(&[1, 1, t, t]), DType::Bool);
        // `arange(n) + offset`: the sum, the arange gone.
        let offset = |e: &mut Engine| -> Result<TensorId> {
            let arange = i64s(e, t)?;
            let sum = i64s(e, t);
            e.release(arange);
            sum
        };
        let batch = i64s(self, b)?;
        let head = i64s(self, 1)?;
        let q = offset(self)?;
        let kv = offset(self)?;
        // and_mask: `result = q_idx.new_ones((), dtype=torch.bool)`.
        let ones = self.act(Shape::scalar(), DType::Bool)?;
        // sliding_window_overlay(0): `kv_idx > q_idx - 0`.
        let shifted = i64s(self, t)?;
        let overlay = square(self);
        self.release(shifted);
        let overlay = overlay?;
        let first = square(self);
        self.release(overlay);
        self.release(ones);
        let first = first?;
        // causal_mask_function: `kv_idx <= q_idx`.
        let causal = square(self)?;
        let mask = square(self);
        self.release(causal);
        self.release(first);
        let mask = mask?;
        for local in [batch, head, q, kv] {
            self.release(local);
        }
        Ok(mask)
    }
}

impl LangNet {
    /// The model's forward returns: its unused sliding-window mask
    /// (`causal_mask_mapping`) goes.
    pub(super) fn end_sliding_mask(&self, e: &mut Engine) {
        if let Some(mask) = self.run_state.sliding_mask.take() {
            e.decref(mask);
        }
    }

    /// Whether this forward's rotary context is handed to the checkpoint
    /// frames (5.x, regions alive) rather than dropped at the forward's end.
    pub(super) fn v5_holds_rope(&self, e: &Engine) -> bool {
        let on_graph = self.run_state.rope_on_graph.replace(false);
        e.cfg.hf_v5() && !e.ckpt.rebuilding() && (on_graph || !e.ckpt.regions.is_empty())
    }

    /// The forward's end under [`LangNet::v5_holds_rope`]: the context's
    /// handles move to the checkpoint state (`Engine::ckpt_hold`).
    pub(super) fn v5_hold_rope(&self, e: &mut Engine) {
        if let Some(c) = self.run_state.rope.take() {
            e.ckpt_hold(c.handles());
        }
    }

    /// A reentrant region `out` came from under 5.x: `CheckpointFunction`'s
    /// ctx keeps `run_function` (the `partial` with the keyword arguments)
    /// until its Node goes (torch/utils/checkpoint.py `CheckpointFunction.forward`:
    /// `ctx.run_function = run_function`), so the Node holds the rotary
    /// context.
    pub(super) fn v5_rope_on_node(&self, e: &mut Engine, out: TensorId) {
        if !e.cfg.hf_v5() {
            return;
        }
        let (Some(c), Some(node)) = (self.run_state.rope.get(), e.grad_fn(out)) else {
            return;
        };
        for h in c.handles() {
            e.keep_on_ctx(node, h);
        }
        self.run_state.rope_on_graph.set(true);
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::tests::*;
    use crate::engine::{Engine, EngineConfig};

    fn with_cache(hf_use_cache: bool) -> Engine {
        let mut e = Engine::bare(EngineConfig {
            hf_use_cache,
            ..EngineConfig::default()
        })
        .expect("engine");
        e.take_events();
        e
    }

    #[test]
    fn find_packed_makes_its_temporaries_and_keeps_none() {
        let mut e = Engine::bare(EngineConfig::default()).expect("engine");
        e.take_events();
        e.v5_find_packed(4, 512).expect("runs");
        let r = requests(&e.take_events());
        // position_ids[:, :1] - 1; the prepend cat, diff, the cat gone;
        // != 1, cumsum, != gone; [:, -1] == 0, .all(), both gone; then the
        // three locals.
        assert_eq!(
            r,
            vec![32, 16416, 16384, -16416, 2048, 16384, -2048, 4, 1, -4, -1, -32, -16384, -16384]
        );
    }

    #[test]
    fn an_unused_sliding_mask_of_window_0_makes_its_temporaries_and_keeps_the_mask() {
        // B 2, T 32, with a DynamicCache (no packed-sequence check,
        // masking_utils.py:854). sdpa_mask (507-510): arange(2) [16 B],
        // arange(1) [8 B], arange(32) + 0 twice (the aranges gone);
        // and_mask (54-56): new_ones () bool; `q_idx - 0` [T] int64, `kv_idx >`
        // it [1, 1, T, T] bool (99), the difference gone; `result &` it, the
        // overlay gone, then the 0-dim; `kv_idx <= q_idx` (80), `result &` it,
        // the comparison gone, then the first `&`; then the aranges.
        let mut e = with_cache(true);
        let mask = e.v5_unused_sliding_mask(2, 32, 0).expect("runs");
        let r = requests(&e.take_events());
        assert_eq!(
            r,
            vec![
                16, 8, 256, 256, -256, 256, 256, -256, 1, 256, 1024, -256, 1024, -1024, -1, 1024,
                1024, -1024, -1024, -16, -8, -256, -256
            ]
        );
        let mask = mask.expect("the keys are at least the window: a mask");
        assert_eq!(e.gpu_bytes(mask), 32 * 32);
        assert!(e.locals.is_empty(), "the mask is the caller's, no local");
        e.decref(mask);
        assert_eq!(requests(&e.take_events()), vec![-1024]);
    }

    #[test]
    fn a_window_above_the_keys_makes_no_mask_and_no_cache_checks_packing_again() {
        // `_ignore_causal_mask_sdpa` (masking_utils.py:262-263): keys fewer
        // than the window, no mask.
        let mut e = with_cache(true);
        assert_eq!(e.v5_unused_sliding_mask(2, 32, 64).expect("runs"), None);
        assert_eq!(requests(&e.take_events()), Vec::<i64>::new());
        // Without a cache `_preprocess_mask_arguments` checks the positions
        // for packing (854) before sdpa_mask: find_packed's requests first.
        let mut packed = with_cache(false);
        packed.v5_find_packed(2, 32).expect("runs");
        let check = requests(&packed.take_events());
        let mut e = with_cache(false);
        assert_eq!(e.v5_unused_sliding_mask(2, 32, 64).expect("runs"), None);
        assert_eq!(requests(&e.take_events()), check);
        let mask = e.v5_unused_sliding_mask(2, 32, 0).expect("runs");
        let r = requests(&e.take_events());
        assert_eq!(r[..check.len()], check[..]);
        assert_eq!(r[check.len()..check.len() + 2], [16, 8]);
        assert!(mask.is_some());
    }
}
