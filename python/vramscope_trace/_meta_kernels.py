"""Meta kernels the trace runs instead of PyTorch's: those PyTorch lacks
for ops a CUDA program runs, the data-dependent ops (sizes from
vramscope), and backward formulas that take their CUDA branch.

Imported at activation, after torch's own import (it binds torch's objects).
"""

import torch

from ._reports import _mark_route
from ._session import _state

_current_node = torch._C._current_autograd_node


def _meta_impls(torch):
    """Meta kernels PyTorch lacks for ops a CUDA program runs: their
    outputs' shapes, nothing else (what the GPU's kernel takes beside them
    is vramscope's: `before`/`out`/`op`)."""
    aten = torch.ops.aten
    meta = _state.meta

    def cudnn_rnn_backward(input, weight, weight_stride0, weight_buf, hx, cx, output,
                           grad_output, grad_hy, grad_cy, mode, hidden_size, proj_size,
                           num_layers, batch_first, dropout, train, bidirectional,
                           batch_sizes, dropout_state, reserve, output_mask):
        if grad_output is None and grad_hy is None and grad_cy is None:
            return (None, None, None, [])
        if not train:
            raise RuntimeError("cudnn RNN backward can only be called in training mode")
        dx = torch.empty(input.shape, dtype=input.dtype, device=meta)
        dhx = torch.empty(hx.shape, dtype=hx.dtype, device=meta)
        dcx = torch.empty(cx.shape, dtype=cx.dtype, device=meta) if cx is not None else None
        dw = []
        if output_mask[3]:
            n = weight_buf.numel() if weight_buf is not None else sum(w.numel() for w in weight)
            flat = torch.zeros(n, dtype=weight[0].dtype, device=meta)
            off = 0
            for w in weight:
                dw.append(flat[off:off + w.numel()].view(w.shape))
                off += w.numel()
        return (dx, dhx, dcx, dw)

    def cudnn_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                        is_causal=False, return_debug_mask=False, scale=None):
        # Meta's kernel always makes the [B, H, T, 1] fp32 stats; CUDA's
        # (`_scaled_dot_product_cudnn_attention_cuda`, MHA.cpp
        # `run_cudnn_SDP_fprop`) only when `compute_log_sumexp`: without
        # it the stats are undefined (an empty tensor here: no storage).
        out = aten._scaled_dot_product_cudnn_attention.default(
            query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal,
            return_debug_mask, scale=scale,
        )
        if compute_log_sumexp:
            return out
        out = list(out)
        out[1] = torch.empty(0, dtype=torch.float32, device=meta)
        return tuple(out)

    impls = {
        aten._cudnn_rnn_backward.default: cudnn_rnn_backward,
        aten._scaled_dot_product_cudnn_attention.default: cudnn_attention,
    }
    impls.update(_data_dependent(torch))
    impls.update(_cuda_branches(torch))
    return impls


def _cuda_branches(torch):
    """Backward formulas that take another branch on CUDA than under a
    dispatch mode: `areAnyTensorSubclassLike` (ATen/TensorSubclassLikeUtils.h)
    is true whenever any dispatch mode is on, so the formula's
    out-of-place branch runs here where the GPU runs the in-place one.
    Keyed by the aten op the out-of-place branch calls, and taken only in
    the autograd node whose formula it is."""
    aten = torch.ops.aten

    def index_put(x, indices, values, accumulate=False):
        # IndexBackward0 (derivatives.yaml `index.Tensor`: `index_backward(
        # grad.new_zeros_symint(...), indices, grad)`; FunctionsManual.cpp
        # `index_backward`): `at::_index_put_impl_(zeros_like_self, indices,
        # grad, true, true)` into the zeros, not `zeros_like_self.index_put(
        # indices, grad, true)` (a copy of them). No grad-mode test there.
        node = _current_node()
        if accumulate and node is not None and node.name() == "IndexBackward0":
            with _state.allocations:
                return aten._index_put_impl_(x, indices, values, True, True)
        return aten.index_put.default(x, indices, values, accumulate)

    def index_add(x, dim, index, source, alpha=1):
        # IndexSelectBackward0 (TensorAdvancedIndexing.cpp
        # `index_select_backward_symint`): `grad.new_zeros_symint(...)
        # .index_add_(dim, index, grad)`, the out-of-place `index_add` only
        # where `isTensorSubclassLike(index)`.
        node = _current_node()
        if node is not None and alpha == 1 and node.name() == "IndexSelectBackward0":
            with _state.allocations:
                return aten.index_add_.default(x, dim, index, source)
        return aten.index_add.default(x, dim, index, source, alpha=alpha)

    # The nodes whose formula is `value_selecting_reduction_backward_symint`
    # (derivatives.yaml: kthvalue, max.dim, median.dim, nanmedian.dim,
    # min.dim, mode, sort, sort.stable, topk; FunctionsManual.cpp):
    # `at::zeros_symint(sizes).scatter_(dim, indices, grad)`, the
    # out-of-place `scatter` only where `areAnyTensorSubclassLike`.
    selecting = {
        "KthvalueBackward0", "MaxBackward0", "MedianBackward1", "NanmedianBackward1",
        "MinBackward0", "ModeBackward0", "SortBackward0", "SortBackward1", "TopkBackward0",
    }

    def scatter(x, dim, index, src):
        node = _current_node()
        if node is not None and node.name() in selecting:
            with _state.allocations:
                return aten.scatter_.src(x, dim, index, src)
        return aten.scatter.src(x, dim, index, src)

    return {
        aten.index_put.default: index_put,
        aten.index_add.default: index_add,
        aten.scatter.src: scatter,
    }


