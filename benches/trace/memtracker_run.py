"""PyTorch's own estimate beside vramscope's (issue 38): runs a program
unmodified under `torch.distributed._tools.mem_tracker.MemTracker`, the
peer that estimates peak allocated memory without a GPU, and prints its
peak for the simulated GPU.

    vramscope trace --json --steps 0 -- python benches/trace/memtracker_run.py PROGRAM [ARGS]

A program written for CUDA runs on a machine without a GPU only with its
device relabelled: under `vramscope trace` it does (its tensors are meta
tensors that say they are `cuda:0`), and MemTracker, entered as soon as
torch is imported, sees every aten op the program runs and sums its live
storages as it does for a CUDA device (each rounded up to 512 B). What it
does not count is its own limit: no caching allocator (reserved memory,
segments, fragmentation), no cuBLAS/cuDNN workspaces or kernel scratch.

Prints `MEMTRACKER {"peak": B, "seconds": S}` on stderr at the end (also
when the program raises SystemExit or an error); with MEMTRACKER_SHOW=1
also MemTracker's peak snapshot by device and kind of memory.
"""

import importlib.abc
import importlib.util
import json
import os
import runpy
import sys
import time


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Enters MemTracker right after `import torch` finishes (after the
    trace's own hook, which this one wraps): the program may set its
    environment before importing torch, as the capture programs do."""

    def __init__(self):
        self.busy = False
        self.tracker = None

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return None
        inner = spec.loader
        hook = self

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return inner.create_module(spec)

            def exec_module(self, module):
                inner.exec_module(module)
                sys.meta_path[:] = [f for f in sys.meta_path if f is not hook]
                hook.tracker = _tracker()
                hook.tracker.__enter__()

        spec.loader = _Loader()
        return spec


def _tracker():
    import torch
    from torch.distributed._tools import mem_tracker
    from torch.distributed._tools.mem_tracker import MemTracker

    # The simulated GPU's tensors are meta tensors that say they are
    # `cuda:0` where Python asks (not inside a dispatch mode, where
    # MemTracker meets most of them): each storage is filed under cuda:0,
    # so MemTracker keeps one device's total (and rounds each storage up to
    # 512 B, as it does for CUDA).
    cuda = torch.device("cuda", 0)
    create = mem_tracker._WeakRefInfo.create_winfo.__func__

    def create_winfo(cls, st, device, reftype, callback=None):
        if device.type == "meta":
            device = cuda
        return create(cls, st, device, reftype, callback)

    mem_tracker._WeakRefInfo.create_winfo = classmethod(create_winfo)

    class PerIteration(MemTracker):
        """MemTracker refuses a root module called again in forward ("does
        not support memory tracking for multiple iterative calls ... use
        reset_mod_stats"): its per-module statistics are reset there, as
        its documentation says to do each iteration. The peak over the
        whole run is kept (reset_mod_stats leaves it)."""

        def _pre_fw_hook(self, module, inputs):
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                name = self._mod_tracker.get_known_fqn(module)
                if set(self._mod_tracker.parents) - {name} == {"Global"}:
                    self.reset_mod_stats()
            super()._pre_fw_hook(module, inputs)

    tracker = PerIteration()
    # A program that resets the peak (`torch.cuda.reset_peak_memory_stats`)
    # measures its peak from there: MemTracker's peak starts there too.
    reset = torch.cuda.reset_peak_memory_stats

    def reset_peak_memory_stats(device=None):
        reset(device)
        snap = tracker.get_tracker_snapshot()
        tracker._peak_mem_snap = snap
        tracker._peak_mem = {d: s["Total"] for d, s in snap.items()}

    torch.cuda.reset_peak_memory_stats = reset_peak_memory_stats
    return tracker


def _report(hook, started):
    peak = 0
    if hook.tracker is not None:
        snap = hook.tracker.get_tracker_snapshot("peak")
        if os.environ.get("MEMTRACKER_SHOW"):
            print("MEMTRACKER_PEAK", {str(d): {str(k): v for k, v in s.items()} for d, s in snap.items()}, file=sys.stderr)
        for device, stats in snap.items():
            if str(device).startswith("cuda"):
                peak += stats.get("Total", 0)
    print(
        "MEMTRACKER " + json.dumps({"peak": peak, "seconds": round(time.perf_counter() - started, 3)}),
        file=sys.stderr,
    )


def main():
    if len(sys.argv) < 2:
        raise SystemExit("usage: memtracker_run.py PROGRAM [ARGS]")
    hook = _AfterTorch()
    sys.meta_path.insert(0, hook)
    program = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
    started = time.perf_counter()
    try:
        runpy.run_path(program, run_name="__main__")
    finally:
        _report(hook, started)


if __name__ == "__main__":
    main()
