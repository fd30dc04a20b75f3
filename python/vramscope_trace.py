"""vramscope_trace: run an unmodified PyTorch program on a simulated GPU.

`vramscope trace -- python train.py ARGS` starts the program with this file
and a `sitecustomize.py` that imports it on a private `PYTHONPATH`, and
`VRAMSCOPE_TRACE_SOCKET` naming the unix socket where vramscope listens.
Nothing here runs unless that variable is set. The program is not changed:

- when the program imports torch, the import finishes and then this module
  patches `torch.cuda` (`is_available()` is true, the device's properties are
  the GPU profile's, `memory_allocated()`, `memory_stats()`, `empty_cache()`,
  `set_per_process_memory_fraction()`, `_dump_snapshot()` … answer from the
  simulation) and pushes two modes for the rest of the run;
- a TorchFunctionMode relabels: `device="cuda"`, `.cuda()`, `.to("cuda")`
  land on PyTorch's `meta` device (shapes and dtypes, no data), a meta
  tensor says it is on `cuda:0`, and what needs data (`.item()`, `.cpu()`,
  `.tolist()`, `bool(t)`) gets zeros of the right shape and dtype;
  `F.scaled_dot_product_attention` runs the kernel PyTorch would pick on the
  GPU (vramscope's engine chooses it);
- a TorchDispatchMode sees every aten op's outputs: each new storage is a
  `malloc` that waits for vramscope's allocator (an address, or an OOM that
  is raised here as `torch.cuda.OutOfMemoryError` with PyTorch's message),
  and a weak reference on the storage sends its `free` when it dies;
- every `optimizer.step()` is a step; after `--steps N` of them the process
  ends (os._exit), so a long training run gives a quick answer;
- at a step where allocated memory grew by 1 MiB or more since the last
  walk, and at a simulated OOM, the live helper's holder walk
  (python/vramscope_live/holders.py, written beside this file as
  `vramscope_trace_holders.py`) names the Python variables that hold the
  simulated GPU's tensors: PROTOCOL.md `holders`, within a budget it states.

Channel: frames of 4 bytes little-endian length + UTF-8 JSON, as
python/PROTOCOL.md frames the live stream. The messages are arrays, the
first element the kind; `docs/trace.md` lists them. The two nearly every
storage sends (`ma`, `f`) are fixed-size binary frames (`_MA`, `_F`). A malloc and every
query wait for the answer; frees, stacks and steps are buffered and go with
the next message that waits, so one round trip serves many events.

An extension's CUDA kernel written in Python (bitsandbytes') runs in place
of its fake kernel, its native calls skipped (`_extension_kernels`); the
program's own meta tensors are told apart from the simulated GPU's
(`_own_op`).

No allocator or CUDA rule lives here: sizes are the storages' bytes, and
what PyTorch's CUDA kernels add (cuBLAS workspaces, the SDPA backend's
buffers) is decided by vramscope from the op names and shapes sent.
"""

import atexit
import functools
import importlib.abc
import importlib.util
import json
import os
import socket
import struct
import sys
import threading
import weakref

ENV_SOCKET = "VRAMSCOPE_TRACE_SOCKET"
ENV_BOOT = "VRAMSCOPE_TRACE_BOOT"
# Environment variables PyTorch reads when CUDA starts (the allocator's
# config and the cuBLAS / cuBLASLt workspaces); sent with `init`.
CUDA_ENV = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUBLASLT_WORKSPACE_SIZE",
    "TORCH_CUBLAS_WORKSPACE_CACHE",
)
MAX_STACK = 128
# Messages that need no answer go out in batches of this many, without
# waiting: vramscope places them while the program runs on (two processes,
# two cores), instead of all at once while the program waits for its next
# answer.
SEND_EVERY = 128
# VRAMSCOPE_TRACE_DEBUG=1: every aten op the program runs, on stderr.
_DEBUG = os.environ.get("VRAMSCOPE_TRACE_DEBUG") == "1"
_HERE = os.path.abspath(__file__)
# Frames of the machinery between the program and this helper (the modes'
# entry, dynamo's guard around them): PyTorch's own stacks have none.
_MACHINERY = (
    os.sep + os.path.join("torch", "_dynamo", "eval_frame.py"),
    os.sep + os.path.join("torch", "_compile.py"),
    os.sep + os.path.join("torch", "overrides.py"),
    os.sep + os.path.join("torch", "utils", "_python_dispatch.py"),
)


# The holder walk (python/vramscope_live/holders.py): `vramscope trace` writes
# it beside this file under this name; run from the repository, it is found
# in its package folder.
HOLDERS_FILES = ("vramscope_trace_holders.py", os.path.join("vramscope_live", "holders.py"))
# A walk when allocated grew by this much since the last (the live helper's
# threshold); every such step, with no clock: the same program gives the
# same walks.
HOLDERS_MIN_GROWTH = 1 << 20


# What vramscope sends ahead of an answer when the view asks for a holder
# walk (`H`; PROTOCOL.md `find_holders`).
_WALK = ["walk"]

# The keyword arguments of a call that has none (never changed).
_NO_KWARGS = {}
# A frame's length prefix (python/PROTOCOL.md).
_LENGTH = struct.Struct("<I").pack
# The two messages nearly every storage sends are binary frames, length
# prefix included (src/traced/message.rs): a malloc sent without waiting
# (`ma`: 1, the storage's key, its bytes, its stack id) and a free (`f`:
# 2, the key). A struct's pack costs a fraction of JSON's two decimal
# conversions and format.
_MA = struct.Struct("<IBQQI").pack
_MA_LEN = 1 + 8 + 8 + 4
_F = struct.Struct("<IBQ").pack
_F_LEN = 1 + 8


class TraceError(RuntimeError):
    """The channel to vramscope failed; the message says how."""


# ------------------------------------------------------------------ channel


class _Discard(list):
    """A forked child's outbox (`_forked`): what it would send goes nowhere
    (the socket is the parent's)."""

    def append(self, _frame):
        pass


