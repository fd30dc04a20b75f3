# As PyTorch's own torch/optim/__init__.py does, the submodule is imported and
# then deleted from the package: `torch.optim.optimizer` is no attribute, so
# code must import it by name (`importlib.import_module("torch.optim.optimizer")`).
from .optimizer import SGD, Optimizer  # noqa: F401
from .optimizer import register_optimizer_step_post_hook as _hook  # noqa: F401

del optimizer  # noqa: F821
