"""Fake torch for vramscope_live's tests (see fake_torch.py)."""

__version__ = "2.11.0+fake"

from . import _C, cuda, optim, utils  # noqa: E402,F401
