"""NkiTensor: a view of a tensor in the kernel being traced, and the memory regions it lives in."""

from __future__ import annotations

import sys
from typing import Any

from . import _core
from .arguments import argument_error, check_int, check_shape, is_int
from .dtypes import BY_CORE_INDEX as _DTYPE_BY_INDEX
from .dtypes import dtype as _dtype_cls
from .dtypes import to_dtype
from .errors import KernelError, ViewError, is_internal_frame, kernel_error_at, user_frame
from .hooks import hooks
from .registers import VirtualRegister
from .tracing import assigned_name, current

__all__ = ["MemoryRegion", "NkiTensor", "DynSlice", "sbuf", "psum", "hbm", "shared_hbm", "private_hbm", "ndarray",
           "par_dim"]


class MemoryRegion:
    """A memory a tensor lives in (``nl.sbuf``, ``nl.psum``, ``nl.hbm``, ...)."""

    __slots__ = ("name", "core")

    def __init__(self, name: str):
        self.name = name
        self.core = getattr(_core.Buffer, name)

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    @property
    def is_on_chip(self) -> bool:
        return self.name in ("sbuf", "psum")

    @property
    def is_hbm(self) -> bool:
        return not self.is_on_chip


sbuf = MemoryRegion("sbuf")
psum = MemoryRegion("psum")
hbm = MemoryRegion("hbm")
shared_hbm = MemoryRegion("shared_hbm")
private_hbm = MemoryRegion("private_hbm")
_REGIONS = {r.core: r for r in (sbuf, psum, hbm, shared_hbm, private_hbm)}


def region_of(buffer) -> MemoryRegion:
    """Normalizes a buffer argument; NKI rejects string names, so nikki does too."""
    if isinstance(buffer, MemoryRegion):
        return buffer
    allocated = getattr(buffer, "region", None)  # a direct allocation (nki.compiler.sbuf.mod_alloc(...))
    if isinstance(allocated, MemoryRegion):
        return allocated
    if isinstance(buffer, str):
        raise kernel_error_at(user_frame(2), f"buffer={buffer!r}: string buffer names are not supported",
                              hint=f"pass the memory region object, e.g. buffer=nl.{buffer}")
    raise kernel_error_at(user_frame(2), f"buffer={buffer!r} is not a memory region",
                          hint="use nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm or nl.private_hbm")


# Subscripts beyond this cannot address any tensor, and do not fit the IR's 64-bit indices.
_INDEX_LIMIT = 2 ** 62


class DynSlice:
    """``nl.ds(start, size)``: the slice [start, start + size). `start` may be a runtime value (a
    register or a 1x1 integer tensor); `size` is a compile-time integer."""

    __slots__ = ("start", "size")

    def __init__(self, start, size: int):
        self.size = check_int(size, "nl.ds: size", 1, _INDEX_LIMIT)
        self.start = start if _is_runtime_index(start) else check_int(start, "nl.ds: start", 0, _INDEX_LIMIT)

    @property
    def is_runtime(self) -> bool:
        return _is_runtime_index(self.start)

    def as_slice(self) -> slice:
        start = 0 if self.is_runtime else self.start
        return slice(start, start + self.size)

    def __repr__(self) -> str:
        return f"nl.ds({self.start}, {self.size})"


def _is_runtime_index(x) -> bool:
    """A register or a tensor standing for an index known only at run time."""
    return isinstance(x, (VirtualRegister, NkiTensor))


def _checked_index(k) -> int:
    """An integer subscript as an int (bools are not subscripts: numpy reads them as masks)."""
    return int(k)  # one beyond int64 is named by the view's own check


def _checked_slice(k: slice) -> slice:
    """A slice subscript whose bounds are integers and whose step is positive: an access pattern
    walks a dim forwards only."""
    for part in (k.start, k.stop, k.step):
        if part is not None and part.__class__ is not int:
            if not is_int(part):
                raise argument_error("a slice bound", "an integer or None", part)
            return _checked_slice(slice(*(None if p is None else int(p) for p in (k.start, k.stop, k.step))))
    if k.step is not None and k.step <= 0:
        raise kernel_error_at(user_frame(), f"slice step must be positive, got {k.step} in "
                              f"[{'' if k.start is None else k.start}:{'' if k.stop is None else k.stop}:{k.step}]",
                              hint="reverse iteration is not expressible as an NKI access pattern")
    return k


