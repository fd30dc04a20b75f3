"""The producers: PyTorch's trace read by polling `_snapshot()`, or as it happens by the C++ agent."""

import threading
import time

from ._log import ENTRIES_PER_FRAME, MAX_STACKS
from ._wire import _now_us, _say

MIN_POLL_INTERVAL_S = 0.5
POLL_COST_FACTOR = 20
# After entries are lost between polls the factor halves, down to this: the
# poll thread then spends up to a fifth of the time in _snapshot().
MIN_POLL_COST_FACTOR = 4
TAIL = 8  # entries remembered to find the last one sent in a new ring
AGENT_RING_SLOTS = 1 << 18
AGENT_DRAIN_EVERY_S = 0.01
AGENT_DRAIN_MAX = ENTRIES_PER_FRAME * 4  # records per extension drain() call


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

