"""Tensors, storages and autograd Nodes as vramscope_live's holder walk
reads them from PyTorch (python/vramscope_live/holders.py), and no more:

- `Tensor`: `is_cuda`, `shape` (a tuple, as `torch.Size` is), `dtype`,
  `dim()`, `grad_fn`, `requires_grad`, `is_leaf`, `untyped_storage()` (a
  storage with `data_ptr()` and `nbytes()`, shared by views), `detach()`,
  `item()`, `cpu()`, and `backward()`.
- Nodes (`grad_fn`): `name()` (`AddBackward0`), `next_functions` (a tuple of
  `(node or None, input_nr)`, an `AccumulateGrad` for a leaf that requires
  grad), and the saved tensors as `_saved_<name>` attributes, as PyTorch's
  generated Node classes expose them. Once a backward has run through a
  Node without retain_graph, reading one raises PyTorch's RuntimeError, as
  the real attribute does. `_raw_saved_<name>` is the saved value with its
  unpack hook (`save_with_hooks`: a `saved_tensors_hooks` pair).

Ops: `add`, `mul`, `mm` (saves `self` and `mat2`), `relu` (saves `result`),
`sum` (a 0-dim result, saves only sizes). A CUDA storage counts its bytes
into `torch.cuda.memory_allocated()` while it lives.
"""

import itertools
import weakref

_ptrs = itertools.count(0x7F0000000000, 0x100000)
ALLOCATED = [0]  # bytes of live CUDA storages made through this module

FREED = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward."
)


class dtype:
    def __init__(self, name, size):
        self.name, self.itemsize = name, size

    def __repr__(self):
        return f"torch.{self.name}"


float32 = dtype("float32", 4)
int64 = dtype("int64", 8)


class UntypedStorage:
    def __init__(self, nbytes, cuda):
        self._nbytes = nbytes
        self._ptr = next(_ptrs) if cuda else 0
        if cuda:
            ALLOCATED[0] += nbytes
            weakref.finalize(self, _release, nbytes)

    def data_ptr(self):
        return self._ptr

    def nbytes(self):
        return self._nbytes


def _release(n):
    ALLOCATED[0] -= n