def _view_error(err: ViewError, name: str) -> KernelError:
    return kernel_error_at(user_frame(3), f"tensor '{name}': {err.what}", limit=err.limit, hint=err.hint)


class NkiTensor:
    """A view of a tensor inside a kernel being traced (NKI's NkiTensor).

    Views are free: slicing, reshaping, permuting and broadcasting return new views of the same
    storage. Out-of-bound subscripts are errors, never clipped.
    """

    __slots__ = ("_ctx", "_view")
    __array_priority__ = 1000  # numpy scalars defer to NkiTensor's operators

    def __init__(self, ctx, view):
        self._ctx = ctx
        self._view = view

    # --- attributes -----------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self._view.shape

    @property
    def dtype(self) -> _dtype_cls:
        return _DTYPE_BY_INDEX[self._view.dtype_index]

    @property
    def buffer(self) -> MemoryRegion:
        regions = self._ctx.regions
        storage = self._view.storage
        region = regions.get(storage)
        if region is None:
            region = regions[storage] = _REGIONS[self._ctx.builder.storage_buffer(storage)]
        return region

    @property
    def ndim(self) -> int:
        return self._view.ndim

    @property
    def size(self) -> int:
        return self._view.size

    @property
    def offset(self) -> int:
        return self._view.offset

    @property
    def strides(self) -> tuple:
        return self._view.strides

    @property
    def name(self) -> str:
        return self._ctx.builder.storage_name(self._view.storage)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def get_pattern(self) -> list:
        """The access pattern as [[stride, count], ...], outermost first."""
        return [list(p) for p in self._view.pattern]

    def is_contiguous(self) -> bool:
        return self._view.is_contiguous()

    def is_indirect(self) -> bool:
        return self._view.is_dynamic

    def __repr__(self) -> str:
        return f"NkiTensor('{self.name}', shape={self.shape}, dtype={self.dtype.name}, buffer={self.buffer.name})"

    def __len__(self) -> int:
        return self.shape[0]

    def __bool__(self) -> bool:
        # A tensor is a compile-time object: `if t:` asks whether one was given (NKI kernels test
        # optional tensor parameters that way). Comparison tiles refuse (see ComparisonTile).
        return True

    __hash__ = object.__hash__

    # --- views ----------------------------------------------------------------------------
    def _derive(self, method: str, *args) -> "NkiTensor":
        try:
            return NkiTensor(self._ctx, getattr(self._view, method)(*args))
        except ViewError as err:
            raise _view_error(err, self.name) from None

    def __getitem__(self, key) -> "NkiTensor":
        if not isinstance(key, tuple):
            key = (key,)
        if hooks.uses_index_expr(key):  # legacy nl.arange index expressions
            return hooks.index_subscript(self, key)
        subs: list[slice | int] = []
        runtime = []  # (dim, runtime index) of subscripts t[reg] / t[nl.ds(reg, size)]
        for i, k in enumerate(key):
            if k is Ellipsis:
                fill = self.ndim - (len(key) - 1)
                subs.extend([slice(None)] * max(fill, 0))
            elif isinstance(k, DynSlice):
                if k.is_runtime:
                    runtime.append((len(subs), k.start))
                subs.append(k.as_slice())
            elif k.__class__ is slice:
                subs.append(_checked_slice(k))
            elif is_int(k):
                subs.append(_checked_index(k))
            elif _is_runtime_index(k):
                if isinstance(k, NkiTensor) and k.size != 1:
                    raise kernel_error_at(user_frame(2), f"subscript is a tensor of shape {k.shape}; a runtime "
                                          "subscript is a register or a 1x1 tensor",
                                          hint="gather rows with t.ap(pattern, vector_offset=indices) in "
                                               "nisa.dma_copy")
                runtime.append((len(subs), k))
                subs.append(0)
            else:
                raise kernel_error_at(user_frame(2), f"unsupported subscript {k!r}",
                                      hint="use integers, slices, nl.ds(start, size) or ...")
        try:
            view = self._view.subscript(subs, self.buffer.is_on_chip)
        except ViewError as err:
            error = _view_error(err, self.name)
            if not runtime and "out-of-bound" in err.what:
                lazy = hooks.overhanging_slices(self, key, error)  # a legacy mask= may trim them into bounds
                if lazy is not None:
                    return lazy
            raise error from None
        if runtime:
            if len(runtime) > 1:
                raise kernel_error_at(user_frame(2), "only one subscript of a view may be a runtime index",
                                      hint="combine the runtime offsets into one register")
            dim, index = runtime[0]
            view = self._with_runtime_offset(view, self._view.strides[dim], index)
        return NkiTensor(self._ctx, view)

    def _with_runtime_offset(self, view, stride: int, index):
        """`view` shifted at run time by index * stride elements (index: a register or a 1x1 tensor)."""
        if self.is_indirect():
            raise kernel_error_at(user_frame(3), f"tensor '{self.name}': a view with runtime offsets cannot take "
                                  "another runtime index", hint="index the base tensor once")
        if isinstance(index, VirtualRegister):
            return view.with_indirection(None, index._reg, stride, None, 0, 0)
        return view.with_indirection(index._view, None, stride, None, 0, 0)

    def __setitem__(self, key, value) -> None:
        """Legacy assignment ``t[...] = value``: copies value (a tile or a scalar) into t[key]."""
        # A tile no name refers to (`t[i] = nl.load(...)`: references from the caller's stack, this
        # frame and getrefcount's argument) may be written in place by the instruction producing it.
        temporary = sys.getrefcount(value) <= 3
        dst = self[key]
        if isinstance(value, LoopReduction):
            hooks.tensor_tensor(dst, dst, value, value.op)
        elif isinstance(value, NkiTensor):
            if dst._view.same_as(value._view):
                return  # `t[i] += x` writes in place, then assigns t[i] to itself
            mask = hooks.masked_write_of(value)
            if mask is not None:  # `t[i] = op(..., mask=m)`: the mask applies to the assignment too
                ops = hooks.apply_mask(mask, dst, value)
                if ops is None:
                    return
                # a mask that keeps the whole tile: the masked instruction may write dst itself
                if temporary and ops[1].shape == value.shape and hooks.produce_in_place(dst, value):
                    return
                hooks.assign(*ops)
                return
            if temporary and hooks.produce_in_place(dst, value):
                return
            hooks.assign(dst, value)
        else:
            hooks.assign_scalar(dst, value)

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> "NkiTensor":
        """Elements [start, end) with `step` along `dim`."""
        return self._derive("slice", check_int(dim, "slice(): dim"), check_int(start, "slice(): start"),
                            check_int(end, "slice(): end"), check_int(step, "slice(): step"))

    def select(self, dim: int, index) -> "NkiTensor":
        """Fixes `dim` at `index` and removes it; `index` may be a runtime register or 1x1 tensor."""
        if _is_runtime_index(index):
            if isinstance(index, NkiTensor) and index.size != 1:
                raise kernel_error_at(user_frame(2), f"select(): index is a tensor of shape {index.shape}; a runtime "
                                      "index is a register or a 1x1 tensor")
            d = dim + self.ndim if dim < 0 else dim
            dim = check_int(dim, "select(): dim")
            selected = self._derive("select", dim, 0)
            stride = self._view.strides[d] if 0 <= d < self.ndim else 0
            return NkiTensor(self._ctx, self._with_runtime_offset(selected._view, stride, index))
        return self._derive("select", check_int(dim, "select(): dim"), check_int(index, "select(): index"))

    def permute(self, dims) -> "NkiTensor":
        """Reorders dims: result dim k is input dim dims[k]."""
        try:
            order = list(dims)
        except TypeError:
            raise argument_error("permute(): dims", "a sequence of dim indices", dims) from None
        return self._derive("permute", [check_int(d, "permute(): dim") for d in order])

    def broadcast(self, dim: int, size: int) -> "NkiTensor":
        """Repeats a size-1 dim `size` times without copying (stride 0)."""
        return self._derive("broadcast", check_int(dim, "broadcast(): dim"),
                            check_int(size, "broadcast(): size", minimum=1))

    def broadcast_to(self, shape) -> "NkiTensor":
        """Broadcasts size-1 dims to `shape` (same rank). An SBUF/PSUM tile broadcast across
        partitions is copied into a full tile here, as Beta 1's broadcast_to returns a new tile:
        engines cannot read a view that repeats a partition, and a broadcast made once before a
        loop is then copied once."""
        shape = check_shape(shape, "broadcast_to(): shape", _core.max_rank)
        if len(shape) != self.ndim:
            raise kernel_error_at(user_frame(2), f"broadcast_to{shape} needs rank {self.ndim}")
        t = self
        for d, (have, want) in enumerate(zip(self.shape, shape)):
            if have != want:
                t = t._derive("broadcast", d, want)
        if t is not self and t._view.is_partition_broadcast and t.buffer.is_on_chip:
            return hooks.partition_broadcast(t)
        return t

    def expand_dim(self, dim: int) -> "NkiTensor":
        """A view with a size-1 dim inserted at `dim`."""
        return self._derive("expand_dim", check_int(dim, "expand_dim(): dim"))

    def expand_dims(self, axis: int) -> "NkiTensor":
        """A view with a size-1 dim inserted at `axis`."""
        return self._derive("expand_dim", check_int(axis, "expand_dims(): axis"))

    def squeeze_dim(self, dim: int) -> "NkiTensor":
        """A view without size-1 dim `dim`."""
        return self._derive("squeeze_dim", check_int(dim, "squeeze_dim(): dim"))

    def reshape(self, *shape, **kwargs) -> "NkiTensor":
        """Same elements with a new shape (no copy; merged dims must be contiguous): ``t.reshape(a, b)``,
        ``t.reshape((a, b))`` or ``t.reshape(shape=(a, b))``."""
        if "shape" in kwargs:
            if shape:
                raise TypeError("reshape() got the shape both positionally and as shape=")
            shape = (kwargs.pop("shape"),)
        if kwargs:
            raise TypeError(f"reshape() got an unexpected keyword argument '{next(iter(kwargs))}'")
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return self._derive("reshape", list(check_shape(shape, "reshape(): shape", _core.max_rank)))

    def reshape_dim(self, dim: int, shape) -> "NkiTensor":
        """A view with dim `dim` split into `shape`."""
        return self._derive("reshape_dim", check_int(dim, "reshape_dim(): dim"),
                            list(check_shape(shape, "reshape_dim(): shape", _core.max_rank)))

    def flatten_dims(self, start_dim: int, end_dim: int) -> "NkiTensor":
        """A view with dims start_dim..end_dim merged into one."""
        return self._derive("flatten_dims", check_int(start_dim, "flatten_dims(): start_dim"),
                            check_int(end_dim, "flatten_dims(): end_dim"))

    def view(self, dtype) -> "NkiTensor":
        """Reinterprets the bytes as `dtype`; the last dim is rescaled."""
        return self._derive("reinterpret", to_dtype(dtype).core)

    reinterpret_cast = view

    def assert_shape(self, shape) -> "NkiTensor":
        """Beta 1: raises unless the tensor has `shape`; returns the tensor."""
        if tuple(self.shape) != tuple(shape):
            raise kernel_error_at(user_frame(2), f"tensor '{self.name}' has shape {tuple(self.shape)}, not "
                                  f"{tuple(shape)}", limit="assert_shape checks the shape exactly")
        return self

    def astype(self, dtype) -> "NkiTensor":
        """Beta 1: a copy converted to `dtype` (a new SBUF tile)."""
        return hooks.copy(self, dtype=dtype)

    def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None):
        """NKI 0.5's einops-style view: not supported yet (NotImplementedError)."""
        raise NotImplementedError("NkiTensor.rearrange is not supported by nikki yet; compose reshape, permute and "
                                  "flatten_dims views instead (see docs/api-coverage.md)")

    def vector_select(self, dim, vector_offset):
        """NKI 0.5's per-partition dynamic select: not supported yet (NotImplementedError)."""
        raise NotImplementedError("NkiTensor.vector_select is not supported by nikki yet; use "
                                  ".ap(vector_offset=...) in nisa.dma_copy (see docs/api-coverage.md)")

    def indirect(self, index, num_elem=None):
        """Tensor indirection of NeuronCore-v4 compute instructions: not supported (NotImplementedError)."""
        raise NotImplementedError("NkiTensor.indirect (tensor indirection, NeuronCore-v4) is not supported by nikki "
                                  "(see docs/api-coverage.md)")

    def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim: int = 0,
           dtype=None) -> "NkiTensor":
        """A raw access pattern [[stride, count], ...] over this tensor's storage, ignoring the
        current view (NKI's .ap()). Runtime offsets come from a register or a 1x1 tensor
        (scalar_offset) or a per-partition index tensor (vector_offset)."""
        dt = to_dtype(dtype).core if dtype is not None else self._ctx.builder.storage(self._view.storage)["dtype"]
        try:
            pairs = [tuple(pair) for pair in pattern]
        except TypeError:
            pairs = None
        if pairs is None or any(len(p) != 2 or not (is_int(p[0]) and is_int(p[1])) for p in pairs):
            raise kernel_error_at(user_frame(2), "ap(): pattern must be a list of [stride, count] pairs of integers")
        pairs = [(int(stride), int(count)) for stride, count in pairs]
        v = self._derive("with_pattern", pairs, check_int(offset or 0, "ap(): offset"), dt)._view
        if scalar_offset is None and vector_offset is None:
            return NkiTensor(self._ctx, v)
        if scalar_offset is not None and vector_offset is not None:
            raise kernel_error_at(user_frame(2), "ap(): scalar_offset and vector_offset are mutually exclusive")
        storage_shape = self._ctx.builder.storage(self._view.storage)["shape"]
        if not 0 <= indirect_dim < len(storage_shape):
            raise kernel_error_at(user_frame(2), f"ap(): indirect_dim {indirect_dim} is out of range for a "
                                  f"tensor of rank {len(storage_shape)}")
        multiplier = 1
        for extent in storage_shape[indirect_dim + 1:]:
            multiplier *= extent
        scalar_view = scalar_reg = vector_view = None
        if isinstance(scalar_offset, VirtualRegister):
            scalar_reg = scalar_offset._reg
        elif isinstance(scalar_offset, NkiTensor):
            if scalar_offset.size != 1:
                raise kernel_error_at(user_frame(2), f"ap(): scalar_offset must be a 1x1 tensor, got shape "
                                      f"{scalar_offset.shape}", hint="pass a [1, 1] SBUF tensor or a register")
            scalar_view = scalar_offset._view
        elif scalar_offset is not None:
            raise kernel_error_at(user_frame(2), "ap(): scalar_offset must be a register or a 1x1 tensor",
                                  hint="a compile-time offset goes in offset=")
        if vector_offset is not None:
            if not isinstance(vector_offset, NkiTensor):
                raise kernel_error_at(user_frame(2), "ap(): vector_offset must be an SBUF index tensor")
            if indirect_dim != 0:
                raise kernel_error_at(user_frame(2), "ap(): vector_offset supports only indirect_dim=0",
                                      limit="indirect_dim must be 0")
            vector_view = vector_offset._view
        return NkiTensor(self._ctx, v.with_indirection(scalar_view, scalar_reg, multiplier, vector_view,
                                                      indirect_dim, multiplier))

    # --- legacy tile arithmetic (each operator emits instructions and returns a new tile) ---
    def _binary(self, other, op, reverse=False):
        return hooks.binary_op(op, other, self) if reverse else hooks.binary_op(op, self, other)

    def __add__(self, other):
        return self._binary(other, "add")

    def __radd__(self, other):
        return self._binary(other, "add", True)

    def __sub__(self, other):
        return self._binary(other, "subtract")

    def __rsub__(self, other):
        return self._binary(other, "subtract", True)

    def __mul__(self, other):
        return self._binary(other, "multiply")

    def __rmul__(self, other):
        return self._binary(other, "multiply", True)

    def __truediv__(self, other):
        return self._binary(other, "divide")

    def __rtruediv__(self, other):
        return self._binary(other, "divide", True)

    def __pow__(self, other):
        return self._binary(other, "power")

    def __and__(self, other):
        return self._binary(other, "bitwise_and")

    def __or__(self, other):
        return self._binary(other, "bitwise_or")

    def __xor__(self, other):
        return self._binary(other, "bitwise_xor")

    def __lshift__(self, other):
        return self._binary(other, "left_shift")

    def __rshift__(self, other):
        return self._binary(other, "right_shift")

    def __lt__(self, other):
        return self._binary(other, "less")

    def __le__(self, other):
        return self._binary(other, "less_equal")

    def __gt__(self, other):
        return self._binary(other, "greater")

    def __ge__(self, other):
        return self._binary(other, "greater_equal")

    def __eq__(self, other):
        if not isinstance(other, (NkiTensor, int, float)):
            return NotImplemented
        return self._binary(other, "equal")

    def __ne__(self, other):
        if not isinstance(other, (NkiTensor, int, float)):
            return NotImplemented
        return self._binary(other, "not_equal")

    def __neg__(self):
        return hooks.negative(self)

    def __abs__(self):
        return hooks.abs(self)

    def __invert__(self):
        return hooks.invert(self)

    def __iadd__(self, other):
        """``t += x`` accumulates in place; ``psum += nisa.nc_matmul(...)`` accumulates in PSUM."""
        hooks.accumulate_into(self, other)
        return self

    def __isub__(self, other):
        hooks.update_in_place(self, other, "subtract")
        return self

    def __imul__(self, other):
        hooks.update_in_place(self, other, "multiply")
        return self


