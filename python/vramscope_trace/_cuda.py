"""The `torch.cuda` the program sees: the GPU profile's device properties,
one stream and events that do nothing, and the memory answers
(`memory_allocated`, `memory_stats`, `empty_cache`, `_dump_snapshot` …)
from vramscope's simulation.
"""

import os

from ._allocations import _lazy_init
from ._channel import _chan
from ._session import _state


class _DeviceProperties:
    def __init__(self, d):
        self.name = d["name"]
        self.total_memory = d["total_memory"]
        self.major = d["major"]
        self.minor = d["minor"]
        self.multi_processor_count = d["sm_count"]
        self.max_threads_per_multi_processor = d["max_threads_per_sm"]
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.warp_size = 32
        self.L2_cache_size = d.get("l2_bytes", 0)
        self.uuid = "GPU-00000000-0000-0000-0000-000000000000"

    def __repr__(self):
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1 << 20)}MB, "
            f"multi_processor_count={self.multi_processor_count}) [simulated by vramscope]"
        )


class _FakeStream:
    """A CUDA stream on the simulated GPU: everything runs on stream 0."""

    cuda_stream = 0
    device = None

    def __init__(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event or _FakeEvent()

    def query(self):
        return True

    def is_capturing(self):
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _FakeEvent:
    def __init__(self, *a, **k):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


class _DeviceContext:
    def __init__(self, device=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _patch_cuda(torch):
    import pickle
    import tempfile

    cuda = torch.cuda
    mem = torch.cuda.memory
    dev = _state.device

    def stats(device=None):
        _lazy_init()
        return _chan.ask(["stats"])[1]

    def stat(key):
        def f(device=None):
            return stats(device).get(key, 0)

        return f

    def reset_peak(device=None):
        _lazy_init()
        _chan.ask(["reset_peak"])

    def reset_accumulated(device=None):
        _lazy_init()
        _chan.ask(["reset_accumulated"])

    def empty_cache():
        if _state.initialized:
            _chan.ask(["empty_cache"])

    def set_fraction(fraction, device=None):
        _lazy_init()
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if fraction < 0 or fraction > 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        r = _chan.ask(["fraction", fraction])
        if r[0] != "ok":
            raise RuntimeError(r[1])

    def get_fraction(device=None):
        _lazy_init()
        return _chan.ask(["get_fraction"])[1]

    def mem_get_info(device=None):
        _lazy_init()
        free, total = _chan.ask(["mem_get_info"])[1]
        return (free, total)

    def summary(device=None, abbreviated=False):
        _lazy_init()
        return _chan.ask(["summary", bool(abbreviated)])[1]

    def dump_snapshot(filename="dump_snapshot.pickle"):
        _lazy_init()
        r = _chan.ask(["dump", os.path.abspath(filename)])
        if r[0] != "ok":
            raise RuntimeError(r[1])

    def snapshot(device=None, *a, **k):
        _lazy_init()
        fd, path = tempfile.mkstemp(suffix=".pickle")
        os.close(fd)
        try:
            r = _chan.ask(["dump", path])
            if r[0] != "ok":
                raise RuntimeError(r[1])
            with open(path, "rb") as f:
                return pickle.load(f)
        finally:
            os.unlink(path)

    def record_history(*a, **k):
        _lazy_init()  # the simulation records every event from the start
        # `enabled=None` stops recording and clears the buffer, and nothing
        # is recorded until it is on again; 2.8+'s `clear_history=True`
        # clears it on enabling (allocator.md §13.1). The program's own
        # snapshots follow that; vramscope's views keep every event.
        enabled = a[0] if a else k.get("enabled", "all")
        on = enabled is not None and enabled is not False
        r = _chan.ask(["history", on, bool(k.get("clear_history"))])
        if r[0] != "ok":
            raise RuntimeError(r[1])

    def noop(*a, **k):
        return None

    def init():
        _lazy_init()

    def props(device=None):
        return _DeviceProperties(dev)

    def rng_state(device="cuda"):
        return torch.zeros(16, dtype=torch.uint8)

    def clear_workspaces():
        if _state.initialized:
            _chan.ask(["clear_workspaces"])
            # The next GEMM on each thread takes its workspace again: it
            # waits for its answer (an OOM there reaches the program).
            _state.quiet.clear()
            _state.still.clear()
            _state.asked.clear()

    patches = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": noop,
        "is_initialized": lambda: _state.initialized,
        "init": init,
        "_lazy_init": init,
        "synchronize": noop,
        "get_device_properties": props,
        "get_device_name": lambda device=None: dev["name"],
        "get_device_capability": lambda device=None: (dev["major"], dev["minor"]),
        "is_bf16_supported": lambda including_emulation=True: dev["major"] >= 8,
        "mem_get_info": mem_get_info,
        "memory_stats": stats,
        "memory_allocated": stat("allocated_bytes.all.current"),
        "max_memory_allocated": stat("allocated_bytes.all.peak"),
        "memory_reserved": stat("reserved_bytes.all.current"),
        "max_memory_reserved": stat("reserved_bytes.all.peak"),
        "memory_cached": stat("reserved_bytes.all.current"),
        "max_memory_cached": stat("reserved_bytes.all.peak"),
        "reset_peak_memory_stats": reset_peak,
        "reset_max_memory_allocated": reset_peak,
        "reset_max_memory_cached": reset_peak,
        "reset_accumulated_memory_stats": reset_accumulated,
        "empty_cache": empty_cache,
        "set_per_process_memory_fraction": set_fraction,
        "get_per_process_memory_fraction": get_fraction,
        "memory_summary": summary,
        "get_allocator_backend": lambda: "native",
        "get_rng_state": rng_state,
        "get_rng_state_all": lambda: [rng_state()],
        "set_rng_state": noop,
        "set_rng_state_all": noop,
        "manual_seed": noop,
        "manual_seed_all": noop,
        "seed": noop,
        "seed_all": noop,
        "initial_seed": lambda: 0,
        "current_stream": lambda device=None: _FakeStream(),
        "default_stream": lambda device=None: _FakeStream(),
        "set_stream": noop,
        "Stream": _FakeStream,
        "Event": _FakeEvent,
        "stream": lambda s=None: _DeviceContext(),
        "device": _DeviceContext,
        "device_of": _DeviceContext,
        "is_current_stream_capturing": lambda: False,
    }
    for name, fn in list(patches.items()):
        # One object per name: torch._dynamo's rule table refuses one
        # function standing for two names.
        fn = _distinct(name, fn)
        patches[name] = fn
        setattr(cuda, name, fn)
        if hasattr(mem, name):
            setattr(mem, name, fn)
    try:
        import torch.cuda.graphs as graphs

        graphs.is_current_stream_capturing = patches["is_current_stream_capturing"]
    except ImportError:
        pass
    mem._record_memory_history = record_history
    mem._dump_snapshot = dump_snapshot
    mem._snapshot = snapshot
    torch._C._cuda_clearCublasWorkspaces = clear_workspaces
    _patch_accelerator(torch, patches, noop)
    try:
        import torch.cuda.random as rnd

        for name in ("get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all", "seed", "seed_all"):
            setattr(rnd, name, patches[name])
    except ImportError:
        pass


def _patch_accelerator(torch, cuda, noop):
    """`torch.accelerator` (PyTorch 2.6 on), which newer releases' own code
    asks where older ones asked `torch.cuda` (the optimizers' graph-capture
    check, from 2.12 or so, asks for the current stream): the simulated GPU
    answers, from the same functions as `torch.cuda`'s (`cuda`: name ->
    the patched function), never the machine's CUDA runtime."""
    acc = getattr(torch, "accelerator", None)
    if acc is None:
        return
    patches = {
        "is_available": cuda["is_available"],
        "device_count": cuda["device_count"],
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "current_device_index": cuda["current_device"],
        "current_device_idx": cuda["current_device"],
        "set_device_index": noop,
        "set_device_idx": noop,
        "current_stream": cuda["current_stream"],
        "set_stream": noop,
        "synchronize": noop,
        "device_index": cuda["device"],
        "empty_cache": cuda["empty_cache"],
        "empty_host_cache": noop,
        "memory_stats": cuda["memory_stats"],
        "memory_allocated": cuda["memory_allocated"],
        "max_memory_allocated": cuda["max_memory_allocated"],
        "memory_reserved": cuda["memory_reserved"],
        "max_memory_reserved": cuda["max_memory_reserved"],
        "reset_accumulated_memory_stats": cuda["reset_accumulated_memory_stats"],
        "reset_peak_memory_stats": cuda["reset_peak_memory_stats"],
        "get_memory_info": cuda["mem_get_info"],
    }
    mem = getattr(acc, "memory", None)
    for name, fn in patches.items():
        if hasattr(acc, name):
            setattr(acc, name, _distinct("accelerator." + name, fn))
        if mem is not None and hasattr(mem, name):
            setattr(mem, name, _distinct("accelerator.memory." + name, fn))


def _distinct(name, fn):
    if isinstance(fn, type):
        return type(name, (fn,), {})

    def call(*a, **k):
        return fn(*a, **k)

    call.__name__ = call.__qualname__ = name
    return call
