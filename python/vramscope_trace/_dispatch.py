"""The dispatch mode (`Allocations`): every aten op's outputs are traced
(`_allocations`), the ops vramscope names are reported (`_reports`), known
values follow (`_known`), and ops that take another branch on CUDA than
under a dispatch mode take the CUDA one (a gradient summed in place,
`_meta_kernels`).

Imported at activation, after torch's own import (it binds torch's objects).
"""

import json
import sys

import torch

from ._allocations import _in_backward, _malloc, _register, _register_staged
from ._channel import _chan
from ._known import _KV, _from_known, _known_rows, _value_rule, _values
from ._meta_kernels import _meta_impls
from ._own_meta import _mark_own, _own_op
from ._patches import _cuda_kernel_of
from ._reports import (
    _after_op, _before_op, _report_for, _report_of, _resized, _shapes, _signature, _untraceable,
)
from ._session import _DEBUG, _state
from ._stack_walk import _set_dispatch_code, _stack
from ._steps import _asked_walk

_Tensor = torch.Tensor
_current_node = torch._C._current_autograd_node
# The keyword arguments of a call that has none (never changed).
_NO_KWARGS = {}


def _allocations_mode(torch):
    """The dispatch mode, made (not pushed)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    Tensor = torch.Tensor
    add_tensor = torch.ops.aten.add.Tensor
    use_count = torch._C._storage_Use_Count
    from torch._prims_common import is_non_overlapping_and_dense_or_false as dense

    def accumulate(args, kwargs):
        """autograd's InputBuffer::accumulate, as on a GPU. On meta (and
        under a dispatch mode) PyTorch counts every tensor as "subclass-like"
        and always adds out of place; on CUDA it adds into the old gradient
        when it holds the last reference to it and its storage and grad mode
        is off. None: not such an addition."""
        if kwargs or len(args) != 2 or torch.is_grad_enabled() or not _in_backward():
            return None
        old, new = args
        if not (isinstance(old, Tensor) and isinstance(new, Tensor) and old.is_meta and new.is_meta):
            return None
        # `can_accumulate_inplace` (input_buffer.cpp): a layout that is
        # non-overlapping and dense, not only a contiguous one (a permuted
        # gradient, a transposed view's, is summed in place too).
        if old.shape != new.shape or old.dtype != new.dtype or not dense(old):
            return None
        # untyped_storage() itself holds one reference while asked. A
        # matmul's input gradient is a reshape of the mm's result to the
        # input's rank (`ViewBackward0` of the fold `input.reshape(-1, k)`),
        # made without grad mode: here a view whose `_base` holds the
        # storage once more, where the engine (an H100 capture's rule: the
        # q/k/v and gate/up projections' input gradients of a Llama layer
        # are summed in place, llama_lora_finetune) counts none. Only that
        # unfold (a whole 2-D base seen with more dimensions) counts so; any
        # other view keeps its base, as the engine's do (a tied weight's
        # transposed gradient is summed out of place on the H100).
        key = old.untyped_storage()._cdata
        # A seed (the `grad_tensors` of a backward: a reentrant checkpoint's
        # incoming gradients) is held by the caller and by the task's
        # GraphRoot while the backward runs: its TensorImpl's use count is
        # above 1 (`adjusted_use_count(v) == 1` fails), so it is summed
        # out of place.
        if key in _state.seeds:
            return None
        refs = use_count(key)
        base = old._base if old._is_view() else None
        if base is not None and base.dim() == 2 and old.dim() > 2 and base.numel() == old.numel():
            refs -= 1
        if refs != 2:
            return None
        return old.add_(new)

    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    function_modes = torch._C._len_torch_function_stack
    function_mode_at = torch._C._get_function_stack_at

    def from_engine():
        """Whether the op comes from the autograd engine's C++ (a backward
        formula, validate_outputs) rather than from Python: a call from
        Python passes the function mode, which is off the stack while it
        handles the call; the engine runs with it on (`run_backward`)."""
        n = function_modes()
        return n > 0 and function_mode_at(n - 1) is _state.relabel
    impls = _meta_impls(torch)
    op_overload_call = torch._ops.OpOverload.__call__
    inplace_add = torch.ops.aten.add_.Tensor
    bump = torch.autograd.graph.increment_version

    def rule_of(func):
        name = getattr(func, "_opname", "")
        full = func.name()
        # A composite op reaches this mode undecomposed only where autograd's
        # keys are off (inference_mode): on CUDA it runs its decomposition,
        # whose ops (native_layer_norm's mean and rstd) the meta device's
        # own kernel for the composite may leave out.
        composite = has_kernel(full, "CompositeImplicitAutograd") and not has_kernel(full, "CUDA")
        rule = (
            name in _state.after_ops,
            _state.host_outputs.get(name),
            name in _state.before_ops,
            name in _state.staged_ops,
            _state.register_order.get(name),
            composite,
            name.startswith("_foreach_") and name.endswith("_"),
            _state.autocast_policy_of(func),
            impls.get(func),
            func,
            # Its report's first fields, on the program's thread and on
            # autograd's (`_after_op`).
            (b"%s,false," % json.dumps(name).encode(), b"%s,true," % json.dumps(name).encode()),
            _cuda_kernel_of(torch, func),
        )
        # Nothing but its outputs' storages (most ops): `__torch_dispatch__`'s
        # short way.
        plain = not any(rule[:9]) and rule[11] is None
        # What runs the op: an OpOverload's `__call__` only passes its
        # arguments to `_op` (a Python frame per op saved); a subclass's
        # own `__call__` (TorchBindOpOverload's) is kept.
        call = func._op if type(func).__call__ is op_overload_call else func
        # How its outputs take known values (`_values`).
        vr = _value_rule(torch, func, name)
        # Its outputs' storages and the after-op report only (a GEMM's
        # `mm`): `__torch_dispatch__`'s second short way, where its autocast
        # policy (rule[7]) is not asked (no backward under autocast).
        report_only = (
            rule[0] and not any(rule[1:7]) and not rule[8] and rule[11] is None and not vr[5]
        )
        return rule + (plain, vr, call, report_only)

    # The rules of ops that take no attribute, by id (kept alive by their
    # rule).
    rules = {}

    def keep_rule(func, rule):
        """The op's rule, kept on the op itself (`_vramscope_rule`): a
        lookup by the op (an OpOverload's hash is a Python method) or by
        `id()` (an audited builtin) costs more than an attribute."""
        try:
            func._vramscope_rule = rule
        except AttributeError:
            rules[id(func)] = rule
        return rule

    def rule_for(func):
        rule = rules.get(id(func))
        return rule if rule is not None else keep_rule(func, rule_of(func))

    class Allocations(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            # torch.compile runs eagerly under the trace (`_compile_eagerly`),
            # so dynamo never meets this mode: its guard around every op
            # (`torch._disable_dynamo`) would only cost time.
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is add_tensor:
                out = accumulate(args, kwargs)
                if out is not None:
                    return out
                if _state.math_sdpa and not kwargs and len(args) == 2:
                    # Inside SDPA's math backend the mask is added in place
                    # on CUDA; the `areAnyTensorSubclassLike` branch that
                    # meta takes adds it out of place.
                    return inplace_add(*args)
            if _state.own_seen and _own_op(args, kwargs):
                # The program's own meta device: no GPU memory (`_own_op`).
                out = func(*args, **(kwargs or {}))
                _mark_own(out)
                return out
            try:
                rule = func._vramscope_rule
            except AttributeError:
                rule = rule_for(func)
            if rule[12] or rule[15] and (rule[7] is None or _state.backward_autocast is None):
                # The short ways: an op that makes only its outputs'
                # storages (rule[12], most ops), or that and the after-op
                # report (rule[15], a GEMM's `mm`, whose autocast policy is
                # asked only under a backward's autocast).
                if rule[15]:
                    backward = _current_node() is not None
                    # `_signature`'s key, made here for a two-tensor call.
                    if len(args) == 2 and not kwargs:
                        a, b = args
                        if isinstance(a, _Tensor) and isinstance(b, _Tensor):
                            sig = ((a.shape, a.stride(), a.dtype), (b.shape, b.stride(), b.dtype))
                        else:
                            sig = _signature(args)
                    else:
                        sig = _signature(args)
                    skey = (id(func), backward, sig) if sig is not None else None
                    report = _report_of(args, sig) if skey is None or skey not in _state.still else None
                else:
                    report = None
                box = [None]
                pre = None
                vr = rule[13]
                try:
                    out = rule[14](*args, **(kwargs or _NO_KWARGS))
                except (NotImplementedError, RuntimeError) as e:
                    # Meta cannot; the CPU can where the values are known.
                    known = _from_known(func, vr, args, kwargs, box, e)
                    if known is None:
                        if isinstance(e, NotImplementedError):
                            raise _untraceable(func, e) from None
                        raise
                    out, pre = known
                if _DEBUG:
                    print(f"vramscope trace: {func} {(_current_node().name() if _current_node() is not None else '')}", file=sys.stderr)
                if isinstance(out, _Tensor):
                    # One tensor (most ops): `_register`'s first case, here.
                    if out.is_meta:
                        _malloc(out, box, 1)
                else:
                    _register(out, box)
                if report is not None:
                    _after_op(func, rule[10], report, box, backward, skey)
                if _KV or vr[4] or pre is not None:
                    _values(func, vr, args, kwargs, out, pre)
                if _state.walk_asked:
                    _asked_walk()
                return out
            if rule[7] is not None and _state.backward_autocast is not None and from_engine():
                # An op a backward formula calls (C++, never through the
                # function mode) while the backward runs under autocast.
                args, kwargs = rule[7](args, kwargs or {}, self)
            if rule[5]:
                with self:
                    out = func.decompose(*args, **(kwargs or {}))
                if out is not NotImplemented:
                    return out
            if rule[11] is not None:
                # An extension's CUDA kernel in Python (`_extension_kernels`):
                # it runs as on the GPU, seeing the simulated device, its
                # tensors traced, its native calls skipped.
                relabel = _state.relabel if not from_engine() else None
                _state.in_cuda_kernel += 1
                try:
                    if relabel is not None:
                        relabel.__enter__()
                    try:
                        with self:
                            return rule[11](*args, **(kwargs or {}))
                    finally:
                        if relabel is not None:
                            relabel.__exit__(None, None, None)
                except torch.cuda.OutOfMemoryError:
                    raise
                except Exception as e:  # noqa: BLE001 - named, then the fake kernel
                    # The kernel asked for what the simulation has not (a CUDA
                    # call of its own): said once, and from now on the op
                    # runs its fake kernel, whose outputs are traced.
                    rule = keep_rule(func, rule[:11] + (None, False) + rule[13:])
                    _chan.post(
                        [
                            "untraced",
                            f"{func} (its CUDA kernel in Python)",
                            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                            _stack(),
                            "ran its fake kernel: its outputs traced, the CUDA kernel's temporaries not",
                        ]
                    )
                finally:
                    _state.in_cuda_kernel -= 1
            # The op's stack, walked at its first report (`_op_stack`).
            box = [None]
            if rule[2] or rule[3]:
                shapes = _shapes(args)
                report = _report_for(shapes) if rule[0] else None
            else:
                shapes = None
                report = None
                if rule[0]:
                    backward = _current_node() is not None
                    sig = _signature(args)
                    skey = (id(func), backward, sig) if sig is not None else None
                    if skey is None or skey not in _state.still:
                        report = _report_of(args, sig)
            vr = rule[13]
            # A data-dependent op with known inputs: its true size, from
            # the CPU, before vramscope is told of it.
            pre = _known_rows(func, vr, args, kwargs) if vr[5] else None
            sizes = _before_op(func, shapes, box, args, pre) if rule[2] else None
            versions = [t._version for t in args[0]] if rule[6] and args else None
            try:
                impl = rule[8]
                out = impl(*args, **(kwargs or {})) if impl else rule[14](*args, **(kwargs or _NO_KWARGS))
            except (NotImplementedError, RuntimeError) as e:
                known = _from_known(func, vr, args, kwargs, box, e) if pre is None else None
                if known is None:
                    if isinstance(e, NotImplementedError):
                        raise _untraceable(func, e) from None
                    raise
                out, pre = known
            if versions is not None:
                # CUDA's in-place foreach kernels bump their first list's
                # versions (`increment_version(tensors)`); the per-tensor
                # path meta takes under a dispatch mode does not.
                for t, v in zip(args[0], versions):
                    if t._version == v:
                        bump(t)
            if _DEBUG:
                print(f"vramscope trace: {func} {(_current_node().name() if _current_node() is not None else '')}", file=sys.stderr)
            if sizes and sizes.get("sizes"):
                out = _resized(out, sizes["sizes"])
            if rule[3]:
                _register_staged(func, out, shapes, box, rule[4])
            elif rule[4]:
                _register([out[i] for i in rule[4] if i < len(out)], box, rule[1])
            elif not rule[1] and isinstance(out, _Tensor):
                # One tensor none of whose outputs the GPU keeps on the host
                # (a GEMM's): `_register`'s first case, here.
                if out.is_meta:
                    _malloc(out, box, 1)
            else:
                _register(out, box, rule[1])
            if report is not None:
                if shapes is not None:
                    backward, skey = _current_node() is not None, None
                _after_op(func, rule[10], report, box, backward, skey)
            if _KV or vr[4] or pre is not None:
                _values(func, vr, args, kwargs, out, pre)
            if _state.walk_asked:
                _asked_walk()
            return out

    _set_dispatch_code(Allocations.__torch_dispatch__.__code__)
    return Allocations()
