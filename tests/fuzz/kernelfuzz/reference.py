"""An independent numpy model of nikki's numerics, written from docs/numerics.md.

The generator keeps, for every tile of a generated kernel, the values the kernel should hold there
(``Val``): a float64 array of the stored values plus an elementwise bound on how far nikki may be
from them. Operations whose result is defined bit for bit and cheap to recompute (copies, views,
conversions, fp32 add / subtract / multiply / maximum / minimum, comparisons, selections, iota,
exact integer sums) keep the bound at zero, so the comparison is exact. Operations nikki defines
only up to rounding (transcendental activation functions, matmul and reduction sums in a different
order, statistics) give a bound justified by the dtype: ulps of fp32 for the computation plus an
ulp of the destination dtype for the final rounding. An element derived from an inexact one through
an operation whose error does not propagate simply (a comparison, a conversion to an integer, a
transcendental function) is not modelled: its bound is infinite, and only the executors are
compared there.

Nothing here calls nikki: dtype layouts come from ml_dtypes, the rest from the documentation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import scipy.special

FLOAT_DTYPES = ("float32", "bfloat16", "float16", "tfloat32", "float8_e4m3", "float8_e4m3fn", "float8_e5m2")

_NUMPY = {
    "float32": np.dtype(np.float32), "tfloat32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16), "float8_e4m3": np.dtype(ml_dtypes.float8_e4m3),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn), "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "int8": np.dtype(np.int8), "int16": np.dtype(np.int16), "int32": np.dtype(np.int32),
    "uint8": np.dtype(np.uint8), "uint16": np.dtype(np.uint16), "uint32": np.dtype(np.uint32),
    "bool_": np.dtype(np.bool_),
}

# Mantissa bits (without the implicit one) of each float format: the size of one ulp.
_MANTISSA = {"float32": 23, "tfloat32": 10, "bfloat16": 7, "float16": 10, "float8_e4m3": 3,
             "float8_e4m3fn": 3, "float8_e5m2": 2}
# Smallest normal exponent of each float format (ulps do not shrink below it).
_MIN_EXP = {"float32": -126, "tfloat32": -126, "bfloat16": -126, "float16": -14, "float8_e4m3": -6,
            "float8_e4m3fn": -6, "float8_e5m2": -14}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype holding a nikki dtype's elements bit for bit."""
    return _NUMPY[name]


def is_float(name: str) -> bool:
    return name in FLOAT_DTYPES


def int_range(name: str) -> tuple[int, int]:
    """The integer range of an integer dtype (bool_: 0..1)."""
    if name == "bool_":
        return 0, 1
    info = np.iinfo(_NUMPY[name])
    return int(info.min), int(info.max)


def largest_finite(name: str) -> float:
    if name == "tfloat32":  # fp32's exponent range, 10 mantissa bits
        return math.ldexp(2 - 2.0 ** -_MANTISSA[name], 127)
    return float(ml_dtypes.finfo(_NUMPY[name]).max) if name != "float32" else float(np.finfo(np.float32).max)


