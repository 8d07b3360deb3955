#!/usr/bin/env python3
"""A numpy-eager executor for compiled nikki kernels: the baseline of simulation_throughput.py.

It runs a kernel the way NKI's own CPU simulator does: one instruction at a time, in program
order, each instruction one vectorized numpy computation over its whole tile. Each storage (HBM
tensor, SBUF or PSUM tile) is one flat numpy array, and every tensor operand is a strided view
of it (``np.lib.stride_tricks.as_strided`` with the operand's access pattern), built when the
instruction runs. Engines compute in fp32 and every write rounds to the destination dtype, as in
nikki's reference semantics (runtime/src/reference_semantics.cpp); activation functions are evaluated in
fp64 and rounded once, as nikki's are. Accumulation orders differ from nikki's (numpy's matmul,
pairwise sums), so results agree within the dtype's rounding, not bit for bit.

The kernel comes from nikki's introspection API (``Kernel.storages()`` / ``Kernel.instructions()``,
bindings/src/program_introspection.cpp), taken from a compiled program::

    compiled = my_kernel.specialize(x, y)          # a @nki.jit kernel
    eager = NumpyEagerExecutor(compiled.programs[0].kernel)
    out = eager.run(x, y)                          # numpy arrays, in kernel.outputs order

Scope: single-program kernels (no SPMD grid), static views (no runtime offsets), no runtime
control flow (registers, loops), no integer bitvec arithmetic. Anything outside it raises
NotImplementedError when the executor is built, naming the opcode or feature. Storages get one
array each, so kernels that deliberately alias storages through user-chosen addresses are not
modelled.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from nikki import _core

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes ships with nikki
    ml_dtypes = None

try:  # erf-based activations (gelu, erf, erf_dx) need it; everything else is plain numpy
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover
    _erf = None

__all__ = ["NumpyEagerExecutor", "SUPPORTED_OPCODES"]

F32 = np.float32
F64 = np.float64


def _numpy_dtype(name: str) -> np.dtype:
    if name in ("float32", "float16", "int8", "int16", "int32", "uint8", "uint16", "uint32"):
        return np.dtype(name)
    if name == "bool_":
        return np.dtype(np.uint8)  # one byte holding 0 or 1; the arithmetic treats it as an integer
    if name in ("bfloat16", "float8_e4m3", "float8_e4m3fn", "float8_e5m2") and ml_dtypes is not None:
        return np.dtype(getattr(ml_dtypes, name))
    # tfloat32 needs its own rounding on every write; not worth it for a baseline
    raise NotImplementedError(f"numpy-eager: dtype {name} is not supported")


def _is_float(name: str) -> bool:
    return name.startswith("float") or name == "bfloat16"


# --- the ALU and activation tables (fp32 in, fp32 out) ------------------------------------------

def _mod(a, b):
    r = np.fmod(a, b)
    return np.where((r != 0) & ((r < 0) != (b < 0)), r + b, r).astype(F32, copy=False)


def _as_f32(x):
    return x.astype(F32, copy=False)


_ALU = {
    "bypass": lambda a, b: a,
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "maximum": np.maximum,  # both propagate NaN, as nikki's do
    "minimum": np.minimum,
    "power": lambda a, b: _as_f32(np.power(np.asarray(a, F64), np.asarray(b, F64))),
    "mod": _mod,
    "fmod": np.fmod,
    "abs_max": lambda a, b: np.maximum(np.abs(a), np.abs(b)),
    "abs_min": lambda a, b: np.minimum(np.abs(a), np.abs(b)),
    "equal": lambda a, b: _as_f32(np.equal(a, b)),
    "not_equal": lambda a, b: _as_f32(np.not_equal(a, b)),
    "greater": lambda a, b: _as_f32(np.greater(a, b)),
    "greater_equal": lambda a, b: _as_f32(np.greater_equal(a, b)),
    "less": lambda a, b: _as_f32(np.less(a, b)),
    "less_equal": lambda a, b: _as_f32(np.less_equal(a, b)),
    "logical_and": lambda a, b: _as_f32((a != 0) & (b != 0)),
    "logical_or": lambda a, b: _as_f32((a != 0) | (b != 0)),
    "logical_xor": lambda a, b: _as_f32((a != 0) != (b != 0)),
    # unary operators ignore b
    "abs": lambda a, b: np.abs(a),
    "square": lambda a, b: a * a,
    "relu": lambda a, b: np.where(a > 0, a, np.where(np.isnan(a), a, F32(0))),
    "rsqrt": lambda a, b: _as_f32(1.0 / np.sqrt(np.asarray(a, F64))),
    "reciprocal": lambda a, b: F32(1) / a,
    "negate": lambda a, b: -a,
}
_UNARY = {"abs", "square", "relu", "rsqrt", "reciprocal", "negate", "invert"}
_BITVEC = {"bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "arith_shift_right", "invert"}


def _alu(op: str, a, b):
    fn = _ALU.get(op)
    if fn is None:
        raise NotImplementedError(f"numpy-eager: ALU operator {op} is not supported")
    return np.asarray(fn(a, b), dtype=F32)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x):
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def _need_erf(fn):
    def wrapped(x):
        if _erf is None:
            raise NotImplementedError("numpy-eager: erf-based activations need scipy")
        return fn(x)
    return wrapped


_SQRT2 = np.sqrt(2.0)
# fp64 formulas, rounded once to fp32 by the caller (nikki's activation.hpp does the same)
_ACT = {
    "square": lambda x: x * x,
    "sigmoid": _sigmoid,
    "gelu": _need_erf(lambda x: 0.5 * x * (1.0 + _erf(x / _SQRT2))),
    "gelu_dx": _need_erf(lambda x: 0.5 * (1.0 + _erf(x / _SQRT2))
                         + x * (1 / np.sqrt(2 * np.pi)) * np.exp(-0.5 * x * x)),
    "gelu_apprx_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x * x * x))),
    "gelu_apprx_sigmoid": lambda x: x * _sigmoid(1.702 * x),
    "gelu_apprx_sigmoid_dx": lambda x: (lambda s: s * (1.0 + 1.702 * x * (1.0 - s)))(_sigmoid(1.702 * x)),
    "silu": lambda x: x * _sigmoid(x),
    "silu_dx": lambda x: (lambda s: s * (1.0 + x * (1.0 - s)))(_sigmoid(x)),
    "tanh": np.tanh,
    "softplus": _softplus,
    "mish": lambda x: x * np.tanh(_softplus(x)),
    "erf": _need_erf(lambda x: _erf(x)),
    "erf_dx": lambda x: (2 / np.sqrt(np.pi)) * np.exp(-x * x),
    "exp": np.exp,
    "log": np.log,
    "sin": np.sin,
    "arctan": np.arctan,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "reciprocal": lambda x: 1.0 / x,
}
# evaluated on the fp32 value directly (exact in fp32)
_ACT_F32 = {
    "copy": lambda x: x,
    "relu": lambda x: _ALU["relu"](x, None),
    "sign": lambda x: np.where(np.isnan(x), x, np.sign(x)).astype(F32, copy=False),
    "abs": np.abs,
}


def _activation(func: str, x32):
    if func in _ACT_F32:
        return np.asarray(_ACT_F32[func](x32), dtype=F32)
    fn = _ACT.get(func)
    if fn is None:
        raise NotImplementedError(f"numpy-eager: activation function {func} is not supported")
    return fn(x32.astype(F64)).astype(F32)


def _fold(op: str, v):
    """Folds the last axis of v (fp32) with ALU operator `op`, as the engines' reductions do
    (left to right in nikki; numpy's pairwise order here)."""
    if v.shape[-1] == 1:
        return v[..., 0]
    if op == "add":
        return np.add.reduce(v, axis=-1)
    if op == "maximum":
        return np.max(v, axis=-1)
    if op == "minimum":
        return np.min(v, axis=-1)
    if op == "multiply":
        return np.multiply.reduce(v, axis=-1)
    if op == "subtract":
        return v[..., 0] - np.add.reduce(v[..., 1:], axis=-1)
    if op == "abs_max":
        return np.max(np.abs(v), axis=-1)
    if op == "abs_min":
        return np.min(np.abs(v), axis=-1)
    if op == "logical_and":
        return _as_f32(np.all(v != 0, axis=-1))
    if op == "logical_or":
        return _as_f32(np.any(v != 0, axis=-1))
    if op == "logical_xor":
        return _as_f32(np.count_nonzero(v, axis=-1) % 2 == 1)
    raise NotImplementedError(f"numpy-eager: reduce operator {op} is not supported")


def _apply_reduce_cmd(cmd: str, op: str, identity: float, acc, P: int, partial):
    """nikki's engine accumulators (ScalarE for activation, VectorE for select_reduce)."""
    if cmd == "reset":
        acc[:P] = identity
    elif cmd in ("reduce", "load_reduce"):
        if partial is not None:
            acc[:P] = _alu(op, acc[:P], partial)
    elif cmd == "reset_reduce":
        acc[:P] = identity if partial is None else partial


# --- operands -------------------------------------------------------------------------------------

class _View:
    """A decoded TensorView: where the operand lives and its geometry, in numpy terms."""

    __slots__ = ("storage", "dtype_name", "dtype", "offset", "shape", "strides", "P", "F", "is_float")

    def __init__(self, tv):
        self.storage = tv.storage
        self.dtype_name = tv.dtype
        self.dtype = _numpy_dtype(tv.dtype)
        self.offset = tv.offset
        self.shape = tuple(count for _stride, count in tv.pattern)
        self.strides = tuple(stride * self.dtype.itemsize for stride, _count in tv.pattern)
        self.P = self.shape[0] if self.shape else 1
        n = 1
        for c in self.shape:
            n *= c
        self.F = n // self.P
        self.is_float = _is_float(tv.dtype)


class NumpyEagerExecutor:
    """Runs one compiled nikki kernel (a ``_core.Kernel`` with allocated storages) with numpy."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.storages = kernel.storages()
        self.inputs = tuple(kernel.inputs)
        self.outputs = tuple(kernel.outputs)
        # the target's partition count sizes the engine accumulators
        self.num_partitions = _core.target_info(kernel.target)["tile_size"]["pmax"]
        self._storage_dtype = [_numpy_dtype(s["dtype"]) for s in self.storages]
        self._program = []
        self._first_use = []  # per instruction: scratch storages whose life starts there
        seen = set(self.inputs) | set(self.outputs)
        for inst in kernel.instructions():
            op = inst["opcode"]
            handler = getattr(self, "_op_" + op, None)
            if handler is None:
                raise NotImplementedError(f"numpy-eager: opcode {op} (instruction {inst['index']}) is not supported")
            operands = [_View(o) if isinstance(o, _core.TensorView) else o for o in inst["operands"]]
            self._check_supported(inst, operands)
            fresh = []
            for o in operands:
                if isinstance(o, _View) and o.storage not in seen:
                    seen.add(o.storage)
                    fresh.append(o.storage)
            self._first_use.append(fresh)
            self._program.append((handler, operands, inst["attrs"], inst))

    @staticmethod
    def _check_supported(inst, operands):
        """Raises NotImplementedError for the features of a supported opcode this executor leaves out."""
        op, where = inst["opcode"], f"{inst['opcode']} (instruction {inst['index']})"
        if "runtime_offsets" in inst:
            raise NotImplementedError(f"numpy-eager: {where} has runtime offsets")
        for key in ("op0", "op1", "reduce_op"):
            if inst["attrs"].get(key) in _BITVEC:
                raise NotImplementedError(f"numpy-eager: {where} uses bitvec operator {inst['attrs'][key]}")
        if op == "nc_matmul" and operands[0].dtype.itemsize != 4:
            # nikki tracks PSUM accumulation per 4-byte word; narrower dsts share words
            raise NotImplementedError(f"numpy-eager: {where} writes a PSUM tile narrower than 32 bits")
        if op == "tensor_tensor" and inst["engine"] == "gpsimd" and inst["attrs"]["op0"] != "power" and \
                all(o.dtype_name in ("int32", "uint32") for o in operands[:3]):
            raise NotImplementedError(f"numpy-eager: {where} is GpSimd int32 arithmetic")

    # --- memory -----------------------------------------------------------------------------
    def _fresh(self, sid: int):
        """A storage at the start of its life: uninitialized-memory sentinels (NaN / 4), as nikki."""
        s = self.storages[sid]
        dt = self._storage_dtype[sid]
        n = int(np.prod(s["shape"], dtype=np.int64))
        flat = np.empty(n, dtype=dt)
        # bool_ keeps the low bit of nikki's integer sentinel 4
        flat.fill(np.nan if _is_float(s["dtype"]) else 0 if s["dtype"] == "bool_" else 4)
        self._mem[sid] = flat
        self._written.pop(sid, None)
        return flat

    def _flat(self, v: _View):
        flat = self._mem[v.storage]
        return flat if flat.dtype == v.dtype else flat.view(v.dtype)

    def _view(self, v: _View):
        flat = self._flat(v)
        return as_strided(flat[v.offset:], v.shape, v.strides)

    def _load(self, v: _View):
        """The operand's values as fp32, [partitions, free]."""
        return np.asarray(self._view(v), dtype=F32).reshape(v.P, v.F)

    def _store(self, v: _View, values):
        """Writes fp32 values ([partitions, free] or broadcastable) rounded to the view's dtype."""
        dst = self._view(v)
        values = np.broadcast_to(np.asarray(values, dtype=F32), (v.P, v.F))
        if not v.is_float:
            values = self._float_to_int(values, v)
        dst[...] = values.reshape(v.shape)

    @staticmethod
    def _float_to_int(values, v: _View):
        if v.dtype_name == "bool_":
            return (values != 0).astype(np.uint8)
        info = np.iinfo(v.dtype)
        # truncate toward zero, saturate, NaN -> 0 (nikki's numerics.hpp)
        t = np.trunc(np.nan_to_num(values.astype(F64), nan=0.0))
        return np.clip(t, info.min, info.max).astype(v.dtype)

    def _store_integers(self, v: _View, values):
        """Writes int64 values with the engines' integer cast (saturating; floats round from fp32)."""
        dst = self._view(v)
        values = np.broadcast_to(values, (v.P, v.F))
        if v.is_float:
            out = values.astype(F32)
        elif v.dtype_name == "bool_":
            out = np.clip(values, 0, 1).astype(np.uint8)
        else:
            info = np.iinfo(v.dtype)
            out = np.clip(values, info.min, info.max).astype(v.dtype)
        dst[...] = out.reshape(v.shape)

    def _scalar(self, o, P: int):
        """A per-partition scalar operand: a [P, 1] column (the first element of each partition)
        or an fp32 immediate."""
        if isinstance(o, _View):
            return self._load(o)[:, :1]
        return F32(o)

    def _raw(self, v: _View):
        return np.asarray(self._view(v)).reshape(v.P, v.F)

    def _bits(self, v: _View):
        """Elements as integers (raw bit patterns for floats), as nikki's predicates read them."""
        raw = self._raw(v)
        if v.is_float:
            return raw.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[v.dtype.itemsize])
        return raw

    # --- running ------------------------------------------------------------------------------
    def run(self, *inputs):
        """Runs the kernel on numpy arrays (one per kernel input, in parameter order) and returns
        the outputs (numpy arrays, in kernel.outputs order)."""
        if len(inputs) != len(self.inputs):
            raise TypeError(f"kernel takes {len(self.inputs)} tensor inputs, got {len(inputs)}")
        self._mem = {}
        self._written = {}  # PSUM storage -> per-element "written by a matmul since allocation"
        self.scalar_acc = np.zeros(self.num_partitions, F32)
        self.vector_acc = np.zeros(self.num_partitions, F32)
        for sid, x in zip(self.inputs, inputs):
            s = self.storages[sid]
            x = np.asarray(x)
            if x.dtype == np.bool_:
                x = x.view(np.uint8)
            if x.dtype != self._storage_dtype[sid] or tuple(x.shape) != tuple(s["shape"]):
                raise TypeError(f"input '{s['name']}' must be {s['dtype']}{list(s['shape'])}, got "
                                f"{x.dtype}{list(x.shape)}")
            self._mem[sid] = np.ascontiguousarray(x).reshape(-1)
        for sid in self.outputs:
            self._fresh(sid)
        with np.errstate(all="ignore"):
            for fresh, (handler, operands, attrs, _inst) in zip(self._first_use, self._program):
                for sid in fresh:
                    self._fresh(sid)
                handler(operands, attrs)
        return [self._result(sid) for sid in self.outputs]

    def _result(self, sid: int):
        out = self._mem[sid].reshape(self.storages[sid]["shape"])
        return out.view(np.bool_) if self.storages[sid]["dtype"] == "bool_" else out

    # --- instructions (the numpy counterparts of reference_semantics.cpp's exec_*) --------------
    def _op_dma_copy(self, ops, at):
        dst, src = ops[0], ops[1]
        if dst.dtype == src.dtype:
            self._view(dst)[...] = np.asarray(self._view(src)).reshape(dst.shape)  # bit exact
        else:
            self._store(dst, self._load(src))

    _op_tensor_copy = _op_dma_copy

    def _op_tensor_tensor(self, ops, at):
        dst, a, b = ops[0], ops[1], ops[2]
        self._store(dst, _alu(at["op0"], self._load(a), self._load(b)))

    def _op_tensor_scalar(self, ops, at):
        dst, data, o0, o1 = ops[0], ops[1], ops[2], ops[3]
        x = self._load(data)
        s0 = self._scalar(o0, dst.P)
        # reverse swaps an operator's operands; unary operators only see the tensor value
        r = _alu(at["op0"], s0, x) if at["reverse0"] and at["op0"] not in _UNARY else _alu(at["op0"], x, s0)
        if o1 is not None:
            s1 = self._scalar(o1, dst.P)
            r = _alu(at["op1"], s1, r) if at["reverse1"] and at["op1"] not in _UNARY else _alu(at["op1"], r, s1)
        self._store(dst, r)

    def _op_scalar_tensor_tensor(self, ops, at):
        dst, data, o0, other = ops[0], ops[1], ops[2], ops[3]
        x, y = self._load(data), self._load(other)
        s0 = self._scalar(o0, dst.P)
        r = _alu(at["op0"], s0, x) if at["reverse0"] else _alu(at["op0"], x, s0)
        r = _alu(at["op1"], y, r) if at["reverse1"] else _alu(at["op1"], r, y)
        self._store(dst, r)

    def _op_activation(self, ops, at):
        dst, data, bias, scale, res = ops
        x = self._load(data)
        b = self._load(bias)[:, :1].astype(F64) if bias is not None else 0.0
        s = self._scalar(scale, dst.P)
        if bias is None and not isinstance(s, np.ndarray) and s == 1:
            t = x + F32(0)  # fma(x, 1, +0): exact, and -0 becomes +0 as in nikki
        else:
            # fma(x, scale, bias) in fp32: the fp64 product is exact, so one rounding (bar ties)
            t = (x.astype(F64) * (s.astype(F64) if isinstance(s, np.ndarray) else float(s)) + b).astype(F32)
        y = _activation(at["func"], t)
        self._store(dst, y)
        reducing = at["reduce_cmd"] in ("reduce", "reset_reduce")
        partial = np.add.reduce(y, axis=1) if reducing else None
        _apply_reduce_cmd(at["reduce_cmd"], "add", 0.0, self.scalar_acc, dst.P, partial)
        if res is not None:
            self._store(res, self.scalar_acc[:dst.P, None])

    def _op_tensor_reduce(self, ops, at):
        dst, data = ops[0], ops[1]
        reduced = [d for d in at["axes"] if d >= 1]
        first = min(reduced) if reduced else len(data.shape)
        run = int(np.prod(data.shape[first:], dtype=np.int64))
        v = self._load(data).reshape(data.P, data.F // run, run)
        r = _fold(at["op0"], v)
        self._store(dst, -r if at["negate"] else r)

    def _op_tensor_scalar_reduce(self, ops, at):
        dst, data, o0, res = ops
        v = _alu(at["op0"], self._load(data), self._scalar(o0, dst.P))
        self._store(dst, v)
        self.vector_acc[:dst.P] = _fold(at["reduce_op"], v)
        if res is not None:
            self._store(res, self.vector_acc[:dst.P, None])

    def _op_nc_matmul(self, ops, at):
        dst, st, mv = ops[0], ops[1], ops[2]
        a, b = self._load(st), self._load(mv)  # [K, M], [K, N]
        if at["is_transpose"]:
            return self._matmul_transpose(dst, st, a, b)
        part = a.T @ b  # fp32 products and sums (BLAS order, not nikki's k order)
        mode = at["accumulate"]
        if mode == "overwrite":
            self._store(dst, part)
        elif mode == "accumulate":
            self._store(dst, self._load(dst) + part)
        else:  # automatic: add where a matmul wrote since the tile's allocation
            flags = self._written_view(dst)
            self._store(dst, np.where(flags.reshape(dst.P, dst.F) != 0, self._load(dst) + part, part))
        self._written_view(dst)[...] = 1

    def _written_view(self, v: _View):
        flags = self._written.get(v.storage)
        if flags is None:
            s = self.storages[v.storage]
            n = int(np.prod(s["shape"], dtype=np.int64)) * self._storage_dtype[v.storage].itemsize // 4
            flags = self._written[v.storage] = np.zeros(n, np.uint8)
        return as_strided(flags[v.offset:], v.shape, tuple(st // v.dtype.itemsize for st in v.strides))

    def _matmul_transpose(self, dst, st, a, b):
        """Transpose mode is bit accurate: columns of `moving` that are unit vectors pass
        `stationary` through unchanged; other columns skip products with a zero factor."""
        nonzero = b != 0
        unit = (nonzero.sum(axis=0) == 1) & (np.where(nonzero, b, 0) == 1).any(axis=0)
        k_of = np.argmax(nonzero, axis=0)
        prod = np.where((a != 0)[:, :, None] & nonzero[:, None, :], a[:, :, None] * b[:, None, :], F32(0))
        out = prod.sum(axis=0, dtype=F32)  # [M, N]
        if dst.dtype == st.dtype:
            raw = self._raw(st)  # [K, M]
            res = np.empty((dst.P, dst.F), dst.dtype)
            res[...] = out.astype(dst.dtype) if dst.is_float else self._float_to_int(out, dst)
            res[:, unit] = raw[k_of[unit], :].T
            self._view(dst)[...] = res.reshape(dst.shape)
        else:
            out[:, unit] = a[k_of[unit], :].T
            self._store(dst, out)

    def _op_nc_transpose(self, ops, at):
        dst, data = ops[0], ops[1]
        self._view(dst)[...] = self._raw(data).T.reshape(dst.shape)

    def _op_memset(self, ops, at):
        dst, value = ops[0], ops[1]
        if dst.is_float:
            self._store(dst, F32(value))
        else:
            self._store_integers(dst, np.int64(np.trunc(value)))

    def _affine_values(self, dst: _View, at):
        """offset + partition * channel_multiplier + sum(step * index) over the pattern, in int32."""
        pattern = at["pattern"]
        idx = np.zeros(1, np.int64)
        for step, count in pattern:
            idx = (idx[:, None] + step * np.arange(count, dtype=np.int64)[None, :]).reshape(-1)
        per_row = np.resize(idx, dst.F)  # the pattern restarts when the row is longer
        v = at["offset"] + at["channel_multiplier"] * np.arange(dst.P, dtype=np.int64)[:, None] + per_row[None, :]
        return ((v + 2**31) % 2**32) - 2**31

    def _op_iota(self, ops, at):
        self._store_integers(ops[0], self._affine_values(ops[0], at))

    def _op_affine_select(self, ops, at):
        dst, on_true, on_false = ops[0], ops[1], ops[2]
        v = self._affine_values(dst, at)
        cond = _alu(at["cmp_op"], v.astype(F64), 0.0) != 0
        if dst.dtype == on_true.dtype:
            fill = np.asarray(F32(on_false)).astype(dst.dtype) if dst.is_float else \
                self._float_to_int(np.asarray(F32(on_false)), dst)
            self._view(dst)[...] = np.where(cond, self._raw(on_true), fill).reshape(dst.shape)
        else:
            self._store(dst, np.where(cond, self._load(on_true), F32(on_false)))

    def _op_bn_stats(self, ops, at):
        dst, data = ops[0], ops[1]
        x = self._load(data).astype(F64)
        out = np.zeros((data.P, 6), F64)
        for lane in (0, 1):
            v = x[:, lane::2]
            n = v.shape[1]
            if n == 0:
                continue
            mean = v.mean(axis=1)
            out[:, 3 * lane] = n
            out[:, 3 * lane + 1] = mean
            out[:, 3 * lane + 2] = ((v - mean[:, None]) ** 2).sum(axis=1)
        self._store(dst, out.astype(F32))

    def _op_bn_aggr(self, ops, at):
        dst, data = ops[0], ops[1]
        x = self._load(data).astype(F64)
        t = x[:, : 3 * (data.F // 3)].reshape(data.P, -1, 3)
        used = t[:, :, 0] != 0
        nb = np.where(used, t[:, :, 0], 0.0)
        mb = np.where(used, t[:, :, 1], 0.0)
        m2b = np.where(used, t[:, :, 2], 0.0)
        n = nb.sum(axis=1)
        mean = np.where(n > 0, (nb * mb).sum(axis=1) / np.where(n > 0, n, 1), 0.0)
        m2 = m2b.sum(axis=1) + (nb * (mb - mean[:, None]) ** 2).sum(axis=1)
        var = np.where(n > 0, m2 / np.where(n > 0, n, 1), np.nan)
        self._store(dst, np.stack([mean, var], axis=1).astype(F32))

    def _op_reciprocal(self, ops, at):
        self._store(ops[0], F32(1) / self._load(ops[1]))

    def _op_tensor_copy_predicated(self, ops, at):
        dst, src, pred = ops[0], ops[1], ops[2]
        take = (self._bits(pred) != 0) != at["reverse_pred"]
        if isinstance(src, _View) and src.dtype == dst.dtype:
            new = np.where(take, self._raw(src), self._raw(dst))
            self._view(dst)[...] = new.reshape(dst.shape)
        else:
            value = self._load(src) if isinstance(src, _View) else F32(src)
            self._store(dst, np.where(take, value, self._load(dst)))

    def _op_select_reduce(self, ops, at):
        dst, pred, on_true, on_false, res = ops
        take = (self._bits(pred) != 0) != at["reverse_pred"]
        v = np.where(take, self._load(on_true), self._scalar(on_false, dst.P)).astype(F32)
        self._store(dst, v)
        reducing = at["reduce_cmd"] in ("reduce", "reset_reduce")
        best = np.maximum(np.max(v, axis=1), F32(-np.inf)) if reducing else None
        _apply_reduce_cmd(at["reduce_cmd"], "maximum", -np.inf, self.vector_acc, dst.P, best)
        if res is not None:
            self._store(res, self.vector_acc[:dst.P, None])

    def _op_max8(self, ops, at):
        dst, src = ops[0], ops[1]
        # descending, NaN last (a NaN never outranks a number)
        self._store(dst, -np.sort(-self._load(src), axis=1, kind="stable")[:, :8])

    def _op_nc_find_index8(self, ops, at):
        dst, data, vals = ops[0], ops[1], ops[2]
        x, want = self._load(data), self._load(vals)
        used = np.zeros(x.shape, bool)
        rows = np.arange(x.shape[0])
        found = np.empty((x.shape[0], 8), np.int64)
        for i in range(8):  # each value takes the first match not taken by an earlier one
            match = (x == want[:, i:i + 1]) & ~used
            has = match.any(axis=1)
            f = np.argmax(match, axis=1)
            found[:, i] = np.where(has, f, 0xFFFFFFFF)
            used[rows[has], f[has]] = True
        self._store_integers(dst, found)

    def _op_tensor_partition_reduce(self, ops, at):
        dst, data = ops[0], ops[1]
        op = at["op0"]
        v = self._load(data).T  # [free, partitions]
        r = _fold("add" if op == "average" else op, v)
        if op == "average":
            r = r / F32(data.P)
        self._store(dst, r[None, :])


# the opcodes run() executes (each still subject to _check_supported's feature checks)
SUPPORTED_OPCODES = frozenset(name[len("_op_"):] for name in dir(NumpyEagerExecutor) if name.startswith("_op_"))
