//! Tensors: refcounted views onto storages (engine.md §0.3, §1.3).
//!
//! Handles are ids with explicit reference counts. Every handle an op returns
//! is a *local* (like a Python temporary): `release` drops it, `keep` hands it
//! to a long-lived owner. When a step fails, the locals created since the step
//! began are released in reverse order, as Python's unwinding would.

use serde::{Deserialize, Serialize};

use super::dtype::DType;
use super::error::Result;
use super::shape::Shape;
use super::storage::{DeviceKind, StorageId};
use super::tag::Category;
use super::Engine;
use crate::engine::autograd::NodeId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TensorId(pub u32);

/// Enough layout to decide copies (engine.md §1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Contiguous,
    /// A transpose/permute or a non-last-dim slice: reshape-merges copy.
    Strided,
    /// A broadcast (stride-0) view, e.g. the gradient of `sum` (engine.md §12 #10).
    Expanded,
}

/// A version counter: a storage's (shared by all views of it) or a tensor's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VersionCounter {
    Storage(StorageId),
    Cell(u32),
}

#[derive(Debug, Clone)]
pub(crate) struct Tensor {
    pub storage: StorageId,
    pub shape: Shape,
    pub dtype: DType,
    pub layout: Layout,
    pub requires_grad: bool,
    pub grad_fn: Option<NodeId>,
    pub output_nr: u8,
    pub grad: Option<TensorId>,
    /// Weak: a leaf's AccumulateGrad node while some graph holds it.
    pub grad_acc: Option<NodeId>,
    pub is_view: bool,
    /// Its own version counter (an index into `Engine::version_cells`)
    /// instead of its storage's: a tensor `set_` onto another's storage is
    /// not a view of it, and PyTorch keeps a counter per view family (§1.4.4).
    pub version_cell: Option<u32>,
    /// Created under `inference_mode` (engine.md §4).
    pub inference: bool,
    /// `retain_grad()` was called on this non-leaf (engine.md §3.3).
    pub retains_grad: bool,
    pub refs: u32,
}

impl Engine {
    /// A new tensor on a fresh GPU storage (one allocator request), as a local.
    pub(crate) fn empty(
        &mut self,
        shape: Shape,
        dtype: DType,
        category: Category,
    ) -> Result<TensorId> {
        let s = self.new_storage(shape.numel().saturating_mul(dtype.size()), category)?;
        Ok(self.wrap_storage(s, shape, dtype, Layout::Contiguous, false))
    }

    /// A host tensor (never touches the GPU allocator).
    pub(crate) fn empty_cpu(&mut self, shape: Shape, dtype: DType, category: Category) -> TensorId {
        let s = self.new_cpu_storage(shape.numel().saturating_mul(dtype.size()), category);
        self.wrap_storage(s, shape, dtype, Layout::Contiguous, false)
    }

    pub(crate) fn wrap_storage(
        &mut self,
        s: StorageId,
        shape: Shape,
        dtype: DType,
        layout: Layout,
        is_view: bool,
    ) -> TensorId {
        self.storages[s.0].tensor_refs += 1;
        let id = TensorId(self.tensors.insert(Tensor {
            storage: s,
            shape,
            dtype,
            layout,
            requires_grad: false,
            grad_fn: None,
            output_nr: 0,
            grad: None,
            grad_acc: None,
            is_view,
            version_cell: None,
            inference: self.ctx.inference,
            retains_grad: false,
            refs: 1,
        }));
        self.locals.push(id);
        id
    }

    pub(crate) fn t(&self, t: TensorId) -> &Tensor {
        &self.tensors[t.0]
    }

    pub(crate) fn t_mut(&mut self, t: TensorId) -> &mut Tensor {
        &mut self.tensors[t.0]
    }

    pub fn shape(&self, t: TensorId) -> Shape {
        self.tensors[t.0].shape
    }

