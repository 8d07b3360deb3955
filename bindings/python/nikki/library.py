"""Library kernels: the prebuilt C++ kernels of nikki's registry as callable kernels.

A :class:`LibraryKernel` behaves like an ``@nki.jit`` kernel (same specialization cache, launch
path, ``nikki.estimate`` / ``nikki.profile`` support), but its body is the C++ kernel of the
registry instead of a traced Python function. Called inside another kernel being traced, it inlines
its body there.
"""

from __future__ import annotations

import inspect
import itertools
import re

from . import _core
from .arguments import EXACT_INT_LIMIT, argument_error, check_bool, check_int, check_real, is_real
from .dtypes import to_dtype
from .errors import KernelError, user_frame
from .kernel import Kernel, _TensorArg, _for_user
from .tensor import NkiTensor
from .tracing import maybe_current

__all__ = ["LibraryKernel", "library_kernels", "doc_section", "kernels_table"]


class LibraryKernel(Kernel):
    """One kernel of nikki's library, e.g. ``nikki.kernels.softmax``.

    Calling it runs the kernel on numpy arrays or torch CPU tensors (outputs of the inputs' kind);
    tensor inputs come first, then the kernel's scalar parameters (keyword or positional).
    """

    def __init__(self, info: dict, target=None):
        self.info = info
        self.name = info["name"]
        self.inputs = tuple(info["inputs"])
        self.outputs = tuple(info["outputs"])
        self.saved_outputs = tuple(info["saved_outputs"])
        self.backward = info["backward"] or None
        self.param_kinds = {name: kind for name, kind, _default, _doc in info["params"]}
        params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in self.inputs]
        params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
                   for name, _kind, default, _doc in info["params"]]
        # A Kernel of a stub function with the library kernel's name, docstring and signature: the
        # same binding, caching and launching as an @nki.jit kernel.
        super().__init__(_named_stub(self.name, self._doc(), inspect.Signature(params)), target)
        # Inputs updated in place (a KV cache): written into the caller's arrays, not returned.
        self.updated_inputs = tuple(info["updated_inputs"])
        self._mutable = {self.inputs.index(name) for name in self.updated_inputs}
        # Tiling parameters a call may leave to nikki (0 = choose): parameter -> candidate values.
        self.tuning: dict = dict(info.get("tuning", {}))
        self._autotuners: dict = {}  # the parameters left to choose -> their nikki.autotune

    def _doc(self) -> str:
        lines = [self.info["doc"]]
        if self.info["params"]:
            lines += ["", "Parameters:"]
            for name, kind, default, doc in self.info["params"]:
                lines.append(f"    {name} ({kind}, default {default!r}): {doc}")
        lines += ["", f"Returns {', '.join(self.outputs)}" + (" (a tuple)." if len(self.outputs) > 1 else ".")]
        if self.info["updated_inputs"]:
            lines.append(f"Updates {', '.join(self.info['updated_inputs'])} in place.")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<nikki library kernel {self.name}>"

    def with_target(self, target: str) -> "LibraryKernel":
        return LibraryKernel(self.info, target)

    def __getitem__(self, grid):
        raise KernelError(f"library kernel '{self.name}' has no SPMD launch grid",
                          hint=f"call nikki.kernels.{self.name}(...) directly")

    def __call__(self, *args, **kwargs):
        ctx = maybe_current()
        if ctx is None:
            if self.tuning:
                args, kwargs = self._with_tuned_params(args, kwargs)
            return super().__call__(*args, **kwargs)
        return self._inline(ctx, self._bind(args, kwargs))

    # --- autotuning -------------------------------------------------------------------------
    def _with_tuned_params(self, args, kwargs) -> tuple:
        """(args, kwargs) of the call with each tuned parameter it leaves at 0 set to the value
        estimated fastest for its shapes (``nikki.autotune`` over the registry's candidates, the
        choice cached per shape key). Calls that set every tuned parameter pass unchanged."""
        try:
            free, call = self._free_tuned_params(args, kwargs)
        except TypeError:
            return args, kwargs  # a bad call: the launch reports it
        if not free:
            return args, kwargs
        return (), {**call, **self._autotuner(free).best_config(**call)}

    def _free_tuned_params(self, args, kwargs) -> tuple:
        """The tuned parameters the call leaves at 0, and its other arguments as keywords."""
        call = dict(self._signature.bind(*args, **kwargs).arguments)
        free = tuple(n for n in self.tuning if type(call.get(n, 0)) is int and call.get(n, 0) == 0)
        for n in free:
            call.pop(n, None)
        return free, call

    def _autotuner(self, free: tuple):
        from .autotune import Autotuned  # autotune estimates through this module's kernels

        tuner = self._autotuners.get(free)
        if tuner is None:
            configs = [dict(zip(free, values)) for values in itertools.product(*(self.tuning[n] for n in free))]
            tuner = self._autotuners[free] = Autotuned(self, configs)
        return tuner

    def autotune_table(self, *args, **kwargs) -> list:
        """[(choice, estimated µs or None, error or None)] of the tiling choices considered for these
        arguments (the tuned parameters the call leaves at 0), in the registry's order."""
        return self._tuning_for(args, kwargs, "table")

    def autotune_report(self, *args, **kwargs) -> str:
        """The tiling choices considered for these arguments as text, the chosen one marked."""
        return self._tuning_for(args, kwargs, "report")

    def _tuning_for(self, args, kwargs, what: str):
        if not self.tuning:
            raise KernelError(f"kernel '{self.name}' has no tuned parameters", hint="it has no tiling choice to make")
        free, call = self._free_tuned_params(args, kwargs)
        if not free:
            raise KernelError(f"kernel '{self.name}': every tuned parameter ({', '.join(self.tuning)}) is set "
                              "in this call, so nothing is chosen", hint="leave them at 0 to let nikki choose")
        return getattr(self._autotuner(free), what)(**call)

    def cache_identity(self) -> str:
        """What identifies this kernel's code in the disk cache (its C++ body is part of nikki's build)."""
        return f"nikki library kernel {self.name}"

    # --- specialization ---------------------------------------------------------------------
    def param_values(self, values) -> dict:
        """The scalar parameters of a bound call as the registry takes them (validated)."""
        out: dict[str, float | None] = {}
        for name, value in zip(self._signature.parameters, values):
            if name not in self.param_kinds:
                continue
            kind = self.param_kinds[name]
            what = f"kernel '{self.name}': parameter '{name}'"
            if kind == "bool":
                out[name] = float(check_bool(value, what))
            elif kind == "int":
                out[name] = float(check_int(value, what, -EXACT_INT_LIMIT, EXACT_INT_LIMIT))
            elif value is None and kind == "float?":
                out[name] = None
            elif kind == "float?" and not is_real(value):
                raise argument_error(what, "a finite number or None", value)
            else:
                out[name] = check_real(value, what, finite=True)
        return out

    def _trace(self, specs, target, grid, program_ids, sanitize: bool = False):
        tensors = []
        for name, spec in zip(self.inputs, specs):
            if not isinstance(spec, _TensorArg):
                raise KernelError(f"kernel '{self.name}': input '{name}' must be an array or tensor, "
                                  f"got {type(spec).__name__}")
            self._check_input_dtype(name, spec.dtype)
            tensors.append((list(spec.shape), spec.dtype.core))
        try:
            kernel = _core.trace_library(self.name, tensors, self.param_values(specs), target)
        except KernelError as err:
            raise _naming_the_input(err, self.inputs, specs) from None
        output_specs = [(tuple(shape), to_dtype(dt)) for shape, dt in kernel.output_specs()]
        return kernel, (output_specs, [("output", k) for k in range(len(output_specs))])

    def _check_input_dtype(self, name: str, dtype) -> None:
        """A KernelError naming the input when no input of the kernel takes its dtype (the engines
        would reject it deep inside the kernel, naming an instruction's operand instead)."""
        if dtype.core not in self.info["dtypes"]:
            taken = ", ".join(d.name for d in self.info["dtypes"])
            raise KernelError(f"kernel '{self.name}': input '{name}' has dtype {dtype.name}",
                              limit=f"{self.name} takes {taken}", hint="convert the input to one of these dtypes")

    def _inline(self, ctx, values):
        views = []
        for name, v in zip(self.inputs, values):
            if not isinstance(v, NkiTensor):
                raise KernelError(f"kernel '{self.name}': input '{name}' must be a tensor, got {type(v).__name__}")
            self._check_input_dtype(name, v.dtype)
            views.append(v._view)
        try:
            results = _core.inline_library(ctx.builder, self.name, views, self.param_values(values))
        except KernelError as err:
            raise _for_user(err, user_frame(2)) from None  # at the kernel's line that calls the library
        tensors = tuple(NkiTensor(ctx, view) for view in results)
        return tensors[0] if len(tensors) == 1 else tensors


