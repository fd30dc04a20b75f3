"""vramscope_trace: run an unmodified PyTorch program on a simulated GPU.

`vramscope trace -- python train.py ARGS` starts the program with this package
and a `sitecustomize.py` that imports it on a private `PYTHONPATH`, and
`VRAMSCOPE_TRACE_SOCKET` naming the unix socket where vramscope listens.
Nothing here runs unless that variable is set. The program is not changed:

- when the program imports torch, the import finishes and then this package
  patches `torch.cuda` (`is_available()` is true, the device's properties are
  the GPU profile's, `memory_allocated()`, `memory_stats()`, `empty_cache()`,
  `set_per_process_memory_fraction()`, `_dump_snapshot()` … answer from the
  simulation) and pushes two modes for the rest of the run;
- a TorchFunctionMode relabels: `device="cuda"`, `.cuda()`, `.to("cuda")`
  land on PyTorch's `meta` device (shapes and dtypes, no data), a meta
  tensor says it is on `cuda:0`, and what needs data (`.item()`, `.cpu()`,
  `.tolist()`, `bool(t)`) gets zeros of the right shape and dtype;
  `F.scaled_dot_product_attention` runs the kernel PyTorch would pick on the
  GPU (vramscope's engine chooses it);
- a TorchDispatchMode sees every aten op's outputs: each new storage is a
  `malloc` that waits for vramscope's allocator (an address, or an OOM that
  is raised here as `torch.cuda.OutOfMemoryError` with PyTorch's message),
  and a weak reference on the storage sends its `free` when it dies;
- every `optimizer.step()` is a step; after `--steps N` of them the process
  ends (os._exit), so a long training run gives a quick answer;
- at a step where allocated memory grew by 1 MiB or more since the last
  walk, and at a simulated OOM, the live helper's holder walk
  (python/vramscope_live/holders.py, written beside this package as
  `vramscope_trace_holders.py`) names the Python variables that hold the
  simulated GPU's tensors: PROTOCOL.md `holders`, within a budget it states.

Channel: frames of 4 bytes little-endian length + UTF-8 JSON, as
python/PROTOCOL.md frames the live stream. The messages are arrays, the
first element the kind; `docs/trace.md` lists them. The two nearly every
storage sends (`ma`, `f`) are fixed-size binary frames (`_MA`, `_F`). A malloc and every
query wait for the answer; frees, stacks and steps are buffered and go with
the next message that waits, so one round trip serves many events.

An extension's CUDA kernel written in Python (bitsandbytes') runs in place
of its fake kernel, its native calls skipped (`_extension_kernels`); the
program's own meta tensors are told apart from the simulated GPU's
(`_own_op`).

No allocator or CUDA rule lives here: sizes are the storages' bytes, and
what PyTorch's CUDA kernels add (cuBLAS workspaces, the SDPA backend's
buffers) is decided by vramscope from the op names and shapes sent.

The package, one job a module (`vramscope trace` carries every one,
src/traced/launch.rs):

- `_boot`: the sitecustomize's `_boot` and the import hook;
- `_session`: the session's state (`_state`, one object filled at
  activation), the holder walk's module;
- `_channel`: the channel to vramscope (`_chan`, one object connected at
  activation), its frames;
- `_activate`: activation, right after `import torch`: `hello`, the
  patches, the two modes pushed;
- `_stack_walk`: each op's Python stack, as an interned id;
- `_allocations`: storages' mallocs and frees;
- `_reports`: what vramscope is told of an op beyond its storages;
- `_known`: known values of small tensors;
- `_relabel`: the function mode and its handlers;
- `_dispatch`: the dispatch mode;
- `_autocast`: CUDA autocast and its cast cache;
- `_meta_kernels`: meta kernels for ops meta lacks or runs otherwise
  (data-dependent sizes, CUDA branches of backward formulas);
- `_cuda_paths`: SDPA's backend, cuDNN's RNNs, a loss's CUDA backward;
- `_own_meta`: the program's own meta device;
- `_patches`: extensions' CUDA kernels, `torch.compile`, foreach, checkpoint;
- `_cuda`: the `torch.cuda` the program sees;
- `_steps`: steps, the holder walk, the end.

The hot path (every op) reads module globals; the two that change at
activation, `_state` and `_chan`, are objects made once whose attributes
change, never rebound, so `from ._session import _state` stays true. The
modules that bind torch's objects at import (`_allocations`, `_known`,
`_reports`, `_meta_kernels`, `_dispatch`) are imported by `_activate`, once
torch's own import has finished; importing this package imports no torch.
"""

from ._boot import ENV_BOOT, ENV_SOCKET, _boot
from ._channel import TraceError
from ._session import _state

__all__ = ["ENV_BOOT", "ENV_SOCKET", "TraceError", "_boot", "paused"]


class paused:
    """`with vramscope_trace.paused():` runs its body on PyTorch's plain meta
    device, the helper's modes off (its benchmark's baseline,
    benches/trace/op_cost.py): nothing in it is traced."""

    def __enter__(self):
        _state.relabel.__exit__(None, None, None)
        _state.allocations.__exit__(None, None, None)
        return self

    def __exit__(self, *exc):
        _state.allocations.__enter__()
        _state.relabel.__enter__()
        return False
