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
max_entries=1_000_000, step_marker=None, mode="auto", poll_interval_s=None)`:

- `address`: a unix socket path (`unix:/p`, `/p`, `./p`; the default is
  `$XDG_RUNTIME_DIR/vramscope/{pid}.sock`, else `/tmp/vramscope-{uid}/{pid}.sock`)
  or `HOST:PORT` for TCP. `{rank}` is replaced by `RANK` (else `LOCAL_RANK`,
  else 0), so one line serves every process of a multi-process job.
- `stacks`: record Python stacks with each allocation (what the by-line and
  leak views group by). Turning it off makes each event cheaper.
- `record_to`: also write everything to this file (`{rank}` allowed), which
  `vramscope attach --replay FILE` plays back.
- `max_entries`: how many trace entries PyTorch's ring keeps (poll mode) and how
  long the helper's log grows before it restarts from a fresh state.
- `step_marker`: a `torch.profiler.record_function` name whose every START
  marks a step boundary (a name like `Optimizer.step#AdamW.step` also matches
  `Optimizer.step`). `Optimizer.step` and `mark_step()` always mark steps.
- `mode`: `"agent"` (a small C++ extension built on first use with
  `torch.utils.cpp_extension`; every event as it happens), `"poll"` (pure
  Python), or `"auto"` (agent, else poll, saying why).

`mark_step()` ends a step explicitly (a no-op when not started). `stop()` sends
a last state and `bye`, closes the socket and the recording, and turns
PyTorch's memory history off again.

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
the helper sends `lost` plus a fresh state. To lower the cost: a smaller
`max_entries` (a cheaper `_snapshot()`, but an earlier wrap), a longer
`poll_interval_s`, `stacks=False`, or agent mode. Agent mode copies each
entry into a lock-free ring inside the allocator's lock (well under 1 us,
no GIL, no PyTorch call) and a drain thread symbolises the stacks in batches
with the GIL; with stacks on, PyTorch's own stack capture (about 2 us per
entry) costs the job's thread most. The drain's Python side (stack interning,
JSON) measured 2-3 us per entry on a 2-core CI machine, on a thread that
shares the GIL with the job: at 50,000 entries per step that is 0.1-0.15 s of
GIL time per step, which the issue's 1 % target does not allow; moving the
encoding and interning into the extension is the next step. In poll mode the
same Python work runs on the poll thread (about 2.5 us per entry, plus
finding the last entry sent: 0.15 us per new entry), besides `_snapshot()`. A state (at start, after a loss, every `max_entries`) is read
with `_snapshot(include_traces=False)` between two markers in the same ring and
placed exactly by the `snapshot` entries PyTorch records while reading it; on a
PyTorch that records none, only when no allocation happened meanwhile (else it
is read again 10 ms later). With `step_marker` set in agent mode a global
RecordFunction callback (user scope) watches for the name: each op then pays a
scope check.

