"""Which Python names hold the CUDA tensors that grew (PROTOCOL.md `holders`).

At a step boundary where the job's allocated memory grew (or when
`vramscope attach` asks), in the job's own thread and never inside the
allocator's callback, the helper walks from the job's roots — the locals of
its frames (the innermost user frame first), then the module globals of
`__main__` and of the modules those frames run in — through containers
(dict, list, tuple, deque, set), object attributes (`__dict__`, an
`nn.Module`'s submodules and hooks), functions' closures, bound methods and
`functools.partial`s, to the CUDA tensors they reach. A tensor bound to a
name or an attribute is held by that name; one inside a container is held
by the container. What a holder keeps is its tensors' storages plus the
saved tensors their graphs keep (found through `grad_fn`: `next_functions`
and the `_saved_*` attributes; a saved tensor that is a parameter is the
model's, not the graph's). A holder that grew since the last walk is sent as
a chain:

    train.py:42 in train: self.history (list, 1,601 items) → [1600]: 0-dim
    tensor float32, grad_fn=AddBackward0, its graph keeps 12.3 MiB of saved tensors

with the fix that fits the holder (a hook's handle, a closure, a framework's
container, an accumulator). Parameters, buffers and optimizer state are the
model's own: counted, never reported. The walk stops at its budget
(`budget_ms`, 25 ms by default) and says whether it was complete.

`vramscope trace` runs this same file inside a traced program (written
beside its helper as `vramscope_trace_holders.py`), with meta tensors as the
device's (`is_device`) and its own helper's frames skipped (`skip_files`).

Pure standard library; `torch` is passed in.
"""

import collections
import functools
import gc
import os
import sys
import sysconfig
import time
import types

DEFAULT_BUDGET_MS = 25.0
MAX_CHAINS = 8
MAX_DEPTH = 12
MAX_LABEL = 80
# How often the walk looks at the clock (objects visited between looks).
CLOCK_EVERY = 64
# A container longer than this is looked into only if the items at its two
# ends hold tensors or containers (a dataset's million strings is not).
LARGE = 4096
SAMPLE = 32
# Nodes of the graphs of one holder walked at most.
MAX_GRAPH_NODES = 20000
FRAMEWORKS = ("lightning", "pytorch_lightning", "torchmetrics", "wandb", "transformers",
              "accelerate", "ignite", "fastai", "tensorboard", "mlflow", "neptune", "comet_ml")
HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), range, slice)
# A tensor reached through one of these links is held by the name itself.
_NAMED = ("name", "attr", "self", "closure", "hook")


class _Link:
    """One step of a chain: how the next object is reached from this one."""

    __slots__ = ("label", "kind")

    def __init__(self, label, kind):
        self.label = label
        self.kind = kind  # root, name, attr, index, key, closure, hook, self


def _short(text):
    text = str(text)
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def _skip_dirs(torch):
    """Frames in these folders are not the user's: this package, torch's,
    and the interpreter's library and site-packages."""
    dirs = [os.path.dirname(os.path.abspath(__file__))]
    torch_file = getattr(torch, "__file__", None)
    if torch_file:
        dirs.append(os.path.dirname(os.path.abspath(torch_file)))
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = paths.get(key)
        if p:
            dirs.append(os.path.abspath(p))
    return tuple(d.rstrip(os.sep) + os.sep for d in dirs)


def _user_file(filename, skip, skip_files=()):
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    return path not in skip_files and not any(path.startswith(d) for d in skip)


def _framework(obj):
    """The framework an object belongs to (its class's top-level module)."""
    top = (getattr(type(obj), "__module__", "") or "").split(".", 1)[0]
    return top if top in FRAMEWORKS else None


def _instance_dict(obj):
    """`obj.__dict__`, read as `object.__getattribute__` reads it: never
    through the class's own `__getattr__`, which may load, fetch or raise
    (a ctypes library loader loads a library named after the attribute)."""
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:
        return None
    return d if isinstance(d, dict) else None


class _Holder:
    __slots__ = ("path", "container", "framework", "tensors", "storages", "bytes", "graph",
                 "graph_complete")

    def __init__(self, path, container, framework):
        self.path = path
        self.container = container
        self.framework = framework
        self.tensors = []  # (link, tensor)
        self.storages = set()
        self.bytes = 0
        self.graph = 0
        self.graph_complete = True

    def keeps(self):
        """Its tensors' storages and the saved tensors their graphs keep."""
        return self.bytes + self.graph


