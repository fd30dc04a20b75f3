"""vramscope_live: watch a running PyTorch job's GPU memory with `vramscope attach`.

Usage, inside the training script::

    import vramscope_live
    vramscope_live.start()                   # unix socket, path printed to stderr
    # or vramscope_live.start("127.0.0.1:7878")  # TCP on loopback, token printed
    for batch in loader:
        ...
        optimizer.step()                     # each Optimizer.step ends a step
    vramscope_live.stop()                    # also done at exit

and in a terminal on the same machine::

    vramscope attach /run/user/1000/vramscope/4242.sock
    vramscope attach 127.0.0.1:7878 --token 3f2a...      # the line the job printed

`start(address=None, *, token=None, stacks=True, record_to=None,
max_entries=1_000_000, step_marker=None, mode="auto", poll_interval_s=None,
holders=True, holders_budget_ms=25.0)`:

- `address`: a unix socket path (`unix:/p`, `/p`, `./p`; the default is
  `$XDG_RUNTIME_DIR/vramscope/{pid}.sock`, else `/tmp/vramscope-{uid}/{pid}.sock`)
  or `HOST:PORT` for TCP. `{rank}` is replaced by `RANK` (else `LOCAL_RANK`,
  else 0), so one line serves every process of a multi-process job.
- `stacks`: record Python stacks with each allocation (what the by-line and
  leak views group by). Turning it off makes each event cheaper.
- `record_to`: also write everything to this file (`{rank}` allowed), which
  `vramscope attach --replay FILE` plays back. It is made as a new file, mode
  0600 (an earlier recording there is replaced whole, never truncated in
  place); a symbolic link, a named pipe, a directory or a device there is
  refused.
- `max_entries`: how many trace entries PyTorch's ring keeps (poll mode) and how
  long the helper's log grows before it restarts from a fresh state.
- `step_marker`: a `torch.profiler.record_function` name whose every START
  marks a step boundary (a name like `Optimizer.step#AdamW.step` also matches
  `Optimizer.step`). `Optimizer.step` and `mark_step()` always mark steps.
- `holders`: at a step boundary (`Optimizer.step`, `mark_step()`) where
  allocated memory grew by 1 MiB since the last look (at most once a
  second), or when `attach` asks (its `H` key), walk in the job's thread from
  its frames and module globals to its CUDA tensors and send the Python
  names that hold what grew, with what their graphs keep and a fix
  (holders.py; PROTOCOL.md `holders`). `holders_budget_ms` bounds one walk.
- `mode`: `"agent"` (a small C++ extension built on first use with
  `torch.utils.cpp_extension`; every event as it happens), `"poll"` (pure
  Python), or `"auto"` (agent, else poll, saying why).

`mark_step()` ends a step explicitly (a no-op when not started). `stop()` sends
a last state and `bye`, closes the socket and the recording, and turns
PyTorch's memory history off again. An OOM is sent as it happens with the
allocator's state; PyTorch's own message follows when the
`torch.cuda.OutOfMemoryError` ends the program (or a thread), or when your
loop calls `report_oom(e)` where it catches one. The job's stderr says when
vramscope attaches and detaches.

Security. The stream carries your file paths, function names and memory
layout. By default the helper serves a unix socket in a directory made `0700`
(the socket itself `0600`): only your user can connect. On TCP it listens on
the address you give; loopback needs the random token it prints (compared in
constant time); any other interface is served only because you named it, and
the helper warns. One client at a time; a second is refused.

Costs. Poll mode calls `torch.cuda.memory._snapshot()`, which re-serialises
PyTorch's whole trace ring on every call (about 0.7 s at 100 k entries), so it
polls every `poll_interval_s` (default: 20x the measured cost of one call,
at least 0.5 s). Entries arrive in batches; a step marker is placed by time
(within a few microseconds of it an entry may count in the neighbouring step);
if more than `max_entries` entries happen between two polls the ring wraps and
the helper sends `lost` plus a fresh state. Since a call costs about 7 us
per ring entry and the default interval is 20 calls' worth, poll mode keeps
up with about 1 / (20 x 7 us), some 7,000 allocator events a second, whatever
`max_entries` is. When entries are lost between two polls, the helper polls
more often (the factor halves each time, down to 4x: up to a fifth of the
time in `_snapshot()`, keeping up with some 35,000 events a second); past
that a job loses entries between polls (the view starts over each time, and
says so): use agent mode there. Besides `_snapshot()`, the poll
thread encodes the new entries in Python, with the GIL: about 2.5 us per
entry, plus 0.15 us per new entry to find the last one sent. To lower the
cost: a smaller `max_entries` (a cheaper `_snapshot()`, but an earlier wrap),
a longer `poll_interval_s`, `stacks=False`, or agent mode.

Measured on an H100 80GB HBM3 with PyTorch 2.11.0+cu130 (python/gpu/live_check.py,
2026-11-26): a loop that only allocates and frees cached 1 KiB blocks (the GPU
idle, so every microsecond shows) costs 1.0 us per allocator event alone; the
helper adds 0.15 us per event in agent mode with stacks=False (the tracker
callback, the ring, the drain), 0.66-0.94 us in agent mode with stacks (mostly
PyTorch's own capture of the Python stack), 0.81 us in poll mode with stacks.
A GPT-2-small training step (batch 4 x 1,024 tokens, AdamW, 89 ms, 2,355
allocator events) ran as fast with the helper as without it in every mode (the
medians differed by under 0.7 %, either way: noise); start() took 0.25-0.37 s
with the agent already built (23 s to build it the first time, cached by torch).
The replayed stream matched every state the job sent, block for block.

Agent mode, per trace entry, on the standalone build of the extension's core
(g++ -O2 with python/tests/agent_core/driver.cpp, `driver bench`, a shared
2-core machine; ranges over several runs):
- In the allocator's lock (the tracker callback: copy the entry and its stack
  pointer, read the clock, push into the lock-free ring): 30-45 ns. No GIL,
  no PyTorch call.
- On the drain thread, without the GIL: pop, intern the stack, encode the
  `entries` frames: 100-120 ns per entry without stacks, 130-190 ns with them
  (24-frame stacks, 256 distinct; torch::symbolize not counted).
- With the GIL, without stacks: nothing per entry. Every 10 ms the drain
  thread holds it for about 6 us per batch of up to 16,384 entries (placing
  markers and states, handing the frames to the log; measured with a stand-in
  extension), plus copying the frame bytes into Python (1.4 ns per entry).
  With stacks: torch::symbolize's Python part, once per batch (PyTorch
  resolves each frame with the GIL; not measured here), and dropping the
  entries' stack objects.
- With stacks on, PyTorch's own capture of a Python stack for every entry
  (in the job's thread, inside the allocation; 0.5-0.8 us of the figures
  above) costs the job most; it is PyTorch's cost whether or not anything
  drains.
At 50,000 allocator events per step, the measured 0.15 us per event of agent
mode without stacks is 7.5 ms per step: under 1 % of steps longer than 0.75 s.
With stacks, 0.66-0.94 us per event (33-47 ms a step), most of it PyTorch's own
stack capture: under 1 % of steps longer than 5 s. Where a GPU keeps the step
busy (the GPT-2 step above) the CPU's share hides behind the kernels it
launched. To lower it:
`stacks=False` (no capture, no symbolize: the by-line and leak views then
have no lines), or fewer allocator events (fewer, larger tensors; a step that
reuses its buffers). The ring holds 262,144 records; a job that outruns the
drain for longer than that loses entries and the helper starts over from a
fresh state (`lost`). A state (at start, after a loss, every `max_entries`
entries) costs a `_snapshot(include_traces=False)` where PyTorch has that
argument (newer than 2.11; about 0.2 ms), else a `_snapshot()` of PyTorch's
ring, which agent mode keeps at 1 entry, and Python work per block; it is read
between two markers in the same ring and placed exactly by the `snapshot`
entries PyTorch records while reading it (2.11 records one per call); on a
PyTorch that records none, only when no allocation happened meanwhile (else it
is read again 10 ms later). With `step_marker` set in agent mode a global
RecordFunction callback (user scope) watches for the name: each op then pays a
scope check.

The wire protocol is python/PROTOCOL.md in vramscope's repository. This file
needs only the standard library until `start()` imports torch.
"""

