"""A stand-in for the parts of torch that vramscope_live calls, driven by a
real snapshot file. Put this folder first on sys.path: `import torch` then gets
the stand-in, and `import fake_torch` the controls a test uses.

The "job" replays the file's trace entries one by one (`advance(n)`), keeping
its own segments and blocks the way the caching allocator does for these
actions (split on alloc, merge on free), so `_snapshot()` at any moment is
consistent with the entries replayed so far. Only closed traces (recording
started at process start) are supported: the replay starts from no segments.
Entries are stamped with the real clock when replayed, as PyTorch stamps them
when they happen.
"""

import collections
import copy
import pickle
import threading
import time


def symbolize_python_frames():
    """What PyTorch's symbolisation of Python frames does first
    (torch/csrc/profiler/python/combined_traceback.cpp): `hasattr(torch,
    "_inductor")`, which imports torch._inductor lazily, in the calling thread."""
    import torch

    hasattr(torch, "_inductor")

_SMALL_SEGMENT = 2 * 1024 * 1024
_MIN_BLOCK = 512
_SMALL_SIZE = 1024 * 1024  # kSmallSize: a large-pool block splits only above this


class _Job:
    def __init__(self, path, total_memory):
        with open(path, "rb") as f:
            snap = pickle.load(f)
        self.file = snap
        self.total_memory = total_memory
        # Where device 0 sits on the PCI bus (device d: the next buses).
        self.pci_bus = 0x3B
        self.allocator_settings = snap.get("allocator_settings", {})
        # (time, order, kind, payload): entries and annotations in file order
        events = []
        for device, trace in enumerate(snap.get("device_traces", [])):
            for i, e in enumerate(trace):
                # the file's own `snapshot` marks came from its _snapshot() calls; this
                # stand-in records its own when the helper calls _snapshot()
                if e.get("action") != "snapshot":
                    events.append((e.get("time_us", 0), 0, device, i, "entry", e))
        for i, a in enumerate(snap.get("external_annotations", [])):
            events.append((a["time_us"], 1, a.get("device", 0), i, "annotation", a))
        events.sort(key=lambda x: (x[0], x[2], x[1], x[3]))
        self.events = [(kind, device, payload) for _, _, device, _, kind, payload in events]
        self.pos = 0
        self.n_devices = max(1, len(snap.get("device_traces", [])))
        self.segments = {}  # (device, address) -> segment dict
        self.recording = False
        self.max_entries = None
        self.record_stacks = True
        self.rings = [collections.deque() for _ in range(self.n_devices)]
        self.annotations = collections.deque()
        self.last_us = 0
        self.step_hooks = {}
        self.oom_observers = _OOM_OBSERVERS  # process-wide in PyTorch: they outlive a job
        self.num_ooms = [0] * self.n_devices
        self.peak = {}
        self.snapshot_calls = 0
        self.trace_trackers = []  # attachAllocatorTraceTracker: every entry, recording or not
        self.annotation_trackers = []  # a RecordFunction callback's view of the annotations
        # PyTorch records a `snapshot` entry per device as it reads the segments; the
        # stand-in shows it to trackers only (the poll tests count file entries)
        self.snapshot_entries = True
        # (entries replayed before, after) reading the segments, one pair per _snapshot()
        self.during_snapshot = []
        self.include_traces_supported = True
        # the allocator's lock: the helper's poll thread reads while a test advances
        self.lock = threading.RLock()

    # the clock: strictly increasing, never ahead of the real one
    def tick(self):
        now = time.time_ns() // 1000
        while now <= self.last_us:
            now = time.time_ns() // 1000
        self.last_us = now
        return now

    def entries_left(self):
        return sum(1 for kind, _, _ in self.events[self.pos:] if kind == "entry")

    def advance(self, n=None):
        """Replay the next n trace entries (all when None); returns how many."""
        with self.lock:
            return self._advance(n)

    def _advance(self, n):
        done = 0
        while self.pos < len(self.events) and (n is None or done < n):
            kind, device, payload = self.events[self.pos]
            if kind == "entry":
                self._apply(device, payload)
                done += 1
            else:
                self._annotate(payload)
            self.pos += 1
        # let the trailing annotations (e.g. the END of a step) happen too
        while self.pos < len(self.events) and self.events[self.pos][0] == "annotation":
            self._annotate(self.events[self.pos][2])
            self.pos += 1
        self.tick()
        return done

    def _annotate(self, a):
        t = self.tick()
        for tracker in self.annotation_trackers:
            tracker(a)
        if self.recording:
            rec = dict(a)
            rec["time_us"] = t
            self._push(self.annotations, rec)
        if a["stage"] == "END" and a["name"].startswith("Optimizer.step"):
            for hook in list(self.step_hooks.values()):
                hook(None, (), {})

    def _push(self, ring, item):
        ring.append(item)
        if self.max_entries is not None:
            while len(ring) > self.max_entries:
                ring.popleft()

    def _apply(self, device, e):
        action = e["action"]
        frames = [dict(f) for f in e.get("frames", [])] if self.record_stacks else []
        if action == "segment_alloc":
            self._segment_alloc(device, e["addr"], e["size"], e.get("stream", 0), frames)
        elif action == "segment_free":
            self.segments.pop((device, e["addr"]), None)
        elif action == "alloc":
            self._alloc(device, e["addr"], e["size"], frames)
        elif action == "free_completed":
            self._free(device, e["addr"])
        self._update_peaks(device)
        rec = {k: v for k, v in e.items() if k != "frames"}
        rec["frames"] = frames
        rec["time_us"] = self.tick()
        for tracker in self.trace_trackers:
            tracker(device, rec, rec["time_us"])
        if self.recording:
            self._push(self.rings[device], rec)

    def _segment_alloc(self, device, addr, size, stream, frames):
        self.segments[(device, addr)] = {
            "device": device,
            "address": addr,
            "total_size": size,
            "stream": stream,
            "segment_type": "small" if size == _SMALL_SEGMENT else "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": [
                {"address": addr, "size": size, "requested_size": 0, "state": "inactive", "frames": []}
            ],
        }

    def _find(self, device, addr):
        for seg in self.segments.values():
            if seg["device"] == device and seg["address"] <= addr < seg["address"] + seg["total_size"]:
                for i, b in enumerate(seg["blocks"]):
                    if b["address"] == addr:
                        return seg, i
        raise RuntimeError(f"fake torch: no block at {addr:#x} on device {device}")

    def _alloc(self, device, addr, size, frames):
        seg, i = self._find(device, addr)
        b = seg["blocks"][i]
        rounded = max(_MIN_BLOCK, (size + _MIN_BLOCK - 1) // _MIN_BLOCK * _MIN_BLOCK)
        rest = b["size"] - rounded
        split = rest >= _MIN_BLOCK if seg["segment_type"] == "small" else rest > _SMALL_SIZE
        if split:
            tail = {"address": addr + rounded, "size": rest, "requested_size": 0, "state": "inactive", "frames": []}
            b["size"] = rounded
            seg["blocks"].insert(i + 1, tail)
        b.update(requested_size=size, state="active_allocated", frames=frames)

    def _free(self, device, addr):
        seg, i = self._find(device, addr)
        blocks = seg["blocks"]
        blocks[i]["state"] = "inactive"
        blocks[i]["frames"] = []
        if i + 1 < len(blocks) and blocks[i + 1]["state"] == "inactive":
            blocks[i]["size"] += blocks.pop(i + 1)["size"]
        if i > 0 and blocks[i - 1]["state"] == "inactive":
            blocks[i - 1]["size"] += blocks.pop(i)["size"]

    def _update_peaks(self, device):
        for key, value in self._sums(device).items():
            self.peak[(device, key)] = max(self.peak.get((device, key), 0), value)

    def _sums(self, device):
        allocated = active = requested = reserved = n_alloc = n_seg = 0
        for seg in self.segments.values():
            if seg["device"] != device:
                continue
            n_seg += 1
            reserved += seg["total_size"]
            for b in seg["blocks"]:
                if b["state"] == "active_allocated":
                    allocated += b["size"]
                    n_alloc += 1
                if b["state"] != "inactive":
                    active += b["size"]
                    requested += b["requested_size"]
        return {
            "allocated_bytes": allocated,
            "active_bytes": active,
            "requested_bytes": requested,
            "reserved_bytes": reserved,
            "allocation": n_alloc,
            "segment": n_seg,
        }

    def segments_now(self):
        out = []
        for key in sorted(self.segments):
            seg = copy.deepcopy(self.segments[key])
            live = [b for b in seg["blocks"] if b["state"] != "inactive"]
            seg["allocated_size"] = sum(b["size"] for b in live if b["state"] == "active_allocated")
            seg["active_size"] = sum(b["size"] for b in live)
            seg["requested_size"] = sum(b["requested_size"] for b in live)
            out.append(seg)
        return out

    def snapshot(self, include_traces=True):
        with self.lock:
            return self._snapshot(include_traces)

    def _snapshot(self, include_traces):
        self.snapshot_calls += 1
        busy_before, busy_after = self.during_snapshot.pop(0) if self.during_snapshot else (0, 0)
        self._advance(busy_before)  # in PyTorch: other threads, before it takes a device's lock
        snap = {"segments": self.segments_now()}
        if self.recording and self.snapshot_entries:
            for device in range(self.n_devices):
                rec = {"action": "snapshot", "addr": 0, "size": self._sums(device)["allocated_bytes"],
                       "stream": 0, "time_us": self.tick()}
                for tracker in self.trace_trackers:
                    tracker(device, rec, rec["time_us"])
        self._advance(busy_after)  # ... and after it let the lock go
        if include_traces:
            snap["device_traces"] = [copy.deepcopy(list(r)) for r in self.rings]
            if any(e.get("frames") for r in self.rings for e in r):
                symbolize_python_frames()
        else:
            snap["device_traces"] = [[] for _ in self.rings]
        snap["allocator_settings"] = copy.deepcopy(self.allocator_settings)
        snap["external_annotations"] = copy.deepcopy(list(self.annotations)) if include_traces else []
        return snap

    def memory_stats(self, device):
        with self.lock:
            return self._memory_stats(device)

    def _memory_stats(self, device):
        stats = {}
        for key, value in self._sums(device).items():
            stats[f"{key}.all.current"] = value
            stats[f"{key}.all.peak"] = self.peak.get((device, key), value)
        stats["num_ooms"] = self.num_ooms[device]
        stats["num_alloc_retries"] = 0
        return stats

    def inject_oom(self, size, device=0):
        """The allocator fails to find `size` bytes: an oom entry, then the observers."""
        with self.lock:
            free = max(0, self.total_memory - self._sums(device)["reserved_bytes"])
            self.num_ooms[device] += 1
            rec = {"action": "oom", "size": size, "stream": 0, "device_free": free,
                   "frames": [], "time_us": self.tick()}
            for tracker in self.trace_trackers:
                tracker(device, rec, rec["time_us"])
            if self.recording:
                self._push(self.rings[device], rec)
            allocated = self._sums(device)["allocated_bytes"]
        # PyTorch calls the observers after releasing its lock
        for cb in list(self.oom_observers):
            cb(device, size, allocated, free)


JOB = None
_OOM_OBSERVERS = []


def load(path, total_memory=80 * 1024**3):
    """Start a fresh job replaying `path`; returns it."""
    global JOB
    JOB = _Job(path, total_memory)
    return JOB


def job():
    if JOB is None:
        raise RuntimeError("fake torch: call fake_torch.load(path) first")
    return JOB


def advance(n=None):
    return job().advance(n)


def inject_oom(size, device=0):
    job().inject_oom(size, device)