    pub fn dtype(&self, t: TensorId) -> DType {
        self.tensors[t.0].dtype
    }

    /// Bytes of the tensor's own elements (not of its storage).
    pub fn nbytes(&self, t: TensorId) -> u64 {
        let x = &self.tensors[t.0];
        x.shape.numel().saturating_mul(x.dtype.size())
    }

    pub fn storage_of(&self, t: TensorId) -> StorageId {
        self.tensors[t.0].storage
    }

    pub fn requires_grad(&self, t: TensorId) -> bool {
        self.tensors[t.0].requires_grad
    }

    pub fn grad_fn(&self, t: TensorId) -> Option<NodeId> {
        self.tensors[t.0].grad_fn
    }

    pub fn grad(&self, t: TensorId) -> Option<TensorId> {
        self.tensors[t.0].grad
    }

    pub fn is_cuda(&self, t: TensorId) -> bool {
        self.storages[self.tensors[t.0].storage.0].device == DeviceKind::Cuda
    }

    /// A view on the same storage (views never allocate, §1.3). It inherits the
    /// base's autograd identity; geometry differences do not change bytes.
    pub(crate) fn view_as(&mut self, base: TensorId, shape: Shape, layout: Layout) -> TensorId {
        let b = self.tensors[base.0].clone();
        let v = self.wrap_storage(b.storage, shape, b.dtype, layout, true);
        let vt = &mut self.tensors[v.0];
        vt.requires_grad = b.requires_grad;
        vt.output_nr = b.output_nr;
        vt.inference = b.inference;
        if let Some(n) = b.grad_fn {
            vt.grad_fn = Some(n);
            self.nodes[n.0].refs += 1;
        } else if b.requires_grad {
            // A view of a leaf routes its gradient to the leaf's accumulator.
            let acc = self.grad_accumulator(base);
            let vt = &mut self.tensors[v.0];
            vt.grad_fn = Some(acc);
            self.nodes[acc.0].refs += 1;
        }
        v
    }

    /// `detach()`: a view without history; keeps the whole storage alive (§1.3).
    pub fn detach(&mut self, t: TensorId) -> TensorId {
        let b = self.tensors[t.0].clone();
        self.wrap_storage(b.storage, b.shape, b.dtype, b.layout, true)
    }

    /// Take one more handle on `t` (e.g. a binding that aliases another).
    pub(crate) fn retain(&mut self, t: TensorId) {
        self.tensors[t.0].refs += 1;
    }

    /// Hand a local handle to a long-lived owner (binding, grad, state, cache).
    pub(crate) fn keep(&mut self, t: TensorId) {
        if let Some(pos) = self.locals.iter().rposition(|x| *x == t) {
            self.locals.remove(pos);
        }
    }

    /// Drop a local handle.
    pub(crate) fn release(&mut self, t: TensorId) {
        self.keep(t);
        self.decref(t);
    }

    /// Drop a handle owned by a long-lived owner (not a local).
    pub(crate) fn decref(&mut self, t: TensorId) {
        let x = &mut self.tensors[t.0];
        x.refs -= 1;
        if x.refs > 0 {
            return;
        }
        if let Some(x) = self.tensors.remove(t.0) {
            // TensorImpl::release_resources: autograd meta (grad_fn, grad) goes
            // first, then the storage — so a dying output frees its graph's
            // saved tensors before its own block (engine.md §1.4).
            if x.retains_grad {
                self.retaining.retain(|r| *r != t);
            }
            if let Some(n) = x.grad_fn {
                self.release_node(n);
            }
            if let Some(g) = x.grad {
                self.decref(g);
            }
            self.release_storage_tensor(x.storage);
            if !self.held_by.is_empty() {
                self.held_to_loss.remove(&t);
                if let Some(held) = self.held_by.remove(&t) {
                    for h in held {
                        self.decref(h);
                    }
                }
            }
        }
    }

