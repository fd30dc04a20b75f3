"""Benchmark for `vramscope trace` (issue 38): the trace's own cost per
aten op counted in instructions (callgrind), which the other builders'
load on the machine does not change, where benches/trace/op_cost.py reads
clocks.

    vramscope trace --headless --steps 0 -- valgrind --tool=callgrind \\
        --instr-atstart=no --callgrind-out-file=DIR/cg.out \\
        python benches/trace/op_instructions.py KIND N [MODE]

KIND: `view` (`x.t()`), `factory` (`torch.empty(64, 64)`), `gemm`
(`a @ b`), as op_cost.py runs them. MODE: `traced` (the default), or `bare`:
the helper's modes paused (PyTorch's plain meta device) under two modes
that do nothing, the floor any tracer built on PyTorch's Python dispatch
pays. Instrumentation is on for the N ops only (`callgrind_control -i on`
before, a dump after): `DIR/cg.out.1`'s `summary:` line is their
instructions, plus a constant for the two `callgrind_control` calls, which
a run with N = 0 measures. Per op: (summary - constant) / N; traced minus
bare is what the trace adds. `callgrind_annotate DIR/cg.out.1` says where.
"""

import os
import subprocess
import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

try:
    import vramscope_trace
except ImportError:
    raise SystemExit("run this under `vramscope trace -- valgrind ... python benches/trace/op_instructions.py`")

KIND = sys.argv[1]
N = int(sys.argv[2])
MODE = sys.argv[3] if len(sys.argv) > 3 else "traced"


class BareFunctionMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class BareDispatchMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def make(device):
    a = torch.empty(64, 64, device=device)
    b = torch.empty(64, 64, device=device)
    return {
        "view": lambda: a.t(),
        "factory": lambda: torch.empty(64, 64, device=device),
        "gemm": lambda: a @ b,
    }[KIND]


def callgrind(*args):
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True)


def loop(fn):
    for _ in range(N):
        fn()


# As op_cost.py: a small tensor with known values alive throughout.
positions = torch.arange(512, device="cuda")
if MODE == "traced":
    fn = make("cuda")
elif MODE == "bare":
    vramscope_trace.paused().__enter__()
    fn = make("meta")
    BareDispatchMode().__enter__()
    BareFunctionMode().__enter__()
else:
    raise SystemExit(f"MODE is traced or bare, not {MODE!r}")
# Twice first: stacks defined, workspaces taken, frames the walk passes
# tagged.
fn()
fn()
callgrind("-i", "on")
loop(fn)
callgrind("-d")
callgrind("-i", "off")