class Walker:
    """One walk: what it reached, by holder."""

    def __init__(self, torch, budget_s, is_device=None):
        self.torch = torch
        # What counts as a device tensor: CUDA's, or, for `vramscope
        # trace`, the meta tensors that stand for them.
        self.is_device = is_device
        self.deadline = time.perf_counter() + budget_s
        self.complete = True
        self.visited = {}
        self.holders = {}  # key -> _Holder
        self.param_storages = set()
        self.steps = 0
        nn = getattr(torch, "nn", None)
        self.Tensor = getattr(torch, "Tensor", None)
        self.Parameter = getattr(nn, "Parameter", None)
        self.Module = getattr(nn, "Module", None)
        self.Optimizer = getattr(getattr(torch, "optim", None), "Optimizer", None)

    def out_of_time(self):
        self.steps += 1
        if self.steps % CLOCK_EVERY == 0 and time.perf_counter() > self.deadline:
            self.complete = False
        return not self.complete

    def is_cuda_tensor(self, obj):
        if self.Tensor is None or not isinstance(obj, self.Tensor):
            return False
        if self.is_device is not None:
            return bool(self.is_device(obj))
        return bool(getattr(obj, "is_cuda", False))

    def is_parameter(self, t):
        """A parameter, a leaf that requires grad, or a view of one (what
        `Linear` saves is `weight.t()`)."""
        base = getattr(t, "_base", None)
        if base is not None:
            t = base
        if self.Parameter is not None and isinstance(t, self.Parameter):
            return True
        return bool(getattr(t, "is_leaf", False)) and bool(getattr(t, "requires_grad", False))

    @staticmethod
    def storage(t):
        """(the storage's identity, its bytes). The identity is the C++
        storage (`_cdata`), which views share: a meta tensor's `data_ptr()`
        is 0 for every storage (`vramscope trace`); where `_cdata` is
        missing, the data pointer."""
        try:
            st = t.untyped_storage()
            key = getattr(st, "_cdata", None)
            if key is None:
                key = st.data_ptr()
            return int(key), int(st.nbytes())
        except Exception:
            return None

    # ------------------------------------------------------------ the walk

    def walk(self, roots):
        """`roots`: [(label, key, names, own)]: a frame's locals or a module's
        globals, innermost frame first. Each root is walked breadth first
        before the next, so the frame that runs the loop is covered before
        the budget goes to outer frames and modules."""
        for label, key, names, own in roots:
            if not self.complete:
                return
            queue = collections.deque()
            root = (_Link(label, "root"),)
            for name, value in list(names.items()):
                if isinstance(name, str) and name.startswith("__") and name.endswith("__"):
                    continue
                queue.append((value, root + (_Link(str(name), "name"),), (key, str(name)), own, None, None))
            self.walk_from(queue)

    def walk_from(self, queue):
        while queue:
            if self.out_of_time():
                break
            obj, path, key, own, parent, framework = queue.popleft()
            if self.is_cuda_tensor(obj):
                self.tensor(obj, path, key, own, parent, framework)
                continue
            if isinstance(obj, _ATOMS) or len(path) > MAX_DEPTH:
                continue
            i = id(obj)
            if i in self.visited:
                continue
            self.visited[i] = obj  # kept, so that its id is not reused during the walk
            try:
                fw = framework or _framework(obj)
                for child, link, own_child in self.children(obj, own):
                    queue.append((child, path + (link,), key + (link.label,), own_child, obj, fw))
            except Exception:
                # The program's own object failed to be read (a property or
                # container that raises): what it gave so far is kept, the
                # rest of it is not walked, and the program never sees it.
                continue

    def children(self, obj, own):
        """(child, link, is it the model's own) for what `obj` refers to."""
        if isinstance(obj, (types.ModuleType, type)):
            return
        if self.Optimizer is not None and isinstance(obj, self.Optimizer):
            for v in list(getattr(obj, "state", {}).values()):
                yield v, _Link(".state[…]", "attr"), True
            return
        if isinstance(obj, dict):
            items = list(obj.items())
            if len(items) > LARGE and not self.worth_it([v for _, v in items[:SAMPLE] + items[-SAMPLE:]]):
                return
            for k, v in items:
                yield v, _Link(f"[{_short(repr(k))}]", "key"), own
            return
        if isinstance(obj, (list, tuple, collections.deque)):
            items = list(obj)
            if len(items) > LARGE and not self.worth_it(items[:SAMPLE] + items[-SAMPLE:]):
                return
            for idx, v in enumerate(items):
                yield v, _Link(f"[{idx}]", "index"), own
            return
        if isinstance(obj, (set, frozenset)):
            for v in list(obj):
                yield v, _Link("{…}", "index"), own
            return
        if isinstance(obj, types.MethodType):
            yield obj.__self__, _Link(".__self__", "self"), own
            yield obj.__func__, _Link(".__func__", "attr"), own
            return
        if isinstance(obj, types.FunctionType):
            for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
                try:
                    yield cell.cell_contents, _Link(f"→(closure: {name})", "closure"), own
                except ValueError:  # an empty cell
                    pass
            return
        if isinstance(obj, functools.partial):
            for idx, v in enumerate(obj.args):
                yield v, _Link(f".args[{idx}]", "attr"), own
            for k, v in obj.keywords.items():
                yield v, _Link(f".keywords[{k!r}]", "attr"), own
            return
        if self.Module is not None and isinstance(obj, self.Module):
            for name, v in list(getattr(obj, "__dict__", {}).items()):
                if name in ("_parameters", "_buffers"):
                    for pname, p in list(v.items()):
                        yield p, _Link(f".{pname}", "attr"), True
                elif name == "_modules":
                    for mname, m in list(v.items()):
                        yield m, _Link(f".{mname}", "attr"), own
                elif name in HOOK_DICTS:
                    for hid, h in list(v.items()):
                        yield h, _Link(f".{name}[{hid}]", "hook"), own
                elif not name.startswith("_"):
                    yield v, _Link(f".{name}", "attr"), own
            return
        d = _instance_dict(obj)
        if d is not None:
            for name, v in list(d.items()):
                yield v, _Link(f".{name}", "attr"), own

    def worth_it(self, sample):
        """Whether a long container's ends hold anything that may hold a tensor."""
        return any(not isinstance(v, _ATOMS) for v in sample)

    def tensor(self, t, path, key, own, parent, framework):
        st = self.storage(t)
        if st is None:
            return
        ptr, nbytes = st
        if own or self.is_parameter(t):
            self.param_storages.add(ptr)
            return
        link = path[-1]
        if link.kind in _NAMED:
            hkey, hpath, container = key, path, None
        else:
            hkey, hpath, container = key[:-1], path[:-1], parent
        h = self.holders.get(hkey)
        if h is None:
            h = self.holders[hkey] = _Holder(hpath, container, framework)
        h.tensors.append((link, t))
        if ptr not in h.storages:
            h.storages.add(ptr)
            h.bytes += nbytes

    # ------------------------------------------------------------ graphs

    def graph_bytes(self, tensors):
        """Bytes of the saved tensors and the leaves (with their .grad) the
        graphs of `tensors` keep (not the tensors' own storages, not
        parameters); (bytes, complete)."""
        seen_nodes = {}
        # A tensor's own storage is its holder's bytes, even where its own
        # node saved it (ReLU saves its result).
        seen_storage = {st[0] for st in map(self.storage, tensors) if st is not None}
        total = 0
        complete = True
        stack = [getattr(t, "grad_fn", None) for t in tensors]
        while stack:
            if self.out_of_time() or len(seen_nodes) >= MAX_GRAPH_NODES:
                complete = False
                break
            fn = stack.pop()
            if fn is None or id(fn) in seen_nodes:
                continue
            # Keyed by id() with the node kept: PyTorch makes a new Python
            # object for a graph node at each access, so an id freed here
            # would come back for another node and hide its saved tensors.
            seen_nodes[id(fn)] = fn
            for name in _saved_names(fn):
                try:
                    v = _saved_value(fn, name)
                except Exception:  # freed by a backward ("…after they have already been freed")
                    continue
                for s in v if isinstance(v, (tuple, list)) else (v,):
                    total += self._kept(s, seen_storage)
            # An AccumulateGrad keeps its leaf and the leaf's .grad. A leaf
            # the walk found no name for (it put every named leaf that
            # requires grad with the parameters) lives only as long as a
            # graph that reaches it: WGAN-GP's x_hat of an earlier step.
            leaf = getattr(fn, "variable", None)
            if leaf is not None and not self.is_named_leaf(leaf):
                total += self._kept(leaf, seen_storage, leaf=True)
                total += self._kept(getattr(leaf, "grad", None), seen_storage)
            for nf in getattr(fn, "next_functions", ()) or ():
                if nf and nf[0] is not None:
                    stack.append(nf[0])
        return total, complete

    def is_named_leaf(self, t):
        """A parameter, or a leaf whose storage the walk reached by a name."""
        if self.Parameter is not None and isinstance(t, self.Parameter):
            return True
        st = self.storage(t)
        return st is not None and st[0] in self.param_storages

    def _kept(self, t, seen_storage, leaf=False):
        """The bytes of `t`'s storage, once, unless it is a parameter's or
        not on the device (`leaf`: an unnamed leaf, counted although it
        requires grad)."""
        if t is None or not self.is_cuda_tensor(t) or (not leaf and self.is_parameter(t)):
            return 0
        st = self.storage(t)
        if st is None or st[0] in seen_storage or st[0] in self.param_storages:
            return 0
        seen_storage.add(st[0])
        return st[1]


