"""CUDA autocast for the simulated GPU (meta tensors never carry the
autocast key): PyTorch's policies, sent by vramscope, applied in the
function mode (`_autocast_handlers`) and, for the ops a backward formula
calls, in the dispatch mode (`_dispatch_autocast`), with autocast's cache
of weight casts (`_CastCache`).
"""

import weakref

from ._session import _state


class _backward_autocast:
    """A backward runs under the autocast of the code that called it: the
    engine carries the caller's thread-local state to the thread that runs
    the graph, so the ops its backward formulas call pass autocast's
    wrappers (a half gradient's `sum_to` sums into fp32, then
    validate_outputs casts it back). Kept for the length of the call."""

    def __init__(self, torch):
        self.torch = torch

    def __enter__(self):
        torch = self.torch
        self.saved = _state.backward_autocast
        if torch.is_autocast_enabled("cuda"):
            _state.backward_autocast = (
                torch.get_autocast_dtype("cuda"),
                torch.is_autocast_cache_enabled(),
            )
        else:
            _state.backward_autocast = None
        return self

    def __exit__(self, *exc):
        _state.backward_autocast = self.saved
        return False


class _CastCache:
    """Autocast's cache of weight casts (autocast_mode.cpp `cached_cast`):
    an fp32 leaf that requires grad is cast once per region; the cast lives
    until the outermost `autocast` exits (`torch.clear_autocast_cache`)."""

    def __init__(self):
        self.casts = {}

    def get(self, t):
        hit = self.casts.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        return None

    def put(self, t, cast):
        self.casts[id(t)] = (weakref.ref(t), cast)

    def clear(self):
        self.casts.clear()


def _autocast_handlers(torch, handlers):
    """CUDA autocast for the simulated GPU. Autocast is a dispatch key that
    meta tensors never carry, so its policies (sent by vramscope, PyTorch
    2.11's lists) run here, above autograd as on a GPU: the casts are in the
    graph, weight casts cached, arguments cast right to left (GCC's order of
    the wrapper's call arguments)."""
    table = _state.autocast
    if not table:
        return set()
    import torch.nn.functional as F

    cache = _CastCache()
    clear = torch.clear_autocast_cache

    # PyTorch's signature: torch._dynamo checks it.
    def clear_autocast_cache() -> None:
        cache.clear()
        clear()

    torch.clear_autocast_cache = clear_autocast_cache
    fp32 = torch.float32

    # CUDA's autocast, asked with no argument (the CUDA one, in every
    # release since 2.0): `"cuda"` would be parsed to a device at every call,
    # and the policies ask at every op of their lists (a GEMM's `matmul`).
    enabled = torch.is_autocast_enabled

    def active():
        return enabled()

    def eligible(t):
        return (
            isinstance(t, torch.Tensor)
            and t.is_meta
            and t.is_floating_point()
            and t.dtype != torch.float64
        )

    def cast(t, to):
        if not eligible(t) or t.dtype == to:
            return t
        lower = torch.get_autocast_dtype("cuda")
        cacheable = (
            to == lower
            and t.dtype == fp32
            and t.requires_grad
            and t.is_leaf
            and not t._is_view()
            and torch.is_autocast_cache_enabled()
        )
        if cacheable:
            hit = cache.get(t)
            if hit is not None:
                return hit
        c = t.to(to)
        if cacheable:
            cache.put(t, c)
        return c

    def cast_args(args, kwargs, to):
        # Right to left: keyword arguments come after the positional ones.
        kw = dict(kwargs)
        for k in reversed(list(kw)):
            kw[k] = cast_value(kw[k], to)
        out = list(args)
        for i in range(len(out) - 1, -1, -1):
            out[i] = cast_value(out[i], to)
        return out, kw

    def cast_value(v, to):
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return type(v)(reversed([cast(x, to) for x in reversed(v)]))
        return cast(v, to)

    def policy(to_of):
        def h(func, args, kwargs):
            if not enabled():
                return func(*args, **kwargs)
            to = to_of(args, kwargs)
            if to is None:
                return func(*args, **kwargs)
            a, kw = cast_args(args, kwargs, to)
            return func(*a, **kw)

        return h

    def lower(args, kwargs):
        return torch.get_autocast_dtype("cuda")

    def widest(args, kwargs):
        ts = [x for x in list(args) + list(kwargs.values()) if eligible(x)]
        for v in list(args) + list(kwargs.values()):
            if isinstance(v, (list, tuple)):
                ts.extend(x for x in v if eligible(x))
        if not ts:
            return None
        to = ts[0].dtype
        for t in ts[1:]:
            to = torch.promote_types(to, t.dtype)
        return to

    def unless_dtype(inner):
        def h(func, args, kwargs):
            given = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args[1:])
            x = args[0] if args else None
            if given or not active() or not eligible(x) or x.dtype == fp32:
                return inner(func, args, kwargs)
            kw = dict(kwargs)
            kw["dtype"] = fp32
            return inner(func, args, kw)

        return h

    def plain(func, args, kwargs):
        return func(*args, **kwargs)

    def banned(message):
        def h(func, args, kwargs):
            if active() and any(eligible(a) for a in args):
                raise RuntimeError(message)
            return func(*args, **kwargs)

        return h

    def cross_entropy(func, args, kwargs):
        # C++ cross_entropy_loss: log_softmax(self, class_dim, self.dtype)
        # keeps the logits' dtype, then nll_loss (fp32 list) casts it up.
        x = args[0] if args else kwargs.get("input")
        if not active() or not eligible(x) or x.dtype == fp32 or kwargs.get("label_smoothing", 0.0):
            return func(*args, **kwargs)
        names = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction")
        a = dict(zip(names, args))
        a.update(kwargs)
        target = a["target"]
        if target.is_floating_point():
            return func(*args, **kwargs)
        dim = 0 if x.dim() == 1 else 1
        logp = torch.log_softmax(x, dim, dtype=x.dtype).to(fp32)
        weight = a.get("weight")
        return F.nll_loss(
            logp,
            target,
            weight=cast(weight, fp32) if weight is not None else None,
            ignore_index=a.get("ignore_index", -100),
            reduction=a.get("reduction", "mean"),
        )

    def resolve(name):
        found = []
        places = [(owner, name) for owner in (torch, torch.Tensor, F, torch._C._nn)]
        if name.startswith("linalg_"):
            places.append((torch.linalg, name[len("linalg_"):]))
        for owner, attr in places:
            f = getattr(owner, attr, None)
            if f is not None and callable(f) and f not in found:
                found.append(f)
        return found

    # The handlers made here: each only calls its function while CUDA's
    # autocast is off.
    made = {cross_entropy}
    for group, h in (
        ("lower", policy(lower)),
        ("fp32", policy(lambda a, k: fp32)),
        ("promote", policy(widest)),
    ):
        made.add(h)
        for name in table.get(group, []):
            for f in resolve(name):
                handlers.setdefault(f, h)
    for name in table.get("fp32_unless_dtype", []):
        for f in resolve(name):
            inner = handlers.get(f, plain)
            handlers[f] = unless_dtype(inner)
            # Around another handler (softmax's half-to-float kernel), the
            # wrapper is more than a policy: never skipped.
            if inner is plain or inner in made:
                made.add(handlers[f])
    for name, message in table.get("banned", {}).items():
        h = banned(message)
        made.add(h)
        for f in resolve(name):
            handlers.setdefault(f, h)
    handlers[F.cross_entropy] = cross_entropy
    _state.autocast_policy_of = _dispatch_autocast(torch, table)
    return made


