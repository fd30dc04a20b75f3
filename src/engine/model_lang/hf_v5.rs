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

impl LangNet {
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
}
