"""Calls that take another path on CUDA than on meta, in the function
mode: `F.scaled_dot_product_attention` (the backend vramscope's engine
picks), cuDNN's RNNs (`_cudnn_rnn`, flattened weights), and
`binary_cross_entropy_with_logits`'s backward (its in-place CUDA branch).
"""

from ._channel import _chan
from ._own_meta import _is_own
from ._session import _state


def _sdpa_handler(torch):
    """F.scaled_dot_product_attention runs the kernel the GPU would take.
    On meta SDPA decomposes into math ops; vramscope's engine says which
    backend PyTorch would pick for these inputs on the simulated GPU, and
    the fused backends' own aten ops (whose meta kernels give their outputs'
    real shapes: logsumexp, seeds) run instead."""
    if not _state.sdpa:
        return None
    aten = torch.ops.aten
    backends = {}

    def h(func, args, kwargs):
        q, k, v = args[0], args[1], args[2]
        if not (q.is_meta and k.is_meta and v.is_meta):
            return func(*args, **kwargs)
        names = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        opts = dict(zip(names, args[3:]))
        opts.update(kwargs)
        mask = opts.get("attn_mask")
        p = float(opts.get("dropout_p", 0.0) or 0.0)
        causal = bool(opts.get("is_causal", False))
        scale = opts.get("scale")
        gqa = bool(opts.get("enable_gqa", False)) and q.shape[-3] != k.shape[-3]
        dtype = _amp_dtype(torch, q)
        enabled = {
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
            "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
        }
        ask = {
            "dtype": str(dtype).replace("torch.", ""),
            "mask": mask is not None,
            "dropout": p,
            "head_dim": int(q.shape[-1]),
            "gqa": gqa,
            "enabled": enabled,
        }
        # The backend follows from these and the GPU's rules, fixed once
        # CUDA has started: asked once for each.
        key = (ask["dtype"], ask["mask"], p, ask["head_dim"], gqa, tuple(enabled.values()))
        backend = backends.get(key) if _state.initialized else None
        if backend is None:
            backend = _chan.ask(["sdpa", ask])[1]
            if _state.initialized:
                backends[key] = backend
        if dtype != q.dtype:
            # Autocast's casts, right to left.
            v = v.to(dtype)
            k = k.to(dtype)
            q = q.to(dtype)
        # attention.cpp `should_compute_logsumexp`: an input requires grad
        # and grad mode is on.
        need = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        if backend == "efficient" and not gqa:
            out = aten._scaled_dot_product_efficient_attention(
                q, k, v, mask, need, p, causal, scale=scale
            )
            return out[0]
        if backend == "flash" and mask is None:
            out = aten._scaled_dot_product_flash_attention(q, k, v, p, causal, False, scale=scale)
            return out[0]
        if backend == "cudnn":
            out = aten._scaled_dot_product_cudnn_attention(
                q, k, v, mask, need, p, causal, False, scale=scale
            )
            return out[0]
        # The math backend: PyTorch's own composite, with the mask added in
        # place as on CUDA (see Allocations).
        _state.math_sdpa = True
        try:
            return func(*args, **kwargs)
        finally:
            _state.math_sdpa = False

    return h


def _amp_dtype(torch, t):
    if t.dtype in (torch.float32,) and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return t.dtype