def _dispatch_autocast(torch, table):
    """Autocast's wrappers for the ops a backward formula calls: they reach
    the dispatch mode only (C++ calls pass no function mode), so the
    policies of `_autocast_handlers` are applied there, by aten op, under
    the autocast the backward inherited (`_backward_autocast`). Returns the
    policy of an op (a function of args, kwargs and the dispatch mode that
    gives them cast), or None."""
    kinds = {}
    for group in ("lower", "fp32", "fp32_unless_dtype", "promote"):
        for name in table.get(group, []):
            kinds.setdefault(name, group)
    fp32 = torch.float32
    f64 = torch.float64
    Tensor = torch.Tensor
    to_copy = torch.ops.aten._to_copy.default
    # Autocast's cast cache is thread-local and only the thread that leaves
    # a region clears its own: casts cached on the engine's thread are
    # never cleared.
    cache = _CastCache()

    def floating(t):
        return isinstance(t, Tensor) and t.is_meta and t.is_floating_point()

    def cast(t, to, mode):
        # cached_cast: eligible (a CUDA floating tensor), never a double.
        if not floating(t) or t.dtype == to or t.dtype == f64:
            return t
        lower, cache_enabled = _state.backward_autocast
        cacheable = (
            cache_enabled and to == lower and t.dtype == fp32
            and t.requires_grad and t.is_leaf and not t._is_view()
        )
        if cacheable:
            hit = cache.get(t)
            if hit is not None:
                return hit
        with mode:
            c = to_copy(t, dtype=to)
        if cacheable:
            cache.put(t, c)
        return c

    def cast_all(args, kwargs, to, mode):
        # Right to left, as `_autocast_handlers` casts.
        kw = dict(kwargs)
        for k in reversed(list(kw)):
            kw[k] = cast_value(kw[k], to, mode)
        out = list(args)
        for i in range(len(out) - 1, -1, -1):
            out[i] = cast_value(out[i], to, mode)
        return tuple(out), kw

    def cast_value(v, to, mode):
        if isinstance(v, (list, tuple)) and any(isinstance(x, Tensor) for x in v):
            return type(v)(reversed([cast(x, to, mode) for x in reversed(v)]))
        return cast(v, to, mode)

    def tensors(args, kwargs):
        for v in list(args) + list(kwargs.values()):
            if isinstance(v, (list, tuple)):
                yield from (x for x in v if floating(x))
            elif floating(v):
                yield v

    def lower(args, kwargs, mode):
        return cast_all(args, kwargs, _state.backward_autocast[0], mode)

    def to_fp32(args, kwargs, mode):
        return cast_all(args, kwargs, fp32, mode)

    def promote(args, kwargs, mode):
        to = None
        for t in tensors(args, kwargs):
            to = t.dtype if to is None else torch.promote_types(to, t.dtype)
        if to is None:
            return args, kwargs
        return cast_all(args, kwargs, to, mode)

    def opt_dtype(func):
        # fp32_set_opt_dtype: the op's optional dtype set to fp32 when it is
        # not given and the first argument is a CUDA floating tensor.
        names = [a.name for a in func._schema.arguments]
        if "dtype" not in names:
            return None
        i = names.index("dtype")

        def h(args, kwargs, mode):
            if not (args and floating(args[0])):
                return args, kwargs
            if i < len(args):
                if args[i] is not None:
                    return args, kwargs
                a = list(args)
                a[i] = fp32
                return tuple(a), kwargs
            if kwargs.get("dtype") is not None:
                return args, kwargs
            kw = dict(kwargs)
            kw["dtype"] = fp32
            return args, kw

        return h

    def policy_of(func):
        kind = kinds.get(getattr(func, "_opname", ""))
        if kind is None or "out" in func._overloadname:
            return None
        if kind == "fp32_unless_dtype":
            return opt_dtype(func)
        return {"lower": lower, "fp32": to_fp32, "promote": promote}[kind]

    return policy_of