def _data_dependent(torch):
    """Ops whose output size depends on the data, which the simulated GPU
    does not hold: `nonzero` (`torch.where(cond)`, `argwhere`),
    `masked_select`, a boolean mask index (`x[mask]`), `bincount`. Their
    sizes come from vramscope (`before`'s `rows`), which takes them from a
    stated assumption and names it in the report (`trace.assumed`, with the
    program's line): a mask `chosen == e` of a router's top-k choice gets
    balanced routing's rows for expert e (the engine's
    `Routing::Balanced`), any other mask counts as all true. So the
    trace follows the routing it had to assume: `topk`/`argmax` indices
    and their `== e` masks are kept here (`_route_of`)."""
    aten = torch.ops.aten
    meta = _state.meta
    Tensor = torch.Tensor
    masks = (torch.bool, torch.uint8)
    long = torch.long

    def mode():
        return _state.allocations

    def topk(x, k, dim=-1, largest=True, sorted=True):
        out = aten.topk.default(x, k, dim, largest, sorted)
        if x.dim() > 0 and k > 0:
            _mark_route(_state.routes, out[1], {
                "experts": int(x.shape[dim]), "top_k": int(k),
                "tokens": int(out[1].numel() // k),
            })
        return out

    def argmax(x, dim=None, keepdim=False):
        out = aten.argmax.default(x, dim, keepdim)
        if dim is not None and x.dim() > 0:
            _mark_route(_state.routes, out, {
                "experts": int(x.shape[dim]), "top_k": 1, "tokens": int(out.numel()),
            })
        return out

    def eq_scalar(x, other):
        out = aten.eq.Scalar(x, other)
        if _state.routes and isinstance(other, int) and not isinstance(other, bool):
            hit = _state.routes.get(x.untyped_storage()._cdata)
            if hit is not None:
                _mark_route(_state.route_masks, out, dict(hit[1], expert=int(other)))
        return out

    def nonzero(x):
        rows = _state.rows
        _state.rows = None
        if rows is None:
            raise NotImplementedError("aten::nonzero: no size from vramscope")
        return torch.empty((int(rows), x.dim()), dtype=long, device=meta)

    def bincount(x, weights=None, minlength=0):
        rows = _state.rows
        _state.rows = None
        if rows is None:
            raise NotImplementedError("aten::bincount: no size from vramscope")
        # CUDA's _bincount_cuda: the input's min (a negative value is an
        # error) and max (the bins), each read back to the host, then the
        # zeroed bins (the weights' dtype, or int64).
        with mode():
            if x.numel() > 0:
                x.min()
                x.max()
            return torch.zeros(int(rows), dtype=weights.dtype if weights is not None else long,
                               device=meta)

    def index(x, indices):
        if not any(isinstance(i, Tensor) and i.dtype in masks for i in indices):
            return aten.index.Tensor(x, indices)
        # CUDA's index (expandTensors): each boolean mask becomes its
        # nonzero's columns, then the gather; the nonzero result goes after.
        with mode():
            cols = []
            for i in indices:
                if isinstance(i, Tensor) and i.dtype in masks:
                    cols.extend(torch.nonzero(i).unbind(1))
                else:
                    cols.append(i)
            return aten.index.Tensor(x, cols)

    def masked_select(x, mask):
        # masked_select_out_cuda_impl: expand_outplace(mask, self), then
        # index(self, {mask}).
        with mode():
            m, s = torch.broadcast_tensors(mask, x)
            return aten.index.Tensor(s, [m])

    return {
        aten.topk.default: topk,
        aten.argmax.default: argmax,
        aten.eq.Scalar: eq_scalar,
        aten.nonzero.default: nonzero,
        aten.bincount.default: bincount,
        aten.index.Tensor: index,
        aten.masked_select.default: masked_select,
    }
