"""Steps and the end: every `optimizer.step()` is a step (the holder walk
at those where memory grew, the stop after `--steps N`), the view's asked
walk, and the program's end, normal or by an exception.
"""

import os
import sys

from ._channel import TraceError, _chan, _forked_guard
from ._session import _state
from ._stack_walk import _HELPER_FILES, MAX_STACK

# A walk when allocated grew by this much since the last (the live helper's
# threshold); every such step, with no clock: the same program gives the
# same walks.
HOLDERS_MIN_GROWTH = 1 << 20


def _install_step_hook(torch):
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def hook(optimizer, args, kwargs):
        _state.steps += 1
        _chan.post(["step"])
        _find_holders(sys._getframe(1))
        limit = _state.steps_limit
        if limit and _state.steps >= limit:
            _stop(f"stopped after {_state.steps} optimizer step{'s' if _state.steps != 1 else ''} (--steps {limit})")

    register_optimizer_step_post_hook(hook)


def _asked_walk():
    """The walk the view asked for (`H`), at this op boundary: the
    largest holders, named `requested` as a live job's are."""
    _state.walk_asked = False
    _find_holders(sys._getframe(1), requested=True)


def _find_holders(frame, oom=False, requested=False):
    """The holder walk (PROTOCOL.md `holders`) from `frame`, in the
    program's thread, at a step boundary where allocated grew by
    `HOLDERS_MIN_GROWTH` since the last walk (the first walk is the
    baseline and says nothing) or at an OOM (the largest holders). Never
    from a storage's free callback. A meta tensor is the simulated GPU's.
    The walk's own failure is said, never the program's."""
    st = _state
    h = st.holders
    if h is None or _forked_guard():
        return
    # The channel's failures are the trace's own and end it (OSError,
    # TraceError); the walk's are said, never turned into the program's:
    # a walk reads the program's objects, whose errors may be OSErrors too.
    allocated = int(_chan.ask(["stats"])[1].get("allocated_bytes.all.current", 0))
    requested = requested or st.walk_asked
    st.walk_asked = False
    asked = oom or requested
    if not asked and st.holders_prev is not None and allocated - st.holders_alloc < HOLDERS_MIN_GROWTH:
        return
    try:
        # Tensors' attributes without the relabelling mode (a Python call
        # for each, several times the walk's own cost); no op runs here.
        with st.torch._C.DisableTorchFunction():
            fields, totals = h.find(
                st.torch, frame, st.holders_budget_ms, st.holders_prev,
                "oom" if oom else "requested" if requested else "grew",
                is_device=_is_meta, skip_files=tuple(_HELPER_FILES),
            )
    except Exception as e:  # never turn the program's step into an error
        print(f"vramscope trace: could not find what holds the memory: {e!r}", file=sys.stderr)
        return
    first = st.holders_prev is None
    st.holders_prev, st.holders_alloc = totals, allocated
    if first and not asked:
        return  # the baseline: nothing to compare with yet
    _chan.post(["holders", fields])


def _is_meta(t):
    return t.is_meta


def _stop(reason):
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    try:
        _chan.ask(["bye", reason])
    finally:
        _chan.close()
        os._exit(0)


def _at_exit():
    if _forked_guard():
        return
    try:
        _chan.ask(["bye", "the program ended"])
    except (OSError, TraceError):
        pass
    _chan.close()


def _wrap_excepthook():
    prev = sys.excepthook

    def hook(tp, value, tb):
        if not _forked_guard():
            frames = []
            t = tb
            while t is not None:
                co = t.tb_frame.f_code
                # This helper's own frames (a simulated OOM is raised in
                # its allocation hook) are not the program's.
                if os.path.abspath(co.co_filename) not in _HELPER_FILES:
                    frames.append([co.co_filename, t.tb_lineno, co.co_name])
                t = t.tb_next
            frames.reverse()
            _chan.post(["exception", tp.__name__, str(value)[:16384], frames[:MAX_STACK]])
        prev(tp, value, tb)

    sys.excepthook = hook
