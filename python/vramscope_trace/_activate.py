"""Activation, right after the program's `import torch` finished: the
channel's `hello`, the session's state, then `torch.cuda` patched and the
two modes pushed for the rest of the run.

Imported then (by `_boot`'s hook), with the modules that bind torch's
objects at their import.
"""

import atexit
import os
import sys

from ._channel import _chan, _forked
from ._cuda import _patch_cuda
from ._dispatch import _allocations_mode
from ._patches import _checkpoint_metadata, _compile_eagerly, _extension_kernels, _foreach_on_meta
from ._relabel import _relabel_mode
from ._session import _state
from ._steps import _at_exit, _install_step_hook, _wrap_excepthook


def _activate(torch, path):
    _chan.connect(path)
    reply = _chan.ask(
        [
            "hello",
            {
                "pid": os.getpid(),
                "argv": list(sys.argv),
                "torch": torch.__version__,
                "python": sys.version.split()[0],
            },
        ]
    )
    _state.start(torch, reply)
    os.register_at_fork(after_in_child=_forked)
    _patch_cuda(torch)
    _extension_kernels(torch)
    _install_step_hook(torch)
    # The function mode's handlers, then the dispatch mode's rules, then
    # what torch's own code asks of the device; pushed last.
    _state.relabel = _relabel_mode(torch)
    _state.allocations = _allocations_mode(torch)
    _foreach_on_meta(torch)
    _compile_eagerly(torch)
    _checkpoint_metadata(torch, _state.cuda)
    _state.allocations.__enter__()
    _state.relabel.__enter__()
    atexit.register(_at_exit)
    _wrap_excepthook()
