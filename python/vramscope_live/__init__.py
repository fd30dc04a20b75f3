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
import hmac
import importlib
import ipaddress
import json
import os
import secrets
import select
import socket
import stat
import struct
import sys
import threading
import time

from . import holders as _holders

__all__ = ["start", "stop", "mark_step", "report_oom", "LiveError"]

PROTOCOL = 1
MAGIC = b"VSLIVE1\n"
MAX_FRAME = 64 * 1024 * 1024  # PROTOCOL.md "Framing"
MAX_STRING = 64 * 1024  # PROTOCOL.md "Bounds a reader keeps"
MAX_STACK_FRAMES = 1024
MAX_STACKS = 1_000_000  # distinct stacks kept by the helper (a reader accepts 4 M)
MAX_HELLO = 64 * 1024
HANDSHAKE_TIMEOUT_S = 10.0  # the whole hello, however slowly it comes
MAX_PENDING = 8  # connections still in their handshake: more are closed at once
SEND_TIMEOUT_S = 30.0
STATS_MIN_INTERVAL_S = 0.1  # stats at most 10 per second
MIN_POLL_INTERVAL_S = 0.5
POLL_COST_FACTOR = 20
# After entries are lost between polls the factor halves, down to this: the
# poll thread then spends up to a fifth of the time in _snapshot().
MIN_POLL_COST_FACTOR = 4
ENTRIES_PER_FRAME = 4096
SEND_BATCH_ITEMS = 64  # frames joined into one send: a late client's replay is not copied whole
BLOCKS_PER_FRAME = 20000
SEGMENTS_PER_FRAME = 256
TAIL = 8  # entries remembered to find the last one sent in a new ring
AGENT_RING_SLOTS = 1 << 18
AGENT_DRAIN_EVERY_S = 0.01
AGENT_DRAIN_MAX = ENTRIES_PER_FRAME * 4  # records per extension drain() call


class LiveError(RuntimeError):
    """start() could not do what was asked; the message says why."""


def _say(msg):
    print(f"vramscope_live: {msg}", file=sys.stderr, flush=True)


def _now_us():
    return time.time_ns() // 1000


# ---------------------------------------------------------------- framing


def encode_frame(obj):
    body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8")
    if len(body) > MAX_FRAME:
        raise LiveError(f"a {obj.get('t')} message of {len(body)} bytes is over the 64 MiB frame limit")
    return struct.pack("<I", len(body)) + body


