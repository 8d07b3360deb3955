"""Bad-input fuzzer of nikki's Python face.

Each case takes one public entry point with arguments that work, replaces one argument with a
value drawn from a pool of awkward ones (None, strings, wrong ranks, empty and 0-d arrays, NaN and
infinities, numpy scalars, bools where ints go, huge ints, negative sizes, tensors on another
device, sparse, non-contiguous, broadcast, big-endian and unaligned arrays, float64 / int64 /
complex dtypes, tensors requiring grad, ...) and runs the call in this process. The oracle:

* the call raises nikki.KernelError, TypeError, ValueError or NotImplementedError whose message
  names the replaced argument (a KernelError may instead point at the line of the user's kernel
  that the value broke), and never says "internal error"; or
* the value was in fact valid (a numpy scalar, a view, another byte order, ...) and the call
  returns the result numpy / PyTorch give, or the same result as the canonical arguments.

Anything else (another exception type, an error that names nothing, a result that differs, a
value silently accepted that is not valid) is a defect; a crash ends the process.

NIKKI_FUZZ_CASES sets the number of cases (default 300), NIKKI_FUZZ_SEED the seed; case i is drawn
from (seed, i) alone, so a failure names the case to rerun with NIKKI_FUZZ_ONLY=i.
"""

from __future__ import annotations

import collections
import math
import os
import random
import sys
import traceback

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl
import nikki.typing as nt
from nikki.library import library_kernels

torch = pytest.importorskip("torch")
import nikki.torch as ntorch  # noqa: E402

CASES = int(os.environ.get("NIKKI_FUZZ_CASES", "300"))
SEED = int(os.environ.get("NIKKI_FUZZ_SEED", "20240611"))
ONLY = os.environ.get("NIKKI_FUZZ_ONLY")

ACCEPTED_ERRORS = (nki.KernelError, TypeError, ValueError, NotImplementedError)
P, F = 4, 8  # the canonical tile: small, so that valid cases compile quickly


# --- values ----------------------------------------------------------------------------------------

class Bad:
    """One replacement value: `make(base)` builds it from the argument it replaces (for tensors, a
    numpy array holding the base's values); `valid` says whether the call must then work (True),
    fail (False) or may do either, what the entry point does with it deciding (None). Tensor
    values are numpy arrays, made torch tensors when the base is one, unless `numpy_only`;
    `torch_only` values are torch tensors whatever the base."""

    def __init__(self, label, make, valid=False, torch_only=False, numpy_only=False):
        self.label = label
        self.make = make
        self.valid = valid
        self.torch_only = torch_only
        self.numpy_only = numpy_only

    def but_valid(self, valid=True) -> "Bad":
        return Bad(self.label, self.make, valid, self.torch_only, self.numpy_only)


def _const(v):
    return lambda base: v


NUMBERS = [  # where a number goes (an instruction operand, an nl operand, a fill value)
    Bad("None", _const(None)), Bad("str", _const("2")), Bad("list", _const([2.0])), Bad("complex", _const(1j)),
    Bad("array", _const(np.ones(3))), Bad("huge int", _const(10 ** 400)), Bad("dict", _const({})),
    Bad("nan", _const(float("nan")), True), Bad("-inf", _const(float("-inf")), True),
    Bad("np.float32", _const(np.float32(2.5)), True), Bad("np.float64", _const(np.float64(0.25)), True),
    Bad("np.int64", _const(np.int64(3)), True), Bad("True", _const(True), True),
    Bad("np.True_", _const(np.True_), True), Bad("int", _const(7), True),
]
OPTIONAL_NUMBERS = [b.but_valid() if b.label == "None" else b for b in NUMBERS]
FINITE_NUMBERS = [b for b in NUMBERS if b.label not in ("nan", "-inf", "True", "np.True_")] + [
    Bad("nan", _const(float("nan"))), Bad("inf", _const(float("inf"))), Bad("True", _const(True))]
OPTIONAL_FINITE = [b.but_valid() if b.label == "None" else b for b in FINITE_NUMBERS]
BOOLS = [
    Bad("str no", _const("no")), Bad("None", _const(None)), Bad("int 1", _const(1)), Bad("float", _const(0.5)),
    Bad("list", _const([True])), Bad("np.True_", _const(np.True_), True),
    Bad("np.False_", _const(np.bool_(False)), True), Bad("False", _const(False), True),
]
INTS = [
    Bad("None", _const(None)), Bad("str", _const("1")), Bad("float", _const(1.5)), Bad("True", _const(True)),
    Bad("huge", _const(10 ** 30)), Bad("-huge", _const(-10 ** 30)), Bad("complex", _const(1j)),
    Bad("list", lambda base: [base]), Bad("np.int64", np.int64, True), Bad("np.int32", np.int32, True),
]
AXES = [b.but_valid() if b.label == "list" else b for b in INTS]  # a list of axes is an axis argument
SLICE_STOPS = [b.but_valid() if b.label == "None" else b for b in INTS]
SLICE_STEPS = SLICE_STOPS + [Bad("zero", _const(0)), Bad("negative", _const(-1))]
OPERATORS = [
    Bad("None", _const(None)), Bad("str", _const("add")), Bad("int", _const(1)), Bad("activation", _const(nl.exp)),
    Bad("np.add", _const(np.add), True), Bad("lambda", _const(lambda a, b: a + b)),
]
SHAPES = [
    Bad("None", _const(None)), Bad("str", _const("4")), Bad("float dim", _const((4.5, F))),
    Bad("bool dim", _const((True, F))), Bad("zero dim", _const((0, F)), None), Bad("negative dim", _const((-1, F))),
    Bad("rank 9", _const((1,) * 9)), Bad("huge int", _const(2 ** 62), None), Bad("empty", _const(())),
    Bad("list", list, True), Bad("np.int64 dims", lambda base: tuple(np.int64(d) for d in base), True),
]
DTYPES = [
    Bad("None", _const(None)), Bad("unknown name", _const("float99")), Bad("float64", _const(np.float64)),
    Bad("int64", _const(np.int64)), Bad("complex64", _const(np.complex64)), Bad("object", _const(object)),
    Bad("int", _const(3)), Bad("name", _const("float32"), True),
    Bad("numpy", _const(np.float32), True),
]


