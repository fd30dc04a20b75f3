"""Known values: a small tensor on the simulated GPU whose values follow
from values the program had carries them as a CPU tensor beside the meta
one, which `.item()`, `bool()`, `.cpu()` and data-dependent ops read.

Imported at activation, after torch's own import (it binds torch's objects).
"""

import functools
import weakref

import torch

from ._channel import TraceError, _chan
from ._session import _state
from ._stack_walk import _op_stack

_Tensor = torch.Tensor

# The simulated GPU's tensors hold no data (meta), but many of a program's
# values follow from values it had: `torch.arange(T) + past`, a mask of it,
# its own input ids moved to the device, `torch.tensor([...])`. A small
# tensor whose values follow so carries them: a real CPU tensor beside the
# meta one, which `bool()`, `.item()`, `.tolist()`, `.cpu()` answer from and
# a data-dependent op (`nonzero`, `x[mask]`, `bincount`, `unique`) takes its
# true size from. Bounded (`KNOWN_MAX` elements): the values a program's
# control flow reads are positions, masks, counts and flags, far below it,
# while activations and weights (which come from random initialisation or
# from an unknown value anyway) are far above it; each kept copy costs at
# most 512 KiB of host memory (int64/float64) and one CPU op per op on it.
KNOWN_MAX = 1 << 16
# A storage of at most this many bytes can hold a known value (KNOWN_MAX
# elements of the widest dtype, complex128): a tensor wider than this
# cannot alias one (`_forget`).
_KNOWN_BYTES = KNOWN_MAX * 16

# id(meta tensor) -> (weak reference to it, its CPU value, its cell). A cell
# `[alive, storage key]` is shared by every known view of one storage: a
# write that cannot be computed kills it, and so every alias at once. Keyed
# by id (a dict lookup per argument is all the common path pays), each
# entry dropped when its tensor dies; it never keeps a storage alive.
_KV = {}
# meta storage key (_cdata) -> the cell of the known value on it: a write
# through a tensor that is not known by id (`.data`, a Parameter made from
# it) still kills it.
_KSTORE = {}
# Host tensors the helper made up for unknown values (zeros, `host_copy`),
# id -> weak reference: moved back to the GPU they are not known.
_FAKE = {}

# How an op's outputs take values (`_value_rule`).
_V_NORMAL = 0  # from its inputs' values, when every one is known
_V_SOURCE = 1  # a factory with no tensor argument (arange, zeros, full, eye)
_V_LIKE = 2  # from its tensor arguments' shapes only (zeros_like, new_ones)
_V_OVERWRITE = 3  # writes all of its first argument (copy_, fill_, zero_)
_V_NEVER = 4  # random, or undefined memory (randn, dropout, empty)

_LIKE_OPS = frozenset(("zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full"))
_OVERWRITE_OPS = frozenset(("copy_", "fill_", "zero_"))
_NO_DATA_OPS = frozenset((
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
    "resize_", "resize_as_", "set_", "_resize_output_", "uniform_", "normal_", "bernoulli_",
    "exponential_", "geometric_", "log_normal_", "cauchy_", "random_",
))
# Ops whose output size the data decide and vramscope is told before they
# run (`before`): with a known input, the known output's rows.
_ROWS_OPS = frozenset(("nonzero", "bincount"))
# Ops meta cannot run at all (no kernel, or a size it cannot know): with
# known inputs they run on the CPU and their outputs take its shapes.
_CPU_ONLY_OPS = frozenset((
    "_local_scalar_dense", "repeat_interleave", "_unique2", "unique_dim", "unique_consecutive",
    "_unique", "equal", "masked_select", "nonzero", "nonzero_static", "bincount", "argwhere",
))


class _Unknown(Exception):
    """An argument has no known value: the op's outputs are unknown."""


def _value_rule(torch, func, name):
    """(how the op's outputs take values, written positional arguments,
    written keyword arguments, whether its outputs are views of its first
    argument, whether to look at it even when nothing is known (a source,
    or a host tensor moved to the device), whether its size needs the
    values before it runs (`_ROWS_OPS`), whether meta cannot run it
    (`_CPU_ONLY_OPS`), whether it writes any argument: `_forget_written`
    is called only then)."""
    schema = func._schema
    writes = tuple(
        i for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only
    )
    writes_kw = tuple(
        a.name for a in schema.arguments
        if a.alias_info is not None and a.alias_info.is_write and a.kwarg_only
    )
    views = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    tensors = any("Tensor" in str(a.type) for a in schema.arguments)
    if torch.Tag.nondeterministic_seeded in func.tags or name in _NO_DATA_OPS:
        mode = _V_NEVER
    elif name in _LIKE_OPS:
        mode = _V_LIKE
    elif name in _OVERWRITE_OPS:
        mode = _V_OVERWRITE
    elif not tensors:
        mode = _V_SOURCE
    else:
        mode = _V_NORMAL
    always = mode in (_V_SOURCE, _V_LIKE) or name in ("_to_copy", "copy_")
    return (
        mode, writes, writes_kw, views, always, name in _ROWS_OPS, name in _CPU_ONLY_OPS,
        bool(writes or writes_kw),
    )