import atexit
import importlib
import os
import secrets
import socket
import sys
import threading
import time

from ._address import _is_loopback, _parse_address, _rank
from ._agent_source import AGENT_SOURCE
from ._log import _Log, _Recorder
from ._producers import _Agent, _Poller, _segments_snapshot
from ._server import _Server
from ._wire import _clean, _now_us, _pci_bus_id, _say, _uuid, LiveError, PROTOCOL
from . import holders as _holders

__all__ = ["start", "stop", "mark_step", "report_oom", "LiveError"]

STATS_MIN_INTERVAL_S = 0.1  # stats at most 10 per second



class _Session:
    def __init__(self, torch, opts):
        self.torch = torch
        self.stacks = opts["stacks"]
        self.max_entries = int(opts["max_entries"])
        self.step_marker = opts["step_marker"]
        self.poll_interval_s = opts["poll_interval_s"]
        self.started_us = _now_us()
        self.last_stats = 0.0
        self.stats_lock = threading.Lock()
        self.hooks = []
        self.active = True
        n = torch.cuda.device_count()
        self.devices = []
        for d in range(n):
            props = torch.cuda.get_device_properties(d)
            self.devices.append({"device": d, "name": _clean(props.name), "total_memory": int(props.total_memory),
                                 "pci_bus_id": _pci_bus_id(props), "uuid": _uuid(props)})
        self.producer = None
        self.log = None
        self.server = None
        self.allocator_settings = {"PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
        # Who holds what grew (holders.py): the last walk's bytes per holder,
        # the allocated bytes then, and whether attach asked for a walk.
        self.holders = opts.get("holders", True)
        self.holders_budget_ms = float(opts.get("holders_budget_ms", _holders.DEFAULT_BUDGET_MS))
        self.holders_prev = None
        self.holders_alloc = None
        self.holders_last_walk = 0.0
        self.holders_requested = False
        self.marks = 0

    def on_client(self, msg):
        """A message from the attached client (its own thread)."""
        if msg.get("t") == "find_holders":
            self.holders_requested = True

    def hello(self):
        interval = getattr(self.producer, "interval_s", None)
        return {
            "t": "hello",
            "protocol": PROTOCOL,
            "pid": os.getpid(),
            "rank": _rank(),
            "world_size": int(os.environ.get("WORLD_SIZE", "1") or 1),
            "hostname": _clean(socket.gethostname()),
            "argv": [_clean(a) for a in sys.argv],
            "torch": _clean(getattr(self.torch, "__version__", "unknown")),
            "mode": self.producer.mode,
            "stacks": bool(self.stacks),
            "poll_interval_s": interval if self.producer.mode == "poll" else None,
            "devices": self.devices,
            "allocator_settings": self.allocator_settings,
            "started_us": self.started_us,
        }

    def stats_due(self):
        with self.stats_lock:
            now = time.monotonic()
            if now - self.last_stats < STATS_MIN_INTERVAL_S:
                return False
            self.last_stats = now
            return True

    def read_stats(self):
        out = []
        for dev in self.devices:
            raw = self.torch.cuda.memory_stats(dev["device"])
            out.append((dev["device"], {str(k): int(v) for k, v in raw.items() if isinstance(v, int) and not isinstance(v, bool)}))
        return out

    def mark(self, source, frame=None):
        if not self.active:
            return
        stats = self.read_stats() if self.stats_due() else None
        self.producer.mark(source, stats)
        step = self.marks
        self.marks += 1
        if self.holders and frame is not None:
            try:
                self.find_holders(frame, step)
            except Exception as e:  # never turn the job's step into an error
                _say(f"could not find what holds the memory: {e!r}")

    def allocated(self):
        return sum(int(self.torch.cuda.memory_allocated(d["device"])) for d in self.devices)

    def find_holders(self, frame, step, oom=False):
        """At a step boundary, in the job's thread: walk from its frames to
        the tensors, when memory grew since the last walk (at most once a
        second) or attach asked. The first walk is the baseline. At an OOM
        (`oom`, from the failing frame) it always walks and names the
        largest holders."""
        requested, self.holders_requested = self.holders_requested, False
        requested = requested or oom
        allocated = self.allocated()
        now = time.monotonic()
        if not requested:
            if self.holders_prev is not None:
                grew = allocated - self.holders_alloc
                if grew < HOLDERS_MIN_GROWTH or now - self.holders_last_walk < HOLDERS_MIN_INTERVAL_S:
                    return
        fields, totals = _holders.find(
            self.torch, frame, self.holders_budget_ms, self.holders_prev,
            "oom" if oom else "requested" if requested else "grew",
        )
        first = self.holders_prev is None
        self.holders_prev, self.holders_alloc, self.holders_last_walk = totals, allocated, now
        if first and not requested:
            return  # the baseline: nothing to compare with yet
        with self.log.cond:
            msg = {"t": "holders", "seq": self.log.next_seq, "step": step, "allocated": allocated}
            msg.update(fields)
            self.log.append(msg, weight=0)

    def on_oom(self, device, alloc_size, device_allocated, device_free):
        if not self.active:
            return
        total = next((d["total_memory"] for d in self.devices if d["device"] == device), None)
        fields = {
            "device": int(device),
            "message": (
                f"out of memory on device {device}: tried to allocate {alloc_size} bytes with "
                f"{device_allocated} allocated and {device_free} free on the device (from PyTorch's "
                "OOM observer, which runs before PyTorch raises its own message)"
            ),
            "device_free": int(device_free),
            "device_total": total,
            "alloc_size": int(alloc_size),
        }
        try:
            self.producer.oom(fields)
        except Exception as e:  # never turn the job's OOM into another error
            _say(f"could not record the OOM: {e!r}")


_SESSION = None
_LOCK = threading.Lock()
_EXCEPTHOOK_INSTALLED = False
_OOM_OBSERVER_ATTACHED = False


def _import_torch():
    try:
        import torch  # noqa: F401
        import torch.cuda.memory  # noqa: F401
    except ImportError as e:
        raise LiveError(
            f"vramscope_live needs PyTorch in this Python environment (import torch failed: {e})"
        ) from None
    if not torch.cuda.is_available():
        raise LiveError("vramscope_live watches the CUDA caching allocator, and torch sees no CUDA device")
    return torch


def _import_inductor():
    """Import torch._inductor in the thread that calls start().

    PyTorch's symbolisation of Python stack frames (in ``_snapshot()`` and the
    agent's drain, both run in the helper's threads) begins with
    ``hasattr(torch, "_inductor")``, which imports torch._inductor on first use.
    That import, in a helper thread, can meet the job's own first import of
    torch._dynamo (the first optimizer's constructor does it), and Python's
    import-deadlock detection then hands the job a partially initialised
    module: an ImportError in the job (seen on PyTorch 2.11). Imported here,
    it leaves the helper's threads nothing to import."""
    try:
        importlib.import_module("torch._inductor")
    except Exception as e:  # a build without inductor: then symbolisation skips it too
        _say(f"torch._inductor did not import ({e.__class__.__name__}: {e}); going on without it")


def _build_agent(torch):
    import torch.utils.cpp_extension as ext_mod  # ImportError -> poll

    return ext_mod.load_inline(
        name="vramscope_live_agent_v2",  # v2: drain() returns encoded frames
        cpp_sources=[AGENT_SOURCE],
        with_cuda=True,
        extra_cflags=["-O2"],
        verbose=False,
    )


def start(
    address=None,
    *,
    token=None,
    stacks=True,
    record_to=None,
    max_entries=1_000_000,
    step_marker=None,
    mode="auto",
    poll_interval_s=None,
    holders=True,
    holders_budget_ms=25.0,
):
    """Start streaming this process's allocator events; see the module docstring."""
    global _SESSION, _OOM_OBSERVER_ATTACHED
    if mode not in ("auto", "agent", "poll"):
        raise LiveError(f"mode {mode!r}: expected 'auto', 'agent' or 'poll'")
    if int(max_entries) < 1:
        raise LiveError("max_entries must be at least 1")
    with _LOCK:
        if _SESSION is not None:
            raise LiveError("vramscope_live is already started in this process; call stop() first")
        kind, *where = _parse_address(address)
        torch = _import_torch()
        if stacks:
            _import_inductor()
        s = _Session(
            torch,
            {"stacks": stacks, "max_entries": max_entries, "step_marker": step_marker, "poll_interval_s": poll_interval_s,
             "holders": holders, "holders_budget_ms": holders_budget_ms},
        )
        ext = None
        if mode in ("auto", "agent"):
            try:
                ext = _build_agent(torch)
            except Exception as e:  # no compiler, no headers, an API that moved
                if mode == "agent":
                    _say(f"agent mode failed to build ({e.__class__.__name__}: {e}); polling instead")
                else:
                    _say(f"no agent ({e.__class__.__name__}: {e}); polling _snapshot() instead")
        memory = torch.cuda.memory
        ring = 1 if ext is not None else int(max_entries)
        if stacks:
            memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=ring)
        else:
            memory._record_memory_history(enabled="all", context=None, max_entries=ring)
        recorder = None
        try:
            s.producer = _Agent(s, ext) if ext is not None else _Poller(s)
            # the settings for the hello; in poll mode this also measures one poll's cost
            first = s.producer._snapshot() if ext is None else _segments_snapshot(memory)
            if isinstance(first.get("allocator_settings"), dict):
                s.allocator_settings = first["allocator_settings"]
            if record_to is not None:
                path = str(record_to).replace("{rank}", str(_rank()))
                recorder = _Recorder(path, s.hello())
            s.log = _Log(int(max_entries), recorder)
            token_needed = token if kind == "unix" else (token or secrets.token_hex(16))
            s.server = _Server(kind, where[0] if kind == "unix" else tuple(where), token_needed, s.log, s.hello,
                               s.on_client)
            try:
                s.producer.start()
            except BaseException:
                s.server.close()
                raise
        except BaseException:
            memory._record_memory_history(enabled=None)
            if recorder is not None:
                recorder.close()
            raise
        try:
            # torch/optim/__init__.py deletes its `optimizer` attribute: import the module by name
            optimizer = importlib.import_module("torch.optim.optimizer")
            s.hooks.append(optimizer.register_optimizer_step_post_hook(
                lambda *_: s.mark("Optimizer.step", sys._getframe(1))))
        except Exception as e:
            _say(f"no Optimizer.step hook ({e!r}); use mark_step() or step_marker=")
        if not _OOM_OBSERVER_ATTACHED:  # an observer cannot be detached: it calls the live session
            try:
                torch._C._cuda_attach_out_of_memory_observer(_oom_observer)
                _OOM_OBSERVER_ATTACHED = True
            except Exception as e:
                _say(f"no OOM observer ({e!r}); OOMs show only as trace entries")
        global _EXCEPTHOOK_INSTALLED
        if not _EXCEPTHOOK_INSTALLED:
            _install_excepthook()
            _EXCEPTHOOK_INSTALLED = True
        _SESSION = s
        _announce(kind, s.server, token_needed)
        return s.server.address


