//! Autograd graph objects (engine.md §0.3, §2): Nodes with SavedSlots and
//! next-edges, AccumulateGrad, and their lifetimes.

pub(crate) mod backward;
pub mod checkpoint;
mod formulas;
mod grad;
pub(crate) mod reentrant;
mod second_order;

use serde::{Deserialize, Serialize};

use crate::engine::dtype::DType;
use crate::engine::error::{Result, INFERENCE_TENSOR_SAVED};
use crate::engine::scratch::embedding::EmbeddingSort;
use crate::engine::shape::Shape;
use crate::engine::storage::StorageId;
use crate::engine::tensor::{Layout, TensorId};
use crate::engine::{Engine, EngineError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

pub(crate) use grad::GradOnly;

/// An edge to the `nr`-th output of `node` (PyTorch's `Edge{function, input_nr}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Edge {
    pub node: NodeId,
    pub nr: u8,
}

/// One differentiable input of a Node: where its gradient goes, and the
/// geometry the gradient must have.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InputMeta {
    pub edge: Option<Edge>,
    pub shape: Shape,
    pub dtype: DType,
}

/// What an SDPA backward allocates after the q, k, v gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SdpaScratch {
    /// One fp32 buffer of these bytes ([B, h, T]: the delta a
    /// half-precision memory-efficient kernel computes itself).
    Delta(u64),
    /// FlashAttention-2's `mha_bwd`: `softmax_d` [B, h, ⌈T⌉₁₂₈] fp32, then
    /// `dq_accum` [B, ⌈T⌉₁₂₈, h, ⌈hd⌉] fp32, freed first.
    Flash { softmax_d: u64, dq_accum: u64 },
    /// `mha_bwd` with fewer key/value heads: `dk_expanded` and
    /// `dv_expanded` (`expanded` bytes each) before `softmax_d` and
    /// `dq_accum`; all four go when the call returns, newest first.
    FlashGqa {
        expanded: u64,
        softmax_d: u64,
        dq_accum: u64,
    },
    /// cuDNN attention's backward workspace (models.md §4.5 [unc]).
    Cudnn { workspace: u64 },
    /// Memory-efficient attention in fp32 (`_efficient_attention_backward`):
    /// ATen computes delta as `(grad_out * out).sum(-1)` (a `product`-byte
    /// temporary, then `rows` bytes), transposed and made contiguous (another
    /// `rows` bytes when `copy_delta`: more than one head), then takes the
    /// kernel's `workspace`.
    EfficientF32 {
        product: u64,
        rows: u64,
        copy_delta: bool,
        workspace: u64,
    },
}

/// One step of a kernel's scratch: take a buffer of these bytes, or free
/// the n-th buffer taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScratchStep {
    Take(u64),
    Free(usize),
}

impl SdpaScratch {
    /// The buffers in the order the kernel takes and frees them: the
    /// engine's backward and a traced program's both follow these steps.
    pub(crate) fn steps(self) -> Vec<ScratchStep> {
        use ScratchStep::{Free, Take};
        match self {
            SdpaScratch::Delta(bytes) => vec![Take(bytes), Free(0)],
            SdpaScratch::Cudnn { workspace } => vec![Take(workspace), Free(0)],
            SdpaScratch::Flash {
                softmax_d,
                dq_accum,
            } => vec![Take(softmax_d), Take(dq_accum), Free(1), Free(0)],
            SdpaScratch::FlashGqa {
                expanded,
                softmax_d,
                dq_accum,
            } => vec![
                Take(expanded),
                Take(expanded),
                Take(softmax_d),
                Take(dq_accum),
                Free(3),
                Free(2),
                Free(1),
                Free(0),
            ],
            // (grad_out * out).sum(-1).transpose(-2, -1).contiguous(): the
            // temporaries die at the end of the expression, last made first
            // (with one head the transpose is contiguous and delta is the
            // sum itself); the workspace outlives delta.
            SdpaScratch::EfficientF32 {
                product,
                rows,
                copy_delta: true,
                workspace,
            } => vec![
                Take(product),
                Take(rows),
                Take(rows),
                Free(1),
                Free(0),
                Take(workspace),
                Free(2),
                Free(3),
            ],
            SdpaScratch::EfficientF32 {
                product,
                rows,
                copy_delta: false,
                workspace,
            } => vec![
                Take(product),
                Take(rows),
                Free(0),
                Take(workspace),
                Free(1),
                Free(2),
            ],
        }
    }
}

