"""vramscope_live against a stand-in torch fed from the project's H100 captures.

Run: python3 -m unittest discover -s python/tests -v
A client written here from python/PROTOCOL.md (not from the helper's code)
connects over a unix socket and TCP and checks what the helper sends.
"""

import contextlib
import io
import json
import os
import pickle
import re
import select
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
# The project's own H100 captures (tests/fixtures/pytorch), not other people's files.
CAPTURES = os.path.join(REPO, "tests", "fixtures", "pytorch", "captured")
ADAM = os.path.join(CAPTURES, "peak_inside_step.pickle")  # one AdamW step, 312 entries
TINY = os.path.join(CAPTURES, "amp_bce_bug.pickle")  # 47 entries, ends in an error

sys.path.insert(0, os.path.join(HERE, "fake_torch"))
sys.path.insert(0, PYTHON_DIR)

import fake_agent  # noqa: E402
import fake_torch  # noqa: E402
import vramscope_live  # noqa: E402

NEVER = 3600.0  # a poll interval the tests never reach: they poll with _poll_now()


# ------------------------------------------------------------ a protocol client


class Client:
    def __init__(self, address, token=None, protocol=1):
        if address.startswith("/"):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(address)
        else:
            host, port = address.rsplit(":", 1)
            self.sock = socket.create_connection((host, int(port)))
        self.sock.settimeout(5)
        self.send({"t": "hello", "protocol": protocol, "token": token, "client": "test_live"})
        self.first = self.read()

    def send(self, obj):
        body = json.dumps(obj).encode()
        self.sock.sendall(struct.pack("<I", len(body)) + body)

    def read(self):
        head = self._exact(4)
        if head is None:
            return None
        (n,) = struct.unpack("<I", head)
        assert n <= 64 * 1024 * 1024, n
        return json.loads(self._exact(n).decode("utf-8"))

    def _exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                assert not buf, "the stream ended inside a frame"
                return None
            buf += chunk
        return buf

    def read_until(self, pred, limit=100000):
        got = []
        for _ in range(limit):
            f = self.read()
            if f is None:
                break
            got.append(f)
            if pred(f):
                return got
        raise AssertionError(f"stream ended before the awaited frame; got {[g['t'] for g in got]}")

    def close(self):
        self.sock.close()


class View:
    """What a client knows after reading frames; asserts PROTOCOL.md's rules."""

    def __init__(self):
        self.stacks = {}
        self.next_seq = None
        self.entries = []  # (seq, row with the stack resolved)
        self.states = []  # (state message, segments with stacks resolved)
        self.steps, self.stats, self.ooms, self.lost = [], [], [], []
        self.bye = None
        self._chunks_left = 0
        self._state = None

    def feed(self, frames):
        for f in frames:
            self.one(f)
        return self

    def one(self, f):
        t = f["t"]
        if self._chunks_left:
            assert t == "segments", f"{t} inside a state's chunks"
            self._state[1].extend(self._resolve_segment(s) for s in f["segments"])
            self._chunks_left -= 1
            return
        if t == "stack":
            assert f["id"] not in self.stacks, f"stack {f['id']} defined twice"
            self.stacks[f["id"]] = [tuple(fr) for fr in f["frames"]]
        elif t == "state":
            if self.next_seq is not None:
                assert f["seq"] == self.next_seq, (f, self.next_seq)
            self.next_seq = f["seq"]
            self._state = (f, [])
            self.states.append(self._state)
            self._chunks_left = f["chunks"]
        elif t == "entries":
            assert self.next_seq is not None, "entries before any state"
            assert f["first"] == self.next_seq, (f["first"], self.next_seq)
            for i, row in enumerate(f["entries"]):
                assert len(row) == 7, row
                self.entries.append((f["first"] + i, row[:6] + [self._stack(row[6])]))
            self.next_seq += len(f["entries"])
        elif t == "step":
            assert f["seq"] == self.next_seq, (f, self.next_seq)
            self.steps.append(f)
        elif t == "stats":
            self.stats.append(f)
        elif t == "oom":
            self.ooms.append(f)
        elif t == "lost":
            self.lost.append(f)
        elif t == "bye":
            self.bye = f

    def _stack(self, sid):
        if sid is None:
            return None
        assert sid in self.stacks, f"stack {sid} used before it was defined"
        return self.stacks[sid]

    def _resolve_segment(self, seg):
        seg = dict(seg)
        seg["blocks"] = [dict(b, stack=self._stack(b["stack"])) for b in seg["blocks"]]
        return seg

    def last_state(self, reason=None):
        for msg, segs in reversed(self.states):
            if reason is None or msg["reason"] == reason:
                return msg, segs
        raise AssertionError(f"no state with reason {reason}")


def blocks_of(segments):
    """Segments as the tests compare them: every block, its stack as frames."""
    out = []
    for s in segments:
        blocks = []
        for b in s["blocks"]:
            frames = b.get("stack")
            if frames is None and b.get("frames"):
                frames = [(f["filename"], f["line"], f["name"]) for f in b["frames"]]
            # an inactive block's requested_size is a leftover (SCHEMA.md §4): not compared
            requested = b["requested_size"] if b["state"] != "inactive" else None
            blocks.append((b["address"], b["size"], requested, b["state"], frames or None))
        out.append((s["device"], s["address"], s["total_size"], s["segment_type"], blocks))
    return out