def _strided(a):
    """A view of a copy of `a` that steps over every other element of the last dim."""
    wide = np.zeros(a.shape[:-1] + (a.shape[-1] * 2,), a.dtype)
    wide[..., ::2] = a
    return wide[..., ::2]


def _unaligned(a):
    raw = bytearray(a.nbytes + 1)
    view = np.frombuffer(raw, dtype=a.dtype, count=a.size, offset=1).reshape(a.shape)
    view[...] = a
    return view


def _torch_of(a):
    """A torch tensor of a numpy array's values (bfloat16 and OCP fp8 through their bits: torch
    cannot take ml_dtypes arrays)."""
    a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if a.dtype.name in ("float8_e4m3fn", "float8_e5m2"):
        return torch.from_numpy(a.view(np.uint8)).view(getattr(torch, a.dtype.name))
    return torch.from_numpy(a)


def _meta(a):
    return torch.empty(a.shape, dtype=_torch_of(a).dtype, device="meta")


def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


# Where a tensor goes. NOT_WRITABLE: valid inputs an nt.mutable_tensor argument must reject.
TENSORS = [
    Bad("None", _const(None)), Bad("str", _const("x")), Bad("int", _const(3)),
    Bad("list", lambda a: a.tolist(), numpy_only=True), Bad("dict", _const({})),
    Bad("0-d", lambda a: np.ones((), a.dtype)), Bad("empty", lambda a: a[:0]),
    Bad("rank 9", lambda a: np.ones((1,) * 9, a.dtype), None), Bad("wrong rank", lambda a: a.reshape(-1) if a.ndim > 1 else a.reshape(1, -1), None),
    Bad("float64", lambda a: a.astype(np.float64)), Bad("int64", lambda a: a.astype(np.int64)),
    Bad("complex64", lambda a: a.astype(np.complex64)), Bad("uint64", lambda a: np.abs(a).astype(np.uint64), numpy_only=True),
    Bad("object", lambda a: a.astype(object), numpy_only=True),
    Bad("datetime", lambda a: np.zeros(a.shape, "datetime64[s]"), numpy_only=True),
    Bad("meta", _meta, torch_only=True), Bad("sparse", lambda a: _torch_of(a).to_sparse(), torch_only=True),
    Bad("fortran order", np.asfortranarray, True), Bad("strided view", _strided, True),
    Bad("big-endian", lambda a: a.astype(a.dtype.newbyteorder(">")), True, numpy_only=True),
    Bad("unaligned", _unaligned, True, numpy_only=True), Bad("read-only", _read_only, True, numpy_only=True),
    Bad("broadcast", lambda a: np.broadcast_to(a[:1], a.shape), True, numpy_only=True),
    Bad("torch", _torch_of, True, torch_only=True),
    Bad("torch transposed", lambda a: _torch_of(np.ascontiguousarray(a.T)).permute(*reversed(range(a.ndim))), True, torch_only=True),
    Bad("torch requires grad", lambda a: _torch_of(a).requires_grad_(a.dtype.kind == "f"), True, torch_only=True),
    Bad("torch expanded", lambda a: _torch_of(a[:1]).expand(*a.shape), True, torch_only=True),
]
OPTIONAL_TENSORS = [b.but_valid() if b.label == "None" else b for b in TENSORS]
NOT_WRITABLE = {"read-only", "broadcast", "torch expanded", "torch requires grad"}


def make_tensor(bad: Bad, base):
    """The value `bad` makes of tensor argument `base` (numpy or torch)."""
    if isinstance(base, torch.Tensor):
        value = bad.make(_as_numpy(base).astype(_numpy_dtype_of(base)))
        if isinstance(value, np.ndarray) and not bad.numpy_only:
            try:  # keeping the layout of views (a transposed fortran array stays non-contiguous)
                return torch.from_numpy(value) if value.dtype.name != "bfloat16" else _torch_of(value)
            except TypeError:
                return value
        return value
    return bad.make(base)


def _numpy_dtype_of(t):
    from nikki.dtypes import from_torch, numpy_dtype

    return numpy_dtype(from_torch(t.dtype))


def _as_numpy(x):
    if isinstance(x, torch.Tensor):
        x = x.detach()
        widen = x.dtype == torch.bfloat16 or (x.is_floating_point() and x.dtype.itemsize == 1)  # no numpy dtype
        return (x.float() if widen else x).numpy()
    return np.asarray(x)


# --- entry points ------------------------------------------------------------------------------------

