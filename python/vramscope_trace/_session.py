"""The traced session's state: what vramscope said at `hello` (the GPU
profile, the ops it wants to hear of, autocast's lists), the storages and
stacks sent so far, and what the running op and backward need to know.

`_state` is one object, made here once: activation fills its attributes
(`_State.start`), so every module binds it at import and reads the same
object; it is never rebound.
"""

import importlib.util
import os
import sys

# VRAMSCOPE_TRACE_DEBUG=1: every aten op the program runs, on stderr.
_DEBUG = os.environ.get("VRAMSCOPE_TRACE_DEBUG") == "1"
# The folder holding this package: `vramscope trace` writes the holder walk
# there, beside it.
_BESIDE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The holder walk (python/vramscope_live/holders.py): `vramscope trace` writes
# it beside this package under this name; run from the repository, it is
# found in its package folder.
HOLDERS_FILES = ("vramscope_trace_holders.py", os.path.join("vramscope_live", "holders.py"))


class _State:
    """Empty until `start` (the `hello` answer): a message sent before it
    (the `hello` itself) may set `room_count` or `walk_asked`, which
    `start` sets afresh."""

    def start(self, torch, reply):
        self.torch = torch
        self.device = reply["device"]
        self.steps_limit = reply.get("steps")
        self.steps = 0
        self.live = {}  # storage _cdata -> weakref
        self.stacks = {}  # ((code, line), ...) -> id
        self.initialized = False
        self.meta = torch.device("meta")
        self.cuda = torch.device("cuda", 0)
        self.untraced = set()
        self.after_ops = set(reply.get("after_ops", []))
        self.before_ops = set(reply.get("before_ops", []))
        self.host_outputs = {k: set(v) for k, v in reply.get("host_outputs", {}).items()}
        self.sdpa = reply.get("sdpa", True)
        self.staged_ops = set(reply.get("staged_ops", []))
        self.register_order = {k: list(v) for k, v in reply.get("register_order", {}).items()}
        self.cudnn = reply.get("cudnn", {})
        # Set while SDPA's math backend runs (see Allocations).
        self.math_sdpa = False
        # The storages of the gradients each running backward was seeded
        # with (`_seeded`): never summed into in place (`accumulate`).
        self.seeds = {}
        # Storages the program may send without waiting (`_malloc`).
        self.room_bytes = 0
        self.room_count = 0
        # (op, autograd thread) vramscope said take nothing more (`_after_op`).
        self.quiet = set()
        # (op, autograd thread, signature) vramscope said take nothing at
        # all (`still`: no report is sent), and those asked once already.
        self.still = set()
        self.asked = set()
        # (op, autograd thread, signature) -> (bytes, storages) vramscope
        # said the same report takes again (a reduction's staging buffers,
        # a fused SDPA backward's scratch): sent within the headroom.
        self.same = {}
        self.autocast = reply.get("autocast", {})
        # The autocast a running backward inherits from its caller (the
        # engine carries the thread-local state): (dtype, cache enabled),
        # or None; and the dispatch-level policies that apply it
        # (`_autocast_handlers`).
        self.backward_autocast = None
        self.autocast_policy_of = lambda func: None
        # The holder walk (`_find_holders`): its module (None: off), its
        # budget, the last walk's bytes per holder and allocated bytes then.
        budget = reply.get("holders_budget_ms")
        self.holders = _load_holders() if budget else None
        self.holders_budget_ms = float(budget or 0)
        self.holders_prev = None
        self.holders_alloc = 0
        # The view asked for a walk (`Channel.ask_raw`): at the next op
        # boundary (`_asked_walk`).
        self.walk_asked = False
        # Extensions' CUDA kernels written in Python (`_extension_kernels`):
        # op name -> function; and how deep such a kernel runs now (its
        # native calls are skipped meanwhile).
        self.cuda_kernels = {}
        self.in_cuda_kernel = 0
        # The program's own meta tensors (`_own_op`): storage _cdata ->
        # weakref; whether the program has made any; and what the running
        # call's device says ("own": the program asked for meta, "gpu": for
        # CUDA, None: nothing).
        self.own = {}
        self.own_seen = False
        self.call_device = None
        # Data-dependent shapes (`_data_dependent`): storages of a router's
        # top-k indices and of masks `chosen == e` (_cdata -> (weakref,
        # what vramscope is told)), and the rows vramscope gave the op
        # running now.
        self.routes = {}
        self.route_masks = {}
        self.rows = None


def _load_holders():
    """The holder walk's module, loaded from its file under a private name
    (a program's own `holders` module is left alone); None if missing."""
    for name in HOLDERS_FILES:
        path = os.path.join(_BESIDE, name)
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_vramscope_trace_holders", path)
            if spec and spec.loader:
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                return mod
    print("vramscope trace: the holder walk's file is missing; holders are not named", file=sys.stderr)
    return None


_state = _State()