def read_state(client, reason):
    """Frames up to the end of the next state with this reason, as a View."""
    frames = client.read_until(lambda f: f["t"] == "state" and f["reason"] == reason)
    frames += [client.read() for _ in range(frames[-1]["chunks"])]
    return View().feed(frames)


def file_entries(path):
    with open(path, "rb") as f:
        snap = pickle.load(f)
    # without the file's own `snapshot` marks, as the stand-in job replays it
    trace = [e for e in snap["device_traces"][0] if e["action"] != "snapshot"]
    return trace, snap.get("external_annotations", [])


def frames_of(entry):
    """An entry's frames as the helper sends them (none recorded: None)."""
    return [(f["filename"], f["line"], f["name"]) for f in entry["frames"]] or None


def optimizer_step_times(annotations, stage):
    """The times of every `Optimizer.step` record_function START or END."""
    return [a["time_us"] for a in annotations if a["stage"] == stage and a["name"].startswith("Optimizer.step")]


def entries_before(trace, time_us):
    return sum(1 for e in trace if e["time_us"] < time_us)


# ------------------------------------------------------------ tests


class LiveTestCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        os.environ["XDG_RUNTIME_DIR"] = self.tmp.name
        self.clients = []

    def tearDown(self):
        for c in self.clients:
            c.close()
        vramscope_live.stop()
        self.tmp.cleanup()

    def start(self, path=ADAM, before=0, **kw):
        self.job = fake_torch.load(path)
        if before:
            self.job.advance(before)
        kw.setdefault("poll_interval_s", NEVER)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            address = vramscope_live.start(kw.pop("address", None), **kw)
        self.stderr = err.getvalue()
        return address

    def connect(self, address, token=None):
        c = Client(address, token)
        self.clients.append(c)
        self.assertEqual(c.first["t"], "hello", c.first)
        return c

    def finish(self, client):
        vramscope_live.stop()
        return View().feed(client.read_until(lambda f: f["t"] == "bye"))


class HandshakeTests(LiveTestCase):
    def test_unix_socket_is_private_and_says_hello(self):
        address = self.start()
        self.assertEqual(os.path.dirname(address), os.path.join(self.tmp.name, "vramscope"))
        self.assertEqual(stat.S_IMODE(os.stat(os.path.dirname(address)).st_mode), 0o700)
        st = os.stat(address)
        self.assertTrue(stat.S_ISSOCK(st.st_mode))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)
        self.assertIn(address, self.stderr)
        hello = self.connect(address).first
        self.assertEqual(hello["protocol"], 1)
        self.assertEqual(hello["mode"], "poll")  # the fake has no cpp_extension
        self.assertEqual(hello["pid"], os.getpid())
        self.assertEqual(
            hello["devices"],
            [
                {
                    "device": 0,
                    "name": "Fake GPU 0",
                    "total_memory": 80 * 1024**3,
                    # torch's ids as NVML writes them: bus 0x3b, UUID with GPU-
                    "pci_bus_id": "0000:3b:00.0",
                    "uuid": "GPU-8e3c0f7a-0000-4000-8000-000000000000",
                }
            ],
        )
        self.assertTrue(hello["stacks"])
        self.assertEqual(hello["poll_interval_s"], NEVER)

    def test_a_torch_without_device_ids_says_null(self):
        import torch

        class OldProps:  # torch before pci_*_id and uuid
            name = "Old GPU"
            total_memory = 1 << 30

        real = torch.cuda.get_device_properties
        torch.cuda.get_device_properties = lambda d: OldProps()
        try:
            hello = self.connect(self.start()).first
        finally:
            torch.cuda.get_device_properties = real
        self.assertEqual(hello["devices"][0]["pci_bus_id"], None)
        self.assertEqual(hello["devices"][0]["uuid"], None)
        self.assertEqual(hello["devices"][0]["name"], "Old GPU")

    def test_poll_interval_adapts_and_the_fallback_is_explained(self):
        hello = self.connect(self.start(poll_interval_s=None)).first
        self.assertEqual(hello["poll_interval_s"], 0.5, "20x a sub-millisecond poll is under the 0.5 s floor")
        self.assertIn("polling _snapshot() instead", self.stderr)

    def test_entries_lost_between_polls_make_it_poll_sooner_down_to_4x(self):
        self.start(poll_interval_s=None)
        poller = vramscope_live._SESSION.producer
        poller.cost_s = 1.0  # as a large ring would cost
        intervals = []
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            for _ in range(4):
                poller._poll_sooner()
                intervals.append(poller.interval_s)
        self.assertEqual(intervals, [10.0, 5.0, 4.0, 4.0])
        self.assertIn("entries were lost between two polls: polling every 10.00 s now", said.getvalue())

    def test_a_loss_between_polls_lowers_the_default_interval(self):
        address = self.start(max_entries=4, poll_interval_s=None)
        poller = vramscope_live._SESSION.producer
        self.connect(address)
        self.job.advance(10)  # more than the ring of 4 before the next poll
        vramscope_live._poll_now()
        self.assertLess(poller.cost_factor, vramscope_live._producers.POLL_COST_FACTOR)

    def test_a_poll_interval_the_user_set_is_kept_after_a_loss(self):
        address = self.start(max_entries=4, poll_interval_s=NEVER)
        poller = vramscope_live._SESSION.producer
        self.connect(address)
        self.job.advance(10)  # more than the ring of 4 before the first poll
        vramscope_live._poll_now()
        self.assertEqual(poller.interval_s, NEVER)
        self.assertEqual(poller.cost_factor, vramscope_live._producers.POLL_COST_FACTOR)

    def test_other_interfaces_are_served_with_a_warning(self):
        class Served:
            address = "10.1.2.3:7878"

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            vramscope_live._announce("tcp", Served, "abc")
        self.assertIn("other machines may reach", err.getvalue())
        self.assertIn("\nvramscope attach 10.1.2.3:7878 --token abc\n", err.getvalue())

    def test_rank_in_the_address(self):
        os.environ["RANK"] = "3"
        try:
            address = self.start(address=os.path.join(self.tmp.name, "job-{rank}.sock"))
        finally:
            del os.environ["RANK"]
        self.assertEqual(address, os.path.join(self.tmp.name, "job-3.sock"))

    def test_tcp_needs_the_printed_token(self):
        address = self.start(address="127.0.0.1:0")
        m = re.search(r"^vramscope attach (127\.0\.0\.1:\d+) --token ([0-9a-f]{32})$", self.stderr, re.M)
        self.assertIsNotNone(m, self.stderr)
        self.assertEqual(m.group(1), address)
        for wrong in (None, "0" * 32, m.group(2)[:-1]):
            c = Client(address, wrong)
            self.clients.append(c)
            self.assertEqual(c.first, {"t": "refused", "reason": "wrong token"})
            self.assertIsNone(c.read(), "the helper closes after refusing")
        self.connect(address, m.group(2))

    def test_other_protocol_refused(self):
        address = self.start()
        c = Client(address, protocol=2)
        self.clients.append(c)
        self.assertEqual(c.first["t"], "refused")
        self.assertIn("protocol 2 is not supported", c.first["reason"])

    def test_hostile_hellos_are_refused_with_a_reason(self):
        address = self.start()
        for raw, said in (
            (struct.pack("<I", 0xFFFFFFF0), "over the limit"),
            (struct.pack("<I", 5) + b"\xff\xfe{}x", "bad hello"),
            (struct.pack("<I", 2) + b"[]", "not an object"),
            (struct.pack("<I", 13) + b'{"t":"stack"}', "expected hello"),
        ):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            sock.connect(address)
            sock.sendall(raw)
            c = Client.__new__(Client)
            c.sock = sock
            self.clients.append(c)
            reply = c.read()
            self.assertEqual(reply["t"], "refused")
            self.assertIn(said, reply["reason"])
            self.assertIsNone(c.read())
        self.connect(address)  # and the helper still serves

    def test_second_client_refused_then_reconnect_works(self):
        address = self.start()
        first = self.connect(address)
        second = Client(address)
        self.clients.append(second)
        self.assertEqual(second.first, {"t": "refused", "reason": "another vramscope is attached"})
        first.close()
        self.clients.remove(first)
        deadline = time.time() + 5
        while True:  # the helper notices the close within its wait (0.5 s)
            c = Client(address)
            if c.first["t"] == "hello" or time.time() > deadline:
                break
            c.close()
            time.sleep(0.1)
        self.clients.append(c)
        self.assertEqual(c.first["t"], "hello")


