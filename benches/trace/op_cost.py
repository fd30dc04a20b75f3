"""Benchmark for `vramscope trace` (issue 38): the trace's own cost per
aten op, apart from meta execution.

    vramscope trace --headless --steps 0 -- python benches/trace/op_cost.py [N]

Runs the same ops N times traced and with the helper's modes paused
(`vramscope_trace.paused()`: PyTorch's plain meta device, nothing traced),
and prints the difference per op: what the two modes' Python handlers, the
stack walk and the channel add to each op. Three kinds of op:

- a view (`x.t()`): the modes' dispatch only, no storage;
- a factory (`torch.empty(…)`): a malloc request (within vramscope's
  headroom, sent without waiting) and, as the last one dies, its free;
- a GEMM (`a @ b`): a malloc and the op report vramscope sizes its
  workspaces from (a round trip).

Each is the best of five runs of N (the machine's other load only slows a
run down), and meta's own time is what the same op costs paused. Beside
it, the same op on meta under two modes that do nothing (a
TorchFunctionMode and a TorchDispatchMode that only call the op): what
PyTorch's Python dispatch costs any tracer built on modes (MemTracker is
a TorchDispatchMode), before the tracer does anything; the trace's own
work is the rest.
"""

import statistics
import sys
import time

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

try:
    import vramscope_trace
except ImportError:
    raise SystemExit("run this under `vramscope trace -- python benches/trace/op_cost.py`")

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
REPEATS = 5


def timed(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def best(fn, n):
    return min(timed(fn, n) for _ in range(REPEATS))


class BareFunctionMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class BareDispatchMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def case(name, make):
    traced_fn = make("cuda")
    with vramscope_trace.paused():
        plain_fn = make("meta")
    traced_fn()  # first call: stacks defined, workspaces taken
    traced = best(traced_fn, N)
    with vramscope_trace.paused():
        plain = best(plain_fn, N)
        with BareDispatchMode(), BareFunctionMode():
            bare = best(plain_fn, N)
    own = traced - plain
    print(
        f"{name:8s} traced {traced * 1e6:7.2f} µs  meta {plain * 1e6:7.2f} µs  "
        f"bare modes {bare * 1e6:7.2f} µs  the trace's own {own * 1e6:7.2f} µs per op "
        f"({(traced - bare) * 1e6:.2f} µs above the bare modes)",
        file=sys.stderr,
    )
    return own, traced - bare


def view(device):
    x = torch.zeros(64, 64, device=device)
    return lambda: x.t()


def empty(device):
    return lambda: torch.empty(64, 64, device=device)


def gemm(device):
    a = torch.zeros(64, 64, device=device)
    b = torch.zeros(64, 64, device=device)
    return lambda: a @ b


costs = [case("view", view), case("factory", empty), case("gemm", gemm)]
print(
    f"mean of the three: {statistics.mean(c[0] for c in costs) * 1e6:.2f} µs per op "
    f"({statistics.mean(c[1] for c in costs) * 1e6:.2f} µs above the bare modes)",
    file=sys.stderr,
)
