"""nki.isa: the NeuronCore instructions.

Every instruction accepts the current destination-passing form (``nisa.op(dst, ...)``, NKI 0.2+)
and the legacy functional form (``tile = nisa.op(...)``, with ``dtype=`` and ``mask=``), told
apart by their arguments. Hardware rules are checked when the kernel is compiled, with the user's
file and line.
"""

from __future__ import annotations

import dataclasses

import enum
import inspect
import math
import re
import sys
import types as _types
import typing
from typing import Any, Sequence, Union, overload

import numpy as np

from . import _core
from .arguments import EXACT_INT_LIMIT, argument_error, check_bool, check_int, check_real, is_bool, is_int, is_real
from .dtypes import to_dtype
from .errors import KernelCallError, KernelError, kernel_error_at, kernel_error_in_traceback, user_frame
from .ops import act_func, alu_op
from .hooks import hooks
from .registers import VirtualRegister
from .tensor import ComparisonTile, NkiTensor, ndarray, psum, sbuf
from .tracing import assigned_name, current

__all__ = [
    "engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "nc_version", "dma_engine",
    "tensor_engine", "vector_engine", "scalar_engine", "gpsimd_engine", "unknown_engine",
    "VirtualRegister", "NkiValidationError",
    "dma_copy", "tensor_copy", "tensor_tensor", "tensor_scalar", "scalar_tensor_tensor", "activation",
    "activation_reduce", "tensor_reduce", "tensor_scalar_reduce", "nc_matmul", "nc_transpose", "memset",
    "iota", "affine_select", "bn_stats", "bn_aggr", "tensor_tensor_scan", "reciprocal",
    "tensor_copy_predicated", "select_reduce", "max8", "nc_find_index8", "tensor_partition_reduce",
    "register_alloc", "register_move", "register_load", "register_store", "get_nc_version",
    "get_nc_sub_version", "dma_transpose", "dma_compute", "nc_stream_shuffle", "nc_match_replace8", "range_select",
    "nc_n_gather", "local_gather", "nonzero_with_count", "core_barrier", "sendrecv",
]


class engine(enum.IntEnum):
    """Engines an instruction may be placed on (nisa.engine)."""

    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


_Engine = engine  # the enum, for functions whose `engine` parameter shadows it

tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown

_ENGINES = {
    engine.unknown: _core.Engine.unknown, engine.tensor: _core.Engine.tensor, engine.scalar: _core.Engine.scalar,
    engine.gpsimd: _core.Engine.gpsimd, engine.dma: _core.Engine.dma, engine.vector: _core.Engine.vector,
    engine.sync: _core.Engine.sync,
}


class reduce_cmd(enum.IntEnum):
    """Accumulator control of activation / select_reduce (nisa.reduce_cmd)."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


_ReduceCmd = reduce_cmd
# The binding's enum for each command (constructing a bound enum from an int is slow).
_CORE_REDUCE_CMD: dict[Any, Any] = {cmd: _core.ReduceCmd(int(cmd)) for cmd in reduce_cmd}

class dge_mode(enum.IntEnum):
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.IntEnum):
    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):
    none = "none"
    double_row = "double_row"


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.IntEnum):
    dma = 1
    gpsimd_dma = 2


_DmaEngine = dma_engine  # the enum, for sendrecv whose `dma_engine` parameter shadows it


# Annotations of the public signatures. An operator is an nl function (nl.add, nl.exp), a numpy
# ufunc (np.add) or a nikki._core enum member; a dtype anything nl accepts (nl.float32, np.float32,
# "bfloat16"); an operand a number or a [P, 1] tile; a legacy mask an index-expression predicate.
Operator = Any
DTypeLike = Any
LegacyMask = Any
Operand = Union[NkiTensor, float]
Pattern = Sequence[Sequence[int]]

_FLOAT32 = to_dtype("float32")
_UINT32 = to_dtype("uint32")

# NKI's "hardware constraints are violated" exception. nikki raises nikki.KernelError for those,
# so the NKI name is that class: ``except nisa.NkiValidationError`` catches nikki's errors.
NkiValidationError = KernelError


# --- emission helpers -----------------------------------------------------------------------

def _operand(x, opcode=None, slot: int = 0):
    if x is None:
        return None
    if isinstance(x, NkiTensor):
        return x._view
    if isinstance(x, VirtualRegister):
        return x._reg
    if x.__class__ is int and -EXACT_INT_LIMIT < x < EXACT_INT_LIMIT:
        return x
    what = f"nisa.{opcode.name}: {opcode.slot_names[slot]}" if opcode is not None else "operand"
    return _number(x, what)


# Integer attributes the engines compute with in int32 (iota and affine_select offsets and patterns).
_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def _int32(value, what: str) -> int:
    value = check_int(value, what)
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise kernel_error_at(user_frame(), f"{what} {value} does not fit in int32, which the engines compute it in",
                              limit=f"an integer in [{_INT32_MIN}, {_INT32_MAX}]")
    return value


def _number(value, what: str) -> float:
    """A number operand of an instruction (a bool is 0 or 1, NaN and infinities are values), or a
    KernelError naming the argument `what`: strings, None and arrays are not numbers."""
    if value is True or value is False or isinstance(value, np.bool_):
        return float(value)
    return check_real(value, what)


# Opcodes whose operands are never staged by _partition_broadcast. Callers pass the enum's class
# attributes, so identity comparisons suffice (and are much cheaper than the enum's __eq__).
_DMA_COPY = _core.Opcode.dma_copy
_DEVICE_PRINT = _core.Opcode.device_print


def _emit(opcode, operands, eng=engine.unknown, name=None, **attrs) -> int:
    ctx = current()
    loc = ctx.location()
    # One pass over the operands (this runs for every traced instruction): views of tensors go
    # straight to the builder, slots after dst get their partition broadcasts staged first.
    stage = opcode is not _DMA_COPY and opcode is not _DEVICE_PRINT
    converted = []
    for i, o in enumerate(operands):
        if o.__class__ is NkiTensor:
            view = o._view
            if stage and i and view.is_partition_broadcast:
                view = _partition_broadcast(o)._view
            converted.append(view)
        elif o is None or o.__class__ is float:
            converted.append(o)
        else:
            if stage and i:
                o = _partition_broadcast(o)
            converted.append(_operand(o, opcode, i))
    index = ctx.builder.emit(opcode, _engine(eng), loc, converted, name or "", **attrs)
    if ctx.masked_writes and converted:
        _track_masked_write(ctx, converted[0], index)
    return index


def _partition_broadcast(x):
    """An SBUF/PSUM view repeated across partitions (stride 0 on the partition dim, as
    ``t[0:1, :].broadcast(0, 128)`` gives) cannot be read by an engine, which streams
    consecutive partitions; it is first copied into a full tile by a DMA. Legacy
    ``t.broadcast_to(shape)`` makes that copy where it is called (NkiTensor.broadcast_to), so a
    broadcast made before a loop is copied once, not at every use in the loop."""
    if not isinstance(x, NkiTensor) or not x._view.is_partition_broadcast or not x.buffer.is_on_chip:
        return x
    staged = _new_tile(x.shape, x.dtype, sbuf, name="partition_broadcast")
    _emit(_DMA_COPY, (staged, x), _core.Engine.dma)
    return staged


def _engine(e) -> _core.Engine:
    if e.__class__ is _core.Engine:  # an identity test: hashing a bound enum is slow
        return e
    try:
        core = _ENGINES.get(e)  # a dict lookup before the IntEnum constructor, which is slow
        if core is not None:
            return core
        return _ENGINES[engine(e)]
    except (ValueError, TypeError):
        raise kernel_error_at(user_frame(3), f"engine={e!r} is not an engine", hint="use nisa.engine.vector, ...") from None


_CORE_IDLE = _CORE_REDUCE_CMD[_ReduceCmd.idle]


def _core_reduce_cmd(cmd) -> _core.ReduceCmd:
    if cmd is _ReduceCmd.idle:  # the default, tested by identity: hashing an enum member is slow
        return _CORE_IDLE
    core = _CORE_REDUCE_CMD.get(cmd) if isinstance(cmd, int) else None
    if core is None:
        raise kernel_error_at(user_frame(3), f"reduce_cmd={cmd!r} is not a reduce command",
                              hint="use nisa.reduce_cmd.idle, reset, reduce, reset_reduce or load_reduce")
    return core


_BINDING_ERROR = re.compile(r"(\w+)\(\) (got an unexpected keyword argument|got multiple values for argument|"
                            r"missing \d+ required|takes \d+|takes from \d+)")


def _call_error(err: TypeError) -> KernelError | None:
    """The KernelError (also a TypeError) for calling a public instruction with arguments neither of
    its forms takes: Python's message names the private function the public one forwarded them to;
    this one names the public function and the form the call was read as, located at the user's
    call. None for any other TypeError (one raised while an instruction runs)."""
    codes = []
    tb = err.__traceback__
    while tb is not None:
        codes.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    if codes and codes[-1] is to_dtype.__code__:  # a dtype argument nikki cannot read (nl.ndarray(shape, None))
        return kernel_error_in_traceback(err, str(err), cls=KernelCallError)
    if not codes or codes[-1].co_filename != __file__:
        return None
    match = _BINDING_ERROR.match(str(err))
    if match is None or not isinstance(globals().get(match.group(1)), _types.FunctionType):
        return None  # not a call of one of this module's functions with the wrong arguments
    entry = next(i for i, code in enumerate(codes) if code.co_filename == __file__)  # the call into nki.isa
    public = codes[entry]
    if public.co_name.startswith("_") or getattr(globals().get(public.co_name), "__code__", None) is not public:
        return None  # raised inside an instruction, not by the call into one of its forms
    legacy = match.group(1).startswith("_legacy") or any(c.co_name.startswith("_legacy") for c in codes[entry:])
    form = "the legacy form (returning a new tile)" if legacy else "the form with dst"
    message = str(err).split("() ", 1)[-1]
    return kernel_error_in_traceback(err, f"nisa.{public.co_name}: {message} (read as {form})",
                                     hint=f"see help(nisa.{public.co_name}) for its parameters", cls=KernelCallError)


def _flag(value, api: str, param: str) -> bool:
    """A bool instruction attribute; the common literals are tested by identity (tracing hot path)."""
    if value is False or value is True:
        return value
    return check_bool(value, f"nisa.{api}: {param}")


def _alu_operand(op: _core.AluOp, operand, api: str, op_param: str, operand_param: str):
    """The operand of ALU operator `op`: None only for unary operators, which ignore it."""
    if operand is not None:
        return operand
    if op.is_unary:
        return 0.0
    raise kernel_error_at(user_frame(), f"nisa.{api}: {operand_param} is None, but {op_param}={op.name} takes an "
                          "operand", hint=f"pass a number or a [P, 1] tile as {operand_param}")


def _check_tensor(x, param: str) -> NkiTensor:
    if not isinstance(x, NkiTensor):
        raise kernel_error_at(user_frame(3), f"{param} must be a tensor, got {type(x).__name__}")
    return x


def _not_implemented(what: str):
    raise NotImplementedError(f"{what} is not supported by nikki yet (see docs/api-coverage.md)")


def _new_tile(shape, dt, buffer=sbuf, name="") -> NkiTensor:
    return ndarray(tuple(shape), dtype=dt, buffer=buffer, name=name)


def _tile_shape(data: NkiTensor) -> tuple:
    """Shape of a legacy result tile for `data`: SBUF/PSUM views keep their shape, HBM views too."""
    return tuple(data.shape)


def _wider(a, b):
    """The higher-precision dtype of two (legacy default output dtype of two-input ops)."""
    a, b = to_dtype(a), to_dtype(b)
    if a == b:
        return a
    if a.is_float != b.is_float:
        return a if a.is_float else b
    if a.itemsize != b.itemsize:
        return a if a.itemsize > b.itemsize else b
    return _FLOAT32 if a.is_float else (a if a.name.startswith("int") else b)


def _legacy(kwargs, is_legacy: bool, args=(), first: str = "") -> bool:
    """True when a call is the legacy functional form (no dst). ``dst=`` always means the current
    form; so does passing the legacy first parameter `first` (e.g. ``data``) by keyword next to a
    positional tensor, which can then only be dst (``nisa.tensor_scalar(d, data=x, ...)``).
    Otherwise `is_legacy`, the per-instruction test on the positional arguments, decides."""
    if "dst" in kwargs:
        return False
    if first and first in kwargs and args and isinstance(args[0], NkiTensor):
        return False
    return is_legacy


def _legacy_operand(x) -> bool:
    """Whether a positional argument where the current form has a tensor reads as the legacy form's
    argument there (an operator, a number, a shape): neither a tensor nor None, since None is a
    missing tensor, reported by name in the current form."""
    return x is not None and x.__class__ is not NkiTensor


def _masked_extras(mask, *extras):
    """Applies a legacy mask= to an instruction's per-partition operands ([P, 1] scalars, bias,
    reduce_res): they follow the partitions the mask keeps. Numbers and None pass through."""
    if mask is None:
        return extras
    tensors = [e for e in extras if isinstance(e, NkiTensor)]
    if not tensors:
        return extras
    masked = hooks.apply_mask(mask, *tensors)
    if masked is None:
        return extras
    it = iter(masked)
    return tuple(next(it) if isinstance(e, NkiTensor) else e for e in extras)


def _masked(mask, dst, *operands):
    """Applies a legacy mask= predicate: the operands restricted to the masked iteration space,
    or None when the mask selects nothing (the instruction is skipped)."""
    if mask is None:
        return (dst, *operands)
    ops = hooks.apply_mask(mask, dst, *operands)
    _note_masked_write(dst, mask, skipped=ops is None)
    return ops


class _MaskedWrite:
    """A fresh tile whose first writer is a masked instruction: the tile's `view` holds values only
    where `mask` kept them. `index` is that instruction's, set when it is emitted (None before,
    -1 when the mask kept nothing and no instruction was emitted)."""

    __slots__ = ("view", "mask", "index")

    def __init__(self, view, mask, index):
        self.view, self.mask, self.index = view, mask, index


def _note_masked_write(dst, mask, skipped: bool) -> None:
    """In NKI a legacy ``t[...] = op(..., mask=m)`` is masked as a whole: the elements the mask
    drops keep t's values. nikki traces it as the masked op into a fresh tile, then the assignment;
    remembering the mask of the fresh tile's only write lets the assignment copy just the kept
    elements (see _masked_write_of) instead of the undefined rest."""
    if dst.__class__ is not NkiTensor:  # fresh tiles are plain; index-expression views resolve lazily
        return
    ctx = current()
    view = dst._view
    builder = ctx.builder
    if builder.storage_defined_at(view.storage) == builder.num_instructions:  # nothing wrote it yet
        ctx.masked_writes[view.storage] = _MaskedWrite(view, mask, -1 if skipped else None)
    else:
        ctx.masked_writes.pop(view.storage, None)


def _track_masked_write(ctx, dst_view, index: int) -> None:
    """Called for each instruction writing a tile with a noted masked write: the first such
    instruction is the masked one; any later write makes the tile ordinary again."""
    storage = getattr(dst_view, "storage", None)
    entry = ctx.masked_writes.get(storage)
    if entry is None:
        return
    if entry.index is None:
        entry.index = index
    else:
        del ctx.masked_writes[storage]


def _masked_write_of(value: NkiTensor):
    """The mask of the one masked instruction that wrote `value` (a whole fresh tile), or None
    when `value` holds defined values everywhere it was written."""
    ctx = current()
    entry = ctx.masked_writes.get(value._view.storage) if ctx.masked_writes else None
    if entry is None or entry.index is None or not entry.view.same_as(value._view):
        return None
    return entry.mask


# --- data movement --------------------------------------------------------------------------

def dma_copy(dst: NkiTensor | None = None, src: NkiTensor | None = None, priority: int | None = None,
             oob_mode: oob_mode = oob_mode.error, dge_mode: dge_mode = dge_mode.unknown,
             engine: engine = engine.unknown, name: str | None = None, mask: LegacyMask = None,
             dst_rmw_op: Operator = None) -> None:
    """Copies ``src`` into ``dst`` through a DMA queue; dtypes convert through fp32.

    Parameters: ``dst`` / ``src``: HBM or SBUF views of the same shape (runtime offsets through
    ``.ap(scalar_offset=, vector_offset=)`` gather and scatter); ``oob_mode=skip`` leaves elements
    whose run-time address is out of bounds unmoved; ``priority``, ``dge_mode`` and ``engine`` are
    scheduling choices that change no value. Beta 1's ``dst_rmw_op=`` makes it ``dst = op(dst, src)``.

    Limits: no PSUM source or destination. Engine: the DMA queues. Cost: no per-instruction formula
    is published; transfers under 256 bytes per partition are overhead-bound, 2 KiB and more approach
    the DMA bandwidth."""
    _check_tensor(dst, "dst")
    _check_tensor(src, "src")
    ops = _masked(mask, dst, src)
    if ops is None:
        return None
    skip = _oob_skip(oob_mode)
    if dst_rmw_op is not None:  # Beta 1 / NKI 0.2: dst = dst_rmw_op(dst, src), as dma_compute does now
        _emit(_core.Opcode.dma_compute, (ops[0], ops[0], ops[1]), _core.Engine.dma, name,
              op0=alu_op(dst_rmw_op, "dst_rmw_op"), oob_skip=skip)
        return None
    _emit(_core.Opcode.dma_copy, ops, _core.Engine.dma, name, oob_skip=skip)
    return None


def _oob_skip(mode) -> bool:
    """True for oob_mode.skip: elements whose run-time address is out of bounds are not moved."""
    try:
        value = int(mode)
    except (TypeError, ValueError):
        value = -1
    if value not in (0, 1):
        raise kernel_error_at(user_frame(3), f"oob_mode={mode!r} is not an out-of-bounds mode",
                              hint="use nisa.oob_mode.error or nisa.oob_mode.skip")
    return value == 1


@overload
def tensor_copy(dst: NkiTensor, src: NkiTensor, engine: engine = engine.unknown, name: str | None = None) -> None: ...


@overload
def tensor_copy(src: NkiTensor, *, dtype: DTypeLike = None, mask: LegacyMask = None, engine: engine = engine.unknown,
                name: str | None = None) -> NkiTensor: ...


def tensor_copy(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """Copies ``src`` into ``dst`` element by element, converting to ``dst.dtype``.

    Parameters: ``dst`` / ``src``: tiles of the same shape in SBUF or PSUM; ``engine``: the Vector,
    Scalar or GpSimd engine (``engine.unknown`` lets nikki choose, as NKI does); ``name``: an
    instruction name for the profile. Legacy form: ``tile = tensor_copy(src, dtype=..., mask=...)``
    returns a new SBUF tile.

    Limits: GpSimd cannot access PSUM. The copy is bit-exact when the dtypes match.
    Engine: Vector (default), Scalar or GpSimd. Cost: ``max(MIN_II, N)`` engine cycles, N the
    elements per partition."""
    if _legacy(kwargs, len(args) + ("src" in kwargs) < 2):
        return _legacy_unary(_tensor_copy, *args, **kwargs)
    return _tensor_copy(*args, **kwargs)


def _tensor_copy(dst, src, engine=engine.unknown, name=None, mask=None):
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(src, "src"))
    if ops is not None:
        _emit(_core.Opcode.tensor_copy, ops, engine, name)


def _legacy_unary(fn, src=None, *, dtype=None, mask=None, **kwargs):
    src = _check_tensor(src if src is not None else kwargs.pop("data", None), "src")
    out = _new_tile(_tile_shape(src), to_dtype(dtype) if dtype is not None else src.dtype)
    fn(out, src, mask=mask, **kwargs)
    return out


# --- element-wise ---------------------------------------------------------------------------

@overload
def tensor_tensor(dst: NkiTensor, data1: NkiTensor, data2: NkiTensor, op: Operator, engine: engine = engine.unknown,
                  name: str | None = None) -> None: ...


@overload
def tensor_tensor(data1: NkiTensor, data2: NkiTensor, op: Operator, *, dtype: DTypeLike = None,
                  mask: LegacyMask = None, engine: engine = engine.unknown, name: str | None = None) -> NkiTensor: ...


def tensor_tensor(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst = op(data1, data2)`` element by element (computed in fp32, cast to ``dst.dtype``).

    Parameters: ``dst``, ``data1``, ``data2``: tiles with the same partition count and elements per
    partition; ``op``: an ALU operator (``nl.add``, ``nl.maximum``, ``np.multiply``, ...);
    ``engine``: ``engine.unknown`` picks the Vector engine, GpSimd for ``nl.power`` and int32
    tiles. Legacy form: ``tile = tensor_tensor(data1, data2, op, dtype=..., mask=...)``.

    Limits: the two inputs cannot both be in PSUM; bitvec operators need integer tiles.
    Engine: Vector (GpSimd as above). Cost: ``max(MIN_II, N)`` cycles with one input in PSUM, or
    bf16 SBUF inputs contiguous along the free dim under add / subtract / multiply; otherwise
    ``max(MIN_II, 2N)``."""
    if _legacy(kwargs, len(args) < 3 or len(args) == 3 and _legacy_operand(args[2]), args, "data1"):
        return _legacy_tensor_tensor(*args, **kwargs)
    return _tensor_tensor(*args, **kwargs)


