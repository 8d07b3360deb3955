"""@nki.jit kernels: specialization on argument shapes and constants, tracing, compiling, caching,
and running on the simulated NeuronCore with numpy arrays or torch CPU tensors."""

from __future__ import annotations

import dis
import functools
import inspect
import itertools
import linecache
import math
import os
import warnings
from typing import Any

import numpy as np

from . import _core, isa
from .arguments import describe, is_int
from .dtypes import from_numpy, from_torch, numpy_dtype, to_dtype, torch_dtype
from .spec import TensorSpec
from .specialization_cache import SpecializationCache
from .errors import (KernelError, SpillWarning, is_internal_frame, kernel_error_at, kernel_error_in_traceback,
                     user_frame,
                     without_internal_frames)
from .tensor import NkiTensor, shared_hbm
from .tracing import TraceContext, maybe_current
from .typing import mutable_tensor

__all__ = ["Kernel", "jit"]

# Callables told of every kernel launch as (kernel, compiled), e.g. by `nikki profile`.
launch_observers: list = []

# The most program instances an SPMD grid may have (docs/decisions.md): each instance is traced,
# compiled and run on its own (milliseconds for the smallest kernel, far more for real ones) and
# keeps its program in memory until the launch ends; NIKKI_MAX_GRID_PROGRAMS raises the limit.
DEFAULT_MAX_GRID_PROGRAMS = 4096


def max_grid_programs() -> int:
    """The grid limit: NIKKI_MAX_GRID_PROGRAMS when set, else the default."""
    value = os.environ.get("NIKKI_MAX_GRID_PROGRAMS", "")
    if not value:
        return DEFAULT_MAX_GRID_PROGRAMS
    if not value.isdigit() or int(value) < 1:
        raise KernelError(f"NIKKI_MAX_GRID_PROGRAMS={value} is not a number of program instances",
                          limit="a positive decimal integer",
                          hint=f"set e.g. NIKKI_MAX_GRID_PROGRAMS=8192, or unset it for {DEFAULT_MAX_GRID_PROGRAMS}")
    return int(value)


def _check_grid(grid: tuple, frame) -> None:
    """A KernelError at `frame` when the grid has more program instances than the limit."""
    programs = 1
    for g in grid:
        programs *= g
    limit = max_grid_programs()
    if programs > limit:
        raise kernel_error_at(frame, f"launch grid {list(grid)} has {programs} program instances, more than "
                              f"nikki runs ({limit})",
                              limit=f"nikki traces, compiles and runs every SPMD instance separately, one after "
                                    f"another; at most {limit} instances (NIKKI_MAX_GRID_PROGRAMS)",
                              hint="launch fewer instances that each do more work (loop over the tiles inside "
                                   "the kernel with nl.affine_range), or raise NIKKI_MAX_GRID_PROGRAMS")


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


class _TensorArg:
    """A kernel argument that becomes an HBM tensor."""

    __slots__ = ("shape", "dtype", "is_torch")

    def __init__(self, shape, dtype, is_torch):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.is_torch = is_torch


class Compiled:
    """One specialization of a kernel: a compiled program per SPMD program instance."""

    def __init__(self, programs, output_specs, writable_inputs, results=None, constants=()):
        self.programs = programs
        # Arrays of nl.shared_constant, bound as the last inputs of every run.
        self.constants = list(constants)
        self.output_specs = output_specs  # [(shape, dtype)] of the shared_hbm outputs
        self.writable_inputs = writable_inputs  # parameter indices the kernel may write
        # What the kernel returns, in order: ("output", k) is output_specs[k]; ("input", i) is
        # parameter i itself (a returned nt.mutable_tensor, updated in place).
        self.results = results if results is not None else [("output", k) for k in range(len(output_specs))]
        # bytes and numpy dtype of each output, worked out once rather than at every launch
        self.output_bytes = [math.prod(shape) * dt.itemsize for shape, dt in output_specs]
        self.total_output_bytes = sum(self.output_bytes)
        self.output_numpy_dtypes = [numpy_dtype(dt) for _shape, dt in output_specs]
        # Whether the instances meet (core_barrier, sendrecv): then they run, and are estimated, together.
        self.meets = any(p.meets for p in programs)

    def text(self, locations: bool = True) -> str:
        return "\n".join(p.text(locations) for p in self.programs)

    def memory_bytes(self) -> int:
        """Approximate bytes held by the compiled programs (what the in-memory cache counts)."""
        return _COMPILED_OVERHEAD_BYTES + sum(p.memory_bytes for p in self.programs)