/// How a Node's backward allocates (engine.md table 2.2, column "backward allocates").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BwdKind {
    AccumulateGrad,
    /// `CheckpointFunctionBackward` (reentrant checkpoint, §7): re-run model
    /// blocks `start..end` under the forward's autocast and back-propagate
    /// through them in a nested backward.
    Reentrant {
        start: u32,
        end: u32,
        amp: Option<DType>,
    },
    /// One new gradient per input that needs one, in input order.
    Alloc,
    /// `.to(dtype)`'s backward: the gradient cast back to the input's dtype,
    /// laid out like the incoming one (`to()` preserves strides).
    Cast,
    /// As `Alloc`, with one temporary of the gradient's size made and freed
    /// beside it, before the gradient (`temp_first`: sqrt's
    /// `grad / (2 * result)`) or after it (softmax's backward), as the
    /// H100 sweep shows (tests/fixtures/elementwise).
    AllocWithTemp {
        temp_first: bool,
    },
    /// As `Alloc`, after `temps` temporaries of the gradient's size that the
    /// formula's C++ expression builds first and destroys, newest first,
    /// once the gradient exists: PowBackward0's `grad * (2 * self.pow(1))`,
    /// RsqrtBackward0's `-0.5 * grad * result.pow(3)` (derivatives.yaml).
    AllocAfterTemps {
        temps: u8,
    },
    /// ClampBackward1 (`clamp_backward` with both bounds): a 0-dim zero
    /// (`at::scalar_tensor(0., grad.options())`), the bool masks `self >=
    /// min` and `self <= max` (anded in place), the gradient from `where`;
    /// then the masks die, the second first, and the zero (the trace of
    /// tests/fixtures/pytorch/adversarial_input_graph_bug.py on PyTorch 2.11).
    Clamp,
    /// MulBackward0: each gradient is `grad * other` (or `* self`) at the
    /// output's shape; an input broadcast to it gets that product reduced by
    /// `validate_outputs`' `sum_to` afterwards, the product then freed.
    Mul,
    /// SubBackward0: `self`'s gradient is the incoming one handed on,
    /// `other`'s a new `-grad` at the output's shape; `validate_outputs`
    /// sums a broadcast input's down afterwards (ops/handwritten.rs).
    Sub,
    /// DivBackward0: `other`'s `-grad * ((self / other) / other)` first (three
    /// temporaries at the output's shape, destroyed newest first once the
    /// product exists), then `self`'s `grad / other`; each summed down by
    /// `validate_outputs` when broadcast (ops/handwritten.rs).
    Div,
    /// The incoming gradient is handed on as a view (add, views, cat); broadcasts
    /// and dtype changes are fixed up by `validate_outputs` (sum_to / cast).
    PassThrough,
    /// `cat`: slices (views) of the incoming gradient, one per input; also
    /// `contiguous()` of a transposed view, whose TransposeBackward0 hands
    /// the gradient on transposed.
    Slice,
    /// `_unsafe_view` of a batched matmul's [B·h, M, N] result as
    /// [B, h, M, N]: backward reshapes the incoming gradient, a copy when it
    /// is strided and `merge_fails` (B, h and M all above 1), else a view.
    UnsafeView {
        merge_fails: bool,
    },
    /// `sum`: an expanded (broadcast) view of the incoming 0-dim gradient.
    Expand,
    /// ViewBackward0 (`grad.reshape(self_sym_sizes)`): a view of the incoming
    /// gradient, or a copy of the input's shape when it arrives broadcast
    /// (`x.view(n, k, d).sum(dim=1)`'s expanded gradient, ops/grouped_mm.rs).
    ViewCopy,
    /// GroupedMmBackward0 (ops/grouped_mm.rs): mat2's gradient, then
    /// self's, each one new tensor of the input's shape.
    GroupedMm,
    /// mm / addmm / bmm: gradients come from GEMMs (copy of a broadcast incoming
    /// gradient, backward-thread cuBLAS workspace). Input 0 of addmm is the bias.
    Gemm {
        has_bias: bool,
        /// The last input is a Linear's weight, multiplied as `W.t()`: its
        /// gradient comes back as a transposed view (`mm_mat2_backward`'s
        /// column-major branch, then TBackward0), and the view keeps its
        /// base alive.
        weight_transposed: bool,
    },
    /// convolution: per-input gradients (x, w, bias), each with its
    /// transient cuDNN workspace (0: none).
    Conv {
        workspace: [u64; 3],
    },
    /// SDPA flash / memory-efficient: q, k, v gradients, then the kernel's
    /// scratch.
    Sdpa {
        scratch: SdpaScratch,
        /// The causal mask: fused kernels skip the masked half of the work.
        causal: bool,
    },
    /// layer_norm: dX, dgamma, dbeta as needed; past 65,536 rows (see
    /// `scratch::layer_norm`) the weight and bias gradients are then remade
    /// from `partial_rows` rows of partial sums each.
    LayerNorm {
        partial_rows: Option<u64>,
    },
    /// split: one allocation (the cat of the output gradients) of the input's shape.
    Split,
    /// IndexAddBackward0 (ops/moe.rs): `self`'s gradient is the incoming
    /// one handed on; `source`'s is `grad.index_select(dim, index)`, one
    /// new tensor of the source's shape.
    IndexAdd,
    /// IndexBackward0 (ops/moe.rs): a zeros of the indexed tensor's shape
    /// and an accumulating `index_put_` of `rows` index rows, which on CUDA
    /// sorts the linear indices first (`scratch::index_put`).
    IndexPut {
        rows: u64,
    },
    /// embedding: the weight's gradient, made between the index sort and
    /// the segment sums when the lookups take the sort path.
    Embedding {
        sort: Option<EmbeddingSort>,
    },
    /// cuDNN RNN: dx, dhx, dcx, workspace, then one flat zero-filled dw whose
    /// per-parameter views become the grads (engine.md §8.2).
    CudnnRnn {
        workspace: u64,
        flat_bytes: u64,
        training: bool,
    },
    /// A bitsandbytes Function (`MatMul4Bit`, `MatMul8bitLt`): the bias's
    /// gradient first, then the input's (ops/bnb_matmul.rs).
    Bnb(BnbBwd),
    /// A node of the graph a `create_graph=True` backward recorded
    /// (`second_order.rs`), run by its name's rule there. `self_t`: an
    /// MmBackward0 whose `self` is a transposed gradient (a weight's
    /// gradient, `grad.t().mm(mat1)`), so `self`'s own gradient comes back
    /// transposed and `mat2`'s does not.
    SecondOrder {
        self_t: bool,
    },
    /// LinalgVectorNormBackward0 for p = 2 (`ops/penalty.rs`: two
    /// temporaries, then the gradient).
    Norm,
}