def _tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None, mask=None):
    # engine.unknown resolves to NKI's default in the builder (GpSimd for power and int32 tiles)
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(data1, "data1"), _check_tensor(data2, "data2"))
    if ops is not None:
        _emit(_core.Opcode.tensor_tensor, ops, engine, name, op0=alu_op(op, "op"))


def _broadcast_shape(a: tuple, b: tuple):
    """numpy's broadcast of two shapes of one rank, or None."""
    if len(a) != len(b) or not all(m == n or m == 1 or n == 1 for m, n in zip(a, b)):
        return None
    return tuple(max(m, n) for m, n in zip(a, b))


def _same_elements(a: NkiTensor, shape: tuple) -> bool:
    """Whether tile `a` spans the partitions of `shape` with as many elements per partition."""
    return (a.shape[0] if a.shape else 1) == (shape[0] if shape else 1) and a.size == math.prod(shape)


def _operand_shape(ref: NkiTensor, *others) -> tuple:
    """The shape the tile operands of one operation are used at, by NKI's rule: a tile with ref's
    partitions and as many elements per partition is used as it is, whatever its shape; any other
    broadcasts with ref like numpy (size-1 dims repeat, as Beta 1 repeats a [P, 1] scale). Numbers
    among `others` are skipped; shapes that do not broadcast leave ref's shape (the instruction's
    own check then reports them)."""
    shape = tuple(ref.shape)
    for t in others:
        if isinstance(t, NkiTensor) and not _same_elements(t, tuple(ref.shape)):
            shape = _broadcast_shape(shape, tuple(t.shape)) or shape
    return shape


def _spread(t, shape: tuple):
    """`t` broadcast to `shape` (from _operand_shape) where it is not used as it is: a number, or
    a tile of shape's elements or not broadcasting there, is returned unchanged."""
    if isinstance(t, NkiTensor) and not _same_elements(t, shape) and _broadcast_shape(tuple(t.shape), shape) == shape:
        return t.broadcast_to(shape)
    return t


def _legacy_tensor_tensor(data1, data2, op, *, dtype=None, mask=None, engine=engine.unknown, name=None):
    data1, data2 = _check_tensor(data1, "data1"), _check_tensor(data2, "data2")
    shape = _operand_shape(data1, data2)
    data1, data2 = _spread(data1, shape), _spread(data2, shape)
    out = _new_tile(_tile_shape(data1), to_dtype(dtype) if dtype is not None else _wider(data1.dtype, data2.dtype))
    _tensor_tensor(out, data1, data2, op, engine=engine, name=name, mask=mask)
    return out


@overload
def tensor_scalar(dst: NkiTensor, data: NkiTensor, op0: Operator, operand0: Operand, reverse0: bool = False,
                  op1: Operator = None, operand1: Operand | None = None, reverse1: bool = False,
                  engine: engine = engine.unknown, name: str | None = None) -> None: ...


@overload
def tensor_scalar(data: NkiTensor, op0: Operator, operand0: Operand, reverse0: bool = False, op1: Operator = None,
                  operand1: Operand | None = None, reverse1: bool = False, *, dtype: DTypeLike = None,
                  mask: LegacyMask = None, engine: engine = engine.unknown, name: str | None = None) -> NkiTensor: ...