# What a cache entry costs beyond its programs' own estimate: the key, the Compiled object and its
# lists, the Python wrappers of the programs. Measured with tracemalloc, rounded up.
_COMPILED_OVERHEAD_BYTES = 4096
# An entry of the traced-outputs cache: the key and a few tuples of shapes and dtypes.
_OUTPUTS_ENTRY_BYTES = 1024


def _warn(programs) -> None:
    """Shows the compiler's warnings (spills) once per compile, at the user line they are about;
    SPMD instances that spill alike warn once."""
    shown = set()
    for program in programs:
        for message, file, line in program.warnings:
            if message not in shown:
                shown.add(message)
                warnings.warn_explicit(message, SpillWarning, file or "<kernel>", line or 0)


def _resolve_target(target) -> str:
    name = target or os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE") or _core.default_target()
    try:
        return _core.target_info(str(name))["name"]
    except KernelError as err:
        raise KernelError(err.summary, limit=err.limit, hint=err.hint) from None


class Kernel:
    """A function decorated with @nki.jit.

    Calling it traces the function for the arguments' shapes, dtypes and constant values
    (compiling once per specialization), runs it on the simulated NeuronCore and returns its
    outputs as the inputs' kind: numpy arrays for numpy inputs, torch tensors for torch inputs.
    ``kernel[g0, g1](...)`` launches an SPMD grid (``kernel[2]``: two logical cores).
    """

    def __init__(self, fn, target=None, grid=(), **options):
        if not callable(fn) or not hasattr(fn, "__code__"):
            raise TypeError(f"a kernel is a Python function, got {describe(fn)}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.target = target
        self.grid = tuple(grid)
        self.options = options
        self._signature = inspect.signature(fn)
        self._params = list(self._signature.parameters.values())
        self._positional_only = all(p.default is inspect.Parameter.empty and p.kind in (
            p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in self._params)
        self._mutable = {i for i, p in enumerate(self._params)
                         if _is_mutable_annotation(p.annotation, getattr(fn, "__globals__", {}))}
        # Compiled specializations and traced output specs by specialization key, both counted
        # against the process-wide budget of nikki.set_cache_limit.
        self._cache = SpecializationCache()
        self._outputs_cache = SpecializationCache()
        for p in self._params:
            if p.kind is p.KEYWORD_ONLY:
                raise kernel_error_at(user_frame(2), f"kernel '{fn.__name__}': keyword-only parameter '{p.name}' is "
                                      "not supported", hint="remove the '*' separator from the kernel signature")

    def __getitem__(self, grid) -> "Kernel":
        grid = grid if isinstance(grid, tuple) else (grid,)
        for g in grid:
            if not is_int(g) or g < 1:
                raise kernel_error_at(user_frame(2), f"launch grid {grid} must be positive integers")
        grid = tuple(int(g) for g in grid)
        _check_grid(grid, user_frame(2))
        launched = Kernel.__new__(Kernel)
        launched.__dict__.update(self.__dict__)
        launched.grid = tuple(grid)
        return launched  # shares the caches: the grid is part of the key

    def with_schedule(self, schedule) -> "Kernel":
        """NKI's extra ordering edges [(consumer, producers), ...] between named instructions. nikki
        runs instructions with program-order semantics and keeps every dependency, so the edges
        change no result; they are accepted and the kernel is returned (the timing estimate does not
        model them)."""
        for entry in schedule:
            if not isinstance(entry, (tuple, list)) or len(entry) < 2:
                raise TypeError(f"with_schedule: {entry!r} is not a (consumer, producer, ...) tuple of instruction "
                                "names")
        return self

    def with_target(self, target: str) -> "Kernel":
        """The same kernel compiled for another target ("trn1" or "trn2"); shares no cache entries."""
        k = Kernel.__new__(Kernel)
        k.__dict__.update(self.__dict__)
        k.target = target
        k._cache = SpecializationCache()
        k._outputs_cache = SpecializationCache()
        return k

    def __repr__(self) -> str:
        return f"<nikki kernel {self.fn.__name__}{list(self.grid) if self.grid else ''}>"

    # --- calling --------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if maybe_current() is not None:
            # Called while another kernel is being traced: a sub-kernel (Beta 1's
            # @nki.jit(mode='trace') helpers), inlined into the caller like any Python function.
            return self.fn(*args, **kwargs)
        try:
            return self._call(args, kwargs)
        except Exception as err:
            raise _for_user(err, user_frame(2)) from None

    def _bind(self, args, kwargs) -> tuple:
        if not kwargs and self._positional_only and len(args) == len(self._params):
            return args
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as err:
            raise TypeError(f"{self.fn.__name__}(): {err}") from None
        bound.apply_defaults()
        return tuple(bound.arguments.values())

    def _grid(self) -> tuple:
        if self.grid:
            return self.grid
        lnc = os.environ.get("NEURON_LOGICAL_NC_CONFIG")
        if not lnc:
            return ()
        if not lnc.isdigit() or int(lnc) < 1:
            raise KernelError(f"NEURON_LOGICAL_NC_CONFIG={lnc} is not a number of logical cores",
                              hint="set NEURON_LOGICAL_NC_CONFIG=1 or 2, or unset it")
        grid = (int(lnc),) if int(lnc) > 1 else ()
        _check_grid(grid, user_frame(2))
        return grid

    def _call(self, args, kwargs):
        values = self._bind(args, kwargs)
        grid = self._grid()
        key = self._key(values)
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = self.compile_for(values, grid)
            self._cache.put(key, compiled, compiled.memory_bytes())
        return self._launch(compiled, values)

    def _key(self, values) -> tuple:
        """The specialization key of a call: shapes, dtypes and kinds of arrays, constants' values,
        the target and the grid. Cheap by design: it runs on every call."""
        key_parts: list[tuple] = []
        for v in values:
            if isinstance(v, np.ndarray):
                # the dtype itself: .str is "<V1"-like for every ml_dtypes fp8 type
                key_parts.append((v.shape, v.dtype, 0))
            elif _is_torch(v):
                key_parts.append((tuple(v.shape), v.dtype, 1))
            elif isinstance(v, TensorSpec):
                key_parts.append((v.shape, v.dtype, 2))
            else:
                key_parts.append(("const", _constant_key(v)))
        return (tuple(key_parts), self.target, os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE"), self._grid(),
                os.environ.get("NIKKI_SANITIZE"))

    # --- compiling ------------------------------------------------------------------------
    def trace_outputs(self, values) -> tuple:
        """(output_specs, results) of a bound call, as :class:`Compiled` has them, from tracing
        alone (no compiling); cached per specialization. Frameworks use it for shape inference."""
        key = self._key(values)
        cache = self._outputs_cache
        found = cache.get(key)
        if found is None:
            compiled = self._cache.get(key)
            if compiled is not None:
                found = (compiled.output_specs, compiled.results)
            else:
                specs = [self._classify(i, v) for i, v in enumerate(values)]
                target = _resolve_target(self.target or self.options.get("platform_target"))
                grid = self._grid()
                _kernel, found = self._trace(specs, target, grid, tuple(0 for _ in grid))
            cache.put(key, found, _OUTPUTS_ENTRY_BYTES)
        return found

    def output_specs(self, *args, **kwargs) -> list:
        """[(shape, dtype)] of the outputs for these inputs (arrays, tensors or nikki.spec
        placeholders), from tracing alone."""
        try:
            return self.trace_outputs(self._bind(args, kwargs))[0]
        except Exception as err:
            raise _for_user(err, user_frame(2)) from None

    def specialize(self, *args, **kwargs) -> Compiled:
        """Traces and compiles for these arguments without running (arrays or nikki.spec placeholders)."""
        try:
            return self.compile_for(self._bind(args, kwargs), self._grid())
        except Exception as err:
            raise _for_user(err, user_frame(2)) from None

    def sanitizing(self) -> bool:
        """Whether calls are sanitized: ``nki.jit(sanitize=...)`` if given, else NIKKI_SANITIZE."""
        option = self.options.get("sanitize")
        return _core.sanitize_from_env() if option is None else bool(option)

    def compile_for(self, values, grid, for_running: bool = True) -> Compiled:
        specs = [self._classify(i, v) for i, v in enumerate(values)]
        target = _resolve_target(self.target or self.options.get("platform_target"))
        sanitize = self.sanitizing()
        ids = list(itertools.product(*[range(g) for g in grid])) if grid else [()]
        programs: list = []
        outputs: Any = None  # the output specs of the first program instance
        constants: list = []
        instructions, max_instructions = 0, _core.max_instructions()
        for program_ids in ids:
            kernel, out_specs = self._trace(specs, target, grid, program_ids, sanitize)
            traced_constants = self.__dict__.pop("_traced_constants", [])
            instructions += kernel.num_instructions
            if instructions > max_instructions:  # each program is held in memory until the launch ends
                raise KernelError(f"the {len(ids)} program instances of kernel '{self.fn.__name__}' unroll into "
                                  f"more than {max_instructions} instructions together",
                                  limit=_core.instruction_limit_text(max_instructions),
                                  hint="launch fewer instances, trace a smaller problem, or loop at run time "
                                       "(nl.fori_loop), which traces the loop body once")
            if outputs is None:
                outputs, constants = out_specs, traced_constants
            elif out_specs != outputs:
                raise self._error_at_return(f"kernel '{self.fn.__name__}': program instances {ids[0]} and "
                                            f"{program_ids} return different outputs",
                                            hint="all instances must return the same shared_hbm tensors")
            programs.append(_core.compile(kernel, for_running, sanitize))
        _warn(programs)
        output_specs, results = outputs
        in_out = {k for kind, k in results if kind == "input"}
        return Compiled(programs, output_specs, [i for i, s in enumerate(specs) if isinstance(s, _TensorArg)
                                                 and (i in self._mutable or i in in_out)], results, constants)

    def _param_name(self, index) -> str:
        return self._params[index].name if index < len(self._params) else f"arg{index}"

    def _classify(self, index, value):
        name = self._param_name(index)
        try:
            if isinstance(value, TensorSpec):
                return _tensor_arg(name, value.shape, to_dtype(value.dtype), False)
            if isinstance(value, np.ndarray):
                if isinstance(value, np.ma.MaskedArray):
                    raise _masked_array_error(name)
                return _tensor_arg(name, value.shape, from_numpy(value.dtype), False)
            if _is_torch(value):
                problem = _torch_problem(name, value)
                if problem is not None:
                    raise problem
                return _tensor_arg(name, tuple(value.shape), from_torch(value.dtype), True)
        except TypeError as err:
            raise KernelError(f"argument '{name}': {err}") from None
        if isinstance(value, list):
            raise KernelError(f"argument '{name}' is a list; kernel arguments are tensors or compile-time constants",
                              hint="pass a tuple instead of a list")
        return value

    def _trace(self, specs, target, grid, program_ids, sanitize: bool = False):
        fn = self.fn
        ctx = TraceContext(fn.__name__, target, grid, program_ids, sanitize)
        code = fn.__code__
        loc = ctx.builder.location(code.co_filename, code.co_firstlineno, 0, 0, fn.__name__)
        call_args = []
        with ctx:
            for i, spec in enumerate(specs):
                if isinstance(spec, _TensorArg):
                    name = self._params[i].name if i < len(self._params) else f"arg{i}"
                    view = ctx.builder.add_storage(name, _core.Buffer.hbm, spec.dtype.core, list(spec.shape), "input",
                                                   loc, None)
                    if i in self._mutable:
                        ctx.builder.set_writable(view.storage)
                    # Arguments are visible to every instance of the SPMD grid: NKI reports them in
                    # shared_hbm, and kernels test `t.buffer == nl.shared_hbm` to tell HBM inputs apart.
                    ctx.regions[view.storage] = shared_hbm
                    call_args.append(NkiTensor(ctx, view))
                else:
                    call_args.append(spec)
            try:
                result = fn(*call_args)
            except AttributeError as err:
                raise self._constant_used_as_tensor(err, specs) or err
            except TypeError as err:
                raise isa._call_error(err) or err
        outputs = self._outputs(ctx, result, call_args)
        self._traced_constants = ctx.constants  # taken by compile_for
        return ctx.builder.finish(), outputs

    def _constant_used_as_tensor(self, err: AttributeError, specs) -> KernelError | None:
        """The KernelError for a kernel body that asked a constant argument (None, a string, a
        number: anything but an array or tensor) for a tensor attribute such as ``.shape``, located
        at that line and naming the argument; None when the attribute error is about anything else."""
        culprit = getattr(err, "obj", _NOT_AN_ARGUMENT)
        index = next((i for i, spec in enumerate(specs) if spec is culprit and not isinstance(spec, _TensorArg)), None)
        if index is None or not hasattr(NkiTensor, getattr(err, "name", "") or ""):
            return None
        return kernel_error_in_traceback(err, f"argument '{self._param_name(index)}' is {describe(culprit)}, but the "
                                         f"kernel uses it as a tensor (.{err.name})",
                                         hint="pass a numpy array or a torch CPU tensor")

    def _error_at_return(self, summary: str, limit: str = "", hint: str = "", at_def: bool = False) -> KernelError:
        """A KernelError about what the kernel returns, located at its return statement (or at its
        def line when it has none or several)."""
        code = self.fn.__code__
        line, column, end_column = _def_line(code), 0, 0
        if not at_def:
            sites = {(p.lineno, p.col_offset or 0, p.end_col_offset if p.end_lineno == p.lineno else 0)
                     for p in (getattr(i, "positions", None) for i in dis.get_instructions(code)
                               if i.opname in ("RETURN_VALUE", "RETURN_CONST")) if p is not None and p.lineno}
            if len(sites) == 1:
                line, column, end_column = sites.pop()
                end_column = end_column or 0
        return KernelError(summary, code.co_filename, line, column, end_column, limit=limit, hint=hint)

    def _outputs(self, ctx, result, call_args):
        if result is None:
            raise self._error_at_return(f"kernel '{self.fn.__name__}' returns no output", at_def=True,
                                        hint="allocate outputs with nl.ndarray(shape, dtype, buffer=nl.shared_hbm), "
                                             "write them and return them")
        results = result if isinstance(result, (tuple, list)) else (result,)
        returned = set()
        specs, kinds = [], []
        for r in results:
            if not isinstance(r, NkiTensor):
                raise self._error_at_return(f"kernel '{self.fn.__name__}' returns {type(r).__name__}; kernels "
                                            "return tensors", hint="return the shared_hbm output tensors")
            info = ctx.builder.storage(r._view.storage)
            # The whole storage, possibly reshaped (a contiguous view of every element in order has
            # the storage's bytes, so the caller's array simply takes the view's shape).
            whole = (r._view.offset == 0 and r.size == math.prod(info["shape"]) and r.is_contiguous()
                     and not r.is_indirect())
            param = next((i for i, a in enumerate(call_args) if isinstance(a, NkiTensor)
                          and a._view.storage == r._view.storage), None)
            writable_input = info["role"] == "input" and param is not None
            if not whole or not (info["role"] == "output" or writable_input):
                raise self._error_at_return(f"kernel '{self.fn.__name__}' returns {'' if whole else 'a view of '}"
                                            f"tensor '{info['name']}' in {info['buffer'].name}",
                                            limit="kernel outputs are whole tensors allocated in shared_hbm",
                                            hint="allocate the output with nl.ndarray(shape, dtype, "
                                                 "buffer=nl.shared_hbm), write it and return it")
            if writable_input:
                # A returned parameter is an in-out tensor (as in NKI, annotated nt.mutable_tensor or
                # not): it is written in place, and the call returns the caller's array itself.
                ctx.builder.set_writable(r._view.storage)
                kinds.append(("input", param))
                continue
            ctx.builder.add_output(r._view.storage)
            returned.add(r._view.storage)
            specs.append((tuple(r.shape), to_dtype(info["dtype"])))
            kinds.append(("output", len(specs) - 1))
        for storage in range(ctx.builder.num_storages):
            if storage not in returned and ctx.builder.storage(storage)["role"] == "output":
                ctx.builder.set_role_scratch(storage)  # a shared_hbm scratch tensor nobody returns
        return specs, kinds

    # --- running --------------------------------------------------------------------------
    def _launch(self, compiled: Compiled, values):
        if launch_observers:
            for observe in launch_observers:
                observe(self, compiled)
        if compiled.writable_inputs:
            for i in compiled.writable_inputs:
                _check_writable(self._param_name(i), values[i])
        _check_host_memory(self, compiled, values)
        in_ptrs, keep, write_back, torch_out = [], [], [], False
        for i, v in enumerate(values):
            if isinstance(v, np.ndarray):
                if v.__class__ is not np.ndarray and isinstance(v, np.ma.MaskedArray):
                    raise _masked_array_error(self._param_name(i))
                flags = v.flags
                if flags.c_contiguous and flags.aligned and v.dtype.isnative:
                    arr = v
                else:  # the device reads C-ordered, aligned elements in the machine's byte order
                    arr = np.require(v, v.dtype.newbyteorder("="), ("C", "A"))
                    if i in compiled.writable_inputs:
                        write_back.append((v, arr))
                keep.append(arr)
                in_ptrs.append(arr.__array_interface__["data"][0] if arr.size else 0)
            elif _is_torch(v):
                t = v if v.is_contiguous() else v.contiguous()
                if t is not v and i in compiled.writable_inputs:
                    write_back.append((v, t))
                keep.append(t)
                in_ptrs.append(t.data_ptr())
                torch_out = True
            elif isinstance(v, TensorSpec):
                raise KernelError(f"argument '{self._param_name(i)}' is {v!r}, a placeholder without data",
                                  hint="placeholders stand in for arrays in nikki.estimate and Kernel.specialize; "
                                       "pass a numpy array or a torch CPU tensor to run the kernel")
        if compiled.writable_inputs:
            _separate_aliased_inputs(self, compiled, values, keep, in_ptrs)
        for constant in compiled.constants:
            in_ptrs.append(constant.__array_interface__["data"][0] if constant.size else 0)
        outputs: list[Any] = []
        for (shape, dt), np_dtype in zip(compiled.output_specs, compiled.output_numpy_dtypes):
            if torch_out:
                import torch

                outputs.append(torch.empty(shape, dtype=torch_dtype(dt)))
            else:
                outputs.append(np.empty(shape, dtype=np_dtype))
        out_ptrs = [o.data_ptr() if torch_out else o.__array_interface__["data"][0] for o in outputs]
        if compiled.meets:
            # Instances that meet (core_barrier, sendrecv) run together, each on its own core.
            _core.run_launch(compiled.programs, in_ptrs, out_ptrs)
            if len(compiled.programs) > 1:
                for program in compiled.programs:
                    program.release_executor()
        else:
            # SPMD instances run in turn on the same shared_hbm outputs; only the first run fills
            # them with the uninitialized-memory sentinels, later ones must keep earlier writes.
            for index, program in enumerate(compiled.programs):
                program.run(in_ptrs, out_ptrs, index == 0)
                if len(compiled.programs) > 1:
                    program.release_executor()  # hold one simulated core at a time, not one per instance
        for original, copy in write_back:
            original[...] = copy
        results = [outputs[k] if kind == "output" else values[k] for kind, k in compiled.results]
        return results[0] if len(results) == 1 else tuple(results)


_NOT_AN_ARGUMENT = object()
_strided = None


def _torch_strided():
    """torch.strided, imported on first use (nikki runs without torch installed)."""
    global _strided
    if _strided is None:
        import torch

        _strided = torch.strided
    return _strided


def _tensor_arg(name: str, shape, dtype, is_torch: bool) -> _TensorArg:
    """The tensor argument `name` of this shape, if NKI can hold it: at least one dim, at most the
    IR's rank (an empty dim is fine until the kernel accesses it)."""
    shape = tuple(int(s) for s in shape)
    if not shape:
        raise KernelError(f"argument '{name}' is 0-dimensional; NKI tensors have at least one dim",
                          hint="reshape it, e.g. x.reshape(1, 1)")
    if len(shape) > _core.max_rank:
        raise KernelError(f"argument '{name}' has {len(shape)} dims", limit=f"tensors have at most {_core.max_rank} dims",
                          hint="merge dims with reshape before the call")
    return _TensorArg(shape, dtype, is_torch)


def _masked_array_error(name: str) -> KernelError:
    return KernelError(f"argument '{name}' is a numpy masked array; a kernel reads every element and would ignore "
                       "the mask", hint="pass a.filled(value), or a.data to compute on the masked elements too")


def _torch_problem(name: str, tensor) -> KernelError | None:
    """The KernelError for a torch tensor nikki cannot read through its data pointer: on another
    device than the CPU, or not a dense (strided) tensor."""
    if tensor.device.type != "cpu":
        return KernelError(f"argument '{name}' is a torch tensor on {tensor.device}; nikki runs on CPU tensors",
                           hint="move it with .cpu()")
    if tensor.layout is not _torch_strided():
        return KernelError(f"argument '{name}' is a {tensor.layout} torch tensor; nikki takes dense tensors",
                           hint="convert it with .to_dense()")
    return None


def _check_writable(name: str, value) -> None:
    """A KernelError unless the kernel may write `value`, the argument of an nt.mutable_tensor
    parameter, in place."""
    why = hint = ""
    if isinstance(value, np.ndarray):
        if not value.flags.writeable:
            why, hint = "is a read-only numpy array", "pass a writable array, e.g. a copy: a.copy()"
        elif any(stride == 0 and n > 1 for stride, n in zip(value.strides, value.shape)):
            why, hint = "repeats its elements (a stride-0 broadcast view)", "pass a materialized copy: a.copy()"
    elif _is_torch(value):
        import torch

        if value.requires_grad and torch.is_grad_enabled():
            why = "requires grad, and nikki would write it in place behind autograd's back"
            hint = ("pass a.detach() or call under torch.no_grad(); for autograd, register the kernel with "
                    "nikki.torch.nki_op(..., mutates_args=...)")
        elif any(stride == 0 and n > 1 for stride, n in zip(value.stride(), value.shape)):
            why, hint = "repeats its elements (a stride-0 expanded view)", "pass a materialized copy: a.clone()"
    if why:
        raise KernelError(f"argument '{name}' {why}; the kernel writes it (nt.mutable_tensor)", hint=hint)


def _byte_span(value) -> tuple:
    """[first, last) bytes an array or tensor argument covers (0-size: an empty span)."""
    if isinstance(value, np.ndarray):
        start = stop = value.__array_interface__["data"][0]
        item = value.itemsize
    else:
        start = stop = value.data_ptr()
        item = value.element_size()
    strides = value.strides if isinstance(value, np.ndarray) else [s * item for s in value.stride()]
    for n, stride in zip(value.shape, strides):
        if n == 0:
            return (start, start)
        if stride < 0:
            start += (n - 1) * stride
        else:
            stop += (n - 1) * stride
    return (start, stop + item)


def _separate_aliased_inputs(kernel, compiled, values, keep, in_ptrs) -> None:
    """Inputs are distinct tensors in the kernel's model. When an argument the kernel writes
    shares memory with another argument, the other one gets a private copy taken before the run
    (it reads the values it had at the call); two written arguments sharing memory are an error."""
    slots = [i for i, v in enumerate(values) if isinstance(v, np.ndarray) or _is_torch(v)]
    spans = {i: _byte_span(values[i]) for i in slots}
    for w in compiled.writable_inputs:
        ws, we = spans[w]
        for position, j in enumerate(slots):
            js, je = spans[j]
            if j == w or ws >= je or js >= we:
                continue
            if j in compiled.writable_inputs:
                raise KernelError(f"arguments '{kernel._param_name(w)}' and '{kernel._param_name(j)}' share memory, "
                                  "and the kernel writes both (nt.mutable_tensor)", hint="pass separate arrays")
            private = keep[position].copy() if isinstance(keep[position], np.ndarray) else keep[position].clone()
            keep[position] = private
            in_ptrs[position] = private.__array_interface__["data"][0] if isinstance(private, np.ndarray) \
                else private.data_ptr()


_HOST_MEMORY_CHECK_BYTES = 64 << 20


def _host_available_bytes():
    """Memory the host can still give this process (MemAvailable), or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _bytes_text(nbytes: int) -> str:
    for unit, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= unit:
            return f"{nbytes / unit:.1f} {name}"
    return f"{nbytes} B"


def _check_host_memory(kernel, compiled: Compiled, values) -> None:
    """A KernelError, before anything is allocated or copied, when the launch's host buffers (the
    outputs, and contiguous copies of strided or broadcast inputs) need more memory than the host
    has available. The verifier has already held every HBM tensor to the device's capacity. First
    of all, every torch tensor must be a dense CPU tensor, whose data nikki reads by its pointer."""
    needs = []  # (bytes, index of the argument copied, or None for the outputs)
    for i, v in enumerate(values):
        if isinstance(v, np.ndarray):
            if not v.flags.c_contiguous:
                needs.append((v.nbytes, i))
        elif _is_torch(v):
            # Checked on every launch, not only when compiling: the specialization key holds shape
            # and dtype, not the device or the layout (a sparse tensor has no strides to ask about).
            if not v.is_cpu or v.layout is not _torch_strided():
                problem = _torch_problem(kernel._param_name(i), v)
                assert problem is not None  # the test above is the function's
                raise problem
            if not v.is_contiguous():
                needs.append((v.numel() * v.element_size(), i))
    total = compiled.total_output_bytes + sum(n for n, _ in needs)
    # Reading the host's free memory costs more than a small launch's whole Python side; below
    # this size an allocation cannot be what exhausts a host (numpy's MemoryError stays the net).
    if total < _HOST_MEMORY_CHECK_BYTES:
        return
    available = _host_available_bytes()
    if available is None or total <= available:
        return
    named = [(n, f"a contiguous copy of argument '{kernel._params[i].name}'") for n, i in needs]
    named += [(n, f"output {k} {tuple(shape)}")
              for k, ((shape, _dt), n) in enumerate(zip(compiled.output_specs, compiled.output_bytes))]
    largest = ", ".join(f"{what}: {_bytes_text(n)}" for n, what in sorted(named, key=lambda x: -x[0])[:3])
    raise KernelError(f"kernel '{kernel.fn.__name__}' needs {_bytes_text(total)} of host memory for its launch "
                      f"({largest}), but only {_bytes_text(available)} is available",
                      limit="nikki runs on this host's memory: outputs, and strided or broadcast inputs, which "
                            "are copied into contiguous arrays before the run",
                      hint="pass contiguous inputs (a broadcast array is copied in full), or run on smaller tensors")


def _def_line(code) -> int:
    """The line of a function's `def` (co_firstlineno is the first decorator's line)."""
    for line in range(code.co_firstlineno, code.co_firstlineno + 20):
        text = linecache.getline(code.co_filename, line).lstrip()
        if text.startswith(("def ", "async def ")):
            return line
    return code.co_firstlineno


def _for_user(err: Exception, call_frame) -> Exception:
    """The exception to show the user for an error raised while tracing or running a kernel.

    KernelErrors without a location (bad arguments, unknown target) or located in nikki's C++ code
    (the argument checks of a library kernel, which name their C++ call site) get the location of
    the kernel call: the innermost frame outside nikki, `call_frame`. User-facing errors (KernelError, NotImplementedError for an unsupported API) and errors
    raised in the user's own code (the innermost frame is not nikki's, e.g. a TypeError from a bad
    keyword) lose nikki's internal frames, so the traceback shows the user's code only. Anything
    else is a nikki bug and keeps its full traceback.
    """
    tb = err.__traceback__
    innermost = tb
    while innermost is not None and innermost.tb_next is not None:
        innermost = innermost.tb_next
    raised_in_user_code = innermost is not None and not is_internal_frame(innermost.tb_frame.f_code.co_filename)
    if isinstance(err, KernelError) and (not err.file or not err.file.endswith(".py")) and call_frame is not None:
        located = kernel_error_at(call_frame, err.summary, err.limit, err.hint, err.instruction)
        return located.with_traceback(None)
    if isinstance(err, (KernelError, NotImplementedError)) or raised_in_user_code:
        return err.with_traceback(without_internal_frames(tb))
    return err


def _constant_key(v):
    try:
        hash(v)
        return (type(v), v)
    except TypeError:
        return (type(v), id(v))


def _is_mutable_annotation(annotation, fn_globals) -> bool:
    """True for ``nt.mutable_tensor`` (also as the string annotation `from __future__ import
    annotations` makes of it)."""
    if isinstance(annotation, str):
        try:
            annotation = eval(annotation, dict(fn_globals))  # noqa: S307 - the user's own annotation
        except Exception:
            pass
        if isinstance(annotation, str):  # unresolvable, or a quoted annotation
            return annotation.strip("'\" ").split("[")[0].endswith("mutable_tensor")
    return annotation is mutable_tensor or getattr(annotation, "_nikki_mutable", False)


# Options of NKI's compiler that have no meaning on a simulator: accepted and ignored.
_IGNORED_JIT_OPTIONS = ("compile_config", "specialization_config", "additional_compile_opt", "debug_kernel",
                        "show_compiler_tb", "experimental_flags", "enable_out_of_bound_check", "artifacts_dir",
                        "save_neff_name", "save_trace_name", "kernel_return", "enable_simulator")


def jit(fn=None, *, target=None, mode=None, platform_target=None, sanitize=None, **kwargs):
    """Decorates a kernel function: ``@nki.jit`` or ``@nki.jit(target="trn1")``.

    ``mode=`` is accepted and ignored (as in NKI 0.3+); nikki always runs on its simulated
    NeuronCore. ``platform_target=`` is accepted as an alias of ``target=``. Compiler options
    (NKI 2.33's ``compile_config=`` / ``specialization_config=``, ``debug_kernel=``,
    ``show_compiler_tb=``, ``experimental_flags=``, ``additional_compile_opt=``, ...) are accepted
    and ignored; any other keyword is an error, as misspelled options would otherwise be silently
    dropped.

    ``sanitize=True`` (default: the NIKKI_SANITIZE environment variable) checks the kernel for
    what a sequential simulator hides: dependencies between iterations of an ``nl.affine_range``
    loop (when compiling) and reads of memory nothing wrote (when running, on the reference
    interpreter); both raise a KernelError naming the lines involved (docs/sanitizer.md).
    """
    unknown = [k for k in kwargs if k not in _IGNORED_JIT_OPTIONS]
    if unknown:
        raise TypeError(f"nki.jit() got an unexpected keyword argument '{unknown[0]}'")
    kwargs = {} if sanitize is None else {"sanitize": bool(sanitize)}

    def wrap(f):
        try:
            return Kernel(f, target=target or platform_target, **kwargs)
        except KernelError as err:
            raise err.with_traceback(without_internal_frames(err.__traceback__)) from None

    if fn is None:
        return wrap
    try:
        return wrap(fn)
    except KernelError as err:
        raise err.with_traceback(without_internal_frames(err.__traceback__)) from None