    /// `held` (long-lived handles) go when `t` goes: the tensors an object
    /// returned with `t` keeps (a model output's cache).
    pub(crate) fn hold_with(&mut self, t: TensorId, held: Vec<TensorId>) {
        if held.is_empty() {
            return;
        }
        self.held_by.entry(t).or_default().extend(held);
    }

    /// `held` lives until a loss is made from `t` (`Engine::loss_made_from`)
    /// or `t` goes, whichever comes first: a local of the forward that
    /// returned `t` and computed the loss before returning
    /// (`Qwen2ForCausalLM.forward`'s `hidden_states`, transformers 5.16.1
    /// modeling_qwen2.py:462-469, alive until the forward returns).
    pub(crate) fn hold_to_loss(&mut self, t: TensorId, held: TensorId) {
        self.retain(held);
        self.hold_with(t, vec![held]);
        self.held_to_loss.insert(t, held);
    }

    /// A loss was made from `t`: what `hold_to_loss` kept for it goes.
    pub(crate) fn loss_made_from(&mut self, t: TensorId) {
        let Some(h) = self.held_to_loss.remove(&t) else {
            return;
        };
        if let Some(list) = self.held_by.get_mut(&t) {
            if let Some(pos) = list.iter().position(|x| *x == h) {
                list.swap_remove(pos);
                if list.is_empty() {
                    self.held_by.remove(&t);
                }
                self.decref(h);
            }
        }
    }

    /// Release every local created after `mark`, newest first (Python unwinding).
    pub(crate) fn unwind_locals(&mut self, mark: usize) {
        while self.locals.len() > mark {
            if let Some(t) = self.locals.pop() {
                if self.tensors.get(t.0).is_some() {
                    self.decref(t);
                }
            }
        }
    }

    /// Run `body` as one Python frame: if it fails, the locals it created
    /// unwind, newest first (the exception leaving the frame); on success
    /// they stay for the caller to release.
    pub(crate) fn scoped<T>(&mut self, body: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let mark = self.locals.len();
        let r = body(self);
        if r.is_err() {
            self.unwind_locals(mark);
        }
        r
    }

    /// `scoped` inside the op `name`: its marker opens before `body` and
    /// closes after the unwinding; an error the op left in `op_error` wins
    /// over the body's.
    pub(crate) fn in_op<T>(
        &mut self,
        name: &'static str,
        body: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        let prev = self.op_begin(name);
        let r = self.scoped(body);
        self.op_end(prev)?;
        r
    }

    /// Bump the version counter shared by all views (in-place ops, §1.4.4).
    pub(crate) fn bump_version(&mut self, t: TensorId) {
        if self.ctx.inference {
            return; // inference mode does no version-counter bumps (§4)
        }
        match self.version_counter(t) {
            VersionCounter::Storage(s) => self.storages[s.0].version += 1,
            VersionCounter::Cell(c) => self.version_cells[c as usize] += 1,
        }
    }

    /// The counter `t`'s in-place ops bump.
    pub(crate) fn version_counter(&self, t: TensorId) -> VersionCounter {
        let x = &self.tensors[t.0];
        match x.version_cell {
            Some(c) => VersionCounter::Cell(c),
            None => VersionCounter::Storage(x.storage),
        }
    }

    /// A counter's value now.
    pub(crate) fn version_of(&self, counter: VersionCounter) -> u32 {
        match counter {
            VersionCounter::Storage(s) => self.storages[s.0].version,
            VersionCounter::Cell(c) => self.version_cells[c as usize],
        }
    }

    /// Give `t` a counter of its own, starting at `version`.
    pub(crate) fn own_version_counter(&mut self, t: TensorId, version: u32) {
        self.version_cells.push(version);
        let cell = (self.version_cells.len() - 1) as u32;
        self.tensors[t.0].version_cell = Some(cell);
    }

    /// Live tensor handles (all owners).
    pub fn live_tensors(&self) -> usize {
        self.tensors.len()
    }
}