def tensor_scalar(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst = (data op0 operand0) op1 operand1`` element by element.

    Parameters: ``operand0`` / ``operand1``: a number or a ``[P, 1]`` tile (one value per
    partition); ``reverse0`` / ``reverse1`` swap the operands of ``op0`` / ``op1``; ``op1`` and
    ``operand1`` are optional and given together. Legacy form: ``tile = tensor_scalar(data, op0,
    operand0, ..., dtype=..., mask=...)``.

    Limits: bitvec operators run on the Vector engine only and need integer tiles.
    Engine: Vector (default), Scalar or GpSimd. Cost: ``max(MIN_II, N)`` cycles, the same for one
    operator or two."""
    if _legacy(kwargs, len(args) < 2 or _legacy_operand(args[1]), args, "data"):
        return _legacy_tensor_scalar(*args, **kwargs)
    return _tensor_scalar(*args, **kwargs)


def _tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                   engine=engine.unknown, name=None, mask=None):
    attrs = {"op0": alu_op(op0, "op0"), "reverse0": _flag(reverse0, "tensor_scalar", "reverse0"),
             "reverse1": _flag(reverse1, "tensor_scalar", "reverse1")}
    if op1 is not None:
        attrs["op1"] = alu_op(op1, "op1")
    if (op1 is None) != (operand1 is None) and not (operand1 is None and attrs["op1"].is_unary):
        raise kernel_error_at(user_frame(2), "tensor_scalar: op1 and operand1 must be given together",
                              hint="pass both op1= and operand1=, or neither")
    if op1 is not None and operand1 is None:
        operand1 = 0.0  # a unary op1 ignores its operand
    operand0 = _alu_operand(attrs["op0"], operand0, "tensor_scalar", "op0", "operand0")
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(data, "data"))
    if ops is not None:
        operand0, operand1 = _masked_extras(mask, operand0, operand1)
        _emit(_core.Opcode.tensor_scalar, (*ops, operand0, operand1), engine, name, **attrs)


def _legacy_tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, *,
                          dtype=None, mask=None, engine=engine.unknown, name=None):
    out = _new_tile(_tile_shape(data), to_dtype(dtype) if dtype is not None else data.dtype)
    _tensor_scalar(out, data, op0, operand0, reverse0, op1, operand1, reverse1, engine=engine, name=name, mask=mask)
    return out


@overload
def scalar_tensor_tensor(dst: NkiTensor, data: NkiTensor, op0: Operator, operand0: Operand, op1: Operator,
                         operand1: NkiTensor, reverse0: bool = False, reverse1: bool = False, name: str | None = None) -> None: ...


@overload
def scalar_tensor_tensor(*, data: NkiTensor, op0: Operator, operand0: Operand, op1: Operator, operand1: NkiTensor,
                         reverse0: bool = False, reverse1: bool = False, dtype: DTypeLike = None,
                         mask: LegacyMask = None, name: str | None = None) -> NkiTensor: ...


def scalar_tensor_tensor(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst = (data op0 operand0) op1 operand1``: ``operand0`` a number or ``[P, 1]`` tile,
    ``operand1`` a full tile of data's shape.

    Parameters: ``reverse0`` / ``reverse1`` swap the operands of ``op0`` / ``op1``. Legacy form (all
    keywords): ``tile = scalar_tensor_tensor(data=..., op0=..., operand0=..., op1=..., operand1=...)``.

    Engine: Vector. Cost: ``N`` cycles for bf16 data and operand1 with op0=subtract,
    op1=multiply and N even; ``2N`` otherwise."""
    if _legacy(kwargs, len(args) < 2 or _legacy_operand(args[1]), args, "data"):
        return _legacy_scalar_tensor_tensor(*args, **kwargs)
    return _scalar_tensor_tensor(*args, **kwargs)


def _scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None,
                          mask=None):
    attrs = {"op0": alu_op(op0, "op0"), "op1": alu_op(op1, "op1"),
             "reverse0": _flag(reverse0, "scalar_tensor_tensor", "reverse0"),
             "reverse1": _flag(reverse1, "scalar_tensor_tensor", "reverse1")}
    operand0 = _alu_operand(attrs["op0"], operand0, "scalar_tensor_tensor", "op0", "operand0")
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(data, "data"), _check_tensor(operand1, "operand1"))
    if ops is not None:
        d, x, y = ops
        (operand0,) = _masked_extras(mask, operand0)
        _emit(_core.Opcode.scalar_tensor_tensor, (d, x, operand0, y), engine.vector, name, **attrs)


def _legacy_scalar_tensor_tensor(data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, *, dtype=None,
                                 mask=None, name=None):
    out = _new_tile(_tile_shape(data), to_dtype(dtype) if dtype is not None else _wider(data.dtype, operand1.dtype))
    _scalar_tensor_tensor(out, data, op0, operand0, op1, operand1, reverse0, reverse1, name=name, mask=mask)
    return out


@overload
def activation(dst: NkiTensor, op: Operator, data: NkiTensor, bias: Operand | None = None, scale: Operand = 1.0,
               reduce_op: Operator = None, reduce_res: NkiTensor | None = None,
               reduce_cmd: reduce_cmd = reduce_cmd.idle, name: str | None = None) -> None: ...


@overload
def activation(op: Operator, data: NkiTensor, *, bias: Operand | None = None, scale: Operand = 1.0,
               reduce_op: Operator = None, reduce_res: NkiTensor | None = None,
               reduce_cmd: reduce_cmd = reduce_cmd.idle, mask: LegacyMask = None, dtype: DTypeLike = None,
               name: str | None = None) -> NkiTensor: ...


def activation(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst = op(data * scale + bias)`` with an activation function ``op`` (``nl.exp``, ``nl.gelu``,
    ``nl.copy``, ...).

    Parameters: ``scale``: a number or a ``[P, 1]`` fp32 tile; ``bias``: a ``[P, 1]`` tile (or a
    number, staged into one); ``reduce_op`` / ``reduce_res`` / ``reduce_cmd``: an optional reduction
    of each partition of the result through the engine's accumulators into ``reduce_res``
    (``[P, 1]``). Legacy form: ``tile = activation(op, data, bias=..., scale=..., dtype=..., mask=...)``.

    Limits: functions are exact to fp32 on nikki; on hardware they are valid on their published
    input ranges (``nl.log`` on [2^-64, 2^64], ``nl.sin`` on [-pi, pi], ...).
    Engine: Scalar. Cost: ``max(MIN_II, N)`` cycles; scale, bias and the reduction cost nothing
    extra."""
    if "dst" in kwargs or (args and args[0].__class__ is NkiTensor):  # the current form, tested cheaply
        return _activation(*args, **kwargs)
    if _legacy(kwargs, len(args) == 0 or _legacy_operand(args[0])):
        return _legacy_activation(*args, **kwargs)
    return _activation(*args, **kwargs)


def _activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
                name=None, mask=None):
    func = act_func(op, "op")
    cmd = _core_reduce_cmd(reduce_cmd)
    if reduce_res is not None:
        if reduce_op is None:
            raise kernel_error_at(user_frame(2), "activation: reduce_res needs reduce_op", hint="pass reduce_op=nl.add")
        if cmd is _CORE_IDLE:
            cmd = _CORE_REDUCE_CMD[_ReduceCmd.reset_reduce]
    if bias is not None and bias.__class__ is not NkiTensor and (is_real(bias) or is_bool(bias)):
        bias = _constant_bias(data, _number(bias, "nisa.activation: bias"))
    if mask is None:
        ops = (_check_tensor(dst, "dst"), _check_tensor(data, "data"))
    else:
        ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(data, "data"))
        if ops is None:
            return
        bias, scale, reduce_res = _masked_extras(mask, bias, scale, reduce_res)
    operands = (*ops, bias, scale, reduce_res)
    if reduce_op is None:
        _emit(_core.Opcode.activation, operands, engine.scalar, name, func=func, reduce_cmd=cmd)
    else:
        _emit(_core.Opcode.activation, operands, engine.scalar, name, func=func, reduce_cmd=cmd,
              reduce_op=alu_op(reduce_op, "reduce_op"))


def _constant_bias(data: NkiTensor, value: float):
    """A [P, 1] fp32 tile holding a compile-time bias (NeuronCore-v3 accepts scalar biases)."""
    # named like nl.full names it: after the variable the user's call is assigned to
    bias = _new_tile((data.shape[0], 1), _FLOAT32, sbuf, name=assigned_name(user_frame()) or "")
    _assign_scalar(bias, value)
    return bias


def _legacy_activation(op, data, *, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
                       reduce_cmd=reduce_cmd.idle, mask=None, dtype=None, name=None):
    out = _new_tile(_tile_shape(data), to_dtype(dtype) if dtype is not None else data.dtype)
    _activation(out, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd, name=name, mask=mask)
    return out


@overload
def activation_reduce(dst: NkiTensor, op: Operator, data: NkiTensor, reduce_op: Operator, reduce_res: NkiTensor,
                      bias: Operand | None = None, scale: Operand = 1.0, name: str | None = None) -> None: ...


@overload
def activation_reduce(op: Operator, data: NkiTensor, *, reduce_op: Operator, reduce_res: NkiTensor,
                      bias: Operand | None = None, scale: Operand = 1.0, mask: LegacyMask = None,
                      dtype: DTypeLike = None, name: str | None = None) -> NkiTensor: ...


def activation_reduce(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``activation`` followed by a reduction (``reduce_op``) of each partition of the result into
    ``reduce_res`` (``[P, 1]``): activation with ``reduce_cmd=reset_reduce``.

    Engine: Scalar. Cost: ``max(MIN_II, N) + MIN_II`` cycles."""
    if _legacy(kwargs, len(args) == 0 or _legacy_operand(args[0])):
        return _legacy_activation_reduce(*args, **kwargs)
    return _activation_reduce(*args, **kwargs)


def _activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None, mask=None):
    _activation(dst, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd.reset_reduce, name=name, mask=mask)


def _legacy_activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, mask=None, dtype=None,
                              name=None):
    out = _new_tile(_tile_shape(data), to_dtype(dtype) if dtype is not None else data.dtype)
    _activation_reduce(out, op, data, reduce_op, reduce_res, bias, scale, name=name, mask=mask)
    return out


