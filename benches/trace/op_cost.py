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

Their inputs are `torch.empty` (no values: the common path, an activation
or a weight). A fourth kind, `known`, is an elementwise op on a small
tensor whose values the trace knows (`torch.arange`: docs/trace.md "Known
values"): the op also runs on the CPU copy and its result is kept; it is
printed apart and left out of the mean.

Each is the best of five runs of N (the machine's other load only slows a
run down), and meta's own time is what the same op costs paused. Beside
it, the same op on meta under two modes that do nothing (a
TorchFunctionMode and a TorchDispatchMode that only call the op): what
PyTorch's Python dispatch costs any tracer built on modes (MemTracker is
a TorchDispatchMode), before the tracer does anything; the trace's own
work is the rest.

Two clocks: wall time, and the CPU time of the program's thread
(`time.thread_time`: what the op costs the program, which other
processes on a loaded machine do not add to). vramscope itself places
the messages in its own process, on another core, while the program runs
on; its CPU time per traced op (its process's, from /proc, while the
traced loops ran) is printed apart.
"""

import os
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
    """(wall, CPU of this thread) per call, in seconds."""
    t, c = time.perf_counter(), time.thread_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n, (time.thread_time() - c) / n


def best(fn, n):
    runs = [timed(fn, n) for _ in range(REPEATS)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def vramscope_cpu():
    """The CPU seconds vramscope's process has used (it started this
    program: its parent), or None where /proc does not say."""
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/comm") as f:
            if f.read().strip() != "vramscope":
                return None
        with open(f"/proc/{ppid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class BareFunctionMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class BareDispatchMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def us(x):
    return f"{x * 1e6:7.2f} µs"


def case(name, make):
    traced_fn = make("cuda")
    with vramscope_trace.paused():
        plain_fn = make("meta")
    traced_fn()  # first call: stacks defined, workspaces taken
    before = vramscope_cpu()
    traced = best(traced_fn, N)
    after = vramscope_cpu()
    with vramscope_trace.paused():
        plain = best(plain_fn, N)
        with BareDispatchMode(), BareFunctionMode():
            bare = best(plain_fn, N)
    for clock, k in (("wall", 0), ("cpu ", 1)):
        print(
            f"{name:8s} {clock} traced {us(traced[k])}  meta {us(plain[k])}  "
            f"bare modes {us(bare[k])}  the trace's own {us(traced[k] - plain[k])} per op "
            f"({(traced[k] - bare[k]) * 1e6:.2f} µs above the bare modes)",
            file=sys.stderr,
        )
    if before is not None and after is not None:
        print(
            f"{name:8s} vramscope's own CPU {us((after - before) / (N * REPEATS))} per traced op "
            "(its process, on another core)",
            file=sys.stderr,
        )
    return [(traced[k] - plain[k], traced[k] - bare[k]) for k in (0, 1)]


def view(device):
    x = torch.empty(64, 64, device=device)
    return lambda: x.t()


def empty(device):
    return lambda: torch.empty(64, 64, device=device)


def gemm(device):
    a = torch.empty(64, 64, device=device)
    b = torch.empty(64, 64, device=device)
    return lambda: a @ b


def known(device):
    k = torch.arange(4096, device=device)
    return lambda: k + 1


# A small tensor with known values alive throughout, as a program has its
# position ids or masks: the common path then looks for known arguments
# (and finds none) at every op.
positions = torch.arange(512, device="cuda")
costs = [case("view", view), case("factory", empty), case("gemm", gemm)]
case("known", known)
for clock, k in (("wall", 0), ("cpu ", 1)):
    print(
        f"mean of the three ({clock.strip()}): "
        f"{statistics.mean(c[k][0] for c in costs) * 1e6:.2f} µs per op "
        f"({statistics.mean(c[k][1] for c in costs) * 1e6:.2f} µs above the bare modes)",
        file=sys.stderr,
    )