def _known(t):
    """The CPU value of a simulated-GPU tensor, or None (unknown)."""
    e = _KV.get(id(t))
    if e is not None and e[2][0] and e[0]() is t:
        return e[1]
    return None


def _fake_gone(ref, key=None):
    f = _FAKE.get(key)
    if f is ref:
        del _FAKE[key]


def _kv_gone(ref, key=None):
    e = _KV.get(key)
    if e is not None and e[0] is ref:
        del _KV[key]


def _keep(t, cpu, cell):
    key = id(t)
    _KV[key] = (weakref.ref(t, functools.partial(_kv_gone, key=key)), cpu, cell)


def _new_cell(t):
    """A cell for a known value on a storage of its own (a new output, or
    one the op wrote whole): a value known before on that storage is not
    any more."""
    cell = [True, None]
    if t.numel() > 0:
        cd = t.untyped_storage()._cdata
        old = _KSTORE.get(cd)
        if old is not None:
            old[0] = False
        _KSTORE[cd] = cell
        cell[1] = cd
    return cell


def _forget(t):
    """A write to `t` that was not computed: its value, and every alias's,
    is unknown from now on."""
    if not isinstance(t, _Tensor) or not t.is_meta:
        return
    e = _KV.get(id(t))
    if e is not None and e[0]() is t:
        cell = e[2]
    elif _KSTORE and t.numel() * t.element_size() <= _KNOWN_BYTES:
        cell = _KSTORE.get(t.untyped_storage()._cdata)
    else:
        return
    if cell is not None and cell[0]:
        cell[0] = False
        if cell[1] is not None and _KSTORE.get(cell[1]) is cell:
            del _KSTORE[cell[1]]


def _forget_written(vr, args, kwargs):
    for i in vr[1]:
        if i < len(args):
            a = args[i]
            if isinstance(a, (list, tuple)):
                for t in a:
                    _forget(t)
            else:
                _forget(a)
    if kwargs:
        for k in vr[2]:
            a = kwargs.get(k)
            if isinstance(a, (list, tuple)):
                for t in a:
                    _forget(t)
            elif a is not None:
                _forget(a)


def _any_known(args, kwargs):
    kv = _KV
    for a in args:
        if id(a) in kv:
            return True
        if a.__class__ is list or a.__class__ is tuple:
            for b in a:
                if id(b) in kv:
                    return True
    if kwargs:
        for a in kwargs.values():
            if id(a) in kv:
                return True
    return False


def _small(out):
    """Whether every output could carry a known value (at most KNOWN_MAX
    elements): only then is the op run on the CPU."""
    T = _Tensor
    if isinstance(out, T):
        return out.numel() <= KNOWN_MAX
    if isinstance(out, (list, tuple)):
        for o in out:
            if not _small(o):
                return False
    return True


def _cpu_of(a, like, fresh):
    """An argument as the CPU op takes it: a known tensor's value, a host
    tensor as it is, the meta device as the CPU; `_Unknown` for a tensor
    without a value. `like`: a meta tensor stands for its shape only (an
    empty CPU tensor of it). `fresh`: the tensor an overwrite writes whole,
    unknown so far, gets a new CPU tensor (kept in `fresh`)."""
    T = _Tensor
    if isinstance(a, T):
        if a.is_meta:
            k = _known(a)
            if k is not None:
                return k
            torch = _state.torch
            if like:
                return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype)
            if fresh is not None and not fresh and _whole(a):
                k = torch.empty(a.shape, dtype=a.dtype)
                fresh.append((a, k))
                return k
            raise _Unknown
        f = _FAKE.get(id(a))
        if (f is not None and f() is a) or isinstance(a, _state.torch.nn.Parameter):
            raise _Unknown
        return a
    if isinstance(a, (list, tuple)):
        return a.__class__(_cpu_of(b, like, None) for b in a)
    if isinstance(a, _state.torch.device) and a.type == "meta":
        return _state.torch.device("cpu")
    return a