class Entry:
    """A public entry point: its arguments (name -> (kind, canonical value)), how to call it, and
    what a valid call returns (None: no independent reference; the canonical call's result is)."""

    name = ""
    accepts_numpy = True  # numpy arrays are tensors here (not for the torch-facing entries)
    torch_facing = False  # dispatched by torch (a meta tensor gives a meta result)

    def located_ok(self, slot: str) -> bool:
        """Whether an error about `slot` may point at a line of a kernel in this file instead of
        naming the argument (a value that is fine in itself but breaks what the kernel does)."""
        return False

    def arguments(self, rng) -> dict:
        raise NotImplementedError

    def call(self, args: dict):
        raise NotImplementedError

    def reference(self, args: dict):
        return None

    def names(self, slot: str) -> tuple:
        """The names an error about `slot` may use."""
        return (slot,)

    def writable(self, slot: str) -> bool:
        return False


def _rand(rng, shape, dtype=np.float32):
    return np.asarray(rng.standard_normal(shape), dtype=dtype)


@nki.jit
def jit_add(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out


@nki.jit
def jit_scale(a, factor):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.multiply(nl.load(a), factor))
    return out


@nki.jit
def jit_write(a: nt.mutable_tensor, b):
    nl.store(a, nl.add(nl.load(b), 1))
    return a


class JitAdd(Entry):
    located_ok = staticmethod(lambda slot: True)
    name = "@nki.jit add(a, b)"

    def arguments(self, rng):
        return {"a": ("tensor", _rand(rng, (P, F))), "b": ("tensor", _rand(rng, (P, F)))}

    def call(self, args):
        return jit_add(args["a"], args["b"])

    def reference(self, args):
        return _as_numpy(args["a"]).astype(np.float32) + _as_numpy(args["b"]).astype(np.float32)


class JitScale(Entry):
    located_ok = staticmethod(lambda slot: True)
    name = "@nki.jit scale(a, factor)"

    def arguments(self, rng):
        return {"a": ("tensor", _rand(rng, (P, F))), "factor": ("number", 2.0)}

    def call(self, args):
        return jit_scale(args["a"], args["factor"])

    def reference(self, args):
        return (_as_numpy(args["a"]).astype(np.float32) * np.float32(args["factor"])).astype(np.float32)

    def names(self, slot):
        return ("factor", "y") if slot == "factor" else (slot,)


class JitWrite(Entry):
    located_ok = staticmethod(lambda slot: True)
    name = "@nki.jit write(a: mutable, b)"

    def arguments(self, rng):
        return {"a": ("tensor", np.zeros((P, F), np.float32)), "b": ("tensor", _rand(rng, (P, F)))}

    def call(self, args):
        jit_write(args["a"], args["b"])
        return args["a"]  # the written argument itself, in its own layout

    def reference(self, args):
        return _as_numpy(args["b"]).astype(np.float32) + 1

    def writable(self, slot):
        return slot == "a"


class JitGrid(Entry):
    name = "kernel[grid]"

    def arguments(self, rng):
        return {"grid": ("int", 1)}

    def call(self, args):
        return jit_add[args["grid"]](np.ones((P, F), np.float32), np.ones((P, F), np.float32))

    def reference(self, args):
        return np.full((P, F), 2.0, np.float32)


class Spec(Entry):
    name = "nikki.spec(shape, dtype)"

    def arguments(self, rng):
        return {"shape": ("shape", (P, F)), "dtype": ("dtype", np.float32)}

    def call(self, args):
        return np.array(nki.spec(args["shape"], args["dtype"]).shape)

    def reference(self, args):
        shape = args["shape"]
        return np.array([int(d) for d in ((shape,) if isinstance(shape, int) else shape)])


class Estimate(Entry):
    name = "nikki.estimate(kernel, spec, spec, target=)"

    def arguments(self, rng):
        return {"a": ("spec", nki.spec((P, F), np.float32)), "target": ("target", "trn2")}

    def call(self, args):
        profile = nki.estimate(jit_add, args["a"], nki.spec((P, F), np.float32), target=args["target"])
        assert profile.total_ns > 0
        return np.array(1)

    def reference(self, args):
        return np.array(1)


def _flash_reference(q, k, v, sinks=None, causal=False, scale=None, window=0, softcap=0, prefix_len=0):
    q, k, v = (torch.from_numpy(_as_numpy(t).astype(np.float64)) for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if causal or window:  # query i sits at key position i + prefix_len (top-left aligned without a prefix)
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1 + int(prefix_len)), -math.inf)
    if window:  # a sliding window: key j visible from query i when i + prefix_len - window < j
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).tril(int(prefix_len) - int(window)), -math.inf)
    if sinks is not None:  # a sink logit per head joins the denominator
        sink = torch.from_numpy(_as_numpy(sinks).astype(np.float64))[None, :, None, None]
        s = torch.cat([s, sink.expand(*s.shape[:-1], 1)], -1)
    p = torch.softmax(s, -1)
    return [(p[..., :-1] if sinks is not None else p) @ v, torch.logsumexp(s, -1)]


def _norm_stats(x, eps, centered):
    x = _as_numpy(x).astype(np.float64)
    mean = x.mean(-1) if centered else np.zeros(x.shape[0])
    rstd = 1 / np.sqrt(((x - mean[:, None]) ** 2).mean(-1) + eps)
    return x, mean, rstd


def _layernorm_reference(x, gamma, beta, eps=1e-5):
    x, mean, rstd = _norm_stats(x, eps, True)
    return [(x - mean[:, None]) * rstd[:, None] * _as_numpy(gamma) + _as_numpy(beta), mean, rstd]


