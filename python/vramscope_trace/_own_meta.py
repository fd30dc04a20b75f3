"""The program's own meta device, told apart from the simulated GPU's
(which the trace runs on meta too): its tensors take no GPU memory.
"""

import weakref

from ._session import _state


def _own_call(device, func, args, kwargs):
    """`func` with its device given as the program's own meta ("own") or
    the simulated GPU ("gpu"): what its ops make is that device's."""
    if device == "own":
        _state.own_seen = True
    prev = _state.call_device
    _state.call_device = device
    try:
        return func(*args, **kwargs)
    finally:
        _state.call_device = prev


def _is_own(t):
    """Whether a meta tensor is the program's own, not the simulated GPU's."""
    if not _state.own_seen:
        return False
    try:
        return t.untyped_storage()._cdata in _state.own
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def _own_op(args, kwargs):
    """Whether an op makes the program's own meta tensors: its call named
    meta as the device, or (no device named) its meta tensor arguments are
    all the program's own (`_mark_own` kept them)."""
    d = _state.call_device
    if d is not None:
        return d == "own"
    T = _state.torch.Tensor
    own = _state.own
    seen = False
    for a in (*args, *(kwargs or {}).values()):
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, T) and t.is_meta:
                if t.untyped_storage()._cdata not in own:
                    return False
                seen = True
    return seen


def _mark_own(out):
    T = _state.torch.Tensor
    own = _state.own
    for t in out if isinstance(out, (list, tuple)) else (out,):
        if isinstance(t, T) and t.is_meta:
            s = t.untyped_storage()
            cd = s._cdata
            if cd not in own and cd not in _state.live:
                own[cd] = weakref.ref(s, lambda _wr, cd=cd: own.pop(cd, None))