@overload
def reciprocal(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> None: ...


@overload
def reciprocal(data: NkiTensor, *, dtype: DTypeLike = None, mask: LegacyMask = None) -> NkiTensor: ...


def reciprocal(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst = 1 / data`` element by element, at higher precision than the Scalar engine's
    ``activation(op=nl.reciprocal)``.

    Engine: Vector. Cost: ``max(MIN_II, 8N)`` cycles (the Scalar engine's activation costs
    ``max(MIN_II, N)``)."""
    if _legacy(kwargs, len(args) + ("data" in kwargs) < 2):
        return _legacy_unary(_reciprocal, *args, **kwargs)
    return _reciprocal(*args, **kwargs)


def _reciprocal(dst, data, name=None, mask=None, engine=engine.unknown):
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(data, "data"))
    if ops is not None:
        _emit(_core.Opcode.reciprocal, ops, _Engine.vector, name)


# --- reductions and scans -------------------------------------------------------------------

def _axes_mask(axis, rank: int, api: str) -> int:
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    mask = 0
    for a in axes:
        a = check_int(a, f"nisa.{api}: axis")
        d = a + rank if a < 0 else a
        if not 0 <= d < rank:
            raise kernel_error_at(user_frame(3), f"axis {a} is out of range for data of rank {rank}")
        mask |= 1 << d
    return mask


@overload
def tensor_reduce(dst: NkiTensor, op: Operator, data: NkiTensor, axis: int | Sequence[int], negate: bool = False,
                  keepdims: bool = False, name: str | None = None) -> None: ...


@overload
def tensor_reduce(op: Operator, data: NkiTensor, axis: int | Sequence[int], *, mask: LegacyMask = None,
                  dtype: DTypeLike = None, negate: bool = False, keepdims: bool = False, name: str | None = None) -> NkiTensor: ...


def tensor_reduce(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst = op-reduction of data over the free axes axis`` (optionally negated).

    Parameters: ``axis``: one free axis or several (the last ones); ``keepdims``: keep the reduced
    axes with size 1. Legacy form: ``tile = tensor_reduce(op, data, axis, dtype=..., mask=...)``.

    Limits: axis 0, the partition axis, is never reduced here (see ``tensor_partition_reduce``).
    Engine: Vector. Cost: ``N/2`` cycles for bf16 in and out under add or maximum, ``N``
    otherwise."""
    if _legacy(kwargs, len(args) == 0 or _legacy_operand(args[0])):
        return _legacy_tensor_reduce(*args, **kwargs)
    return _tensor_reduce(*args, **kwargs)


def _tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None, mask=None):
    data = _check_tensor(data, "data")
    attrs = {"op0": alu_op(op, "op"), "axes": _axes_mask(axis, data.ndim, "tensor_reduce"),
             "negate": _flag(negate, "tensor_reduce", "negate"), "keepdims": _flag(keepdims, "tensor_reduce", "keepdims")}
    dst = _check_tensor(dst, "dst")
    if mask is None:
        ops = (dst, data)
    else:
        ops = hooks.apply_reduction_mask(mask, dst, data, attrs["axes"], attrs["keepdims"])
    if ops is not None:
        _emit(_core.Opcode.tensor_reduce, ops, engine.vector, name, **attrs)


def _legacy_tensor_reduce(op, data, axis, *, mask=None, dtype=None, negate=False, keepdims=False, name=None):
    data = _check_tensor(data, "data")
    axes = _axes_mask(axis, data.ndim, "tensor_reduce")
    shape = [1 if axes & (1 << d) else n for d, n in enumerate(data.shape)]
    if not keepdims:
        shape = [n for d, n in enumerate(data.shape) if not axes & (1 << d)]
        if len(shape) < 2:
            shape = shape + [1] * (2 - len(shape))
    out = _new_tile(shape, to_dtype(dtype) if dtype is not None else data.dtype)
    _tensor_reduce(out, op, data, axis, negate, keepdims, name=name, mask=mask)
    return out


@overload
def tensor_scalar_reduce(dst: NkiTensor, data: NkiTensor, op0: Operator, operand0: Operand, reduce_op: Operator,
                         reduce_res: NkiTensor | None = None, reverse0: bool = False,
                         reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce, reduce_init: Operand | None = None,
                         reduce_res_negate: bool = False, name: str | None = None) -> None: ...


@overload
def tensor_scalar_reduce(*, data: NkiTensor, op0: Operator, operand0: Operand, reduce_op: Operator,
                         reduce_res: NkiTensor, reverse0: bool = False, dtype: DTypeLike = None,
                         mask: LegacyMask = None, name: str | None = None) -> NkiTensor: ...


def tensor_scalar_reduce(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst = data op0 operand0`` (one operator, as ``tensor_scalar``) and ``reduce_res`` ([P, 1]) =
    ``reduce_op`` over the free axes of that result.

    Limits: nikki supports ``reduce_cmd=reset_reduce`` only, without ``reduce_init`` or
    ``reduce_res_negate``, and needs ``reduce_res`` (NotImplementedError otherwise).
    Engine: Vector. Cost: ``max(MIN_II, N) + MIN_II`` cycles."""
    if _legacy(kwargs, len(args) < 2 or _legacy_operand(args[1]), args, "data"):
        return _legacy_tensor_scalar_reduce(*args, **kwargs)
    return _tensor_scalar_reduce(*args, **kwargs)


def _tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                          reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None, reduce_res_negate=False, name=None,
                          mask=None):
    if _core_reduce_cmd(reduce_cmd) is not _CORE_REDUCE_CMD[_ReduceCmd.reset_reduce] or reduce_init is not None \
            or reduce_res_negate:
        _not_implemented("tensor_scalar_reduce with reduce_cmd other than reset_reduce, reduce_init or "
                         "reduce_res_negate")
    if reduce_res is None:
        _not_implemented("tensor_scalar_reduce(reduce_res=None) (accumulator-only reductions)")
    attrs = {"op0": alu_op(op0, "op0"), "reduce_op": alu_op(reduce_op, "reduce_op"),
             "reverse0": _flag(reverse0, "tensor_scalar_reduce", "reverse0")}
    operand0 = _alu_operand(attrs["op0"], operand0, "tensor_scalar_reduce", "op0", "operand0")
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(data, "data"))
    if ops is not None:
        operand0, reduce_res = _masked_extras(mask, operand0, reduce_res)
        _emit(_core.Opcode.tensor_scalar_reduce, (*ops, operand0, reduce_res), engine.vector, name, **attrs)


def _legacy_tensor_scalar_reduce(*, data, op0, operand0, reduce_op, reduce_res, reverse0=False, dtype=None,
                                 mask=None, name=None):
    out = _new_tile(_tile_shape(data), to_dtype(dtype) if dtype is not None else data.dtype)
    _tensor_scalar_reduce(out, data, op0, operand0, reduce_op, reduce_res, reverse0, name=name, mask=mask)
    return out


@overload
def tensor_tensor_scan(dst: NkiTensor, data0: NkiTensor, data1: NkiTensor, initial: Operand, op0: Operator,
                       op1: Operator, reverse0: bool = False, reverse1: bool = False, name: str | None = None) -> None: ...


@overload
def tensor_tensor_scan(data0: NkiTensor, data1: NkiTensor, initial: Operand, op0: Operator, op1: Operator,
                       reverse0: bool = False, reverse1: bool = False, *, dtype: DTypeLike = None,
                       mask: LegacyMask = None, name: str | None = None) -> NkiTensor: ...


def tensor_tensor_scan(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """A scan along each partition: ``r[i] = (data0[i] op0 r[i-1]) op1 data1[i]`` with
    ``r[-1] = initial`` (a number or ``[P, 1]`` tile); ``dst = r``.

    Engine: Vector. Cost: ``max(MIN_II, 2N)`` cycles."""
    if _legacy(kwargs, len(args) < 3 or _legacy_operand(args[2]), args, "data0"):
        return _legacy_tensor_tensor_scan(*args, **kwargs)
    return _tensor_tensor_scan(*args, **kwargs)


def _tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None, mask=None):
    attrs = {"op0": alu_op(op0, "op0"), "op1": alu_op(op1, "op1"),
             "reverse0": _flag(reverse0, "tensor_tensor_scan", "reverse0"),
             "reverse1": _flag(reverse1, "tensor_tensor_scan", "reverse1")}
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(data0, "data0"), _check_tensor(data1, "data1"))
    if ops is not None:
        (initial,) = _masked_extras(mask, initial)
        _emit(_core.Opcode.tensor_tensor_scan, (*ops, initial), engine.vector, name, **attrs)


def _legacy_tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0=False, reverse1=False, *, dtype=None,
                               mask=None, name=None):
    out = _new_tile(_tile_shape(data0), to_dtype(dtype) if dtype is not None else _wider(data0.dtype, data1.dtype))
    _tensor_tensor_scan(out, data0, data1, initial, op0, op1, reverse0, reverse1, name=name, mask=mask)
    return out


@overload
def tensor_partition_reduce(dst: NkiTensor, op: Operator, data: NkiTensor, name: str | None = None) -> None: ...


@overload
def tensor_partition_reduce(op: Operator, data: NkiTensor, *, mask: LegacyMask = None, dtype: DTypeLike = None,
                            name: str | None = None) -> NkiTensor: ...


def tensor_partition_reduce(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst[0, ...] = op-reduction of data across its partitions`` (add, maximum, bitwise or /
    and, ...).

    Engine: GpSimd. Cost: not published."""
    if _legacy(kwargs, len(args) == 0 or _legacy_operand(args[0])):
        return _legacy_tensor_partition_reduce(*args, **kwargs)
    return _tensor_partition_reduce(*args, **kwargs)


def _tensor_partition_reduce(dst, op, data, name=None, mask=None):
    alu = alu_op(op, "op")
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(data, "data"))
    if ops is not None:
        _emit(_core.Opcode.tensor_partition_reduce, ops, engine.gpsimd, name, op0=alu)


def _legacy_tensor_partition_reduce(op, data, *, mask=None, dtype=None, name=None):
    out = _new_tile((1, *data.shape[1:]), to_dtype(dtype) if dtype is not None else data.dtype)
    _tensor_partition_reduce(out, op, data, name=name, mask=mask)
    return out


# --- Tensor engine --------------------------------------------------------------------------

@overload
def nc_matmul(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, is_stationary_onezero: bool = False,
              is_moving_onezero: bool = False, is_transpose: bool = False, accumulate: bool | None = None,
              tile_position: Sequence[int] = (), tile_size: Sequence[int] = (),
              perf_mode: matmul_perf_mode = matmul_perf_mode.none, name: str | None = None) -> None: ...


@overload
def nc_matmul(stationary: NkiTensor, moving: NkiTensor, *, is_stationary_onezero: bool = False,
              is_moving_onezero: bool = False, is_transpose: bool = False, tile_position: Sequence[int] = (),
              tile_size: Sequence[int] = (), perf_mode: Any = None, mask: LegacyMask = None, name: str | None = None) -> NkiTensor: ...


def nc_matmul(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst (+)= stationary.T @ moving``, contracting over the partition dim, into fp32 PSUM.

    Parameters: ``stationary`` ``[K, M]`` and ``moving`` ``[K, N]`` in SBUF; ``accumulate``: False
    overwrites, True adds, None overwrites on the first write to the PSUM location and adds later;
    ``is_transpose``: a bit-exact transpose of ``moving`` (stationary an identity);
    ``tile_position`` / ``tile_size``: a row / column tile of the PE array (both or neither);
    ``perf_mode=double_row``: fp8 inputs laid out ``[128, 2, ...]``. Legacy form:
    ``psum_tile = nc_matmul(stationary, moving, ...)``.

    Limits: K <= 128, M <= 128, N <= 512 (nl.tile_size.gemm_stationary_fmax / gemm_moving_fmax);
    inputs fp8 / bf16 / fp16 / tf32 / fp32 (fp32 pairs with fp32 only).
    Engine: Tensor. Cost: ``max(min(64, N_stationary), N_moving)`` cycles back to back, four times
    that for fp32 inputs."""
    tensors = sum(isinstance(a, NkiTensor) for a in args) + sum(k in kwargs for k in ("stationary", "moving"))
    # A third positional argument that is not a legacy flag makes it the current form, where a
    # non-tensor operand is reported by name.
    third_operand = len(args) >= 3 and not is_bool(args[2])
    if _legacy(kwargs, tensors < 3 and not third_operand):
        return _legacy_nc_matmul(*args, **kwargs)
    return _nc_matmul(*args, **kwargs)


def _is_double_row(perf_mode) -> bool:
    if perf_mode in (None, matmul_perf_mode.none, "none"):
        return False
    if perf_mode in (matmul_perf_mode.double_row, "double_row", "double_row_gen3"):  # the last: Beta 1's name
        return True
    raise kernel_error_at(user_frame(3), f"nc_matmul: perf_mode={perf_mode!r} is not a matmul performance mode",
                          hint="use nisa.matmul_perf_mode.none or nisa.matmul_perf_mode.double_row")


def _matmul_attrs(is_stationary_onezero, is_moving_onezero, is_transpose, tile_position, tile_size):
    if bool(tile_position) != bool(tile_size):
        raise kernel_error_at(user_frame(3), "nc_matmul: tile_position and tile_size must be given together",
                              hint="pass both, e.g. tile_position=(0, 0), tile_size=(64, 128)")
    for pos, size in zip(tile_position or (), tile_size or ()):
        if size <= 0 or pos % size != 0 or pos + size > 128:
            raise kernel_error_at(user_frame(3), f"nc_matmul: tile_position {tuple(tile_position)} / tile_size "
                                  f"{tuple(tile_size)} is not a legal PE-array tile",
                                  limit="the start must be a multiple of the tile size and the tile within 128")
    return {"is_stationary_onezero": _flag(is_stationary_onezero, "nc_matmul", "is_stationary_onezero"),
            "is_moving_onezero": _flag(is_moving_onezero, "nc_matmul", "is_moving_onezero"),
            "is_transpose": _flag(is_transpose, "nc_matmul", "is_transpose")}


def _nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
               accumulate=None, tile_position=(), tile_size=(), perf_mode=matmul_perf_mode.none, name=None,
               mask=None):
    attrs = _matmul_attrs(is_stationary_onezero, is_moving_onezero, is_transpose, tile_position, tile_size)
    attrs["accumulate"] = (_core.Accumulate.automatic if accumulate is None else
                           _core.Accumulate.accumulate if _flag(accumulate, "nc_matmul", "accumulate")
                           else _core.Accumulate.overwrite)
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(stationary, "stationary"),
                  _check_tensor(moving, "moving"))
    if ops is None:
        return None
    if _is_double_row(perf_mode):
        return _double_row_matmul(ops, name, attrs, bool(tile_position))
    return _emit(_core.Opcode.nc_matmul, ops, engine.tensor, name, **attrs)


def _double_row_matmul(ops, name, attrs, column_tiled: bool) -> int:
    """perf_mode=double_row (NeuronCore-v3+, fp8): stationary [K, 2, M] and moving [K, 2, N] contract
    over K and the pair, as two K-row passes into one PSUM accumulation (the hardware streams both
    rows at once, at twice the rate)."""
    dst, stationary, moving = ops
    generation = current().builder.generation
    problems = []
    if generation < 3:
        problems.append(f"the target is NeuronCore-v{generation}")
    if stationary.ndim != 3 or moving.ndim != 3 or stationary.shape[1] != 2 or moving.shape[1] != 2:
        problems.append(f"stationary {stationary.shape} and moving {moving.shape} must both be [K, 2, F]")
    fp8 = ("float8_e4m3", "float8_e4m3fn", "float8_e5m2")
    if stationary.dtype.name not in fp8 or moving.dtype.name not in fp8:
        problems.append(f"the operands are {stationary.dtype.name} and {moving.dtype.name}")
    if column_tiled:
        problems.append("column tiling (tile_position) cannot be combined with it")
    if problems:
        raise kernel_error_at(user_frame(3), f"nc_matmul(perf_mode=double_row): {'; '.join(problems)}",
                              limit="double_row needs NeuronCore-v3 or later, fp8 operands shaped [K, 2, F] "
                                    "and no column tiling",
                              hint="pad K to a multiple of 256 and view the operands as [128, 2, F], or drop "
                                   "perf_mode")
    first = _emit(_core.Opcode.nc_matmul, (dst, stationary[:, 0, :], moving[:, 0, :]), engine.tensor, name, **attrs)
    second = dict(attrs, accumulate=_core.Accumulate.accumulate)
    _emit(_core.Opcode.nc_matmul, (dst, stationary[:, 1, :], moving[:, 1, :]), engine.tensor, name, **second)
    return first


def _staged_from_psum(t: NkiTensor) -> NkiTensor:
    """t itself, or for a PSUM tile an SBUF copy of it (same dtype, bit for bit)."""
    if t.buffer is not psum:
        return t
    staged = _new_tile(t.shape, t.dtype, name="psum_staged")
    _tensor_copy(staged, t)
    return staged


def _legacy_nc_matmul(stationary, moving, *, is_stationary_onezero=False, is_moving_onezero=False,
                      is_transpose=False, tile_position=(), tile_size=(), perf_mode=None, mask=None, name=None):
    stationary, moving = _check_tensor(stationary, "stationary"), _check_tensor(moving, "moving")
    # Beta 1 kernels multiply tiles straight out of PSUM (e.g. a transpose's result): the Tensor
    # engine reads SBUF, so such operands are staged through SBUF first.
    stationary, moving = (_staged_from_psum(t) for t in (stationary, moving))
    rows = 2 if _is_double_row(perf_mode) else 1  # double_row operands are [K, 2, F]
    m = stationary.size // (stationary.shape[0] * rows)
    n = moving.size // (moving.shape[0] * rows)
    out = _new_tile((m, n), moving.dtype if is_transpose else _FLOAT32, psum)
    index = _nc_matmul(out, stationary, moving, is_stationary_onezero, is_moving_onezero, is_transpose, False,
                       tile_position, tile_size, perf_mode, name=name, mask=mask)
    if index is not None and rows == 1:  # `psum += ...` may then retarget the one matmul
        current().pending_matmul[out._view.storage] = index
    return out


@overload
def nc_transpose(dst: NkiTensor, data: NkiTensor, engine: engine = engine.unknown, name: str | None = None) -> None: ...


@overload
def nc_transpose(data: NkiTensor, *, mask: LegacyMask = None, dtype: DTypeLike = None,
                 engine: engine = engine.unknown, name: str | None = None) -> NkiTensor: ...


def nc_transpose(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst = data.T`` for a 2-D tile (partition and free dims swapped).

    Parameters: ``engine``: ``engine.tensor`` (up to 128x128, SBUF into PSUM, a matmul against an
    identity), ``engine.vector`` (up to 32x32, SBUF or PSUM), ``engine.unknown`` chooses by size.

    Limits: ``dst.dtype`` equals ``data.dtype``.
    Engine: Tensor or Vector. Cost: Tensor ``max(P, min(64, F))`` cycles, Vector
    ``max(MIN_II, N)``."""
    if _legacy(kwargs, len(args) + ("data" in kwargs) < 2):
        return _legacy_nc_transpose(*args, **kwargs)
    return _nc_transpose(*args, **kwargs)


def _nc_transpose(dst, data, engine=engine.unknown, name=None, mask=None):
    # engine.unknown resolves in the builder: the Tensor engine into PSUM, else the Vector engine
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(data, "data"))
    if ops is not None:
        _emit(_core.Opcode.nc_transpose, ops, engine, name)


def _legacy_nc_transpose(data, *, mask=None, dtype=None, engine=engine.unknown, name=None, api="nc_transpose"):
    data = _check_tensor(data, "data")
    if data.ndim != 2:
        raise kernel_error_at(user_frame(2), f"{api}: the tile has shape {data.shape}, but a transpose takes a 2-D "
                              "[partition, free] tile", limit="transposes swap the partition dim and one free dim",
                              hint="reshape the tile to 2-D first, e.g. x.reshape((p, f))")
    p, f = data.shape[0], data.size // data.shape[0]
    chosen = _engine(engine)
    on_vector = chosen == _core.Engine.vector or (chosen == _core.Engine.unknown and p <= 32 and f <= 32)
    out = _new_tile((f, p), data.dtype, sbuf if on_vector else psum)
    _nc_transpose(out, data, _Engine.vector if on_vector else _Engine.tensor, name=name,
                  mask=mask)
    if dtype is not None and to_dtype(dtype) != data.dtype:
        cast = _new_tile((f, p), to_dtype(dtype))
        _tensor_copy(cast, out)
        return cast
    return out


# --- initialization and index generation ----------------------------------------------------

@overload
def memset(dst: NkiTensor, value: float, engine: engine = engine.unknown, name: str | None = None) -> None: ...


@overload
def memset(shape: Sequence[int], value: float, dtype: DTypeLike, *, mask: LegacyMask = None,
           engine: engine = engine.unknown, name: str | None = None) -> NkiTensor: ...


def memset(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """Fills ``dst`` with ``value``. Legacy form: ``tile = memset(shape, value, dtype)``.

    Limits: an integer tile takes finite values only.
    Engine: Vector or GpSimd. Cost: ``max(MIN_II, N/2)`` cycles for 0 into bf16 / fp16,
    ``max(MIN_II, N)`` otherwise."""
    if _legacy(kwargs, len(args) >= 1 and _legacy_operand(args[0]) or "shape" in kwargs):
        return _legacy_memset(*args, **kwargs)
    return _memset(*args, **kwargs)


def _memset(dst, value, engine=engine.unknown, name=None, mask=None):
    ops = _masked(mask, _check_tensor(dst, "dst"))
    if ops is not None:
        _emit(_core.Opcode.memset, (*ops, value), engine, name)


def _legacy_memset(shape, value, dtype, *, mask=None, engine=engine.unknown, name=None):
    out = _new_tile(tuple(shape), to_dtype(dtype))
    _memset(out, value, engine, name=name, mask=mask)
    return out


def _pattern(pattern, api: str):
    try:
        pairs = [tuple(pair) for pair in pattern]
    except TypeError:
        pairs = None
    if pairs is None or any(len(p) != 2 for p in pairs):
        raise argument_error(f"nisa.{api}: pattern", "a list of [step, num] pairs", pattern)
    return [(_int32(step, f"nisa.{api}: pattern step"), check_int(num, f"nisa.{api}: pattern num", 1, _INT32_MAX))
            for step, num in pairs]


@overload
def iota(dst: NkiTensor, pattern: Pattern, offset: int = 0, channel_multiplier: int = 0, name: str | None = None) -> None: ...


@overload
def iota(expr: Any, dtype: DTypeLike, *, mask: LegacyMask = None, name: str | None = None) -> NkiTensor: ...


def iota(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst[c, i...] = offset + c * channel_multiplier + sum(step_k * i_k)`` over the access pattern
    ``pattern`` ([[step, count], ...], outermost first), computed in int32 and cast to ``dst.dtype``.
    Legacy form: ``tile = iota(expr, dtype)`` with an ``nl.arange`` index expression.

    Limits: offset, multiplier and steps fit int32. dst in SBUF.
    Engine: GpSimd. Cost: ``150 + N`` cycles."""
    if _legacy(kwargs, len(args) == 0 or _legacy_operand(args[0])):
        return hooks.legacy_iota(*args, **kwargs)
    return _iota(*args, **kwargs)


def _iota(dst, pattern, offset=0, channel_multiplier=0, name=None, mask=None):
    ops = _masked(mask, _check_tensor(dst, "dst"))
    if ops is not None:
        _emit(_core.Opcode.iota, ops, engine.gpsimd, name, pattern=_pattern(pattern, "iota"),
              offset=_int32(offset, "nisa.iota: offset"),
              channel_multiplier=_int32(channel_multiplier, "nisa.iota: channel_multiplier"))


@overload
def affine_select(dst: NkiTensor, pattern: Pattern, channel_multiplier: int, on_true_tile: NkiTensor,
                  on_false_value: float, cmp_op: Operator = None, offset: int = 0, name: str | None = None) -> None: ...


@overload
def affine_select(pred: Any, on_true_tile: NkiTensor, on_false_value: float, *, mask: LegacyMask = None,
                  dtype: DTypeLike = None, name: str | None = None) -> NkiTensor: ...


def affine_select(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst = on_true_tile where cmp_op(v, 0) else on_false_value``, v the affine value of ``iota``
    (``offset + c * channel_multiplier + pattern``); ``cmp_op=None`` is ``nl.equal``. Causal masks
    are its common use. Legacy form: ``tile = affine_select(pred, on_true_tile, on_false_value)``
    with an index-expression predicate such as ``i_q >= i_k``.

    Engine: GpSimd. Cost: ``150 + N`` cycles."""
    if _legacy(kwargs, len(args) == 0 or _legacy_operand(args[0])):
        return hooks.legacy_affine_select(*args, **kwargs)
    return _affine_select(*args, **kwargs)


def _affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=None, offset=0, name=None,
                   mask=None):
    cmp = alu_op(cmp_op if cmp_op is not None else _core.AluOp.equal, "cmp_op")
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(on_true_tile, "on_true_tile"))
    if ops is not None:
        _emit(_core.Opcode.affine_select, (*ops, _number(on_false_value, "nisa.affine_select: on_false_value")),
              engine.gpsimd, name, pattern=_pattern(pattern, "affine_select"),
              channel_multiplier=_int32(channel_multiplier, "nisa.affine_select: channel_multiplier"), cmp_op=cmp,
              offset=_int32(offset, "nisa.affine_select: offset"))


# --- statistics -----------------------------------------------------------------------------

@overload
def bn_stats(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> None: ...


@overload
def bn_stats(data: NkiTensor, *, mask: LegacyMask = None, dtype: DTypeLike = None) -> NkiTensor: ...


def bn_stats(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """Per partition, 6 statistics of ``data`` into ``dst`` ``[P, 6]``: count, mean and
    count * variance of the even and of the odd elements (combine with ``bn_aggr``).

    Limits: at most 512 elements per partition (nl.tile_size.bn_stats_fmax).
    Engine: Vector. Cost: ``max(MIN_II, N)`` cycles."""
    if _legacy(kwargs, len(args) + ("data" in kwargs) < 2):
        data = _check_tensor(args[0] if args else kwargs.pop("data"), "data")
        dtype = kwargs.pop("dtype", None)
        out = _new_tile((data.shape[0], 6), to_dtype(dtype) if dtype is not None else data.dtype)
        _bn_stats(out, data, **kwargs)
        return out
    return _bn_stats(*args, **kwargs)


def _bn_stats(dst, data, name=None, mask=None):
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(data, "data"))
    if ops is not None:
        _emit(_core.Opcode.bn_stats, ops, engine.vector, name)


@overload
def bn_aggr(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> None: ...


@overload
def bn_aggr(data: NkiTensor, *, mask: LegacyMask = None, dtype: DTypeLike = None) -> NkiTensor: ...


def bn_aggr(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """Combines ``bn_stats`` outputs (``[P, 6k]``) into ``dst`` ``[P, 2]``: mean and variance per
    partition.

    Engine: Vector. Cost: ``max(MIN_II, 13 * (N / 3))`` cycles, N the elements per partition of
    the statistics."""
    if _legacy(kwargs, len(args) + ("data" in kwargs) < 2):
        data = _check_tensor(args[0] if args else kwargs.pop("data"), "data")
        dtype = kwargs.pop("dtype", None)
        out = _new_tile((data.shape[0], 2), to_dtype(dtype) if dtype is not None else data.dtype)
        _bn_aggr(out, data, **kwargs)
        return out
    return _bn_aggr(*args, **kwargs)


def _bn_aggr(dst, data, name=None, mask=None):
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(data, "data"))
    if ops is not None:
        _emit(_core.Opcode.bn_aggr, ops, engine.vector, name)


# --- predication and selection --------------------------------------------------------------

def tensor_copy_predicated(dst: NkiTensor | None = None, src: Operand | None = None,
                           predicate: NkiTensor | None = None, reverse_pred: bool = False, name: str | None = None,
                           mask: LegacyMask = None, dtype: DTypeLike = None) -> None:
    """``dst = src`` where ``predicate`` is nonzero (``reverse_pred``
    inverts it), else unchanged; ``src`` a tile or a number.

    Engine: Vector. Cost: ``max(MIN_II, N)`` cycles when one of src and predicate is in PSUM,
    ``max(MIN_II, 2N)`` with both in SBUF."""
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(predicate, "predicate"),
                  *([src] if isinstance(src, NkiTensor) else []))
    if ops is not None:
        d, pred = ops[0], ops[1]
        s = ops[2] if isinstance(src, NkiTensor) else src
        _emit(_core.Opcode.tensor_copy_predicated, (d, s, pred), engine.vector, name,
              reverse_pred=_flag(reverse_pred, "tensor_copy_predicated", "reverse_pred"))


def select_reduce(dst: NkiTensor | None = None, predicate: NkiTensor | None = None, on_true: NkiTensor | None = None,
                  on_false: Operand | None = None, reduce_res: NkiTensor | None = None,
                  reduce_cmd: reduce_cmd = reduce_cmd.idle, reduce_op: Operator = None, reverse_pred: bool = False,
                  name: str | None = None, mask: LegacyMask = None, dtype: DTypeLike = None) -> None:
    """``dst = where(predicate, on_true, on_false)``, with an optional reduction of each
    partition of the result into ``reduce_res`` (``[P, 1]``, ``reduce_op`` maximum by default).

    Parameters: ``on_false``: a tile or a number; ``reverse_pred`` inverts the predicate;
    ``reduce_cmd`` drives the engine's accumulators as in ``activation``.
    Engine: Vector. Cost: not published."""
    attrs = {"reduce_op": alu_op(reduce_op if reduce_op is not None else _core.AluOp.maximum, "reduce_op"),
             "reduce_cmd": _core_reduce_cmd(reduce_cmd),
             "reverse_pred": _flag(reverse_pred, "select_reduce", "reverse_pred")}
    if reduce_res is not None and int(reduce_cmd) == 0:
        attrs["reduce_cmd"] = _core.ReduceCmd.reset_reduce
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(predicate, "predicate"),
                  _check_tensor(on_true, "on_true"))
    if ops is not None:
        on_false, reduce_res = _masked_extras(mask, on_false, reduce_res)
        _emit(_core.Opcode.select_reduce, (*ops, on_false, reduce_res), engine.vector, name, **attrs)


@overload
def max8(dst: NkiTensor, src: NkiTensor, name: str | None = None) -> None: ...


@overload
def max8(*, src: NkiTensor, mask: LegacyMask = None, dtype: DTypeLike = None) -> NkiTensor: ...


def max8(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """The 8 largest values of each partition of ``src``, in descending order, into ``dst``
    ``[P, 8]`` (compared in fp32).

    Limits: 8 to 16384 elements per partition.
    Engine: Vector. Cost: ``N`` cycles."""
    if _legacy(kwargs, len(args) < 2, args, "src"):
        src = _check_tensor(args[0] if args else kwargs.pop("src"), "src")
        dtype = kwargs.pop("dtype", None)
        out = _new_tile((src.shape[0], 8), to_dtype(dtype) if dtype is not None else src.dtype)
        _max8(out, src, **kwargs)
        return out
    return _max8(*args, **kwargs)


def _max8(dst, src, name=None, mask=None):
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(src, "src"))
    if ops is not None:
        _emit(_core.Opcode.max8, ops, engine.vector, name)


@overload
def nc_find_index8(dst: NkiTensor, data: NkiTensor, vals: NkiTensor, name: str | None = None) -> None: ...


@overload
def nc_find_index8(*, data: NkiTensor, vals: NkiTensor, mask: LegacyMask = None, dtype: DTypeLike = None) -> NkiTensor: ...


def nc_find_index8(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """For each of the 8 values per partition in ``vals``, the index of its first occurrence in that
    partition of ``data``, into ``dst`` ``[P, 8]`` (uint32 by default in the legacy form).

    Engine: Vector. Cost: ``N`` cycles."""
    if _legacy(kwargs, len(args) < 3, args, "data"):
        data = _check_tensor(args[0] if args else kwargs.pop("data"), "data")
        vals = args[1] if len(args) > 1 else kwargs.pop("vals")
        dtype = kwargs.pop("dtype", None)
        out = _new_tile((data.shape[0], 8), to_dtype(dtype) if dtype is not None else _UINT32)
        _nc_find_index8(out, data, vals, **kwargs)
        return out
    return _nc_find_index8(*args, **kwargs)


def _nc_find_index8(dst, data, vals, name=None, mask=None):
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(data, "data"), _check_tensor(vals, "vals"))
    if ops is not None:
        _emit(_core.Opcode.nc_find_index8, ops, engine.vector, name)


# --- registers --------------------------------------------------------------------------------

def register_alloc(x: int | VirtualRegister | None = None) -> VirtualRegister:
    """A new 32-bit sequencer register, initialized with ``x`` (an integer or another
    register) when given. Registers drive ``nl.fori_loop`` / ``nl.dynamic_range`` counters and
    runtime offsets of views (``t[reg]``, ``nl.ds(reg, size)``, ``.ap(scalar_offset=reg)``)."""
    ctx = current()
    reg = VirtualRegister(ctx.builder.new_register())
    if x is not None:
        register_move(reg, x)
    return reg


def register_move(dst: VirtualRegister, src: int | VirtualRegister, name: str | None = None) -> None:
    """``dst = src``: a register takes an integer or another register's value (a
    sequencer instruction, no engine time)."""
    _emit(_core.Opcode.register_move, (dst, src), engine.sync, name)


def register_load(dst: VirtualRegister, src: NkiTensor, name: str | None = None) -> None:
    """``dst = src[0, 0]``: a register takes the value of a 1x1 SBUF or HBM tensor at run
    time (a sequencer instruction)."""
    _emit(_core.Opcode.register_load, (dst, _check_tensor(src, "src")), engine.sync, name)


def register_store(dst: NkiTensor, src: VirtualRegister, name: str | None = None) -> None:
    """``dst[0, 0] = src``: writes register ``src`` into a 1x1 tensor at run time (a
    sequencer instruction)."""
    _emit(_core.Opcode.register_store, (_check_tensor(dst, "dst"), src), engine.sync, name)


def get_nc_version() -> nc_version:
    """The NeuronCore generation (``nc_version.gen2``, ``gen3``, ``gen4``) of the target
    being traced for (trn1 / inf2: gen2, trn2: gen3); a compile-time value."""
    return nc_version(current().builder.generation)


def get_nc_sub_version() -> int:
    """The sub-version of the target's NeuronCore generation (0 for the modelled targets)."""
    return 0


class NkiInstruction:
    """NKI's handle of an emitted instruction, for ``depends_on`` scheduling edges. nikki's
    instructions keep program order, so edges change nothing; nisa calls return None, not handles."""

    def depends_on(self, *producers) -> "NkiInstruction":
        return self


class NKIObject:
    """Base class of the configuration classes NKI kernels pass around. As in NKI, a subclass
    without a constructor of its own takes its fields as arguments, every one optional: annotated
    fields by position or keyword, plain class attributes (``offset = None``) by keyword; a field
    not given keeps its class default, or None. This holds for ``@dataclass`` subclasses too,
    whose generated constructor would require undefaulted fields and refuse plain attributes."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Owning __init__ in the subclass's own namespace keeps @dataclass from replacing it.
        if "__init__" not in vars(cls):
            cls.__init__ = NKIObject.__init__  # type: ignore[method-assign]

    def __init__(self, *args, **kwargs):
        cls = type(self)
        fields = _annotated_fields(cls)
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__}() takes at most {len(fields)} positional arguments "
                            f"({', '.join(fields) or 'no fields'}), {len(args)} given")
        for name, value in zip(fields, args):
            if name in kwargs:
                raise TypeError(f"{cls.__name__}() got multiple values for field '{name}'")
            kwargs[name] = value
        for name in kwargs:
            if name not in fields and not _is_plain_class_attribute(cls, name):
                raise TypeError(f"{cls.__name__}() got an unexpected keyword argument '{name}' (its fields: "
                                f"{', '.join(fields + _plain_class_attributes(cls)) or 'none'})")
        factories = {f.name: f.default_factory for f in getattr(cls, "__dataclass_fields__", {}).values()
                     if f.default_factory is not dataclasses.MISSING}
        for name in fields:
            if name in kwargs:
                continue
            if name in factories:
                object.__setattr__(self, name, factories[name]())
            elif not hasattr(cls, name):
                object.__setattr__(self, name, None)
        for name, value in kwargs.items():
            object.__setattr__(self, name, value)  # object's: a frozen dataclass is set up here too
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    def __repr__(self) -> str:
        values = ", ".join(f"{n}={getattr(self, n, None)!r}" for n in _annotated_fields(type(self)))
        return f"{type(self).__name__}({values})"


def _is_plain_class_attribute(cls, name: str) -> bool:
    """Whether `name` is a data attribute set in the body of cls or a base below NKIObject."""
    if name.startswith("_"):
        return False
    for klass in cls.__mro__:
        if klass is NKIObject:
            return False
        if name in vars(klass):
            value = vars(klass)[name]
            return not (callable(value) or hasattr(value, "__get__"))
    return False


def _plain_class_attributes(cls) -> list:
    return sorted({name for klass in cls.__mro__ if klass is not NKIObject and klass is not object
                   for name in vars(klass) if _is_plain_class_attribute(cls, name)} - set(_annotated_fields(cls)))


def _annotated_fields(cls) -> list:
    """Annotated field names of cls and its bases, base classes' first (dataclass order)."""
    names: list = []
    for klass in reversed(cls.__mro__):
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            if name not in names and "ClassVar" not in str(annotation):
                names.append(name)
    return names


# --- data movement and selection added in NKI 0.2+ ----------------------------------------------

_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


@overload
def dma_transpose(dst: NkiTensor, src: NkiTensor, axes: Sequence[int] | None = None, priority: int | None = None,
                  dge_mode: dge_mode = dge_mode.unknown, oob_mode: oob_mode = oob_mode.error, name: str | None = None) -> None: ...


@overload
def dma_transpose(src: NkiTensor, *, axes: Sequence[int] | None = None, mask: LegacyMask = None,
                  dtype: DTypeLike = None) -> NkiTensor: ...


def dma_transpose(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst = src`` with its dims permuted by ``axes`` (default ``[1, 0]``, ``[2, 1, 0]`` or
    ``[3, 1, 2, 0]`` for 2-, 3- and 4-D), moved by the DMA engines.

    Limits: ``dst.shape`` is exactly the permuted ``src.shape``.
    Engine: DMA. Cost: no formula published (up to 90% of a copy's throughput HBM to SBUF)."""
    if _legacy(kwargs, len(args) + ("src" in kwargs) < 2 and "dst" not in kwargs):
        src = _check_tensor(args[0] if args else kwargs.pop("src"), "src")
        dtype, axes = kwargs.pop("dtype", None), kwargs.pop("axes", None)
        axes = _transpose_axes(src, axes)
        out = _new_tile(tuple(src.shape[a] for a in axes), to_dtype(dtype) if dtype is not None else src.dtype)
        _dma_transpose(out, src, axes, **kwargs)
        return out
    return _dma_transpose(*args, **kwargs)


def _transpose_axes(src: NkiTensor, axes):
    if axes is None:
        if src.ndim not in _TRANSPOSE_AXES:
            raise kernel_error_at(user_frame(3), f"dma_transpose of a {src.ndim}-D tensor needs axes=",
                                  limit="default axes exist for 2-, 3- and 4-D tensors")
        return _TRANSPOSE_AXES[src.ndim]
    axes = tuple(int(a) for a in axes)
    if sorted(axes) != list(range(src.ndim)):
        raise kernel_error_at(user_frame(3), f"dma_transpose: axes {axes} is not a permutation of the {src.ndim} dims "
                              "of src")
    return axes


def _dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error,
                   name=None, mask=None):
    dst, src = _check_tensor(dst, "dst"), _check_tensor(src, "src")
    axes = _transpose_axes(src, axes)
    moved = src.permute(axes)
    if tuple(dst.shape) != tuple(moved.shape):
        raise kernel_error_at(user_frame(2), f"dma_transpose: dst has shape {tuple(dst.shape)}, but src {tuple(src.shape)} "
                              f"transposed by axes {axes} has shape {tuple(moved.shape)}",
                              limit="dst has exactly the transposed shape of src, rank included",
                              hint="reshape dst (or src) so the ranks and extents agree")
    ops = _masked(mask, dst, moved)
    if ops is not None:
        _emit(_core.Opcode.dma_copy, ops, _core.Engine.dma, name, oob_skip=_oob_skip(oob_mode))


def dma_compute(dst: NkiTensor | None = None, srcs: NkiTensor | Sequence[NkiTensor] | None = None,
                reduce_op: Operator = None, scales: float | Sequence[float] | None = None,
                unique_indices: bool = True, oob_mode: oob_mode = oob_mode.error, name: str | None = None) -> None:
    """``dst = reduce_op(srcs[0] * scales[0], srcs[1] * scales[1], ...)`` computed in
    fp32 by the DMA engines.

    Parameters: ``srcs``: 1 to 4 HBM or SBUF views; ``reduce_op``: ``nl.add`` (the default);
    ``scales``: 1.0 each (NKI supports no other); ``oob_mode`` as in ``dma_copy``. A source that is
    dst itself (read-modify-write, e.g. a scatter-add through a vector_offset) sees earlier
    elements' writes, so repeated indices accumulate.
    Engine: the DMA queues. Cost: not published."""
    dst = _check_tensor(dst, "dst")
    sources = list(srcs) if isinstance(srcs, (list, tuple)) else [srcs]
    if not 1 <= len(sources) <= 4:
        raise kernel_error_at(user_frame(2), f"dma_compute: {len(sources)} sources; it combines 1 to 4",
                              hint="add the tensors in several dma_compute calls")
    sources = [_check_tensor(t, f"srcs[{i}]") for i, t in enumerate(sources)]
    if scales is not None:
        factors = [float(f) for f in scales] if isinstance(scales, (list, tuple)) else [float(typing.cast(Any, scales))]
        if any(f != 1.0 for f in factors):
            _not_implemented(f"dma_compute(scales={factors}) (NKI supports only scales of 1.0)")
    _emit(_core.Opcode.dma_compute, (dst, *sources), _core.Engine.dma, name,
          op0=alu_op(reduce_op if reduce_op is not None else _core.AluOp.add, "reduce_op"), oob_skip=_oob_skip(oob_mode))


def nc_stream_shuffle(dst: NkiTensor, src: NkiTensor, shuffle_mask: Sequence[int], name: str | None = None, *,
                      mask: LegacyMask = None, dtype: DTypeLike = None) -> None:
    """Within each quadrant of 32 partitions, dst partition i gets src partition shuffle_mask[i]
    (255 leaves it unmodified); the same 32-entry mask serves every quadrant. ``dst`` may be
    ``src`` (an in-place shuffle).

    Beta 1 spelled it ``nc_stream_shuffle(src, dst, shuffle_mask)``: use keywords when porting.
    Limits: dst and src have the same dtype and elements per partition; SBUF or PSUM.
    Engine: Vector. Cost: ``max(MIN_II, N)`` cycles."""
    lanes = [int(v) for v in shuffle_mask]
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(src, "src"))
    if ops is not None:
        _emit(_core.Opcode.nc_stream_shuffle, ops, engine.vector, name, lanes=lanes)


@overload
def nc_match_replace8(dst: NkiTensor, data: NkiTensor, vals: NkiTensor, imm: float, dst_idx: NkiTensor | None = None,
                      name: str | None = None) -> None: ...


@overload
def nc_match_replace8(*, data: NkiTensor, vals: NkiTensor, imm: float, dst_idx: NkiTensor | None = None,
                      mask: LegacyMask = None, dtype: DTypeLike = None) -> NkiTensor: ...


def nc_match_replace8(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """``dst = data`` with the first occurrence in each partition of each of the 8 values of
    ``vals`` replaced by ``imm``; their positions go to ``dst_idx`` when given.

    Engine: Vector. Cost: ``min(MIN_II, N)`` cycles as published (likely meant ``max``)."""
    if _legacy(kwargs, len(args) < 4 and "dst" not in kwargs, args, "data"):
        data = _check_tensor(kwargs.pop("data") if "data" in kwargs else args[0], "data")
        dtype = kwargs.pop("dtype", None)
        out = _new_tile(data.shape, to_dtype(dtype) if dtype is not None else data.dtype)
        _nc_match_replace8(out, data, **kwargs)
        return out
    return _nc_match_replace8(*args, **kwargs)


def _nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None, mask=None):
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(data, "data"), _check_tensor(vals, "vals"))
    if ops is not None:
        _emit(_core.Opcode.nc_match_replace8, (*ops, float(imm), dst_idx), engine.vector, name)