def _loss_handlers(torch, handlers):
    """Losses whose backward formula takes another branch on CUDA than
    under a dispatch mode. `binary_cross_entropy_with_logits_backward`
    (torch/csrc/autograd/FunctionsManual.cpp; derivatives.yaml names it for
    `self`, and `..._target_backward` for `target`) computes
    `input.sigmoid().sub_(target)`, then `mul_(grad)`, `mul_(weight)` and
    `div_(numel)` in place, but only where `areAnyTensorSubclassLike` is
    false (ATen/TensorSubclassLikeUtils.h), which is true whenever any
    dispatch mode is on: under the trace's mode it would run `sub` and
    `mul` out of place, two full-size temporaries the GPU never takes. So
    the op runs as an autograd Function whose forward is the same aten op
    (its allocations planned as before) and whose backward is that
    formula's CUDA branch: in place unless grad mode is on (`create_graph`),
    as there. It saves what the native node saves (input, target, weight,
    pos_weight); its node is named `BinaryCrossEntropyWithLogitsBackward`
    (the native one ends in 0)."""
    import torch.nn.functional as F
    from torch.nn import _reduction

    Tensor = torch.Tensor
    native = torch.binary_cross_entropy_with_logits
    MEAN = 1

    def input_grad(grad, x, target, weight, pos_weight, reduction):
        # binary_cross_entropy_with_logits_backward, the branch CUDA takes
        # (no tensor is subclass-like there): out of place only under
        # grad mode.
        outplace = torch.is_grad_enabled()
        if pos_weight is not None:
            t = pos_weight.mul(target)
            if outplace:
                gi = t.add(1).sub(target).mul(x.sigmoid()).sub(t)
            else:
                gi = t.add(1).sub_(target).mul_(x.sigmoid()).sub_(t)
            del t
        elif outplace:
            gi = x.sigmoid().sub(target)
        else:
            gi = x.sigmoid().sub_(target)
        gi = gi.mul(grad) if outplace else gi.mul_(grad)
        if weight is not None:
            gi = gi.mul(weight) if outplace else gi.mul_(weight)
        if reduction == MEAN:
            gi.div_(x.numel())
        return gi

    def target_grad(grad, x, target, weight, pos_weight, reduction):
        # binary_cross_entropy_with_logits_target_backward's CUDA branch.
        if pos_weight is not None:
            gt = F.logsigmoid(-x).sub_(F.logsigmoid(x).mul_(pos_weight)).mul_(grad)
        else:
            gt = -x * grad
        if weight is not None:
            gt.mul_(weight)
        if reduction == MEAN:
            gt.div_(target.numel())
        return gt

    class BinaryCrossEntropyWithLogits(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, target, weight, pos_weight, reduction):
            ctx.save_for_backward(x, target, weight, pos_weight)
            ctx.reduction = reduction
            return native(x, target, weight, pos_weight, reduction)

        @staticmethod
        def backward(ctx, grad):
            x, target, weight, pos_weight = ctx.saved_tensors
            need = ctx.needs_input_grad
            gi = input_grad(grad, x, target, weight, pos_weight, ctx.reduction) if need[0] else None
            gt = target_grad(grad, x, target, weight, pos_weight, ctx.reduction) if need[1] else None
            return gi, gt, None, None, None

    def on_gpu(*ts):
        return all(
            t is None or (isinstance(t, Tensor) and t.is_meta and not _is_own(t)) for t in ts
        )

    def run(func, x, target, weight, pos_weight, reduction):
        if not (torch.is_grad_enabled() and (x.requires_grad or target.requires_grad)):
            return None
        if not on_gpu(x, target, weight, pos_weight):
            return None
        if weight is not None and weight.requires_grad or pos_weight is not None and pos_weight.requires_grad:
            return None  # no formula for them: PyTorch's own error
        return BinaryCrossEntropyWithLogits.apply(x, target, weight, pos_weight, reduction)

    def functional(func, args, kwargs):
        # F.binary_cross_entropy_with_logits' body (torch/nn/functional.py).
        names = ("input", "target", "weight", "size_average", "reduce", "reduction", "pos_weight")
        a = dict(zip(names, args))
        a.update(kwargs)
        x, target = a.get("input"), a.get("target")
        if not (isinstance(x, Tensor) and isinstance(target, Tensor)) or target.size() != x.size():
            return func(*args, **kwargs)
        if a.get("size_average") is not None or a.get("reduce") is not None:
            reduction = _reduction.legacy_get_enum(a.get("size_average"), a.get("reduce"))
        else:
            reduction = _reduction.get_enum(a.get("reduction", "mean"))
        out = run(func, x, target, a.get("weight"), a.get("pos_weight"), reduction)
        return func(*args, **kwargs) if out is None else out

    def aten_level(func, args, kwargs):
        names = ("input", "target", "weight", "pos_weight", "reduction")
        a = dict(zip(names, args))
        a.update(kwargs)
        x, target = a.get("input"), a.get("target")
        if not (isinstance(x, Tensor) and isinstance(target, Tensor)):
            return func(*args, **kwargs)
        out = run(func, x, target, a.get("weight"), a.get("pos_weight"), int(a.get("reduction", MEAN)))
        return func(*args, **kwargs) if out is None else out

    for f, h in ((F.binary_cross_entropy_with_logits, functional), (native, aten_level)):
        # After autocast's policy (its fp32 cast), which calls what it is
        # given with the arguments cast.
        inner = handlers.get(f)
        if inner is None:
            handlers[f] = h
        else:
            handlers[f] = lambda func, args, kwargs, inner=inner, h=h: inner(
                lambda *a, **k: h(func, a, k), args, kwargs
            )


