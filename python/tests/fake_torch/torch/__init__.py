"""Fake torch for vramscope_live's tests (see fake_torch.py, and _tensor.py
for tensors, autograd Nodes and nn.Module)."""

__version__ = "2.11.0+fake"

from . import _C, cuda, nn, optim, utils  # noqa: E402,F401
from ._tensor import Tensor, add, float32, int64, mm, mul, randn, relu, sum  # noqa: E402,F401


def __getattr__(name):
    # As PyTorch's torch/__init__.py: some submodules are imported on first use.
    if name == "_inductor":
        import importlib

        return importlib.import_module("._inductor", __name__)
    raise AttributeError(f"module 'torch' has no attribute {name!r}")