_SAVED_NAMES = {}


def _saved_value(fn, name):
    """What the graph keeps for saved attribute `name`, read without
    running a `saved_tensors_hooks` unpack hook: non-reentrant
    checkpointing's recomputes the forward (it allocates), an offloading
    one copies back to the device. Where a hook is set, the packed value
    (`_raw_saved_*`'s `data`: what the graph really holds) is read."""
    raw = getattr(fn, "_raw" + name, None)
    if raw is None:
        return getattr(fn, name)
    items = raw if isinstance(raw, (tuple, list)) else (raw,)
    if all(getattr(r, "unpack_hook", None) is None for r in items):
        return getattr(fn, name)
    return [getattr(r, "data", None) for r in items]


def _saved_names(fn):
    kind = type(fn)
    names = _SAVED_NAMES.get(kind)
    if names is None:
        names = tuple(n for n in dir(fn) if n.startswith("_saved_"))
        _SAVED_NAMES[kind] = names
    return names


def roots_from(start_frame, skip, skip_files=()):
    """The walk's roots, innermost user frame first, then module globals.
    `skip_files`: more files whose frames are not the user's (absolute
    paths: `vramscope trace`'s own helper)."""
    roots = []
    modules = []
    f = start_frame
    while f is not None:
        code = f.f_code
        if _user_file(code.co_filename, skip, skip_files):
            if code.co_name != "<module>":
                where = f"{os.path.basename(code.co_filename)}:{f.f_lineno} in {code.co_name}"
                roots.append((where, ("frame", code.co_filename, code.co_name), _locals_of(f), False))
            if all(m is not f.f_globals for m in modules):
                modules.append(f.f_globals)
        f = f.f_back
    main = sys.modules.get("__main__")
    if main is not None and all(m is not vars(main) for m in modules):
        modules.append(vars(main))
    for g in modules:
        name = g.get("__name__", "?")
        file = g.get("__file__")
        label = f"{os.path.basename(file)} (module {name})" if file else f"module {name}"
        roots.append((label, ("module", name), g, False))
    return roots


