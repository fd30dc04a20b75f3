"""What vramscope is told of an op beyond its storages, for the CUDA rules
meta does not show: the op's report after it runs (`op`/`oa`: a GEMM's
workspace), the scratch a kernel takes before its outputs (`before`), its
outputs one at a time (`out`), what a data-dependent op was made from,
and an op that cannot be traced (`untraced`).

Imported at activation, after torch's own import (it binds torch's objects).
"""

import json
import weakref

import torch

from ._allocations import _in_backward, _lazy_init, _oom
from ._channel import _chan
from ._session import _state
from ._stack_walk import _op_stack, _stack

_Tensor = torch.Tensor


# The report of an after-op (`_after_op`), by its arguments' signature
# (`_signature`): what `_shapes` makes of them, as JSON, and `_arg_bytes`.
# Programs repeat a few shapes many times (every layer's GEMMs), so each
# signature is encoded once.
_REPORTS = {}


def _signature(args):
    """A key that fixes what `_shapes(args)` gives: a tensor's shape,
    strides (contiguity follows from the two) and dtype; a number or a
    list of numbers with its type (True, 1 and 1.0 are written apart); a
    float by its bits (`hex`: -0.0 and 0.0 apart, one key for NaN, as
    `_shapes` writes them). None where an argument could not be a key."""
    key = []
    push = key.append
    T = _Tensor
    for a in args:
        if isinstance(a, T):
            push((a.shape, a.stride(), a.dtype))
        elif a is None or a.__class__ is bool or a.__class__ is int:
            push((a.__class__, a))
        elif isinstance(a, (list, tuple)):
            if all(x.__class__ is int for x in a):
                push((int, tuple(a)))
            elif a and all(x.__class__ is bool for x in a):
                push((bool, tuple(a)))
            elif a and all(isinstance(x, T) for x in a):
                push(tuple((x.shape, x.stride(), x.dtype) for x in a))
            else:
                return None
        elif a.__class__ is float:
            push((float, a.hex()))
        elif isinstance(a, (bool, int, float)):
            return None
        else:
            push(0)  # `_shapes` writes it as null
    return tuple(key)


def _report_of(args, sig):
    """An op's arguments as its report carries them: (the JSON of
    `_shapes(args)`, their `_arg_bytes`), encoded once per signature
    (`sig`, `_signature(args)`)."""
    if sig is None:
        return _report_for(_shapes(args))
    hit = _REPORTS.get(sig)
    if hit is None:
        hit = _REPORTS[sig] = _report_for(_shapes(args))
    return hit


def _report_for(shapes):
    return (json.dumps(shapes, separators=(",", ":")).encode("utf-8"), _arg_bytes(shapes))


def _after_op(func, heads, report, box, backward, skey):
    """The CUDA rules meta does not show, for the ops vramscope names
    (`after_ops`): the op's name, whether autograd's thread runs it
    (`heads`: the two beginnings of its report), and its tensors' shapes
    and dtypes (`report`: `_report_of`); vramscope allocates what the
    kernel would. `skey`: (op, thread, signature), None where the call has
    no signature. A call vramscope said takes nothing at all (`still`: a
    GEMM whose thread's workspaces are cached and whose operands cuBLAS
    takes as they are) is not reported again with the same signature:
    asked once, then known (`_still`, until `_cuda_clearCublasWorkspaces`)."""
    st = _state
    if not st.initialized:
        _lazy_init()
    body, n = report
    head = heads[backward]
    key = (id(func), backward)
    # What vramscope said this call takes at most (bytes, storages): this
    # report's own (`same`: a reduction's staging buffers, a fused SDPA
    # backward's scratch), or, where it said the op takes nothing more on
    # this thread but clones of its arguments (`quiet`: a GEMM with its
    # workspaces cached), two clones of at most the arguments' bytes.
    bound = st.same.get(skey) if skey is not None else None
    if bound is None and key in st.quiet and (skey is None or skey in st.asked):
        bound = (n, 2)
    stack = _op_stack(box, 1)
    if bound is not None and st.room_count >= bound[1] and bound[0] <= st.room_bytes:
        # Within the headroom it cannot run out of memory: it need not wait.
        st.room_count -= bound[1]
        st.room_bytes -= bound[0]
        _chan.post_raw(b'["oa",%s%s,%d]' % (head, body, stack))
        return
    r = _chan.ask_raw(b'["op",%s%s,%d]' % (head, body, stack))
    if r[0] != "ok":
        raise _oom(r[1])
    if len(r) > 1 and isinstance(r[1], dict):
        if r[1].get("quiet"):
            st.quiet.add(key)
            if skey is not None:
                st.asked.add(skey)
        if r[1].get("still") and skey is not None:
            st.still.add(skey)
        same = r[1].get("same")
        if same is not None and skey is not None:
            st.same[skey] = tuple(same)


