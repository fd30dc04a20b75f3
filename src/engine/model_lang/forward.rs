//! The language's forward: each built node run on the engine's ops, with
//! Python's lifetimes (`x = layer(x)` drops the old `x` once the new one
//! exists; a saved tensor outlives its handle).

use std::ops::Range;

use super::build::{LangNet, Node};
use crate::engine::error::Result;
use crate::engine::shape::Shape;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

impl LangNet {
    /// `model(x)`: a new handle; `x` stays the caller's.
    pub(crate) fn forward(&self, e: &mut Engine, x: TensorId) -> Result<TensorId> {
        self.run(e, self.root, x)
    }

    /// Checkpoint recomputation (engine.md §7.2): the regions numbered
    /// `sites`, in order, from `x` (not released; every later intermediate is).
    pub(crate) fn run_sites(
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
            Node::Linear(l) => e.apply_linear(l, x),
            Node::Unary { op, module } => e.in_module(*module, |e| e.unary(*op, x)),
            Node::InplaceRelu { module } => {
                e.in_module(*module, |e| e.relu_(x))?;
                Ok(e.local_ref(x))
            }
            Node::Dropout { p, module } => e.in_module(*module, |e| e.dropout(x, *p)),
            Node::Embedding(m) => e.in_module(m.module, |e| e.embedding(m.w, x)),
            Node::LayerNorm(l) => e.apply_layer_norm(l, x),
            Node::Residual(inner) => {
                let y = self.run(e, *inner, x)?;
                let out = e.add(x, y);
                e.release(y);
                out
            }
            Node::Conv(c) => e.apply_conv(c, x),
            Node::BatchNorm(n) => e.apply_bn(n, x),
            Node::MaxPool {
                k,
                stride,
                pad,
                module,
            } => e.in_module(*module, |e| e.max_pool2d(x, *k, *stride, *pad)),
            Node::AvgPool { module } => e.in_module(*module, |e| e.adaptive_avg_pool2d(x)),
            Node::Flatten { module } => {
                let s = e.shape(x);
                let rest = s.dims().iter().skip(1).product::<u64>();
                e.in_module(*module, |e| e.reshape(x, Shape::new(&[s.dim(0), rest])))
            }
            Node::BasicBlock(b) => e.in_module(b.module, |e| b.forward(e, x)),
            Node::Bottleneck(b) => b.forward(e, x),
            Node::Checkpoint {
                site,
                inner,
                reentrant,
            } => self.checkpoint(e, *site, *inner, *reentrant, x),
        }
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
            return e.reentrant_region(site..site + 1, x, |e, x| self.run(e, inner, x));
        }
        e.ckpt_begin(site..site + 1, x);
        let y = self.run(e, inner, x);
        e.ckpt_end();
        y
    }
}