def _announce(kind, server, token):
    if kind == "unix":
        _say(f"serving on unix socket {server.address}")
        print(f"vramscope attach {server.address}", file=sys.stderr, flush=True)
        return
    host = server.address.rsplit(":", 1)[0].strip("[]")
    if not _is_loopback(host):
        _say(
            f"serving on {server.address}, which other machines may reach: anyone with the token can read "
            "this job's memory layout, file paths and function names"
        )
    print(f"vramscope attach {server.address} --token {token}", file=sys.stderr, flush=True)


def _oom_observer(device, alloc_size, device_allocated, device_free):
    s = _SESSION
    if s is not None:
        s.on_oom(device, alloc_size, device_allocated, device_free)


def mark_step():
    """End the current step (an iteration boundary) now. A no-op when not started."""
    s = _SESSION
    if s is not None:
        s.mark("mark_step", sys._getframe(1))


def report_oom(exc):
    """Send PyTorch's own message for the last OOM (the observer that
    records an OOM runs before PyTorch builds its message). Call it where a
    loop catches ``torch.cuda.OutOfMemoryError``; one that reaches the top
    of the program is reported by itself. A no-op when not started."""
    s = _SESSION
    if s is None or not s.active:
        return
    text = str(exc)[:MAX_OOM_MESSAGE]
    device = _device_of_oom(text)
    with s.log.cond:
        s.log.append({"t": "oom_message", "seq": s.log.next_seq, "device": device, "message": text})
    frame = _failing_frame(exc)
    if s.holders and frame is not None:
        # What held the memory when the request failed, by name: the walk
        # starts at the frame that raised, whose locals are still alive.
        try:
            s.find_holders(frame, None, oom=True)
        except Exception as e:  # never hide the OOM behind the walk's own error
            _say(f"could not find what held the memory at the OOM: {e!r}")