def ulp(values: np.ndarray, name: str) -> np.ndarray:
    """One ulp of float dtype `name` at each |value| (the subnormal spacing below the normal range)."""
    mag = np.abs(np.asarray(values, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        exp = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    exp = np.maximum(np.where(np.isfinite(exp), exp, 0.0), _MIN_EXP[name])
    return np.ldexp(1.0, (exp - _MANTISSA[name]).astype(np.int64))


# --- conversions (numerics.md "Conversions") --------------------------------------------------

def _tf32(x32: np.ndarray) -> np.ndarray:
    """fp32 -> tf32 (round to nearest even on the low 13 mantissa bits), kept in fp32."""
    bits = np.ascontiguousarray(x32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(x32)
    lsb = (bits >> 13) & 1
    rounded = ((bits + 0xFFF + lsb) & ~np.uint64(0x1FFF)) & 0xFFFFFFFF
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(nan, np.float32(np.nan), out)


def store(x32, name: str) -> np.ndarray:
    """The value an engine's fp32 result `x32` stores in dtype `name`, as float64."""
    x32 = np.asarray(x32, dtype=np.float32)
    if name == "float32":
        return x32.astype(np.float64)
    if name == "tfloat32":
        return _tf32(x32).astype(np.float64)
    if is_float(name):
        with np.errstate(over="ignore", invalid="ignore"):
            return x32.astype(_NUMPY[name]).astype(np.float64)
    if name == "bool_":
        return (x32 != 0).astype(np.float64)  # NaN is nonzero
    lo, hi = int_range(name)
    with np.errstate(invalid="ignore"):
        t = np.trunc(x32.astype(np.float64))
    t = np.where(np.isnan(t), 0.0, t)
    return np.clip(t, lo, hi) + 0.0  # an integer has no -0: trunc(-0.5) stores 0


def store_integer(values, name: str) -> np.ndarray:
    """A saturating write of integer results (iota, memset, nc_find_index8): clamped for integer
    dtypes, converted through fp32 for float dtypes."""
    v = np.asarray(values, dtype=np.float64)
    if is_float(name):
        return store(v.astype(np.float32), name)
    lo, hi = int_range(name)
    return np.clip(v, lo, hi) + 0.0


def read32(v: np.ndarray) -> np.ndarray:
    """Stored values as the fp32 an engine reads (exact for every float dtype, host rounding above
    2^24 for integers)."""
    return np.asarray(v, dtype=np.float64).astype(np.float32)


def from_array(a: np.ndarray, name: str) -> np.ndarray:
    """The stored values of a host array of dtype `name`, as float64."""
    if name == "bool_":
        return a.astype(np.float64)
    return np.asarray(a).astype(np.float64)


def to_array(v: np.ndarray, name: str) -> np.ndarray:
    """Host array of dtype `name` holding stored values `v` (exact: v came from store())."""
    if name == "bool_":
        return v != 0
    if is_float(name):
        return v.astype(np.float32).astype(_NUMPY[name])
    return v.astype(_NUMPY[name])


# --- ALU operators (numerics.md "ALU operators") ---------------------------------------------

ARITH_OPS = ("add", "subtract", "multiply", "maximum", "minimum")
COMPARE_OPS = ("equal", "not_equal", "greater", "greater_equal", "less", "less_equal")
LOGICAL_OPS = ("logical_and", "logical_or", "logical_xor")
BITVEC_OPS = ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift")
UNARY_OPS = ("abs", "square", "relu", "rsqrt", "reciprocal", "negative")


def alu(op: str, a, b) -> np.ndarray:
    """fp32 result of ALU operator `op` (NaN results canonical; NaN compares as numpy does)."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    with np.errstate(all="ignore"):
        if op == "add":
            r = a + b
        elif op == "subtract":
            r = a - b
        elif op == "multiply":
            r = a * b
        elif op == "maximum":
            r = np.where(np.isnan(a) | np.isnan(b), np.float32(np.nan), np.where(a > b, a, b))
        elif op == "minimum":
            r = np.where(np.isnan(a) | np.isnan(b), np.float32(np.nan), np.where(a < b, a, b))
        elif op == "equal":
            r = (a == b).astype(np.float32)
        elif op == "not_equal":
            r = (a != b).astype(np.float32)
        elif op == "greater":
            r = (a > b).astype(np.float32)
        elif op == "greater_equal":
            r = (a >= b).astype(np.float32)
        elif op == "less":
            r = (a < b).astype(np.float32)
        elif op == "less_equal":
            r = (a <= b).astype(np.float32)
        elif op == "logical_and":
            r = ((a != 0) & (b != 0)).astype(np.float32)
        elif op == "logical_or":
            r = ((a != 0) | (b != 0)).astype(np.float32)
        elif op == "logical_xor":
            r = ((a != 0) ^ (b != 0)).astype(np.float32)
        elif op == "abs":
            r = np.abs(a)
        elif op == "negative":
            r = -a
        elif op == "square":
            r = a * a
        elif op == "relu":
            r = np.where(np.isnan(a), a, np.where(a > 0, a, np.float32(0)))
        elif op == "reciprocal":
            r = np.float32(1) / a
        elif op == "rsqrt":
            r = (1.0 / np.sqrt(a.astype(np.float64))).astype(np.float32)
        else:
            raise ValueError(f"no reference for ALU operator {op}")
    return np.asarray(r, dtype=np.float32)


def bitvec(op: str, a: np.ndarray, b: np.ndarray, name: str) -> np.ndarray:
    """Bitvec operator on integer stored values of dtype `name` (same dtype both sides), written
    back wrapping to the dtype's width."""
    bits = 8 * numpy_dtype(name).itemsize
    mask = (1 << bits) - 1
    x = np.asarray(a, dtype=np.float64).astype(np.int64) & mask
    y = np.asarray(b, dtype=np.float64).astype(np.int64)
    if op == "bitwise_and":
        r = x & (y & mask)
    elif op == "bitwise_or":
        r = x | (y & mask)
    elif op == "bitwise_xor":
        r = x ^ (y & mask)
    elif op == "left_shift":
        r = np.where((y < 0) | (y >= bits), 0, x << np.clip(y, 0, bits - 1)) & mask
    elif op == "right_shift":
        r = np.where((y < 0) | (y >= bits), 0, x >> np.clip(y, 0, bits - 1))
    else:
        raise ValueError(op)
    r = r & mask
    lo, _ = int_range(name)
    if lo < 0:
        r = np.where(r >= (1 << (bits - 1)), r - (1 << bits), r)
    return r.astype(np.float64)


# --- activation functions (numerics.md "Activation functions"), in float64 ------------------

def _sigmoid(x):
    return scipy.special.expit(x)


ACTIVATIONS = {
    "copy": lambda x: x,
    "square": lambda x: x * x,
    "sigmoid": _sigmoid,
    "relu": lambda x: np.where(np.isnan(x) | (x > 0), x, 0.0),  # NaN stays NaN
    # 1 + erf(z) = erfc(-z) and 1 + tanh(u) = 2 sigmoid(2u): the float64 reference must not cancel
    # where nikki (rightly) does not
    "gelu": lambda x: 0.5 * x * scipy.special.erfc(-x / math.sqrt(2)),
    "gelu_dx": lambda x: 0.5 * scipy.special.erfc(-x / math.sqrt(2)) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi),
    "gelu_apprx_tanh": lambda x: x * _sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)),
    "gelu_apprx_sigmoid": lambda x: x * _sigmoid(1.702 * x),
    "gelu_apprx_sigmoid_dx": lambda x: _sigmoid(1.702 * x) * (1 + 1.702 * x * _sigmoid(-1.702 * x)),
    "silu": lambda x: x * _sigmoid(x),
    "silu_dx": lambda x: _sigmoid(x) * (1 + x * _sigmoid(-x)),
    "tanh": np.tanh,
    "softplus": lambda x: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))),
    "mish": lambda x: x * np.tanh(np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))),
    "erf": scipy.special.erf,
    "erf_dx": lambda x: 2 / math.sqrt(math.pi) * np.exp(-x * x),
    "exp": np.exp,
    "log": np.log,
    "sin": np.sin,
    "arctan": np.arctan,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "reciprocal": lambda x: 1 / x,
    "sign": np.sign,
    "abs": np.abs,
}
# Functions computed exactly in fp32 (a copy, or one operation on the fma'd input).
EXACT_ACTIVATIONS = ("copy", "relu", "sign", "abs")