/// What a bitsandbytes backward dequantises (ops/bnb_matmul.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BnbBwd {
    /// `absmax`: bytes of the fp32 absmax made again under double
    /// quantisation (0 without); the weight [out, in] comes back in
    /// `weight_dtype`, the dtype it was quantised from.
    FourBit {
        absmax: u64,
        weight_dtype: DType,
        out: u64,
        input: u64,
    },
    EightBit {
        out: u64,
        input: u64,
    },
}

/// Saved tensor reference (engine.md §0.3 SavedSlot).
#[derive(Debug, Clone)]
pub(crate) struct SavedSlot {
    pub name: &'static str,
    /// None once released, or while it is a checkpoint placeholder.
    pub storage: Option<StorageId>,
    pub shape: Shape,
    pub dtype: DType,
    pub version: u32,
    /// The saved tensor's own counter, if it has one (else the storage's).
    pub version_cell: Option<u32>,
    pub is_output: bool,
    /// The saved tensor's producer (for the in-place error message).
    pub producer: Option<(&'static str, u8)>,
    /// Checkpoint placeholder: (region, pack index) to unpack from (§7.1).
    pub pack: Option<(u32, u32)>,
}

impl SavedSlot {
    pub fn bytes(&self) -> u64 {
        self.shape.numel().saturating_mul(self.dtype.size())
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub name: &'static str,
    pub kind: BwdKind,
    pub inputs: Vec<InputMeta>,
    pub saved: Vec<SavedSlot>,
    pub seq: u64,
    pub iteration: u32,
    pub module: u32,
    pub released: bool,
    pub refs: u32,
    /// AccumulateGrad's variable (a strong reference, engine.md §0.3).
    pub leaf: Option<TensorId>,
    pub num_outputs: u8,
    /// Gradient buffer during backward, one per output.
    pub buf: Vec<Option<TensorId>>,
    pub deps: u32,
    /// Checkpoint region whose recomputation produces this node's saved tensors.
    pub region: Option<u32>,
    /// Extra tensors a node keeps (RNN parameter views for the flat dw).
    pub extra: Vec<TensorId>,
    /// Tensors a custom Function keeps as plain `ctx` attributes
    /// (bitsandbytes' `ctx.tensors`): not saved tensors, so neither
    /// released by backward nor packed by a checkpoint region; they go
    /// with the Node.
    pub ctx_attrs: Vec<TensorId>,
}

impl Engine {
    /// The tensor's gradient edge: its grad_fn, or its leaf accumulator.
    pub(crate) fn edge_of(&mut self, t: TensorId) -> Option<Edge> {
        let x = &self.tensors[t.0];
        if let Some(n) = x.grad_fn {
            return Some(Edge {
                node: n,
                nr: x.output_nr,
            });
        }
        if x.requires_grad {
            let acc = self.grad_accumulator(t);
            return Some(Edge { node: acc, nr: 0 });
        }
        None
    }