def _recv_exact(sock, n, deadline=None):
    """`n` bytes from `sock`; with `deadline` (time.monotonic()), all of them
    by then, however slowly they trickle (socket.timeout past it)."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("the handshake took too long")
            sock.settimeout(left)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        buf += chunk
    return bytes(buf)


def read_frame(sock, limit=MAX_FRAME, deadline=None):
    """One frame from `sock` as a dict; raises ValueError on a bad frame."""
    (n,) = struct.unpack("<I", _recv_exact(sock, 4, deadline))
    if n > limit:
        raise ValueError(f"frame of {n} bytes is over the limit of {limit}")
    obj = json.loads(_recv_exact(sock, n, deadline).decode("utf-8"))
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        raise ValueError("frame is not an object with a string field t")
    return obj


def _pci_bus_id(props):
    """`0000:3b:00.0` from torch's PCI ids (torch ≥ 2.x has them; older: None)."""
    ids = [getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if not all(type(v) is int and v >= 0 for v in ids):
        return None
    return "%04x:%02x:%02x.0" % tuple(ids)


def _uuid(props):
    """The device's UUID as NVML writes it (`GPU-…`; torch writes it bare); None where torch has none."""
    u = getattr(props, "uuid", None)
    if u is None:
        return None
    s = _clean(u)
    if not s:
        return None
    return s if s.startswith(("GPU-", "MIG-")) else "GPU-" + s


def _clean(s):
    """A string any JSON reader takes: no lone surrogates, at most 64 KiB."""
    s = str(s)
    s = s.encode("utf-8", "replace").decode("utf-8")
    if len(s.encode("utf-8")) > MAX_STRING:
        s = s.encode("utf-8")[: MAX_STRING - 4].decode("utf-8", "ignore")
    return s


# ---------------------------------------------------------------- addresses


def _rank():
    for var in ("RANK", "LOCAL_RANK"):
        try:
            return int(os.environ[var])
        except (KeyError, ValueError):
            continue
    return 0


def _parse_address(address):
    """("unix", path) or ("tcp", host, port) for a PROTOCOL.md address."""
    if address is None:
        return ("unix", _default_socket_path())
    address = str(address).replace("{rank}", str(_rank()))
    if address.startswith("unix:"):
        return ("unix", address[len("unix:") :])
    if address.startswith("tcp:"):
        address = address[len("tcp:") :]
    elif "/" in address or address.endswith(".sock") or ":" not in address:
        return ("unix", address)
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise LiveError(f"address {address!r}: expected HOST:PORT or a unix socket path")
    return ("tcp", host, int(port))


def _default_socket_path():
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        base = os.path.join(runtime, "vramscope")
    else:
        base = os.path.join("/tmp", f"vramscope-{os.getuid()}")
    return os.path.join(base, f"{os.getpid()}.sock")


def _private_dir(path):
    """Create `path` 0700, or check that an existing one is ours and private."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise LiveError(f"{path} exists and is not a directory")
    if st.st_uid != os.getuid():
        raise LiveError(f"{path} belongs to uid {st.st_uid}, not to you: refusing to serve there")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)


def _is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------- the log


def _utf8(s):
    """A name as the bytes PyTorch's C++ holds it (what the extension interns)."""
    return str(s or "").encode("utf-8", "surrogatepass")


def _frame(f):
    """(filename, line, name) with strings any JSON reader takes."""
    return (_clean(f[0] or ""), int(f[1] or 0), _clean(f[2] or ""))


class _Behind(Exception):
    pass


class _Log:
    """Frames since the last state, shared by every reader through a cursor.

    Items are (frame bytes, stack ids it uses). A reader sends each stack's
    definition before the first item that needs it, once per connection.
    """

    def __init__(self, max_entries, recorder):
        self.cond = threading.Condition()
        self.items = []
        self.base = 0  # absolute index of items[0]
        self.size = 0  # entries, steps and stats since the last rebase (states count 0)
        self.max_entries = max_entries
        self.next_seq = 0
        self.step = 0
        self.stack_ids = {}
        self.stack_frames = []
        self.stacks_full = False
        self.interner = None  # agent mode: the extension's, one id space with the entries it encodes
        self.recorder = recorder
        self.closed = False

    # all methods below: call with self.cond held
    def intern(self, frames):
        if not frames:
            return None
        frames = frames[:MAX_STACK_FRAMES]
        if isinstance(frames[0], dict):
            raw = tuple((f.get("filename"), f.get("line"), f.get("name")) for f in frames)
        else:
            raw = tuple(tuple(f) for f in frames)
        sid = self.stack_ids.get(raw)
        if sid is not None:
            return sid
        if self.interner is not None:
            return self._intern_native(raw)
        if len(self.stack_frames) >= MAX_STACKS:
            if not self.stacks_full:
                self.stacks_full = True
                _say(f"{MAX_STACKS} distinct stacks seen: new ones are sent without a stack from now on")
            return None
        # cleaned only once per distinct stack
        sid = len(self.stack_frames)
        self.stack_ids[raw] = sid
        clean = [list(_frame(f)) for f in raw]
        while True:  # a stack of huge names: keep its innermost frames that fit a frame
            try:
                self.stack_frames.append(encode_frame({"t": "stack", "id": sid, "frames": clean}))
                break
            except LiveError:
                clean = clean[: len(clean) // 2]
        return sid

    def _intern_native(self, raw):
        frames = [(_utf8(f), int(line or 0), _utf8(name)) for f, line, name in raw]
        sid, definition = self.interner.intern(frames)
        if definition is not None:
            self.add_stacks([definition])
        if sid is not None:
            self.stack_ids[raw] = sid
        return sid

    def add_stacks(self, definitions):
        """`stack` frames the extension encoded, in id order (agent mode)."""
        self.stack_frames.extend(definitions)
        if len(self.stack_frames) >= MAX_STACKS and not self.stacks_full:
            self.stacks_full = True
            _say(f"{MAX_STACKS} distinct stacks seen: new ones are sent without a stack from now on")

    def append(self, obj, stacks=(), weight=1):
        self.append_bytes(encode_frame(obj), stacks, weight)

    def append_bytes(self, frame, stacks=(), weight=1):
        item = (frame, tuple(stacks))
        self.items.append(item)
        self.size += weight
        if self.recorder is not None:
            self.recorder.write_item(item, self.stack_frames)
        self.cond.notify_all()

    def append_entries(self, rows):
        for i in range(0, len(rows), ENTRIES_PER_FRAME):
            chunk = rows[i : i + ENTRIES_PER_FRAME]
            stacks = {r[6] for r in chunk if r[6] is not None}
            self.append({"t": "entries", "first": self.next_seq, "entries": chunk}, stacks, len(chunk))
            self.next_seq += len(chunk)

    def append_encoded(self, frames):
        """`entries` frames the extension encoded from next_seq on: (bytes, stack ids, count)."""
        for frame, stacks, count in frames:
            self.append_bytes(frame, stacks, count)
            self.next_seq += count

    def append_step(self, source, time_us):
        self.append({"t": "step", "step": self.step, "seq": self.next_seq, "time_us": time_us, "source": source})
        self.step += 1

    def append_stats(self, stats):
        for device, values in stats:
            self.append({"t": "stats", "device": device, "seq": self.next_seq, "stats": values})

    def append_state(self, reason, segments):
        chunks, stacks, cur, cur_stacks, blocks = [], [], [], set(), 0
        for seg in segments:
            seg = self._segment(seg, cur_stacks)
            cur.append(seg)
            blocks += len(seg["blocks"])
            if len(cur) >= SEGMENTS_PER_FRAME or blocks >= BLOCKS_PER_FRAME:
                chunks.append(cur)
                stacks.append(cur_stacks)
                cur, cur_stacks, blocks = [], set(), 0
        if cur:
            chunks.append(cur)
            stacks.append(cur_stacks)
        # every stack a chunk uses is defined before the state: its chunks follow it at once
        everything = set().union(*stacks) if stacks else set()
        self.append({"t": "state", "seq": self.next_seq, "reason": reason, "chunks": len(chunks)}, everything, 0)
        for chunk, ids in zip(chunks, stacks):
            self.append({"t": "segments", "segments": chunk}, ids, 0)

    def _segment(self, seg, used):
        out = {k: v for k, v in seg.items() if k not in ("blocks", "frames")}
        if "frames" in seg:
            out["stack"] = self._use(seg["frames"], used)
        blocks = []
        for b in seg.get("blocks", []):
            nb = {k: v for k, v in b.items() if k not in ("frames", "history")}
            nb["stack"] = self._use(b.get("frames"), used)
            blocks.append(nb)
        out["blocks"] = blocks
        return out

    def _use(self, frames, used):
        sid = self.intern(frames)
        if sid is not None:
            used.add(sid)
        return sid

    def rebase(self, reason, segments, before=()):
        """Drop the log and start it again from `before` and a state at the current seq."""
        self.base += len(self.items)
        self.items = []
        self.size = 0
        for msg in before:
            self.append(msg, weight=0)
        self.append_state(reason, segments)

    def needs_rebase(self):
        return self.size > self.max_entries

    def close(self, reason):
        if not self.closed:
            self.append({"t": "bye", "reason": reason})
            self.closed = True
            if self.recorder is not None:
                self.recorder.close()
            self.cond.notify_all()

    def read(self, cursor, timeout, max_items=SEND_BATCH_ITEMS):
        """Up to max_items items from absolute index `cursor` on, waiting up to `timeout`."""
        if cursor < self.base:
            raise _Behind()
        end = self.base + len(self.items)
        if cursor >= end and not self.closed:
            self.cond.wait(timeout)
            if cursor < self.base:
                raise _Behind()
            end = self.base + len(self.items)
        end = min(end, cursor + max_items)
        return self.items[cursor - self.base : end - self.base], end


def _create_private(path):
    """A new file at `path`, mode 0600, for writing. Never follows a link,
    never opens a named pipe or a device (it would block, or write into
    something else): those, and directories, are refused. A regular file
    already there is replaced whole (a new file renamed over it), never
    truncated in place, so a hard link to it keeps what it held."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = (
            "a symbolic link" if stat.S_ISLNK(st.st_mode)
            else "a named pipe" if stat.S_ISFIFO(st.st_mode)
            else "a directory" if stat.S_ISDIR(st.st_mode)
            else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "a socket" if stat.S_ISSOCK(st.st_mode)
            else "not a regular file"
        )
        raise LiveError(f"record_to={path}: {kind} is there: refusing to write a recording to it")
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return os.fdopen(fd, "wb")


class _Recorder:
    """record_to=: the frames a client attached at start() would receive."""

    def __init__(self, path, hello):
        self.f = _create_private(path)
        self.sent = set()
        self.f.write(MAGIC)
        self.f.write(encode_frame(hello))

    def write_item(self, item, stack_frames):
        frame, stacks = item
        for sid in stacks:
            if sid not in self.sent:
                self.sent.add(sid)
                self.f.write(stack_frames[sid])
        self.f.write(frame)
        self.f.flush()

    def close(self):
        self.f.close()


# ---------------------------------------------------------------- the server


class _Server:
    def __init__(self, kind, where, token, log, hello_fn, on_message=None):
        self.log = log
        self.hello_fn = hello_fn
        self.on_message = on_message
        self.token = token
        self.attached = False
        self.lock = threading.Lock()
        self.pending = 0  # connections not yet past their handshake
        self.stopping = False
        self.path = None
        if kind == "unix":
            self.sock = self._bind_unix(where)
            self.address = where
        else:
            host, port = where
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.sock = socket.socket(family, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
            port = self.sock.getsockname()[1]
            self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.thread = threading.Thread(target=self._accept_loop, name="vramscope-live-accept", daemon=True)
        self.thread.start()

    def _bind_unix(self, path):
        path = os.path.abspath(path)
        if path == os.path.abspath(_default_socket_path()):
            _private_dir(os.path.dirname(path))
        if os.path.lexists(path):
            st = os.lstat(path)
            if not stat.S_ISSOCK(st.st_mode):
                raise LiveError(f"{path} exists and is not a socket: refusing to replace it")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
                raise LiveError(f"{path}: another process is serving there")
            except OSError:
                os.unlink(path)  # a stale socket from a dead job
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self.path = path
        return sock

    def _accept_loop(self):
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            # An unauthenticated peer gets no thread of the job's beyond a few.
            with self.lock:
                full = self.pending >= MAX_PENDING
                if not full:
                    self.pending += 1
            if full:
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="vramscope-live-client", daemon=True).start()

    def _serve(self, conn):
        attached = False
        pending = True
        try:
            try:
                reason = self._handshake(conn, time.monotonic() + HANDSHAKE_TIMEOUT_S)
            finally:
                with self.lock:
                    self.pending -= 1
                pending = False
            conn.settimeout(SEND_TIMEOUT_S)
            if reason is not None:
                conn.sendall(encode_frame({"t": "refused", "reason": reason}))
                return
            with self.lock:
                if self.attached:
                    conn.sendall(encode_frame({"t": "refused", "reason": "another vramscope is attached"}))
                    return
                self.attached = attached = True
            _say("vramscope attached")
            conn.settimeout(SEND_TIMEOUT_S)
            conn.sendall(encode_frame(self.hello_fn()))
            self._stream(conn)
        except socket.timeout:
            if not pending and attached:
                _say("dropped a client that stopped reading for 30 s; it may reconnect")
        except _Behind:
            _say("dropped a client that fell behind the log; it may reconnect and get the log again")
        except (OSError, ValueError, ConnectionError):
            pass
        finally:
            if attached:
                with self.lock:
                    self.attached = False
                _say("vramscope detached")
            conn.close()

    def _handshake(self, conn, deadline):
        try:
            hello = read_frame(conn, MAX_HELLO, deadline)
        except (ValueError, UnicodeDecodeError) as e:
            return f"bad hello: {e}"
        if hello.get("t") != "hello":
            return "expected hello"
        if hello.get("protocol") != PROTOCOL:
            return f"protocol {hello.get('protocol')} is not supported; this helper speaks {PROTOCOL}"
        if self.token is not None:
            given = hello.get("token")
            if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self.token.encode()):
                return "wrong token"
        return None

    def _stream(self, conn):
        log = self.log
        with log.cond:
            cursor, sent = log.base, set()
        inbox = bytearray()
        while True:
            with log.cond:
                items, cursor = log.read(cursor, 0.5)
                closed = log.closed and not items
                stack_frames = log.stack_frames
            if closed:
                return
            if self._read_client(conn, inbox):
                return
            out = []
            for frame, stacks in items:
                for sid in stacks:
                    if sid not in sent:
                        sent.add(sid)
                        out.append(stack_frames[sid])
                out.append(frame)
            if out:
                conn.sendall(b"".join(out))

    def _read_client(self, conn, inbox):
        """Take what the client sent (PROTOCOL.md "What the client sends");
        True once it has closed the connection."""
        readable, _, _ = select.select([conn], [], [], 0)
        if not readable:
            return False
        try:
            data = conn.recv(65536)
        except OSError:
            return True
        if not data:
            return True
        inbox.extend(data)
        while len(inbox) >= 4:
            (n,) = struct.unpack_from("<I", inbox)
            if n > MAX_HELLO:
                raise ValueError(f"a client frame of {n} bytes")
            if len(inbox) < 4 + n:
                break
            body = bytes(inbox[4 : 4 + n])
            del inbox[: 4 + n]
            try:
                msg = json.loads(body.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(msg, dict) and self.on_message is not None:
                self.on_message(msg)
        return False

    def close(self):
        self.stopping = True
        self.sock.close()
        self.thread.join(timeout=2)
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass


# ---------------------------------------------------------------- producers


def _entry_row(log, device, e):
    # An oom entry has no addr in _snapshot(); the C++ entry keeps the free
    # device bytes there, and so does the wire (PROTOCOL.md).
    addr = e.get("device_free", 0) if e.get("action") == "oom" else e.get("addr", 0)
    return [
        e.get("action"),
        device,
        addr,
        e.get("size", 0),
        e.get("stream", 0),
        e.get("time_us"),
        log.intern(e.get("frames")),
    ]


def _entry_key(e):
    return (e.get("action"), e.get("addr"), e.get("size"), e.get("stream"), e.get("time_us"))


def _marker_matches(name, wanted):
    return name == wanted or name.split("#", 1)[0] == wanted


class _Poller:
    """Poll mode: `_snapshot()` every interval, new ring entries into the log."""

    mode = "poll"

    def __init__(self, session):
        self.s = session
        self.torch = session.torch
        self.lock = threading.Lock()  # one poll at a time (poll thread, OOM, stop)
        self.pending_lock = threading.Lock()  # markers: taken briefly by the job's thread
        self.tails = []
        self.seen_annotations = set()
        self.last_annotation_us = 0
        self.pending = []  # (time_us, order, source, stats or None)
        self.order = 0
        self.cost_s = 0.0
        self.cost_factor = POLL_COST_FACTOR
        self.interval_s = session.poll_interval_s or MIN_POLL_INTERVAL_S
        self.stop_event = threading.Event()
        self.thread = None

    def start(self):
        snap = self._snapshot()
        self.tails = [self._tail(trace) for trace in snap.get("device_traces", [])]
        self._note_annotations(snap, emit=False)
        with self.s.log.cond:
            self.s.log.append_state("start", snap.get("segments", []))
        self.thread = threading.Thread(target=self._run, name="vramscope-live-poll", daemon=True)
        self.thread.start()
        return snap

    def _snapshot(self):
        t0 = time.perf_counter()
        snap = self.torch.cuda.memory._snapshot()
        self.cost_s = time.perf_counter() - t0
        if self.s.poll_interval_s is None:
            self.interval_s = max(MIN_POLL_INTERVAL_S, self.cost_factor * self.cost_s)
        return snap

    def _poll_sooner(self):
        """Entries were lost between two polls: poll more often (the default
        interval only), down to MIN_POLL_COST_FACTOR times a call's cost."""
        if self.s.poll_interval_s is not None or self.cost_factor <= MIN_POLL_COST_FACTOR:
            return
        self.cost_factor = max(MIN_POLL_COST_FACTOR, self.cost_factor // 2)
        self.interval_s = max(MIN_POLL_INTERVAL_S, self.cost_factor * self.cost_s)
        _say(
            f"entries were lost between two polls: polling every {self.interval_s:.2f} s now "
            f"({self.cost_factor}x the cost of one _snapshot() call)"
        )

    @staticmethod
    def _tail(trace):
        return [_entry_key(e) for e in trace[-TAIL:]]

    def _run(self):
        while not self.stop_event.wait(self.interval_s):
            try:
                with self.lock:
                    self.poll_once()
            except Exception as e:  # keep the job alive whatever the poll meets
                _say(f"poll failed: {e!r}")

    def mark(self, source, stats):
        with self.pending_lock:
            self.pending.append((_now_us(), self.order, source, stats))
            self.order += 1

    def poll_once(self):
        """Append what happened since the last poll; returns the snapshot."""
        started_us = _now_us()
        snap = self._snapshot()
        traces = snap.get("device_traces", [])
        new, lost = [], False
        for device, trace in enumerate(traces):
            fresh = self._new_entries(device, trace)
            if fresh is None:
                lost = True
            else:
                new.extend((e.get("time_us") or 0, device, i, e) for i, e in enumerate(fresh))
            self._set_tail(device, trace)
        self._note_annotations(snap, emit=True)
        log = self.s.log
        with log.cond:
            if lost:
                self._lost(snap)
                self._poll_sooner()
                return snap
            new.sort(key=lambda x: (x[0], x[1], x[2]))
            steps_without_stats = self._emit(new, started_us)
            if steps_without_stats and self.s.stats_due():
                log.append_stats(self.s.read_stats())
            if log.needs_rebase():
                log.rebase("rebase", snap.get("segments", []))
        return snap

    def _set_tail(self, device, trace):
        while len(self.tails) <= device:
            self.tails.append([])
        self.tails[device] = self._tail(trace)

    def _new_entries(self, device, trace):
        """Entries after the last one sent, or None when the ring wrapped past it."""
        tail = self.tails[device] if device < len(self.tails) else []
        if not tail:
            return None if len(trace) >= self.s.max_entries else list(trace)
        last = tail[-1]
        for p in range(len(trace) - 1, -1, -1):
            if _entry_key(trace[p]) != last:
                continue
            if p + 1 >= len(tail) and [_entry_key(e) for e in trace[p + 1 - len(tail) : p + 1]] == tail:
                return list(trace[p + 1 :])
            if p + 1 < len(tail) and [_entry_key(e) for e in trace[: p + 1]] == tail[len(tail) - p - 1 :]:
                return list(trace[p + 1 :])
        return None

    def _lost(self, snap):
        log = self.s.log
        lost = {
            "t": "lost",
            "seq": log.next_seq,
            "count": None,
            "why": "PyTorch's trace ring wrapped between two polls (more than max_entries "
            "entries in one poll interval)",
        }
        with self.pending_lock:
            self.pending = []  # their steps fell in what was lost
        log.rebase("lost", snap.get("segments", []), [lost])

    def _note_annotations(self, snap, emit):
        wanted = self.s.step_marker
        for a in snap.get("external_annotations", []) or []:
            t = a.get("time_us", 0)
            key = (t, a.get("name"), a.get("stage"), a.get("device"))
            if t < self.last_annotation_us or key in self.seen_annotations:
                continue
            if t > self.last_annotation_us:
                self.seen_annotations = set()
                self.last_annotation_us = t
            self.seen_annotations.add(key)
            if emit and wanted and a.get("stage") == "START" and _marker_matches(str(a.get("name")), wanted):
                with self.pending_lock:
                    self.pending.append((t, self.order, f"record_function:{wanted}", None))
                    self.order += 1

    def _emit(self, new, polled_us):
        """Entries and the markers between them; True if a step came without stats."""
        log = self.s.log
        with self.pending_lock:
            pending = sorted(self.pending, key=lambda p: (p[0], p[1]))
            self.pending = []
        rows, missing_stats = [], False
        for t, device, _, e in new:
            # a marker at time m ends its step before the first entry at or after m
            while pending and pending[0][0] <= t:
                missing_stats |= self._marker(rows, pending.pop(0))
            rows.append(_entry_row(log, device, e))
        while pending and pending[0][0] < polled_us:
            missing_stats |= self._marker(rows, pending.pop(0))
        log.append_entries(rows)
        with self.pending_lock:
            self.pending = pending + self.pending
        return missing_stats

    def _marker(self, rows, marker):
        t, _, source, stats = marker
        log = self.s.log
        log.append_entries(rows)
        rows.clear()
        log.append_step(source, t)
        if stats:
            log.append_stats(stats)
        return stats is None

    def oom(self, message_fields):
        with self.lock:
            snap = self.poll_once()
            with self.s.log.cond:
                self.s.log.append(dict(message_fields, t="oom", seq=self.s.log.next_seq))
                self.s.log.append_stats(self.s.read_stats())
                self.s.log.append_state("oom", snap.get("segments", []))

    def stop(self):
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=10)
        with self.lock:
            snap = self.poll_once()
            with self.s.log.cond:
                self.s.log.append_state("resync", snap.get("segments", []))


def _segments_snapshot(memory):
    try:
        return memory._snapshot(include_traces=False)
    except TypeError:  # torch before include_traces; agent mode keeps PyTorch's ring at 1 entry
        return memory._snapshot()


class _Agent:
    """Agent mode: the C++ trace tracker's ring, drained by a Python thread
    that calls into the extension. The extension pops a batch, symbolises its
    stacks (one torch::symbolize per batch; only its Python part takes the
    GIL), interns them and encodes `entries` and `stack` frames without the
    GIL; this side only places markers and states between the batch's runs of
    entries and forwards bytes.

    A state is read between two barrier markers pushed into the same ring. Where
    PyTorch records a `snapshot` trace entry for each device while it reads that
    device's segments (under the allocator's lock), those entries split the
    entries between the barriers exactly into "in the state" and "after it";
    otherwise the state is used only if no entry happened between the barriers,
    and is asked for again at the next drain.
    """

    mode = "agent"
    MARK_CODES = {"mark_step": 1, "Optimizer.step": 2}
    MARK_RECORD_FUNCTION = 3
    BARRIER_OPEN = 4
    BARRIER_CLOSE = 5
    WARN_AFTER_RETRIES = 50

    def __init__(self, session, ext):
        self.s = session
        self.torch = session.torch
        self.ext = ext
        self.tokens = 0
        self.token_lock = threading.Lock()
        self.request_lock = threading.Lock()  # one barrier window in the ring at a time
        self.drain_lock = threading.Lock()  # one consumer of the ring at a time
        self.stats = {}  # marker token -> stats read when the marker was set
        self.states = {}  # barrier token -> (reason, segments, messages before the state)
        self.window = None  # records between an open barrier and its close
        self.have_state = False
        self.rebase_pending = False
        self.retries = 0
        self.stop_event = threading.Event()
        self.thread = None
        self.interval_s = None

    def _token(self):
        with self.token_lock:
            self.tokens += 1
            return self.tokens

    def start(self):
        self.ext.start(AGENT_RING_SLOTS, self.s.step_marker or "", MAX_STACKS)
        self.s.log.interner = self.ext  # a state's blocks and the entries share stack ids
        self.request_state("start")
        self.thread = threading.Thread(target=self._run, name="vramscope-live-drain", daemon=True)
        self.thread.start()

    def _snapshot(self):
        return _segments_snapshot(self.torch.cuda.memory)

    def request_state(self, reason, before=()):
        token = self._token()
        with self.request_lock:
            self.ext.mark(self.BARRIER_OPEN, token)
            segments = self._snapshot().get("segments", [])
            self.states[token] = (reason, segments, list(before))
            self.ext.mark(self.BARRIER_CLOSE, token)

    def mark(self, source, stats):
        token = self._token()
        if stats is not None:
            self.stats[token] = stats
        self.ext.mark(self.MARK_CODES[source], token)

    def _run(self):
        while not self.stop_event.wait(AGENT_DRAIN_EVERY_S):
            try:
                self.drain()
            except Exception as e:
                _say(f"drain failed: {e!r}")

    def drain(self):
        with self.drain_lock:
            retry = []
            while True:
                n, lost, marks, stacks = self.ext.drain(AGENT_DRAIN_MAX)
                with self.s.log.cond:
                    self.s.log.add_stacks(stacks)
                    if lost:
                        self._lost(retry)
                    self._process(n, marks, retry)
                if n < AGENT_DRAIN_MAX:
                    break
            for reason, before in retry:
                self.request_state(reason, before)

    def _lost(self, retry):
        self.window = None  # a barrier may be among what was dropped
        if self.have_state:
            # null count: entries keep being dropped until a state is read
            lost = {"t": "lost", "count": None, "why": "the native ring overflowed"}
            self.have_state = False
            retry.append(("lost", [lost]))

    def _process(self, n, marks, retry):
        """The batch: runs of entries between its markers."""
        pos = 0
        for index, code, token, time_us in marks:
            self._run_of_entries(pos, index)
            self._marker(("", 0, code, token, 0, time_us, None), retry)
            pos = index + 1
        self._run_of_entries(pos, n)
        if self.have_state and self.s.log.needs_rebase() and not self.rebase_pending:
            self.rebase_pending = True
            retry.append(("rebase", ()))

    def _run_of_entries(self, lo, hi):
        if lo >= hi:
            return
        if self.window is not None:  # rare and short: read as rows, split in Python
            self.window.extend(self.ext.rows(lo, hi))
        elif self.have_state:
            self.s.log.append_encoded(self.ext.encode([(lo, hi)], self.s.log.next_seq))

    def _marker(self, rec, retry):
        code, token = rec[2], rec[3]
        if self.window is not None and code != self.BARRIER_CLOSE:
            self.window.append(rec)
        elif code == self.BARRIER_OPEN:
            self.window = []
        elif code == self.BARRIER_CLOSE:
            self._close_window(token, retry)
        else:
            self._one(rec, [])

    def _flush(self, rows):
        self.s.log.append_entries(rows)
        rows.clear()

    def _one(self, rec, rows):
        """A row of a barrier window (an entry or a step marker), or a step marker."""
        action, device, code, token, stream, time_us, stack = rec
        if action:
            if self.have_state:
                rows.append([action, device, code, token, stream, time_us, stack])
            return
        stats = self.stats.pop(token, None)
        if not self.have_state or code not in (1, 2, self.MARK_RECORD_FUNCTION):
            return
        self._flush(rows)
        if code == self.MARK_RECORD_FUNCTION:
            source = f"record_function:{self.s.step_marker}"
        else:
            source = "mark_step" if code == 1 else "Optimizer.step"
        self.s.log.append_step(source, time_us)
        if stats:
            self.s.log.append_stats(stats)

    def _close_window(self, token, retry):
        window, self.window = self.window or [], None
        reason, segments, before = self.states.pop(token, ("resync", [], []))
        split = _split_window(window)
        rows = []
        if split is None:
            for rec in window:
                self._one(rec, rows)
            self._flush(rows)
            self.retries += 1
            if self.retries == self.WARN_AFTER_RETRIES:
                _say(f"{self.retries} tries to read a {reason} state failed: the allocator was never quiet")
            retry.append((reason, before))
            return
        in_state, after = split
        for rec in in_state:
            self._one(rec, rows)
        self._flush(rows)
        self._place_state(reason, segments, before)
        for rec in after:
            self._one(rec, rows)
        self._flush(rows)

    def _place_state(self, reason, segments, before):
        log = self.s.log
        before = [dict(msg, seq=log.next_seq) for msg in before]
        if reason in ("lost", "rebase"):
            log.rebase(reason, segments, before)
            self.rebase_pending = False
        else:
            for msg in before:
                log.append(msg)
            log.append_state(reason, segments)
        self.have_state = True
        self.retries = 0

    def oom(self, message_fields):
        stats = [{"t": "stats", "device": d, "stats": v} for d, v in self.s.read_stats()]
        self.request_state("oom", [dict(message_fields, t="oom")] + stats)

    def stop(self):
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=10)
        for _ in range(5):
            self.request_state("resync")
            self.drain()
            if not self.states:
                break
        self.ext.stop()


def _split_window(window):
    """(in the state, after it) for the records read between two barriers, or None.

    Devices are separate allocators, so each device's entries split at its own
    `snapshot` entry; a marker goes before the state only if it came before
    every `snapshot` entry."""
    snaps, busy = {}, set()
    for i, (action, device, *_rest) in enumerate(window):
        if action == "snapshot":
            if device in snaps:
                return None  # someone else's _snapshot() too: which one is ours?
            snaps[device] = i
        elif action:
            busy.add(device)
    if not busy:
        return window, []
    if not busy <= set(snaps):
        return None
    first = min(snaps.values())
    in_state, after = [], []
    for i, rec in enumerate(window):
        cut = snaps[rec[1]] if rec[0] else first - 1
        (in_state if i <= cut else after).append(rec)
    return in_state, after


# ---------------------------------------------------------------- the session


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


# ---------------------------------------------------------------- the agent
#
# Built with torch.utils.cpp_extension.load_inline on first use (cached by torch
# in its extensions directory) from two parts:
# - AGENT_CORE_SOURCE: standard C++17 only (the ring, the JSON encoder, the stack
#   interner, the batch). python/tests/test_agent_core.py compiles it with g++
#   and a driver, runs it, and checks its bytes against PROTOCOL.md.
# - AGENT_TORCH_SOURCE: the tracker callback, the RecordFunction marker, and the
#   pybind11 functions the helper calls. Written against PyTorch 2.5-2.11's
#   c10/cuda/CUDACachingAllocator.h (TraceEntry's action_, device_, addr_,
#   context_, stream_, size_; attachAllocatorTraceTracker),
#   torch/csrc/profiler/combined_traceback.h (CapturedTraceback, symbolize,
#   unwind::Frame's filename/funcname/lineno), ATen/record_function.h and
#   pybind11 (bytes, int_, gil_scoped_release, the stl casters for the vector of
#   pairs and of tuples that encode() and intern() take).
# Built and run against PyTorch 2.11.0+cu130 on an H100 (python/gpu/live_check.py,
# 2026-11-26: every entry, no loss, each state placed exactly). CI checks the torch
# part only with g++ -fsyntax-only against the stub headers in
# python/tests/agent_stubs/, which declare that API as described above. If the
# build fails on another release, "auto" mode polls instead and prints why.
AGENT_CORE_SOURCE = r"""
// ---- the agent's core: standard C++17 only (no torch), so a test compiles it alone
#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace vramscope_agent {

// PROTOCOL.md "Framing" and "Bounds a reader keeps"
constexpr size_t kMaxFrame = 64u * 1024 * 1024;
constexpr size_t kMaxString = 64 * 1024;
constexpr size_t kMaxStackFrames = 1024;
constexpr size_t kEntriesPerFrame = 4096;

// action 0 is a marker: addr = marker code, size = token
enum ActionCode : int32_t {
  kMarker = 0, kAlloc, kFreeRequested, kFreeCompleted, kSegmentAlloc, kSegmentFree,
  kSegmentMap, kSegmentUnmap, kSnapshot, kOom, kUnknown
};

inline const char* action_name(int32_t code) {
  static const char* names[] = {"", "alloc", "free_requested", "free_completed", "segment_alloc",
                                "segment_free", "segment_map", "segment_unmap", "snapshot", "oom",
                                "unknown"};
  return (code >= 0 && code <= kUnknown) ? names[code] : "unknown";
}

template <class Ctx>
struct Rec {
  int32_t action = kMarker;
  int32_t device = 0;
  uint64_t addr = 0;
  uint64_t size = 0;
  int64_t stream = 0;
  int64_t time_us = 0;
  Ctx ctx{};
};

// Bounded multi-producer queue (Vyukov): each device's allocator lock is a
// separate producer; the drain is the one consumer. Push never blocks.
template <class Ctx>
class Ring {
 public:
  explicit Ring(size_t slots) : cells_(new Cell[slots]), mask_(slots - 1) {
    for (size_t i = 0; i < slots; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }
  bool push(Rec<Ctx>&& r) {
    size_t pos = enq_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & mask_];
      size_t seq = c.seq.load(std::memory_order_acquire);
      intptr_t dif = (intptr_t)seq - (intptr_t)pos;
      if (dif == 0) {
        if (enq_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          c.rec = std::move(r);
          c.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (dif < 0) {
        return false;
      } else {
        pos = enq_.load(std::memory_order_relaxed);
      }
    }
  }
  bool pop(Rec<Ctx>& out) {
    size_t pos = deq_.load(std::memory_order_relaxed);
    Cell& c = cells_[pos & mask_];
    size_t seq = c.seq.load(std::memory_order_acquire);
    if ((intptr_t)seq - (intptr_t)(pos + 1) < 0) return false;  // empty, or a push still writing
    deq_.store(pos + 1, std::memory_order_relaxed);  // one consumer
    out = std::move(c.rec);
    c.rec.ctx = Ctx{};
    c.seq.store(pos + mask_ + 1, std::memory_order_release);
    return true;
  }

 private:
  struct Cell {
    std::atomic<size_t> seq{0};
    Rec<Ctx> rec;
  };
  std::unique_ptr<Cell[]> cells_;
  size_t mask_;
  alignas(64) std::atomic<size_t> enq_{0};
  alignas(64) std::atomic<size_t> deq_{0};
};

// ---- JSON, as PROTOCOL.md writes it: integers only, strings valid UTF-8

template <class Int>
void append_int(std::string& out, Int v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

// Length of the valid UTF-8 sequence at p (1-4), or 0 with *bad set to the
// length of its maximal invalid prefix (what Python's "replace" turns into one U+FFFD).
inline size_t utf8_sequence(const unsigned char* p, size_t n, size_t* bad) {
  unsigned char c = p[0];
  if (c < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) { len = 3; lo = 0xA0; }
  else if (c >= 0xE1 && c <= 0xEC) len = 3;
  else if (c == 0xED) { len = 3; hi = 0x9F; }  // no surrogates
  else if (c >= 0xEE && c <= 0xEF) len = 3;
  else if (c == 0xF0) { len = 4; lo = 0x90; }
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else if (c == 0xF4) { len = 4; hi = 0x8F; }
  else { *bad = 1; return 0; }
  size_t i = 1;
  for (; i < len && i < n; ++i) {
    unsigned char b = p[i];
    if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) break;
  }
  if (i == len) return len;
  *bad = i;
  return 0;
}

// A JSON string of s: invalid UTF-8 replaced by U+FFFD, and one longer than
// kMaxString bytes cut to at most kMaxString - 4 at a character boundary (as
// the Python side's _clean does).
inline void append_string(std::string& out, const char* s, size_t n) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  std::string clean;
  clean.reserve(n < kMaxString ? n : kMaxString + 4);
  const auto* p = reinterpret_cast<const unsigned char*>(s);
  for (size_t i = 0; i < n && clean.size() <= kMaxString;) {
    size_t bad = 0;
    size_t len = utf8_sequence(p + i, n - i, &bad);
    if (len) {
      clean.append(s + i, len);
      i += len;
    } else {
      clean.append(kReplacement, 3);
      i += bad;
    }
  }
  if (clean.size() > kMaxString) {
    size_t end = kMaxString - 4;
    while (end > 0 && (static_cast<unsigned char>(clean[end]) & 0xC0) == 0x80) --end;
    clean.resize(end);
  }
  static const char hex[] = "0123456789abcdef";
  out.push_back('"');
  for (unsigned char c : clean) {
    switch (c) {
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\b': out.append("\\b"); break;
      case '\f': out.append("\\f"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      default:
        if (c < 0x20) {
          out.append("\\u00");
          out.push_back(hex[c >> 4]);
          out.push_back(hex[c & 15]);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
}

inline void append_string(std::string& out, const std::string& s) { append_string(out, s.data(), s.size()); }

// A frame: 4 bytes little-endian length, then the JSON. begin_frame returns
// where the frame starts; end_frame writes its length (false when over 64 MiB).
inline size_t begin_frame(std::string& out) {
  size_t at = out.size();
  out.append(4, '\0');
  return at;
}

inline bool end_frame(std::string& out, size_t at) {
  size_t n = out.size() - at - 4;
  if (n > kMaxFrame) return false;
  for (int i = 0; i < 4; ++i) out[at + i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return true;
}

// ---- stacks: frames and stacks interned once, each new stack encoded once

struct Frame {
  std::string filename;
  int64_t line = 0;
  std::string name;
};

class StackInterner {
 public:
  explicit StackInterner(size_t max_stacks) : max_stacks_(max_stacks) {}

  uint32_t frame_id(const std::string& filename, int64_t line, const std::string& name) {
    key_.clear();
    append_int(key_, line);
    key_.push_back('\0');
    key_.append(filename);
    key_.push_back('\0');
    key_.append(name);
    auto it = frame_ids_.find(key_);
    if (it != frame_ids_.end()) return it->second;
    auto id = static_cast<uint32_t>(frames_.size());
    frames_.push_back(Frame{filename, line, name});
    frame_ids_.emplace(key_, id);
    return id;
  }

  // The stack's id (frame ids innermost first), or -1 for no frames or a full
  // table. A stack seen for the first time appends its `stack` frame to defs.
  int64_t intern(std::vector<uint32_t>& frames, std::vector<std::string>& defs) {
    if (frames.empty()) return -1;
    if (frames.size() > kMaxStackFrames) frames.resize(kMaxStackFrames);
    auto it = stack_ids_.find(frames);
    if (it != stack_ids_.end()) return it->second;
    if (stack_ids_.size() >= max_stacks_) {
      full_ = true;
      return -1;
    }
    auto id = static_cast<int64_t>(stack_ids_.size());
    stack_ids_.emplace(frames, id);
    defs.push_back(encode_stack(id, frames));
    return id;
  }

  size_t size() const { return stack_ids_.size(); }
  bool full() const { return full_; }

 private:
  struct VecHash {
    size_t operator()(const std::vector<uint32_t>& v) const {
      uint64_t h = 1469598103934665603ull;  // FNV-1a over the ids
      for (uint32_t x : v) h = (h ^ x) * 1099511628211ull;
      return static_cast<size_t>(h);
    }
  };

  // A stack of huge names: keep its innermost frames that fit a frame.
  std::string encode_stack(int64_t id, const std::vector<uint32_t>& frames) const {
    for (size_t keep = frames.size();; keep /= 2) {
      std::string out;
      size_t at = begin_frame(out);
      out.append("{\"t\":\"stack\",\"id\":");
      append_int(out, id);
      out.append(",\"frames\":[");
      for (size_t i = 0; i < keep; ++i) {
        const Frame& f = frames_[frames[i]];
        out.append(i ? ",[" : "[");
        append_string(out, f.filename);
        out.push_back(',');
        append_int(out, f.line);
        out.push_back(',');
        append_string(out, f.name);
        out.push_back(']');
      }
      out.append("]}");
      if (end_frame(out, at) || keep == 0) return out;
    }
  }

  size_t max_stacks_;
  bool full_ = false;
  std::string key_;
  std::vector<Frame> frames_;
  std::unordered_map<std::string, uint32_t> frame_ids_;
  std::unordered_map<std::vector<uint32_t>, int64_t, VecHash> stack_ids_;
};

// Stack ids for symbolised tracebacks: all_frames and tracebacks as
// torch::symbolize returns them (FrameT has filename, lineno, funcname).
template <class FrameT>
std::vector<int64_t> intern_tracebacks(StackInterner& interner, const std::vector<FrameT>& all_frames,
                                       const std::vector<std::vector<uint64_t>>& tracebacks,
                                       std::vector<std::string>& defs) {
  std::vector<int64_t> frame_ids(all_frames.size(), -1);
  std::vector<int64_t> out;
  out.reserve(tracebacks.size());
  std::vector<uint32_t> ids;
  for (const auto& tb : tracebacks) {
    ids.clear();
    for (uint64_t idx : tb) {
      if (idx >= all_frames.size()) continue;
      if (frame_ids[idx] < 0) {
        const FrameT& f = all_frames[idx];
        frame_ids[idx] = interner.frame_id(f.filename, static_cast<int64_t>(f.lineno), f.funcname);
      }
      ids.push_back(static_cast<uint32_t>(frame_ids[idx]));
    }
    out.push_back(interner.intern(ids, defs));
  }
  return out;
}

// ---- a drained batch, encoded as `entries` frames

struct Entry {
  int32_t action = kMarker;
  int32_t device = 0;
  uint64_t addr = 0;
  uint64_t size = 0;
  int64_t stream = 0;
  int64_t time_us = 0;
  int64_t stack = -1;
};

struct EncodedFrame {
  std::string bytes;
  std::vector<int64_t> stacks;  // the ids its entries use, each once
  uint64_t count = 0;
};

// The entries (markers skipped) of batch[lo, hi) for each range, in order, as
// `entries` frames of at most kEntriesPerFrame, the first starting at seq `first`.
inline std::vector<EncodedFrame> encode_entries(const std::vector<Entry>& batch,
                                                const std::vector<std::pair<size_t, size_t>>& ranges,
                                                uint64_t first) {
  std::vector<EncodedFrame> out;
  EncodedFrame cur;
  size_t at = 0;
  auto finish = [&] {
    cur.bytes.append("]}");
    end_frame(cur.bytes, at);  // 4096 entries of at most ~150 bytes: far under 64 MiB
    std::sort(cur.stacks.begin(), cur.stacks.end());
    cur.stacks.erase(std::unique(cur.stacks.begin(), cur.stacks.end()), cur.stacks.end());
    first += cur.count;
    out.push_back(std::move(cur));
    cur = EncodedFrame{};
  };
  size_t left = 0;  // entries (and markers) still to encode: what a frame reserves for
  for (const auto& range : ranges)
    if (range.first < range.second) left += range.second - range.first;
  for (const auto& range : ranges) {
    for (size_t i = range.first; i < range.second && i < batch.size(); ++i, --left) {
      const Entry& e = batch[i];
      if (e.action == kMarker) continue;
      if (cur.count == 0) {
        cur.bytes.reserve(64 + 96 * std::min(kEntriesPerFrame, left));
        at = begin_frame(cur.bytes);
        cur.bytes.append("{\"t\":\"entries\",\"first\":");
        append_int(cur.bytes, first);
        cur.bytes.append(",\"entries\":[");
      }
      // one row into a local buffer, then one append: the drain's hot loop
      // at most 1 + 2 + 14 + 2 + 11 + 4 * 20 + 20 + 6 + 1 = 137 bytes; `end` only bounds to_chars
      char row[256];
      char* p = row;
      char* const end = row + 160;
      if (cur.count) *p++ = ',';
      *p++ = '[';
      *p++ = '"';
      const char* name = action_name(e.action);
      size_t len = std::strlen(name);
      std::memcpy(p, name, len);
      p += len;
      *p++ = '"';
      *p++ = ',';
      p = std::to_chars(p, end, e.device).ptr;
      *p++ = ',';
      p = std::to_chars(p, end, e.addr).ptr;
      *p++ = ',';
      p = std::to_chars(p, end, e.size).ptr;
      *p++ = ',';
      p = std::to_chars(p, end, e.stream).ptr;
      *p++ = ',';
      p = std::to_chars(p, end, e.time_us).ptr;
      *p++ = ',';
      if (e.stack < 0) {
        std::memcpy(p, "null", 4);
        p += 4;
      } else {
        p = std::to_chars(p, end, e.stack).ptr;
        cur.stacks.push_back(e.stack);
      }
      *p++ = ']';
      cur.bytes.append(row, static_cast<size_t>(p - row));
      if (++cur.count == kEntriesPerFrame) finish();
    }
  }
  if (cur.count) finish();
  return out;
}


// ---- the drain's side: one consumer, called with the GIL released (the
// torch part symbolises stacks between pop() and fill())

template <class Ctx>
class Drainer {
 public:
  explicit Drainer(size_t max_stacks) : interner_(max_stacks) {}

  static void pop(Ring<Ctx>& ring, size_t max_records, std::vector<Rec<Ctx>>& recs) {
    Rec<Ctx> r;
    while (recs.size() < max_records && ring.pop(r)) recs.push_back(std::move(r));
  }

  // The batch: recs with their stack ids (-1: none), contexts left in recs.
  void fill(const std::vector<Rec<Ctx>>& recs, const std::vector<int64_t>& stacks) {
    batch_.clear();
    batch_.reserve(recs.size());
    for (size_t i = 0; i < recs.size(); ++i) {
      const Rec<Ctx>& r = recs[i];
      batch_.push_back(Entry{r.action, r.device, r.addr, r.size, r.stream, r.time_us,
                             i < stacks.size() ? stacks[i] : -1});
    }
  }

  StackInterner& interner() { return interner_; }
  const std::vector<Entry>& batch() const { return batch_; }

 private:
  StackInterner interner_;
  std::vector<Entry> batch_;
};

}  // namespace vramscope_agent
"""

AGENT_TORCH_SOURCE = r"""
// ---- the torch-facing part
#include <torch/extension.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <chrono>
#include <mutex>
#include <tuple>

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
namespace va = vramscope_agent;
using TraceEntry = cca::TraceEntry;
using Ctx = std::shared_ptr<c10::GatheredContext>;

std::atomic<bool> g_on{false};
std::atomic<va::Ring<Ctx>*> g_ring{nullptr};
std::atomic<uint64_t> g_lost{0};
std::once_flag g_attach_once;
std::mutex g_marker_mutex;
std::string g_marker_name;  // read by the RecordFunction callback
std::atomic<bool> g_marker_on{false};
at::CallbackHandle g_marker_handle = 0;
// One drain at a time. Taken only with the GIL released (a holder never waits for the GIL).
std::mutex g_drain_mutex;
std::unique_ptr<va::Drainer<Ctx>> g_drainer;

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int32_t action_code(TraceEntry::Action a) {
  switch (a) {
    case TraceEntry::ALLOC: return va::kAlloc;
    case TraceEntry::FREE_REQUESTED: return va::kFreeRequested;
    case TraceEntry::FREE_COMPLETED: return va::kFreeCompleted;
    case TraceEntry::SEGMENT_ALLOC: return va::kSegmentAlloc;
    case TraceEntry::SEGMENT_FREE: return va::kSegmentFree;
    case TraceEntry::SEGMENT_MAP: return va::kSegmentMap;
    case TraceEntry::SEGMENT_UNMAP: return va::kSegmentUnmap;
    case TraceEntry::SNAPSHOT: return va::kSnapshot;
    case TraceEntry::OOM: return va::kOom;
    default: return va::kUnknown;
  }
}

// Runs inside the allocator's lock: copy and return; no GIL, no PyTorch call.
void on_trace(const TraceEntry& te) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  va::Ring<Ctx>* ring = g_ring.load(std::memory_order_acquire);
  if (ring == nullptr) return;
  va::Rec<Ctx> r;
  r.action = action_code(te.action_);
  r.device = static_cast<int32_t>(te.device_);
  r.addr = static_cast<uint64_t>(te.addr_);  // for an OOM: the free device bytes
  r.size = static_cast<uint64_t>(te.size_);
  r.stream = static_cast<int64_t>(reinterpret_cast<intptr_t>(te.stream_));
  r.time_us = now_us();
  r.ctx = te.context_;
  if (!ring->push(std::move(r))) g_lost.fetch_add(1, std::memory_order_relaxed);
}

void push_marker(int64_t code, int64_t token) {
  va::Ring<Ctx>* ring = g_ring.load(std::memory_order_acquire);
  if (ring == nullptr) return;
  va::Rec<Ctx> r;
  r.addr = static_cast<uint64_t>(code);
  r.size = static_cast<uint64_t>(token);
  r.time_us = now_us();
  if (!ring->push(std::move(r))) g_lost.fetch_add(1, std::memory_order_relaxed);
}

std::unique_ptr<at::ObserverContext> on_record_function(const at::RecordFunction& fn) {
  if (!g_marker_on.load(std::memory_order_relaxed)) return nullptr;
  const char* name = fn.name();
  size_t n = g_marker_name.size();
  if (name != nullptr && std::strncmp(name, g_marker_name.c_str(), n) == 0 &&
      (name[n] == '\0' || name[n] == '#')) {
    push_marker(3, 0);
  }
  return nullptr;
}

// A new session: a fresh stack table (ids restart with the helper's log).
void start(int64_t slots, const std::string& step_marker, int64_t max_stacks) {
  TORCH_CHECK(slots > 0 && (slots & (slots - 1)) == 0, "slots must be a power of two");
  TORCH_CHECK(max_stacks >= 0, "max_stacks must not be negative");
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> guard(g_drain_mutex);
    g_drainer.reset(new va::Drainer<Ctx>(static_cast<size_t>(max_stacks)));
  }
  if (g_ring.load() == nullptr) g_ring.store(new va::Ring<Ctx>(static_cast<size_t>(slots)));  // never freed
  std::call_once(g_attach_once, [] { cca::attachAllocatorTraceTracker(&on_trace); });
  std::lock_guard<std::mutex> guard(g_marker_mutex);
  if (!step_marker.empty() && g_marker_handle == 0) {
    g_marker_name = step_marker;
    g_marker_handle = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_record_function).scopes({at::RecordScope::USER_SCOPE}));
    g_marker_on.store(true);
  }
  g_on.store(true);
}

void stop() {
  g_on.store(false);  // the tracker cannot be detached: it returns at once from now on
  std::lock_guard<std::mutex> guard(g_marker_mutex);
  g_marker_on.store(false);
  if (g_marker_handle != 0) {
    at::removeCallback(g_marker_handle);
    g_marker_handle = 0;
  }
}

void mark(int64_t code, int64_t token) { push_marker(code, token); }

py::list bytes_list(const std::vector<std::string>& items) {
  py::list out;
  for (const auto& s : items) out.append(py::bytes(s.data(), s.size()));
  return out;
}

// Pops up to max_records into the batch, which replaces the last one, and
// returns (records in the batch, entries lost since the last drain, markers
// as (index, code, token, time_us), `stack` frames of the stacks first seen,
// ids in order). All of it runs without the GIL but torch::symbolize's Python
// part (one call per batch, none when no entry has a stack: PyTorch's
// appendSymbolized takes the GIL itself) and the Python results.
py::tuple drain(int64_t max_records) {
  std::vector<va::Rec<Ctx>> recs;
  uint64_t lost = 0;
  std::vector<std::string> defs;
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> marks;
  {
    py::gil_scoped_release nogil;
    {
      std::lock_guard<std::mutex> guard(g_drain_mutex);
      va::Ring<Ctx>* ring = g_ring.load(std::memory_order_acquire);
      if (ring != nullptr && g_drainer && max_records > 0)
        va::Drainer<Ctx>::pop(*ring, static_cast<size_t>(max_records), recs);
      lost = g_lost.exchange(0);  // after the pops: a loss among them is counted now
    }
    std::vector<torch::CapturedTraceback*> tracebacks;
    std::vector<int64_t> which(recs.size(), -1);
    for (size_t i = 0; i < recs.size(); ++i) {
      auto* tb = dynamic_cast<torch::CapturedTraceback*>(recs[i].ctx.get());
      if (tb != nullptr) {
        which[i] = static_cast<int64_t>(tracebacks.size());
        tracebacks.push_back(tb);
      }
    }
    torch::SymbolizedTracebacks sym;
    if (!tracebacks.empty()) sym = torch::symbolize(tracebacks);
    std::lock_guard<std::mutex> guard(g_drain_mutex);
    if (g_drainer) {
      std::vector<int64_t> ids = va::intern_tracebacks(g_drainer->interner(), sym.all_frames, sym.tracebacks, defs);
      std::vector<int64_t> stacks(recs.size(), -1);
      for (size_t i = 0; i < recs.size(); ++i)
        if (which[i] >= 0 && static_cast<size_t>(which[i]) < ids.size()) stacks[i] = ids[which[i]];
      g_drainer->fill(recs, stacks);
    }
    for (size_t i = 0; i < recs.size(); ++i)
      if (recs[i].action == va::kMarker)
        marks.emplace_back(static_cast<int64_t>(i), static_cast<int64_t>(recs[i].addr),
                           static_cast<int64_t>(recs[i].size), recs[i].time_us);
  }
  size_t n = recs.size();
  recs.clear();  // drops the tracebacks with the GIL held: safe whether PyTorch frees their frames now or later
  py::list py_marks;
  for (const auto& m : marks)
    py_marks.append(py::make_tuple(std::get<0>(m), std::get<1>(m), std::get<2>(m), std::get<3>(m)));
  return py::make_tuple(n, lost, py_marks, bytes_list(defs));
}

// The batch's records [lo, hi) as (action, device, addr, size, stream,
// time_us, stack id|None); a marker as ("", 0, code, token, 0, time_us, None).
py::list rows(int64_t lo, int64_t hi) {
  std::vector<va::Entry> got;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> guard(g_drain_mutex);
    if (g_drainer) {
      const auto& batch = g_drainer->batch();
      size_t end = std::min(static_cast<size_t>(std::max<int64_t>(hi, 0)), batch.size());
      for (size_t i = static_cast<size_t>(std::max<int64_t>(lo, 0)); i < end; ++i) got.push_back(batch[i]);
    }
  }
  py::list out;
  for (const auto& e : got) {
    py::object stack = py::none();
    if (e.stack >= 0) stack = py::int_(e.stack);
    out.append(py::make_tuple(va::action_name(e.action), e.device, e.addr, e.size, e.stream, e.time_us, stack));
  }
  return out;
}

// The batch's entries in `ranges` ([lo, hi) pairs, in order) as `entries`
// frames from seq `first`: [(frame bytes, stack ids it uses, entries)].
py::list encode(const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t first) {
  std::vector<va::EncodedFrame> frames;
  {
    py::gil_scoped_release nogil;
    std::vector<std::pair<size_t, size_t>> spans;
    for (const auto& r : ranges)
      spans.emplace_back(static_cast<size_t>(std::max<int64_t>(r.first, 0)),
                         static_cast<size_t>(std::max<int64_t>(r.second, 0)));
    std::lock_guard<std::mutex> guard(g_drain_mutex);
    if (g_drainer) frames = va::encode_entries(g_drainer->batch(), spans, static_cast<uint64_t>(first));
  }
  py::list out;
  for (const auto& f : frames) {
    py::list ids;
    for (int64_t id : f.stacks) ids.append(id);
    out.append(py::make_tuple(py::bytes(f.bytes.data(), f.bytes.size()), py::tuple(ids), f.count));
  }
  return out;
}

// A stack from Python (a state's block): (id|None, its `stack` frame if new|None).
py::tuple intern(const std::vector<std::tuple<std::string, int64_t, std::string>>& frames) {
  int64_t id = -1;
  std::vector<std::string> defs;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> guard(g_drain_mutex);
    if (g_drainer) {
      va::StackInterner& interner = g_drainer->interner();
      std::vector<uint32_t> ids;
      for (const auto& f : frames) ids.push_back(interner.frame_id(std::get<0>(f), std::get<1>(f), std::get<2>(f)));
      id = interner.intern(ids, defs);
    }
  }
  py::object sid = py::none();
  if (id >= 0) sid = py::int_(id);
  py::object def = py::none();
  if (!defs.empty()) def = py::bytes(defs[0].data(), defs[0].size());
  return py::make_tuple(sid, def);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("start", &start);
  m.def("stop", &stop);
  m.def("mark", &mark);
  m.def("drain", &drain);
  m.def("rows", &rows);
  m.def("encode", &encode);
  m.def("intern", &intern);
}
"""

AGENT_SOURCE = AGENT_CORE_SOURCE + AGENT_TORCH_SOURCE