def _rmsnorm_reference(x, gamma, eps=1e-6):
    x, _, rstd = _norm_stats(x, eps, False)
    return [x * rstd[:, None] * _as_numpy(gamma), rstd]


# Independent float64 references of the forward kernels, by registry name.
LIBRARY_REFERENCES = {
    "matmul": lambda a, b: [_as_numpy(a).astype(np.float64) @ _as_numpy(b).astype(np.float64)],
    "softmax": lambda x: [torch.softmax(torch.from_numpy(_as_numpy(x).astype(np.float64)), -1)],
    "layernorm": _layernorm_reference,
    "rmsnorm": _rmsnorm_reference,
    "flash_attention": _flash_reference,
}
PARAM_KINDS = {"bool": "bool", "int": "int", "float": "finite", "float?": "optional"}


class Library(Entry):
    """nikki.kernels.<name>(inputs..., params...) on numpy arrays, or torch.ops.nikki.<name> on
    torch tensors; inputs from the kernel's smallest registry example."""

    def __init__(self, kernel, via_torch_op: bool):
        self.kernel = kernel
        self.via_torch_op = via_torch_op
        self.name = f"torch.ops.nikki.{kernel.name}" if via_torch_op else f"nikki.kernels.{kernel.name}"
        specs, self.example_params, _ = min(kernel.info["examples"],
                                            key=lambda ex: sum(math.prod(s) for s, _ in ex[0]))
        self.specs = [(tuple(s), d) for s, d in specs]
        self.accepts_numpy = not via_torch_op
        self.torch_facing = via_torch_op

    def arguments(self, rng):
        from nikki.dtypes import numpy_dtype, to_dtype

        args = {}
        # Values from the registration's own input maker, so the valid call is valid (cache
        # lengths in range, class indices below V, non-negative second moments).
        values = nki._core.library_inputs(self.kernel.name, [(list(sh), dt) for sh, dt in self.specs],
                                          self.example_params, int(rng.integers(1 << 31)))
        for name, (shape, dt), value in zip(self.kernel.inputs, self.specs, values):
            value = value.astype(numpy_dtype(to_dtype(dt)))
            args[name] = ("tensor", _torch_of(value) if self.via_torch_op else value)
        for name, kind, default, _doc in self.kernel.info["params"]:
            value = self.example_params.get(name, default)
            value = bool(value) if kind == "bool" else value
            args[name] = (PARAM_KINDS[kind], value)
        return args

    def writable(self, slot):
        # a kernel's updated_inputs (decode_attention's caches) are written in place
        return slot in self.kernel.info.get("updated_inputs", ())

    def call(self, args):
        inputs = [args[n] for n in self.kernel.inputs]
        params = {n: args[n] for n, *_ in self.kernel.info["params"]}
        if self.via_torch_op:
            return ntorch.library_op(self.kernel.name)(*inputs, **params)
        return self.kernel(*inputs, **params)

    def reference(self, args):
        ref = LIBRARY_REFERENCES.get(self.kernel.name)
        if ref is None:
            return None
        return ref(*[args[n] for n in self.kernel.inputs],
                   **{n: args[n] for n, *_ in self.kernel.info["params"] if n in args})


class TorchFunction(Entry):
    """A nikki.torch function against its PyTorch counterpart."""

    accepts_numpy = False
    torch_facing = True

    def __init__(self, name, make_args, call, reference, valid_labels=()):
        self.name = f"nikki.torch.{name}"
        self._make_args, self._call, self._reference = make_args, call, reference
        # (slot, replacement) pairs PyTorch's own function takes (so the nikki one must, and match it)
        self.valid_labels = frozenset(valid_labels)

    def arguments(self, rng):
        return self._make_args(rng)

    def call(self, args):
        return self._call(**args)

    def reference(self, args):
        plain = {k: (torch.from_numpy(_as_numpy(v).astype(np.float64)) if isinstance(v, (torch.Tensor, np.ndarray))
                     else v.item() if isinstance(v, np.generic) else v) for k, v in args.items()}
        return self._reference(**plain)


def _t(rng, *shape):
    return torch.from_numpy(_rand(rng, shape))


def _softmax_ref(x, dim=-1):
    return torch.softmax(x, int(dim))


def _layer_norm_ref(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(int(d) for d in normalized_shape)
    return torch.nn.functional.layer_norm(x, shape, weight, bias, float(eps))


def _rms_norm_ref(x, weight=None, eps=1e-6):
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + float(eps))
    return y if weight is None else y * weight


def _adamw_step(param, grad, exp_avg, exp_avg_sq, step, lr, eps, weight_decay):
    """nikki.torch.adamw_ on copies of the tensors it updates (the case's arguments stay as drawn,
    for the reference), returning the updated (param, exp_avg, exp_avg_sq)."""
    updated = [t.clone() if isinstance(t, torch.Tensor) else t for t in (param, exp_avg, exp_avg_sq)]
    ntorch.adamw_(updated[0], grad, updated[1], updated[2], step, lr=lr, eps=eps, weight_decay=weight_decay)
    return tuple(updated)


def _adamw_ref(param, grad, exp_avg, exp_avg_sq, step, lr, eps, weight_decay, betas=(0.9, 0.999)):
    """One AdamW step (torch.optim.AdamW's update, adamw_'s default betas) in float64."""
    m = betas[0] * exp_avg + (1 - betas[0]) * grad
    v = betas[1] * exp_avg_sq + (1 - betas[1]) * grad * grad
    denominator = torch.sqrt(v / (1 - betas[1] ** step)) + eps
    return param * (1 - lr * weight_decay) - lr * (m / (1 - betas[0] ** step)) / denominator, m, v