def range_select(dst: NkiTensor | None = None, on_true_tile: NkiTensor | None = None, comp_op0: Operator = None,
                 comp_op1: Operator = None, bound0: Operand | None = None, bound1: Operand | None = None,
                 reduce_cmd: reduce_cmd = reduce_cmd.idle, reduce_res: NkiTensor | None = None,
                 reduce_op: Operator = None, range_start: int = 0, on_false_value: float = 0.0,
                 name: str | None = None, mask: LegacyMask = None, dtype: DTypeLike = None) -> None:
    """``dst[p, f] = on_true_tile[p, f]`` where ``(f + range_start) comp_op0 bound0[p]``
    and ``(f + range_start) comp_op1 bound1[p]``, else ``on_false_value``; the results also reduce
    (maximum) into ``reduce_res`` (``[P, 1]``).

    Limits: NeuronCore-v3 and later; NKI requires ``on_false_value`` to be fp32's lowest value.
    Engine: Vector. Cost: ``max(MIN_II, N)`` cycles."""
    if float(range_start) != int(range_start):
        raise kernel_error_at(user_frame(2), f"range_select: range_start={range_start} is not an integer position")
    attrs = {"op0": alu_op(comp_op0, "comp_op0"), "op1": alu_op(comp_op1, "comp_op1"),
             "reduce_op": alu_op(reduce_op if reduce_op is not None else _core.AluOp.maximum, "reduce_op"),
             "reduce_cmd": _core_reduce_cmd(reduce_cmd), "offset": int(range_start),
             "fill_value": float(on_false_value)}
    if reduce_res is not None and int(reduce_cmd) == 0:
        attrs["reduce_cmd"] = _core.ReduceCmd.reset_reduce
    ops = _masked(mask, _check_tensor(dst, "dst"), _check_tensor(on_true_tile, "on_true_tile"))
    if ops is not None:
        bound0, bound1, reduce_res = _masked_extras(mask, bound0, bound1, reduce_res)
        _emit(_core.Opcode.range_select, (*ops, bound0, bound1, reduce_res), engine.vector, name, **attrs)