def fma32(x32: np.ndarray, scale, bias) -> tuple[np.ndarray, np.ndarray]:
    """(fp32 ``fma(x, scale, bias)``, whether each element is certainly the correctly rounded one).

    The product of two fp32 values is exact in float64; the sum is exact when its rounding error
    (TwoSum) is zero, and then one rounding to fp32 is the fma's single rounding."""
    with np.errstate(all="ignore"):
        p = x32.astype(np.float64) * np.asarray(scale, dtype=np.float64)
        b = np.broadcast_to(np.asarray(bias, dtype=np.float64), p.shape)
        s = p + b
        bb = s - p
        two_sum_err = (p - (s - bb)) + (b - bb)
        exact = (two_sum_err == 0) | ~np.isfinite(s)
    return s.astype(np.float32), exact


def activation(func: str, x32: np.ndarray, scale, bias) -> tuple[np.ndarray, np.ndarray]:
    """(fp32 value, error bound) of ``func(fma(x, scale, bias))``: nikki's functions are faithful
    (under 1 ulp), so two fp32 ulps of the result, plus the slope times one ulp of the argument
    where the reference's fma is not certainly correctly rounded."""
    arg32, arg_exact = fma32(x32, scale, bias)
    with np.errstate(all="ignore"):
        a64 = arg32.astype(np.float64)
        y64 = ACTIVATIONS[func](a64)
        y = y64.astype(np.float32)
        slope = np.abs(ACTIVATIONS[func](a64 + ulp(arg32, "float32")) - y64)
        slope = np.where(np.isfinite(slope), slope, np.inf)
        arg_err = np.where(arg_exact, 0.0, slope)
        if func in EXACT_ACTIVATIONS:
            err = arg_err
        else:
            err = 2 * ulp(y, "float32") + arg_err
    return y, np.where(np.isfinite(y), err, np.where(arg_exact, 0.0, np.inf))