class AddressTests(LiveTestCase):
    def test_address_forms(self):
        parse = vramscope_live._parse_address
        self.assertEqual(parse("unix:/run/x.sock"), ("unix", "/run/x.sock"))
        self.assertEqual(parse("./x.sock"), ("unix", "./x.sock"))
        self.assertEqual(parse("127.0.0.1:7878"), ("tcp", "127.0.0.1", 7878))
        self.assertEqual(parse("tcp:[::1]:9"), ("tcp", "::1", 9))
        for bad in ("host:http", "127.0.0.1:70000", ":80"):
            with self.assertRaises(vramscope_live.LiveError) as e:
                parse(bad)
            self.assertIn(bad, str(e.exception))
        self.assertTrue(vramscope_live._is_loopback("localhost"))
        self.assertFalse(vramscope_live._is_loopback("10.0.0.7"))

    def test_a_failed_start_leaves_nothing_running(self):
        taken = os.path.join(self.tmp.name, "not-a-socket")
        with open(taken, "w") as f:
            f.write("mine")
        with self.assertRaises(vramscope_live.LiveError) as e:
            self.start(address=taken)
        self.assertIn(taken, str(e.exception))
        self.assertFalse(self.job.recording, "memory history is turned off again")
        with open(taken) as f:
            self.assertEqual(f.read(), "mine")
        self.connect(self.start())  # and a new start works

    def test_default_directory_of_another_user_is_refused(self):
        os.mkdir(os.path.join(self.tmp.name, "vramscope"), 0o700)
        if os.getuid() == 0:
            os.chown(os.path.join(self.tmp.name, "vramscope"), 12345, 12345)
            owner = 12345
        else:
            # not root: the directory is ours, so the helper is made to be someone else
            owner = os.getuid()
            real_getuid = vramscope_live.os.getuid
            vramscope_live.os.getuid = lambda: owner + 1
            self.addCleanup(setattr, vramscope_live.os, "getuid", real_getuid)
        with self.assertRaises(vramscope_live.LiveError) as e:
            self.start()
        self.assertIn(f"belongs to uid {owner}", str(e.exception))