def nc_n_gather(dst: NkiTensor | None = None, data: NkiTensor | None = None, indices: NkiTensor | None = None,
                name: str | None = None) -> None:
    """``dst[p, j] = data[p, indices[p, j]]``, indexing each partition's flattened free
    elements.

    Engine: GpSimd (``ceil(elements per partition / 512)`` instructions). Cost: not published."""
    _emit(_core.Opcode.nc_n_gather, (_check_tensor(dst, "dst"), _check_tensor(data, "data"),
                                     _check_tensor(indices, "indices")), engine.gpsimd, name)


def nonzero_with_count(dst: NkiTensor | None = None, src: NkiTensor | None = None, index_offset: int = 0,
                       padding_val: int = -1, name: str | None = None) -> None:
    """On partitions 0, 16, ..., 112 (the first of each GpSimd core's 16): the
    positions of ``src``'s nonzero elements plus ``index_offset``, then ``padding_val``, then their
    count as the last element of ``dst``.

    Limits: NeuronCore-v3 and later. Engine: GpSimd. Cost: not published."""
    _emit(_core.Opcode.nonzero_with_count, (_check_tensor(dst, "dst"), _check_tensor(src, "src")), engine.gpsimd,
          name, offset=int(index_offset), fill_value=float(padding_val))