class Channel:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.out = []
        self.lock = threading.RLock()
        self.pid = os.getpid()
        self.closed = False

    def _frame(self, obj):
        body = json.dumps(obj, separators=(",", ":")).encode("utf-8")
        return struct.pack("<I", len(body)) + body

    def post(self, obj):
        """Send later, with the next message that waits (or at close). A
        forked child never sends: `_forked` (an at-fork hook) closes its
        channel, so the hot paths ask no pid (a system call per message)."""
        if self.closed:
            return
        self.out.append(self._frame(obj))
        if len(self.out) >= SEND_EVERY:
            self._send_now()

    def post_raw(self, body):
        """`post` for a message already written as JSON bytes (the frees and
        storages of every op, where json.dumps would cost more than the op)."""
        if self.closed:
            return
        out = self.out
        out.append(_LENGTH(len(body)) + body)
        if len(out) >= SEND_EVERY:
            self._send_now()

    def _send_now(self):
        # Under the lock: another thread's message (a storage freed there)
        # must not interleave its bytes with a frame being sent.
        with self.lock:
            self._flush()

    def ask(self, obj):
        """Send everything buffered and `obj`, and wait for the answer. Any
        message that waits may take memory (a workspace): the headroom for
        storages sent without waiting ends here (the next malloc waits)."""
        return self.ask_raw(json.dumps(obj, separators=(",", ":")).encode("utf-8"))

    def ask_raw(self, body):
        """`ask` for a message already written as JSON bytes."""
        if self.closed or os.getpid() != self.pid:
            raise TraceError("vramscope trace: the channel to vramscope is closed")
        if _state is not None:
            _state.room_count = 0
        with self.lock:
            self.out.append(struct.pack("<I", len(body)) + body)
            self._flush()
            while True:
                head = self._recv(4)
                (n,) = struct.unpack("<I", head)
                answer = json.loads(self._recv(n))
                if answer != _WALK:
                    return answer
                # The view asked for a holder walk (its `H`): made at the
                # next op boundary (`_asked_walk`), then this answer.
                if _state is not None:
                    _state.walk_asked = True

    def _flush(self):
        # A weakref callback may append while this runs: take the list first.
        out, self.out = self.out, []
        if out:
            self.sock.sendall(b"".join(out))

    def _recv(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise TraceError("vramscope trace: vramscope closed the channel")
            buf += chunk
        return bytes(buf)

    def close(self):
        if self.closed or os.getpid() != self.pid:
            return
        with self.lock:
            try:
                self._flush()
            except OSError:
                pass
            self.closed = True
            # Frees after the end (storages dying as the interpreter
            # exits) go nowhere.
            self.out = _Discard()
            try:
                self.sock.close()
            except OSError:
                pass


_chan = None
_state = None
# Set when tracing starts: torch.Tensor, and the autograd node running on
# this thread (None outside a backward).
_Tensor = None
_current_node = None


# ------------------------------------------------------------------- boot


def _boot():
    """Called by the generated sitecustomize: wait for `import torch`."""
    path = os.environ.get(ENV_SOCKET)
    if not path:
        return
    # Child processes (DataLoader workers started with spawn, subprocesses)
    # must not trace: only the process vramscope started does.
    os.environ.pop(ENV_SOCKET, None)
    _chain_sitecustomize()
    sys.meta_path.insert(0, _TorchHook(path))


def _chain_sitecustomize():
    """Run the sitecustomize this one shadows, if the environment has one."""
    boot = os.environ.get(ENV_BOOT)
    for entry in sys.path:
        if not entry or (boot and os.path.abspath(entry) == os.path.abspath(boot)):
            continue
        cand = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(cand):
            spec = importlib.util.spec_from_file_location("_vramscope_chained_sitecustomize", cand)
            if spec and spec.loader:
                mod = importlib.util.module_from_spec(spec)
                try:
                    spec.loader.exec_module(mod)
                except Exception as e:  # the user's own file: say, go on
                    print(f"vramscope trace: {cand}: {e!r}", file=sys.stderr)
            return


class _TorchHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `torch` is imported, wraps its loader so
    that tracing starts right after torch's own import finishes."""

    def __init__(self, path):
        self.path = path
        self.busy = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        hook = self

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                sys.meta_path[:] = [f for f in sys.meta_path if f is not hook]
                _activate(module, hook.path)

        spec.loader = _Loader()
        return spec


# --------------------------------------------------------------- activate


class _State:
    def __init__(self, torch, reply):
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
    here = os.path.dirname(_HERE)
    for name in HOLDERS_FILES:
        path = os.path.join(here, name)
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_vramscope_trace_holders", path)
            if spec and spec.loader:
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                return mod
    print("vramscope trace: the holder walk's file is missing; holders are not named", file=sys.stderr)
    return None


def _activate(torch, path):
    global _chan, _state
    _chan = Channel(path)
    reply = _chan.ask(
        [
            "hello",
            {
                "pid": os.getpid(),
                "argv": list(sys.argv),
                "torch": torch.__version__,
                "python": sys.version.split()[0],
            },
        ]
    )
    _state = _State(torch, reply)
    global _Tensor, _current_node
    _Tensor = torch.Tensor
    _current_node = torch._C._current_autograd_node
    os.register_at_fork(after_in_child=_forked)
    _patch_cuda(torch)
    _extension_kernels(torch)
    _install_step_hook(torch)
    _install_modes(torch)
    atexit.register(_at_exit)
    _wrap_excepthook()


class paused:
    """`with vramscope_trace.paused():` runs its body on PyTorch's plain meta
    device, the helper's modes off (its benchmark's baseline,
    benches/trace/op_cost.py): nothing in it is traced."""

    def __enter__(self):
        _state.relabel.__exit__(None, None, None)
        _state.allocations.__exit__(None, None, None)
        return self

    def __exit__(self, *exc):
        _state.allocations.__enter__()
        _state.relabel.__enter__()
        return False


def _forked():
    # A forked child (a DataLoader worker) shares the socket: it must not
    # write. The hot paths append to `out` without asking (`_malloc`,
    # `_freed`): in the child it keeps nothing.
    if _chan is not None:
        _chan.closed = True
        _chan.out = _Discard()


def _forked_guard():
    return _chan is None or _chan.closed


# ------------------------------------------------------------ allocations


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
# The dispatch mode's `__torch_dispatch__` (set when the modes are pushed):
# `_op_stack` starts the walk above it.
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
    keep = _OWN[id(co)] = fn != _HERE and not fn.endswith(_MACHINERY)
    _OWN_CODES.append(co)
    return keep


# This file's name as its functions' code has it, where a stack leaves
# them out (`_own`): the walk skips them at its start (`_op_stack`).
_HELPER_FILE = _own.__code__.co_filename
if _HELPER_FILE != _HERE:
    _HELPER_FILE = None


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


def _oom(message):
    """The exception for a request that did not fit. First, what holds the
    memory then, by name (`_find_holders`): the frames are the program's as
    it made the request (a storage, a kernel's workspace)."""
    _find_holders(sys._getframe(1), oom=True)
    return _state.torch.cuda.OutOfMemoryError(message)


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
            # The frames that called into the op: this file's (the
            # function mode's, its handlers') are never a stack's.
            f = f.f_back
            while f.f_code.co_filename is _HELPER_FILE:
                f = f.f_back
        else:
            f = sys._getframe(1)
        sid = box[0] = _stack_from(f)
    return sid


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


# The report of an after-op (`_after_op`), by its arguments' signature
# (`_signature`): what `_shapes` makes of them, as JSON, and `_arg_bytes`.
# Programs repeat a few shapes many times (every layer's GEMMs), so each
# signature is encoded once.
_REPORTS = {}


def _signature(args):
    """A key that fixes what `_shapes(args)` gives: a tensor's shape,
    strides (contiguity follows from the two) and dtype; a number or a
    list of numbers with its type (True, 1 and 1.0 are written apart).
    None where an argument could not be a key (a float: -0.0 and NaN)."""
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
            elif a and all(isinstance(x, T) for x in a):
                push(tuple((x.shape, x.stride(), x.dtype) for x in a))
            else:
                return None
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
    if key in st.quiet and (skey is None or skey in st.asked):
        # vramscope said this op takes nothing more on this thread but
        # clones of its arguments: within the headroom it need not wait.
        if st.room_count > 1 and n <= st.room_bytes:
            st.room_count -= 2
            st.room_bytes -= n
            _chan.post_raw(b'["oa",%s%s,%d]' % (head, body, _op_stack(box, 1)))
            return
    r = _chan.ask_raw(b'["op",%s%s,%d]' % (head, body, _op_stack(box, 1)))
    if r[0] != "ok":
        raise _oom(r[1])
    if len(r) > 1 and isinstance(r[1], dict):
        if r[1].get("quiet"):
            st.quiet.add(key)
            if skey is not None:
                st.asked.add(skey)
        if r[1].get("still") and skey is not None:
            st.still.add(skey)


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


# ------------------------------------------------------------ known values

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
    values before it runs (`_ROWS_OPS`))."""
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
    return (mode, writes, writes_kw, views, always, name in _ROWS_OPS, name in _CPU_ONLY_OPS)


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
        _forget_written(vr, args, kwargs)
        return
    if pre is None:
        if (
            (not vr[4] and not _any_known(args, kwargs))
            or not _small(out)
        ):
            _forget_written(vr, args, kwargs)
            return
        pre = _compute(func, vr, args, kwargs)
        if pre is None:
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


# ------------------------------------------------------------------ modes


def _install_modes(torch):
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

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
    _autocast_handlers(torch, handlers)
    _rnn_handlers(torch, handlers)
    _loss_handlers(torch, handlers)

    class Relabel(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            h = handlers.get(func)
            if h is not None:
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
        return rule + (plain, _value_rule(torch, func, name), call)

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
            if rule[12]:
                box = [None]
                pre = None
                try:
                    out = rule[14](*args, **(kwargs or _NO_KWARGS))
                except (NotImplementedError, RuntimeError) as e:
                    # Meta cannot; the CPU can where the values are known.
                    known = _from_known(func, rule[13], args, kwargs, box, e)
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
                vr = rule[13]
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

    _foreach_on_meta(torch)
    _compile_eagerly(torch)
    _checkpoint_metadata(torch, cuda)
    global _DISPATCH_CODE
    _DISPATCH_CODE = Allocations.__torch_dispatch__.__code__
    _state.relabel = Relabel()
    _state.allocations = Allocations()
    _state.allocations.__enter__()
    _state.relabel.__enter__()


# ---------------------------------------------------------------- autocast


class _backward_autocast:
    """A backward runs under the autocast of the code that called it: the
    engine carries the caller's thread-local state to the thread that runs
    the graph, so the ops its backward formulas call pass autocast's
    wrappers (a half gradient's `sum_to` sums into fp32, then
    validate_outputs casts it back). Kept for the length of the call."""

    def __init__(self, torch):
        self.torch = torch

    def __enter__(self):
        torch = self.torch
        self.saved = _state.backward_autocast
        if torch.is_autocast_enabled("cuda"):
            _state.backward_autocast = (
                torch.get_autocast_dtype("cuda"),
                torch.is_autocast_cache_enabled(),
            )
        else:
            _state.backward_autocast = None
        return self

    def __exit__(self, *exc):
        _state.backward_autocast = self.saved
        return False


class _CastCache:
    """Autocast's cache of weight casts (autocast_mode.cpp `cached_cast`):
    an fp32 leaf that requires grad is cast once per region; the cast lives
    until the outermost `autocast` exits (`torch.clear_autocast_cache`)."""

    def __init__(self):
        self.casts = {}

    def get(self, t):
        hit = self.casts.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        return None

    def put(self, t, cast):
        self.casts[id(t)] = (weakref.ref(t), cast)

    def clear(self):
        self.casts.clear()


def _autocast_handlers(torch, handlers):
    """CUDA autocast for the simulated GPU. Autocast is a dispatch key that
    meta tensors never carry, so its policies (sent by vramscope, PyTorch
    2.11's lists) run here, above autograd as on a GPU: the casts are in the
    graph, weight casts cached, arguments cast right to left (GCC's order of
    the wrapper's call arguments)."""
    table = _state.autocast
    if not table:
        return
    import torch.nn.functional as F

    cache = _CastCache()
    clear = torch.clear_autocast_cache

    # PyTorch's signature: torch._dynamo checks it.
    def clear_autocast_cache() -> None:
        cache.clear()
        clear()

    torch.clear_autocast_cache = clear_autocast_cache
    fp32 = torch.float32

    def active():
        return torch.is_autocast_enabled("cuda")

    def eligible(t):
        return (
            isinstance(t, torch.Tensor)
            and t.is_meta
            and t.is_floating_point()
            and t.dtype != torch.float64
        )

    def cast(t, to):
        if not eligible(t) or t.dtype == to:
            return t
        lower = torch.get_autocast_dtype("cuda")
        cacheable = (
            to == lower
            and t.dtype == fp32
            and t.requires_grad
            and t.is_leaf
            and not t._is_view()
            and torch.is_autocast_cache_enabled()
        )
        if cacheable:
            hit = cache.get(t)
            if hit is not None:
                return hit
        c = t.to(to)
        if cacheable:
            cache.put(t, c)
        return c

    def cast_args(args, kwargs, to):
        # Right to left: keyword arguments come after the positional ones.
        kw = dict(kwargs)
        for k in reversed(list(kw)):
            kw[k] = cast_value(kw[k], to)
        out = list(args)
        for i in range(len(out) - 1, -1, -1):
            out[i] = cast_value(out[i], to)
        return out, kw

    def cast_value(v, to):
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return type(v)(reversed([cast(x, to) for x in reversed(v)]))
        return cast(v, to)

    enabled = torch.is_autocast_enabled

    def policy(to_of):
        def h(func, args, kwargs):
            if not enabled("cuda"):
                return func(*args, **kwargs)
            to = to_of(args, kwargs)
            if to is None:
                return func(*args, **kwargs)
            a, kw = cast_args(args, kwargs, to)
            return func(*a, **kw)

        return h

    def lower(args, kwargs):
        return torch.get_autocast_dtype("cuda")

    def widest(args, kwargs):
        ts = [x for x in list(args) + list(kwargs.values()) if eligible(x)]
        for v in list(args) + list(kwargs.values()):
            if isinstance(v, (list, tuple)):
                ts.extend(x for x in v if eligible(x))
        if not ts:
            return None
        to = ts[0].dtype
        for t in ts[1:]:
            to = torch.promote_types(to, t.dtype)
        return to

    def unless_dtype(inner):
        def h(func, args, kwargs):
            given = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args[1:])
            x = args[0] if args else None
            if given or not active() or not eligible(x) or x.dtype == fp32:
                return inner(func, args, kwargs)
            kw = dict(kwargs)
            kw["dtype"] = fp32
            return inner(func, args, kw)

        return h

    def plain(func, args, kwargs):
        return func(*args, **kwargs)

    def banned(message):
        def h(func, args, kwargs):
            if active() and any(eligible(a) for a in args):
                raise RuntimeError(message)
            return func(*args, **kwargs)

        return h

    def cross_entropy(func, args, kwargs):
        # C++ cross_entropy_loss: log_softmax(self, class_dim, self.dtype)
        # keeps the logits' dtype, then nll_loss (fp32 list) casts it up.
        x = args[0] if args else kwargs.get("input")
        if not active() or not eligible(x) or x.dtype == fp32 or kwargs.get("label_smoothing", 0.0):
            return func(*args, **kwargs)
        names = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction")
        a = dict(zip(names, args))
        a.update(kwargs)
        target = a["target"]
        if target.is_floating_point():
            return func(*args, **kwargs)
        dim = 0 if x.dim() == 1 else 1
        logp = torch.log_softmax(x, dim, dtype=x.dtype).to(fp32)
        weight = a.get("weight")
        return F.nll_loss(
            logp,
            target,
            weight=cast(weight, fp32) if weight is not None else None,
            ignore_index=a.get("ignore_index", -100),
            reduction=a.get("reduction", "mean"),
        )

    def resolve(name):
        found = []
        places = [(owner, name) for owner in (torch, torch.Tensor, F, torch._C._nn)]
        if name.startswith("linalg_"):
            places.append((torch.linalg, name[len("linalg_"):]))
        for owner, attr in places:
            f = getattr(owner, attr, None)
            if f is not None and callable(f) and f not in found:
                found.append(f)
        return found

    for group, h in (
        ("lower", policy(lower)),
        ("fp32", policy(lambda a, k: fp32)),
        ("promote", policy(widest)),
    ):
        for name in table.get(group, []):
            for f in resolve(name):
                handlers.setdefault(f, h)
    for name in table.get("fp32_unless_dtype", []):
        for f in resolve(name):
            handlers[f] = unless_dtype(handlers.get(f, plain))
    for name, message in table.get("banned", {}).items():
        for f in resolve(name):
            handlers.setdefault(f, banned(message))
    handlers[F.cross_entropy] = cross_entropy
    _state.autocast_policy_of = _dispatch_autocast(torch, table)


def _dispatch_autocast(torch, table):
    """Autocast's wrappers for the ops a backward formula calls: they reach
    the dispatch mode only (C++ calls pass no function mode), so the
    policies of `_autocast_handlers` are applied there, by aten op, under
    the autocast the backward inherited (`_backward_autocast`). Returns the
    policy of an op (a function of args, kwargs and the dispatch mode that
    gives them cast), or None."""
    kinds = {}
    for group in ("lower", "fp32", "fp32_unless_dtype", "promote"):
        for name in table.get(group, []):
            kinds.setdefault(name, group)
    fp32 = torch.float32
    f64 = torch.float64
    Tensor = torch.Tensor
    to_copy = torch.ops.aten._to_copy.default
    # Autocast's cast cache is thread-local and only the thread that leaves
    # a region clears its own: casts cached on the engine's thread are
    # never cleared.
    cache = _CastCache()

    def floating(t):
        return isinstance(t, Tensor) and t.is_meta and t.is_floating_point()

    def cast(t, to, mode):
        # cached_cast: eligible (a CUDA floating tensor), never a double.
        if not floating(t) or t.dtype == to or t.dtype == f64:
            return t
        lower, cache_enabled = _state.backward_autocast
        cacheable = (
            cache_enabled and to == lower and t.dtype == fp32
            and t.requires_grad and t.is_leaf and not t._is_view()
        )
        if cacheable:
            hit = cache.get(t)
            if hit is not None:
                return hit
        with mode:
            c = to_copy(t, dtype=to)
        if cacheable:
            cache.put(t, c)
        return c

    def cast_all(args, kwargs, to, mode):
        # Right to left, as `_autocast_handlers` casts.
        kw = dict(kwargs)
        for k in reversed(list(kw)):
            kw[k] = cast_value(kw[k], to, mode)
        out = list(args)
        for i in range(len(out) - 1, -1, -1):
            out[i] = cast_value(out[i], to, mode)
        return tuple(out), kw

    def cast_value(v, to, mode):
        if isinstance(v, (list, tuple)) and any(isinstance(x, Tensor) for x in v):
            return type(v)(reversed([cast(x, to, mode) for x in reversed(v)]))
        return cast(v, to, mode)

    def tensors(args, kwargs):
        for v in list(args) + list(kwargs.values()):
            if isinstance(v, (list, tuple)):
                yield from (x for x in v if floating(x))
            elif floating(v):
                yield v

    def lower(args, kwargs, mode):
        return cast_all(args, kwargs, _state.backward_autocast[0], mode)

    def to_fp32(args, kwargs, mode):
        return cast_all(args, kwargs, fp32, mode)

    def promote(args, kwargs, mode):
        to = None
        for t in tensors(args, kwargs):
            to = t.dtype if to is None else torch.promote_types(to, t.dtype)
        if to is None:
            return args, kwargs
        return cast_all(args, kwargs, to, mode)

    def opt_dtype(func):
        # fp32_set_opt_dtype: the op's optional dtype set to fp32 when it is
        # not given and the first argument is a CUDA floating tensor.
        names = [a.name for a in func._schema.arguments]
        if "dtype" not in names:
            return None
        i = names.index("dtype")

        def h(args, kwargs, mode):
            if not (args and floating(args[0])):
                return args, kwargs
            if i < len(args):
                if args[i] is not None:
                    return args, kwargs
                a = list(args)
                a[i] = fp32
                return tuple(a), kwargs
            if kwargs.get("dtype") is not None:
                return args, kwargs
            kw = dict(kwargs)
            kw["dtype"] = fp32
            return args, kw

        return h

    def policy_of(func):
        kind = kinds.get(getattr(func, "_opname", ""))
        if kind is None or "out" in func._overloadname:
            return None
        if kind == "fp32_unless_dtype":
            return opt_dtype(func)
        return {"lower": lower, "fp32": to_fp32, "promote": promote}[kind]

    return policy_of


def _meta_impls(torch):
    """Meta kernels PyTorch lacks for ops a CUDA program runs: their
    outputs' shapes, nothing else (what the GPU's kernel takes beside them
    is vramscope's: `before`/`out`/`op`)."""
    aten = torch.ops.aten
    meta = _state.meta

    def cudnn_rnn_backward(input, weight, weight_stride0, weight_buf, hx, cx, output,
                           grad_output, grad_hy, grad_cy, mode, hidden_size, proj_size,
                           num_layers, batch_first, dropout, train, bidirectional,
                           batch_sizes, dropout_state, reserve, output_mask):
        if grad_output is None and grad_hy is None and grad_cy is None:
            return (None, None, None, [])
        if not train:
            raise RuntimeError("cudnn RNN backward can only be called in training mode")
        dx = torch.empty(input.shape, dtype=input.dtype, device=meta)
        dhx = torch.empty(hx.shape, dtype=hx.dtype, device=meta)
        dcx = torch.empty(cx.shape, dtype=cx.dtype, device=meta) if cx is not None else None
        dw = []
        if output_mask[3]:
            n = weight_buf.numel() if weight_buf is not None else sum(w.numel() for w in weight)
            flat = torch.zeros(n, dtype=weight[0].dtype, device=meta)
            off = 0
            for w in weight:
                dw.append(flat[off:off + w.numel()].view(w.shape))
                off += w.numel()
        return (dx, dhx, dcx, dw)

    def cudnn_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                        is_causal=False, return_debug_mask=False, scale=None):
        # Meta's kernel always makes the [B, H, T, 1] fp32 stats; CUDA's
        # (`_scaled_dot_product_cudnn_attention_cuda`, MHA.cpp
        # `run_cudnn_SDP_fprop`) only when `compute_log_sumexp`: without
        # it the stats are undefined (an empty tensor here: no storage).
        out = aten._scaled_dot_product_cudnn_attention.default(
            query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal,
            return_debug_mask, scale=scale,
        )
        if compute_log_sumexp:
            return out
        out = list(out)
        out[1] = torch.empty(0, dtype=torch.float32, device=meta)
        return tuple(out)

    impls = {
        aten._cudnn_rnn_backward.default: cudnn_rnn_backward,
        aten._scaled_dot_product_cudnn_attention.default: cudnn_attention,
    }
    impls.update(_data_dependent(torch))
    impls.update(_cuda_branches(torch))
    return impls


