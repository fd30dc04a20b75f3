//! Non-reentrant activation checkpointing (engine.md §7): inside a region every
//! saved tensor becomes a placeholder; the first backward Node that needs one
//! re-runs the region (with its autocast state) and takes the recomputed
//! tensors from the region's buffer. Recomputation stops early once every
//! tensor the region saved has been produced (`early_stop=True`).

use std::ops::Range;

use rustc_hash::FxHashMap;

use crate::engine::autograd::NodeId;
use crate::engine::dtype::DType;
use crate::engine::error::{EngineError, Result};
use crate::engine::storage::StorageId;
use crate::engine::tensor::{TensorId, VersionCounter};
use crate::engine::Engine;

#[derive(Debug, Clone)]
pub(crate) struct Region {
    /// The region's inputs, kept for recomputation (strong).
    pub inputs: Vec<TensorId>,
    /// Which model blocks to re-run, in order.
    pub blocks: Range<usize>,
    pub amp: Option<DType>,
    /// Number of saves the region made in forward.
    pub total: u32,
    pub buffer: Vec<Option<StorageId>>,
    pub recomputed: bool,
    /// Saved slots packed in forward and not yet released. PyTorch's frame
    /// (and with it the inputs and the recomputed tensors) is held only by
    /// the hooks of those SavedVariables, and `reset_data()` drops them as
    /// backward releases each Node's variables: the region dies with the last
    /// one, not with the graph.
    pub live_packs: u32,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct CheckpointState {
    pub regions: FxHashMap<u32, Region>,
    next: u32,
    active: Option<u32>,
    counter: u32,
    /// (region, saves so far) while recomputing.
    recompute: Option<(u32, u32)>,
    /// Reentrant recomputations in progress (nested backwards).
    pub reentrant: u32,
    /// What checkpointed layers hold beyond their inputs: transformers
    /// 5.x's layers' keyword arguments (the rotary tables, `hf_v5.rs`) of
    /// the last forward, one handle each, for its recomputation to reuse.
    /// Dropped when the last non-reentrant region dies or the next forward
    /// hands its own (a reentrant region's Node keeps its own handles).
    pub held: Vec<TensorId>,
}

impl CheckpointState {
    pub fn active_region(&self) -> Option<u32> {
        if self.recompute.is_some() {
            None
        } else {
            self.active
        }
    }

    /// Whether activations made now are rebuilt ones (either checkpoint kind).
    pub fn rebuilding(&self) -> bool {
        self.recompute.is_some() || self.reentrant > 0
    }

    /// Early stop: every tensor the region needs has been rebuilt.
    pub fn should_stop(&self) -> bool {
        match self.recompute {
            Some((r, c)) => self.regions.get(&r).is_some_and(|reg| c >= reg.total),
            None => false,
        }
    }
}

impl Engine {
    /// Open a checkpoint region around `blocks`, whose input is `x`.
    pub(crate) fn ckpt_begin(&mut self, blocks: Range<usize>, x: TensorId) {
        self.retain(x);
        let id = self.ckpt.next;
        self.ckpt.next += 1;
        let amp = self.amp.dtype;
        self.ckpt.regions.insert(
            id,
            Region {
                inputs: vec![x],
                blocks,
                amp,
                total: 0,
                buffer: Vec::new(),
                recomputed: false,
                live_packs: 0,
            },
        );
        self.ckpt.active = Some(id);
        self.ckpt.counter = 0;
    }

    /// Close the open region. A region that saved nothing dies at once.
    pub(crate) fn ckpt_end(&mut self) {
        if let Some(id) = self.ckpt.active.take() {
            let total = self.ckpt.counter;
            if let Some(r) = self.ckpt.regions.get_mut(&id) {
                r.total = total;
                r.buffer = vec![None; total as usize];
            }
            if self
                .ckpt
                .regions
                .get(&id)
                .is_some_and(|r| r.live_packs == 0)
            {
                self.ckpt_free(id);
            }
        }
    }

    /// Called by `save`: a placeholder in a region (forward), or — while
    /// recomputing — the real storage parked in the region's buffer.
    pub(crate) fn ckpt_pack(&mut self, s: StorageId) -> Option<(u32, u32)> {
        if let Some((r, c)) = self.ckpt.recompute {
            self.ckpt.recompute = Some((r, c + 1));
            let slot = self
                .ckpt
                .regions
                .get_mut(&r)
                .and_then(|reg| reg.buffer.get_mut(c as usize));
            if let Some(slot) = slot {
                if slot.is_none() {
                    *slot = Some(s);
                    self.retain_storage_slot(s);
                }
            }
            return Some((r, c));
        }
        let r = self.ckpt.active?;
        let c = self.ckpt.counter;
        self.ckpt.counter += 1;
        if let Some(reg) = self.ckpt.regions.get_mut(&r) {
            reg.live_packs += 1;
        }
        Some((r, c))
    }

