"""A stand-in for the agent extension (AGENT_SOURCE in vramscope_live.py) over
fake_torch's job: what the C++ tracker would see, in the order it would see
it, with the same start/stop/mark/drain calls and a bounded ring that drops
and counts when full. It checks the helper's agent-mode logic, not the C++."""

import collections

import fake_torch


class FakeAgent:
    def __init__(self, slots=1 << 18):
        self.slots = slots
        self.ring = collections.deque()
        self.lost = 0
        self.on = False
        self.marker = ""
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

    def start(self, slots, step_marker):
        self.on = True
        self.marker = step_marker
        fake_torch.job().annotation_trackers.append(self._on_annotation)

    def stop(self):
        self.on = False

    def mark(self, code, token):
        self._push(("", 0, code, token, 0, fake_torch.job().tick(), None))

    def drain(self, max_records):
        out = []
        while self.ring and len(out) < max_records:
            out.append(self.ring.popleft())
        lost, self.lost = self.lost, 0
        return out, lost