def _cuda_branches(torch):
    """Backward formulas that take another branch on CUDA than under a
    dispatch mode: `areAnyTensorSubclassLike` (ATen/TensorSubclassLikeUtils.h)
    is true whenever any dispatch mode is on, so the formula's
    out-of-place branch runs here where the GPU runs the in-place one.
    Keyed by the aten op the out-of-place branch calls, and taken only in
    the autograd node whose formula it is."""
    aten = torch.ops.aten

    def index_put(x, indices, values, accumulate=False):
        # IndexBackward0 (derivatives.yaml `index.Tensor`: `index_backward(
        # grad.new_zeros_symint(...), indices, grad)`; FunctionsManual.cpp
        # `index_backward`): `at::_index_put_impl_(zeros_like_self, indices,
        # grad, true, true)` into the zeros, not `zeros_like_self.index_put(
        # indices, grad, true)` (a copy of them). No grad-mode test there.
        node = _current_node()
        if accumulate and node is not None and node.name() == "IndexBackward0":
            with _state.allocations:
                return aten._index_put_impl_(x, indices, values, True, True)
        return aten.index_put.default(x, indices, values, accumulate)

    def index_add(x, dim, index, source, alpha=1):
        # IndexSelectBackward0 (TensorAdvancedIndexing.cpp
        # `index_select_backward_symint`): `grad.new_zeros_symint(...)
        # .index_add_(dim, index, grad)`, the out-of-place `index_add` only
        # where `isTensorSubclassLike(index)`.
        node = _current_node()
        if node is not None and alpha == 1 and node.name() == "IndexSelectBackward0":
            with _state.allocations:
                return aten.index_add_.default(x, dim, index, source)
        return aten.index_add.default(x, dim, index, source, alpha=alpha)

    # The nodes whose formula is `value_selecting_reduction_backward_symint`
    # (derivatives.yaml: kthvalue, max.dim, median.dim, nanmedian.dim,
    # min.dim, mode, sort, sort.stable, topk; FunctionsManual.cpp):
    # `at::zeros_symint(sizes).scatter_(dim, indices, grad)`, the
    # out-of-place `scatter` only where `areAnyTensorSubclassLike`.
    selecting = {
        "KthvalueBackward0", "MaxBackward0", "MedianBackward1", "NanmedianBackward1",
        "MinBackward0", "ModeBackward0", "SortBackward0", "SortBackward1", "TopkBackward0",
    }

    def scatter(x, dim, index, src):
        node = _current_node()
        if node is not None and node.name() in selecting:
            with _state.allocations:
                return aten.scatter_.src(x, dim, index, src)
        return aten.scatter.src(x, dim, index, src)

    return {
        aten.index_put.default: index_put,
        aten.index_add.default: index_add,
        aten.scatter.src: scatter,
    }


