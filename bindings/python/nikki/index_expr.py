"""Legacy (Beta 1) index expressions: ``nl.arange`` / ``nl.mgrid`` subscripts, ``mask=`` predicates,
legacy ``nisa.iota(expr)`` / ``nisa.affine_select(pred)``, and tensors with leading block dims
(``nl.par_dim``).

Model. An index expression is an affine function of the positions of a numpy-style index grid:
``nl.arange(128)[:, None]`` is the position ``j0`` along grid axis 0 of a 2-D grid of shape
(128, 1), ``nl.arange(512)[None, :]`` is ``j1`` along axis 1 (shape (1, 512)), and
``i_p + 128*k`` is ``j0 + 128*k``. Grids combine with numpy broadcasting (right-aligned axes), so an
expression is (rank, coefficient per axis, extent per axis, constant). Variables are not tracked by
identity: two aranges on the same axis are the same position, as in numpy broadcasting.

Subscripting ``t[e_0, ..., e_{n-1}]`` with one affine expression (or integer) per tensor dim gives a
view whose dims are the grid axes (axis 0, the partition axis, first): axis k steps by
``sum_d coef_{d,k} * stride_d`` and the view starts at ``sum_d const_d * stride_d``. Such a view is
kept lazy (:class:`IndexedTensor`) because NKI's idiom is an over-sized tile masked down on the last
tile; the out-of-bound check runs when an instruction consumes the view, after its mask restricted
the grid. A mask is a conjunction of comparisons, each on one grid axis, so it restricts every axis
to a range of positions; instructions then see operands sliced to those ranges (plain tiles are
sliced positionally: axis 0 on dim 0, the other axes right-aligned on the last dims).
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

import numpy as np

from . import _core
from . import isa as _isa
from . import language as nl
from .dtypes import to_dtype
from .errors import KernelError, ViewError, kernel_error_at, user_frame
from .hooks import hooks
from .registers import VirtualRegister
from .tensor import DynSlice, NkiTensor, region_of
from .tracing import assigned_name, current

__all__ = ["arange", "mgrid", "IndexExpr", "IndexedTensor", "BlockTensor", "uses_index_expr", "subscript",
           "apply_mask", "legacy_iota", "legacy_affine_select", "block_tensor"]

_PLACE_HINT = ("place the arange on a grid axis: nl.arange(n)[:, None] for the partition dim, "
               "nl.arange(n)[None, :] for a free dim (or use nl.mgrid), or index with a slice")
_MASK_LIMIT = ("a mask compares an affine expression of nl.arange / nl.mgrid indices and compile-time integers "
               "(loop indices, nl.program_id) with a compile-time number (<, <=, >, >=, ==), and combines such "
               "comparisons with &")


def _error(summary: str, limit: str = "", hint: str = "") -> KernelError:
    """A KernelError at the user's line that is calling into nikki."""
    return kernel_error_at(user_frame(2), summary, limit=limit, hint=hint)


def _is_int(x) -> bool:
    # numpy integer scalars register as numbers.Integral too.
    return isinstance(x, numbers.Integral)


def _describe(x) -> str:
    if isinstance(x, NkiTensor):
        return f"tensor '{x.name}' (a run-time value)"
    if isinstance(x, VirtualRegister):
        return f"register {x!r} (a run-time value)"
    if isinstance(x, numbers.Real):
        return f"the non-integer {x!r}"
    return f"{x!r} of type {type(x).__name__}"


def _control_flow_error() -> KernelError:
    return _error("Control-flow depending on `nl.arange` or `nl.mgrid` is not supported",
                  limit="index expressions are evaluated by the engines, not by Python",
                  hint="restrict instructions with mask=(i_p < n) (combine conditions with &), or select "
                       "values with nisa.affine_select")


# --- index expressions ------------------------------------------------------------------------