def _launch_rank() -> tuple[int, int]:
    """This program instance's rank in its launch (its grid coordinates in row-major order) and the
    launch's number of instances: what core_barrier's cores and sendrecv's ranks number."""
    ctx = current()
    rank, instances = 0, 1
    for size, index in zip(ctx.grid, ctx.program_ids):
        rank, instances = rank * size + index, instances * size
    return rank, instances


def core_barrier(data: NkiTensor | None = None, cores: Sequence[int] | int = (0, 1), engine: engine = engine.unknown,
                 name: str | None = None) -> None:
    """Waits until the NeuronCores `cores` have all reached this point, so that each sees the
    others' writes to the shared HBM tensor `data` (which names what they synchronize on).

    The cores are the program instances of the launch (``kernel[2]``, or NEURON_LOGICAL_NC_CONFIG=2:
    instances 0 and 1), this one among them. nikki runs the instances in turn, each until its next
    barrier or sendrecv, so each instance's n-th barrier meets the others' n-th; instances whose
    barriers do not pair up (different counts) wait forever, a KernelError naming where each one
    is. A core the launch does not have (a launch of one instance) is not waited for.

    Limits: NeuronCore-v3 and later. Engine: the engine queues drain, then the cores exchange
    semaphores (estimated as the DMA fixed latency after the last core arrives)."""
    _check_tensor(data, "data")
    # nki-library passes `cores=(0)`, which is the int 0: one core.
    listed: Any = (cores,) if is_int(cores) else cores
    if not isinstance(listed, (tuple, list)) or not listed:
        raise argument_error("nisa.core_barrier: cores", "a non-empty tuple of core numbers", cores)
    members = [check_int(c, f"nisa.core_barrier: cores[{i}]", minimum=0) for i, c in enumerate(listed)]
    if not isinstance(engine, _Engine):
        raise argument_error("nisa.core_barrier: engine", "an nisa.engine", engine)
    rank, _instances = _launch_rank()
    if rank not in members:
        raise kernel_error_at(user_frame(), f"nisa.core_barrier: cores={tuple(members)} leaves out this program "
                              f"instance ({rank})", limit="a core waits at a barrier with the other cores it names",
                              hint="name this instance among cores, e.g. cores=(0, 1)")
    _emit(_core.Opcode.core_barrier, (data,), _Engine.sync, name, lanes=members)


def sendrecv(src: NkiTensor, dst: NkiTensor, send_to_rank: int, recv_from_rank: int, pipe_id: int,
             dma_engine: dma_engine = dma_engine.dma, name: str | None = None) -> None:
    """Sends the SBUF tile `src` to the program instance `send_to_rank`, whose `dst` receives it,
    while `dst` receives the `src` of instance `recv_from_rank` (ranks number the launch's program
    instances: 0 and 1 for ``kernel[2]``).

    As NKI pairs them, the n-th sendrecv of an instance meets the n-th of its partners: nikki runs
    the instances in turn until each reaches its next sendrecv or core_barrier, then moves the
    data. src and dst have the same dtype and size (the partner's dst receives this src's bytes);
    ``pipe_id`` groups transfers on the hardware and changes nothing here, as every sendrecv
    completes before its instance goes on; ``dma_engine`` has no effect.

    Limits: NeuronCore-v3 and later; src and dst in SBUF. Cost (estimate): the DMA fixed latency
    plus the bytes at the DMA bandwidth, after both partners arrive."""
    src, dst = _check_tensor(src, "src"), _check_tensor(dst, "dst")
    _rank, instances = _launch_rank()
    ranks = [check_int(r, f"nisa.sendrecv: {what}", minimum=0) for r, what in
             ((send_to_rank, "send_to_rank"), (recv_from_rank, "recv_from_rank"))]
    for r, what in zip(ranks, ("send_to_rank", "recv_from_rank")):
        if r >= instances:
            raise kernel_error_at(user_frame(), f"nisa.sendrecv: {what}={r}, but the launch has {instances} program "
                                  f"instance{'s' if instances > 1 else ''}",
                                  limit=f"ranks are the launch's program instances, 0 to {instances - 1}",
                                  hint="launch the kernel on two cores (kernel[2], or NEURON_LOGICAL_NC_CONFIG=2)"
                                  if instances == 1 else "send to and receive from an instance of the launch")
    pipe = check_int(pipe_id, "nisa.sendrecv: pipe_id", minimum=0)
    if not isinstance(dma_engine, _DmaEngine):
        raise argument_error("nisa.sendrecv: dma_engine", "an nisa.dma_engine", dma_engine)
    _emit(_core.Opcode.sendrecv, (dst, src), _Engine.sync, name, lanes=[ranks[0], ranks[1], pipe])


# --- NKI instructions nikki does not implement yet --------------------------------------------

def nc_matmul_mx(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, stationary_scale: NkiTensor,
                 moving_scale: NkiTensor, tile_position: Sequence[int] | None = None,
                 tile_size: Sequence[int] | None = None, accumulate: bool | None = None, name: str | None = None) -> None:
    """A matmul of MXFP8 / MXFP4 tiles (x4-packed dtypes) with their per-block scales, dequantized on the fly (NeuronCore-v4, Tensor engine).

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.nc_matmul_mx")


def activate2(dst: NkiTensor, op: Operator, data: NkiTensor, imm0: Operand, imm1: Operand, op0: Operator,
              op1: Operator, relu_param: float = 0.0, reverse0: bool = False, reverse1: bool = False,
              reduce_op: Operator = None, reduce_res: NkiTensor | None = None,
              reduce_cmd: reduce_cmd = reduce_cmd.idle, name: str | None = None) -> None:
    """``dst = op((data op0 imm0) op1 imm1)`` with an optional reduction (NeuronCore-v4, Scalar engine).

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.activate2")


def tensor_scalar_cumulative(dst: NkiTensor, src: NkiTensor, op0: Operator, op1: Operator, imm0: Operand,
                             imm1: Operand | None = None, reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce,
                             name: str | None = None) -> None:
    """A running reduction along each partition: ``r = op1(op0(src[i], imm0), r); dst[i] = r`` (Vector engine).

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.tensor_scalar_cumulative")


def exponential(dst: NkiTensor, src: NkiTensor, max_value: Operand = 0.0, reduce_res: NkiTensor | None = None,
                reduce_cmd: reduce_cmd = reduce_cmd.idle, reduce_init: float = 0.0, name: str | None = None) -> None:
    """``dst = exp(src - max_value)`` with an optional running sum into reduce_res (NeuronCore-v4).

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.exponential")


