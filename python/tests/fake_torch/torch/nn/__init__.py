"""`torch.nn.Module` and `Parameter` as the holder walk reads them: a
module's `__dict__` holds `_parameters`, `_buffers`, `_modules` and the hook
dicts (`_forward_hooks`, an ordered dict of id → hook), as PyTorch's do."""

import collections
import itertools

from .._tensor import Parameter  # noqa: F401

_hook_ids = itertools.count()


class _RemovableHandle:
    def __init__(self, hooks, hid):
        self.hooks, self.id = hooks, hid

    def remove(self):
        self.hooks.pop(self.id, None)


class Module:
    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_forward_hooks", collections.OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", collections.OrderedDict())
        object.__setattr__(self, "_backward_hooks", collections.OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        for d in ("_parameters", "_modules"):
            table = self.__dict__.get(d, {})
            if name in table:
                return table[name]
        raise AttributeError(name)

    def parameters(self):
        yield from self._parameters.values()
        for m in self._modules.values():
            yield from m.parameters()

    def register_forward_hook(self, hook):
        hid = next(_hook_ids)
        self._forward_hooks[hid] = hook
        return _RemovableHandle(self._forward_hooks, hid)

    def __call__(self, *args):
        out = self.forward(*args)
        for hook in list(self._forward_hooks.values()):
            hook(self, args, out)
        return out


class Linear(Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = Parameter((n_in, n_out))

    def forward(self, x):
        from .._tensor import mm, relu

        return relu(mm(x, self.weight))
