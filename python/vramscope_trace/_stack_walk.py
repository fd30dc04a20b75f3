"""The Python stack of each op, as an interned id: the program's frames
(never this package's, nor the modes' machinery), sent once as `s` and
named by id after. The walk tags the frames it passes twice (`_Above`), so
a deep stack costs the few frames below the first tag.
"""

import os
import sys

from ._channel import _chan
from ._session import _state

MAX_STACK = 128
# Frames of the machinery between the program and this helper (the modes'
# entry, dynamo's guard around them): PyTorch's own stacks have none.
_MACHINERY = (
    os.sep + os.path.join("torch", "_dynamo", "eval_frame.py"),
    os.sep + os.path.join("torch", "_compile.py"),
    os.sep + os.path.join("torch", "overrides.py"),
    os.sep + os.path.join("torch", "utils", "_python_dispatch.py"),
)

# id(code object) -> whether its frames are the program's (not the helper's
# or the modes' machinery): decided once per function. Keyed by id, not by
# the code object, whose hash is computed from its contents at every
# lookup; `_OWN_CODES` keeps each one alive, so no id is reused.
_OWN = {}
_OWN_CODES = []
# A walk's frames as (id(code), instruction offset) pairs, flat, then the
# id of the frames above the last (`_ABOVE`, where the walk met a tag) ->
# stack id: the line of a suspended frame is fixed by its instruction, so
# a walk that finds these pairs again finds the same lines without reading
# them (the line table is looked up only for a stack never seen). The
# codes stay alive in `_OWN_CODES`.
_RAW = {}
# The frames above a frame, interned: (id(code), instruction offset, the
# id of the frames above that one) -> id; 0 is no frame.
_ABOVE = {}
# A generator's, a coroutine's or an async generator's code.
_RESUMABLE = 0x20 | 0x80 | 0x100 | 0x200
# The dispatch mode's `__torch_dispatch__` (`_set_dispatch_code`, when the
# modes are pushed): `_op_stack` starts the walk above it.
_DISPATCH_CODE = None


class _Mark:
    """What the stack walk (`_stack_from`) leaves in a frame's `f_trace`,
    which holds nothing otherwise while no tracer runs. A trace function
    started later (`sys.settrace`) calls it for that frame's events as it
    would the frame's own, and it does nothing and stays, as a frame
    without one would have no call: no tracer sees a difference."""

    __slots__ = ()

    def __call__(self, frame, event, arg):
        return None


class _Above(_Mark):
    """A frame's tag: the interned id (`_ABOVE`) of the frames above it,
    which cannot change while the frame runs (its caller waits at the same
    instruction until it returns, and so do theirs). A walk stops at the
    first tag instead of walking the frames above again: a deep stack
    costs the few frames below the first tag. It goes with its frame."""

    __slots__ = ("above",)

    def __init__(self, above):
        self.above = above


# A frame a walk passed once (not the first, where the op was called: a
# new frame each op): tagged if a walk passes it again, so a frame that
# lives for one op costs no tag.
_SEEN = _Mark()
# A frame never tagged: a generator's or a coroutine's (whose caller is
# whoever resumes it).
_NEVER = _Mark()


def _own(co):
    fn = co.co_filename
    keep = _OWN[id(co)] = fn not in _HELPER_FILES and not fn.endswith(_MACHINERY)
    _OWN_CODES.append(co)
    return keep


# This package's files as its functions' code names them, and as absolute
# paths: a stack leaves their frames out (`_own`), the walk skips them at
# its start (`_op_stack`), and the holder walk and the exception's frames
# leave them out.
_PACKAGE = os.path.dirname(_own.__code__.co_filename)
_HELPER_FILES = frozenset(
    p
    for name in os.listdir(_PACKAGE or os.curdir)
    if name.endswith(".py")
    for p in (os.path.join(_PACKAGE, name), os.path.abspath(os.path.join(_PACKAGE, name)))
)