def _data_dependent(torch):
    """Ops whose output size depends on the data, which the simulated GPU
    does not hold: `nonzero` (`torch.where(cond)`, `argwhere`),
    `masked_select`, a boolean mask index (`x[mask]`), `bincount`. Their
    sizes come from vramscope (`before`'s `rows`), which takes them from a
    stated assumption and names it in the report (`trace.assumed`, with the
    program's line): a mask `chosen == e` of a router's top-k choice gets
    balanced routing's rows for expert e (the engine's
    `Routing::Balanced`), any other mask counts as all true. So the
    trace follows the routing it had to assume: `topk`/`argmax` indices
    and their `== e` masks are kept here (`_route_of`)."""
    aten = torch.ops.aten
    meta = _state.meta
    Tensor = torch.Tensor
    masks = (torch.bool, torch.uint8)
    long = torch.long

    def mode():
        return _state.allocations

    def topk(x, k, dim=-1, largest=True, sorted=True):
        out = aten.topk.default(x, k, dim, largest, sorted)
        if x.dim() > 0 and k > 0:
            _mark_route(_state.routes, out[1], {
                "experts": int(x.shape[dim]), "top_k": int(k),
                "tokens": int(out[1].numel() // k),
            })
        return out

    def argmax(x, dim=None, keepdim=False):
        out = aten.argmax.default(x, dim, keepdim)
        if dim is not None and x.dim() > 0:
            _mark_route(_state.routes, out, {
                "experts": int(x.shape[dim]), "top_k": 1, "tokens": int(out.numel()),
            })
        return out

    def eq_scalar(x, other):
        out = aten.eq.Scalar(x, other)
        if _state.routes and isinstance(other, int) and not isinstance(other, bool):
            hit = _state.routes.get(x.untyped_storage()._cdata)
            if hit is not None:
                _mark_route(_state.route_masks, out, dict(hit[1], expert=int(other)))
        return out

    def nonzero(x):
        rows = _state.rows
        _state.rows = None
        if rows is None:
            raise NotImplementedError("aten::nonzero: no size from vramscope")
        return torch.empty((int(rows), x.dim()), dtype=long, device=meta)

    def bincount(x, weights=None, minlength=0):
        rows = _state.rows
        _state.rows = None
        if rows is None:
            raise NotImplementedError("aten::bincount: no size from vramscope")
        # CUDA's _bincount_cuda: the input's min (a negative value is an
        # error) and max (the bins), each read back to the host, then the
        # zeroed bins (the weights' dtype, or int64).
        with mode():
            if x.numel() > 0:
                x.min()
                x.max()
            return torch.zeros(int(rows), dtype=weights.dtype if weights is not None else long,
                               device=meta)

    def index(x, indices):
        if not any(isinstance(i, Tensor) and i.dtype in masks for i in indices):
            return aten.index.Tensor(x, indices)
        # CUDA's index (expandTensors): each boolean mask becomes its
        # nonzero's columns, then the gather; the nonzero result goes after.
        with mode():
            cols = []
            for i in indices:
                if isinstance(i, Tensor) and i.dtype in masks:
                    cols.extend(torch.nonzero(i).unbind(1))
                else:
                    cols.append(i)
            return aten.index.Tensor(x, cols)

    def masked_select(x, mask):
        # masked_select_out_cuda_impl: expand_outplace(mask, self), then
        # index(self, {mask}).
        with mode():
            m, s = torch.broadcast_tensors(mask, x)
            return aten.index.Tensor(s, [m])

    return {
        aten.topk.default: topk,
        aten.argmax.default: argmax,
        aten.eq.Scalar: eq_scalar,
        aten.nonzero.default: nonzero,
        aten.bincount.default: bincount,
        aten.index.Tensor: index,
        aten.masked_select.default: masked_select,
    }


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


def _compile_eagerly(torch):
    """`torch.compile` returns what it was given: the program runs eagerly,
    and the report says so once (a compiled graph fuses kernels, so its
    intermediate tensors may be fewer than the eager ones traced here)."""
    said = []

    def say():
        if not said:
            said.append(True)
            _chan.post(
                [
                    "untraced",
                    "torch.compile",
                    "compiled kernels are not simulated",
                    _stack(),
                    "ran the model eagerly (every eager op traced; a compiled graph may fuse some away)",
                ]
            )

    def compiled(model):
        # A module is compiled to be run: said at once (and returned as
        # it is, one object). A function may be compiled at import and
        # never run (bitsandbytes compiles its CPU kernels as it loads): said
        # at its first call, with that call's line.
        if isinstance(model, torch.nn.Module) or not callable(model):
            say()
            return model

        @functools.wraps(model)
        def eager(*args, **kwargs):
            say()
            return model(*args, **kwargs)

        return eager

    def compile(model=None, **kwargs):
        if model is None:
            return compiled
        return compiled(model)

    torch.compile = compile


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


def _extension_kernels(torch):
    """An extension's ops (bitsandbytes' `bitsandbytes::gemm_4bit` & co.)
    are registered with a fake kernel, which meta runs, and a CUDA kernel
    written in Python (`torch.library.register_kernel(op, "cuda")`,
    `Library.impl(op, fn, "CUDA")`, a `custom_op`'s `register_kernel`) that
    allocates through torch (its outputs, temporaries, a fallback that
    calls `F.linear`) and then launches native code through ctypes. The
    fake kernel shows only the outputs, so the simulated GPU runs the CUDA
    kernel instead (`Allocations`): its tensors are traced as any op's, and
    its native calls are skipped (no GPU, and meta tensors' `data_ptr()` is
    0), which this sets up: each Python CUDA kernel registered after torch
    is imported is kept by op name, each ctypes library loaded after it
    gets function pointers that do nothing while such a kernel runs, and
    `torch._C._cuda_getCurrentRawStream` (the stream handle such kernels
    pass) answers 0."""
    import ctypes

    import torch.library as tl

    impl = tl.Library.impl

    def impl_kept(self, op_name, fn, dispatch_key="", *a, **k):
        key = dispatch_key or getattr(self, "dispatch_key", "")
        if key == "CUDA" and callable(fn):
            name = getattr(op_name, "_name", None) or str(op_name)
            if "::" not in name:
                name = f"{self.ns}::{name}"
            if name.endswith(".default"):
                name = name[: -len(".default")]
            _state.cuda_kernels[name] = fn
        return impl(self, op_name, fn, dispatch_key, *a, **k)

    tl.Library.impl = impl_kept

    cdll_init = ctypes.CDLL.__init__

    def cdll_kept(self, *a, **k):
        cdll_init(self, *a, **k)
        base = self._FuncPtr

        class _FuncPtr(base):
            _flags_ = base._flags_
            _restype_ = base._restype_

            def __call__(fp, *args):
                if _state.in_cuda_kernel:
                    return None if fp.restype is None else 0
                return base.__call__(fp, *args)

        self._FuncPtr = _FuncPtr

    ctypes.CDLL.__init__ = cdll_kept
    if hasattr(torch._C, "_cuda_getCurrentRawStream"):
        torch._C._cuda_getCurrentRawStream = lambda device=None: 0


def _cuda_kernel_of(torch, func):
    """The CUDA kernel an extension registered in Python for `func`, or
    None (ATen's own ops, and ops whose CUDA kernel is C++)."""
    if func.namespace in ("aten", "prim", "prims"):
        return None
    name = func.name()
    k = _state.cuda_kernels.get(name)
    if k is not None:
        return k
    try:
        opdef = torch._library.custom_ops._maybe_get_opdef(name.split(".")[0])
    except Exception:  # noqa: BLE001 - private API: absent is "none"
        opdef = None
    fns = getattr(opdef, "_backend_fns", None) if opdef is not None else None
    return fns.get("cuda") if isinstance(fns, dict) else None


def _foreach_on_meta(torch):
    """The foreach kernels PyTorch runs for CUDA tensors run for the
    simulated GPU's: code that groups tensors by their real device
    (`clip_grad_norm_`'s `_group_tensors_by_device_and_dtype`) finds meta,
    which PyTorch's list of foreach devices leaves out."""
    try:
        import torch.utils._foreach_utils as fu
    except ImportError:
        return
    devices = getattr(fu, "_get_foreach_kernels_supported_devices", None)
    if devices is None:
        return

    def supported() -> list[str]:
        found = list(devices())
        return found if "meta" in found else found + ["meta"]

    fu._get_foreach_kernels_supported_devices = supported


def _checkpoint_metadata(torch, cuda):
    """Non-reentrant checkpointing compares each recomputed tensor's device
    with the forward's. Whether the relabelling mode is on when autograd's
    hook reads it depends on where the tensor was saved, so the check reads
    the simulated GPU's name for meta itself."""
    try:
        import torch.utils.checkpoint as ckpt
    except ImportError:
        return
    table = getattr(ckpt, "_allowed_determinism_checks_to_fns", None)
    default = getattr(ckpt, "_DEFAULT_DETERMINISM_MODE", None)
    if not isinstance(table, dict) or default not in table:
        return
    extract = table[default]

    def metadata(x):
        m = extract(x)
        if isinstance(m, dict) and getattr(m.get("device"), "type", None) == "meta":
            m["device"] = cuda
        return m

    table[default] = metadata


def _sdpa_handler(torch):
    """F.scaled_dot_product_attention runs the kernel the GPU would take.
    On meta SDPA decomposes into math ops; vramscope's engine says which
    backend PyTorch would pick for these inputs on the simulated GPU, and
    the fused backends' own aten ops (whose meta kernels give their outputs'
    real shapes: logsumexp, seeds) run instead."""
    if not _state.sdpa:
        return None
    aten = torch.ops.aten

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
        r = _chan.ask(
            [
                "sdpa",
                {
                    "dtype": str(dtype).replace("torch.", ""),
                    "mask": mask is not None,
                    "dropout": p,
                    "head_dim": int(q.shape[-1]),
                    "gqa": gqa,
                    "enabled": enabled,
                },
            ]
        )
        backend = r[1]
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


# ------------------------------------------------------------- torch.cuda


class _DeviceProperties:
    def __init__(self, d):
        self.name = d["name"]
        self.total_memory = d["total_memory"]
        self.major = d["major"]
        self.minor = d["minor"]
        self.multi_processor_count = d["sm_count"]
        self.max_threads_per_multi_processor = d["max_threads_per_sm"]
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.warp_size = 32
        self.L2_cache_size = d.get("l2_bytes", 0)
        self.uuid = "GPU-00000000-0000-0000-0000-000000000000"

    def __repr__(self):
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1 << 20)}MB, "
            f"multi_processor_count={self.multi_processor_count}) [simulated by vramscope]"
        )