TORCH_FUNCTIONS = [
    TorchFunction("softmax", lambda r: {"x": ("tensor", _t(r, P, F)), "dim": ("int", -1)},
                  ntorch.softmax, _softmax_ref),
    TorchFunction("rms_norm", lambda r: {"x": ("tensor", _t(r, P, F)), "weight": ("tensor?", _t(r, F)),
                                         "eps": ("finite", 1e-6)}, ntorch.rms_norm, _rms_norm_ref),
    TorchFunction("layer_norm", lambda r: {"x": ("tensor", _t(r, P, F)), "normalized_shape": ("shape", (F,)),
                                           "weight": ("tensor?", _t(r, F)), "bias": ("tensor?", _t(r, F)),
                                           "eps": ("finite", 1e-5)}, ntorch.layer_norm, _layer_norm_ref),
    TorchFunction("matmul", lambda r: {"a": ("tensor", _t(r, P, F)), "b": ("tensor", _t(r, F, P))},
                  ntorch.matmul, lambda a, b: a @ b, valid_labels={("a", "empty")}),  # [0, K] @ [K, N] is [0, N]
    TorchFunction("flash_attention", lambda r: {"q": ("tensor", _t(r, 1, 2, 16, F)), "k": ("tensor", _t(r, 1, 1, 16, F)),
                                                "v": ("tensor", _t(r, 1, 1, 16, F)), "causal": ("bool", False),
                                                "scale": ("optional", 0.5)},
                  ntorch.flash_attention, lambda q, k, v, causal, scale: _flash_reference(q, k, v, causal=causal, scale=scale)[0]),
    TorchFunction("adamw_", lambda r: {"param": ("tensor", _t(r, F)), "grad": ("tensor", _t(r, F)),
                                       "exp_avg": ("tensor", _t(r, F)), "exp_avg_sq": ("tensor", _t(r, F).abs()),
                                       "step": ("int", 3), "lr": ("finite", 1e-2), "eps": ("finite", 1e-8),
                                       "weight_decay": ("finite", 1e-2)}, _adamw_step, _adamw_ref),
]


class _Tile:
    """A stand-in for a tensor that only exists inside the kernel; InKernel resolves it there."""

    def __init__(self, label):
        self.label = label

    def __repr__(self):
        return f"<{self.label}>"


SAME_TILE, WIDE_TILE, HBM_INPUT, PSUM_TILE = (_Tile(n) for n in ("the input tile", "a [P, 2F] tile", "the HBM input",
                                                                 "a PSUM tile"))
TILES = [  # where a tile goes inside a kernel (the canonical value is the input tile)
    Bad("None", _const(None)), Bad("number", _const(1.0)), Bad("str", _const("t")), Bad("list", _const([1.0])),
    Bad("numpy array", _const(np.ones((P, F), np.float32))), Bad("torch tensor", _const(torch.ones(P, F))),
    Bad("wider tile", _const(WIDE_TILE)), Bad("HBM tensor", _const(HBM_INPUT), None),
    Bad("PSUM tile", _const(PSUM_TILE), None), Bad("same tile", _const(SAME_TILE), True),
]


def _resolve(value, a, t):
    """The tensor a _Tile stands for in the kernel being traced (a: the HBM input, t: its tile)."""
    if value is SAME_TILE:
        return t
    if value is HBM_INPUT:
        return a
    if value is WIDE_TILE:
        return nl.zeros((P, 2 * F), nl.float32)
    if value is PSUM_TILE:
        tile = nl.ndarray((P, F), nl.float32, buffer=nl.psum)
        nisa.tensor_copy(tile, t)
        return tile
    return value


class InKernel(Entry):
    """One nl / nisa call inside a kernel, its arguments passed in from outside: `body(t, d, args)`
    runs in the kernel with t the loaded input tile and d a fresh [P, F] fp32 tile that the
    kernel returns; `reference(x, args)` is d's value for input x."""

    def __init__(self, name, slots, body, reference, aliases=None, out_dtype=nl.float32):
        self.name = name
        self.slots = slots
        self.body = body
        self._reference = reference
        self.aliases = aliases or {}
        self.out_dtype = out_dtype
        self.input = np.linspace(-2, 2, P * F, dtype=np.float32).reshape(P, F)

    def arguments(self, rng):
        return dict(self.slots)

    def call(self, args):
        body, values, out_dtype = self.body, {k: v for k, v in args.items()}, self.out_dtype

        def kernel(a):
            out = nl.ndarray((P, F), out_dtype, buffer=nl.shared_hbm)
            t = nl.load(a)
            d = nl.ndarray((P, F), out_dtype)
            body(t, d, {k: _resolve(v, a, t) for k, v in values.items()})
            nl.store(out, d)
            return out

        return nki.jit(kernel)(self.input)

    def reference(self, args):
        return self._reference(self.input.astype(np.float64), args)

    def names(self, slot):
        return (slot, *self.aliases.get(slot, ()))

    def located_ok(self, slot):
        # a well-formed shape the hardware cannot hold, a tile in the wrong memory or of another
        # shape: the verifier names the tensor and the rule at the user's line
        return self.slots[slot][0] in ("shape", "tile")


def _fill(d, value):
    nisa.memset(d, value)


def _effective_op(op):
    return {nl.add: np.add, nl.multiply: np.multiply, np.add: np.add}.get(op, np.add)


