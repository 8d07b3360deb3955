"""nki.language: dtypes, memories, tensor creation, tile sizes, iterators, SPMD ids, and the
convenience tile functions (element-wise math, reductions, softmax, matmul, load/store, ...)
that NKI builds on nki.isa.

Functions that compute return a new SBUF tile (matmul and large transposes: a PSUM tile) and
take ``dtype=`` for the result; legacy kernels may also pass ``mask=``.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import sys
from typing import Any, Callable, ContextManager, Iterable, Iterator, NoReturn, Sequence, Union

from . import _core
from . import isa as _isa
from .dtypes import PACKED_DTYPES as _PACKED_DTYPES
from .dtypes import PackedDType
from .dtypes import dtype as _dtype_cls
from .dtypes import from_numpy, torch_dtype
from .dtypes import numpy_dtype as _numpy_dtype
from .arguments import check_bool, check_int, check_real, describe, is_int
from .dtypes import to_dtype
from .errors import is_internal_frame, kernel_error_at, user_frame
from .ops import register_op
from .hooks import hooks as _hooks
from .registers import VirtualRegister
from .isa import NKIObject, _broadcast_shape
from .tensor import (ComparisonTile, DynSlice, LoopReduction, MemoryRegion, NkiTensor, hbm, ndarray, par_dim, private_hbm,
                     psum, region_of, sbuf, shared_hbm)
from .tracing import assigned_name, current, maybe_current

# Annotations of the public signatures (as in nki.isa): a tile or a number; a shape; an ALU operator
# or activation function; a dtype; a legacy index-expression mask.
TileOrNumber = Union[NkiTensor, float]
Shape = Union[Sequence[int], int]
Operator = _isa.Operator
DTypeLike = _isa.DTypeLike
LegacyMask = _isa.LegacyMask

# --- dtypes ---------------------------------------------------------------------------------
float32 = to_dtype("float32")
bfloat16 = to_dtype("bfloat16")
float16 = to_dtype("float16")
tfloat32 = to_dtype("tfloat32")
float8_e4m3 = to_dtype("float8_e4m3")
float8_e4m3fn = to_dtype("float8_e4m3fn")
float8_e5m2 = to_dtype("float8_e5m2")
int8 = to_dtype("int8")
int16 = to_dtype("int16")
int32 = to_dtype("int32")
uint8 = to_dtype("uint8")
uint16 = to_dtype("uint16")
uint32 = to_dtype("uint32")
bool_ = to_dtype("bool_")
# NeuronCore-v4 MX types: named (kernels compare against them on every path), not modelled.
float8_e4m3fn_x4 = _PACKED_DTYPES["float8_e4m3fn_x4"]
float8_e5m2_x4 = _PACKED_DTYPES["float8_e5m2_x4"]
float4_e2m1fn_x4 = _PACKED_DTYPES["float4_e2m1fn_x4"]
float8_e8m0fnu = _PACKED_DTYPES["float8_e8m0fnu"]

# --- memories -------------------------------------------------------------------------------
__all_memories__ = (sbuf, psum, hbm, shared_hbm, private_hbm)


def is_psum(buffer: object) -> bool:
    """Whether `buffer` is the memory region PSUM; False for anything that is not a region."""
    return buffer is psum


def is_sbuf(buffer: object) -> bool:
    """Whether `buffer` is the memory region SBUF; False for anything that is not a region."""
    return buffer is sbuf


def is_hbm(buffer: object) -> bool:
    """Whether `buffer` is the memory region an HBM memory (hbm, shared_hbm or private_hbm); False for anything that is not a region."""
    return isinstance(buffer, MemoryRegion) and buffer.is_hbm


def is_on_chip(buffer: object) -> bool:
    """Whether `buffer` is the memory region an on-chip memory (SBUF or PSUM); False for anything that is not a region."""
    return isinstance(buffer, MemoryRegion) and buffer.is_on_chip


# --- tensor creation ------------------------------------------------------------------------

def full(shape: Shape, fill_value: float, dtype: DTypeLike, buffer: MemoryRegion = sbuf, name: str = "",
         lazy_initialization: bool | None = None) -> NkiTensor:
    """A tensor filled with `fill_value` (on-chip memories only).

    Beta 1's ``lazy_initialization=`` (whether the compiler may fold the fill into the tensor's
    first write) is a scheduling hint: it changes no value and is accepted as such.

    Engine: nisa.memset (Vector or GpSimd). Cost: ``max(MIN_II, N)`` cycles (``N/2`` for 0 into bf16
    / fp16).
    """
    if lazy_initialization is not None:
        check_bool(lazy_initialization, "nl.full: lazy_initialization")
    region = region_of(buffer)
    if not region.is_on_chip:
        raise kernel_error_at(user_frame(2), f"creating an HBM tensor ({region.name}) with an initial value is not "
                              "supported", hint="create it in nl.sbuf, or allocate with nl.ndarray and dma_copy into it")
    fill_value = _isa._number(fill_value, "nl.full: fill_value")
    # named after the user's variable (acc = nl.zeros(...)), as ndarray names what it is assigned to
    t = ndarray(shape, dtype, buffer=region, name=name or assigned_name(user_frame(2)))
    _isa._assign_scalar(t, fill_value)
    return t


def zeros(shape: Shape, dtype: DTypeLike, buffer: MemoryRegion = sbuf, name: str = "",
          lazy_initialization: bool | None = None) -> NkiTensor:
    """A tensor of zeros (``lazy_initialization=`` as in ``full``).

    Engine: nisa.memset (Vector or GpSimd). Cost: ``max(MIN_II, N/2)`` cycles for bf16 / fp16,
    ``max(MIN_II, N)`` otherwise.
    """
    return full(shape, 0, dtype, buffer, name, lazy_initialization)


def ones(shape: Shape, dtype: DTypeLike, buffer: MemoryRegion = sbuf, name: str = "",
         lazy_initialization: bool | None = None) -> NkiTensor:
    """A tensor of ones (``lazy_initialization=`` as in ``full``).

    Engine: nisa.memset (Vector or GpSimd). Cost: ``max(MIN_II, N)`` cycles.
    """
    return full(shape, 1, dtype, buffer, name, lazy_initialization)


def zeros_like(x: NkiTensor, dtype: DTypeLike = None, buffer: MemoryRegion | None = None, name: str = "") -> NkiTensor:
    """Zeros of x's shape and dtype (or `dtype`), in `buffer` (SBUF by default, as in NKI).

    Engine: nisa.memset, as nl.zeros.
    """
    return zeros(x.shape, dtype if dtype is not None else x.dtype, buffer if buffer is not None else sbuf, name)


def ones_like(x: NkiTensor, dtype: DTypeLike = None, buffer: MemoryRegion | None = None, name: str = "") -> NkiTensor:
    """Ones of x's shape and dtype (or `dtype`), in `buffer` (SBUF by default, like zeros_like).

    Engine: nisa.memset, as nl.ones.
    """
    return ones(x.shape, dtype if dtype is not None else x.dtype, buffer if buffer is not None else sbuf, name)


def empty_like(x: NkiTensor, dtype: DTypeLike = None, buffer: MemoryRegion | None = None, name: str = "") -> NkiTensor:
    """An uninitialized tensor of x's shape and dtype (or `dtype`), in x's buffer unless `buffer` is given."""
    return ndarray(x.shape, dtype if dtype is not None else x.dtype, buffer if buffer is not None else x.buffer,
                   name)


def shared_constant(constant: Any, dtype: DTypeLike = None) -> NkiTensor:
    """A read-only shared_hbm tensor holding `constant` (a numpy array, or the path of a .npy
    file), built into the compiled kernel; ``dtype=`` converts it (float64 / int64 arrays become
    float32 / int32 otherwise)."""
    import numpy as np

    ctx = current("nl.shared_constant")
    data = np.load(constant) if isinstance(constant, str) else np.asarray(constant)
    if dtype is not None:
        data = static_cast(data, dtype)
    elif data.dtype == np.float64 or data.dtype == np.int64:
        data = data.astype(np.float32 if data.dtype == np.float64 else np.int32)
    data = np.ascontiguousarray(data)
    try:
        dt = from_numpy(data.dtype)
    except TypeError as err:
        raise kernel_error_at(user_frame(2), f"nl.shared_constant: {err}") from None
    name = assigned_name(sys._getframe(1)) or "constant"
    view = ctx.builder.add_storage(name, hbm.core, dt.core, list(data.shape) or [1], "input", ctx.location(), None)
    ctx.constants.append(data.reshape(data.shape or (1,)))
    return NkiTensor(ctx, view)


def shared_identity_matrix(n: int, dtype: DTypeLike = None, dst: NkiTensor | None = None) -> NkiTensor:
    """An n x n identity matrix in SBUF (uint8 by default).

    Engine: GpSimd (nisa.affine_select over a tile of ones). Cost: ``150 + N`` cycles.
    """
    dt = to_dtype(dtype) if dtype is not None else uint8
    out = dst if dst is not None else ndarray((n, n), dt, buffer=sbuf, name="identity")
    ones_tile = ones((n, n), dt)
    _isa._affine_select(out, [[1, n]], -1, ones_tile, 0.0, cmp_op=equal)
    return out


# --- tile sizes -----------------------------------------------------------------------------

class _TileSize:
    """nl.tile_size: hardware tile limits of the target being traced (or the default target)."""

    def _values(self) -> dict:
        ctx = maybe_current()
        target = ctx.target if ctx is not None else _core.default_target()
        return _core.target_info(target)["tile_size"]

    def __getattr__(self, name):
        values = self._values()
        if name in values:
            return values[name]
        raise AttributeError(f"nl.tile_size has no attribute {name!r}; it has {', '.join(sorted(values))}")

    def __dir__(self):
        return sorted(self._values())


tile_size = _TileSize()


# --- iterators and control flow -------------------------------------------------------------

def _loop_range(api: str, start, stop, step) -> range:
    """The iterations of a trace-time loop, its bounds checked as integers."""
    if stop is None:
        return range(check_int(start, f"{api}: stop"))
    return range(check_int(start, f"{api}: start"), check_int(stop, f"{api}: stop"), check_int(step, f"{api}: step"))


def affine_range(start: int, stop: int | None = None, step: int = 1, directives: Any = None) -> Iterable[int]:
    """A loop whose iterations do not depend on one another: NKI may reorder and overlap them.

    It unrolls at trace time (as in current NKI). When the kernel is sanitized
    (``nki.jit(sanitize=True)`` or ``NIKKI_SANITIZE=1``), its iterations are recorded and a
    dependency between two of them (one reads or overwrites what another wrote, beyond
    accumulations such as ``psum += nl.matmul(...)``) is a KernelError. Beta 1's loop
    ``directives=`` (e.g. ``nki.compiler.multi_buffer(2)``) are scheduling hints and change nothing.
    """
    values = _loop_range("affine_range", start, stop, step)
    ctx = maybe_current()
    if ctx is None or not ctx.sanitize:
        return values
    return _recorded_iterations(ctx, values, ctx.location(2))


def _recorded_iterations(ctx, values: range, loc: int):
    loop = ctx.builder.open_parallel_loop(loc, values.start, values.step)
    try:
        for value in values:
            ctx.builder.begin_iteration(loop)
            yield value
    finally:
        # also on `break`: the generator is closed when the for statement drops it
        ctx.builder.close_parallel_loop(loop)


def sequential_range(start: int, stop: int | None = None, step: int = 1, directives: Any = None) -> range:
    """A loop whose iterations may depend on one another (run in order); unrolls at trace time."""
    return _loop_range("sequential_range", start, stop, step)


def static_range(start: int, stop: int | None = None, step: int = 1, directives: Any = None) -> range:
    """A loop unrolled at trace time, iterations in order."""
    return _loop_range("static_range", start, stop, step)


def arange(*args: int) -> Any:
    """Legacy index expression ``nl.arange(n)`` / ``nl.arange(start, stop)`` (an affine index over a
    tile's dim, placed with ``[:, None]`` / ``[None, :]``); implemented by the legacy layer."""
    return _hooks.arange(*args)


class _IndexGrid:
    """Legacy ``nl.mgrid[0:P, 0:F]``: index expressions of a grid, implemented by the legacy layer."""

    def __getitem__(self, key):
        return _hooks.mgrid[key]

    def __repr__(self) -> str:
        return "nl.mgrid"


mgrid = _IndexGrid()


def ds(start: int | VirtualRegister | NkiTensor, size: int) -> DynSlice:
    """The slice [start, start + size): `start` an integer or a runtime value (a register or a 1x1
    tensor), `size` a positive integer."""
    return DynSlice(start, size)


def _loop(lower, upper, step: int):
    if not is_int(step) or step <= 0:
        raise kernel_error_at(user_frame(3), f"loop step {step!r} must be a positive compile-time integer")
    step = int(step)
    ctx = current()
    counter = ctx.builder.new_register()
    begin = _isa._emit(_core.Opcode.loop_begin, (_isa.VirtualRegister(counter), lower, upper), _isa.engine.sync,
                       step=step)
    return ctx, begin, _isa.VirtualRegister(counter)


def _end_loop(ctx, begin: int) -> None:
    end = _isa._emit(_core.Opcode.loop_end, (), _isa.engine.sync, jump=begin)
    ctx.builder.set_jump(begin, end)


def fori_loop(lower: int | VirtualRegister, upper: int | VirtualRegister, body_fun: Callable[[VirtualRegister], None],
              step: int = 1) -> None:
    """A loop that runs on the device: body_fun(i) is traced once and repeated at run time, with i a
    register counting from lower to upper. Carry state in tensors; body_fun returns nothing."""
    ctx, begin, counter = _loop(lower, upper, step)
    body_fun(counter)
    _end_loop(ctx, begin)


def dynamic_range(start: int | VirtualRegister, stop: int | VirtualRegister | None = None,
                  step: int = 1) -> Iterator[VirtualRegister]:
    """Device loop as a Python for-loop (deprecated in NKI 0.6 in favour of fori_loop): the body is
    traced once with the counter register."""
    lower, upper = (0, start) if stop is None else (start, stop)
    ctx, begin, counter = _loop(lower, upper, step)
    yield counter
    _end_loop(ctx, begin)


def while_loop(init: Any, body_fun: Callable[..., Any]) -> NoReturn:
    """A device loop repeating body_fun while its condition register is nonzero. Not supported by
    nikki yet (NotImplementedError); nl.fori_loop covers counted loops."""
    raise NotImplementedError("nl.while_loop is not supported by nikki yet (see docs/api-coverage.md)")


def no_reorder() -> ContextManager[None]:
    """Scheduling hint; nikki's streams keep program order semantics anyway."""
    return contextlib.nullcontext()


# --- SPMD -----------------------------------------------------------------------------------

def program_id(axis: int = 0) -> int:
    """This program instance's coordinate along `axis` of the launch grid."""
    ctx = current("nl.program_id")
    axis = check_int(axis, "nl.program_id: axis")
    if not ctx.grid:
        if axis == 0:
            return 0
    if not 0 <= axis < len(ctx.grid):
        raise kernel_error_at(user_frame(2), f"program_id({axis}) is out of range for a launch grid of "
                              f"{len(ctx.grid)} dims", hint="launch the kernel with a grid: kernel[g0, g1](...)")
    return ctx.program_ids[axis]


def num_programs(axes: int | Sequence[int] | None = None) -> int:
    """Number of program instances along `axes` (all instances when None)."""
    ctx = current("nl.num_programs")
    if axes is None:
        return math.prod(ctx.grid) if ctx.grid else 1
    if isinstance(axes, (tuple, list)):
        return math.prod(num_programs(a) for a in axes)
    axes = check_int(axes, "nl.num_programs: axes")
    if not ctx.grid and axes == 0:
        return 1
    if not 0 <= axes < len(ctx.grid):
        raise kernel_error_at(user_frame(2), f"num_programs({axes}) is out of range for a launch grid of "
                              f"{len(ctx.grid)} dims")
    return ctx.grid[axes]


def program_ndim() -> int:
    """Number of dims of the launch grid."""
    return len(current("nl.program_ndim").grid)


def nc(n: int) -> int:
    """Legacy grid marker distributing a grid dim over NeuronCores; nikki runs instances in turn."""
    return n


def spmd_dim(*sizes: int) -> int:
    """Legacy grid dim built from several sizes (``nl.spmd_dim(nl.nc(2), 2)``): their product."""
    return math.prod(check_int(s, "nl.spmd_dim: size", minimum=1) for s in sizes)


def device_print(print_prefix: str, tensor: NkiTensor) -> None:
    """Prints a tensor's values when the kernel runs on the simulated NeuronCore."""
    if isinstance(print_prefix, NkiTensor) and isinstance(tensor, str):
        print_prefix, tensor = tensor, print_prefix
    _isa._emit(_core.Opcode.device_print, (_isa._check_tensor(tensor, "tensor"),), _isa.engine.sync,
               text=str(print_prefix))


# --- element-wise math ----------------------------------------------------------------------

def _result_tile(shape, dt, name="") -> NkiTensor:
    return ndarray(tuple(shape), dtype=dt, buffer=sbuf, name=name)


def _per_partition(t: NkiTensor) -> bool:
    return t.ndim >= 2 and builtins.all(s == 1 for s in t.shape[1:])


_COMPARISONS = frozenset(("equal", "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and",
                          "logical_or", "logical_xor"))


def _binary_op(op: str, x, y, dtype=None, mask=None):
    out = _binary_tile(op, x, y, dtype, mask)
    return ComparisonTile(out._ctx, out._view) if op in _COMPARISONS else out


def _binary_tile(op: str, x, y, dtype=None, mask=None):
    """x op y for tiles and numbers: tensor_tensor for two tiles of one shape, tensor_scalar for a
    number or a [P, 1] tile (with the operands reversed when needed)."""
    fn = globals()[op if op != "divide" else "multiply"]
    x_t, y_t = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
    if not x_t and not y_t:
        raise kernel_error_at(user_frame(3), f"nl.{op}: x or y must be a tensor, got {describe(x)} and {describe(y)}",
                              hint="apply Python arithmetic to plain numbers")
    if not x_t:
        x = _isa._number(x, f"nl.{op}: x")
    if not y_t:
        y = _isa._number(y, f"nl.{op}: y")
    if op == "divide":
        if y_t:
            y = reciprocal(y)
        else:
            y = 1.0 / y if y else math.copysign(math.inf, y)  # x / 0 as x * inf: +-inf, or NaN for 0 / 0
    # Comparisons and logical operators give 0/1 results: a bool_ tile unless dtype= says otherwise
    # (Beta 1's default, dtype=bool; write dtype=nl.float32 for NKI 0.3+'s input-dtype default).
    comparison = op in _COMPARISONS
    if x_t and y_t and x.shape != y.shape:
        if _per_partition(y) and y.shape[0] == x.shape[0]:
            out = _result_tile(x.shape, _out_dtype(dtype, comparison, x, y))
            _isa._tensor_scalar(out, x, fn, _scalar_operand(y, op), mask=mask)
            return out
        if _per_partition(x) and x.shape[0] == y.shape[0]:
            out = _result_tile(y.shape, _out_dtype(dtype, comparison, x, y))
            _isa._tensor_scalar(out, y, fn, _scalar_operand(x, op), reverse0=True, mask=mask)
            return out
        if _isa._same_elements(y, x.shape) or _broadcast_shape(x.shape, y.shape) is not None:
            shape = _isa._operand_shape(x, y)
            out = _result_tile(shape, _out_dtype(dtype, comparison, x, y))
            _isa._tensor_tensor(out, _isa._spread(x, shape), _isa._spread(y, shape), fn, mask=mask)
            return out
        raise kernel_error_at(user_frame(3), f"nl.{op}: shapes {x.shape} and {y.shape} do not broadcast",
                              limit="binary tile ops take equal shapes, or a [P, 1] tile against a [P, F] tile",
                              hint="broadcast explicitly with t.broadcast_to(shape) or copy into a full tile")
    if x_t and y_t:
        out = _result_tile(x.shape, _out_dtype(dtype, comparison, x, y))
        _isa._tensor_tensor(out, x, y, fn, mask=mask)
        return out
    tile, number, reverse = (x, y, False) if x_t else (y, x, True)
    out = _result_tile(tile.shape, _out_dtype(dtype, comparison, tile))
    _isa._tensor_scalar(out, tile, fn, number, reverse0=reverse, mask=mask)
    return out


_BITVEC = frozenset(("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"))


def _scalar_operand(t: NkiTensor, op: str) -> NkiTensor:
    """A [P, 1] operand of an arithmetic tensor_scalar in the float32 the engines require of it."""
    if op in _BITVEC or t.dtype == float32:
        return t
    return copy(t, dtype=float32)


def _out_dtype(dtype, comparison: bool, *tiles) -> _dtype_cls | PackedDType:
    if dtype is not None:
        return to_dtype(dtype)
    if comparison:
        return bool_
    dt = tiles[0].dtype
    for t in tiles[1:]:
        dt = _isa._wider(dt, t.dtype)
    return dt


def add(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """x + y element-wise."""
    return _binary_op("add", x, y, dtype=dtype, mask=mask)


def subtract(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """x - y element-wise."""
    return _binary_op("subtract", x, y, dtype=dtype, mask=mask)


def multiply(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """x * y element-wise."""
    return _binary_op("multiply", x, y, dtype=dtype, mask=mask)


def divide(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """x / y, computed as x * reciprocal(y) (the engines have no divide)."""
    return _binary_op("divide", x, y, dtype=dtype, mask=mask)


def maximum(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Element-wise maximum (NaN propagates)."""
    return _binary_op("maximum", x, y, dtype=dtype, mask=mask)


def minimum(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Element-wise minimum (NaN propagates)."""
    return _binary_op("minimum", x, y, dtype=dtype, mask=mask)


def power(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """x ** y (GpSimd)."""
    return _binary_op("power", x, y, dtype=dtype, mask=mask)


def equal(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 where x == y else 0 (bool tile by default)."""
    return _binary_op("equal", x, y, dtype=dtype, mask=mask)


def not_equal(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 where x != y else 0."""
    return _binary_op("not_equal", x, y, dtype=dtype, mask=mask)


def greater(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 where x > y else 0."""
    return _binary_op("greater", x, y, dtype=dtype, mask=mask)


def greater_equal(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 where x >= y else 0."""
    return _binary_op("greater_equal", x, y, dtype=dtype, mask=mask)


def less(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 where x < y else 0."""
    return _binary_op("less", x, y, dtype=dtype, mask=mask)


def less_equal(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 where x <= y else 0."""
    return _binary_op("less_equal", x, y, dtype=dtype, mask=mask)


def logical_and(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 where both are nonzero (bool tile by default)."""
    return _binary_op("logical_and", x, y, dtype=dtype, mask=mask)


def logical_or(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 where either is nonzero (bool tile by default)."""
    return _binary_op("logical_or", x, y, dtype=dtype, mask=mask)


def logical_xor(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 where exactly one is nonzero (bool tile by default)."""
    return _binary_op("logical_xor", x, y, dtype=dtype, mask=mask)


def bitwise_and(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Bitwise and of integer tiles."""
    return _binary_op("bitwise_and", x, y, dtype=dtype, mask=mask)


def bitwise_or(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Bitwise or of integer tiles."""
    return _binary_op("bitwise_or", x, y, dtype=dtype, mask=mask)


def bitwise_xor(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Bitwise xor of integer tiles."""
    return _binary_op("bitwise_xor", x, y, dtype=dtype, mask=mask)


def left_shift(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Left shift of integer tiles."""
    return _binary_op("left_shift", x, y, dtype=dtype, mask=mask)


def right_shift(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Logical right shift of integer tiles."""
    return _binary_op("right_shift", x, y, dtype=dtype, mask=mask)


_BINARY_NOTES = """

    Parameters: ``x``, ``y``: tiles of one shape, a tile and a number, or a tile and a ``[P, 1]``
    tile (one value per partition; Beta 1 also repeats other size-1 dims); ``dtype``: the result's
    dtype (default: the wider input dtype; bool_ for comparisons and logical operators); ``mask``:
    a legacy index-expression predicate. Returns a new SBUF tile.

    Engine and cost: two tiles run as nisa.tensor_tensor (Vector engine, ``max(MIN_II, N)`` to
    ``max(MIN_II, 2N)`` cycles, GpSimd for power and int32), a number or a ``[P, 1]`` tile as
    nisa.tensor_scalar (``max(MIN_II, N)`` cycles); N is the elements per partition."""


for _name in ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "equal", "not_equal",
              "greater", "greater_equal", "less", "less_equal", "logical_and", "logical_or", "logical_xor",
              "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"):
    register_op(globals()[_name], alu=_name)
    globals()[_name].__doc__ += _BINARY_NOTES


def _activation_tile(func: str, x: NkiTensor, dtype: DTypeLike, mask: LegacyMask) -> NkiTensor:
    """x through activation function `func` into a new SBUF tile (x.dtype unless dtype= says)."""
    x = _isa._check_tensor(x, "x")
    out = _result_tile(x.shape, to_dtype(dtype) if dtype is not None else x.dtype)
    _isa._activation(out, getattr(_core.ActFunc, func), x, mask=mask)
    return out


def exp(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """e ** x (Scalar engine)."""
    return _activation_tile("exp", x, dtype, mask)


def log(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Natural logarithm (Scalar engine)."""
    return _activation_tile("log", x, dtype, mask)


def sqrt(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Square root (Scalar engine)."""
    return _activation_tile("sqrt", x, dtype, mask)


def tanh(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Hyperbolic tangent."""
    return _activation_tile("tanh", x, dtype, mask)


def sigmoid(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 / (1 + e ** -x)."""
    return _activation_tile("sigmoid", x, dtype, mask)


def relu(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """max(x, 0)."""
    return _activation_tile("relu", x, dtype, mask)


def gelu(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """x * Phi(x) (exact, erf-based)."""
    return _activation_tile("gelu", x, dtype, mask)


def gelu_dx(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Derivative of gelu."""
    return _activation_tile("gelu_dx", x, dtype, mask)


def gelu_apprx_tanh(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """tanh approximation of gelu."""
    return _activation_tile("gelu_apprx_tanh", x, dtype, mask)


def gelu_apprx_sigmoid(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """x * sigmoid(1.702 x)."""
    return _activation_tile("gelu_apprx_sigmoid", x, dtype, mask)


def gelu_apprx_sigmoid_dx(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Derivative of gelu_apprx_sigmoid."""
    return _activation_tile("gelu_apprx_sigmoid_dx", x, dtype, mask)


def silu(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """x * sigmoid(x)."""
    return _activation_tile("silu", x, dtype, mask)


def silu_dx(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Derivative of silu."""
    return _activation_tile("silu_dx", x, dtype, mask)


def softplus(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """log(1 + e ** x)."""
    return _activation_tile("softplus", x, dtype, mask)


def mish(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """x * tanh(softplus(x))."""
    return _activation_tile("mish", x, dtype, mask)


def erf(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Error function."""
    return _activation_tile("erf", x, dtype, mask)


def erf_dx(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Derivative of erf."""
    return _activation_tile("erf_dx", x, dtype, mask)


def sin(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Sine (valid on [-pi, pi] on hardware)."""
    return _activation_tile("sin", x, dtype, mask)


def arctan(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Arctangent."""
    return _activation_tile("arctan", x, dtype, mask)


def sign(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """-1, 0 or 1."""
    return _activation_tile("sign", x, dtype, mask)


def abs(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """|x|."""
    return _activation_tile("abs", x, dtype, mask)


def square(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """x * x."""
    return _activation_tile("square", x, dtype, mask)


_ACTIVATION_NOTES = """

    Parameters: ``x``: a tile in SBUF or PSUM; ``dtype``: the result's dtype (default x.dtype);
    ``mask``: a legacy index-expression predicate. Returns a new SBUF tile.

    Engine and cost: nisa.activation on the Scalar engine, ``max(MIN_II, N)`` cycles (N the
    elements per partition). nikki computes the function exactly in fp32; the hardware's
    piece-wise polynomials are valid on published input ranges (log [2^-64, 2^64], sqrt
    [2^-116, 2^118], sin [-pi, pi], arctan [-pi/2, pi/2]; the others everywhere)."""


for _name in ("exp", "log", "sqrt", "tanh", "sigmoid", "gelu", "gelu_dx", "gelu_apprx_tanh", "gelu_apprx_sigmoid",
              "gelu_apprx_sigmoid_dx", "silu", "silu_dx", "softplus", "mish", "erf", "erf_dx", "sin", "arctan",
              "sign"):
    register_op(globals()[_name], act=_name)
register_op(relu, alu="relu", act="relu")
register_op(abs, alu="abs", act="abs")
register_op(square, alu="square", act="square")
for _name in ("exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu", "gelu_dx", "gelu_apprx_tanh",
              "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx", "silu", "silu_dx", "softplus", "mish", "erf", "erf_dx",
              "sin", "arctan", "sign", "abs", "square"):
    globals()[_name].__doc__ += _ACTIVATION_NOTES


def rsqrt(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 / sqrt(x), on GpSimd as NKI does (higher precision than the Scalar engine).

    Engine: GpSimd (nisa.tensor_scalar with op0=nl.rsqrt). Cost: about 4x the Scalar engine's
    ``max(MIN_II, N)`` cycles. On hardware the input range is [2^-87, 2^97].
    """
    x = _isa._check_tensor(x, "x")
    out = _result_tile(x.shape, to_dtype(dtype) if dtype is not None else x.dtype)
    _isa._tensor_scalar(out, x, rsqrt, 0.0, engine=_isa.engine.gpsimd, mask=mask)
    return out


def reciprocal(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 / x on the Vector engine.

    Engine: Vector (nisa.reciprocal). Cost: ``max(MIN_II, 8N)`` cycles
    (nisa.activation(op=nl.reciprocal) on the Scalar engine costs ``max(MIN_II, N)``, at lower
    precision).
    """
    x = _isa._check_tensor(x, "x")
    out = _result_tile(x.shape, to_dtype(dtype) if dtype is not None else x.dtype)
    _isa._reciprocal(out, x, mask=mask)
    return out


def negative(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """-x element by element, in a new SBUF tile (x.dtype unless dtype= says).

    Engine: Vector (nisa.tensor_scalar multiply by -1). Cost: ``max(MIN_II, N)`` cycles.
    """
    x = _isa._check_tensor(x, "x")
    out = _result_tile(x.shape, to_dtype(dtype) if dtype is not None else x.dtype)
    _isa._tensor_scalar(out, x, multiply, -1.0, mask=mask)
    return out


def invert(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Bitwise not of an integer tile.

    Limits: integer tiles. Engine: Vector (nisa.tensor_scalar). Cost: ``max(MIN_II, N)`` cycles.
    """
    x = _isa._check_tensor(x, "x")
    out = _result_tile(x.shape, to_dtype(dtype) if dtype is not None else x.dtype)
    _isa._tensor_scalar(out, x, invert, 0, mask=mask)
    return out


def logical_not(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 where x == 0 else 0.

    Engine: Vector (nisa.tensor_scalar equal 0). Cost: ``max(MIN_II, N)`` cycles; the result is
    bool_ unless dtype= says.
    """
    return _binary_op("equal", x, 0.0, dtype=dtype, mask=mask)


register_op(rsqrt, alu="rsqrt", act="rsqrt")
register_op(reciprocal, alu="reciprocal", act="reciprocal")
register_op(negative, alu="negate")
register_op(invert, alu="invert")


def copy(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """A copy of x in a new SBUF tile (bit-exact when the dtype is unchanged).

    Parameters: ``x``: an SBUF / PSUM tile (copied by nisa.tensor_copy on the Vector engine,
    ``max(MIN_II, N)`` cycles) or an HBM view (copied by nisa.dma_copy); ``dtype``: the result's
    dtype.
    """
    x = _isa._check_tensor(x, "x")
    out = _result_tile(x.shape, to_dtype(dtype) if dtype is not None else x.dtype)
    if x.buffer.is_hbm:
        _isa.dma_copy(out, x, mask=mask)
    else:
        _isa._tensor_copy(out, x, mask=mask)
    return out


register_op(copy, act="copy")


def _unsupported(name: str) -> NoReturn:
    raise NotImplementedError(f"nl.{name} is not supported by nikki yet (see docs/api-coverage.md)")




# --- composites: functions the engines have no single instruction for -------------------------
# Rounding goes through an int32 tile (engines truncate toward zero when they write integers);
# magnitudes of 2**23 and more are integers already in fp32 and pass through unchanged.
_FP32_INTEGRAL = float(2 ** 23)


def _truncated(x, mask=None) -> NkiTensor:
    """trunc(x) as an fp32 tile."""
    x = _isa._check_tensor(x, "x")
    as_int = _result_tile(x.shape, int32)
    _isa._tensor_copy(as_int, x, mask=mask)
    out = _result_tile(x.shape, float32)
    _isa._tensor_copy(out, as_int, mask=mask)
    if x.dtype.is_float:
        integral = _result_tile(x.shape, uint8)
        _isa._tensor_scalar(integral, x, abs, 0.0, op1=greater_equal, operand1=_FP32_INTEGRAL, mask=mask)
        _isa.tensor_copy_predicated(out, x, integral, mask=mask)
    return out


def _rounded(x, dtype, mask, toward) -> NkiTensor:
    """floor (toward=-1) or ceil (toward=+1) of x: trunc(x), moved one step where it passed x."""
    x = _isa._check_tensor(x, "x")
    t = _truncated(x, mask)
    passed = _result_tile(x.shape, float32)
    _isa._tensor_tensor(passed, t, x, greater if toward < 0 else less, mask=mask)
    out = _result_tile(x.shape, to_dtype(dtype) if dtype is not None else x.dtype)
    _isa._tensor_tensor(out, t, passed, subtract if toward < 0 else add, mask=mask)
    return out


def trunc(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """x rounded toward zero (through an int32 tile on the Vector engine).

    Engine: Vector (copies through an int32 tile; for floats a predicated copy keeps the values of
    2^23 and more, integral already). Cost: a few ``max(MIN_II, N)``-cycle passes.
    """
    t = _truncated(x, mask)
    return copy(t, dtype=dtype if dtype is not None else x.dtype, mask=mask)


def floor(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """The largest integer <= x.

    Engine: Vector (nl.trunc, then a comparison and a correction nisa.tensor_tensor). Cost: a few
    ``max(MIN_II, N)``-cycle passes.
    """
    return _rounded(x, dtype, mask, -1)


def ceil(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """The smallest integer >= x.

    Engine: Vector (nl.trunc, then a comparison and a correction nisa.tensor_tensor). Cost: a few
    ``max(MIN_II, N)``-cycle passes.
    """
    return _rounded(x, dtype, mask, +1)


def _remainder(x, y, dtype, mask, rounding) -> NkiTensor:
    """x - y * rounding(x / y), with x / y computed as x * (1 / y) (the engines have no divide)."""
    quotient = _binary_tile("divide", x, y, dtype=float32, mask=mask)
    whole = rounding(quotient, dtype=float32, mask=mask)
    scaled = _binary_tile("multiply", whole, y, dtype=float32, mask=mask)
    ref = x if isinstance(x, NkiTensor) else y
    return _binary_tile("subtract", x, scaled, dtype=dtype if dtype is not None else ref.dtype, mask=mask)


def fmod(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Remainder of x / y with the sign of x (C's fmod), as x - y * trunc(x * (1 / y)); NKI lists it
    as simulation-only. The reciprocal rounds, so quotients within an ulp of an integer may differ
    from an exact fmod."""
    return _remainder(x, y, dtype, mask, trunc)


def mod(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Remainder of x / y with the sign of y (Python's %), as x - y * floor(x * (1 / y)); see fmod."""
    return _remainder(x, y, dtype, mask, floor)


def cos(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """cos(x) = sin(x + pi/2) on the Scalar engine (the bias add rounds x + pi/2 to fp32).

    Engine: Scalar (nisa.activation). Cost: ``max(MIN_II, N)`` cycles. On hardware sin is valid on
    [-pi, pi].
    """
    out = _result_tile(x.shape, to_dtype(dtype) if dtype is not None else x.dtype)
    _isa._activation(out, sin, x, bias=math.pi / 2, mask=mask)
    return out


def tan(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """tan(x) = sin(x) * (1 / cos(x)).

    Engine: Scalar (two activations) and Vector (reciprocal, multiply). Cost: a few ``N``-cycle
    passes.
    """
    return _binary_tile("multiply", sin(x, dtype=float32, mask=mask), reciprocal(cos(x, dtype=float32, mask=mask)),
                        dtype=dtype if dtype is not None else x.dtype, mask=mask)


def gather_flattened(data: NkiTensor, indices: NkiTensor, axis: int = 0, dtype: DTypeLike = None,
                     mask: LegacyMask = None) -> NkiTensor:
    """out[p, ...] = data[p, flat(indices[p, ...])]: each partition gathers from its own free
    elements, flattened (nisa.nc_n_gather on GpSimd); out has the shape of indices.

    Cost: not published (``ceil(elements per partition / 512)`` GpSimd instructions).
    """
    data, indices = _isa._check_tensor(data, "data"), _isa._check_tensor(indices, "indices")
    gathered = _result_tile(indices.shape, data.dtype)
    _isa.nc_n_gather(gathered, data, indices)
    if dtype is None or to_dtype(dtype) == data.dtype:
        return gathered
    return copy(gathered, dtype=dtype)


def _magnitude(pick: str, x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike, mask: LegacyMask) -> NkiTensor:
    ref = x if isinstance(x, NkiTensor) else y
    assert isinstance(ref, NkiTensor)  # _binary_tile names a call without tiles
    a = abs(x, dtype=float32, mask=mask) if isinstance(x, NkiTensor) else builtins.abs(float(x))
    b = abs(y, dtype=float32, mask=mask) if isinstance(y, NkiTensor) else builtins.abs(float(y))
    return _binary_tile(pick, a, b, dtype=dtype if dtype is not None else ref.dtype, mask=mask)


def abs_max(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """maximum of |x| and |y| (NeuronCore-v4's abs_max operator), computed as abs then maximum:
    two Scalar-engine activations and a Vector-engine nisa.tensor_tensor. Returns a new SBUF tile
    of x's (or y's) dtype unless dtype= says otherwise."""
    return _magnitude("maximum", x, y, dtype, mask)


def abs_min(x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """minimum of |x| and |y| (NeuronCore-v4's abs_min operator), computed as abs then minimum:
    two Scalar-engine activations and a Vector-engine nisa.tensor_tensor. Returns a new SBUF tile
    of x's (or y's) dtype unless dtype= says otherwise."""
    return _magnitude("minimum", x, y, dtype, mask)


for _name in ("fmod", "mod", "abs_max", "abs_min"):
    register_op(globals()[_name], alu=_name)


def rand(shape: Shape, dtype: DTypeLike, buffer: MemoryRegion = sbuf, name: str = "") -> NkiTensor:
    """A new tile of uniform random values. Not supported by nikki yet (NotImplementedError)."""
    _unsupported("rand")


def random_seed(seed: NkiTensor) -> None:
    """Seeds nl.rand from a [1, 1] SBUF tensor. Not supported by nikki yet (NotImplementedError)."""
    _unsupported("random_seed")


def dropout(x: NkiTensor, rate: TileOrNumber, dtype: DTypeLike = None) -> NkiTensor:
    """x with each element zeroed with probability rate (Vector engine, ``max(MIN_II, N)``
    cycles). Not supported by nikki yet (NotImplementedError)."""
    _unsupported("dropout")


def atomic_rmw(dst: NkiTensor, value: NkiTensor, op: Operator, *, mask: LegacyMask = None) -> None:
    """Beta 1: ``dst = op(dst, value)`` as one read-modify-write of HBM. Not supported by nikki yet
    (NotImplementedError)."""
    _unsupported("atomic_rmw")


def all_reduce(x: NkiTensor, op: Operator, program_axes: Sequence[int], *, dtype: DTypeLike = None,
               mask: LegacyMask = None, parallel_reduce: bool = True, asynchronous: bool = False) -> NkiTensor:
    """Beta 1: x reduced with op across the SPMD programs along program_axes. Not supported by
    nikki yet (NotImplementedError)."""
    _unsupported("all_reduce")


def loop_reduce(x: NkiTensor, op: Operator, loop_indices: Any, dtype: DTypeLike = None,
                mask: LegacyMask = None) -> NkiTensor:
    """Beta 1: `x` reduced with `op` over the iterations of the loops whose indices are given, as
    the value assigned to a tile (``acc[...] = nl.loop_reduce(psum, op=np.add, loop_indices=[k])``).
    Loops unroll at trace time here, so the first iteration (every index 0) assigns x and later
    ones fold x into the assigned tile with `op`."""
    x = _isa._check_tensor(x, "x")
    first = builtins.all(int(i) == 0 for i in (loop_indices if isinstance(loop_indices, (list, tuple))
                                                 else [loop_indices]))
    value = copy(x, dtype=dtype, mask=mask)
    return value if first else LoopReduction(value._ctx, value._view, _isa.alu_op(op, "op"))


# --- reductions -----------------------------------------------------------------------------

def _reduce(op, x, axis, dtype=None, keepdims=False, mask=None, negate=False, api="reduce"):
    x = _isa._check_tensor(x, "x")
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    axes = tuple(check_int(a, f"nl.{api}: axis", -x.ndim, x.ndim - 1) for a in axes)
    axes = tuple(a + x.ndim if a < 0 else a for a in axes)
    kept = [1 if d in axes else n for d, n in enumerate(x.shape)] if keepdims else \
        [n for d, n in enumerate(x.shape) if d not in axes]
    if len(kept) < 2:
        kept = kept + [1] * (2 - len(kept))
    out = _result_tile(kept, to_dtype(dtype) if dtype is not None else x.dtype)
    trailing = tuple(range(x.ndim - len(axes), x.ndim))
    if 0 not in axes and tuple(sorted(axes)) != trailing:
        # The engine reduces trailing axes; a permuted view (free) puts the reduced axes last.
        order = [d for d in range(x.ndim) if d not in axes] + sorted(axes)
        x = x.permute(order)
        axes = trailing
    _isa._tensor_reduce(out, op, x, list(axes), negate=negate, keepdims=keepdims, mask=mask)
    return out


def sum(x: NkiTensor, axis: int | Sequence[int], dtype: DTypeLike = None, keepdims: bool = False,
        mask: LegacyMask = None) -> NkiTensor:
    """Sum over the given free axes.

    Parameters: ``x``: a tile in SBUF or PSUM; ``axis``: one free axis or several (never the
    partition axis 0); ``dtype``: the result's dtype (default x.dtype); ``keepdims``: keep the
    reduced axes with size 1. Engine: Vector (nisa.tensor_reduce). Cost: ``N`` cycles, ``N/2`` for
    bf16 add / maximum; N the elements per partition.
    """
    return _reduce(add, x, axis, dtype, keepdims, mask, api="sum")


def prod(x: NkiTensor, axis: int | Sequence[int], dtype: DTypeLike = None, keepdims: bool = False,
         mask: LegacyMask = None) -> NkiTensor:
    """Product over the given free axes.

    Parameters: ``x``: a tile in SBUF or PSUM; ``axis``: one free axis or several (never the
    partition axis 0); ``dtype``: the result's dtype (default x.dtype); ``keepdims``: keep the
    reduced axes with size 1. Engine: Vector (nisa.tensor_reduce). Cost: ``N`` cycles, ``N/2`` for
    bf16 add / maximum; N the elements per partition.
    """
    return _reduce(multiply, x, axis, dtype, keepdims, mask, api="prod")


def max(x: NkiTensor, axis: int | Sequence[int], dtype: DTypeLike = None, keepdims: bool = False,
        mask: LegacyMask = None) -> NkiTensor:
    """Maximum over the given free axes.

    Parameters: ``x``: a tile in SBUF or PSUM; ``axis``: one free axis or several (never the
    partition axis 0); ``dtype``: the result's dtype (default x.dtype); ``keepdims``: keep the
    reduced axes with size 1. Engine: Vector (nisa.tensor_reduce). Cost: ``N`` cycles, ``N/2`` for
    bf16 add / maximum; N the elements per partition.
    """
    return _reduce(maximum, x, axis, dtype, keepdims, mask, api="max")


def min(x: NkiTensor, axis: int | Sequence[int], dtype: DTypeLike = None, keepdims: bool = False,
        mask: LegacyMask = None) -> NkiTensor:
    """Minimum over the given free axes.

    Parameters: ``x``: a tile in SBUF or PSUM; ``axis``: one free axis or several (never the
    partition axis 0); ``dtype``: the result's dtype (default x.dtype); ``keepdims``: keep the
    reduced axes with size 1. Engine: Vector (nisa.tensor_reduce). Cost: ``N`` cycles, ``N/2`` for
    bf16 add / maximum; N the elements per partition.
    """
    return _reduce(minimum, x, axis, dtype, keepdims, mask, api="min")


def all(x: NkiTensor, axis: int | Sequence[int], dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """1 where every element along the axes is nonzero.

    Parameters as in nl.sum. Engine: Vector (nisa.tensor_reduce with nl.logical_and). Cost: ``N``
    cycles; the result is bool_ unless dtype= says.
    """
    return _reduce(logical_and, x, axis, dtype if dtype is not None else bool_, False, mask, api="all")


def mean(x: NkiTensor, axis: int | Sequence[int], dtype: DTypeLike = None, keepdims: bool = False,
         mask: LegacyMask = None) -> NkiTensor:
    """Mean over the given free axes (computed in fp32).

    Parameters: ``x``: a tile in SBUF or PSUM; ``axis``: one free axis or several (never the
    partition axis 0); ``dtype``: the result's dtype (default x.dtype); ``keepdims``: keep the
    reduced axes with size 1. Engine: Vector (nisa.tensor_reduce). Cost: ``N`` cycles, ``N/2`` for
    bf16 add / maximum; N the elements per partition. Plus one nisa.tensor_scalar on the ``[P, 1]``
    result.
    """
    s = _reduce(add, x, axis, float32, keepdims, mask, api="mean")
    count = x.size // (s.size if s.size else 1)
    out = _result_tile(s.shape, to_dtype(dtype) if dtype is not None else x.dtype)
    _isa._tensor_scalar(out, s, multiply, 1.0 / count, mask=mask)
    return out


def var(x: NkiTensor, axis: int | Sequence[int], dtype: DTypeLike = None, keepdims: bool = False,
        mask: LegacyMask = None) -> NkiTensor:
    """Population variance over the given free axes: mean((x - mean(x)) ** 2), computed in fp32.

    Parameters as in nl.sum. Engine: Vector (reductions and element-wise passes over x). Cost: a few
    ``N``-cycle passes.
    """
    x = _isa._check_tensor(x, "x")
    m = mean(x, axis, dtype=float32, keepdims=True, mask=mask)
    centered = _result_tile(x.shape, float32)
    if _per_partition(m):
        _isa._tensor_scalar(centered, x, subtract, m, mask=mask)
    else:  # the mean repeats along the reduced (trailing) axes: a stride-0 broadcast view
        _isa._tensor_tensor(centered, x, m.broadcast_to(x.shape), subtract, mask=mask)
    sq = _result_tile(x.shape, float32)
    _isa._tensor_tensor(sq, centered, centered, multiply, mask=mask)
    return mean(sq, axis, dtype=to_dtype(dtype) if dtype is not None else x.dtype, keepdims=keepdims, mask=mask)


register_op(sum, alu="add")
register_op(prod, alu="multiply")
register_op(max, alu="maximum")
register_op(min, alu="minimum")
register_op(mean, alu="average")


class _OperatorConstant:
    """An NKI operator constant that is not a tile function, such as ``nl.average`` (the
    tensor_partition_reduce operator)."""

    __slots__ = ("__name__",)

    def __init__(self, name: str):
        self.__name__ = name

    def __repr__(self) -> str:
        return f"nl.{self.__name__}"

    def __call__(self, *args, **kwargs):
        raise TypeError(f"nl.{self.__name__} is an operator for nki.isa instructions (op=nl.{self.__name__}), "
                        "not a function")


average = _OperatorConstant("average")
register_op(average, alu="average")
# Operators of nisa.activate2 (NeuronCore-v4, which nikki does not model): named, so kernels that
# pick them on other paths import and run.
prelu = _OperatorConstant("prelu")
bypass = _OperatorConstant("bypass")


def gemm_grid() -> Any:
    """Beta 1's grid of the Tensor engine's tiles: not supported (NotImplementedError)."""
    _unsupported("gemm_grid")


def gemm_stationary_grid() -> Any:
    """Beta 1's grid of the stationary matmul tiles: not supported (NotImplementedError)."""
    _unsupported("gemm_stationary_grid")


class _FloatLimits:
    """Legacy ``nl.fp32`` / ``nl.bfp16``: ``.min`` is the dtype's most negative value (Beta 1 used
    ``on_false_value=nl.fp32.min`` in selections)."""

    __slots__ = ("name", "min")

    def __init__(self, name: str, minimum: float):
        self.name = name
        self.min = minimum

    def __repr__(self) -> str:
        return f"nl.{self.name}"


fp32 = _FloatLimits("fp32", -3.4028234663852886e38)  # bit pattern 0xff7fffff
bfp16 = _FloatLimits("bfp16", float("-inf"))  # bit pattern 0xff80, as Beta 1 defined it


# --- composite operations -------------------------------------------------------------------

def softmax(x: NkiTensor, axis: int = -1, dtype: DTypeLike = None, compute_dtype: DTypeLike = None,
            mask: LegacyMask = None) -> NkiTensor:
    """softmax along the last free axis: exp(x - max) / sum(exp(x - max)).

    Parameters: ``axis``: the last free axis; ``dtype``: the result's dtype; ``compute_dtype``:
    accepted for Beta 1 (nikki computes in fp32). Engine: Vector (a negated max reduction, the
    reciprocal of the sum, the final scaling) and Scalar (exp with the bias -max and an add
    reduction). Cost: about ``3N`` cycles over the engines plus ``[P, 1]`` steps.
    """
    x = _isa._check_tensor(x, "x")
    axis = check_int(axis, "nl.softmax: axis")
    axis_n = axis + x.ndim if axis < 0 else axis
    if axis_n != x.ndim - 1 or axis_n == 0:
        raise kernel_error_at(user_frame(2), f"nl.softmax: axis={axis} is not the last free axis of a tile of shape "
                              f"{x.shape}", hint="transpose so the softmax axis is the last free dim")
    p = x.shape[0]
    neg_max = _result_tile((p, 1), float32)
    _isa._tensor_reduce(neg_max, maximum, x, [axis_n], negate=True, mask=mask)
    e = _result_tile(x.shape, float32)
    total = _result_tile((p, 1), float32)
    _isa._activation(e, exp, x, bias=neg_max, reduce_op=add, reduce_res=total,
                     reduce_cmd=_isa.reduce_cmd.reset_reduce, mask=mask)
    inv = _result_tile((p, 1), float32)
    _isa._reciprocal(inv, total, mask=mask)
    out = _result_tile(x.shape, to_dtype(dtype) if dtype is not None else x.dtype)
    _isa._tensor_scalar(out, e, multiply, inv, mask=mask)
    return out


def rms_norm(x: NkiTensor, w: NkiTensor, axis: int, n: float, epsilon: float = 1e-6, dtype: DTypeLike = None,
             compute_dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """x / sqrt(mean(x ** 2) + epsilon) * w along the last free axis; w is [1, D] or [P, D].

    Parameters: ``axis``: the last free axis; ``n``: the element count the mean divides by;
    ``epsilon``: added to the mean of squares. Engine: Scalar (squares with an add reduction),
    GpSimd (rsqrt) and Vector (scaling). Cost: about ``3N`` cycles over the engines.
    """
    x = _isa._check_tensor(x, "x")
    p, d = x.shape[0], x.shape[-1]
    squares = _result_tile(x.shape, float32)
    ss = _result_tile((p, 1), float32)
    _isa._activation(squares, square, x, reduce_op=add, reduce_res=ss, reduce_cmd=_isa.reduce_cmd.reset_reduce,
                     mask=mask)
    mean_eps = _result_tile((p, 1), float32)
    n = check_real(n, "nl.rms_norm: n", finite=True)
    if n <= 0:
        raise kernel_error_at(user_frame(2), f"nl.rms_norm: n must be the positive element count, got {n}")
    epsilon = check_real(epsilon, "nl.rms_norm: epsilon", finite=True)
    _isa._tensor_scalar(mean_eps, ss, multiply, 1.0 / n, op1=add, operand1=epsilon, mask=mask)
    inv_rms = _result_tile((p, 1), float32)
    _isa._tensor_scalar(inv_rms, mean_eps, rsqrt, 0.0, engine=_isa.engine.gpsimd, mask=mask)
    normed = _result_tile(x.shape, float32)
    _isa._tensor_scalar(normed, x, multiply, inv_rms, mask=mask)
    w = _isa._check_tensor(w, "w")
    if w.ndim == 1:
        w = w.reshape(1, w.shape[0])
    if w.shape[0] != p:
        wide = _result_tile((p, w.shape[-1]), w.dtype)
        _isa.dma_copy(wide, w.broadcast(0, p) if w.shape[0] == 1 else w)
        w = wide
    elif w.buffer.is_hbm:
        w = copy(w)
    out = _result_tile(x.shape, to_dtype(dtype) if dtype is not None else x.dtype)
    _isa._tensor_tensor(out, normed, w, multiply, mask=mask)
    return out


def matmul(x: NkiTensor, y: NkiTensor, transpose_x: bool = False, mask: LegacyMask = None) -> NkiTensor:
    """x @ y into a new fp32 PSUM tile. With transpose_x=True, x is given as x.T ([K, M], the
    stationary layout); otherwise x [M, K] is transposed on the Tensor engine first.

    Limits: x is at most [128, 128] (as stationary), y [128, 512]. Engine: Tensor (nisa.nc_matmul,
    plus nisa.nc_transpose without transpose_x). Cost: ``max(min(64, M), N)`` cycles, four times
    that for fp32 inputs.
    """
    x, y = _isa._check_tensor(x, "x"), _isa._check_tensor(y, "y")
    if not transpose_x:
        x = transpose(x)
        if x.buffer is psum:
            x = copy(x)
    return _isa._legacy_nc_matmul(x, y, mask=mask)


def transpose(x: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """2-D transpose: on the Vector engine up to 32x32, else on the Tensor engine into PSUM.

    Limits: a 2-D tile of at most 128 x 128. Engine: Vector (up to 32x32, ``max(MIN_II, N)`` cycles)
    or Tensor (``max(P, min(64, F))`` cycles).
    """
    return _isa._legacy_nc_transpose(x, dtype=dtype, mask=mask, api="nl.transpose")


def load(src: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Loads an HBM view into a new SBUF tile (dim 0 becomes the partition dim).

    Parameters: ``src``: an HBM view (its dim 0 becomes the partition dim, at most 128); ``dtype``:
    the tile's dtype (converted through fp32). Engine: the DMA queues (nisa.dma_copy). Cost: not
    published per instruction; transfers of 2 KiB or more per partition approach the DMA bandwidth.
    """
    src = _isa._check_tensor(src, "src")
    if not src.buffer.is_hbm:
        raise kernel_error_at(user_frame(2), f"Expected operand 'src' of 'load' to be in address space 'hbm', but got "
                              f"a tile in '{src.buffer.name}' instead.", hint="use nl.copy for on-chip tiles")
    # A 1-D view is a partition vector ([N] loads as [N, 1]), as Beta-1 kernels use it for scale=;
    # a single element (t[b, h]) loads as a [1, 1] tile.
    shape = src.shape if src.ndim >= 2 else (src.shape[0], 1) if src.ndim == 1 else (1, 1)
    tile = _result_tile(shape, to_dtype(dtype) if dtype is not None else src.dtype)
    _isa.dma_copy(tile, src if src.ndim >= 2 else src.reshape(shape), mask=mask)
    return tile


def store(dst: NkiTensor, value: NkiTensor, mask: LegacyMask = None) -> None:
    """Stores a tile into an HBM view (PSUM tiles are staged through SBUF).

    Parameters: ``dst``: an HBM view of value's shape; ``value``: an SBUF (or PSUM) tile. Engine:
    the DMA queues (nisa.dma_copy; a PSUM tile first copied on the Vector engine). Cost: as nl.load.
    """
    dst = _isa._check_tensor(dst, "dst")
    value = _isa._check_tensor(value, "value")
    if not dst.buffer.is_hbm:
        raise kernel_error_at(user_frame(2), f"Expected operand 'dst' of 'store' to be in address space 'hbm', but got "
                              f"a tile in '{dst.buffer.name}' instead.", hint="assign on-chip tiles with nl.copy")
    if value.buffer is psum:
        staged = _result_tile(value.shape, value.dtype)
        _isa._tensor_copy(staged, value, mask=mask)
        value = staged
    _isa.dma_copy(dst, value, mask=mask)


def load_transpose2d(src: NkiTensor, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor:
    """Loads a 2-D HBM view transposed (the DMA reads it column by column).

    Engine: the DMA queues (a strided nisa.dma_copy). Cost: a transposing DMA reaches a fraction of
    a plain copy's bandwidth.
    """
    src = _isa._check_tensor(src, "src")
    return load(src.permute((1, 0)), dtype=dtype, mask=mask)


def where(condition: NkiTensor, x: TileOrNumber, y: TileOrNumber, dtype: DTypeLike = None,
          mask: LegacyMask = None) -> NkiTensor:
    """x where condition is nonzero, else y (x, y tiles or numbers).

    Engine: Vector (y copied or filled into the result, then x copied over it by
    nisa.tensor_copy_predicated). Cost: ``max(MIN_II, N)`` to ``max(MIN_II, 2N)`` cycles per pass.
    """
    condition = _isa._check_tensor(condition, "condition")
    ref = x if isinstance(x, NkiTensor) else y if isinstance(y, NkiTensor) else condition
    dt = to_dtype(dtype) if dtype is not None else (ref.dtype if ref is not condition else float32)
    shape = _isa._operand_shape(condition, x, y)
    condition, x, y = _isa._spread(condition, shape), _isa._spread(x, shape), _isa._spread(y, shape)
    out = _result_tile(shape, dt)
    if isinstance(y, NkiTensor):
        _isa._tensor_copy(out, y, mask=mask)
    else:
        _isa._assign_scalar(out, _isa._number(y, "nl.where: y"))
    pred = condition
    if condition.dtype not in (uint8, uint16, uint32, bool_):
        pred = _result_tile(condition.shape, uint8)
        _isa._tensor_scalar(pred, condition, not_equal, 0.0)
    _isa.tensor_copy_predicated(out, x if isinstance(x, NkiTensor) else _isa._number(x, "nl.where: x"), pred,
                                mask=mask)
    return out


def broadcast_to(x: NkiTensor, shape: Sequence[int], dtype: DTypeLike = None) -> NkiTensor:
    """A stride-0 view of x broadcast to `shape` (size-1 dims repeat)."""
    return _isa._check_tensor(x, "x").broadcast_to(shape)


def expand_dims(x: NkiTensor, axis: int) -> NkiTensor:
    """A view of x with a size-1 dim inserted at `axis`."""
    return _isa._check_tensor(x, "x").expand_dim(axis)


def static_cast(input_data: Any, dtype: DTypeLike) -> Any:
    """A copy of input_data converted to dtype: a new tile inside a kernel; outside one (Beta 1 test
    code casts host arrays with it), a numpy array of the dtype's numpy type."""
    if isinstance(input_data, NkiTensor):
        return copy(input_data, dtype=dtype)
    if type(input_data).__module__.startswith("torch"):
        return input_data.to(torch_dtype(dtype))
    import numpy as np

    target = _numpy_dtype(dtype)
    data = np.asarray(input_data)
    if data.dtype.kind == "V" and data.dtype != target:
        data = data.astype(np.float32)  # ml_dtypes' types (bfloat16, fp8) convert to each other through fp32
    return data.astype(target)


class _FloatInfo:
    """Limits of a floating-point NKI dtype (``nl.finfo``), as numpy's finfo reports them."""

    def __init__(self, dt, bits, eps, max_value, tiny):
        self.dtype = dt
        self.bits = bits
        self.eps = eps
        self.max = max_value
        self.min = -max_value
        self.tiny = self.smallest_normal = tiny

    def __repr__(self) -> str:
        return f"finfo(min={self.min}, max={self.max}, eps={self.eps}, dtype={self.dtype.name})"


def finfo(dtype: DTypeLike) -> _FloatInfo:
    """Machine limits of a floating-point dtype (bits, eps, min, max, tiny); works outside kernels."""
    import numpy as np

    dt = to_dtype(dtype)
    if not dt.is_float:
        raise TypeError(f"nl.finfo: {dt.name} is not a floating-point dtype; use nl.iinfo")
    if dt.name == "tfloat32":  # 1 sign, 8 exponent, 10 mantissa bits held in fp32
        return _FloatInfo(dt, 19, 2.0 ** -10, float((2 - 2.0 ** -10) * 2.0 ** 127), float(2.0 ** -126))
    try:
        import ml_dtypes

        info = ml_dtypes.finfo(_numpy_dtype(dt))
    except ImportError:  # pragma: no cover - ml_dtypes is a dependency
        info = np.finfo(_numpy_dtype(dt))
    return _FloatInfo(dt, int(info.bits), float(info.eps), float(info.max), float(info.tiny))


def iinfo(dtype: DTypeLike) -> Any:
    """Machine limits of an integer dtype (numpy's iinfo of its numpy type); works outside kernels."""
    import numpy as np

    dt = to_dtype(dtype)
    if dt.is_float:
        raise TypeError(f"nl.iinfo: {dt.name} is not an integer dtype; use nl.finfo")
    return np.iinfo(_numpy_dtype(dt) if dt.name != "bool_" else np.uint8)


# The tile operators of NkiTensor (a + b, -a, abs(a), ~a, t.astype(dt)) are these functions.
_hooks.binary_op = _binary_op
_hooks.negative = negative
_hooks.abs = abs
_hooks.invert = invert
_hooks.copy = copy
