"""The function mode (`Relabel`): `device="cuda"`, `.cuda()`, `.to("cuda")`
land on PyTorch's meta device, a meta tensor says it is `cuda:0`, what
needs data gets known values or zeros, backward runs with the mode on,
and composite ops take the path they take on CUDA (dropout, softmax,
SDPA, autocast, RNNs, losses: their handlers are built here).

Imported at activation, after torch's own import.
"""

import functools
import weakref

from ._allocations import _seeded
from ._autocast import _autocast_handlers, _backward_autocast
from ._cuda_paths import _loss_handlers, _rnn_handlers, _sdpa_handler
from ._known import _FAKE, _fake_gone, _known
from ._own_meta import _is_own, _own_call
from ._session import _state


def _relabel_mode(torch):
    """The function mode, made (not pushed)."""
    from torch.overrides import TorchFunctionMode

    import torch.nn.functional as F

    meta = _state.meta
    cuda = _state.cuda
    Tensor = torch.Tensor

    def is_cuda_device(d):
        if isinstance(d, str):
            return d == "cuda" or d.startswith("cuda:")
        if isinstance(d, int) and not isinstance(d, bool):
            return True  # a bare index means a CUDA device in .to()/.cuda()
        return isinstance(d, torch.device) and d.type == "cuda"

    def map_device(d):
        return meta if is_cuda_device(d) else d

    def host_copy(t, dtype=None):
        # What the GPU would copy to the host: its values where they are
        # known (`_known`), else zeros of its shape and dtype, remembered
        # as made up (`_FAKE`: not known if moved back).
        k = _known(t)
        if k is not None:
            return k.to(dtype=dtype or t.dtype, copy=True)
        z = torch.zeros(t.shape, dtype=dtype or t.dtype)
        _FAKE[id(z)] = weakref.ref(z, functools.partial(_fake_gone, key=id(z)))
        return z

    def zero_of(t):
        if t.dtype.is_floating_point:
            return 0.0
        if t.dtype == torch.bool:
            return False
        if t.dtype.is_complex:
            return 0j
        return 0

    def is_meta_device(d):
        return (isinstance(d, str) and (d == "meta" or d.startswith("meta:"))) or (
            isinstance(d, torch.device) and d.type == "meta"
        )

    def h_to(func, args, kwargs):
        t = args[0]
        rest = list(args[1:])
        own = False
        for i, a in enumerate(rest):
            if isinstance(a, (str, torch.device)) or (isinstance(a, int) and not isinstance(a, bool) and i == 0):
                if is_cuda_device(a):
                    rest[i] = meta
                elif t.is_meta and _is_host(a):
                    return host_copy(t, _dtype_in(rest, kwargs))
                elif is_meta_device(a):
                    own = True
        if "device" in kwargs:
            d = kwargs["device"]
            if is_cuda_device(d):
                kwargs["device"] = meta
            elif t.is_meta and _is_host(d):
                return host_copy(t, kwargs.get("dtype"))
            elif is_meta_device(d):
                own = True
        if own:
            return _own_call("own", func, (t, *rest), kwargs)
        return func(t, *rest, **kwargs)

    def _is_host(d):
        return (isinstance(d, str) and (d == "cpu" or d.startswith("cpu:"))) or (
            isinstance(d, torch.device) and d.type == "cpu"
        )

    def _dtype_in(rest, kwargs):
        for a in rest:
            if isinstance(a, torch.dtype):
                return a
        return kwargs.get("dtype")

    def h_cuda(func, args, kwargs):
        t = args[0]
        if t.is_meta:
            return t
        kw = {k: v for k, v in kwargs.items() if k in ("non_blocking", "memory_format")}
        return Tensor.to(t, meta, **kw)

    def h_cpu(func, args, kwargs):
        t = args[0]
        return host_copy(t) if t.is_meta else func(*args, **kwargs)

    def h_item(func, args, kwargs):
        t = args[0]
        if not t.is_meta:
            return func(*args, **kwargs)
        k = _known(t)
        return k.item() if k is not None else zero_of(t)

    def h_tolist(func, args, kwargs):
        t = args[0]
        return host_copy(t).tolist() if t.is_meta else func(*args, **kwargs)

    def h_numpy(func, args, kwargs):
        t = args[0]
        return host_copy(t).numpy() if t.is_meta else func(*args, **kwargs)

    def h_scalar(conv):
        def h(func, args, kwargs):
            t = args[0]
            if not t.is_meta:
                return func(*args, **kwargs)
            k = _known(t)
            # A known value answers as the CPU tensor does (PyTorch's own
            # errors for more than one element included).
            return conv(k) if k is not None else conv(zero_of(t))

        return h

    def h_device(func, args, kwargs):
        d = func(*args, **kwargs)
        return cuda if d.type == "meta" and not _is_own(args[0]) else d

    def h_is_cuda(func, args, kwargs):
        t = args[0]
        return True if t.is_meta and not _is_own(t) else func(*args, **kwargs)

    def h_get_device(func, args, kwargs):
        t = args[0]
        return 0 if t.is_meta and not _is_own(t) else func(*args, **kwargs)

    def h_self(func, args, kwargs):
        return args[0]

    def h_none(func, args, kwargs):
        return None

    def h_false(func, args, kwargs):
        return False

    def h_copy_(func, args, kwargs):
        dst, src = args[0], args[1]
        if src.is_meta and not dst.is_meta:
            # A device-to-host copy: the value where it is known, else the
            # host keeps what it had.
            k = _known(src)
            if k is not None:
                dst.copy_(k)
            return dst
        return func(*args, **kwargs)

    def h_set_data(func, args, kwargs):
        # Module.to("cuda") sets `param.data = moved` to keep each Parameter
        # (and so tied weights) one object; a CPU tensor's data cannot be set
        # to a meta one, so the two objects swap contents instead: the same
        # Parameter, now on the simulated GPU, as on a real one.
        p, v = args[0], args[1]
        if v.is_meta and not p.is_meta:
            rg = p.requires_grad
            if isinstance(p, torch.nn.Parameter):
                v = torch.nn.Parameter(v, requires_grad=rg)
            torch.utils.swap_tensors(p, v)
            if p.requires_grad != rg:
                p.requires_grad_(rg)
            return None
        return func(*args, **kwargs)

    shallow_compatible = torch._has_compatible_shallow_copy_type

    # The same signature as PyTorch's (torch._dynamo's polyfill checks it).
    def compatible(input: torch.Tensor, from_: torch.Tensor) -> bool:
        # A CPU tensor and a meta one are what a CPU and a CUDA tensor are
        # on a GPU: dense, so `Module._apply` keeps its Parameters.
        if input.is_meta != from_.is_meta and input.layout == from_.layout == torch.strided:
            return True
        return shallow_compatible(input, from_)

    torch._has_compatible_shallow_copy_type = compatible

    from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
    from torch.autograd.graph import _engine_run_backward

    def run_backward(tensors, gradient, retain_graph, create_graph, inputs):
        # A function mode is off while it handles a call, and
        # torch.autograd.backward asks the modes again; but backward runs
        # the program's code (checkpoint recomputation, hooks), which must
        # see the simulated GPU as the forward did. So its body runs here,
        # with this mode on (torch/autograd/__init__.py `backward`).
        tensors = (tensors,) if isinstance(tensors, Tensor) else tuple(tensors)
        if inputs is None:
            inputs = ()
        elif isinstance(inputs, Tensor):
            inputs = (inputs,)
        else:
            inputs = tuple(inputs)
        with _state.relabel:
            grads = _tensor_or_tensors_to_tuple(gradient, len(tensors))
            grads = _make_grads(tensors, grads, is_grads_batched=False)
            if retain_graph is None:
                retain_graph = create_graph
            with _backward_autocast(torch), _seeded(grads):
                _engine_run_backward(
                    tensors, grads, retain_graph, create_graph, inputs,
                    allow_unreachable=True, accumulate_grad=True,
                )

    def h_backward(func, args, kwargs):
        names = ("gradient", "retain_graph", "create_graph", "inputs")
        a = dict(zip(names, args[1:]))
        a.update(kwargs)
        return run_backward(
            args[0], a.get("gradient"), a.get("retain_graph"), a.get("create_graph", False), a.get("inputs")
        )

    def h_autograd_backward(func, args, kwargs):
        names = ("tensors", "grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")
        a = dict(zip(names, args))
        a.update(kwargs)
        gradient = a.get("grad_tensors")
        if gradient is None:
            gradient = a.get("grad_variables")
        return run_backward(
            a["tensors"], gradient, a.get("retain_graph"), a.get("create_graph", False), a.get("inputs")
        )

    def h_grad(func, args, kwargs):
        # torch.autograd.grad's body (torch/autograd/__init__.py), run with
        # this mode on as backward() is: checkpoint recomputation and hooks
        # see the simulated GPU.
        names = (
            "outputs", "inputs", "grad_outputs", "retain_graph", "create_graph",
            "only_inputs", "allow_unused", "is_grads_batched", "materialize_grads",
        )
        a = dict(zip(names, args))
        a.update(kwargs)
        if a.get("is_grads_batched"):
            with _state.relabel, _backward_autocast(torch):
                return func(*args, **kwargs)
        outputs, inputs = a["outputs"], a["inputs"]
        t_outputs = (outputs,) if isinstance(outputs, Tensor) else tuple(outputs)
        if isinstance(inputs, (Tensor, torch.autograd.graph.GradientEdge)):
            inputs = (inputs,)
        else:
            inputs = tuple(inputs)
        create_graph = a.get("create_graph", False)
        materialize = a.get("materialize_grads", False)
        allow_unused = a.get("allow_unused")
        if allow_unused is None:
            allow_unused = materialize
        if materialize and not allow_unused:
            raise ValueError("Expected allow_unused to be True or not passed when materialize_grads=True, but got: allow_unused=False.")
        retain_graph = a.get("retain_graph")
        if retain_graph is None:
            retain_graph = create_graph
        with _state.relabel:
            grads = _tensor_or_tensors_to_tuple(a.get("grad_outputs"), len(t_outputs))
            grads = _make_grads(t_outputs, grads, is_grads_batched=False)
            with _backward_autocast(torch), _seeded(grads):
                result = _engine_run_backward(
                    t_outputs, grads, retain_graph, create_graph, inputs, allow_unused,
                    accumulate_grad=False,
                )
            if materialize:
                result = tuple(
                    r if r is not None else torch.zeros_like(i, requires_grad=True)
                    for r, i in zip(result, inputs)
                )
        return result

    def h_tensor(func, args, kwargs):
        # torch.tensor(data, device="cuda") makes its tensor on the host and
        # copies it to the device inside C++, where no mode sees the copy:
        # the device tensor would be counted at its first in-place use. As
        # on a GPU, the host tensor, then its copy (one storage, now).
        d = kwargs.get("device")
        if d is not None and is_cuda_device(d):
            kw = {k: v for k, v in kwargs.items() if k not in ("device", "requires_grad", "pin_memory")}
            t = Tensor.to(func(*args, **kw), meta)
            if kwargs.get("requires_grad"):
                t.requires_grad_(True)
            return t
        if d is not None and is_meta_device(d):
            return _own_call("own", func, args, kwargs)
        return func(*args, **kwargs)

    def h_parse_to(func, args, kwargs):
        # Module.to's argument parser returns the device it was given:
        # "cuda" stays CUDA (each tensor's own `.to` relabels it), so that
        # meta, there, is only ever the program's own.
        return func(*args, **kwargs)

    def h_dropout(func, args, kwargs):
        # ATen's dropout takes the fused kernel (a bool mask) only for CUDA
        # inputs (`is_fused_kernel_acceptable`); on meta it would multiply by
        # an input-sized float noise tensor. Out of place, in training,
        # 0 < p < 1: native_dropout, as the GPU runs it.
        names = ("input", "p", "training", "inplace") if func is F.dropout else ("input", "p", "train")
        a = dict(zip(names, args))
        a.update(kwargs)
        x = a.get("input")
        p = float(a.get("p", 0.5))
        train = a.get("training", a.get("train", True))
        if (
            isinstance(x, Tensor) and x.is_meta and train and not a.get("inplace", False)
            and 0.0 < p < 1.0 and x.numel() > 0
        ):
            return torch.native_dropout(x, p, True)[0]
        return func(*args, **kwargs)

    def h_softmax(half_to_float):
        # softmax(x_half, dim, dtype=float32) on CUDA runs the kernel with
        # half_to_float (no converted copy; SoftMax.cpp checks is_cuda()).
        def h(func, args, kwargs):
            x = args[0] if args else kwargs.get("input")
            dtype = kwargs.get("dtype")
            if dtype is None:
                dtype = next((a for a in args[1:] if isinstance(a, torch.dtype)), None)
            dim = kwargs.get("dim", args[1] if len(args) > 1 and isinstance(args[1], int) else None)
            if (
                isinstance(x, Tensor) and x.is_meta and x.dtype == torch.float16
                and dtype == torch.float32 and dim is not None
            ):
                return half_to_float(x, dim, True)
            return func(*args, **kwargs)

        return h

    handlers = {
        F.dropout: h_dropout,
        torch.dropout: h_dropout,
        Tensor.backward: h_backward,
        torch.autograd.backward: h_autograd_backward,
        torch.autograd.grad: h_grad,
        Tensor.data.__set__: h_set_data,
        Tensor.to: h_to,
        Tensor.cuda: h_cuda,
        Tensor.cpu: h_cpu,
        Tensor.item: h_item,
        Tensor.tolist: h_tolist,
        Tensor.numpy: h_numpy,
        Tensor.__bool__: h_scalar(bool),
        Tensor.__float__: h_scalar(float),
        Tensor.__int__: h_scalar(int),
        Tensor.__index__: h_scalar(int),
        Tensor.device.__get__: h_device,
        Tensor.is_cuda.__get__: h_is_cuda,
        Tensor.get_device: h_get_device,
        Tensor.pin_memory: h_self,
        Tensor.is_pinned: h_false,
        Tensor.record_stream: h_none,
        Tensor.copy_: h_copy_,
        torch.tensor: h_tensor,
    }
    if hasattr(torch._C._nn, "_parse_to"):
        handlers[torch._C._nn._parse_to] = h_parse_to
    for f in (F.softmax, torch.softmax, Tensor.softmax):
        handlers[f] = h_softmax(torch._softmax)
    for f in (F.log_softmax, torch.log_softmax, Tensor.log_softmax):
        handlers[f] = h_softmax(torch._log_softmax)
    sdpa = _sdpa_handler(torch)
    if sdpa is not None:
        handlers[F.scaled_dot_product_attention] = sdpa
    autocast_made = _autocast_handlers(torch, handlers)
    _rnn_handlers(torch, handlers)
    _loss_handlers(torch, handlers)
    # The functions whose handler is only an autocast policy (a GEMM's
    # `matmul`): while autocast is off they are called here, without the
    # handler's frame.
    autocast_only = {f for f, h in handlers.items() if h in autocast_made}
    autocast_on = torch.is_autocast_enabled

    class Relabel(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            h = handlers.get(func)
            if h is not None:
                if func in autocast_only and not autocast_on():
                    return func(*args, **kwargs)
                return h(func, args, kwargs)
            d = kwargs.get("device")
            if d is not None:
                if is_cuda_device(d):
                    kwargs["device"] = meta
                    if _state.own_seen:
                        return _own_call("gpu", func, args, kwargs)
                elif is_meta_device(d):
                    return _own_call("own", func, args, kwargs)
            return func(*args, **kwargs)


    return Relabel()
