"""The wire: frames as PROTOCOL.md sets them out, and the strings and ids they carry."""

import json
import socket
import struct
import sys
import time

PROTOCOL = 1
MAX_FRAME = 64 * 1024 * 1024  # PROTOCOL.md "Framing"
MAX_STRING = 64 * 1024  # PROTOCOL.md "Bounds a reader keeps"

class LiveError(RuntimeError):
    """start() could not do what was asked; the message says why."""


def _say(msg):
    print(f"vramscope_live: {msg}", file=sys.stderr, flush=True)


def _now_us():
    return time.time_ns() // 1000



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