class LogTests(LiveTestCase):
    def test_every_entry_once_in_order_and_the_end_state(self):
        trace, _ = file_entries(ADAM)
        address = self.start(before=5)
        start_segments = blocks_of(self.job.segments_now())
        client = self.connect(address)
        for n in (3, 7, 1, 19, None):
            self.job.advance(n)
            vramscope_live._poll_now()
        view = self.finish(client)
        msg, segs = view.states[0]
        self.assertEqual((msg["reason"], msg["seq"]), ("start", 0))
        self.assertEqual(blocks_of(segs), start_segments)
        got = [(seq, row[0], row[1], row[2], row[3]) for seq, row in view.entries]
        want = [(i, e["action"], 0, e["addr"], e["size"]) for i, e in enumerate(trace[5:])]
        self.assertEqual(got, want)
        for (_, row), e in zip(view.entries, trace[5:]):
            self.assertEqual(row[6], frames_of(e))
        _, end = view.last_state("resync")
        self.assertEqual(blocks_of(end), blocks_of(self.job.segments_now()))
        self.assertEqual(blocks_of(end), blocks_of(self.job.file["segments"]))
        self.assertEqual(view.bye["t"], "bye")

    def test_start_state_plus_entries_give_the_end_state(self):
        address = self.start(TINY, before=20)
        client = self.connect(address)
        while self.job.advance(9):
            vramscope_live._poll_now()
        view = self.finish(client)
        live = {
            b["address"]: b["requested_size"]
            for s in view.states[0][1]
            for b in s["blocks"]
            if b["state"] == "active_allocated"
        }
        for _, (action, _, addr, size, _, _, _) in view.entries:
            if action == "alloc":
                self.assertNotIn(addr, live)
                live[addr] = size
            elif action == "free_completed":
                self.assertIn(addr, live)
                del live[addr]
        _, end = view.last_state("resync")
        want = {b["address"]: b["requested_size"] for s in end for b in s["blocks"] if b["state"] == "active_allocated"}
        self.assertEqual(live, want)

    def test_late_connect_and_reconnect_get_the_whole_log(self):
        address = self.start(before=2)
        self.job.advance(10)
        vramscope_live._poll_now()
        self.job.advance(4)
        vramscope_live._poll_now()
        views = []
        for _ in range(2):
            c = self.connect(address)
            views.append(View().feed(c.read_until(lambda f: f["t"] == "entries" and f["first"] + len(f["entries"]) == 14)))
            c.close()
            self.clients.remove(c)
            time.sleep(0.7)  # the helper sees the close
        for view in views:
            self.assertEqual([s for s, _ in view.entries], list(range(14)))
            self.assertEqual(view.states[0][0]["reason"], "start")
        self.assertEqual(views[0].entries, views[1].entries)

    def test_ring_wrap_sends_lost_and_a_fresh_state(self):
        address = self.start(max_entries=4)
        client = self.connect(address)
        self.job.advance(2)
        vramscope_live._poll_now()
        # read them first: a client still behind when the log restarts is dropped
        first = client.read_until(lambda f: f["t"] == "entries" and f["first"] + len(f["entries"]) == 2)
        self.job.advance(10)  # more than the ring of 4 between two polls
        vramscope_live._poll_now()
        after_lost = blocks_of(self.job.segments_now())
        self.job.advance(2)
        vramscope_live._poll_now()
        done = lambda f: f["t"] == "entries" and f["first"] + len(f["entries"]) == 4  # noqa: E731
        view = View().feed(first + client.read_until(done))
        self.assertEqual([(x["seq"], x["count"]) for x in view.lost], [(2, None)])
        lost_state = view.last_state("lost")
        self.assertEqual(lost_state[0]["seq"], 2)
        self.assertEqual(blocks_of(lost_state[1]), after_lost)
        trace, _ = file_entries(ADAM)
        got = [(seq, row[0], row[2]) for seq, row in view.entries]
        want = [(seq, e["action"], e["addr"]) for seq, e in zip(range(4), trace[0:2] + trace[12:14])]
        self.assertEqual(got, want)
        # the log was rebased at the loss: a client connecting now starts there
        client.close()
        self.clients.remove(client)
        time.sleep(0.7)
        late = View().feed(self.connect(address).read_until(done))
        self.assertEqual((late.states[0][0]["reason"], late.states[0][0]["seq"]), ("lost", 2))
        self.assertEqual(late.lost[0]["seq"], 2)
        self.assertEqual([s for s, _ in late.entries], [2, 3])

    def test_rebase_when_the_log_outgrows_max_entries(self):
        address = self.start(max_entries=6)
        self.job.advance(4)
        vramscope_live._poll_now()
        self.job.advance(4)
        vramscope_live._poll_now()
        at_rebase = blocks_of(self.job.segments_now())
        late = View().feed(self.connect(address).read_until(lambda f: f["t"] == "segments"))
        msg, segs = late.states[0]
        self.assertEqual((msg["reason"], msg["seq"]), ("rebase", 8))
        self.assertEqual(blocks_of(segs), at_rebase)

    def test_behind_a_rebase_is_detected(self):
        log = vramscope_live._Log(2, None)
        with log.cond:
            log.append_state("start", [])
            log.rebase("rebase", [])
            with self.assertRaises(vramscope_live._log._Behind):
                log.read(0, 0)
            items, end = log.read(log.base, 0)
        self.assertEqual(json.loads(items[0][0][4:])["reason"], "rebase")
        self.assertEqual(end, log.base + 1)