def _failing_frame(exc):
    """The innermost frame of the exception's traceback (None without one)."""
    tb = getattr(exc, "__traceback__", None)
    frame = None
    while tb is not None:
        frame, tb = tb.tb_frame, tb.tb_next
    return frame


MAX_OOM_MESSAGE = 16 * 1024
# A walk for holders when allocated grew by this much since the last one,
# at most once in this long (holders.py; attach's request walks at once).
HOLDERS_MIN_GROWTH = 1 << 20
HOLDERS_MIN_INTERVAL_S = 1.0


def _device_of_oom(text):
    """The device PyTorch's OOM message names ("GPU 0 has a total capacity"), or None."""
    marker = "GPU "
    at = text.find(marker)
    if at < 0:
        return None
    digits = ""
    for ch in text[at + len(marker):]:
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else None


def _is_cuda_oom(exc):
    name = type(exc).__name__
    return name == "OutOfMemoryError" or (isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc))


def _install_excepthook():
    """An OOM that ends the program (or a thread) is sent with PyTorch's own
    message before the process exits; the previous hooks still run."""
    previous = sys.excepthook
    previous_thread = threading.excepthook

    def hook(kind, exc, tb):
        if _is_cuda_oom(exc):
            report_oom(exc)
        previous(kind, exc, tb)

    def thread_hook(args):
        if args.exc_value is not None and _is_cuda_oom(args.exc_value):
            report_oom(args.exc_value)
        previous_thread(args)

    sys.excepthook = hook
    threading.excepthook = thread_hook


def _poll_now():
    """Poll (poll mode) or drain (agent mode) at once; tests use it to be exact."""
    s = _SESSION
    if s is None:
        return
    if isinstance(s.producer, _Poller):
        with s.producer.lock:
            s.producer.poll_once()
    else:
        s.producer.drain()


def stop(reason="stopped by vramscope_live.stop()"):
    """Send a last state and bye, close the socket and recording, stop recording history."""
    global _SESSION
    with _LOCK:
        s = _SESSION
        if s is None:
            return
        _SESSION = None
        s.active = False
        for h in s.hooks:
            try:
                h.remove()
            except Exception:
                pass
        try:
            s.producer.stop()
        except Exception as e:
            _say(f"the last state failed: {e!r}")
        with s.log.cond:
            s.log.close(reason)
        time.sleep(0.05)  # let attached clients read the bye
        s.server.close()
        try:
            s.torch.cuda.memory._record_memory_history(enabled=None)
        except Exception:
            pass


atexit.register(lambda: stop("the process is exiting"))