    /// The leaf's AccumulateGrad node (one per leaf; created on demand, weakly
    /// referenced by the leaf, holding the leaf strongly — engine.md §0.3).
    pub(crate) fn grad_accumulator(&mut self, leaf: TensorId) -> NodeId {
        if let Some(n) = self.tensors[leaf.0].grad_acc {
            if self.nodes.get(n.0).is_some() {
                return n;
            }
        }
        self.tensors[leaf.0].refs += 1;
        let x = &self.tensors[leaf.0];
        let meta = InputMeta {
            edge: None,
            shape: x.shape,
            dtype: x.dtype,
        };
        let id = NodeId(self.nodes.insert(Node {
            name: "AccumulateGrad",
            kind: BwdKind::AccumulateGrad,
            inputs: vec![meta],
            saved: Vec::new(),
            seq: u64::MAX,
            iteration: self.ctx.iteration,
            module: self.ctx.module,
            released: false,
            refs: 0,
            leaf: Some(leaf),
            num_outputs: 1,
            buf: Vec::new(),
            deps: 0,
            region: None,
            extra: Vec::new(),
            ctx_attrs: Vec::new(),
        }));
        self.tensors[leaf.0].grad_acc = Some(id);
        id
    }

    /// `t.retain_grad()`: a no-op on a leaf, an error on a tensor that does
    /// not require grad, else its grad is kept at the next backward (§3.3).
    pub fn retain_grad(&mut self, t: TensorId) -> Result<()> {
        let x = &mut self.tensors[t.0];
        if !x.requires_grad {
            return Err(EngineError::Runtime(
                "can't retain_grad on Tensor that has requires_grad=False".into(),
            ));
        }
        if x.grad_fn.is_some() && !x.retains_grad {
            x.retains_grad = true;
            self.retaining.push(t);
        }
        Ok(())
    }

    /// Whether an op over `inputs` records a Node (engine.md §2.1).
    pub(crate) fn records(&self, inputs: &[TensorId]) -> bool {
        self.ctx.grad_enabled && inputs.iter().any(|t| self.tensors[t.0].requires_grad)
    }