class MarkerTests(LiveTestCase):
    def test_optimizer_step_and_mark_step(self):
        trace, annotations = file_entries(ADAM)
        ends = optimizer_step_times(annotations, "END")
        address = self.start(before=3)
        client = self.connect(address)
        self.job.advance(7)
        vramscope_live.mark_step()
        self.job.advance(None)
        vramscope_live._poll_now()
        view = self.finish(client)
        self.assertEqual(
            [(s["step"], s["seq"], s["source"]) for s in view.steps],
            [(0, 7, "mark_step")]
            + [(i + 1, entries_before(trace, t) - 3, "Optimizer.step") for i, t in enumerate(ends)],
        )
        self.assertTrue(any(s["seq"] == 7 and s["stats"]["allocated_bytes.all.current"] > 0 for s in view.stats))

    def test_record_function_marker_from_annotations(self):
        trace, annotations = file_entries(ADAM)
        before_start = entries_before(trace, optimizer_step_times(annotations, "START")[0])
        address = self.start(step_marker="Optimizer.step")
        client = self.connect(address)
        self.job.advance(None)
        vramscope_live._poll_now()
        view = self.finish(client)
        sources = [(s["seq"], s["source"]) for s in view.steps]
        self.assertIn((before_start, "record_function:Optimizer.step"), sources)

    def test_automatic_polls_deliver_entries(self):
        n = len(file_entries(ADAM)[0])
        address = self.start(poll_interval_s=0.05)
        client = self.connect(address)
        self.job.advance(None)
        frames = client.read_until(lambda f: f["t"] == "entries" and f["first"] + len(f["entries"]) == n)
        self.assertEqual([s for s, _ in View().feed(frames).entries], list(range(n)))


class LazyImportTests(LiveTestCase):
    """PyTorch symbolises Python frames with hasattr(torch, "_inductor"), an
    import on first use: the helper's threads must not be the ones to do it
    (it can deadlock with the job's own first import of torch._dynamo)."""

    def test_start_imports_torch_inductor_so_no_helper_thread_does(self):
        import torch

        sys.modules.pop("torch._inductor", None)
        torch.__dict__.pop("_inductor", None)
        address = self.start(poll_interval_s=0.02)  # the ring is empty: start() symbolises nothing
        client = self.connect(address)
        self.job.advance(None)
        client.read_until(lambda f: f["t"] == "entries")
        self.assertEqual(sys.modules["torch._inductor"].IMPORTED_BY, "MainThread")


class OomTests(LiveTestCase):
    def test_oom_sends_message_stats_and_state(self):
        address = self.start()
        client = self.connect(address)
        self.job.advance(12)
        fake_torch.inject_oom(2 * 1024**3)
        view = read_state(client, "oom")
        self.assertEqual(len(view.ooms), 1)
        oom = view.ooms[0]
        self.assertEqual(oom["alloc_size"], 2 * 1024**3)
        self.assertEqual(oom["seq"], 13)
        self.assertEqual(oom["device_total"], 80 * 1024**3)
        self.assertEqual([row[0] for _, row in view.entries][-1], "oom")
        msg, segs = view.last_state("oom")
        self.assertEqual(msg["seq"], 13)
        self.assertEqual(blocks_of(segs), blocks_of(self.job.segments_now()))
        self.assertTrue(any(s["seq"] == 13 for s in view.stats))

    def test_report_oom_sends_pytorch_s_own_message_after_the_oom(self):
        address = self.start()
        client = self.connect(address)
        self.job.advance(12)
        fake_torch.inject_oom(2 * 1024**3)
        oom = read_state(client, "oom").ooms[0]
        text = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                "80.00 GiB of which 1.00 GiB is free.")
        vramscope_live.report_oom(_OutOfMemoryError(text))
        msg = client.read_until(lambda f: f["t"] == "oom_message")[-1]
        self.assertEqual(msg["message"], text)
        self.assertEqual(msg["device"], 0)
        self.assertEqual(msg["seq"], oom["seq"], "no entry came between them")

    def test_an_oom_nobody_catches_is_sent_and_the_previous_hook_still_runs(self):
        import contextlib
        import io
        import sys as _sys
        address = self.start()
        client = self.connect(address)
        self.job.advance(5)
        vramscope_live._poll_now()
        text = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total capacity of 8 GiB"
        printed = io.StringIO()
        with contextlib.redirect_stderr(printed):
            _sys.excepthook(_OutOfMemoryError, _OutOfMemoryError(text), None)
            _sys.excepthook(ValueError, ValueError("not an OOM"), None)
        msg = client.read_until(lambda f: f["t"] == "oom_message")[-1]
        self.assertEqual((msg["message"], msg["device"]), (text, 3))
        self.assertIn("_OutOfMemoryError", printed.getvalue(), "Python's own hook printed it")
        self.assertIn("not an OOM", printed.getvalue())


class _OutOfMemoryError(RuntimeError):
    """Named as torch.cuda.OutOfMemoryError is."""


_OutOfMemoryError.__name__ = "OutOfMemoryError"


