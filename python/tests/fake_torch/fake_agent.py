"""A stand-in for the agent extension (AGENT_TORCH_SOURCE in vramscope_live)
over fake_torch's job: what the C++ tracker would see, in the order it would
see it, with the same start/stop/mark/drain/rows/encode/intern calls and
results, and a bounded ring that drops and counts when full. It checks the
helper's agent-mode logic, not the C++ (test_agent_core.py runs the C++ core).

As the extension does, it interns stacks by their frames' content (the names
as UTF-8 bytes), ids from 0 in first-seen order, up to `max_stacks`, and
encodes frames as PROTOCOL.md writes them."""

import collections
import json
import struct

import fake_torch

ENTRIES_PER_FRAME = 4096
MAX_STACK_FRAMES = 1024
MAX_STRING = 64 * 1024


def _frame(obj):
    body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return struct.pack("<I", len(body)) + body


def _text(raw):
    """The extension's string cleaning: invalid UTF-8 replaced, a long one cut."""
    b = raw.decode("utf-8", "replace").encode("utf-8")
    if len(b) > MAX_STRING:
        b = b[: MAX_STRING - 4]
    return b.decode("utf-8", "ignore")


class FakeAgent:
    def __init__(self, slots=1 << 18):
        self.slots = slots
        self.ring = collections.deque()
        self.lost = 0
        self.on = False
        self.marker = ""
        self.batch = []
        self.stack_ids = {}
        self.max_stacks = 0
        fake_torch.job().trace_trackers.append(self._on_trace)

    def _push(self, rec):
        if len(self.ring) >= self.slots:
            self.lost += 1
        else:
            self.ring.append(rec)

    def _on_trace(self, device, e, time_us):
        if not self.on:
            return
        frames = [(f["filename"], f["line"], f["name"]) for f in e.get("frames", [])] or None
        # As the C++ TraceEntry holds it: an OOM keeps the free device bytes in addr.
        addr = e.get("device_free", 0) if e["action"] == "oom" else e.get("addr", 0)
        self._push((e["action"], device, addr, e.get("size", 0), e.get("stream", 0), time_us, frames))

    def _on_annotation(self, a):
        name = a["name"]
        if self.on and self.marker and a["stage"] == "START" and (name == self.marker or name.split("#")[0] == self.marker):
            self.mark(3, 0)

    def start(self, slots, step_marker, max_stacks):
        self.on = True
        self.marker = step_marker
        self.max_stacks = max_stacks
        self.stack_ids = {}
        self.batch = []
        fake_torch.job().annotation_trackers.append(self._on_annotation)

    def stop(self):
        self.on = False

    def mark(self, code, token):
        self._push(("", 0, code, token, 0, fake_torch.job().tick(), None))

    def _intern(self, frames, defs):
        if not frames:
            return None
        key = tuple(
            (str(f).encode("utf-8", "surrogatepass") if not isinstance(f, bytes) else f, int(line),
             str(n).encode("utf-8", "surrogatepass") if not isinstance(n, bytes) else n)
            for f, line, n in frames[:MAX_STACK_FRAMES]
        )
        sid = self.stack_ids.get(key)
        if sid is None and len(self.stack_ids) < self.max_stacks:
            sid = self.stack_ids[key] = len(self.stack_ids)
            defs.append(_frame({"t": "stack", "id": sid, "frames": [[_text(f), line, _text(n)] for f, line, n in key]}))
        return sid

    def drain(self, max_records):
        recs = []
        while self.ring and len(recs) < max_records:
            recs.append(self.ring.popleft())
        lost, self.lost = self.lost, 0
        defs = []
        self.batch = [r[:6] + (self._intern(r[6], defs),) for r in recs]
        marks = [(i, r[2], r[3], r[5]) for i, r in enumerate(self.batch) if not r[0]]
        return len(self.batch), lost, marks, defs

    def rows(self, lo, hi):
        return list(self.batch[lo:hi])

    def encode(self, ranges, first):
        rows = [list(r) for lo, hi in ranges for r in self.batch[lo:hi] if r[0]]
        out = []
        for i in range(0, len(rows), ENTRIES_PER_FRAME):
            chunk = rows[i : i + ENTRIES_PER_FRAME]
            stacks = tuple(sorted({r[6] for r in chunk if r[6] is not None}))
            out.append((_frame({"t": "entries", "first": first, "entries": chunk}), stacks, len(chunk)))
            first += len(chunk)
        return out

    def intern(self, frames):
        defs = []
        sid = self._intern(frames, defs)
        return sid, (defs[0] if defs else None)