IN_KERNEL = [
    InKernel("nisa.tensor_scalar", {"op0": ("operator", nl.multiply), "operand0": ("number", 2.0),
                                    "reverse0": ("bool", False)},
             lambda t, d, a: nisa.tensor_scalar(dst=d, data=t, op0=a["op0"], operand0=a["operand0"],
                                                reverse0=a["reverse0"]),
             lambda x, a: _effective_op(a["op0"])(x, float(a["operand0"]))),
    InKernel("nisa.tensor_tensor", {"op": ("operator", nl.add)},
             lambda t, d, a: nisa.tensor_tensor(dst=d, data1=t, data2=t, op=a["op"]),
             lambda x, a: _effective_op(a["op"])(x, x)),
    InKernel("nisa.tensor_tensor data2", {"data2": ("tile", SAME_TILE)},
             lambda t, d, a: nisa.tensor_tensor(dst=d, data1=t, data2=a["data2"], op=nl.add), lambda x, a: x + x),
    InKernel("nisa.tensor_copy", {"src": ("tile", SAME_TILE)},
             lambda t, d, a: nisa.tensor_copy(dst=d, src=a["src"]), lambda x, a: x),
    InKernel("nisa.dma_copy", {"src": ("tile", SAME_TILE)},
             lambda t, d, a: nisa.dma_copy(dst=d, src=a["src"]), lambda x, a: x),
    InKernel("nisa.tensor_reduce", {"axis": ("axis", 1), "negate": ("bool", False), "keepdims": ("bool", True)},
             lambda t, d, a: (nisa.tensor_reduce(dst=d[:, 0:1], op=nl.add, data=t, axis=a["axis"], negate=a["negate"],
                                                 keepdims=a["keepdims"]), nisa.memset(d[:, 1:F], 0.0)),
             lambda x, a: np.concatenate([(-1 if a["negate"] else 1) * x.sum(1, keepdims=True), np.zeros((P, F - 1))],
                                         axis=1)),
    InKernel("nl.multiply", {"x": ("tile", SAME_TILE), "y": ("number", 2.0)},
             lambda t, d, a: nisa.tensor_copy(d, nl.multiply(a["x"], a["y"])),
             lambda x, a: x * float(a["y"])),
    InKernel("nisa.activation", {"scale": ("number", 1.0), "bias": ("number?", 0.0)},
             lambda t, d, a: nisa.activation(dst=d, op=nl.copy, data=t, scale=a["scale"], bias=a["bias"]),
             lambda x, a: x * float(a["scale"]) + float(a["bias"] or 0.0)),
    InKernel("nisa.memset", {"value": ("number", 3.0)}, lambda t, d, a: _fill(d, a["value"]),
             lambda x, a: np.full((P, F), float(a["value"]))),
    InKernel("nisa.iota", {"offset": ("int", 0), "channel_multiplier": ("int", 0)},
             lambda t, d, a: nisa.iota(d, [[1, F]], offset=a["offset"], channel_multiplier=a["channel_multiplier"]),
             lambda x, a: np.tile(np.arange(F), (P, 1)) + int(a["offset"]) + np.arange(P)[:, None] *
             int(a["channel_multiplier"]), out_dtype=nl.int32),
    InKernel("nl.add", {"y": ("number", 2.0)}, lambda t, d, a: nisa.tensor_copy(d, nl.add(t, a["y"])),
             lambda x, a: x + float(a["y"])),
    InKernel("nl.full", {"fill_value": ("number", 1.5), "shape": ("shape", (P, F))},
             lambda t, d, a: nisa.tensor_copy(d, nl.full(a["shape"], a["fill_value"], nl.float32)),
             lambda x, a: np.full((P, F), float(a["fill_value"]))),
    InKernel("nl.ndarray", {"shape": ("shape", (P, F)), "dtype": ("dtype", nl.float32)},
             lambda t, d, a: (nisa.memset(nl.ndarray(a["shape"], a["dtype"]), 1.0), nisa.memset(d, 1.0)),
             lambda x, a: np.ones((P, F))),
    InKernel("nl.sum", {"axis": ("axis", 1)},
             lambda t, d, a: nisa.tensor_copy(d, nl.sum(t, axis=a["axis"], keepdims=True).broadcast_to((P, F))),
             lambda x, a: np.repeat(x.sum(axis=1, keepdims=True), F, axis=1)),
    InKernel("nl.ds", {"start": ("int", 0), "size": ("int", F)},
             lambda t, d, a: nisa.tensor_copy(d, t[:, nl.ds(a["start"], a["size"])]),
             lambda x, a: x),
    InKernel("subscript", {"stop": ("slice stop", F), "step": ("slice step", 1)},
             lambda t, d, a: nisa.tensor_copy(d, t[:, 0:a["stop"]:a["step"]]),
             lambda x, a: x, aliases={"stop": ("subscript", "slice"), "step": ("slice",)}),
    InKernel("reshape", {"shape": ("shape", (P, F))},
             lambda t, d, a: nisa.tensor_copy(d, t.reshape(a["shape"])), lambda x, a: x),
]
# The pools for kinds the in-kernel entries use with a tile or a register in hand.
KIND_POOLS = {"number": NUMBERS, "number?": OPTIONAL_NUMBERS, "finite": FINITE_NUMBERS, "optional": OPTIONAL_FINITE,
              "bool": BOOLS, "int": INTS, "axis": AXES,
              "operator": OPERATORS, "shape": SHAPES, "dtype": DTYPES, "slice stop": SLICE_STOPS,
              "slice step": SLICE_STEPS, "tensor": TENSORS, "tensor?": OPTIONAL_TENSORS, "tile": TILES}