def _arg_bytes(shapes):
    """At most the bytes of an op's tensor arguments as `_shapes` wrote
    them (16 bytes an element: no dtype is wider)."""
    total = 0
    for a in shapes:
        if isinstance(a, dict):
            n = 16
            for d in a["shape"]:
                n *= d
            total += n
    return total


def _before_op(func, shapes, box, args, known=None):
    """Scratch a CUDA kernel takes before its outputs (vramscope's
    `before_ops`); the op's report after it runs frees what is left. The
    answer may size outputs the meta kernel cannot (`sizes`: output index →
    bytes, a cuDNN RNN's reserve; `rows`: a data-dependent op's, kept in
    `_state.rows` for its kernel here, `_data_dependent`). A data-dependent
    op's message says what its tensor was made from (`_route_of`)."""
    if not _state.initialized:
        _lazy_init()
    msg = ["before", func._opname, _in_backward(), shapes, _op_stack(box, 1)]
    if known is not None:
        # Its inputs' values are known: the size its result has on the CPU.
        msg.append({"known": int(known[0].shape[0])})
    else:
        route = _route_of(args) if func._opname in ("nonzero", "bincount") else None
        if route is not None:
            msg.append(route)
    r = _chan.ask(msg)
    if r[0] != "ok":
        raise _oom(r[1])
    answer = r[1] if len(r) > 1 else None
    _state.rows = answer.get("rows") if isinstance(answer, dict) else None
    return answer


def _route_of(args):
    """What a data-dependent op's tensor was made from, as far as the
    trace knows it: a router's top-k choice (`topk`/`argmax` indices, or a
    view of them) or a mask `chosen == e` of one (`_data_dependent`)."""
    x = args[0] if args else None
    if not isinstance(x, _Tensor):
        return None
    cd = x.untyped_storage()._cdata
    hit = _state.route_masks.get(cd) or _state.routes.get(cd)
    return {"router": hit[1]} if hit is not None else None


def _mark_route(table, t, info):
    """Keep `info` for `t`'s storage while it lives."""
    s = t.untyped_storage()
    cd = s._cdata

    def gone(_ref, cd=cd, table=table):
        hit = table.get(cd)
        if hit is not None and hit[0]() is None:
            del table[cd]

    table[cd] = (weakref.ref(s, gone), info)


def _resized(out, sizes):
    """The outputs vramscope sized (`sizes`): a byte tensor of that many
    bytes stands for the meta kernel's (whose size it could not know); an
    output with elements keeps its shape and dtype over a storage of that
    many bytes (`mse_loss`'s 0-dim mean lies in a full-size buffer)."""
    torch = _state.torch
    single = isinstance(out, torch.Tensor)
    out = [out] if single else list(out)
    for k, n in sizes.items():
        i = int(k)
        if i >= len(out):
            continue
        o = out[i]
        if o.dtype == torch.uint8 or o.numel() == 0:
            out[i] = torch.empty(int(n), dtype=torch.uint8, device=_state.meta)
        else:
            whole = torch.empty(max(int(n) // o.element_size(), o.numel()), dtype=o.dtype,
                                device=_state.meta)
            out[i] = whole.as_strided(o.shape, o.stride(), 0)
    return out[0] if single else tuple(out)


def _shapes(args):
    """The op's arguments as vramscope reads them: a tensor as its shape,
    dtype and contiguity; numbers and lists of numbers as they are; a list
    of tensors as a list of those."""
    T = _state.torch.Tensor

    def one(a):
        return {
            "shape": list(a.shape),
            "stride": list(a.stride()),
            "dtype": str(a.dtype)[6:],
            "contiguous": a.is_contiguous(),
        }

    out = []
    for a in args:
        if isinstance(a, T):
            out.append(one(a))
        elif a is None or isinstance(a, (bool, int, float)):
            out.append(a)
        elif isinstance(a, (list, tuple)) and all(isinstance(x, (bool, int)) for x in a):
            out.append(list(a))
        elif isinstance(a, (list, tuple)) and a and all(isinstance(x, T) for x in a):
            out.append([one(x) for x in a])
        else:
            out.append(None)
    return out


def _untraceable(func, err):
    """An op that cannot run without data or a GPU: named, with its line."""
    what = f"{func}"
    _chan.post(["untraced", what, str(err).splitlines()[0] if str(err) else "", _stack()])
    return NotImplementedError(
        f"vramscope trace: {what} cannot run on the simulated GPU (PyTorch's meta "
        f"device has no kernel for it, or its output size depends on data): {err}"
    )
