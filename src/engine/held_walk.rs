//! The autograd graph laid out compactly for the walks of one live state:
//! each Node's edges and live saved storages in flat arrays, built in one
//! pass, then one walk per root with a stamp for marks (nothing cleared or
//! allocated per root). The cost of a live state is then linear in what
//! the roots reach, and the walks touch a few bytes per Node, not the
//! Nodes themselves (issue 39: 1,601 retained graphs).
//!
//! An `AccumulateGrad` holds its leaf strongly (engine.md §0.3), and the
//! leaf holds its `.grad`: where nothing else holds them (no variable, no
//! model), the graphs that reach the accumulator are what keeps them, as
//! they keep saved tensors. A leaf a parameter or a name holds has other
//! references and is never counted here.

use super::tensor::TensorId;
use super::Engine;

pub(crate) struct Walk {
    /// Per Node id: where its edges and its live saved storages start in
    /// `edges` / `saved` (one past the last id: the ends).
    edges_at: Vec<u32>,
    edges: Vec<u32>,
    saved_at: Vec<u32>,
    saved: Vec<u32>,
    /// Per Node id: the storages of its leaf and the leaf's `.grad` that
    /// only this `AccumulateGrad` keeps alive (empty for other Nodes).
    leaves_at: Vec<u32>,
    leaves: Vec<u32>,
    iteration: Vec<u32>,
    /// Bit 0: an `AccumulateGrad`; bit 1: it has saved slots (live or not).
    flags: Vec<u8>,
    node_mark: Vec<u32>,
    storage_mark: Vec<u32>,
    stamp: u32,
}

/// What one root's grad_fn reaches.
pub(crate) struct Reach {
    pub nodes: Vec<u32>,
    pub saved: Vec<u32>,
    /// Storages of leaves (and their `.grad`) that only the reached
    /// `AccumulateGrad`s keep alive, not already in `saved`.
    pub leaves: Vec<u32>,
    /// The earliest iteration of a reached Node other than `AccumulateGrad`.
    pub oldest: Option<u32>,
    /// Reached Nodes whose saved slots are all released.
    pub spent: usize,
}

const ACCUMULATE: u8 = 1;
const HAS_SAVED: u8 = 2;

impl Walk {
    pub(crate) fn new(e: &Engine) -> Walk {
        let n = e.nodes.id_bound();
        let mut w = Walk {
            edges_at: Vec::with_capacity(n + 1),
            edges: Vec::new(),
            saved_at: Vec::with_capacity(n + 1),
            saved: Vec::new(),
            leaves_at: Vec::with_capacity(n + 1),
            leaves: Vec::new(),
            iteration: vec![0; n],
            flags: vec![0; n],
            node_mark: vec![0; n],
            storage_mark: vec![0; e.storages.id_bound()],
            stamp: 0,
        };
        for id in 0..n {
            w.edges_at.push(w.edges.len() as u32);
            w.saved_at.push(w.saved.len() as u32);
            w.leaves_at.push(w.leaves.len() as u32);
            let Some(node) = e.nodes.get(id as u32) else {
                continue;
            };
            w.iteration[id] = node.iteration;
            let mut f = 0;
            if node.name == "AccumulateGrad" {
                f |= ACCUMULATE;
                if let Some(leaf) = node.leaf {
                    w.leaves
                        .extend(e.held_only_by_accumulator(leaf).into_iter().flatten());
                }
            }
            if !node.saved.is_empty() {
                f |= HAS_SAVED;
            }
            w.flags[id] = f;
            w.edges
                .extend(node.inputs.iter().filter_map(|m| m.edge.map(|e| e.node.0)));
            w.saved
                .extend(node.saved.iter().filter_map(|s| s.storage.map(|s| s.0)));
        }
        w.edges_at.push(w.edges.len() as u32);
        w.saved_at.push(w.saved.len() as u32);
        w.leaves_at.push(w.leaves.len() as u32);
        w
    }

    /// Every storage some `AccumulateGrad` alone keeps alive (a leaf or its
    /// `.grad`), by id.
    pub(crate) fn leaf_storages(&self) -> &[u32] {
        &self.leaves
    }

    /// The Nodes reachable from `start` and the live saved storages they hold.
    pub(crate) fn reach(&mut self, start: Option<u32>) -> Reach {
        self.stamp += 1;
        let stamp = self.stamp;
        let mut out = Reach {
            nodes: Vec::new(),
            saved: Vec::new(),
            leaves: Vec::new(),
            oldest: None,
            spent: 0,
        };
        let mut stack: Vec<u32> = start.into_iter().collect();
        while let Some(n) = stack.pop() {
            let i = n as usize;
            if i >= self.node_mark.len() || self.node_mark[i] == stamp {
                continue;
            }
            self.node_mark[i] = stamp;
            out.nodes.push(n);
            if self.flags[i] & ACCUMULATE == 0 {
                let it = self.iteration[i];
                out.oldest = Some(out.oldest.map_or(it, |o| o.min(it)));
            }
            let slots = &self.saved[self.saved_at[i] as usize..self.saved_at[i + 1] as usize];
            if slots.is_empty() && self.flags[i] & HAS_SAVED != 0 {
                out.spent += 1;
            }
            for &s in slots {
                if mark_storage(&mut self.storage_mark, s, stamp) {
                    out.saved.push(s);
                }
            }
            let held = &self.leaves[self.leaves_at[i] as usize..self.leaves_at[i + 1] as usize];
            for &s in held {
                if mark_storage(&mut self.storage_mark, s, stamp) {
                    out.leaves.push(s);
                }
            }
            stack.extend_from_slice(
                &self.edges[self.edges_at[i] as usize..self.edges_at[i + 1] as usize],
            );
        }
        out
    }
}

/// Mark storage `s` for the walk of `stamp`; false when it already was.
fn mark_storage(mark: &mut Vec<u32>, s: u32, stamp: u32) -> bool {
    let j = s as usize;
    if j >= mark.len() {
        mark.resize(j + 1, 0);
    }
    let fresh = mark[j] != stamp;
    mark[j] = stamp;
    fresh
}

impl Engine {
    /// The storages of `leaf` and of its `.grad` that nothing but the
    /// leaf's `AccumulateGrad` keeps alive: the leaf's one reference is the
    /// accumulator's, its `.grad`'s one is the leaf's, and each storage has
    /// no other tensor on it and no engine reference.
    pub(super) fn held_only_by_accumulator(&self, leaf: TensorId) -> [Option<u32>; 2] {
        let alone = |t: TensorId| {
            let x = self.tensors.get(t.0)?;
            let s = self.storages.get(x.storage.0)?;
            (x.refs == 1 && s.tensor_refs == 1 && s.engine_refs == 0).then_some(x.storage.0)
        };
        let Some(own) = alone(leaf) else {
            return [None, None];
        };
        let grad = self
            .tensors
            .get(leaf.0)
            .and_then(|x| x.grad)
            .and_then(alone);
        [Some(own), grad]
    }
}
