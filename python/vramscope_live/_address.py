"""Where the helper serves: socket paths and TCP addresses, and who may connect."""

import ipaddress
import os
import stat

from ._wire import LiveError



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

