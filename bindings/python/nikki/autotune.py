"""``nikki.autotune``: pick a kernel's fastest configuration by estimated time, without hardware.

    @nikki.autotune(configs=[dict(tile=128, bufs=2), dict(tile=512, bufs=2), dict(tile=512, bufs=3)])
    @nki.jit
    def kernel(a, b, tile=128, bufs=2):
        ...

    out = kernel(a, b)                    # runs with the configuration estimated fastest for a, b
    print(kernel.report(a, b))            # the table it considered

Each configuration's keyword arguments are passed to the kernel (they must be trace-time
parameters: tile sizes, buffer counts, loop orders). On the first call for a shape key (every
tensor argument's shape and dtype, and the other arguments' values) every configuration is
compiled and estimated by nikki's timing model on the target; a configuration the kernel rejects
(a KernelError: too much SBUF, a bad tile) is recorded with its error and skipped. The choice is
remembered per shape key in memory and in the disk compile cache (NIKKI_CACHE_DIR, category
``autotune``; keyed by nikki's build, the kernel's source, the configurations and the target), so a
later process reuses it without estimating again.
"""

from __future__ import annotations

import hashlib
import inspect
import json

from . import _core, profiling
from .entry import as_kernel
from .errors import KernelError
from .kernel import _resolve_target

__all__ = ["autotune", "Autotuned"]


def _shape_key(args, kwargs) -> tuple:
    """Shapes and dtypes of tensor arguments, values of the others (in call order)."""
    def one(v):
        shape = getattr(v, "shape", None)
        if shape is not None and hasattr(v, "dtype"):
            return ("tensor", tuple(int(d) for d in shape), str(getattr(v.dtype, "name", v.dtype)))
        return ("value", repr(v))
    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()))


def _source_of(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):  # defined interactively: its bytecode and constants stand for it
        code = fn.__code__
        return repr((code.co_code, code.co_consts))


class Autotuned:
    """A kernel with a list of configurations; calling it runs the fastest for the arguments' shapes."""

    def __init__(self, kernel, configs, target=None):
        self.kernel = as_kernel(kernel)
        self.configs = [dict(c) for c in configs]
        self.target = target
        self._choices: dict = {}  # shape key -> (index of the best config, table)
        fn = self.kernel.fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)
        identity = getattr(self.kernel, "cache_identity", None)
        code = identity() if identity is not None else _source_of(fn)
        self._identity = hashlib.sha256((code + repr(self.configs) + repr(target)).encode()).hexdigest()

    def __call__(self, *args, **kwargs):
        return self.kernel(*args, **kwargs, **self.best_config(*args, **kwargs))

    def best_config(self, *args, **kwargs) -> dict:
        """The configuration estimated fastest for these arguments (estimating them on the first call)."""
        return dict(self.configs[self._choose(args, kwargs)[0]])

    def table(self, *args, **kwargs) -> list:
        """[(config, estimated µs or None, error or None)] for these arguments, in the order given."""
        return list(self._choose(args, kwargs)[1])

    def report(self, *args, **kwargs) -> str:
        """The table considered for these arguments as text, the chosen configuration marked."""
        best, table = self._choose(args, kwargs)
        lines = [f"autotune {self.__name__}: {len(table)} configurations, estimated "
                 "(nikki's timing model, not measurements)"]
        for i, (config, us, error) in enumerate(table):
            mark = "->" if i == best else "  "
            what = f"{us:12.3f} us" if us is not None else f"rejected: {error}"
            lines.append(f"{mark} {json.dumps(config, sort_keys=True):<48} {what}")
        return "\n".join(lines)

    def _choose(self, args, kwargs) -> tuple:
        clash = sorted(set(kwargs) & set().union(*self.configs)) if self.configs else []
        if clash:
            raise TypeError(f"autotune {self.__name__}: {', '.join(clash)} is set by the configurations; "
                            "do not pass it in the call")
        target = _resolve_target(self.target or self.kernel.target or self.kernel.options.get("platform_target"))
        key = (target,) + _shape_key(args, kwargs)
        found = self._choices.get(key)
        if found is None:
            found = self._load(key)
        if found is None:
            found = self._estimate(args, kwargs)
            self._store(key, found)
        self._choices[key] = found
        return found

    def _estimate(self, args, kwargs) -> tuple:
        table: list[tuple[dict, float | None, str | None]] = []
        first_error: KernelError | None = None
        for config in self.configs:
            try:
                us = profiling.estimate(self.kernel, *args, target=self.target, **kwargs, **config).total_us
                table.append((config, us, None))
            except KernelError as err:
                first_error = first_error or err
                table.append((config, None, err.summary if hasattr(err, "summary") else str(err)))
        timed = {i: us for i, (_, us, _) in enumerate(table) if us is not None}
        if not timed:
            if first_error is not None and len({e for _, _, e in table}) == 1:
                raise first_error  # the arguments are wrong whatever the configuration: say it as the kernel does
            reasons = "; ".join(f"{json.dumps(c, sort_keys=True)}: {e}" for c, _, e in table)
            raise KernelError(f"autotune {self.__name__}: no configuration compiles for these arguments ({reasons})")
        best = min(timed, key=timed.__getitem__)
        return best, table

    def _cache_key(self, key) -> bytes:
        return (self._identity + repr(key)).encode()

    def _load(self, key):
        payload = _core.cache_load("autotune", self._cache_key(key))
        if payload is None:
            return None
        try:
            saved = json.loads(payload.decode())
            table = [(c, us, err) for c, us, err in saved["table"]]
            if [c for c, _, _ in table] != self.configs:
                return None
            return saved["best"], table
        except (ValueError, KeyError, TypeError):
            return None  # an entry of another layout: estimate again and overwrite it

    def _store(self, key, found) -> None:
        best, table = found
        _core.cache_store("autotune", self._cache_key(key),
                          json.dumps({"best": best, "table": [list(row) for row in table]}).encode())


def autotune(configs, target=None):
    """Decorator over an ``@nki.jit`` kernel: ``configs`` is a list of dicts of keyword arguments
    (tile sizes, buffer counts); each call runs the configuration with the lowest estimated time
    for its arguments' shapes (see the module docstring). ``target`` ("trn1"/"trn2") estimates for
    another target than the kernel's."""
    configs = list(configs)
    if not configs or not all(isinstance(c, dict) for c in configs):
        raise TypeError("nikki.autotune(configs=...): a non-empty list of dicts of keyword arguments, "
                        "e.g. [dict(tile=128), dict(tile=512)]")

    def wrap(kernel):
        return Autotuned(kernel, configs, target)
    return wrap