The wire protocol is python/PROTOCOL.md in vramscope's repository. This file
needs only the standard library until `start()` imports torch.
"""

import atexit
import hmac
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

__all__ = ["start", "stop", "mark_step", "LiveError"]

PROTOCOL = 1
MAGIC = b"VSLIVE1\n"
MAX_FRAME = 64 * 1024 * 1024  # PROTOCOL.md "Framing"
MAX_STRING = 64 * 1024  # PROTOCOL.md "Bounds a reader keeps"
MAX_STACK_FRAMES = 1024
MAX_STACKS = 1_000_000  # distinct stacks kept by the helper (a reader accepts 4 M)
MAX_HELLO = 64 * 1024
HANDSHAKE_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 30.0
STATS_MIN_INTERVAL_S = 0.1  # stats at most 10 per second
MIN_POLL_INTERVAL_S = 0.5
POLL_COST_FACTOR = 20
ENTRIES_PER_FRAME = 4096
SEND_BATCH_ITEMS = 64  # frames joined into one send: a late client's replay is not copied whole
BLOCKS_PER_FRAME = 20000
SEGMENTS_PER_FRAME = 256
TAIL = 8  # entries remembered to find the last one sent in a new ring
AGENT_RING_SLOTS = 1 << 18
AGENT_DRAIN_EVERY_S = 0.01


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


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        buf += chunk
    return bytes(buf)


def read_frame(sock, limit=MAX_FRAME):
    """One frame from `sock` as a dict; raises ValueError on a bad frame."""
    (n,) = struct.unpack("<I", _recv_exact(sock, 4))
    if n > limit:
        raise ValueError(f"frame of {n} bytes is over the limit of {limit}")
    obj = json.loads(_recv_exact(sock, n).decode("utf-8"))
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
        if sid is None and len(self.stack_frames) >= MAX_STACKS:
            if not self.stacks_full:
                self.stacks_full = True
                _say(f"{MAX_STACKS} distinct stacks seen: new ones are sent without a stack from now on")
            return None
        if sid is None:  # cleaned only once per distinct stack
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

    def append(self, obj, stacks=(), weight=1):
        item = (encode_frame(obj), tuple(stacks))
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


class _Recorder:
    """record_to=: the frames a client attached at start() would receive."""

    def __init__(self, path, hello):
        self.f = open(path, "wb")
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
    def __init__(self, kind, where, token, log, hello_fn):
        self.log = log
        self.hello_fn = hello_fn
        self.token = token
        self.attached = False
        self.lock = threading.Lock()
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
            threading.Thread(target=self._serve, args=(conn,), name="vramscope-live-client", daemon=True).start()

    def _serve(self, conn):
        attached = False
        try:
            conn.settimeout(HANDSHAKE_TIMEOUT_S)
            reason = self._handshake(conn)
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

    def _handshake(self, conn):
        try:
            hello = read_frame(conn, MAX_HELLO)
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
        while True:
            with log.cond:
                items, cursor = log.read(cursor, 0.5)
                closed = log.closed and not items
                stack_frames = log.stack_frames
            if closed:
                return
            if not items and self._peer_closed(conn):
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

    @staticmethod
    def _peer_closed(conn):
        readable, _, _ = select.select([conn], [], [], 0)
        if not readable:
            return False
        try:
            return conn.recv(4096) == b""
        except OSError:
            return True

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
            self.interval_s = max(MIN_POLL_INTERVAL_S, POLL_COST_FACTOR * self.cost_s)
        return snap

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
    that calls into the extension (which symbolises stacks with the GIL).

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
        self.ext.start(AGENT_RING_SLOTS, self.s.step_marker or "")
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
                records, lost = self.ext.drain(ENTRIES_PER_FRAME * 4)
                with self.s.log.cond:
                    if lost:
                        self._lost(retry)
                    self._process(records, retry)
                if len(records) < ENTRIES_PER_FRAME * 4:
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

    def _process(self, records, retry):
        rows = []
        for rec in records:
            action, _, code, token, _, _, _ = rec
            if self.window is not None and (action or code != self.BARRIER_CLOSE):
                self.window.append(rec)
            elif not action and code == self.BARRIER_OPEN:
                self.window = []
            elif not action and code == self.BARRIER_CLOSE:
                self._flush(rows)
                self._close_window(token, retry)
            else:
                self._one(rec, rows)
        self._flush(rows)
        if self.have_state and self.s.log.needs_rebase() and not self.rebase_pending:
            self.rebase_pending = True
            retry.append(("rebase", ()))

    def _flush(self, rows):
        self.s.log.append_entries(rows)
        rows.clear()

    def _one(self, rec, rows):
        """An entry or a step marker, outside any barrier window."""
        action, device, code, token, stream, time_us, frames = rec
        if action:
            if self.have_state:
                rows.append([action, device, code, token, stream, time_us, self.s.log.intern(frames)])
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

    def mark(self, source):
        if not self.active:
            return
        stats = self.read_stats() if self.stats_due() else None
        self.producer.mark(source, stats)

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


def _build_agent(torch):
    import torch.utils.cpp_extension as ext_mod  # ImportError -> poll

    return ext_mod.load_inline(
        name="vramscope_live_agent_v1",
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
        s = _Session(
            torch,
            {"stacks": stacks, "max_entries": max_entries, "step_marker": step_marker, "poll_interval_s": poll_interval_s},
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
            s.server = _Server(kind, where[0] if kind == "unix" else tuple(where), token_needed, s.log, s.hello)
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
            s.hooks.append(torch.optim.optimizer.register_optimizer_step_post_hook(lambda *_: s.mark("Optimizer.step")))
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
        s.mark("mark_step")


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


MAX_OOM_MESSAGE = 16 * 1024


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
# in its extensions directory). Written against PyTorch 2.5-2.11's
# c10/cuda/CUDACachingAllocator.h (TraceEntry's action_, device_, addr_,
# context_, stream_, size_; attachAllocatorTraceTracker) and
# torch/csrc/profiler/combined_traceback.h (CapturedTraceback, symbolize).
# NOT COMPILED against torch when written (no torch or GPU on that machine):
# it was only checked against stub headers for syntax. If the build fails,
# "auto" mode polls instead and prints why.
AGENT_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using TraceEntry = cca::TraceEntry;

// action 0 is a marker: addr = marker code, size = token
struct Rec {
  int32_t action = 0;
  int32_t device = 0;
  uint64_t addr = 0;
  uint64_t size = 0;
  int64_t stream = 0;
  int64_t time_us = 0;
  std::shared_ptr<c10::GatheredContext> ctx;
};

struct Cell {
  std::atomic<size_t> seq{0};
  Rec rec;
};

// Bounded multi-producer queue (Vyukov): each device's allocator lock is a
// separate producer; the drain is the one consumer. Push never blocks.
class Ring {
 public:
  explicit Ring(size_t slots) : cells_(new Cell[slots]), mask_(slots - 1) {
    for (size_t i = 0; i < slots; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }
  bool push(Rec&& r) {
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
  bool pop(Rec& out) {
    size_t pos = deq_.load(std::memory_order_relaxed);
    Cell& c = cells_[pos & mask_];
    size_t seq = c.seq.load(std::memory_order_acquire);
    if ((intptr_t)seq - (intptr_t)(pos + 1) < 0) return false;  // empty, or a push still writing
    deq_.store(pos + 1, std::memory_order_relaxed);  // one consumer
    out = std::move(c.rec);
    c.rec.ctx.reset();
    c.seq.store(pos + mask_ + 1, std::memory_order_release);
    return true;
  }

 private:
  std::unique_ptr<Cell[]> cells_;
  size_t mask_;
  alignas(64) std::atomic<size_t> enq_{0};
  alignas(64) std::atomic<size_t> deq_{0};
};

std::atomic<bool> g_on{false};
std::atomic<Ring*> g_ring{nullptr};
std::atomic<uint64_t> g_lost{0};
std::once_flag g_attach_once;
std::mutex g_marker_mutex;
std::string g_marker_name;  // read by the RecordFunction callback
std::atomic<bool> g_marker_on{false};
at::CallbackHandle g_marker_handle = 0;

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int32_t action_code(TraceEntry::Action a) {
  switch (a) {
    case TraceEntry::ALLOC: return 1;
    case TraceEntry::FREE_REQUESTED: return 2;
    case TraceEntry::FREE_COMPLETED: return 3;
    case TraceEntry::SEGMENT_ALLOC: return 4;
    case TraceEntry::SEGMENT_FREE: return 5;
    case TraceEntry::SEGMENT_MAP: return 6;
    case TraceEntry::SEGMENT_UNMAP: return 7;
    case TraceEntry::SNAPSHOT: return 8;
    case TraceEntry::OOM: return 9;
    default: return 10;
  }
}

const char* action_name(int32_t code) {
  static const char* names[] = {"", "alloc", "free_requested", "free_completed", "segment_alloc",
                                "segment_free", "segment_map", "segment_unmap", "snapshot", "oom",
                                "unknown"};
  return (code >= 0 && code <= 10) ? names[code] : "unknown";
}

// Runs inside the allocator's lock: copy and return; no GIL, no PyTorch call.
void on_trace(const TraceEntry& te) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  Ring* ring = g_ring.load(std::memory_order_acquire);
  if (ring == nullptr) return;
  Rec r;
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
  Ring* ring = g_ring.load(std::memory_order_acquire);
  if (ring == nullptr) return;
  Rec r;
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

void start(int64_t slots, const std::string& step_marker) {
  TORCH_CHECK(slots > 0 && (slots & (slots - 1)) == 0, "slots must be a power of two");
  if (g_ring.load() == nullptr) g_ring.store(new Ring(static_cast<size_t>(slots)));  // never freed
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

// Called from Python (GIL held): pops records, symbolises their stacks in one batch.
py::tuple drain(int64_t max_records) {
  Ring* ring = g_ring.load(std::memory_order_acquire);
  std::vector<Rec> recs;
  if (ring != nullptr) {
    Rec r;
    while ((int64_t)recs.size() < max_records && ring->pop(r)) recs.push_back(std::move(r));
  }
  std::vector<torch::CapturedTraceback*> to_symbolize;
  std::vector<int64_t> which(recs.size(), -1);
  for (size_t i = 0; i < recs.size(); ++i) {
    auto* tb = dynamic_cast<torch::CapturedTraceback*>(recs[i].ctx.get());
    if (tb != nullptr) {
      which[i] = static_cast<int64_t>(to_symbolize.size());
      to_symbolize.push_back(tb);
    }
  }
  torch::SymbolizedTracebacks sym = torch::symbolize(to_symbolize);
  std::vector<py::object> frames_of(sym.all_frames.size());
  py::list out;
  for (size_t i = 0; i < recs.size(); ++i) {
    const Rec& r = recs[i];
    py::object frames = py::none();
    if (which[i] >= 0) {
      py::list fl;
      for (uint64_t idx : sym.tracebacks[which[i]]) {
        if (frames_of[idx].ptr() == nullptr) {
          const auto& f = sym.all_frames[idx];
          frames_of[idx] = py::make_tuple(f.filename, f.lineno, f.funcname);
        }
        fl.append(frames_of[idx]);
      }
      frames = fl;
    }
    out.append(py::make_tuple(action_name(r.action), r.device, r.addr, r.size, r.stream, r.time_us, frames));
  }
  recs.clear();  // drops the tracebacks with the GIL held
  return py::make_tuple(out, g_lost.exchange(0));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("start", &start);
  m.def("stop", &stop);
  m.def("mark", &mark);
  m.def("drain", &drain);
}
"""