class IndexExpr:
    """An affine expression of index-grid positions: ``const + sum_k coefs[k] * j_k`` over a grid of
    ``rank`` axes, axis k holding ``counts[k]`` positions (axes without a count have extent 1).

    Built by ``nl.arange``/``nl.mgrid`` and integer arithmetic; used as subscripts, in ``mask=``
    comparisons and by legacy ``nisa.iota``/``nisa.affine_select``.
    """

    __slots__ = ("rank", "coefs", "counts", "const")
    __array_ufunc__ = None  # numpy scalars defer to our reflected operators

    def __init__(self, rank: int, coefs: dict, counts: dict, const: int):
        self.rank = rank
        # Extent-1 axes carry no position (it is always 0), so they are left out, with their
        # coefficients: like numpy, such an axis broadcasts one value.
        self.counts = {k: n for k, n in counts.items() if n != 1}
        self.coefs = {k: c for k, c in coefs.items() if c != 0 and k in self.counts}
        self.const = const

    @property
    def shape(self) -> tuple:
        """The grid shape the expression spans (numpy broadcasting shape)."""
        return tuple(self.counts.get(k, 1) for k in range(self.rank))

    def __repr__(self) -> str:
        terms = [f"{c}*j{k}" if c != 1 else f"j{k}" for k, c in sorted(self.coefs.items())]
        if self.const or not terms:
            terms.append(str(self.const))
        return f"IndexExpr({' + '.join(terms)}, shape={self.shape})"

    def _shifted(self, rank: int):
        """Coefficients and extents with axes right-aligned to a grid of `rank` axes (numpy broadcasting)."""
        s = rank - self.rank
        return {k + s: c for k, c in self.coefs.items()}, {k + s: n for k, n in self.counts.items()}

    # --- arithmetic (affine only; anything else becomes a _NonAffine that errors where it is used)
    def _combine(self, other, sign: int):
        other = _coerce(other)
        if not isinstance(other, IndexExpr):
            return other if isinstance(other, _NonAffine) else _NonAffine(f"adds {_describe(other)}")
        rank = max(self.rank, other.rank)
        ca, na = self._shifted(rank)
        cb, nb = other._shifted(rank)
        counts = _broadcast_counts(na, nb, self.shape, other.shape)
        coefs = {k: ca.get(k, 0) + sign * cb.get(k, 0) for k in set(ca) | set(cb)}
        return IndexExpr(rank, coefs, counts, self.const + sign * other.const)

    def __add__(self, other):
        return self._combine(other, 1)

    __radd__ = __add__

    def __sub__(self, other):
        return self._combine(other, -1)

    def __rsub__(self, other):
        return (-self)._combine(other, 1)

    def __neg__(self):
        return IndexExpr(self.rank, {k: -c for k, c in self.coefs.items()}, self.counts, -self.const)

    def __pos__(self):
        return self

    def _scaled(self, v: int) -> "IndexExpr":
        return IndexExpr(self.rank, {k: c * v for k, c in self.coefs.items()}, self.counts, self.const * v)

    def __mul__(self, other):
        if _is_int(other):
            return self._scaled(int(other))
        if isinstance(other, IndexExpr):
            if self.coefs and other.coefs:
                return _NonAffine("multiplies two index expressions")
            var, constant = (self, other) if self.coefs else (other, self)
            # A constant expression scales like an integer; adding its zero keeps its broadcast extents.
            return var._scaled(constant.const)._combine(constant._scaled(0), 1)
        if isinstance(other, _NonAffine):
            return other
        return _NonAffine(f"multiplies by {_describe(other)}")

    __rmul__ = __mul__

    def __truediv__(self, other):
        return _NonAffine("divides an index expression (index expressions are affine: +, - and * by integers)")

    def __floordiv__(self, other):
        return _NonAffine("uses // on an index expression (index expressions are affine: +, - and * by integers)")

    def __mod__(self, other):
        return _NonAffine("uses % on an index expression (index expressions are affine: +, - and * by integers)")

    def __pow__(self, other):
        return _NonAffine("uses ** on an index expression (index expressions are affine: +, - and * by integers)")

    __rtruediv__ = __truediv__
    __rfloordiv__ = __floordiv__
    __rmod__ = __mod__
    __rpow__ = __pow__

    # --- comparisons build predicates (masks, affine_select)
    def _compare(self, other, op: str):
        if isinstance(other, IndexExpr):
            diff = self - other
            return _Cmp(diff, op, Fraction(0)) if isinstance(diff, IndexExpr) else _BadPred(diff.reason)
        if _is_int(other):
            return _Cmp(self, op, Fraction(int(other)))
        if isinstance(other, numbers.Real) and math.isfinite(other):
            return _Cmp(self, op, Fraction(float(other)))
        if isinstance(other, _NonAffine):
            return _BadPred(other.reason)
        return _BadPred(f"compares an index expression with {_describe(other)}")

    def __lt__(self, other):
        return self._compare(other, "<")

    def __le__(self, other):
        return self._compare(other, "<=")

    def __gt__(self, other):
        return self._compare(other, ">")

    def __ge__(self, other):
        return self._compare(other, ">=")

    def __eq__(self, other):
        if other is None or isinstance(other, str):
            return NotImplemented
        return self._compare(other, "==")

    def __ne__(self, other):
        if other is None or isinstance(other, str):
            return NotImplemented
        return self._compare(other, "!=")

    __hash__ = object.__hash__

    def __bool__(self):
        raise _control_flow_error()

    # --- placement on grid axes: nl.arange(n)[:, None], nl.arange(n)[None, :]
    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        full = [i for i, k in enumerate(key) if isinstance(k, slice) and k == slice(None)]
        if any(not (k is None or (isinstance(k, slice) and k == slice(None))) for k in key) or len(full) > self.rank:
            raise _error(f"cannot index an index expression with {key!r}",
                         limit="index expressions are placed on grid axes with ':' and None only",
                         hint=_PLACE_HINT)
        # Like numpy, missing trailing axes are implicitly ':'.
        key = key + (slice(None),) * (self.rank - len(full))
        new_axis = [i for i, k in enumerate(key) if k is not None]
        return IndexExpr(len(key), {new_axis[k]: c for k, c in self.coefs.items()},
                         {new_axis[k]: n for k, n in self.counts.items()}, self.const)


def _coerce(x):
    if isinstance(x, (IndexExpr, _NonAffine)):
        return x
    if _is_int(x):
        return IndexExpr(0, {}, {}, int(x))
    return x


def _broadcast_counts(na: dict, nb: dict, shape_a, shape_b) -> dict:
    counts = dict(na)
    for k, n in nb.items():
        if counts.get(k, n) != n:
            raise _error(f"index expressions of shapes {shape_a} and {shape_b} do not broadcast together",
                         limit="grid axes combine like numpy broadcasting: equal extents, or extent 1",
                         hint="use aranges of the same length on the same grid axis")
        counts[k] = n
    return counts


class _NonAffine:
    """The result of a non-affine operation on index expressions; an error wherever it is used."""

    __slots__ = ("reason",)
    __array_ufunc__ = None

    def __init__(self, reason: str):
        self.reason = reason

    def __repr__(self) -> str:
        return f"<non-affine index expression: {self.reason}>"

    def _same(self, *args):
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _same
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _same
    __pow__ = __rpow__ = __neg__ = __pos__ = __getitem__ = _same

    def _cmp(self, other):
        return _BadPred(self.reason)

    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _cmp
    __hash__ = object.__hash__

    def __bool__(self):
        raise _control_flow_error()


def arange(*args) -> IndexExpr:
    """``nl.arange(stop)`` / ``nl.arange(start, stop[, step])``: the indices of a range as a 1-D index
    expression. Place it on a grid axis before indexing: ``nl.arange(128)[:, None]`` (partition axis),
    ``nl.arange(512)[None, :]`` (free axis)."""
    if not 1 <= len(args) <= 3 or not all(_is_int(a) for a in args):
        raise _error(f"nl.arange{tuple(args)!r}: arguments must be 1 to 3 compile-time integers",
                     hint="nl.arange(stop) or nl.arange(start, stop, step)")
    r = range(*(int(a) for a in args))
    if len(r) == 0:
        raise _error(f"nl.arange{tuple(args)!r} is empty", hint="give the range at least one index")
    return IndexExpr(1, {0: r.step}, {0: len(r)}, r.start)


class _Grid(tuple):
    """The expressions of ``nl.mgrid[...]``, one per axis, also named as Beta 1 named them:
    ``.p`` is axis 0 (the partition axis), ``.x``, ``.y``, ``.z`` are axes 1, 2, 3."""

    def _axis(self, axis: int, name: str) -> IndexExpr:
        if axis >= len(self):
            raise _error(f"nl.mgrid of {len(self)} axes has no .{name} (axis {axis})",
                         hint="name the axes p, x, y, z in order, or unpack the grid: i_p, i_f = nl.mgrid[...]")
        return self[axis]

    p = property(lambda self: self._axis(0, "p"))
    x = property(lambda self: self._axis(1, "x"))
    y = property(lambda self: self._axis(2, "y"))
    z = property(lambda self: self._axis(3, "z"))


