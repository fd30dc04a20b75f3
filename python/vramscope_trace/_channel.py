"""The channel to vramscope: frames of 4 bytes little-endian length +
UTF-8 JSON (python/PROTOCOL.md frames the live stream alike), the two
messages nearly every storage sends as fixed-size binary frames (`_MA`,
`_F`; src/traced/message.rs). A malloc and every query wait for the
answer; frees, stacks and steps are buffered and go with the next message
that waits, so one round trip serves many events.

`_chan` is one object, made here once and connected at activation; a
forked child's is closed (`_forked`).
"""

import json
import os
import socket
import struct
import threading

from ._session import _state

# Messages that need no answer go out in batches of this many, without
# waiting: vramscope places them while the program runs on (two processes,
# two cores), instead of all at once while the program waits for its next
# answer.
SEND_EVERY = 128


# What vramscope sends ahead of an answer when the view asks for a holder
# walk (`H`; PROTOCOL.md `find_holders`).
_WALK = ["walk"]

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


class _Discard(list):
    """A forked child's outbox (`_forked`): what it would send goes nowhere
    (the socket is the parent's)."""

    def append(self, _frame):
        pass


class Channel:
    """Closed until `connect` (at activation): nothing is sent before."""

    def __init__(self):
        self.sock = None
        self.out = []
        self.lock = threading.RLock()
        self.pid = os.getpid()
        self.closed = True

    def connect(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
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
        _state.room_count = 0
        with self.lock:
            self.out.append(struct.pack("<I", len(body)) + body)
            self._flush()
            while True:
                head = self._recv(4)
                (n,) = struct.unpack("<I", head)
                answer = json.loads(self._recv(n))
                if answer != _WALK:
                    # An op's answer may carry the headroom from here on
                    # (`{"room": [bytes, count]}` last), as a malloc's does.
                    if answer.__class__ is list and len(answer) > 1 and answer[-1].__class__ is dict:
                        room = answer[-1].get("room")
                        if room is not None:
                            _state.room_bytes, _state.room_count = room
                    return answer
                # The view asked for a holder walk (its `H`): made at the
                # next op boundary (`_asked_walk`), then this answer.
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


_chan = Channel()


def _forked():
    # A forked child (a DataLoader worker) shares the socket: it must not
    # write. The hot paths append to `out` without asking (`_malloc`,
    # `_freed`): in the child it keeps nothing.
    _chan.closed = True
    _chan.out = _Discard()


def _forked_guard():
    return _chan.closed