class LoopReduction(NkiTensor):
    """A later iteration's ``nl.loop_reduce`` value: assigning it (``t[...] = value``) folds it into
    t with the reduction's operator instead of overwriting t."""

    __slots__ = ("op",)

    def __init__(self, ctx, view, op):
        super().__init__(ctx, view)
        self.op = op


class ComparisonTile(NkiTensor):
    """The 0/1 tile of a comparison (``a < b``): unlike other tensors, its truth value is a run-time
    value, so ``if a < b:`` is an error rather than always true."""

    __slots__ = ()

    def __bool__(self):
        raise kernel_error_at(user_frame(2), "Cannot evaluate truth value of a multi-element tensor",
                              hint="a comparison of tiles is computed at run time; use nl.where / masks, or "
                                   "compare shapes instead")


# --- tensor creation (nl.ndarray; the tiles instructions create) ---------------------------

class par_dim(int):
    """Legacy marker of the partition dim in a shape with leading block dims (Beta 1)."""


def _shape(shape) -> tuple:
    if is_int(shape):
        return (int(shape),)
    try:
        dims = tuple(shape)
    except TypeError:
        dims = None
    if dims is None or isinstance(shape, str) or not all(is_int(s) for s in dims):
        raise kernel_error_at(user_frame(3), f"shape {shape!r} is not a tuple of integers",
                              hint="dims are ints (a float or a bool is not a size)")
    return tuple(int(s) for s in dims)