TARGETS = [Bad("None", _const(None), True), Bad("unknown", _const("trn9")), Bad("int", _const(2)),
           Bad("trn1", _const("trn1"), True)]
SPECS = [Bad("None", _const(None)), Bad("str", _const("x")), Bad("array", lambda s: np.ones(s.shape, np.float32), True),
         Bad("float64 array", lambda s: np.ones(s.shape)), Bad("empty", lambda s: np.ones((0, F), np.float32)),
         Bad("rank 9", lambda s: np.ones((1,) * 9, np.float32))]


def entries() -> list:
    found = [JitAdd(), JitScale(), JitWrite(), JitGrid(), Spec(), Estimate(), *TORCH_FUNCTIONS, *IN_KERNEL]
    for kernel in library_kernels().values():
        found += [Library(kernel, False), Library(kernel, True)]
    return found


# --- one case ------------------------------------------------------------------------------------------

Case = collections.namedtuple("Case", "index entry slot bad")


def draw(index: int, all_entries: list) -> Case:
    rng = random.Random(SEED * 1_000_003 + index)
    entry = rng.choice(all_entries)
    args = entry.arguments(np.random.default_rng([SEED, index]))
    slot = rng.choice(sorted(args))
    kind = args[slot][0]
    pool = {"target": TARGETS, "spec": SPECS}.get(kind) or KIND_POOLS[kind]
    return Case(index, entry, slot, rng.choice(pool))


def _plain(value):
    """The value a valid replacement stands for, in its plainest form: a C-ordered native copy of an
    array or tensor, a Python scalar for a numpy one."""
    if isinstance(value, torch.Tensor):
        return value.detach().contiguous().clone()
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("="))
    return value.item() if isinstance(value, np.generic) else value


def _same_scalar(a, b) -> bool:
    """Whether two scalar arguments are the same number (None and NaN both stand for None)."""
    def number(x):
        if x is None:
            return None
        try:
            v = float(x)
        except (TypeError, ValueError):
            return x
        return None if math.isnan(v) else v
    return number(a) == number(b)


def _in_type_of(value, base):
    """`base` converted to the type of the number `value` (a bool stays as drawn), or None when that
    type cannot hold it."""
    if isinstance(value, (bool, np.bool_)) or base is None:
        return value
    try:
        return type(value)(base)
    except (TypeError, ValueError, OverflowError):
        return None


def _error_text(err) -> str:
    if isinstance(err, nki.KernelError):
        return "\n".join([err.summary, err.limit, err.hint])
    return str(err)


def _results(value) -> list:
    values = value if isinstance(value, (tuple, list)) else [value]
    return [_as_numpy(v) for v in values]


def _tolerance(*values) -> float:
    """Relative and absolute tolerance against a float64 reference: the engines compute in fp32 over
    reductions of at most a few hundred terms (1e-4); a bf16 or fp16 input or result carries its
    rounding (2^-8 relative for bf16) through the maths (2e-2)."""
    names = {str(getattr(v, "dtype", "")) for v in values}
    return 2e-2 if any(n.endswith(("bfloat16", "float16")) for n in names) else 1e-4


def _writable_anyway(label: str, value, entry):
    """Whether a value made by a NOT_WRITABLE maker may be written in place after all (False: it
    must be refused; None: either outcome is right). An expand of a first dim that is 1 changes
    nothing; whether torch's own op takes a mutated argument that requires grad is torch's rule."""
    if label == "torch expanded":
        return not any(stride == 0 and n > 1 for stride, n in zip(value.stride(), value.shape))
    return None if label == "torch requires grad" and entry.torch_facing else False


