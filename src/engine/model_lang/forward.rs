//! The language's forward: each built node run on the engine's ops, with
//! Python's lifetimes (`x = layer(x)` drops the old `x` once the new one
//! exists; a saved tensor outlives its handle).

use std::ops::Range;

use super::build::{LangNet, Node};
use crate::engine::error::Result;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

impl LangNet {
    /// `model(x)`: a new handle; `x` stays the caller's.
    pub(crate) fn forward(&self, e: &mut Engine, x: TensorId) -> Result<TensorId> {
        let y = self.run(e, self.root, x);
        // The output (`CausalLMOutputWithPast`) holds the DynamicCache.
        let windows = self.run_state.cache_windows.take();
        match &y {
            Ok(out) => e.hold_with(*out, windows),
            Err(_) => windows.into_iter().for_each(|w| e.decref(w)),
        }
        self.end_sliding_mask(e);
        if self.v5_holds_rope(e) {
            self.v5_hold_rope(e);
        } else {
            self.end_rope(e);
        }
        self.end_mask(e);
        y
    }

    /// Checkpoint recomputation (engine.md §7.2): the regions numbered
    /// `sites`, in order, from `x` (not released; every later intermediate is).
    pub(crate) fn run_sites(
        &self,
        e: &mut Engine,
        sites: Range<usize>,
        x: TensorId,
    ) -> Result<TensorId> {
        let r = self.run_sites_inner(e, sites, x);
        self.end_sliding_mask(e);
        self.end_rope(e);
        self.end_mask(e);
        r
    }

    fn run_sites_inner(
        &self,
        e: &mut Engine,
        sites: Range<usize>,
        x: TensorId,
    ) -> Result<TensorId> {
        let mut cur: Option<TensorId> = None;
        for s in sites {
            let Some(&inner) = self.sites.get(s) else {
                continue;
            };
            let y = self.run(e, inner, cur.unwrap_or(x));
            if let Some(prev) = cur {
                e.release(prev);
            }
            cur = Some(y?);
        }
        Ok(cur.unwrap_or_else(|| e.local_ref(x)))
    }

    fn run(&self, e: &mut Engine, i: usize, x: TensorId) -> Result<TensorId> {
        match &self.nodes[i] {
            Node::Seq(children) => {
                let mut h = e.local_ref(x);
                for &c in children {
                    let y = self.run(e, c, h);
                    h = e.rebind(h, y)?;
                }
                Ok(h)
            }
            Node::Residual(inner) => {
                let y = self.run(e, *inner, x)?;
                let out = e.add(x, y);
                e.release(y);
                out
            }
            Node::HfModel(inner) => self.hf_model(e, *inner, x),
            Node::Frame(inner) => {
                self.open_frame();
                let y = self.run(e, *inner, x);
                self.close_frame(e);
                y
            }
            Node::Checkpoint {
                site,
                inner,
                reentrant,
            } => self.checkpoint(e, *site, *inner, *reentrant, x),
            Node::Leaf(leaf) => self.run_leaf(e, leaf, x),
        }
    }

    /// `Module::HfModel`: the body's children in order, the first one's
    /// output (`inputs_embeds`) kept to the end; then the frame's locals go:
    /// an unused sliding-window mask, that output, the positions and the
    /// rotary tables (handed to the
    /// checkpoint frames under 5.x, as at a forward's end).
    fn hf_model(&self, e: &mut Engine, inner: usize, x: TensorId) -> Result<TensorId> {
        let Node::Seq(children) = &self.nodes[inner] else {
            return self.run(e, inner, x);
        };
        let Some((&first, rest)) = children.split_first() else {
            return Ok(e.local_ref(x));
        };
        let embeds = self.run(e, first, x)?;
        let mut out = Ok(e.local_ref(embeds));
        for &c in rest {
            let Ok(h) = out else { break };
            let y = self.run(e, c, h);
            out = e.rebind(h, y);
        }
        // The frame's locals: `causal_mask_mapping`, then `mask_kwargs`
        // (`inputs_embeds`, `position_ids`).
        self.end_sliding_mask(e);
        e.release(embeds);
        if self.v5_holds_rope(e) {
            self.v5_hold_rope(e);
        } else {
            self.end_rope(e);
        }
        out
    }

    /// `checkpoint(inner, x, use_reentrant=reentrant)` (engine.md §7, models.md §9).
    fn checkpoint(
        &self,
        e: &mut Engine,
        site: usize,
        inner: usize,
        reentrant: bool,
        x: TensorId,
    ) -> Result<TensorId> {
        if reentrant {
            let out = e.reentrant_region(site..site + 1, x, |e, x| self.run(e, inner, x))?;
            self.v5_rope_on_node(e, out);
            return Ok(out);
        }
        e.ckpt_begin(site..site + 1, x);
        let y = self.run(e, inner, x);
        e.ckpt_end();
        y
    }
}
