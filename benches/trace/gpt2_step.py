"""Benchmark for `vramscope trace` (issue 38): GPT-2 small (nanoGPT's GPT,
tests/fixtures/pytorch/_gpt.py) trained with AdamW on batch 4 x 1,024 tokens.

    vramscope trace --headless --steps 0 -- python benches/trace/gpt2_step.py [STEPS]
    python benches/trace/gpt2_step.py [STEPS] --meta          # plain meta, untraced
    python benches/trace/gpt2_step.py [STEPS] --meta --modes  # meta under no-op modes

Prints the wall time of each training step (model building and the first
step's one-off costs apart), the aten ops per step, so the trace's cost
per op is (traced - meta) / ops, and the process's memory (resident set:
its peak, and what it holds after the steps). `cargo bench --bench trace`
runs the three and reports.

AdamW is asked for its `foreach` implementation, the one PyTorch picks
for CUDA parameters: traced, the parameters say CUDA and it would pick it
anyway; on plain meta it would pick the per-parameter loop (about 1,200
more aten ops a step), so the three runs would not run the same ops.
`--modes` runs plain meta under a TorchFunctionMode and a
TorchDispatchMode that only call the function: the floor that any tracer
built on PyTorch's Python modes pays, whatever it does.
"""

import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "pytorch"))

import torch  # noqa: E402
from _gpt import GPT, Config, criterion  # noqa: E402


def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 3
device = "meta" if "--meta" in sys.argv else "cuda"
cfg = Config(n_layer=12, n_head=12, n_embd=768, vocab=50_257, block_size=1024)
t0 = time.perf_counter()
model = GPT(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, foreach=True)
print(f"build {time.perf_counter() - t0:.3f} s", file=sys.stderr)


class Count(torch.utils._python_dispatch.TorchDispatchMode):
    ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        Count.ops += 1
        return func(*args, **(kwargs or {}))


class NoOpFunctions(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class NoOpDispatch(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


if "--modes" in sys.argv:
    NoOpFunctions().__enter__()
    NoOpDispatch().__enter__()

for i in range(steps + 1):
    t = time.perf_counter()
    x = torch.randint(0, cfg.vocab, (4, 1024), device=device)
    y = torch.randint(0, cfg.vocab, (4, 1024), device=device)
    opt.zero_grad(set_to_none=True)
    loss = criterion(model(x), y)
    loss.backward()
    opt.step()
    dt = time.perf_counter() - t
    print(f"step {i}{' (first)' if i == 0 else ''}: {dt:.3f} s", file=sys.stderr)
if device == "meta" and "--modes" not in sys.argv:
    with Count():
        opt.zero_grad(set_to_none=True)
        x = torch.randint(0, cfg.vocab, (4, 1024), device=device)
        criterion(model(x), x).backward()
        opt.step()
    print(f"aten ops per step: {Count.ops}", file=sys.stderr)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"resident peak {peak:.0f} MiB, after the steps {resident_mib():.0f} MiB", file=sys.stderr)
