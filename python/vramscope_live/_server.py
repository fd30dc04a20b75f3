"""The server: one client at a time, its handshake, and the frames it is sent."""

import hmac
import json
import os
import select
import socket
import stat
import struct
import threading
import time

from ._address import _default_socket_path, _private_dir
from ._log import _Behind
from ._wire import _say, encode_frame, LiveError, PROTOCOL, read_frame

MAX_HELLO = 64 * 1024
HANDSHAKE_TIMEOUT_S = 10.0  # the whole hello, however slowly it comes
MAX_PENDING = 8  # connections still in their handshake: more are closed at once
SEND_TIMEOUT_S = 30.0


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