# cuDNN's RNN modes (cudnnRNNMode_t), as torch.backends.cudnn.rnn names them.
_RNN_MODES = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}


def _rnn_handlers(torch, handlers):
    """nn.LSTM, nn.GRU and nn.RNN on the simulated GPU take cuDNN's path as
    on a GPU: `flatten_parameters()` puts the weights in one buffer (at
    `.cuda()`), and `_VF.lstm` & co. run `_cudnn_rnn` (its autograd node,
    its reserve, its backward) instead of ATen's cell loop, which is all
    meta can run by itself. cuDNN's buffers are vramscope's (`before`)."""
    meta = _state.meta
    cudnn = torch.backends.cudnn
    # at::native::cudnn_is_acceptable: cuDNN's RNNs take these dtypes.
    dtypes = (torch.float32, torch.float16, torch.float64)

    def acceptable(x):
        return (
            isinstance(x, torch.Tensor) and x.is_meta and x.dtype in dtypes
            and cudnn.enabled and x.numel() > 0
        )

    def weight_buf(params):
        # try_get_weight_buf: the weights' one storage, when they lie in it
        # in order from its start.
        p0 = params[0]
        st = p0.untyped_storage()
        at = 0
        for p in params:
            if p.untyped_storage()._cdata != st._cdata or p.storage_offset() != at or not p.is_contiguous():
                return None
            at += p.numel()
        n = st.nbytes() // p0.element_size()
        buf = torch.empty(0, dtype=p0.dtype, device=meta).set_(st, 0, (n,), (1,))
        return buf.narrow(0, 0, at) if n > at else buf

    def handler(name, mode):
        def h(func, args, kwargs):
            # The `.input` overload (the `.data` one, a packed sequence, has
            # the batch sizes second and its hidden state third).
            if kwargs or len(args) != 9 or isinstance(args[2], torch.Tensor):
                return func(*args, **kwargs)
            x, hx, params, has_biases, layers, dropout, train, bidir, batch_first = args
            if not acceptable(x):
                return func(*args, **kwargs)
            params = list(params)
            if name == "lstm":
                h0, c0 = hx[0], hx[1]
                hidden = c0.shape[-1]
                proj = h0.shape[-1] if h0.shape[-1] != hidden else 0
            else:
                h0, c0 = hx, None
                hidden, proj = h0.shape[-1], 0
            stride0 = len(params) // (layers * (2 if bidir else 1))
            buf = weight_buf(params)
            if buf is None:
                # _cudnn_rnn copies scattered weights into a buffer of its own.
                buf = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=meta)
            out = torch._cudnn_rnn(
                x, params, stride0, buf, h0, c0, mode, hidden, proj, layers,
                batch_first, float(dropout), bool(train), bool(bidir), [], None,
            )
            return (out[0], out[1], out[2]) if name == "lstm" else (out[0], out[1])

        return h

    for name, mode in _RNN_MODES.items():
        f = getattr(torch, name, None)
        if f is not None:
            handlers[f] = handler(name, mode)

    RNNBase = torch.nn.modules.rnn.RNNBase
    original = RNNBase.flatten_parameters

    def flatten_parameters(self):
        # _cudnn_rnn_flatten_weight: one zeroed buffer, every weight copied
        # in and `set_` onto its slice (its old storage dies). The meta
        # device cannot run it (it asks cuDNN for the layout), and its
        # data_ptr()s are all 0, so nn's own check never lets it try.
        ws = self._flat_weights
        if not (
            ws and len(ws) == len(self._flat_weights_names)
            and all(isinstance(w, torch.Tensor) and acceptable(w) for w in ws)
            and len({w.dtype for w in ws}) == 1
        ):
            return original(self)
        if len({(w.untyped_storage()._cdata, w.storage_offset()) for w in ws}) != len(ws):
            return None
        with torch.no_grad():
            buf = torch.zeros(sum(w.numel() for w in ws), dtype=ws[0].dtype, device=meta)
            st = buf.untyped_storage()
            at = 0
            for w in ws:
                w.set_(st, at, w.shape, _contiguous_strides(w.shape))
                at += w.numel()
        return None

    RNNBase.flatten_parameters = flatten_parameters


def _contiguous_strides(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))
