"""The log: every frame sent since the last state, replayed to a client that attaches late, and the recording."""

import os
import secrets
import stat
import threading

from ._wire import _clean, _say, encode_frame, LiveError

MAGIC = b"VSLIVE1\n"
MAX_STACK_FRAMES = 1024
MAX_STACKS = 1_000_000  # distinct stacks kept by the helper (a reader accepts 4 M)
ENTRIES_PER_FRAME = 4096
SEND_BATCH_ITEMS = 64  # frames joined into one send: a late client's replay is not copied whole
BLOCKS_PER_FRAME = 20000
SEGMENTS_PER_FRAME = 256


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