class _FakeStream:
    """A CUDA stream on the simulated GPU: everything runs on stream 0."""

    cuda_stream = 0
    device = None

    def __init__(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event or _FakeEvent()

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _FakeEvent:
    def __init__(self, *a, **k):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


class _DeviceContext:
    def __init__(self, device=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _patch_cuda(torch):
    import pickle
    import tempfile

    cuda = torch.cuda
    mem = torch.cuda.memory
    dev = _state.device

    def stats(device=None):
        _lazy_init()
        return _chan.ask(["stats"])[1]

    def stat(key):
        def f(device=None):
            return stats(device).get(key, 0)

        return f

    def reset_peak(device=None):
        _lazy_init()
        _chan.ask(["reset_peak"])

    def reset_accumulated(device=None):
        _lazy_init()
        _chan.ask(["reset_accumulated"])

    def empty_cache():
        if _state.initialized:
            _chan.ask(["empty_cache"])

    def set_fraction(fraction, device=None):
        _lazy_init()
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if fraction < 0 or fraction > 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        r = _chan.ask(["fraction", fraction])
        if r[0] != "ok":
            raise RuntimeError(r[1])

    def get_fraction(device=None):
        _lazy_init()
        return _chan.ask(["get_fraction"])[1]

    def mem_get_info(device=None):
        _lazy_init()
        free, total = _chan.ask(["mem_get_info"])[1]
        return (free, total)

    def summary(device=None, abbreviated=False):
        _lazy_init()
        return _chan.ask(["summary", bool(abbreviated)])[1]

    def dump_snapshot(filename="dump_snapshot.pickle"):
        _lazy_init()
        r = _chan.ask(["dump", os.path.abspath(filename)])
        if r[0] != "ok":
            raise RuntimeError(r[1])

    def snapshot(device=None, *a, **k):
        _lazy_init()
        fd, path = tempfile.mkstemp(suffix=".pickle")
        os.close(fd)
        try:
            r = _chan.ask(["dump", path])
            if r[0] != "ok":
                raise RuntimeError(r[1])
            with open(path, "rb") as f:
                return pickle.load(f)
        finally:
            os.unlink(path)

    def record_history(*a, **k):
        _lazy_init()  # the simulation records every event from the start
        # `enabled=None` stops recording and clears the buffer, and nothing
        # is recorded until it is on again; 2.8+'s `clear_history=True`
        # clears it on enabling (allocator.md §13.1). The program's own
        # snapshots follow that; vramscope's views keep every event.
        enabled = a[0] if a else k.get("enabled", "all")
        on = enabled is not None and enabled is not False
        r = _chan.ask(["history", on, bool(k.get("clear_history"))])
        if r[0] != "ok":
            raise RuntimeError(r[1])

    def noop(*a, **k):
        return None

    def init():
        _lazy_init()

    def props(device=None):
        return _DeviceProperties(dev)

    def rng_state(device="cuda"):
        return torch.zeros(16, dtype=torch.uint8)

    def clear_workspaces():
        if _state.initialized:
            _chan.ask(["clear_workspaces"])
            # The next GEMM on each thread takes its workspace again: it
            # waits for its answer (an OOM there reaches the program).
            _state.quiet.clear()
            _state.still.clear()
            _state.asked.clear()

    patches = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": noop,
        "is_initialized": lambda: _state.initialized,
        "init": init,
        "_lazy_init": init,
        "synchronize": noop,
        "get_device_properties": props,
        "get_device_name": lambda device=None: dev["name"],
        "get_device_capability": lambda device=None: (dev["major"], dev["minor"]),
        "is_bf16_supported": lambda including_emulation=True: dev["major"] >= 8,
        "mem_get_info": mem_get_info,
        "memory_stats": stats,
        "memory_allocated": stat("allocated_bytes.all.current"),
        "max_memory_allocated": stat("allocated_bytes.all.peak"),
        "memory_reserved": stat("reserved_bytes.all.current"),
        "max_memory_reserved": stat("reserved_bytes.all.peak"),
        "memory_cached": stat("reserved_bytes.all.current"),
        "max_memory_cached": stat("reserved_bytes.all.peak"),
        "reset_peak_memory_stats": reset_peak,
        "reset_max_memory_allocated": reset_peak,
        "reset_max_memory_cached": reset_peak,
        "reset_accumulated_memory_stats": reset_accumulated,
        "empty_cache": empty_cache,
        "set_per_process_memory_fraction": set_fraction,
        "get_per_process_memory_fraction": get_fraction,
        "memory_summary": summary,
        "get_allocator_backend": lambda: "native",
        "get_rng_state": rng_state,
        "get_rng_state_all": lambda: [rng_state()],
        "set_rng_state": noop,
        "set_rng_state_all": noop,
        "manual_seed": noop,
        "manual_seed_all": noop,
        "seed": noop,
        "seed_all": noop,
        "initial_seed": lambda: 0,
        "current_stream": lambda device=None: _FakeStream(),
        "default_stream": lambda device=None: _FakeStream(),
        "set_stream": noop,
        "Stream": _FakeStream,
        "Event": _FakeEvent,
        "stream": lambda s=None: _DeviceContext(),
        "device": _DeviceContext,
        "device_of": _DeviceContext,
        "is_current_stream_capturing": lambda: False,
    }
    for name, fn in list(patches.items()):
        # One object per name: torch._dynamo's rule table refuses one
        # function standing for two names.
        fn = _distinct(name, fn)
        patches[name] = fn
        setattr(cuda, name, fn)
        if hasattr(mem, name):
            setattr(mem, name, fn)
    try:
        import torch.cuda.graphs as graphs

        graphs.is_current_stream_capturing = patches["is_current_stream_capturing"]
    except ImportError:
        pass
    mem._record_memory_history = record_history
    mem._dump_snapshot = dump_snapshot
    mem._snapshot = snapshot
    torch._C._cuda_clearCublasWorkspaces = clear_workspaces
    try:
        import torch.cuda.random as rnd

        for name in ("get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all", "seed", "seed_all"):
            setattr(rnd, name, patches[name])
    except ImportError:
        pass


def _distinct(name, fn):
    if isinstance(fn, type):
        return type(name, (fn,), {})

    def call(*a, **k):
        return fn(*a, **k)

    call.__name__ = call.__qualname__ = name
    return call


# ------------------------------------------------------------ steps, exit


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
    try:
        allocated = int(_chan.ask(["stats"])[1].get("allocated_bytes.all.current", 0))
        requested = requested or st.walk_asked
        st.walk_asked = False
        asked = oom or requested
        if not asked and st.holders_prev is not None and allocated - st.holders_alloc < HOLDERS_MIN_GROWTH:
            return
        # Tensors' attributes without the relabelling mode (a Python call
        # for each, several times the walk's own cost); no op runs here.
        with st.torch._C.DisableTorchFunction():
            fields, totals = h.find(
                st.torch, frame, st.holders_budget_ms, st.holders_prev,
                "oom" if oom else "requested" if requested else "grew",
                is_device=_is_meta, skip_files=(_HERE,),
            )
        first = st.holders_prev is None
        st.holders_prev, st.holders_alloc = totals, allocated
        if first and not asked:
            return  # the baseline: nothing to compare with yet
        _chan.post(["holders", fields])
    except (OSError, TraceError):
        raise
    except Exception as e:  # never turn the program's step into an error
        print(f"vramscope trace: could not find what holds the memory: {e!r}", file=sys.stderr)


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
                if os.path.abspath(co.co_filename) != _HERE:
                    frames.append([co.co_filename, t.tb_lineno, co.co_name])
                t = t.tb_next
            frames.reverse()
            _chan.post(["exception", tp.__name__, str(value)[:16384], frames[:MAX_STACK]])
        prev(tp, value, tb)

    sys.excepthook = hook
