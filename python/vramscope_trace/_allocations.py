"""Storages: each new storage an op makes is a `malloc` (sent without
waiting within the headroom vramscope gave, else waiting for an address or
an OOM), and a weak reference on it sends its `free` when it dies.

Imported at activation, after torch's own import (it binds torch's objects).
"""

import os
import sys
import weakref

import torch

from ._channel import _F, _F_LEN, _MA, _MA_LEN, SEND_EVERY, _chan
from ._known import _KSTORE
from ._session import _DEBUG, _state
from ._stack_walk import _op_stack
from ._steps import _find_holders

# Set once: torch.Tensor, and the autograd node running on this thread
# (None outside a backward).
_Tensor = torch.Tensor
_current_node = torch._C._current_autograd_node

# Environment variables PyTorch reads when CUDA starts (the allocator's
# config and the cuBLAS / cuBLASLt workspaces); sent with `init`.
CUDA_ENV = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUBLASLT_WORKSPACE_SIZE",
    "TORCH_CUBLAS_WORKSPACE_CACHE",
)


def _lazy_init():
    """PyTorch reads the allocator's config and the workspace variables when
    CUDA starts: the first allocation or query. So does vramscope."""
    if _state.initialized:
        return
    _state.initialized = True
    env = {k: os.environ.get(k) for k in CUDA_ENV}
    r = _chan.ask(["init", env])
    if r[0] != "ok":
        raise RuntimeError(r[1])


def _oom(message):
    """The exception for a request that did not fit. First, what holds the
    memory then, by name (`_find_holders`): the frames are the program's as
    it made the request (a storage, a kernel's workspace)."""
    _find_holders(sys._getframe(1), oom=True)
    return _state.torch.cuda.OutOfMemoryError(message)


class _StorageRef(weakref.ref):
    """The weak reference whose callback sends a storage's free: it carries
    the storage's key (`_cdata`), so no function is made per storage."""

    __slots__ = ("cd",)


def _malloc(t, box, up):
    """`t`'s storage, if new: its malloc, and a weak reference that sends
    its free. `up`: how many frames above this one the dispatch mode's is."""
    s = t.untyped_storage()
    cd = s._cdata
    st = _state
    live = st.live
    if cd in live:
        return
    n = s.nbytes()
    if n == 0:
        # PyTorch hands back a null pointer for 0 bytes: no allocation.
        return
    if not st.initialized:
        _lazy_init()
    if _DEBUG:
        print(f"vramscope trace:   malloc {n}", file=sys.stderr)
    if st.room_count > 0 and n <= st.room_bytes:
        # Within the headroom vramscope gave: it cannot run out of memory,
        # so it goes with the next message that waits.
        st.room_count -= 1
        st.room_bytes -= n
        chan = _chan
        out = chan.out
        out.append(_MA(_MA_LEN, 1, cd, n, _op_stack(box, up)))
        if len(out) >= SEND_EVERY:
            chan._send_now()
    else:
        r = _chan.ask(["m", cd, n, _op_stack(box, up)])
        if r[0] != "ok":
            raise _oom(r[1])
        if len(r) > 2:
            st.room_bytes, st.room_count = r[1], r[2]
    ref = live[cd] = _StorageRef(s, _freed)
    ref.cd = cd


def _freed(ref):
    """A registered storage died: its free goes with the next message."""
    cd = ref.cd
    if _KSTORE:
        _KSTORE.pop(cd, None)
    if _state.live.pop(cd, None) is not None:
        chan = _chan
        out = chan.out
        out.append(_F(_F_LEN, 2, cd))
        if len(out) >= SEND_EVERY:
            chan._send_now()


def _register(out, box, host=None):
    if host:
        # Outputs the GPU keeps on the host (vramscope's `host_outputs`).
        out = [o for i, o in enumerate(out) if i not in host]
    if isinstance(out, _Tensor):
        if out.is_meta:
            _malloc(out, box, 2)
        return
    if isinstance(out, (tuple, list)):
        for o in out:
            _register_one(o, box)


def _register_one(o, box):
    T = _Tensor
    # Called from `_register` or `_register_staged`: the dispatch mode's
    # frame is two above.
    if isinstance(o, T):
        if o.is_meta:
            _malloc(o, box, 3)
    elif isinstance(o, (tuple, list)):
        for p in o:
            if isinstance(p, T) and p.is_meta:
                _malloc(p, box, 3)


def _register_staged(func, out, shapes, box, order=None):
    """Outputs one at a time, in the order the GPU's kernel makes them
    (vramscope's `register_order`), each followed by vramscope's word on
    what the kernel takes beside it (`["out", op, i, …]`: a workspace
    between two outputs, for one)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    name = func._opname
    for i in order if order is not None else range(len(outs)):
        if i >= len(outs):
            continue
        _register_one(outs[i], box)
        r = _chan.ask(["out", name, _in_backward(), shapes, _op_stack(box, 1), i])
        if r[0] != "ok":
            raise _oom(r[1])


def _in_backward():
    return _current_node() is not None


class _seeded:
    """While a backward runs: its seed gradients' storages in
    `_state.seeds` (counted, for nested backwards seeded alike)."""

    def __init__(self, grads):
        self.keys = [g.untyped_storage()._cdata for g in grads if g is not None and g.is_meta]

    def __enter__(self):
        for k in self.keys:
            _state.seeds[k] = _state.seeds.get(k, 0) + 1

    def __exit__(self, *exc):
        for k in self.keys:
            n = _state.seeds.get(k, 0) - 1
            if n > 0:
                _state.seeds[k] = n
            else:
                _state.seeds.pop(k, None)
        return False