def _locals_of(frame):
    """A copy of a function frame's locals that leaves nothing behind.

    Before Python 3.13 `frame.f_locals` fills a dict the frame keeps: the
    values it copied stay referenced there until the next read, so a walk
    would itself keep the last step's tensors alive (its graphs, its
    batch) — a leak of one step. The copy is taken and that dict emptied
    (the frame's own variables are not in it; the next read fills it
    afresh). From 3.13 `f_locals` is a view of the variables (PEP 667):
    copied, and never cleared, which would delete them."""
    loc = frame.f_locals
    if type(loc) is dict and loc is not frame.f_globals:
        copy = dict(loc)
        loc.clear()
        return copy
    return dict(loc)


def _describe_tensor(t):
    shape = tuple(getattr(t, "shape", ()))
    dims = "0-dim tensor" if not shape else "tensor [" + "×".join(str(d) for d in shape) + "]"
    dtype = str(getattr(t, "dtype", "")).replace("torch.", "")
    fn = getattr(t, "grad_fn", None)
    text = f"{dims} {dtype}".strip()
    if fn is not None:
        name = fn.name() if hasattr(fn, "name") else type(fn).__name__
        text += f", grad_fn={name}"
    return text


def chain_name(path):
    """A holder's path as the user wrote it: `self.history`, `hist[3]`."""
    text = ""
    for link in path[1:]:
        text += link.label
    return text or path[0].label