class _MGrid:
    """``nl.mgrid[0:128, 0:512]``: one index expression per axis of a dense grid (numpy's mgrid)."""

    def __getitem__(self, key):
        single = not isinstance(key, tuple)
        key = (key,) if single else key
        exprs = []
        for axis, s in enumerate(key):
            if not isinstance(s, slice) or s.stop is None or not all(
                    v is None or _is_int(v) for v in (s.start, s.stop, s.step)):
                raise _error(f"nl.mgrid[{key!r}]: every axis is a slice start:stop[:step] of integers",
                             hint="nl.mgrid[0:128, 0:512]")
            r = range(int(s.start or 0), int(s.stop), int(1 if s.step is None else s.step))
            if len(r) == 0:
                raise _error(f"nl.mgrid axis {axis} ({s.start}:{s.stop}:{s.step}) is empty")
            exprs.append(IndexExpr(len(key), {axis: r.step}, {axis: len(r)}, r.start))
        return exprs[0] if single else _Grid(exprs)


mgrid = _MGrid()


# --- predicates -------------------------------------------------------------------------------

class _Predicate:
    """A compile-time predicate over index-grid positions (masks, affine_select)."""

    __slots__ = ()
    __array_ufunc__ = None

    def _terms(self) -> list:
        return [self]

    def __and__(self, other):
        if isinstance(other, _Predicate):
            return _And(self._terms() + other._terms())
        if isinstance(other, (bool, np.bool_)):
            return _And(self._terms() + [_Const(bool(other))])
        return _BadPred(f"combines a condition with {_describe(other)}")

    __rand__ = __and__

    def __or__(self, other):
        return _BadPred("combines conditions with | (masks are conjunctions; use &)")

    __ror__ = __or__

    def __invert__(self):
        return _BadPred("negates a condition with ~ (write the opposite comparison instead)")

    def __bool__(self):
        raise _control_flow_error()


class _Cmp(_Predicate):
    """``expr op rhs`` with rhs an exact rational number."""

    __slots__ = ("expr", "op", "rhs")

    def __init__(self, expr: IndexExpr, op: str, rhs: Fraction):
        self.expr, self.op, self.rhs = expr, op, rhs

    def __repr__(self) -> str:
        return f"({self.expr!r} {self.op} {self.rhs})"


class _And(_Predicate):
    __slots__ = ("terms",)

    def __init__(self, terms: list):
        self.terms = terms

    def _terms(self) -> list:
        return list(self.terms)


class _Const(_Predicate):
    __slots__ = ("value",)

    def __init__(self, value: bool):
        self.value = value