def _naming_the_input(err: KernelError, names, specs) -> KernelError:
    """`err`, a library kernel's check of its inputs, naming the input it is about when it does not:
    the C++ checks quote an input by its dtype and shape ("got bfloat16[1]"), which identifies it."""
    summary = err.summary
    if any(re.search(rf"\b{re.escape(name)}\b", summary) for name in names):
        return err
    described = {name: f"{spec.dtype.name}[{', '.join(str(d) for d in spec.shape)}]"
                 for name, spec in zip(names, specs) if isinstance(spec, _TensorArg)}
    matches = [name for name, text in described.items() if text in summary]
    if not matches:
        return err
    which = " or ".join(f"'{name}'" for name in matches)
    return KernelError(f"argument {which} ({described[matches[0]]}): {summary}", limit=err.limit, hint=err.hint)


def _named_stub(name: str, doc: str, signature: inspect.Signature):
    def stub(*args, **kwargs):
        raise RuntimeError("library kernels run through their LibraryKernel object")

    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = doc
    stub.__signature__ = signature  # type: ignore[attr-defined]
    return stub


_registry: dict | None = None


def library_kernels() -> dict:
    """name -> LibraryKernel for every kernel of the registry (forward and backward)."""
    global _registry
    if _registry is None:
        _registry = {info["name"]: LibraryKernel(info) for info in _core.library_kernels()}
    return _registry