# --- values the generator tracks ----------------------------------------------------------------

@dataclass
class Val:
    """Expected stored values of a tile (float64) and an elementwise bound on nikki's deviation."""

    v: np.ndarray
    err: np.ndarray

    @staticmethod
    def exact(v) -> "Val":
        v = np.asarray(v, dtype=np.float64)
        return Val(v, np.zeros(v.shape))

    def copy(self) -> "Val":
        return Val(self.v.copy(), self.err.copy())


def rounded(x32: np.ndarray, err32: np.ndarray, dtype: str) -> Val:
    """Writes an fp32 result with bound err32 into `dtype`: exact results stay exact (the reference
    rounds the same way); inexact ones gain half an ulp of the destination per rounding, and are
    not modelled for integer destinations (truncation turns small errors into whole units)."""
    v = store(x32, dtype)
    err32 = np.broadcast_to(np.asarray(err32, dtype=np.float64), v.shape)
    if not np.any(err32):
        return Val(v, np.zeros(v.shape))
    if not is_float(dtype):
        return Val(v, np.where(err32 > 0, np.inf, 0.0))
    with np.errstate(invalid="ignore", over="ignore"):
        reach = np.abs(x32.astype(np.float64)) + err32
        bound = err32 + ulp(reach, dtype)
    bound = np.where(err32 > 0, bound, 0.0)
    # a value that may round past the largest finite one may come out as inf (or NaN for e4m3fn)
    may_overflow = (err32 > 0) & ~(reach < largest_finite(dtype))
    return Val(v, np.where((np.isfinite(v) | (err32 == 0)) & ~may_overflow, bound, np.inf))


def compare(actual: np.ndarray, expected: Val, dtype: str) -> tuple[bool, str]:
    """True when every element of the host array `actual` is within the bound of `expected`."""
    got = from_array(actual, dtype)
    want, err = expected.v.reshape(got.shape), expected.err.reshape(got.shape)
    both_nan = np.isnan(got) & np.isnan(want)
    same_inf = np.isinf(got) & np.isinf(want) & (np.sign(got) == np.sign(want))
    with np.errstate(invalid="ignore"):
        close = np.abs(got - want) <= err
    ok = both_nan | same_inf | close | np.isinf(err)  # an infinite bound: the element is not modelled
    if ok.all():
        return True, ""
    bad = np.argwhere(~ok)
    first = tuple(int(i) for i in bad[0])
    return False, (f"{len(bad)} of {ok.size} elements differ from the numpy reference; first at {first}: "
                   f"got {got[first]!r}, expected {want[first]!r} +- {err[first]!r}")
