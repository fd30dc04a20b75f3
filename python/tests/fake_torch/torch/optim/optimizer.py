import itertools

import fake_torch

_ids = itertools.count()


class _Handle:
    def __init__(self, key):
        self.key = key

    def remove(self):
        fake_torch.job().step_hooks.pop(self.key, None)


def register_optimizer_step_post_hook(hook):
    key = next(_ids)
    fake_torch.job().step_hooks[key] = hook
    return _Handle(key)


class Optimizer:
    """`torch.optim.Optimizer`: its `state` (a dict per parameter) holds the
    optimizer's tensors; `step()` runs the global post hooks after the
    update, as PyTorch's wrapper does."""

    def __init__(self, params):
        self.param_groups = [{"params": list(params)}]
        self.state = {}

    def step(self):
        from .._tensor import Tensor

        for p in self.param_groups[0]["params"]:
            if p not in self.state:
                self.state[p] = {"momentum_buffer": Tensor(p.shape, p.dtype, p.device)}
        for hook in list(fake_torch.job().step_hooks.values()):
            hook(self, (), {})


class SGD(Optimizer):
    pass