def doc_section(doc: str, section: str) -> str:
    """One section of a library kernel's documentation ("Dimensions", "Args", ...), its lines
    joined into one paragraph."""
    lines, inside = [], False
    for line in doc.splitlines():
        head = line.split(":", 1)[0]
        if line[:1] not in (" ", "") and ":" in line and " " not in head:
            inside = head == section
            line = line.split(":", 1)[1]
        if inside:
            lines.append(line.strip())
    return " ".join(x for x in lines if x)


def kernels_table() -> str:
    """The markdown table of docs/kernels.md: every registered kernel with its dimensions, dtypes
    and how it is differentiated. Generated from the registry (``nikki kernels --markdown``)."""
    kernels = library_kernels()
    rows = ["| kernel | dimensions | dtypes | gradient |", "|--------|------------|--------|----------|"]
    for name in sorted(kernels):
        info = kernels[name].info
        backward_of = [k for k, other in kernels.items() if other.info["backward"] == name]
        if info["backward"]:
            gradient = f"`{info['backward']}`"
        elif backward_of:
            gradient = f"(the backward of `{backward_of[0]}`)"
        else:
            gradient = info["gradient"]
        dtypes = ", ".join(_SHORT_DTYPE.get(d.name, d.name) for d in info["dtypes"])
        dims = doc_section(info["doc"], "Dimensions").replace("|", "\\|")
        rows.append(f"| `{name}` | {dims} | {dtypes} | {gradient} |")
    return "\n".join(rows) + "\n"


_SHORT_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
