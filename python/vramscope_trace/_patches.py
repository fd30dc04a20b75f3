"""What the trace changes in torch beside its modes: an extension's CUDA
kernel written in Python runs (its native calls skipped), `torch.compile`
runs eagerly (said once), foreach kernels take meta, and checkpointing
reads meta as the simulated GPU.
"""

import functools

from ._channel import _chan
from ._session import _state
from ._stack_walk import _stack


def _compile_eagerly(torch):
    """`torch.compile` returns what it was given: the program runs eagerly,
    and the report says so once (a compiled graph fuses kernels, so its
    intermediate tensors may be fewer than the eager ones traced here)."""
    said = []

    def say():
        if not said:
            said.append(True)
            _chan.post(
                [
                    "untraced",
                    "torch.compile",
                    "compiled kernels are not simulated",
                    _stack(),
                    "ran the model eagerly (every eager op traced; a compiled graph may fuse some away)",
                ]
            )

    def compiled(model):
        # A module is compiled to be run: said at once (and returned as
        # it is, one object). A function may be compiled at import and
        # never run (bitsandbytes compiles its CPU kernels as it loads): said
        # at its first call, with that call's line.
        if isinstance(model, torch.nn.Module) or not callable(model):
            say()
            return model

        @functools.wraps(model)
        def eager(*args, **kwargs):
            say()
            return model(*args, **kwargs)

        return eager

    def compile(model=None, **kwargs):
        if model is None:
            return compiled
        return compiled(model)

    torch.compile = compile


def _extension_kernels(torch):
    """An extension's ops (bitsandbytes' `bitsandbytes::gemm_4bit` & co.)
    are registered with a fake kernel, which meta runs, and a CUDA kernel
    written in Python (`torch.library.register_kernel(op, "cuda")`,
    `Library.impl(op, fn, "CUDA")`, a `custom_op`'s `register_kernel`) that
    allocates through torch (its outputs, temporaries, a fallback that
    calls `F.linear`) and then launches native code through ctypes. The
    fake kernel shows only the outputs, so the simulated GPU runs the CUDA
    kernel instead (`Allocations`): its tensors are traced as any op's, and
    its native calls are skipped (no GPU, and meta tensors' `data_ptr()` is
    0), which this sets up: each Python CUDA kernel registered after torch
    is imported is kept by op name, each ctypes library loaded after it
    gets function pointers that do nothing while such a kernel runs, and
    `torch._C._cuda_getCurrentRawStream` (the stream handle such kernels
    pass) answers 0."""
    import ctypes

    import torch.library as tl

    impl = tl.Library.impl

    def impl_kept(self, op_name, fn, dispatch_key="", *a, **k):
        key = dispatch_key or getattr(self, "dispatch_key", "")
        if key == "CUDA" and callable(fn):
            name = getattr(op_name, "_name", None) or str(op_name)
            if "::" not in name:
                name = f"{self.ns}::{name}"
            if name.endswith(".default"):
                name = name[: -len(".default")]
            _state.cuda_kernels[name] = fn
        return impl(self, op_name, fn, dispatch_key, *a, **k)

    tl.Library.impl = impl_kept

    cdll_init = ctypes.CDLL.__init__

    def cdll_kept(self, *a, **k):
        cdll_init(self, *a, **k)
        base = self._FuncPtr

        class _FuncPtr(base):
            _flags_ = base._flags_
            _restype_ = base._restype_

            def __call__(fp, *args):
                if _state.in_cuda_kernel:
                    return None if fp.restype is None else 0
                return base.__call__(fp, *args)

        self._FuncPtr = _FuncPtr

    ctypes.CDLL.__init__ = cdll_kept
    if hasattr(torch._C, "_cuda_getCurrentRawStream"):
        torch._C._cuda_getCurrentRawStream = lambda device=None: 0


def _cuda_kernel_of(torch, func):
    """The CUDA kernel an extension registered in Python for `func`, or
    None (ATen's own ops, and ops whose CUDA kernel is C++)."""
    if func.namespace in ("aten", "prim", "prims"):
        return None
    name = func.name()
    k = _state.cuda_kernels.get(name)
    if k is not None:
        return k
    try:
        opdef = torch._library.custom_ops._maybe_get_opdef(name.split(".")[0])
    except Exception:  # noqa: BLE001 - private API: absent is "none"
        opdef = None
    fns = getattr(opdef, "_backend_fns", None) if opdef is not None else None
    return fns.get("cuda") if isinstance(fns, dict) else None


def _foreach_on_meta(torch):
    """The foreach kernels PyTorch runs for CUDA tensors run for the
    simulated GPU's: code that groups tensors by their real device
    (`clip_grad_norm_`'s `_group_tensors_by_device_and_dtype`) finds meta,
    which PyTorch's list of foreach devices leaves out."""
    try:
        import torch.utils._foreach_utils as fu
    except ImportError:
        return
    devices = getattr(fu, "_get_foreach_kernels_supported_devices", None)
    if devices is None:
        return

    def supported() -> list[str]:
        found = list(devices())
        return found if "meta" in found else found + ["meta"]

    fu._get_foreach_kernels_supported_devices = supported


def _checkpoint_metadata(torch, cuda):
    """Non-reentrant checkpointing compares each recomputed tensor's device
    with the forward's. Whether the relabelling mode is on when autograd's
    hook reads it depends on where the tensor was saved, so the check reads
    the simulated GPU's name for meta itself."""
    try:
        import torch.utils.checkpoint as ckpt
    except ImportError:
        return
    table = getattr(ckpt, "_allowed_determinism_checks_to_fns", None)
    default = getattr(ckpt, "_DEFAULT_DETERMINISM_MODE", None)
    if not isinstance(table, dict) or default not in table:
        return
    extract = table[default]

    def metadata(x):
        m = extract(x)
        if isinstance(m, dict) and getattr(m.get("device"), "type", None) == "meta":
            m["device"] = cuda
        return m

    table[default] = metadata
