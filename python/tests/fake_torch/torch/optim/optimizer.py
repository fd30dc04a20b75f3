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
