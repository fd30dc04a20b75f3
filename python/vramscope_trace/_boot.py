"""The start: the generated sitecustomize calls `_boot`, which waits for
the program's `import torch` (an import hook) and starts tracing right
after torch's own import finishes (`_activate`). Nothing runs unless
`VRAMSCOPE_TRACE_SOCKET` is set.
"""

import importlib.abc
import importlib.util
import os
import sys

ENV_SOCKET = "VRAMSCOPE_TRACE_SOCKET"
ENV_BOOT = "VRAMSCOPE_TRACE_BOOT"


def _boot():
    """Called by the generated sitecustomize: wait for `import torch`."""
    path = os.environ.get(ENV_SOCKET)
    if not path:
        return
    # Child processes (DataLoader workers started with spawn, subprocesses)
    # must not trace: only the process vramscope started does.
    os.environ.pop(ENV_SOCKET, None)
    _chain_sitecustomize()
    sys.meta_path.insert(0, _TorchHook(path))


def _chain_sitecustomize():
    """Run the sitecustomize this one shadows, if the environment has one."""
    boot = os.environ.get(ENV_BOOT)
    for entry in sys.path:
        if not entry or (boot and os.path.abspath(entry) == os.path.abspath(boot)):
            continue
        cand = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(cand):
            spec = importlib.util.spec_from_file_location("_vramscope_chained_sitecustomize", cand)
            if spec and spec.loader:
                mod = importlib.util.module_from_spec(spec)
                try:
                    spec.loader.exec_module(mod)
                except Exception as e:  # the user's own file: say, go on
                    print(f"vramscope trace: {cand}: {e!r}", file=sys.stderr)
            return


class _TorchHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `torch` is imported, wraps its loader so
    that tracing starts right after torch's own import finishes."""

    def __init__(self, path):
        self.path = path
        self.busy = False

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
        loader = spec.loader
        hook = self

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                sys.meta_path[:] = [f for f in sys.meta_path if f is not hook]
                # The modules that bind torch's objects are imported now.
                from ._activate import _activate

                _activate(module, hook.path)

        spec.loader = _Loader()
        return spec