def _set_dispatch_code(code):
    """The dispatch mode's `__torch_dispatch__` code, once it is made."""
    global _DISPATCH_CODE
    _DISPATCH_CODE = code


def _stack():
    """The Python stack here (from the caller's caller), innermost first,
    as an interned id."""
    return _stack_from(sys._getframe(2))


def _stack_from(top):
    """The stack id of the frames from `top` outward. The walk stops at
    the first frame tagged by an earlier walk (`_Above`); the frames it
    passed twice are tagged (`_tag_seen`), those it passed once marked."""
    raw = [id(top.f_code), top.f_lasti]
    push = raw.append
    t = top.f_trace
    m = 0
    seen = False
    if t.__class__ is _Above:
        push(t.above)
    else:
        f = top.f_back
        while f is not None:
            m += 1
            push(id(f.f_code))
            push(f.f_lasti)
            t = f.f_trace
            if t is None:
                f.f_trace = _SEEN
            elif t.__class__ is _Above:
                push(t.above)
                break
            elif t is _SEEN:
                seen = True
            f = f.f_back
    key = tuple(raw)
    sid = _RAW.get(key)
    if sid is None:
        sid = _RAW[key] = _stack_of(top)
        # The codes whose ids the key holds stay alive: no id is reused.
        own = _OWN
        f = top
        for _ in range(m + 1):
            co = f.f_code
            if id(co) not in own:
                _own(co)
            f = f.f_back
    if seen:
        _tag_seen(top, raw, m)
    return sid


def _tag_seen(top, raw, m):
    """Tag the frames a walk passed a second time (`_SEEN`; `_stack_from`:
    frames 0 to `m` from `top`, their pairs in `raw`), each with the id of
    the frames above it, interned from the outermost in."""
    frames = []
    f = top
    for _ in range(m):
        f = f.f_back
        frames.append(f)
    if len(raw) & 1:
        # Frame m has a tag: the id of the frames above it ends `raw`.
        above = raw[-1]
        i = m - 1
    else:
        # Frame m is the outermost: none above it.
        above = 0
        i = m
    while i > 0:
        if i < m:
            # Above frame i: frame i + 1 and the frames above it.
            k = (raw[2 * i + 2], raw[2 * i + 3], above)
            a = _ABOVE.get(k)
            if a is None:
                a = _ABOVE[k] = len(_ABOVE) + 1
            above = a
        f = frames[i - 1]
        if f.f_trace is _SEEN:
            f.f_trace = _NEVER if f.f_code.co_flags & _RESUMABLE else _Above(above)
        i -= 1


def _stack_of(f):
    """The id of the stack from frame `f` out, by its lines; a new one is
    sent (`s`) before its first use."""
    key = []
    own = _OWN
    while f is not None and len(key) < MAX_STACK:
        co = f.f_code
        keep = own.get(id(co))
        if keep is None:
            keep = _own(co)
        if keep:
            key.append((co, f.f_lineno))
        f = f.f_back
    key = tuple(key)
    sid = _state.stacks.get(key)
    if sid is None:
        sid = len(_state.stacks)
        _state.stacks[key] = sid
        _chan.post(["s", sid, [[co.co_filename, line, co.co_name] for co, line in key]])
    return sid


def _op_stack(box, up):
    """The stack id of the op being dispatched, walked once per op:
    `box` is the op's own one-element list (every report of an op, its
    outputs' mallocs and its kernel's workspaces, is made from the same
    user line). `up`: how many frames above the caller the dispatch mode's
    frame is; the walk starts at the frame that called into the op (the
    helper's frames between are not walked), or, should that frame not be
    the dispatch mode's, at the caller."""
    sid = box[0]
    if sid is None:
        f = sys._getframe(up + 1)
        if f.f_code is _DISPATCH_CODE:
            # The frames that called into the op: this package's (the
            # function mode's, its handlers') are never a stack's.
            f = f.f_back
            while f.f_code.co_filename in _HELPER_FILES:
                f = f.f_back
        else:
            f = sys._getframe(1)
        sid = box[0] = _stack_from(f)
    return sid