class Tensor:
    def __init__(self, shape, dtype=float32, device="cuda", requires_grad=False, storage=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = device
        self.is_cuda = device == "cuda"
        n = 1
        for d in self.shape:
            n *= d
        self._storage = storage or UntypedStorage(n * dtype.itemsize, self.is_cuda)
        self.requires_grad = requires_grad
        self.grad_fn = None
        self.grad = None

    @property
    def is_leaf(self):
        return self.grad_fn is None

    def dim(self):
        return len(self.shape)

    def untyped_storage(self):
        return self._storage

    def detach(self):
        return Tensor(self.shape, self.dtype, self.device, storage=self._storage)

    def cpu(self):
        return Tensor(self.shape, self.dtype, "cpu")

    def item(self):
        return 0.0

    def backward(self, retain_graph=False):
        seen, stack = set(), [self.grad_fn]
        while stack:
            fn = stack.pop()
            fn = getattr(fn, "_node", fn)
            if fn is None or id(fn) in seen:
                continue
            seen.add(id(fn))
            if fn._released and fn._saved:
                raise RuntimeError(FREED)
            if not retain_graph:
                fn._release()
            stack.extend(n for n, _ in fn.next_functions)

    def __add__(self, other):
        return add(self, other)

    def __mul__(self, other):
        return mul(self, other)


class Parameter(Tensor):
    def __init__(self, shape, dtype=float32, device="cuda"):
        super().__init__(shape, dtype, device, requires_grad=True)


class Node:
    """A grad_fn: `_saved_<name>` reads its saved tensors."""

    def __init__(self, name, inputs, saved):
        self._name = name
        self._edges = tuple((_edge(t), 0) for t in inputs)
        self._saved = dict(saved)
        self._released = False

    @property
    def next_functions(self):
        # A new Python object for each node at each access, as PyTorch's
        # C++ nodes give: a walk that keys nodes by id() must keep them.
        return tuple((None if n is None else _ref_of(n), i) for n, i in self._edges)

    def name(self):
        return self._name

    def _release(self):
        self._released = True
        self._saved = {k: None for k in self._saved}

    def save_with_hooks(self, key, packed, unpack):
        """`key` saved under a `saved_tensors_hooks` pair: the graph keeps
        what the pack hook returned (`packed`); reading `_saved_<key>` runs
        `unpack(packed)`, as PyTorch's SavedVariable does."""
        self.__dict__.setdefault("_hooks", {})[key] = unpack
        self._saved[key] = packed

    def __getattr__(self, attr):
        raw = attr.startswith("_raw_saved_")
        if attr.startswith("_saved_") or raw:
            saved = self.__dict__.get("_saved", {})
            key = attr[len("_raw_saved_" if raw else "_saved_"):]
            if key in saved:
                if self.__dict__.get("_released"):
                    raise RuntimeError(FREED)
                unpack = self.__dict__.get("_hooks", {}).get(key)
                if raw:
                    return _SavedTensor(saved[key], unpack)
                return unpack(saved[key]) if unpack else saved[key]
        raise AttributeError(attr)

    def __dir__(self):
        return list(super().__dir__()) + ["_saved_" + k for k in self._saved]


class _SavedTensor:
    """`node._raw_saved_<name>` (torch._C._autograd.SavedTensor): what the
    graph keeps (`data`) and the unpack hook, or None."""

    def __init__(self, data, unpack_hook):
        self.data = data
        self.unpack_hook = unpack_hook


class _NodeRef:
    """A fresh handle on a Node (what `next_functions` hands out)."""

    def __init__(self, node):
        self._node = node

    def name(self):
        return self._node.name()

    @property
    def next_functions(self):
        return self._node.next_functions

    def __getattr__(self, attr):
        return getattr(self.__dict__["_node"], attr)

    def __dir__(self):
        return dir(self._node)


_ref_classes = {}


def _ref_of(node):
    """A handle of a class per node class, as each PyTorch node class is its own."""
    kind = type(node)
    cls = _ref_classes.get(kind)
    if cls is None:
        cls = _ref_classes[kind] = type(kind.__name__, (_NodeRef,), {})
    return cls(node)


class AccumulateGrad(Node):
    def __init__(self, variable):
        super().__init__("AccumulateGrad", [], {})
        self.variable = variable


_accumulators = weakref.WeakKeyDictionary()


def _edge(t):
    if t.grad_fn is not None:
        return t.grad_fn
    if t.requires_grad:
        acc = _accumulators.get(t)
        if acc is None:
            acc = _accumulators[t] = AccumulateGrad(t)
        return acc
    return None


_node_classes = {}


def _node_class(name):
    """Each backward function is its own class, as PyTorch generates them
    (`type(t.grad_fn).__name__ == "MmBackward0"`)."""
    cls = _node_classes.get(name)
    if cls is None:
        cls = _node_classes[name] = type(name, (Node,), {})
    return cls


def _result(shape, inputs, name, saved):
    out = Tensor(shape, inputs[0].dtype, inputs[0].device)
    if any(t.requires_grad for t in inputs):
        out.requires_grad = True
        out.grad_fn = _node_class(name)(name, inputs, saved)
    return out


def add(a, b):
    return _result(a.shape, [a, b], "AddBackward0", {"alpha": 1})


def mul(a, b):
    return _result(a.shape, [a, b], "MulBackward0", {"self": a, "other": b})


def mm(a, b):
    return _result((a.shape[0], b.shape[1]), [a, b], "MmBackward0", {"self": a, "mat2": b})


def relu(a):
    out = _result(a.shape, [a], "ReluBackward0", {})
    if out.grad_fn is not None:
        out.grad_fn._saved["result"] = out.detach()
    return out


def sum(a):  # noqa: A001  (torch.sum)
    return _result((), [a], "SumBackward0", {"self_sym_sizes": a.shape})


def randn(*shape, device="cuda", requires_grad=False):
    return Tensor(shape, float32, device, requires_grad)