def run_case(case: Case) -> tuple:
    """(verdict, detail): verdict is "error ok", "result ok", "skipped" or "defect"."""
    entry, slot, bad = case.entry, case.slot, case.bad
    arguments = entry.arguments(np.random.default_rng([SEED, case.index]))
    kind = arguments[slot][0]
    args = {k: v for k, (_kind, v) in arguments.items()}
    is_tensor = kind.startswith("tensor")
    base = args[slot]
    try:
        args[slot] = make_tensor(bad, base) if is_tensor else bad.make(base)
    except Exception as err:  # a value this base cannot take (e.g. an object array of a bf16 one)
        return "skipped", f"{type(err).__name__}: {err}"
    value = args[slot]
    valid = True if (slot, bad.label) in getattr(entry, "valid_labels", ()) else bad.valid
    if isinstance(entry, Library) and valid is True and kind in ("finite", "int"):
        # The kind of the number is what is fuzzed, and a library parameter may bound its range
        # (adamw's beta1 < 1, step >= 1): the drawn type carries the example's value where it can
        # hold it, and where it cannot, an error naming the parameter is as right as a result.
        args[slot] = value = _in_type_of(value, base)
        valid = True if value is not None and math.isclose(float(value), float(base), rel_tol=1e-6) else None
        if value is None:
            return "skipped", f"a {bad.label} cannot stand for {base!r}"
    if isinstance(entry, Library) and valid is True and kind == "optional" and not _same_scalar(value, base):
        # An optional number other than the example's may lie outside the parameter's domain
        # (embedding's padding_idx is a row of the table): an error naming it is as right as a result.
        valid = None
    if entry.torch_facing and isinstance(entry, Library) and kind in ("bool", "int", "finite", "optional"):
        # torch's schema parser converts scalars before nikki sees them (True is 1.0 where a float
        # goes and 1 where an int goes, a number is a bool where a bool goes, None is the
        # parameter's default): whether such a
        # value is taken is torch's rule, what nikki then computes must still be right. A value
        # other than the example's may also be out of the parameter's range (embedding's
        # padding_idx lies in [-V, V)): then an error naming the parameter is as right as a result.
        valid = True if bad.valid and _same_scalar(value, base) else None
    if is_tensor and isinstance(value, np.ndarray) and not entry.accepts_numpy:
        valid = False  # a numpy array where a torch function takes a tensor
    if entry.writable(slot) and bad.label in NOT_WRITABLE:
        valid = _writable_anyway(bad.label, value, entry)
    meta = bad.label == "meta" and entry.torch_facing
    try:
        result = entry.call(args)
    except ACCEPTED_ERRORS as err:
        text = _error_text(err)
        if "internal error" in text:
            return "defect", f"internal error: {text}"
        if valid is True:
            return "defect", f"a valid value was rejected: {type(err).__name__}: {text}"
        if any(name in text for name in entry.names(slot)):
            return "error ok", type(err).__name__
        if entry.located_ok(slot) and isinstance(err, nki.KernelError) and err.file == __file__:
            return "error ok", "located"
        if entry.torch_facing and isinstance(err, NotImplementedError) and "backend" in text:
            return "error ok", "torch dispatcher"  # torch finds no kernel of the op for the tensor's backend
        return "defect", f"the error names neither '{slot}' nor a kernel line: {type(err).__name__}: {text}"
    except RuntimeError as err:
        text = str(err)
        if entry.torch_facing and "Expected a value of type" in text and f"argument '{slot}'" in text:
            return "error ok", "torch schema"  # torch's own argument parsing names the argument
        return "defect", f"RuntimeError: {text}\n{traceback.format_exc()}"
    except Exception as err:  # noqa: BLE001 - every other exception type is a defect of the message
        return "defect", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
    if meta:  # torch dispatched the op to its fake implementation: shapes only
        results = result if isinstance(result, (tuple, list)) else [result]
        ok = all(isinstance(r, torch.Tensor) and r.device.type == "meta" for r in results)
        return ("result ok", "meta") if ok else ("defect", "a meta input gave a result that is not on meta")
    if valid is False:
        return "defect", f"an invalid value was accepted and returned {type(result).__name__}"
    got = _results(result)
    tolerance = _tolerance(*args.values(), *(result if isinstance(result, (tuple, list)) else [result]))
    expected = entry.reference(args)
    if expected is None:  # no independent reference: the result of the plain value, bit for bit
        return _compare(got, _results(entry.call({**args, slot: _plain(value)})))
    expected = expected if isinstance(expected, (list, tuple)) else [expected]
    return _compare(got, [e.detach().numpy() if isinstance(e, torch.Tensor) else np.asarray(e) for e in expected],
                    tolerance)


def _compare(got: list, expected: list, tolerance: float = 0.0) -> tuple:
    """Results against expected values within `tolerance` (0: bit for bit)."""
    if len(got) < len(expected):
        return "defect", f"{len(got)} results, expected {len(expected)}"
    for g, e in zip(got, expected):
        if g.shape != e.shape and g.size == e.size:
            g = g.reshape(e.shape)
        if g.shape != e.shape:
            return "defect", f"result shape {g.shape}, expected {e.shape}"
        g64, e64 = g.astype(np.float64), e.astype(np.float64)
        if not np.allclose(g64, e64, rtol=tolerance, atol=tolerance, equal_nan=True):
            worst = np.nanmax(np.abs(g64 - e64)) if g64.size else 0
            return "defect", f"result differs from the reference (max abs diff {worst})"
    return "result ok", ""


# --- the test ---------------------------------------------------------------------------------------

def _forget_compiled() -> None:
    """Drops the specializations the fuzzed kernels compiled: each holds an executor with its own
    simulated memories, and a long run compiles one per distinct constant it passes."""
    nki.clear_cache()
    # A CPU call compiled again, so that a meta tensor next meets a cached specialization (the
    # launch, not the compile, must then refuse it).
    jit_add(torch.ones(P, F), torch.ones(P, F))


def fuzz(cases: int, seed_indices=None, out=sys.stderr) -> tuple:
    """Runs the cases; (tally of verdicts, descriptions of the defects)."""
    all_entries = entries()
    tally, defects = collections.Counter(), []
    indices = seed_indices if seed_indices is not None else range(cases)
    _forget_compiled()
    for index in indices:
        case = draw(index, all_entries)
        verdict, detail = run_case(case)
        if index % 100 == 99:
            _forget_compiled()
        tally[verdict] += 1
        if verdict == "defect":
            defects.append(f"case {index}: {case.entry.name} {case.slot}={case.bad.label}: {detail}")
    for line in defects:
        print(line, file=out)
    return tally, defects


def test_bad_inputs_fuzz():
    indices = [int(i) for i in ONLY.split(",")] if ONLY else None
    tally, defects = fuzz(CASES, indices)
    print(f"\nbad-input fuzz: seed {SEED}, {sum(tally.values())} cases: {dict(tally)}")
    assert not defects, f"{len(defects)} defects; first ones:\n" + "\n".join(d[:1500] for d in defects[:10])