def quantize_mx(dst: NkiTensor, src: NkiTensor, dst_scale: NkiTensor, name: str | None = None) -> None:
    """Quantizes bf16 / fp16 tiles to x4-packed fp8 with e8m0 block scales (NeuronCore-v4, Vector engine).

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.quantize_mx")


def dropout(dst: NkiTensor, data: NkiTensor, prob: Operand, name: str | None = None) -> None:
    """``dst = data`` with each element zeroed with probability prob (Vector engine; cost ``max(MIN_II, N)``).

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.dropout")


def rng(dst: NkiTensor, engine: engine = engine.vector, name: str | None = None) -> None:
    """Fills dst with random bits from the engine's generator.

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.rng")


def rand2(dst: NkiTensor, min: Operand, max: Operand, name: str | None = None) -> None:
    """Fills dst with uniform random values in [min, max) (NeuronCore-v4 XORWOW generator).

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.rand2")


def set_rng_seed(src_seeds: NkiTensor, name: str | None = None) -> None:
    """Seeds the random number generators from a tile of seeds.

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.set_rng_seed")


def rand_set_state(src_seeds: NkiTensor, engine: engine = engine.gpsimd, name: str | None = None) -> None:
    """Loads an engine's random generator state from a tile.

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.rand_set_state")


def rand_get_state(dst: NkiTensor, engine: engine = engine.gpsimd, name: str | None = None) -> None:
    """Stores an engine's random generator state into a tile.

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.rand_get_state")


@overload
def local_gather(dst: NkiTensor, src_buffer: NkiTensor, index: NkiTensor, num_elem_per_idx: int = 1,
                 num_valid_indices: int | None = None, name: str | None = None) -> None: ...


@overload
def local_gather(src_buffer: NkiTensor, index: NkiTensor, num_elem_per_idx: int = 1,
                 num_valid_indices: int | None = None, *, mask: LegacyMask = None) -> NkiTensor: ...


def local_gather(*args: Any, **kwargs: Any) -> NkiTensor | None:
    """A gather within each GpSimd core's 16 partitions.

    Each core (partitions 0-15, 16-31, ...) flattens its 16 partitions of ``index`` partition
    dimension first (``index[c*16:(c+1)*16].flatten(order="F")``) and takes the first
    ``num_valid_indices`` (default: all of them, ``index.size / (index.shape[0] / 16)``). Every
    partition ``p`` of the core then copies, for each of those indices ``i_j``, the
    ``num_elem_per_idx`` elements starting at element ``i_j`` of its own flattened row of
    ``src_buffer``: ``dst[p, j * n + e] = src_buffer[p, i_j + e]``.

    Limits: ``index`` is uint16; ``src_buffer``, ``index`` and ``dst`` span the same partitions, a
    multiple of 16; ``num_elem_per_idx`` in 1, 2, 4, 8, 16, 32; at most 4096 indices per core; dst
    has src_buffer's dtype and ``num_valid_indices * num_elem_per_idx`` elements per partition. An
    index whose run leaves the row is a run-time error (undefined on the device).
    The legacy form ``local_gather(src_buffer, index, ...)`` returns a new
    ``[P, num_valid_indices, num_elem_per_idx]`` tile.
    Engine: GpSimd. Cost: not published (nikki charges the GpSimd start-up plus one cycle per
    element written per partition)."""
    if _legacy(kwargs, len(args) < 3 or not isinstance(args[2], NkiTensor), args, "src_buffer"):
        return _legacy_local_gather(*args, **kwargs)
    return _local_gather(*args, **kwargs)


def _gather_indices_per_core(index: NkiTensor, num_valid_indices) -> int:
    if num_valid_indices is not None:
        return check_int(num_valid_indices, "nisa.local_gather: num_valid_indices")
    partitions = index.shape[0] if index.shape else 1
    return index.size // max(1, partitions) * 16


def _local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    index = _check_tensor(index, "index")
    _emit(_core.Opcode.local_gather, (_check_tensor(dst, "dst"), _check_tensor(src_buffer, "src_buffer"), index),
          engine.gpsimd, name, step=check_int(num_elem_per_idx, "nisa.local_gather: num_elem_per_idx"),
          offset=_gather_indices_per_core(index, num_valid_indices))


def _legacy_local_gather(src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, *, mask=None, name=None):
    if mask is not None:
        _not_implemented("nki.isa.local_gather(mask=...)")
    src_buffer, index = _check_tensor(src_buffer, "src_buffer"), _check_tensor(index, "index")
    per_index = check_int(num_elem_per_idx, "nisa.local_gather: num_elem_per_idx")
    valid = _gather_indices_per_core(index, num_valid_indices)
    out = _new_tile((src_buffer.shape[0], valid, per_index), src_buffer.dtype)
    _local_gather(out, src_buffer, index, per_index, valid, name)
    return out


def sequence_bounds(dst: NkiTensor, segment_ids: NkiTensor, name: str | None = None) -> None:
    """For each element, the [start, end] of the segment its segment id belongs to (GpSimd engine).

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.sequence_bounds")


def topk(val_dst: NkiTensor, idx_dst: NkiTensor, src: NkiTensor, n: int, name: str | None = None) -> None:
    """The K largest values and their indices per partition of a 16-partition bf16 layout (GpSimd engine; cost ``4n + K`` per partition).

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.topk")


def tensor_copy_dynamic_src(src: NkiTensor, *, mask: LegacyMask = None, dtype: DTypeLike = None,
                            engine: engine = engine.unknown) -> None:
    """Beta 1: a copy from a source addressed at run time (removed in NKI 0.4; cost ``max(600, N)`` cycles).

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.tensor_copy_dynamic_src")


def tensor_copy_dynamic_dst(*, dst: NkiTensor, src: NkiTensor, mask: LegacyMask = None, dtype: DTypeLike = None,
                            engine: engine = engine.unknown) -> None:
    """Beta 1: a copy into a destination addressed at run time (removed in NKI 0.4; cost ``max(600, N)`` cycles).

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.tensor_copy_dynamic_dst")


def builtin_custom_op(function_name: str, lib_file_name: str, ulib_to_ucode_version: str, ulib_to_isa_version: str,
                      srcs: Sequence[NkiTensor], dsts: Sequence[NkiTensor]) -> None:
    """Beta 1: calls a custom GpSimd operator from a compiled library.

    Not supported by nikki yet: calling it raises NotImplementedError (see docs/api-coverage.md)."""
    _not_implemented("nki.isa.builtin_custom_op")


# Current (NKI 0.6) and legacy (Beta 1) instructions without a nikki implementation, defined above
# so that code using them fails with a NotImplementedError naming the instruction, not an
# AttributeError; they are deliberately not in __all__ (docs/api-coverage.md lists them).
UNSUPPORTED = (
    "nc_matmul_mx", "activate2", "tensor_scalar_cumulative", "exponential", "quantize_mx", "dropout", "rng", "rand2",
    "set_rng_seed", "rand_set_state", "rand_get_state", "sequence_bounds", "topk",
    "tensor_copy_dynamic_src", "tensor_copy_dynamic_dst", "builtin_custom_op",
)


# --- helpers for legacy tile assignment and accumulation (used by NkiTensor) ------------------

def _produce_in_place(dst: NkiTensor, value: NkiTensor) -> bool:
    """``dst[...] = value`` where `value` is a fresh whole tile that only the last instruction
    writes (created just before it) and nothing else refers to: that instruction writes dst
    instead, saving the tile and a copy (Beta 1 kernels load and compute into slices of block
    tensors this way). Same shape, dtype and memory only, so the result is bit for bit the copy's."""
    ctx = current()
    builder = ctx.builder
    last = builder.num_instructions - 1
    view = value._view
    if (last < 0 or type(value) not in (NkiTensor, ComparisonTile) or dst.is_indirect() or value.is_indirect()
            or value.shape != dst.shape or value.dtype != dst.dtype or value.buffer is not dst.buffer
            or builder.storage_defined_at(view.storage) != last):
        return False
    written = builder.instruction_operand(last, 0)
    if written is None or not written.same_as(view):
        return False
    target = dst._view.storage
    for slot in range(1, 5):  # reading dst while writing it would change what the instruction computes
        operand = builder.instruction_operand(last, slot)
        if operand is not None and operand.storage == target:
            return False
    if builder.instruction_opcode(last) is _core.Opcode.nc_matmul:
        ctx.pending_matmul.pop(view.storage, None)
    builder.retarget(last, 0, dst._view)
    return True


def _assign(dst: NkiTensor, value: NkiTensor) -> None:
    """``dst[...] = value``: a DMA when either side is in HBM, otherwise an engine copy."""
    if dst.buffer.is_hbm or value.buffer.is_hbm:
        if value.buffer is psum:
            staged = _new_tile(value.shape, value.dtype)
            _tensor_copy(staged, value)
            value = staged
        dma_copy(dst, value)
    else:
        _tensor_copy(dst, value)


def _assign_scalar(dst: NkiTensor, value) -> None:
    value = _number(value, f"the value assigned to tensor '{dst.name}'")
    if not dst.dtype.is_float:
        if value != value or value in (float("inf"), float("-inf")):
            raise kernel_error_at(user_frame(), f"cannot store {value} in tensor '{dst.name}' of dtype "
                                  f"{dst.dtype.name}", hint="integer tiles hold finite values only")
        value = int(value)
    _memset(dst, value)


def _accumulate_into(dst: NkiTensor, other) -> None:
    """``dst += other``; a fresh matmul result accumulates straight into a PSUM dst. The matmul is
    retargeted only when it is the instruction just emitted (``psum += nisa.nc_matmul(...)``): if
    anything read its result tile since, that tile must keep being written."""
    ctx = current()
    if isinstance(other, NkiTensor) and dst.buffer is psum:
        index = ctx.pending_matmul.pop(other._view.storage, None)
        if (index is not None and index == ctx.builder.num_instructions - 1
                and ctx.builder.instruction_operand(index, 0).same_as(other._view)):
            if dst._view.storage in ctx.shared_placements:
                # Memory that an allocation at the same placement took over: the sum (the device
                # compiler's accumulation group) starts at the first '+=' into this region since
                # that allocation, so that matmul writes rather than adds onto the last occupant.
                started = ctx.started_sums.setdefault(dst._view.storage, [])
                if not any(view.same_as(dst._view) for view in started):
                    started.append(dst._view)
                    ctx.builder.retarget(index, 0, dst._view)
                    return
            ctx.builder.retarget_accumulate(index, dst._view)
            return
    _update_in_place(dst, other, "add")


def _update_in_place(dst: NkiTensor, other, op: str) -> None:
    alu = getattr(_core.AluOp, op)
    if isinstance(other, NkiTensor):
        if dst.buffer is psum and other.buffer is psum:
            # an engine reads at most one PSUM input: stage the other operand through SBUF
            staged = _new_tile(other.shape, other.dtype)
            _tensor_copy(staged, other)
            other = staged
        if other.shape[1:] == (1,) * (other.ndim - 1) and dst.size != other.size:
            _tensor_scalar(dst, dst, alu, other)
        else:
            _tensor_tensor(dst, dst, other, alu)
    else:
        _tensor_scalar(dst, dst, alu, _number(other, f"the operand of an in-place {op} of tensor '{dst.name}'"))


# --- nki.isa.constants ------------------------------------------------------------------------
# NKI also publishes the instruction enums in a submodule (``from nki.isa.constants import oob_mode``).
constants = _types.ModuleType("nikki.isa.constants", "The nki.isa enums (engine, reduce_cmd, dge_mode, oob_mode, ...).")
for _name in ("engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "nc_version", "dma_engine"):
    setattr(constants, _name, globals()[_name])
del _name
sys.modules.setdefault("nikki.isa.constants", constants)


# Legacy tile assignment and in-place updates of NkiTensor (t[...] = x, t += x) are these functions.
hooks.tensor_tensor = _tensor_tensor
hooks.produce_in_place = _produce_in_place
hooks.partition_broadcast = _partition_broadcast
hooks.masked_write_of = _masked_write_of
hooks.assign = _assign
hooks.assign_scalar = _assign_scalar
hooks.accumulate_into = _accumulate_into
hooks.update_in_place = _update_in_place


def _show_current_form(fn: Any) -> None:
    """inspect.signature / help() of an instruction with two forms show its current (NKI 0.6) form,
    the first of its typing overloads (the dispatcher itself takes *args, **kwargs)."""
    get_overloads = getattr(typing, "get_overloads", None)  # Python 3.11+
    forms = get_overloads(fn) if get_overloads is not None else []
    if forms:
        fn.__signature__ = inspect.signature(forms[0])


for _name in __all__:
    if isinstance(globals()[_name], _types.FunctionType):
        _show_current_form(globals()[_name])
del _name