def _fix(h, example):
    """The fix that fits the holder, in the user's terms."""
    kinds = [link.kind for link in h.path]
    name = chain_name(h.path)
    zero_dim = not tuple(getattr(example, "shape", ()))
    has_graph = getattr(example, "grad_fn", None) is not None
    if "hook" in kinds:
        return ("a module hook keeps it: remove the hook's handle once done (handle.remove()), "
                "or store out.detach() (or .cpu()) in it")
    if h.framework:
        return (f"{h.framework} keeps what your code hands it: pass .detach() (or .item() for a "
                "number) where you call it, e.g. self.log(\"loss\", loss.detach())")
    if "closure" in kinds:
        return ("a function's closure keeps it: hold a weakref.ref instead, clear the captured "
                "container, or break the reference cycle")
    if h.container is not None:
        what = "x.item()" if zero_dim and has_graph else ("x.detach().cpu()" if has_graph else "x.cpu()")
        if isinstance(h.container, dict):
            return f"{name}[key] = {what}  # a number or a host copy, not the tensor"
        return f"{name}.append({what})  # a number or a host copy, not the tensor"
    if zero_dim and has_graph:
        return f"{name} += x.item()  # an accumulator or EMA of numbers, not of tensors"
    if has_graph:
        return f"{name} = x.detach()  # the value without its graph"
    return f"del {name}  # once it is no longer needed"


def _chain(w, key, h, grew_bytes):
    link, example = h.tensors[-1]
    tensors = [t for _, t in h.tensors]
    graph, graph_complete = h.graph, h.graph_complete
    example_graph, _ = w.graph_bytes([example])
    if h.container is not None:
        kind = type(h.container).__name__
        items = len(h.container) if hasattr(h.container, "__len__") else None
    else:
        kind, items = "name", None
    return {
        "where": h.path[0].label,
        "path": [l.label for l in h.path[1:]],
        "holder": kind,
        "items": items,
        "tensors": len(tensors),
        "bytes": h.bytes,
        "graph_bytes": graph,
        "graph_complete": graph_complete,
        "grew_bytes": grew_bytes,
        "example": None if h.container is None else {
            "link": link.label,
            "what": _describe_tensor(example),
            "graph_bytes": example_graph,
        },
        "what": _describe_tensor(example) if h.container is None else None,
        "fix": _fix(h, example),
    }


def find(torch, start_frame, budget_ms, previous, reason, max_chains=MAX_CHAINS,
         is_device=None, skip_files=()):
    """Walk from `start_frame`, compare with `previous` ({key: bytes} of the
    last walk, or None) and build the `holders` message's fields: the
    holders that grew (or, `reason == "requested"`, the largest). Returns
    (fields, totals), totals being this walk's {key: bytes}.
    `is_device(t)`: whether a tensor is the device's (default: `is_cuda`);
    `skip_files`: files whose frames are not the user's (`roots_from`)."""
    t0 = time.perf_counter()
    w = Walker(torch, max(0.001, float(budget_ms) / 1000.0), is_device)
    gc_was = gc.isenabled()
    gc.disable()  # the collector must not run callbacks while the walk holds references
    try:
        w.walk(roots_from(start_frame, _skip_dirs(torch), tuple(os.path.abspath(f) for f in skip_files)))
        # What each holder's graphs keep: a retained graph grows while its
        # holder's own tensor stays one 0-dim value.
        for h in w.holders.values():
            h.graph, h.graph_complete = w.graph_bytes([t for _, t in h.tensors])
        totals = {key: h.keeps() for key, h in w.holders.items()}
        if not w.complete and previous is not None:
            # What this walk did not reach keeps its last figure: it is not
            # new at the next walk that reaches it.
            totals = {**previous, **totals}
        picked = []
        for key, h in w.holders.items():
            before = None if previous is None else previous.get(key)
            grew = None if before is None else h.keeps() - before
            if reason in ("requested", "oom"):
                picked.append((h.keeps(), key, h, grew))
            elif previous is not None and (grew is None or grew > 0):
                picked.append((h.keeps() if grew is None else grew, key, h, h.keeps() if grew is None else grew))
        picked.sort(key=lambda x: -x[0])
        chains = [_chain(w, key, h, grew) for _, key, h, grew in picked[:max_chains]]
    finally:
        if gc_was:
            gc.enable()
    fields = {
        "reason": reason,
        "budget_ms": float(budget_ms),
        "spent_ms": round((time.perf_counter() - t0) * 1000.0, 3),
        "complete": bool(w.complete),
        "holders_seen": len(w.holders),
        "chains": chains,
    }
    return fields, totals