    /// PyTorch's generated autograd kernels pack an op's saved inputs before
    /// they run it: when those packs complete a recomputing region, early
    /// stop raises before the op allocates anything. `input_saves` are the
    /// tensors the op saves as inputs, in the order it saves them.
    pub(crate) fn ckpt_stop_before(&mut self, input_saves: &[TensorId]) -> Result<()> {
        let Some((r, c)) = self.ckpt.recompute else {
            return Ok(());
        };
        let total = self.ckpt.regions.get(&r).map_or(u32::MAX, |reg| reg.total);
        if input_saves.is_empty() || c.saturating_add(input_saves.len() as u32) < total {
            return Ok(());
        }
        for &t in input_saves {
            let storage = self.tensors[t.0].storage;
            self.ckpt_pack(storage);
        }
        Err(EngineError::StopRecompute)
    }

    /// `count` of the region's forward packs were released (their Node's
    /// `release_variables`, in backward or when the Node is deleted).
    pub(crate) fn ckpt_packs_released(&mut self, region: u32, count: u32) {
        let dead = match self.ckpt.regions.get_mut(&region) {
            Some(r) => {
                r.live_packs = r.live_packs.saturating_sub(count);
                r.live_packs == 0 && self.ckpt.active != Some(region)
            }
            None => false,
        };
        if dead {
            self.ckpt_free(region);
        }
    }

    fn ckpt_free(&mut self, id: u32) {
        if let Some(r) = self.ckpt.regions.remove(&id) {
            for s in r.buffer.into_iter().flatten() {
                self.release_storage_slot(s);
            }
            for t in r.inputs {
                self.decref(t);
            }
        }
        if self.ckpt.regions.is_empty() {
            self.ckpt_hold(Vec::new());
        }
    }

    /// Hand `handles` (owned) to the checkpointed layers (see `held`); the
    /// previous forward's go.
    pub(crate) fn ckpt_hold(&mut self, handles: Vec<TensorId>) {
        for t in std::mem::replace(&mut self.ckpt.held, handles) {
            self.decref(t);
        }
    }

    /// Fill node `n`'s placeholder slots, recomputing its region first if needed.
    pub(crate) fn ckpt_unpack(&mut self, n: NodeId) -> Result<()> {
        let Some(region) = self.nodes[n.0].region else {
            return Ok(());
        };
        let needs = self
            .ckpt
            .regions
            .get(&region)
            .is_some_and(|r| !r.recomputed);
        if needs {
            self.ckpt_recompute(region)?;
        }
        let k = self.nodes[n.0].saved.len();
        for i in 0..k {
            let slot = &self.nodes[n.0].saved[i];
            if slot.storage.is_some() {
                continue;
            }
            let Some((r, idx)) = slot.pack else { continue };
            let taken = self
                .ckpt
                .regions
                .get_mut(&r)
                .and_then(|reg| reg.buffer.get_mut(idx as usize))
                .and_then(Option::take);
            match taken {
                // The buffer's slot reference moves into the node's slot.
                Some(s) => {
                    let slot = &mut self.nodes[n.0].saved[i];
                    slot.storage = Some(s);
                    let counter = slot
                        .version_cell
                        .map_or(VersionCounter::Storage(s), VersionCounter::Cell);
                    let version = self.version_of(counter);
                    self.nodes[n.0].saved[i].version = version;
                }
                None => {
                    return Err(EngineError::Runtime(
                        crate::engine::error::BACKWARD_TWICE.into(),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Re-run the region's forward under its autocast state, parking every
    /// saved tensor in the buffer (§7.2). Intermediates die as in forward.
    fn ckpt_recompute(&mut self, region: u32) -> Result<()> {
        let Some(r) = self.ckpt.regions.get_mut(&region) else {
            return Ok(());
        };
        r.recomputed = true;
        let (inputs, blocks, amp) = (r.inputs.clone(), r.blocks.clone(), r.amp);
        let Some(model) = self.model.take() else {
            return Err(EngineError::Program(
                "checkpoint recompute without a model".into(),
            ));
        };
        let mark = self.locals.len();
        let saved_amp = std::mem::take(&mut self.amp);
        if let Some(dt) = amp {
            self.autocast_enter(dt);
        }
        let saved_grad = std::mem::replace(&mut self.ctx.grad_enabled, true);
        self.ckpt.recompute = Some((region, 0));
        // Inputs are detached and re-marked as requiring grad (checkpoint.py).
        let x = inputs[0];
        let xd = self.detach(x);
        let rg = self.requires_grad(x);
        self.t_mut(xd).requires_grad = rg;
        let r = model.run_blocks(self, blocks, xd);
        self.ckpt.recompute = None;
        let result = match r {
            Ok(out) => {
                self.release(out);
                Ok(())
            }
            Err(EngineError::StopRecompute) => Ok(()),
            Err(e) => Err(e),
        };
        self.unwind_locals(mark);
        self.ctx.grad_enabled = saved_grad;
        if amp.is_some() {
            self.autocast_exit();
        }
        self.amp = saved_amp;
        self.model = Some(model);
        result
    }
}