class RecordingTests(LiveTestCase):
    def test_recording_is_framed_and_complete(self):
        path = os.path.join(self.tmp.name, "run-{rank}.vslive")
        self.start(record_to=path, before=4)
        for n in (10, 10, None):
            self.job.advance(n)
            vramscope_live._poll_now()
        vramscope_live.stop()
        with open(path.replace("{rank}", "0"), "rb") as f:
            data = f.read()
        self.assertTrue(data.startswith(b"VSLIVE1\n"))
        frames, pos = [], 8
        while pos < len(data):
            self.assertLessEqual(pos + 4, len(data), "a torn length")
            (n,) = struct.unpack("<I", data[pos : pos + 4])
            self.assertLessEqual(pos + 4 + n, len(data), "a torn frame")
            frames.append(json.loads(data[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        self.assertEqual(frames[0]["t"], "hello")
        self.assertEqual(frames[-1]["t"], "bye")
        view = View().feed(frames[1:])
        self.assertEqual([s for s, _ in view.entries], list(range(len(file_entries(ADAM)[0]) - 4)))
        self.assertEqual(blocks_of(view.last_state("resync")[1]), blocks_of(self.job.segments_now()))


class HostileTargetTests(LiveTestCase):
    """record_to= is written only as a new private file (issue 40)."""

    def start_in_thread(self, **kw):
        """start() on a thread: a start that blocks (a FIFO) fails the test instead of hanging it."""
        out = {}

        def run():
            try:
                out["address"] = self.start(**kw)
            except Exception as e:  # noqa: BLE001 - handed to the test
                out["error"] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(timeout=10)
        self.assertFalse(t.is_alive(), "start() blocked")
        return out

    def test_a_link_a_pipe_or_a_directory_is_refused_and_left_alone(self):
        victim = os.path.join(self.tmp.name, "victim.txt")
        with open(victim, "w") as f:
            f.write("keep")
        link = os.path.join(self.tmp.name, "link.vslive")
        os.symlink(victim, link)
        pipe = os.path.join(self.tmp.name, "pipe.vslive")
        os.mkfifo(pipe)
        folder = os.path.join(self.tmp.name, "folder.vslive")
        os.mkdir(folder)
        for target, says in ((link, "a symbolic link"), (pipe, "a named pipe"), (folder, "a directory")):
            out = self.start_in_thread(record_to=target)
            self.assertIn("error", out, target)
            self.assertIn(says, str(out["error"]))
            self.assertIsNone(vramscope_live._SESSION, "nothing left running")
            self.assertFalse(self.job.recording, "memory history is turned off again")
        with open(victim) as f:
            self.assertEqual(f.read(), "keep")
        self.assertTrue(os.path.islink(link))
        self.assertTrue(stat.S_ISFIFO(os.lstat(pipe).st_mode))
        left = [n for n in os.listdir(self.tmp.name) if n.endswith(".tmp")]
        self.assertEqual(left, [])

    def test_a_recording_is_private_and_replaces_an_old_one_whole(self):
        path = os.path.join(self.tmp.name, "run.vslive")
        with open(path, "wb") as f:
            f.write(b"the earlier run")
        os.chmod(path, 0o644)
        other_name = os.path.join(self.tmp.name, "hardlink")
        os.link(path, other_name)
        old = os.umask(0o022)
        try:
            self.start(record_to=path)
        finally:
            os.umask(old)
        vramscope_live.stop()
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        with open(path, "rb") as f:
            self.assertTrue(f.read().startswith(b"VSLIVE1\n"))
        # Not truncated in place: the other name still holds the old bytes.
        with open(other_name, "rb") as f:
            self.assertEqual(f.read(), b"the earlier run")


class HostileClientTests(LiveTestCase):
    """Unauthenticated peers cost the job a bounded number of threads, for a bounded time."""

    def setUp(self):
        super().setUp()
        self.saved = vramscope_live._server.HANDSHAKE_TIMEOUT_S
        vramscope_live._server.HANDSHAKE_TIMEOUT_S = 1.0

    def tearDown(self):
        vramscope_live._server.HANDSHAKE_TIMEOUT_S = self.saved
        super().tearDown()

    @staticmethod
    def helper_threads():
        return [t for t in threading.enumerate() if t.name == "vramscope-live-client"]

    def test_a_hello_sent_a_byte_at_a_time_is_cut_off_at_the_deadline(self):
        address = self.start(address="127.0.0.1:0")
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        self.addCleanup(sock.close)
        body = json.dumps({"t": "hello", "protocol": 1, "token": "x"}).encode()
        raw = struct.pack("<I", len(body)) + body
        t0 = time.monotonic()
        closed_at = None
        for b in raw:
            try:
                sock.sendall(bytes([b]))
            except OSError:
                closed_at = time.monotonic() - t0
                break
            time.sleep(0.25)
            readable, _, _ = select.select([sock], [], [], 0)
            try:
                gone = readable and sock.recv(1) == b""
            except ConnectionResetError:
                # Closed with our bytes unread: the kernel answers with a reset.
                gone = True
            if gone:
                closed_at = time.monotonic() - t0
                break
        self.assertIsNotNone(closed_at, "the helper kept waiting for the whole trickle")
        self.assertLess(closed_at, 3.0)

    def test_idle_connections_hold_only_a_few_threads_and_then_none(self):
        address = self.start(address="127.0.0.1:0")
        m = re.search(r"--token ([0-9a-f]{32})$", self.stderr, re.M)
        host, port = address.rsplit(":", 1)
        idle = []
        for _ in range(40):
            s = socket.create_connection((host, int(port)))
            self.addCleanup(s.close)
            idle.append(s)
        time.sleep(0.5)
        self.assertLessEqual(len(self.helper_threads()), vramscope_live._server.MAX_PENDING)
        # Past the handshake's deadline they are gone, and a real client gets in.
        deadline = time.monotonic() + 5
        while self.helper_threads() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(self.helper_threads(), [])
        self.connect(address, m.group(1))


class AgentTests(LiveTestCase):
    """Agent mode's Python side, over fake_agent (the C++ core runs in
    test_agent_core.py; the torch part is checked for syntax only)."""

    slots = 1 << 18

    def setUp(self):
        super().setUp()
        self.built = vramscope_live._build_agent
        vramscope_live._build_agent = lambda torch: fake_agent.FakeAgent(self.slots)

    def tearDown(self):
        super().tearDown()
        vramscope_live._build_agent = self.built

    def test_every_entry_once_exact_steps_and_end_state(self):
        trace, annotations = file_entries(ADAM)
        ends = optimizer_step_times(annotations, "END")
        address = self.start(before=5, mode="agent")
        client = self.connect(address)
        self.assertEqual(client.first["mode"], "agent")
        self.assertIsNone(client.first["poll_interval_s"])
        self.job.advance(4)
        vramscope_live.mark_step()
        for n in (3, 7, None):
            self.job.advance(n)
            vramscope_live._poll_now()
        view = self.finish(client)
        self.assertEqual((view.states[0][0]["reason"], view.states[0][0]["seq"]), ("start", 0))
        self.assertEqual([row[0] for _, row in view.entries[-1:]], ["snapshot"], "the resync's own entry")
        got = [(seq, row[0], row[2], row[3]) for seq, row in view.entries[:-1]]
        self.assertEqual(got, [(i, e["action"], e["addr"], e["size"]) for i, e in enumerate(trace[5:])])
        for (_, row), e in zip(view.entries, trace[5:]):
            self.assertEqual(row[6], frames_of(e))
        self.assertEqual(
            [(s["seq"], s["source"]) for s in view.steps],
            [(4, "mark_step")] + [(entries_before(trace, t) - 5, "Optimizer.step") for t in ends],
        )
        self.assertEqual(blocks_of(view.last_state("resync")[1]), blocks_of(self.job.file["segments"]))
        # the state's blocks and the entries share one stack table: no stack under two ids
        self.assertEqual(len({tuple(v) for v in view.stacks.values()}), len(view.stacks))
        self.assertTrue(any(b[4] for s in blocks_of(view.last_state("resync")[1]) for b in s[4]))

    def test_record_function_marker_is_exact(self):
        trace, annotations = file_entries(ADAM)
        start_us = optimizer_step_times(annotations, "START")[0]
        address = self.start(mode="agent", step_marker="Optimizer.step")
        client = self.connect(address)
        self.job.advance(None)
        view = self.finish(client)
        before_start = sum(1 for e in trace if e["time_us"] < start_us)
        self.assertIn((before_start, "record_function:Optimizer.step"), [(s["seq"], s["source"]) for s in view.steps])

    def test_oom_sends_message_and_state(self):
        address = self.start(mode="agent")
        client = self.connect(address)
        self.job.advance(12)
        fake_torch.inject_oom(3 * 1024**3)
        vramscope_live._poll_now()
        view = read_state(client, "oom")
        msg, segs = view.last_state("oom")
        # the state's own `snapshot` entry comes after the oom entry
        self.assertEqual([row[0] for _, row in view.entries[-2:]], ["oom", "snapshot"])
        # addr carries the free device bytes, as PyTorch's C++ TraceEntry does
        free = view.ooms[0]["device_free"]
        self.assertGreater(free, 0)
        self.assertEqual(view.entries[-2][1][:4], ["oom", 0, free, 3 * 1024**3])
        self.assertEqual([(o["seq"], o["alloc_size"]) for o in view.ooms], [(msg["seq"], 3 * 1024**3)])
        self.assertEqual(msg["seq"], 14)
        self.assertTrue(any(s["seq"] == 14 for s in view.stats))
        self.assertEqual(blocks_of(segs), blocks_of(self.job.segments_now()))


    def test_state_is_exact_while_the_allocator_is_busy(self):
        trace, _ = file_entries(ADAM)
        reference = fake_torch.load(ADAM)
        reference.advance(4 + 2)
        at_snapshot = blocks_of(reference.segments_now())
        self.job = fake_torch.load(ADAM)
        self.job.advance(4)
        # start() reads the settings first; then the state: 2 entries before its segments, 3 after
        self.job.during_snapshot = [(0, 0), (2, 3)]
        vramscope_live._build_agent = lambda torch: fake_agent.FakeAgent(self.slots)
        with contextlib.redirect_stderr(io.StringIO()):
            address = vramscope_live.start(mode="agent", poll_interval_s=NEVER)
        vramscope_live._poll_now()
        client = self.connect(address)
        self.job.advance(None)
        view = self.finish(client)
        msg, segs = view.states[0]
        self.assertEqual((msg["reason"], msg["seq"]), ("start", 0))
        self.assertEqual(blocks_of(segs), at_snapshot)
        got = [(row[0], row[2], row[3]) for _, row in view.entries if row[0] != "snapshot"]
        self.assertEqual(got, [(e["action"], e["addr"], e["size"]) for e in trace[6:]])

    def test_without_snapshot_entries_a_busy_state_is_read_again(self):
        self.job = fake_torch.load(TINY)
        self.job.snapshot_entries = False
        self.job.advance(10)
        self.job.during_snapshot = [(0, 0), (1, 2)]  # (the settings,) a busy try, then a quiet one
        vramscope_live._build_agent = lambda torch: fake_agent.FakeAgent(self.slots)
        with contextlib.redirect_stderr(io.StringIO()):
            address = vramscope_live.start(mode="agent", poll_interval_s=NEVER)
        vramscope_live._poll_now()  # sees the busy window and asks again
        at_retry = blocks_of(self.job.segments_now())
        vramscope_live._poll_now()  # places the second state
        client = self.connect(address)
        while self.job.advance(7):
            vramscope_live._poll_now()
        view = self.finish(client)
        self.assertEqual(self.job.snapshot_calls, 4, "settings, start, its retry, the resync at stop")
        self.assertEqual(blocks_of(view.states[0][1]), at_retry)
        trace, _ = file_entries(TINY)
        got = [(row[0], row[2], row[3]) for _, row in view.entries]
        self.assertEqual(got, [(e["action"], e["addr"], e["size"]) for e in trace[13:]])
        self.assertEqual(blocks_of(view.last_state("resync")[1]), blocks_of(self.job.file["segments"]))


class AgentOverflowTests(AgentTests):
    slots = 4

    # the inherited tests need a bigger ring than 4
    test_every_entry_once_exact_steps_and_end_state = None
    test_record_function_marker_is_exact = None
    test_oom_sends_message_and_state = None
    test_state_is_exact_while_the_allocator_is_busy = None
    test_without_snapshot_entries_a_busy_state_is_read_again = None

    def test_overflow_sends_lost_and_a_fresh_state(self):
        trace, _ = file_entries(ADAM)
        address = self.start(mode="agent")
        vramscope_live._poll_now()  # places the start state
        client = self.connect(address)
        self.job.advance(2)
        vramscope_live._poll_now()
        first = client.read_until(lambda f: f["t"] == "entries" and f["first"] + len(f["entries"]) == 2)
        self.job.advance(10)  # 10 entries into a ring of 4
        vramscope_live._poll_now()  # sees the loss, asks for a state
        vramscope_live._poll_now()  # places it
        after_lost = blocks_of(self.job.segments_now())
        self.job.advance(2)
        vramscope_live._poll_now()
        done = lambda f: f["t"] == "entries" and f["first"] + len(f["entries"]) == 4  # noqa: E731
        view = View().feed(first + client.read_until(done))
        self.assertEqual([(x["seq"], x["count"]) for x in view.lost], [(2, None)])
        msg, segs = view.last_state("lost")
        self.assertEqual(msg["seq"], 2)
        self.assertEqual(blocks_of(segs), after_lost)
        got = [(seq, row[0], row[2]) for seq, row in view.entries]
        self.assertEqual(got, [(seq, e["action"], e["addr"]) for seq, e in zip(range(4), trace[0:2] + trace[12:14])])


class AgentSourceTests(unittest.TestCase):
    def test_agent_source_compiles_against_stub_headers(self):
        import shutil

        gxx = shutil.which("g++")
        self.assertIsNotNone(gxx, "g++ is needed to build the agent (Debian/Ubuntu: sudo apt-get install g++)")
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "agent.cpp")
            with open(src, "w") as f:
                f.write(vramscope_live.AGENT_SOURCE)
            stubs = os.path.join(HERE, "agent_stubs")
            out = subprocess.run(
                [gxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I", stubs, src],
                capture_output=True, text=True, timeout=120, check=False,
            )
        self.assertEqual(out.returncode, 0, out.stderr)


class FixtureTests(unittest.TestCase):
    def test_committed_recording_matches_its_snapshot(self):
        path = os.path.join(REPO, "tests", "fixtures", "live", "peak-inside-step.vslive")
        with open(path, "rb") as f:
            data = f.read()
        self.assertTrue(data.startswith(b"VSLIVE1\n"))
        frames, pos = [], 8
        while pos < len(data):
            (n,) = struct.unpack("<I", data[pos : pos + 4])
            frames.append(json.loads(data[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        self.assertEqual(pos, len(data))
        self.assertEqual((frames[0]["t"], frames[-1]["t"]), ("hello", "bye"))
        view = View().feed(frames[1:])
        trace, _ = file_entries(ADAM)
        self.assertEqual(
            [(seq, row[0], row[2], row[3]) for seq, row in view.entries],
            [(i, e["action"], e["addr"], e["size"]) for i, e in enumerate(trace[3:])],
        )
        with open(ADAM, "rb") as f:
            final = pickle.load(f)["segments"]
        self.assertEqual(blocks_of(view.last_state("resync")[1]), blocks_of(final))
        _, annotations = file_entries(ADAM)
        steps = ["Optimizer.step"] * len(optimizer_step_times(annotations, "END"))
        self.assertEqual([s["source"] for s in view.steps], ["mark_step", *steps])


class WithoutTorchTests(unittest.TestCase):
    def test_import_works_and_start_says_torch_is_missing(self):
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); import vramscope_live as v\n"
            "try:\n    v.start()\nexcept v.LiveError as e:\n    print('LiveError:', e)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, PYTHON_DIR], capture_output=True, text=True, timeout=60, check=False
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("LiveError: vramscope_live needs PyTorch", out.stdout)


if __name__ == "__main__":
    unittest.main()