class _BadPred(_Predicate):
    """A predicate nikki cannot evaluate at compile time; an error where it is used."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


def _solve(a: int, b: int, op: str, rhs: Fraction):
    """Positions j (integers) with ``a*j + b op rhs``, as an inclusive range (None = unbounded)."""
    r = (rhs - b) / a
    lo = hi = None
    if op == "==":
        return (int(r), int(r)) if r.denominator == 1 else (1, 0)
    upper = (op in ("<", "<=")) == (a > 0)  # the condition bounds j from above
    strict = op in ("<", ">")
    if upper:
        hi = math.ceil(r) - 1 if strict else math.floor(r)
    else:
        lo = math.floor(r) + 1 if strict else math.ceil(r)
    return lo, hi


def _eval(value, op: str, rhs) -> bool:
    return {"<": value < rhs, "<=": value <= rhs, ">": value > rhs, ">=": value >= rhs, "==": value == rhs,
            "!=": value != rhs}[op]


def _mask_error(reason: str) -> KernelError:
    return kernel_error_at(user_frame(2), f"Unsupported expression in mask: {reason}", limit=_MASK_LIMIT,
                           hint="masks are compile-time predicates; for values known only at run time use "
                                "nisa.tensor_copy_predicated / nl.where, for triangular masks nisa.affine_select")


def _conjuncts(mask) -> list:
    """The comparisons a mask is the conjunction of (raising for anything that is not a mask)."""
    if isinstance(mask, (bool, np.bool_)):
        return [_Const(bool(mask))]
    if isinstance(mask, _BadPred):
        raise _mask_error(mask.reason)
    if isinstance(mask, _Predicate):
        terms = mask._terms()
        for t in terms:
            if isinstance(t, _BadPred):
                raise _mask_error(t.reason)
        return terms
    if isinstance(mask, IndexExpr):
        raise _mask_error(f"{mask!r} is an index expression, not a comparison (e.g. i_p < n)")
    if isinstance(mask, _NonAffine):
        raise _mask_error(mask.reason)
    raise _mask_error(f"mask is {_describe(mask)}, not a comparison of index expressions")


def _mask_rank(terms) -> int:
    return max([t.expr.rank for t in terms if isinstance(t, _Cmp)], default=0)


def _mask_ranges(terms, rank: int):
    """Per grid axis, the inclusive range of positions a mask keeps ({} = everything), or None when
    it keeps nothing. Axes are right-aligned to a grid of `rank` axes."""
    ranges: dict = {}
    for t in terms:
        if isinstance(t, _Const):
            if not t.value:
                return None
            continue
        e = t.expr
        if e.rank == 1:
            raise kernel_error_at(user_frame(2), "Indexing a NKI tensor with 1D arange is not supported "
                                  "(in a mask)", hint=_PLACE_HINT)
        coefs, counts = e._shifted(rank)
        if not coefs:  # no grid position involved: the comparison is a compile-time constant
            if not _eval(e.const, t.op, t.rhs):
                return None
            continue
        if len(coefs) > 1:
            raise _mask_error(f"the condition {e!r} {t.op} {t.rhs} involves several grid axes; a mask restricts "
                              "each axis to a range of indices")
        if t.op == "!=":
            raise _mask_error(f"the condition {e!r} != {t.rhs} keeps two ranges of indices")
        (axis, a), = coefs.items()
        lo, hi = _solve(a, e.const, t.op, t.rhs)
        n = counts.get(axis, 1)
        lo = 0 if lo is None else max(lo, 0)
        hi = n - 1 if hi is None else min(hi, n - 1)
        if axis in ranges:
            lo, hi = max(lo, ranges[axis][0]), min(hi, ranges[axis][1])
        if lo > hi:
            return None
        ranges[axis] = (lo, hi)
    return ranges


def _plain_dim(axis: int, grid_rank: int, ndim: int):
    """The dim of a plain tile that grid axis `axis` lands on: axis 0 on the partition dim 0, the
    other axes right-aligned on the last dims; None when the tile has no such dim."""
    if axis == 0:
        return 0
    d = ndim - grid_rank + axis
    return d if d >= 1 else None


def _plain_dim_ranges(tile: NkiTensor, ranges: dict, grid_rank: int):
    """Per dim of a plain tile, the inclusive range a mask keeps (None when it keeps nothing)."""
    out = {}
    shape = tile.shape
    for axis, (lo, hi) in ranges.items():
        d = _plain_dim(axis, grid_rank, len(shape))
        if d is None:
            raise kernel_error_at(user_frame(2), f"mask restricts grid axis {axis} of a {grid_rank}-D index grid, "
                                  f"which tensor '{tile.name}' of shape {tuple(shape)} does not have",
                                  hint="index the operand with index expressions of the same grid, or give it "
                                       "one dim per grid axis")
        if shape[d] == 1:
            continue  # an extent-1 dim broadcasts along the axis
        hi = min(hi, shape[d] - 1)
        if lo > hi:
            return None
        if (lo, hi) != (0, shape[d] - 1):
            out[d] = (lo, hi)
    return out


def _restrict(op, ranges: dict, grid_rank: int):
    """An instruction operand restricted to the positions a mask keeps (None when none are kept)."""
    if isinstance(op, IndexedTensor):
        return op._restricted(ranges, grid_rank)
    if isinstance(op, BlockTensor) or not isinstance(op, NkiTensor):
        return op
    dims = _plain_dim_ranges(op, ranges, grid_rank)
    if dims is None:
        return None
    for d, (lo, hi) in dims.items():
        op = op.slice(d, lo, hi + 1)
    return op


def apply_mask(mask, dst, *operands):
    """Applies a legacy ``mask=`` predicate to an instruction's operands.

    Returns ``(dst, *operands)`` restricted to the index-grid positions the mask keeps (index-expression
    views by their grid axes, plain tiles positionally), or None when the mask keeps nothing and the
    instruction is skipped. Views that are still out of bounds after the mask raise a KernelError.
    """
    ops = (dst, *operands)
    kept = _restrict_by_mask(mask, max([0] + [op.grid_rank for op in ops if isinstance(op, IndexedTensor)]), ops)
    return None if kept is None else tuple(kept[2])


def _restrict_by_mask(mask, grid_rank: int, tiles):
    """(ranges, rank, the tiles restricted to them) for a legacy mask over a grid of `grid_rank`
    axes at least, or None when the mask keeps nothing."""
    terms = _conjuncts(mask)
    rank = max(_mask_rank(terms), grid_rank)
    ranges = _mask_ranges(terms, rank)
    if ranges is None:
        return None
    out = []
    for t in tiles:
        r = _restrict(t, ranges, rank)
        if r is None:
            return None
        out.append(r)
    return ranges, rank, out


def apply_reduction_mask(mask, dst, data, axes: int, keepdims: bool):
    """A legacy ``mask=`` on a reduction: the mask ranges the input's grid; the result keeps the
    non-reduced axes (`axes` has bit d set for each reduced dim of `data`), so it is restricted
    along those only. Returns (dst, data), or None when the mask keeps nothing."""
    terms = _conjuncts(mask)
    rank = max([_mask_rank(terms), data.ndim] + ([data.grid_rank] if isinstance(data, IndexedTensor) else []))
    ranges = _mask_ranges(terms, rank)
    if ranges is None:
        return None
    data_r = _restrict(data, ranges, rank)
    if data_r is None:
        return None
    shift = rank - data.ndim  # grid axes are right-aligned to the data's dims
    kept, position = {}, 0
    for d in range(data.ndim):
        reduced = bool(axes & (1 << d))
        if not reduced and d + shift in ranges:
            kept[position] = ranges[d + shift]
        if keepdims or not reduced:
            position += 1
    dst_r = _restrict(dst, kept, max(position, dst.ndim)) if kept else dst
    return None if dst_r is None else (dst_r, data_r)


# --- subscripts -------------------------------------------------------------------------------

def uses_index_expr(key) -> bool:
    """True when a subscript key (a tuple) contains legacy index expressions or predicates."""
    return any(isinstance(k, (IndexExpr, _NonAffine, _Predicate)) for k in key)


def _oob_message(name: str, dim: int, lo: int, hi: int, size: int) -> str:
    return (f"Out-of-bound access for tensor `{name}` on dimension {dim}: index range [{lo}, {hi}] exceed "
            f"dimension size of {size}")


def subscript(tensor: NkiTensor, key: tuple) -> "IndexedTensor":
    """``tensor[key]`` where key holds index expressions (and integers for other dims).

    The result's dims are the grid axes of the expressions, axis 0 first. It is lazy: bounds are
    checked when an instruction uses it, after a ``mask=`` restricted the grid.
    """
    for k in key:
        if isinstance(k, _NonAffine):
            raise _error(f"Unsupported index expression: it {k.reason}",
                         limit="index expressions are affine: integer combinations of nl.arange / nl.mgrid "
                               "indices plus compile-time integers",
                         hint="use a*i + b with integers a > 0 and b")
        if isinstance(k, _Predicate):
            raise _error("indexing a tensor with a predicate (boolean mask indexing) is not supported",
                         hint="pass the predicate as mask= of the instruction instead")
        if isinstance(k, IndexExpr) and k.rank == 1:
            raise _error("Indexing a NKI tensor with 1D arange is not supported", hint=_PLACE_HINT)
    # Legacy dynamic indexing: one dim may be indexed by a value known only at run time (a register
    # or a 1x1 tensor, e.g. A[batch_idx, i_p, i_f]); the access is offset by it when it executes.
    runtime = [(d, k) for d, k in enumerate(key) if isinstance(k, (NkiTensor, VirtualRegister))]
    if len(runtime) > 1:
        raise _error("only one dim of an index-expression subscript may be a run-time index",
                     hint="combine the run-time offsets into one register")
    gathered = None  # dim indexed by a [P, 1] tile of row numbers: a per-partition gather
    for d, k in runtime:
        if isinstance(k, NkiTensor) and k.size != 1:
            if k.ndim != 2 or k.shape[1] != 1 or not k.buffer.is_on_chip or k.dtype.is_float:
                raise _error(f"dimension {d} of tensor '{tensor.name}' is indexed with a tensor of shape {k.shape}",
                             limit="a run-time index is a register, a 1x1 tensor, or a [P, 1] integer tile of "
                                   "indices (one per partition)",
                             hint="gather rows with t.ap(pattern, vector_offset=indices) in nisa.dma_copy")
            gathered = d
    rank_of_key = max([e.rank for e in key if isinstance(e, IndexExpr)], default=2)
    key = tuple(arange(k.shape[0])[(slice(None),) + (None,) * (max(rank_of_key, 2) - 1)] if d == gathered
                else 0 if isinstance(k, (NkiTensor, VirtualRegister)) else k for d, k in enumerate(key))
    for k in key:
        if not isinstance(k, (IndexExpr, slice, DynSlice)) and not _is_int(k) and k is not Ellipsis and k is not None:
            raise _error(f"unsupported subscript {k!r} next to index expressions",
                         hint="index each dim with an index expression or an integer")
    basic = [k for k in key if not isinstance(k, IndexExpr) and not _is_int(k)]
    if basic or len(key) < tensor.ndim:
        shown = ", ".join("..." if k is Ellipsis else "None" if k is None else ":" for k in basic)
        raise _error("Mixing basic tensor indexing and advanced tensor indexing is not supported.",
                     limit=(f"subscript mixes index expressions with {shown}" if basic else
                            f"subscript indexes {len(key)} of the {tensor.ndim} dims of tensor '{tensor.name}'"),
                     hint="index every dim with an index expression or an integer, e.g. "
                          "t[b, i_p, i_f] with i_p = nl.arange(128)[:, None], i_f = nl.arange(512)[None, :]")
    if len(key) > tensor.ndim:
        raise _error(f"too many indices ({len(key)}) for tensor '{tensor.name}' of rank {tensor.ndim}")
    if tensor.is_indirect():
        raise _error("index expressions on a view with run-time offsets are not supported",
                     hint="apply the index expressions to the base tensor")
    base = tensor._view
    sizes = base.shape
    exprs = [_coerce(k) for k in key]
    rank = max(e.rank for e in exprs)
    counts: dict = {}
    dims: list = []
    for d, e in enumerate(exprs):
        coefs, n = e._shifted(rank)
        counts = _broadcast_counts(counts, n, tuple(counts.get(k, 1) for k in range(rank)), e.shape)
        if not coefs:
            c = e.const + sizes[d] if isinstance(key[d], numbers.Integral) and e.const < 0 else e.const
            if not 0 <= c < sizes[d]:
                raise _error(_oob_message(tensor.name, d, c, c, sizes[d]),
                             limit=f"dim {d} of '{tensor.name}' has {sizes[d]} elements")
            dims.append(({}, c))
            continue
        dims.append((coefs, e.const))  # a coefficient may be negative: the view then steps backwards
    grid = tuple(counts.get(k, 1) for k in range(rank))
    used = set()
    for coefs, _ in dims:
        used |= set(coefs)
    for axis, n in enumerate(grid):
        if n > 1 and axis not in used:
            raise _error(f"grid axis {axis} (extent {n}) of the index expressions selects no dim of tensor "
                         f"`{tensor.name}` (its coefficients cancel out)",
                         hint="use each nl.arange in the subscript with a positive coefficient")
    frame = user_frame(2)
    where = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("", 0)
    return IndexedTensor(tensor, base, dims, grid, tuple((0, n - 1) for n in grid), where,
                         runtime[0] if runtime else None)


def overhanging_slices(tensor: NkiTensor, key: tuple, error: KernelError):
    """``tensor[a:b, c:d, ...]`` with slices that run past the tensor's end, kept lazy as the index
    expressions they stand for (each slice an nl.arange on a grid axis of its own), so a legacy
    ``mask=`` can trim them, as Beta 1 kernels do on their last tile. Used without such a mask, the
    view raises `error`, the subscript's own out-of-bound error. None when the subscript is not made
    of integers and at least two slices (then `error` is raised at once)."""
    subs: list = []
    for k in key:
        if k is Ellipsis:
            subs.extend([slice(None)] * (tensor.ndim - (len(key) - 1)))
        else:
            subs.append(k)
    subs += [slice(None)] * (tensor.ndim - len(subs))
    if len(subs) != tensor.ndim or not all(isinstance(k, slice) or _is_int(k) for k in subs):
        return None
    if tensor.buffer.is_on_chip and _is_int(subs[0]):  # an integer keeps the partition dim on chip
        subs[0] = slice(int(subs[0]), int(subs[0]) + 1)
    sliced = [d for d, k in enumerate(subs) if isinstance(k, slice)]
    if len(sliced) < 2:
        return None
    exprs = list(subs)
    for axis, d in enumerate(sliced):
        start, stop, step = subs[d].start, subs[d].stop, subs[d].step
        start = 0 if start is None else int(start)
        step = 1 if step is None else int(step)
        stop = tensor.shape[d] if stop is None else int(stop)
        if start < 0 or stop < 0 or step < 1:
            return None
        count = max(0, -(-(stop - start) // step))
        place = tuple(slice(None) if a == axis else None for a in range(len(sliced)))
        exprs[d] = arange(count)[place] * step + start
    lazy = subscript(tensor, tuple(exprs))
    view = _OverhangingSlice(lazy._base, lazy._base_view, lazy._dims, lazy._grid, lazy._ranges, lazy._where,
                             lazy._runtime)
    view._error = error
    return view


class IndexedTensor(NkiTensor):
    """A tensor subscripted with index expressions (``a[i_p + 128*k, i_f]``), kept lazy.

    Its shape is the index grid's. Instructions read ``_view``, which checks bounds: an over-sized
    view is legal only once a ``mask=`` restricted it (see :func:`apply_mask`).
    """

    __slots__ = ("_base", "_base_view", "_dims", "_grid", "_ranges", "_where", "_runtime", "_plain")

    def __init__(self, tensor, base_view, dims, grid, ranges, where, runtime=None):
        self._ctx = tensor._ctx
        self._base = tensor
        self._base_view = base_view
        self._dims = dims
        self._grid = grid
        self._ranges = ranges
        self._where = where
        self._runtime = runtime  # (dim, register or 1x1 tensor) of a run-time index, or None
        self._plain = NkiTensor(self._ctx, self._build())

    @property
    def grid_rank(self) -> int:
        """Number of axes of the index grid."""
        return len(self._grid)

    def _build(self):
        strides = self._base_view.strides
        offset = self._base_view.offset
        axis_stride = [0] * len(self._grid)
        for d, (coefs, const) in enumerate(self._dims):
            offset += const * strides[d]
            for axis, a in coefs.items():
                axis_stride[axis] += a * strides[d]
        pairs = []
        for axis, (lo, hi) in enumerate(self._ranges):
            offset += axis_stride[axis] * lo
            pairs.append((axis_stride[axis], hi - lo + 1))
        try:
            view = self._base_view.with_pattern(pairs, offset, self._base_view.dtype)
        except ViewError as err:  # e.g. an index grid of more axes than a view has dims
            raise kernel_error_at(user_frame(), f"index expression: {err.what}", limit=err.limit,
                                  hint=err.hint) from None
        if self._runtime is None:
            return view
        d, index = self._runtime
        if isinstance(index, VirtualRegister):
            return view.with_indirection(None, index._reg, strides[d], None, 0, 0)
        if index.size != 1:  # per-partition rows: grid axis 0 reads row index[p] of dim d
            lo, hi = self._ranges[0]
            return view.with_indirection(None, None, 0, index[lo:hi + 1, :]._view, 0, strides[d])
        return view.with_indirection(index._view, None, strides[d], None, 0, 0)

    def _out_of_bounds(self):
        """(dim, first, last, size) of the first tensor dim the view leaves, or None."""
        sizes = self._base_view.shape
        for d, (coefs, const) in enumerate(self._dims):
            if self._runtime is not None and self._runtime[0] == d and getattr(self._runtime[1], "size", 1) != 1:
                continue  # gathered rows are checked when the instruction runs
            ends = [(a * self._ranges[axis][0], a * self._ranges[axis][1]) for axis, a in coefs.items()]
            lo = const + sum(min(e) for e in ends)
            hi = const + sum(max(e) for e in ends)
            if lo < 0 or hi >= sizes[d]:
                return d, lo, hi, sizes[d]
        return None

    def _checked(self):
        bad = self._out_of_bounds()
        if bad is None:
            return self._plain._view
        d, lo, hi, size = bad
        frame = user_frame(1)
        summary = _oob_message(self._base.name, d, lo, hi, size)
        if frame is not None and (frame.f_code.co_filename, frame.f_lineno) != self._where and self._where[1]:
            summary += f" (tensor indexed at {self._where[0]}:{self._where[1]})"
        raise kernel_error_at(frame, summary, limit=f"dim {d} of '{self._base.name}' has {size} elements",
                              hint="restrict the instruction with mask=, e.g. mask=(i_p + 128*k < n), or shrink "
                                   "the index range")

    # Instructions (and view methods) read _view: it is only handed out in bounds.
    _view = property(_checked)

    def _restricted(self, ranges: dict, grid_rank: int):
        shift = grid_rank - self.grid_rank
        new = list(self._ranges)
        for axis, (lo, hi) in ranges.items():
            k = axis - shift
            if not 0 <= k < self.grid_rank or self._grid[k] == 1:
                continue  # the operand broadcasts along this axis
            lo, hi = max(lo, new[k][0]), min(hi, new[k][1])
            if lo > hi:
                return None
            new[k] = (lo, hi)
        view = IndexedTensor(self._base, self._base_view, self._dims, self._grid, tuple(new), self._where,
                             self._runtime)
        return NkiTensor(self._ctx, view._checked())

    # Metadata comes from the unchecked view, so shapes are known before a mask is applied.
    shape = property(lambda self: self._plain.shape)
    dtype = property(lambda self: self._plain.dtype)
    buffer = property(lambda self: self._base.buffer)
    ndim = property(lambda self: self._plain.ndim)
    size = property(lambda self: self._plain.size)
    offset = property(lambda self: self._plain.offset)
    strides = property(lambda self: self._plain.strides)
    name = property(lambda self: self._base.name)

    def get_pattern(self) -> list:
        return self._plain.get_pattern()

    def is_contiguous(self) -> bool:
        return self._plain.is_contiguous()

    def is_indirect(self) -> bool:
        return self._runtime is not None

    def __repr__(self) -> str:
        return f"IndexedTensor('{self.name}', shape={self.shape}, dtype={self.dtype.name}, buffer={self.buffer.name})"


# --- legacy iota / affine_select ----------------------------------------------------------------

def _as_expr(x, what: str) -> IndexExpr:
    if isinstance(x, _NonAffine):
        raise _error(f"{what}: unsupported expression: it {x.reason}",
                     hint="use an affine expression of nl.arange indices, e.g. 2*i_p + i_f + 1")
    if not isinstance(x, IndexExpr):
        raise _error(f"{what}: expected an nl.arange index expression, got {_describe(x)}",
                     hint="e.g. nl.arange(512)[None, :] or i_p * 3 + i_f")
    if x.rank < 2:
        raise _error("Indexing a NKI tensor with 1D arange is not supported" if x.rank == 1 else
                     f"{what}: the expression {x!r} spans no index grid", hint=_PLACE_HINT)
    return x


def _affine_fields(e: IndexExpr, shape: tuple, what: str):
    """(channel_multiplier, [(step, num) per free dim], offset) of expression `e` laid over a tile of
    `shape` (grid axis 0 on the partition dim, the others right-aligned on the free dims)."""
    coefs, counts = e._shifted(e.rank)
    per_dim = [0] * len(shape)
    for axis in range(e.rank):
        d = _plain_dim(axis, e.rank, len(shape))
        n = counts.get(axis, 1)
        if n == 1:
            continue  # an extent-1 axis has no coefficient and broadcasts
        if d is None or shape[d] != n:
            raise _error(f"{what}: the index grid {e.shape} does not match the tile shape {tuple(shape)}",
                         hint="use aranges whose lengths equal the tile's dims")
        per_dim[d] = coefs.get(axis, 0)
    return per_dim[0], per_dim[1:], e.const


def _mask_kept(mask, grid_rank: int, tiles: list):
    """The tiles restricted by a legacy mask and the kept index range of each plain dim of the
    first, or None when the mask keeps nothing."""
    kept = _restrict_by_mask(mask, grid_rank, tiles)
    if kept is None:
        return None
    ranges, rank, out = kept
    dims = _plain_dim_ranges(tiles[0], ranges, rank)
    return None if dims is None else (out, dims)


def _masked_fields(mask, tile_shape, grid_rank: int, per_dim: list, offset: int, tiles: list):
    """Applies a legacy mask to the output of iota/affine_select: the restricted tiles, the pattern
    [(step, num)] over the kept free positions and the offset moved to the first kept position."""
    lo = [0] * len(tile_shape)
    hi = [n - 1 for n in tile_shape]
    if mask is not None:
        kept = _mask_kept(mask, grid_rank, tiles)
        _isa._note_masked_write(tiles[0], mask, skipped=kept is None)
        if kept is None:
            return None
        out, dims = kept
        for d, (a, b) in dims.items():
            lo[d], hi[d] = a, b
        tiles = out
    offset += sum(c * l for c, l in zip(per_dim, lo))
    pattern = [(per_dim[d], hi[d] - lo[d] + 1) for d in range(1, len(tile_shape))] or [(0, 1)]
    return tiles, pattern, offset


def legacy_iota(expr=None, dtype=None, *, mask=None, name=None, **kwargs):
    """Legacy ``tile = nisa.iota(expr, dtype, mask=...)``: a new SBUF tile of the expression's grid
    shape holding the expression's value at every position (via nisa.iota's pattern, offset and
    channel_multiplier)."""
    if kwargs:
        raise _error(f"nisa.iota() got unexpected keyword argument(s) {', '.join(sorted(kwargs))}")
    e = _as_expr(expr, "nisa.iota")
    if dtype is None:
        raise _error("nisa.iota(expr, dtype): dtype is required", hint="e.g. nisa.iota(i_p + i_f, dtype=nl.int32)")
    shape = e.shape
    frame = user_frame(1)
    out = nl.ndarray(shape, dtype, buffer=nl.sbuf, name=(assigned_name(frame) if frame else "") or "iota")
    cm, free, offset = _affine_fields(e, shape, "nisa.iota")
    got = _masked_fields(mask, shape, e.rank, [cm] + free, offset, [out])
    if got is not None:
        (dst,), pattern, offset = got
        _isa._iota(dst, pattern, offset, cm, name=name)
    return out


_ALU_NAMES = {"<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal", "==": "equal",
              "!=": "not_equal"}


def legacy_affine_select(pred=None, on_true_tile=None, on_false_value=None, *, mask=None, dtype=None, name=None,
                         **kwargs):
    """Legacy ``tile = nisa.affine_select(pred, on_true_tile, on_false_value, mask=..., dtype=...)``:
    a new SBUF tile holding on_true_tile where the affine comparison `pred` (e.g. ``i_q >= i_k``) holds
    and on_false_value elsewhere (via nisa.affine_select on lhs - rhs compared with 0)."""
    if kwargs:
        raise _error(f"nisa.affine_select() got unexpected keyword argument(s) {', '.join(sorted(kwargs))}")
    if isinstance(pred, _BadPred):
        raise _error(f"nisa.affine_select: unsupported predicate: it {pred.reason}",
                     limit="the predicate is one comparison of affine nl.arange expressions",
                     hint="e.g. pred=(i_q >= i_k)")
    if isinstance(pred, (_And, _Const)):
        raise _error("nisa.affine_select: the predicate must be a single comparison",
                     limit="affine_select compares one affine expression with 0",
                     hint="apply affine_select once per condition")
    if not isinstance(pred, _Cmp):
        raise _error(f"nisa.affine_select: pred must be a comparison of index expressions, got {_describe(pred)}",
                     hint="e.g. pred=(i_q >= i_k) with i_q = nl.arange(128)[:, None], i_k = nl.arange(128)[None, :]")
    tile = _isa._check_tensor(on_true_tile, "on_true_tile")
    if on_false_value is None or not isinstance(on_false_value, (numbers.Real,)) and not hasattr(
            on_false_value, "__float__"):
        raise _error(f"nisa.affine_select: on_false_value must be a number, got {_describe(on_false_value)}")
    e = _as_expr(pred.expr, "nisa.affine_select")
    op = pred.op
    rhs: Fraction | int = pred.rhs
    if rhs.denominator != 1:
        # The engines compare integers: fold a fractional bound into an equivalent integer one.
        if op in ("==", "!="):
            raise _error(f"nisa.affine_select: {e!r} {op} {rhs} compares integer indices with a fraction")
        op, rhs = {"<": ("<=", math.floor(rhs)), "<=": ("<=", math.floor(rhs)), ">": (">", math.floor(rhs)),
                   ">=": (">=", math.ceil(rhs))}[op]
    value = e - int(rhs)
    shape = tile.shape
    # The GpSimd engine cannot read PSUM: Beta 1 kernels select straight from a matmul's result.
    tile = _isa._staged_from_psum(tile)
    frame = user_frame(1)
    out = nl.ndarray(shape, to_dtype(dtype) if dtype is not None else tile.dtype, buffer=nl.sbuf,
                     name=(assigned_name(frame) if frame else "") or "select")
    cm, free, offset = _affine_fields(value, shape, "nisa.affine_select")
    got = _masked_fields(mask, shape, value.rank, [cm] + free, offset, [out, tile])
    if got is not None:
        (dst, on_true), pattern, offset = got
        _isa._affine_select(dst, pattern, cm, on_true, float(on_false_value),
                            cmp_op=getattr(_core.AluOp, _ALU_NAMES[op]), offset=offset, name=name)
    return out


# --- block tensors (nl.par_dim) -----------------------------------------------------------------

class BlockTensor(NkiTensor):
    """A legacy tensor with leading block dims: ``nl.ndarray((B0, B1, nl.par_dim(P), F...))``.

    The storage is laid out partition first, (P, B0, B1, F...), so every block is an ordinary
    [P, F...] tile; ``t[b0, b1]`` (or ``t[b0, b1, i_p, i_f]``) selects one. ``shape`` reports the
    declared (B0, B1, P, F...) order; used whole as an operand (e.g. nl.zeros' memset) the tensor is
    its storage, (P, B0 * B1 * F...) in partition-first order.
    """

    __slots__ = ("_nblock", "_blocks")

    def __init__(self, ctx, view, nblock: int, blocks=None):
        super().__init__(ctx, view)
        self._nblock = nblock
        # Declared block counts; a direct allocation with fewer physical tiles stores only those,
        # and block b of such a dim is tile b % tiles (nki.compiler's modular allocation).
        self._blocks = tuple(blocks) if blocks is not None else tuple(view.shape[1:nblock + 1])

    @property
    def shape(self) -> tuple:
        s = self._view.shape
        nb = self._nblock
        return self._blocks + (s[0],) + tuple(s[nb + 1:])

    @property
    def ndim(self) -> int:
        return self._view.ndim

    def __repr__(self) -> str:
        return f"BlockTensor('{self.name}', shape={self.shape}, dtype={self.dtype.name}, buffer={self.buffer.name})"

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis for k in key):
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            fill = self.ndim - (len(key) - 1)
            key = key[:i] + (slice(None),) * max(fill, 0) + key[i + 1:]
        nb = self._nblock
        shape = self.shape
        tiles = self._view.shape[1:nb + 1]
        view = NkiTensor(self._ctx, self._view)
        pos, left = 1, nb  # position of the next block dim in the partition-first view
        kept = []  # declared counts of the block dims left
        for d, k in enumerate(key[:nb]):
            if _is_int(k):
                i = int(k)
                i = i + shape[d] if i < 0 else i
                if not 0 <= i < shape[d]:
                    raise _error(_oob_message(self.name, d, int(k), int(k), shape[d]),
                                 limit=f"block dim {d} of '{self.name}' has {shape[d]} blocks")
                view = view.select(pos, i % tiles[d])
                left -= 1
            elif isinstance(k, (slice, DynSlice)):
                s = k.as_slice() if isinstance(k, DynSlice) else k
                n = shape[d]
                start = 0 if s.start is None else int(s.start) + (n if s.start < 0 else 0)
                stop = n if s.stop is None else int(s.stop) + (n if s.stop < 0 else 0)
                step = 1 if s.step is None else int(s.step)
                if step < 1:
                    raise _error(f"block dim {d} of tensor '{self.name}' is sliced with step {step}",
                                 limit="block dims are sliced with a positive step")
                if not 0 <= start < stop <= n:  # NKI rejects out-of-bound slices instead of clipping them
                    raise _error(_oob_message(self.name, d, start, stop - 1, n),
                                 limit=f"block dim {d} of '{self.name}' has {n} blocks")
                if stop > tiles[d]:
                    raise _error(f"block dim {d} of tensor '{self.name}' is sliced over blocks {start}..{stop - 1}, "
                                 f"but its allocation has {tiles[d]} tiles, so those blocks share memory",
                                 limit="a slice of blocks stays within the allocated tiles",
                                 hint="index the blocks one at a time")
                view = view.slice(pos, start, stop, step)
                kept.append(len(range(start, stop, step)))
                pos += 1
            else:
                raise _error(f"block dim {d} of tensor '{self.name}' is indexed with {_describe(k)}",
                             limit="block dims are indexed with integers (loop indices) or slices",
                             hint="select the block first: t[b0, b1][i_p, i_f]")
        rest = key[nb:]
        if left == 0:
            return view[rest] if rest else view
        if rest:
            raise _error(f"tensor '{self.name}': index every block dim with an integer before indexing the "
                         "partition and free dims", hint="t[b0, b1, i_p, i_f]")
        return BlockTensor(self._ctx, view._view, left, tuple(kept) + self._blocks[len(key[:nb]):])


def block_tensor(shape, dtype, buffer, name):
    """Legacy ``nl.ndarray((B..., nl.par_dim(P), F...), dtype, buffer)``: a :class:`BlockTensor`
    stored partition first."""
    shape = tuple(shape)
    nb = next(i for i, s in enumerate(shape) if isinstance(s, nl.par_dim))
    region = region_of(buffer)
    if not region.is_on_chip:  # HBM has no partition dim: nl.par_dim is only a number there (as in Beta 1)
        return nl.ndarray(tuple(int(s) for s in shape), dtype, buffer=region, name=name)
    if not name:
        frame = user_frame(1)
        name = (assigned_name(frame) if frame else "") or "t"
    blocks = tuple(int(s) for s in shape[:nb])
    # A direct allocation (nki.compiler mod_alloc) with fewer tiles than blocks stores only its tiles.
    tiles = tuple(getattr(buffer, "tiles", ()))
    stored = tuple(min(b, t) if t > 0 else b for b, t in zip(blocks, tiles + (0,) * (nb - len(tiles))))
    storage_shape = (int(shape[nb]),) + stored + tuple(int(s) for s in shape[nb + 1:])
    shared = _same_placement(buffer, storage_shape, dtype)
    if shared is not None:
        shared._ctx.shared_placements.add(shared._view.storage)
        shared._ctx.started_sums[shared._view.storage] = []  # a new allocation: no sum has started in it
        return BlockTensor(shared._ctx, shared._view, nb, blocks)
    t = nl.ndarray(storage_shape, dtype, buffer=region, name=name)
    placement = getattr(buffer, "placement", None)
    if placement is not None and placement[0] == "mod_alloc":
        t._ctx.placed.setdefault((region.name, placement, tiles), t)
    return BlockTensor(t._ctx, t._view, nb, blocks)


def _same_placement(buffer, storage_shape, dtype):
    """The tensor an earlier direct allocation placed where `buffer` places this one, viewed with
    this one's dtype and shape, when both cover the same bytes: kernels overlay PSUM tensors they
    use at different times this way (two mod_allocs from bank 0), and on the device they are one
    memory. None when nothing was placed there or the sizes differ."""
    placement = getattr(buffer, "placement", None)
    if placement is None or placement[0] != "mod_alloc":
        return None
    ctx = current("nl.ndarray")
    first = ctx.placed.get((buffer.region.name, placement, tuple(buffer.tiles)))
    if first is None:
        return None
    itemsize = to_dtype(dtype).itemsize
    row_bytes = math.prod(storage_shape[1:]) * itemsize
    first_shape = tuple(first.shape)
    if first_shape[0] != storage_shape[0] or math.prod(first_shape[1:]) * first.itemsize != row_bytes:
        return None
    flat = first.reshape(first_shape[0], math.prod(first_shape[1:]))
    if first.dtype != to_dtype(dtype):
        flat = flat.view(dtype)
    return flat.reshape(storage_shape)


class _OverhangingSlice(IndexedTensor):
    """An out-of-bound slice kept for a mask (:func:`overhanging_slices`); unmasked, it raises the
    slice's own error."""

    __slots__ = ("_error",)
    _error: KernelError

    def _checked(self):
        if self._out_of_bounds() is None:
            return self._plain._view
        raise self._error

    _view = property(_checked)


# The legacy layer plugs into the core: NkiTensor subscripts, nl.ndarray's block tensors, nl.arange /
# nl.mgrid and the mask= of nki.isa instructions reach this module through these hooks.
hooks.uses_index_expr = uses_index_expr
hooks.index_subscript = subscript
hooks.overhanging_slices = overhanging_slices
hooks.apply_mask = apply_mask
hooks.apply_reduction_mask = apply_reduction_mask
hooks.legacy_iota = legacy_iota
hooks.legacy_affine_select = legacy_affine_select
hooks.block_tensor = block_tensor
hooks.arange = arange
hooks.mgrid = mgrid