    /// A new Node whose differentiable inputs are `inputs` (None = an input that
    /// is not a tensor, e.g. an absent bias). Takes a strong ref on each edge.
    pub(crate) fn new_node(
        &mut self,
        name: &'static str,
        kind: BwdKind,
        inputs: &[Option<TensorId>],
    ) -> NodeId {
        let mut metas = Vec::with_capacity(inputs.len());
        for t in inputs {
            let meta = match t {
                Some(t) => {
                    let edge = self.edge_of(*t);
                    if let Some(e) = edge {
                        self.nodes[e.node.0].refs += 1;
                    }
                    let x = &self.tensors[t.0];
                    InputMeta {
                        edge,
                        shape: x.shape,
                        dtype: x.dtype,
                    }
                }
                None => InputMeta {
                    edge: None,
                    shape: Shape::scalar(),
                    dtype: DType::F32,
                },
            };
            metas.push(meta);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let region = self.ckpt.active_region();
        NodeId(self.nodes.insert(Node {
            name,
            kind,
            inputs: metas,
            saved: Vec::new(),
            seq,
            iteration: self.ctx.iteration,
            module: self.ctx.module,
            released: false,
            refs: 0,
            leaf: None,
            num_outputs: 1,
            buf: Vec::new(),
            deps: 0,
            region,
            extra: Vec::new(),
            ctx_attrs: Vec::new(),
        }))
    }

    /// Make `t` the `nr`-th output of `node` (requires_grad, non-leaf).
    pub(crate) fn set_grad_fn(&mut self, t: TensorId, node: NodeId, nr: u8) {
        self.nodes[node.0].refs += 1;
        let n = &mut self.nodes[node.0];
        n.num_outputs = n.num_outputs.max(nr + 1);
        let x = &mut self.tensors[t.0];
        if let Some(old) = x.grad_fn.replace(node) {
            self.release_node(old);
        }
        let x = &mut self.tensors[t.0];
        x.requires_grad = true;
        x.output_nr = nr;
    }

    /// Save `t` for backward in `node` (no copy: a storage reference, §2.2).
    /// Inside a checkpointed region the slot is a placeholder (§7.1).
    pub(crate) fn save(&mut self, node: NodeId, name: &'static str, t: TensorId, is_output: bool) {
        let x = &self.tensors[t.0];
        if x.inference && self.op_error.is_none() {
            self.op_error = Some(EngineError::Runtime(INFERENCE_TENSOR_SAVED.into()));
        }
        let (storage, shape, dtype) = (x.storage, x.shape, x.dtype);
        let producer = x.grad_fn.map(|n| (self.nodes[n.0].name, x.output_nr));
        let version_cell = x.version_cell;
        let version = self.version_of(self.version_counter(t));
        let pack = self.ckpt_pack(storage);
        let held = if pack.is_some() {
            None
        } else {
            self.retain_storage_slot(storage);
            Some(storage)
        };
        self.nodes[node.0].saved.push(SavedSlot {
            name,
            storage: held,
            shape,
            dtype,
            version,
            version_cell,
            is_output,
            producer,
            pack,
        });
    }

    /// `release_variables()`: drop every saved storage of the node (§2.3.1),
    /// in the order PyTorch's generated Node resets them: saved inputs by
    /// name, then saved outputs by name (gen_autograd_functions.py sorts
    /// both). An attention backward thus frees `logsumexp` before `output`,
    /// as the H100 traces show.
    pub(crate) fn release_variables(&mut self, n: NodeId) {
        let mut saved = std::mem::take(&mut self.nodes[n.0].saved);
        let (released_before, region) = (self.nodes[n.0].released, self.nodes[n.0].region);
        let mut order: Vec<usize> = (0..saved.len()).collect();
        order.sort_by_key(|&i| (saved[i].is_output, saved[i].name));
        let mut packs = 0u32;
        for i in order {
            let slot = &mut saved[i];
            if let Some(s) = slot.storage.take() {
                self.release_storage_slot(s);
            }
            packs += u32::from(slot.pack.is_some());
        }
        let node = &mut self.nodes[n.0];
        node.saved = saved;
        node.released = true;
        let extra = std::mem::take(&mut node.extra);
        for t in extra {
            self.decref(t);
        }
        if let (Some(r), false, 1..) = (region, released_before, packs) {
            self.ckpt_packs_released(r, packs);
        }
    }

    /// The end of a node's `apply()` under non-reentrant checkpointing: a
    /// recomputed saved tensor is handed to the node by its unpack hook,
    /// which drops the frame's reference, so the node's local is its only
    /// owner and it dies as `apply()` returns, before `validate_outputs`
    /// (the locals go last-unpacked first; the generated code unpacks saved
    /// inputs by name, then saved outputs by name).
    pub(crate) fn release_unpacked_recomputed(&mut self, n: NodeId) {
        let saved = &self.nodes[n.0].saved;
        let mut order: Vec<usize> = (0..saved.len())
            .filter(|&i| saved[i].pack.is_some() && saved[i].storage.is_some())
            .collect();
        order.sort_by_key(|&i| std::cmp::Reverse((saved[i].is_output, saved[i].name)));
        for i in order {
            if let Some(s) = self.nodes[n.0].saved[i].storage.take() {
                self.release_storage_slot(s);
            }
        }
    }

    /// Drop one strong reference to a node. At zero, delete it the way
    /// `deleteNode` does: release its variables, then hand children whose last
    /// reference this was to an explicit stack (no recursion, deepest last).
    pub(crate) fn release_node(&mut self, n: NodeId) {
        let node = &mut self.nodes[n.0];
        node.refs -= 1;
        if node.refs > 0 {
            return;
        }
        let mut stack = vec![n];
        while let Some(f) = stack.pop() {
            self.release_variables(f);
            let Some(node) = self.nodes.remove(f.0) else {
                continue;
            };
            if !self.grad_hooks.is_empty() {
                self.grad_hooks.retain(|h| h.node != f);
            }
            for meta in &node.inputs {
                if let Some(e) = meta.edge {
                    let child = &mut self.nodes[e.node.0];
                    child.refs -= 1;
                    if child.refs == 0 {
                        stack.push(e.node);
                    }
                }
            }
            for t in node.buf.iter().flatten() {
                self.decref(*t);
            }
            for t in &node.ctx_attrs {
                self.decref(*t);
            }
            if let Some(leaf) = node.leaf {
                if let Some(x) = self.tensors.get_mut(leaf.0) {
                    if x.grad_acc == Some(f) {
                        x.grad_acc = None;
                    }
                }
                self.decref(leaf);
            }
        }
    }

    /// Live autograd Nodes (host memory only, engine.md §2.1 / §9).
    pub fn live_nodes(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn layout(&self, t: TensorId) -> Layout {
        self.tensors[t.0].layout
    }
}