def ndarray(shape: Any, dtype: Any, buffer: MemoryRegion = sbuf, name: str = "",
            address: tuple[int, int] | None = None) -> NkiTensor:
    """A new uninitialized tensor (reads before writes see NaN for floats, 4 for integers).

    Parameters: ``shape``: positive extents, at most the target's maximum rank (a Beta 1
    ``nl.par_dim`` after leading block dims makes a block tensor); ``dtype``: any dtype spelling;
    ``buffer``: nl.sbuf (default), nl.psum, nl.hbm, nl.shared_hbm (a kernel output) or
    nl.private_hbm; ``name``: defaults to the variable the call is assigned to; ``address``: a
    (partition, byte offset) placement in SBUF / PSUM. No instruction: allocation is free.
    """
    ctx = current("nl.ndarray")
    shape_t = _shape(shape)
    if isinstance(shape, (tuple, list)) and any(isinstance(s, par_dim) for s in shape) \
            and not isinstance(shape[0], par_dim):
        return hooks.block_tensor(shape, dtype, buffer, name)  # legacy block tensor
    region = region_of(buffer)
    if not shape_t or any(s < 1 for s in shape_t):
        raise kernel_error_at(user_frame(2), f"nl.ndarray shape {shape_t} must have positive extents",
                              hint="give the tensor a shape such as (128, 512)")
    if len(shape_t) > _core.max_rank:
        raise kernel_error_at(user_frame(2), f"nl.ndarray shape {shape_t} has {len(shape_t)} dims",
                              limit=f"tensors have at most {_core.max_rank} dims", hint="merge dims")
    if address is not None and not region.is_on_chip:
        raise kernel_error_at(user_frame(2), f"address= is only meaningful for sbuf and psum tensors, not {region.name}")
    if address is not None:
        try:
            partition, byte = address
        except (TypeError, ValueError):
            raise kernel_error_at(user_frame(2), f"nl.ndarray: address={address!r} must be a (partition, byte) "
                                  "pair") from None
        address = (check_int(partition, "nl.ndarray: address partition", minimum=0),
                   check_int(byte, "nl.ndarray: address byte offset", minimum=0))
    role = "output" if region is shared_hbm else "scratch"
    if not name:
        caller = sys._getframe(1)
        if not is_internal_frame(caller.f_code.co_filename):
            name = assigned_name(caller)
    view = ctx.builder.add_storage(name or "t", region.core, to_dtype(dtype).core, list(shape_t), role,
                                   ctx.location(), address)
    return NkiTensor(ctx, view)