def _whole(t):
    """A small contiguous tensor that is its storage's only content: an
    overwrite of it makes it known on a storage of its own."""
    return (
        t.numel() <= KNOWN_MAX
        and t.is_contiguous()
        and t.storage_offset() == 0
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    )


def _compute(func, vr, args, kwargs):
    """The op on its arguments' CPU values: (its CPU result, the overwritten
    tensors made known), or None where an argument is unknown or the CPU
    cannot run it."""
    mode = vr[0]
    fresh = [] if mode == _V_OVERWRITE else None
    try:
        cargs = [
            _cpu_of(a, mode == _V_LIKE and i == 0, fresh if i == 0 else None)
            for i, a in enumerate(args)
        ]
        ckw = {k: _cpu_of(v, False, None) for k, v in kwargs.items()} if kwargs else {}
    except _Unknown:
        return None
    ckw.pop("pin_memory", None)
    # One thread: these are small ops, and an intra-op thread pool waiting
    # on a busy machine's other core costs a 64 x 64 matmul 2 ms instead of
    # 8 µs (measured); the program's own setting is put back.
    torch = _state.torch
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        return func(*cargs, **ckw), fresh
    except Exception:  # noqa: BLE001 - the CPU cannot: the values are unknown
        return None
    finally:
        if threads != 1:
            torch.set_num_threads(threads)


def _pairs(out, res):
    T = _Tensor
    if isinstance(out, T):
        if isinstance(res, T):
            yield out, res
    elif isinstance(out, (list, tuple)) and isinstance(res, (list, tuple)) and len(out) == len(res):
        for o, r in zip(out, res):
            yield from _pairs(o, r)


def _attach(vr, args, out, computed):
    """Keep the CPU result beside the op's meta outputs: a view shares its
    input's cell, a new output has its own."""
    res, fresh = computed
    for t, k in fresh or ():
        _keep(t, k, _new_cell(t))
    cell = None
    if vr[3] and args and isinstance(args[0], _Tensor):
        e = _KV.get(id(args[0]))
        if e is not None and e[0]() is args[0] and e[2][0]:
            cell = e[2]
    for m, c in _pairs(out, res):
        if not m.is_meta or c.is_meta:
            continue
        e = _KV.get(id(m))
        if e is not None and e[1] is c and e[0]() is m:
            continue  # written in place: its value is already updated
        if m.shape != c.shape or m.dtype != c.dtype or m.numel() > KNOWN_MAX:
            continue
        _keep(m, c, cell if cell is not None else _new_cell(m))


def _values(func, vr, args, kwargs, out, pre=None):
    """After an op ran on meta: its outputs' values where its inputs' are
    known (or it needs none), and a write it could not compute makes what
    it wrote unknown. `pre`: the op already ran on the CPU (its size came
    from that)."""
    mode = vr[0]
    if mode == _V_NEVER:
        if vr[7]:
            _forget_written(vr, args, kwargs)
        return
    if pre is None:
        if (
            (not vr[4] and not _any_known(args, kwargs))
            or not _small(out)
        ):
            if vr[7]:
                _forget_written(vr, args, kwargs)
            return
        pre = _compute(func, vr, args, kwargs)
        if pre is None:
            if vr[7]:
                _forget_written(vr, args, kwargs)
            return
    _attach(vr, args, out, pre)


def _known_rows(func, vr, args, kwargs):
    """A data-dependent op (`_ROWS_OPS`) with known inputs, run on the CPU
    before it runs on meta: (its CPU result, None), or None."""
    if not _KV or not _any_known(args, kwargs):
        return None
    return _compute(func, vr, args, kwargs)


def _from_known(func, vr, args, kwargs, box, err):
    """An op meta cannot run (`err`: no kernel, a size only the data
    give), with known inputs: run on the CPU, its outputs made on meta with
    the CPU result's shapes, and said (`known`). None where it cannot (and
    never for the simulated OOM or a broken channel)."""
    if not vr[6] or not _KV or not _any_known(args, kwargs):
        return None
    if isinstance(err, (TraceError, _state.torch.cuda.OutOfMemoryError)):
        return None
    computed = _compute(func, vr, args, kwargs)
    if computed is None:
        return None
    res = computed[0]
    meta = _state.meta
    T = _Tensor

    def make(r):
        if isinstance(r, T):
            return _state.torch.empty_strided(r.shape, r.stride(), dtype=r.dtype, device=meta)
        if isinstance(r, (list, tuple)):
            return r.__class__(make(x) for x in r)
        return r

    _chan.post(["known", f"{func}", _op_stack(box, 1)])
    return make(res), computed
