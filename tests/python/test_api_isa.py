"""nki.isa against numpy: every instruction in ``nikki.isa.__all__``, in the current
destination-passing style (``dst`` first, NKI parameter names usable as keywords) and in the legacy
functional style (returns a tile, ``dtype=`` casts the result).

Tolerances, by how the engines compute (docs/numerics.md):
- exact (assert_array_equal): data movement, fp32 add/subtract/multiply/min/max/compare (one fp32
  rounding, as numpy does for float32 arrays), integer and bitvec ops, selections, iota.
- rtol 2e-7 (one fp32 rounding): activation functions, evaluated in double and rounded once to fp32,
  compared with a float64 numpy formula.
- rtol 1e-5: fp32 matmul / reductions / statistics against float64 references, or where the
  summation order differs from numpy's pairwise summation (K <= 128 terms of fp32 round-off);
  tensor_reduce's fp32 add uses numpy's order, and one test checks it bit for bit.
- bf16 results: exact against ml_dtypes' round-to-nearest-even cast of the fp32 result.
"""

import inspect
import math

import ml_dtypes
import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

BF16 = ml_dtypes.bfloat16


# --- helpers (traced inside kernels, so they are the "user's" code) ---------------------------

def load(x, dtype=None):
    """HBM input -> a new SBUF tile of the same shape."""
    t = nl.ndarray(x.shape, dtype or x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def store(t):
    """On-chip tile -> a new shared_hbm output (PSUM is staged through SBUF)."""
    if t.buffer == nl.psum:
        s = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=t)
        t = s
    out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def f32(rng, *shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


# --- data movement ----------------------------------------------------------------------------

def test_dma_copy_keywords_and_positional(rng):
    @nki.jit
    def k(a):
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(out, t)
        return out

    a = f32(rng, 64, 96)
    np.testing.assert_array_equal(k(a), a)  # a copy is bit-exact


def test_dma_copy_converts_dtype_round_to_nearest_even(rng):
    @nki.jit
    def k(a):
        t = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)  # fp32 -> bf16 through the DMA
        out = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    a = f32(rng, 32, 64)
    out = k(a)
    assert out.dtype == BF16
    np.testing.assert_array_equal(out, a.astype(BF16))  # RNE, as ml_dtypes


def test_dma_copy_between_hbm_views(rng):
    @nki.jit
    def k(a):
        out = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a.permute((1, 0)))  # HBM -> HBM, strided read
        return out

    a = f32(rng, 16, 24)
    np.testing.assert_array_equal(k(a), a.T)


@pytest.mark.parametrize("style", ["current", "current_kw", "legacy", "legacy_dtype"])
def test_tensor_copy(rng, style):
    @nki.jit
    def k(a):
        x = load(a)
        if style == "current":
            y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(y, x)
        elif style == "current_kw":
            y = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.sbuf)
            nisa.tensor_copy(dst=y, src=x, engine=nisa.engine.gpsimd)
        elif style == "legacy":
            y = nisa.tensor_copy(x)
        else:
            y = nisa.tensor_copy(x, dtype=nl.bfloat16)
        return store(y)

    a = f32(rng, 128, 64)
    out = k(a)
    if style in ("current", "legacy"):
        np.testing.assert_array_equal(out, a)
    else:
        assert out.dtype == BF16
        np.testing.assert_array_equal(out, a.astype(BF16))


# --- element-wise -----------------------------------------------------------------------------

TT_OPS = [
    (nl.add, np.add), (nl.subtract, np.subtract), (nl.multiply, np.multiply), (nl.maximum, np.maximum),
    (nl.minimum, np.minimum), (nl.equal, np.equal), (nl.not_equal, np.not_equal), (nl.greater, np.greater),
    (nl.greater_equal, np.greater_equal), (nl.less, np.less), (nl.less_equal, np.less_equal),
    (np.add, np.add), (np.maximum, np.maximum),
]


@pytest.mark.parametrize("op,ref", TT_OPS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_tensor_tensor_ops_exact(rng, op, ref):
    @nki.jit
    def k(a, b):
        x, y = load(a), load(b)
        d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=x, data2=y, op=op)
        return store(d)

    a = f32(rng, 128, 32)
    b = f32(rng, 128, 32)
    b[:, :4] = a[:, :4]  # some equal elements for the comparisons
    np.testing.assert_array_equal(k(a, b), ref(a, b).astype(np.float32))


def test_tensor_tensor_legacy_dtype_and_positional(rng):
    @nki.jit
    def k(a, b):
        x, y = load(a), load(b)
        s = nisa.tensor_tensor(x, y, nl.add)  # legacy: returns a tile of the wider input dtype
        p = nisa.tensor_tensor(x, y, op=nl.multiply, dtype=nl.bfloat16)
        return store(s), store(p)

    a, b = f32(rng, 64, 48), f32(rng, 64, 48)
    s, p = k(a, b)
    assert s.dtype == np.float32 and p.dtype == BF16
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(p, (a * b).astype(BF16))  # fp32 product rounded once to bf16


def test_tensor_tensor_power_on_gpsimd(rng):
    @nki.jit
    def k(a, b):
        d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(d, load(a), load(b), nl.power)
        return store(d)

    a = f32(rng, 32, 16, lo=0.5, hi=2.0)
    b = f32(rng, 32, 16, lo=-2.0, hi=2.0)
    # pow is evaluated in double and rounded once to fp32
    np.testing.assert_allclose(k(a, b), np.power(a.astype(np.float64), b), rtol=2e-7)


def test_tensor_tensor_int32_exact_and_bitwise(rng):
    @nki.jit
    def k(a, b):
        x, y = load(a), load(b)
        s = nl.ndarray(a.shape, nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s, data1=x, data2=y, op=nl.add, engine=nisa.engine.gpsimd)
        band = nl.ndarray(a.shape, nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=band, data1=x, data2=y, op=nl.bitwise_and)
        bxor = nisa.tensor_tensor(x, y, nl.bitwise_xor)
        return store(s), store(band), store(bxor)

    a = rng.integers(-2**30, 2**30, size=(16, 32), dtype=np.int32)
    b = rng.integers(-2**30, 2**30, size=(16, 32), dtype=np.int32)
    s, band, bxor = k(a, b)
    np.testing.assert_array_equal(s, a + b)  # GpSimd int32 arithmetic is exact
    np.testing.assert_array_equal(band, a & b)
    np.testing.assert_array_equal(bxor, a ^ b)


@pytest.mark.parametrize("style", ["current", "legacy"])
def test_tensor_scalar_two_ops_reverse_and_vector_operand(rng, style):
    @nki.jit
    def k(a, v):
        x, col = load(a), load(v)
        if style == "current":
            d1 = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=d1, data=x, op0=nl.multiply, operand0=3.0, op1=nl.add, operand1=-1.5)
            d2 = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(d2, x, nl.subtract, 10.0, reverse0=True)  # 10 - x
            d3 = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(d3, x, nl.subtract, col, op1=nl.maximum, operand1=0.0)  # [P, 1] operand
        else:
            d1 = nisa.tensor_scalar(x, nl.multiply, 3.0, op1=nl.add, operand1=-1.5)
            d2 = nisa.tensor_scalar(x, nl.subtract, 10.0, reverse0=True)
            d3 = nisa.tensor_scalar(data=x, op0=nl.subtract, operand0=col, op1=nl.maximum, operand1=0.0,
                                    dtype=nl.float32)
        return store(d1), store(d2), store(d3)

    a = f32(rng, 128, 40)
    v = f32(rng, 128, 1)
    d1, d2, d3 = k(a, v)
    np.testing.assert_array_equal(d1, (a * np.float32(3.0)) + np.float32(-1.5))
    np.testing.assert_array_equal(d2, np.float32(10.0) - a)
    np.testing.assert_array_equal(d3, np.maximum(a - v, np.float32(0.0)))


def test_tensor_scalar_bitvec_shift(rng):
    @nki.jit
    def k(a):
        d = nl.ndarray(a.shape, nl.uint32, buffer=nl.sbuf)
        nisa.tensor_scalar(d, load(a), nl.left_shift, 3, op1=nl.bitwise_or, operand1=1)
        return store(d)

    a = rng.integers(0, 2**20, size=(8, 16), dtype=np.uint32)
    np.testing.assert_array_equal(k(a), (a << 3) | 1)


@pytest.mark.parametrize("style", ["current", "legacy"])
def test_scalar_tensor_tensor(rng, style):
    @nki.jit
    def k(a, b):
        x, y = load(a), load(b)
        if style == "current":
            d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            nisa.scalar_tensor_tensor(dst=d, data=x, op0=nl.multiply, operand0=2.0, op1=nl.subtract, operand1=y)
            r = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            nisa.scalar_tensor_tensor(r, x, nl.subtract, 1.0, nl.subtract, y, reverse0=True, reverse1=True)
        else:
            d = nisa.scalar_tensor_tensor(data=x, op0=nl.multiply, operand0=2.0, op1=nl.subtract, operand1=y)
            r = nisa.scalar_tensor_tensor(data=x, op0=nl.subtract, operand0=1.0, op1=nl.subtract, operand1=y,
                                          reverse0=True, reverse1=True)
        return store(d), store(r)

    a, b = f32(rng, 64, 32), f32(rng, 64, 32)
    d, r = k(a, b)
    np.testing.assert_array_equal(d, a * np.float32(2.0) - b)
    np.testing.assert_array_equal(r, b - (np.float32(1.0) - a))


@pytest.mark.parametrize("executor", ["interp", "native"])
def test_vector_operands_of_any_dtype(rng, executor, monkeypatch):
    """NKI casts every input of tensor_scalar, tensor_scalar_reduce and scalar_tensor_tensor to
    fp32 ("All input tiles can be any supported NKI data type"): bf16 [P, 1] vectors, as the MoE
    kernels of NKI's library pass them, give the fp32 computation's values."""
    monkeypatch.setenv("NIKKI_EXECUTOR", executor)

    @nki.jit
    def k(a, s, b):
        x, v, y = load(a), load(s), load(b)
        d = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=d, data=x, op0=nl.multiply, operand0=v, op1=nl.add, operand1=y)
        e = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=e, data=x, op0=nl.subtract, operand0=v, op1=nl.multiply, operand1=v)
        f = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=f, data=x, op0=nl.add, operand0=v, reduce_op=nl.add, reduce_res=total)
        return store(d), store(e), store(total)

    a, s, b = (f32(rng, *shape).astype(BF16) for shape in ((96, 40), (96, 1), (96, 40)))
    x, v, y = a.astype(np.float32), s.astype(np.float32), b.astype(np.float32)
    d, e, total = k(a, s, b)
    np.testing.assert_array_equal(d, (x * v + y).astype(BF16))
    np.testing.assert_array_equal(e, (x - v) * v)
    # the reduction's order is the engine's: fp32 sums of 40 terms of size < 4 agree to 1e-5
    np.testing.assert_allclose(total[:, 0], (x + v).astype(np.float64).sum(axis=1), rtol=0, atol=1e-4)


def _np_act(name, x):
    x = x.astype(np.float64)
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    erf = np.vectorize(math.erf)
    table = {
        "copy": x, "exp": np.exp(x), "tanh": np.tanh(x), "sigmoid": sig(x), "relu": np.maximum(x, 0),
        "gelu": 0.5 * x * (1 + erf(x / math.sqrt(2))), "silu": x * sig(x), "square": x * x,
        "softplus": np.log1p(np.exp(x)), "erf": erf(x), "sin": np.sin(x), "arctan": np.arctan(x),
        "sign": np.sign(x), "abs": np.abs(x),
        "gelu_apprx_tanh": 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    }
    return table[name]


def _activation_kernel(op):
    """A kernel applying activation function `op` to its input (float32 out)."""
    @nki.jit
    def k(a):
        d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=d, op=op, data=load(a))
        return store(d)

    return k


@pytest.mark.parametrize("name", ["copy", "exp", "tanh", "sigmoid", "relu", "gelu", "silu", "square", "softplus",
                                  "erf", "sin", "arctan", "sign", "abs", "gelu_apprx_tanh"])
def test_activation_functions_current(rng, name):
    a = f32(rng, 128, 64, lo=-3.0, hi=3.0)
    np.testing.assert_allclose(_activation_kernel(getattr(nl, name))(a), _np_act(name, a), rtol=2e-7, atol=1e-30)


@pytest.mark.parametrize("name", ["gelu", "gelu_dx"])
def test_gelu_negative_tail_keeps_its_relative_accuracy(name):
    """gelu and gelu_dx at x <= -5, where 1 + erf(x / sqrt 2) cancels: within 2 fp32 ulps of the
    float64 formula written with erfc (tiny results, not 0)."""
    a = -np.linspace(5.0, 12.0, 64, dtype=np.float32).reshape(1, 64)
    x = a[0].astype(np.float64)
    phi_tail = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x])  # Φ(x) without cancellation
    ref = x * phi_tail if name == "gelu" else phi_tail + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    got = _activation_kernel(getattr(nl, name))(a)[0].astype(np.float64)
    assert (got != 0).all()
    np.testing.assert_allclose(got, ref, rtol=2 * 2.0 ** -23)  # 2 ulps: libm's erfc, one fp32 rounding


def test_activation_bias_scale_and_reduce(rng):
    @nki.jit
    def k(a, bias):
        x, b = load(a), load(bias)
        d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=d, op=nl.exp, data=x, bias=b, scale=0.5, reduce_op=nl.add, reduce_res=total,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        v = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(v, nl.copy, x, scale=b)  # [P, 1] vector scale
        return store(d), store(total), store(v)

    a = f32(rng, 128, 64)
    bias = f32(rng, 128, 1)
    d, total, v = k(a, bias)
    ref = np.exp(a.astype(np.float64) * 0.5 + bias)
    np.testing.assert_allclose(d, ref, rtol=3e-7)  # fma in fp32 then exp rounded once
    np.testing.assert_allclose(total, ref.sum(axis=1, keepdims=True), rtol=1e-5)  # fp32 running sum
    np.testing.assert_array_equal(v, a * bias)


def test_activation_legacy_returns_tile_with_dtype(rng):
    @nki.jit
    def k(a):
        x = load(a)
        y = nisa.activation(op=nl.tanh, data=x, bias=None, scale=2.0)
        z = nisa.activation(nl.exp, x, dtype=nl.bfloat16)
        return store(y), store(z)

    a = f32(rng, 32, 64)
    y, z = k(a)
    np.testing.assert_allclose(y, np.tanh(2.0 * a.astype(np.float64)), rtol=2e-7)
    assert z.dtype == BF16
    # exp rounded to fp32 then to bf16: within one bf16 ulp of the exact value
    np.testing.assert_allclose(z.astype(np.float32), np.exp(a), rtol=2 ** -8)


@pytest.mark.parametrize("style", ["current", "legacy"])
def test_activation_reduce(rng, style):
    @nki.jit
    def k(a):
        x = load(a)
        res = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
        if style == "current":
            d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            nisa.activation_reduce(dst=d, op=nl.square, data=x, reduce_op=nl.add, reduce_res=res, scale=1.0)
        else:
            d = nisa.activation_reduce(op=nl.square, data=x, reduce_op=nl.add, reduce_res=res)
        return store(d), store(res)

    a = f32(rng, 64, 100)
    d, res = k(a)
    np.testing.assert_array_equal(d, a * a)
    np.testing.assert_allclose(res, (a.astype(np.float64) ** 2).sum(1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("style", ["current", "legacy"])
def test_reciprocal(rng, style):
    @nki.jit
    def k(a):
        x = load(a)
        if style == "current":
            d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            nisa.reciprocal(dst=d, data=x)
        else:
            d = nisa.reciprocal(x)
        return store(d)

    a = f32(rng, 64, 16, lo=0.5, hi=4.0)
    np.testing.assert_array_equal(k(a), np.float32(1.0) / a)  # one fp32 division


# --- reductions and scans ---------------------------------------------------------------------

@pytest.mark.parametrize("shape,axis,keepdims", [((32, 6, 10), 2, False), ((32, 6, 10), -1, True),
                                                 ((32, 6, 10), (1, 2), False), ((32, 6, 10), [1, 2], True),
                                                 ((64, 50), 1, False)])
def test_tensor_reduce_axes_current(rng, shape, axis, keepdims):
    """NKI reduces the last free axes (a suffix ending at the final dim)."""
    a = f32(rng, *shape)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    ref = a.astype(np.float64).sum(axis=tuple(ax % a.ndim for ax in axes), keepdims=keepdims)
    if ref.ndim < 2:
        ref = ref.reshape(ref.shape[0], 1)

    @nki.jit
    def k(x_in):
        x = load(x_in)
        d = nl.ndarray(ref.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=d, op=nl.add, data=x, axis=axis, keepdims=keepdims)
        return store(d)

    np.testing.assert_allclose(k(a), ref, rtol=1e-5, atol=1e-6)  # fp32 pairwise sum against float64


def test_tensor_reduce_add_is_numpys_float32_sum_bit_for_bit(rng):
    """tensor_reduce sums in numpy's pairwise order (docs/numerics.md, "Reduction order"), so over
    contiguous rows it equals np.add.reduce exactly: short rows, whole blocks of 8 with leftovers,
    and the recursive halving above 128 elements."""
    lengths = (1, 2, 7, 8, 9, 16, 100, 127, 128, 129, 136, 255, 256, 257, 1000, 1031, 2048, 3000)
    # magnitudes over a few binades, so that a different order of the roundings shows
    a = (rng.standard_normal((64, 3000)) * np.exp2(rng.integers(0, 12, (64, 3000)))).astype(np.float32)

    @nki.jit
    def k(x_in):
        x = load(x_in)
        d = nl.ndarray((x_in.shape[0], len(lengths)), nl.float32, buffer=nl.sbuf)
        for c, n in enumerate(lengths):
            nisa.tensor_reduce(dst=d[:, c:c + 1], op=nl.add, data=x[:, 0:n], axis=1, keepdims=True)
        return store(d)

    got = k(a)
    for c, n in enumerate(lengths):
        want = np.add.reduce(np.ascontiguousarray(a[:, :n]), axis=1)
        np.testing.assert_array_equal(got[:, c].view(np.uint32), want.view(np.uint32), err_msg=f"{n} elements")


def test_tensor_reduce_max_negate_and_legacy(rng):
    @nki.jit
    def k(a):
        x = load(a)
        d = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(d, nl.maximum, x, axis=1, negate=True)
        m = nisa.tensor_reduce(nl.minimum, x, axis=(1,))
        p = nisa.tensor_reduce(op=np.multiply, data=x, axis=1, keepdims=True, dtype=nl.float32)
        return store(d), store(m), store(p)

    a = f32(rng, 128, 12, lo=0.5, hi=1.5)
    d, m, p = k(a)
    np.testing.assert_array_equal(d[:, 0], -a.max(axis=1))
    np.testing.assert_array_equal(m.reshape(-1), a.min(axis=1))
    np.testing.assert_allclose(p[:, 0], np.prod(a.astype(np.float64), axis=1), rtol=1e-6)


def test_tensor_reduce_bitwise_or_int(rng):
    @nki.jit
    def k(a):
        d = nl.ndarray((a.shape[0], 1), nl.int32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=d, op=nl.bitwise_or, data=load(a), axis=1)
        return store(d)

    a = rng.integers(0, 2**16, size=(16, 8), dtype=np.int32)
    np.testing.assert_array_equal(k(a)[:, 0], np.bitwise_or.reduce(a, axis=1))


@pytest.mark.parametrize("style", ["current", "legacy"])
def test_tensor_scalar_reduce(rng, style):
    @nki.jit
    def k(a):
        x = load(a)
        res = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
        if style == "current":
            d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar_reduce(dst=d, data=x, op0=nl.multiply, operand0=2.0, reduce_op=nl.maximum,
                                      reduce_res=res)
        else:
            d = nisa.tensor_scalar_reduce(data=x, op0=nl.multiply, operand0=2.0, reduce_op=nl.maximum,
                                          reduce_res=res)
        return store(d), store(res)

    a = f32(rng, 64, 30)
    d, res = k(a)
    np.testing.assert_array_equal(d, a * np.float32(2))
    np.testing.assert_array_equal(res[:, 0], (a * np.float32(2)).max(axis=1))


@pytest.mark.parametrize("style", ["current", "legacy"])
def test_tensor_tensor_scan(rng, style):
    @nki.jit
    def k(a, b):
        x, y = load(a), load(b)
        if style == "current":
            d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor_scan(dst=d, data0=x, data1=y, initial=0.5, op0=nl.multiply, op1=nl.add)
        else:
            d = nisa.tensor_tensor_scan(x, y, 0.5, nl.multiply, nl.add)
        return store(d)

    a, b = f32(rng, 16, 20, lo=0, hi=1), f32(rng, 16, 20)
    ref = np.empty_like(a)
    prev = np.full(a.shape[0], 0.5, dtype=np.float32)
    for i in range(a.shape[1]):  # res[i] = data0[i] * res[i-1] + data1[i], in fp32
        prev = a[:, i] * prev + b[:, i]
        ref[:, i] = prev
    np.testing.assert_array_equal(k(a, b), ref)


@pytest.mark.parametrize("style", ["current", "legacy"])
@pytest.mark.parametrize("op,ref", [(nl.add, np.sum), (nl.maximum, np.max)])
def test_tensor_partition_reduce(rng, style, op, ref):
    @nki.jit
    def k(a):
        x = load(a)
        if style == "current":
            d = nl.ndarray((1, a.shape[1]), nl.float32, buffer=nl.sbuf)
            nisa.tensor_partition_reduce(dst=d, op=op, data=x)
        else:
            d = nisa.tensor_partition_reduce(op, x)
        return store(d)

    a = f32(rng, 32, 24)
    np.testing.assert_allclose(k(a)[0], ref(a.astype(np.float64), axis=0), rtol=1e-5, atol=1e-6)


# --- statistics -------------------------------------------------------------------------------

@pytest.mark.parametrize("style", ["current", "legacy"])
def test_bn_stats_bn_aggr_mean_and_variance(rng, style):
    @nki.jit
    def k(a):
        x = load(a)
        if style == "current":
            stats = nl.ndarray((a.shape[0], 6), nl.float32, buffer=nl.sbuf)
            nisa.bn_stats(dst=stats, data=x)
            mv = nl.ndarray((a.shape[0], 2), nl.float32, buffer=nl.sbuf)
            nisa.bn_aggr(dst=mv, data=stats)
        else:
            stats = nisa.bn_stats(x)
            mv = nisa.bn_aggr(stats)
        return store(stats), store(mv)

    a = f32(rng, 128, 64, lo=-1, hi=3)
    stats, mv = k(a)
    a64 = a.astype(np.float64)
    even, odd = a64[:, 0::2], a64[:, 1::2]
    np.testing.assert_array_equal(stats[:, 0], 32)
    np.testing.assert_allclose(stats[:, 1], even.mean(1), rtol=1e-5)
    np.testing.assert_allclose(stats[:, 2], even.var(1) * 32, rtol=1e-4)  # Welford in fp32
    np.testing.assert_allclose(stats[:, 4], odd.mean(1), rtol=1e-5)
    np.testing.assert_allclose(mv[:, 0], a64.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mv[:, 1], a64.var(1), rtol=1e-4)


def test_bn_aggr_of_several_chunks(rng):
    """Layernorm-style statistics of a row longer than bn_stats_fmax: bn_stats per chunk, one bn_aggr."""
    @nki.jit
    def k(a):
        x = load(a)
        chunks = a.shape[1] // nl.tile_size.bn_stats_fmax
        stats = nl.ndarray((a.shape[0], 6 * chunks), nl.float32, buffer=nl.sbuf)
        for c in range(chunks):
            f = nl.tile_size.bn_stats_fmax
            nisa.bn_stats(stats[:, 6 * c:6 * c + 6], x[:, c * f:(c + 1) * f])
        mv = nl.ndarray((a.shape[0], 2), nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(mv, stats)
        return store(mv)

    a = f32(rng, 16, 1024)
    mv = k(a)
    np.testing.assert_allclose(mv[:, 0], a.astype(np.float64).mean(1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mv[:, 1], a.astype(np.float64).var(1), rtol=1e-4)


def test_bn_stats_and_bn_aggr_nan_results_are_canonical(rng, monkeypatch):
    """Rows with infinities and NaNs of both signs: every NaN statistic is 0x7fc00000, as ALU
    results are, so the reference interpreter and the native routines agree bit for bit (which
    NaN an IEEE operation passes on depends on the compiler's operand order)."""
    def k(a):
        stats = nl.ndarray((a.shape[0], 6), nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(dst=stats, data=load(a))
        mv = nl.ndarray((a.shape[0], 2), nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=stats)
        return store(stats), store(mv)

    _check_canonical_nans_on_both_executors(k, [_specials(rng, 128, 12)], monkeypatch)


def test_activation_accumulator_nan_is_canonical(rng, monkeypatch):
    """Rows whose activation sums meet inf + -inf or a NaN: the accumulator, and so reduce_res,
    holds 0x7fc00000 on both executors."""
    def k(a):
        x = load(a)
        y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=y, op=nl.copy, data=x, reduce_op=nl.add, reduce_res=total,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return store(total)

    _check_canonical_nans_on_both_executors(k, [_specials(rng, 128, 9)], monkeypatch)


def _specials(rng, *shape):
    """fp32 values drawn from infinities, NaNs of both signs and two numbers."""
    return rng.choice(np.array([np.inf, -np.inf, np.nan, -np.nan, 1.0, -2.0], np.float32), size=shape)


def _check_canonical_nans_on_both_executors(kernel_fn, inputs, monkeypatch):
    """Runs kernel_fn on the reference interpreter and on the native executor: every NaN output is
    0x7fc00000 and the outputs agree bit for bit."""
    results = {}
    for executor in ("interp", "native"):
        monkeypatch.setenv("NIKKI_EXECUTOR", executor)
        out = nki.jit(kernel_fn)(*inputs)  # a new kernel object compiles for this executor
        results[executor] = out if isinstance(out, tuple) else (out,)
    for interp, native in zip(results["interp"], results["native"]):
        assert np.isnan(interp).any()
        nan_bits = interp.view(np.uint32)[np.isnan(interp)]
        assert (nan_bits == 0x7FC00000).all(), sorted({hex(b) for b in nan_bits})
        np.testing.assert_array_equal(interp.view(np.uint32), native.view(np.uint32))


# --- Tensor engine ----------------------------------------------------------------------------

def _mm_ref(at, b):
    return at.astype(np.float64).T @ b.astype(np.float64)


def test_nc_matmul_nan_results_are_canonical(rng, monkeypatch):
    """Infinities and NaNs of both signs in both operands, a first matmul and an accumulating
    one: NaN sums are 0x7fc00000 on both executors."""
    def k(a, b):
        acc = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, load(a), load(b))
        nisa.nc_matmul(acc, load(b[:, 0:a.shape[1]]), load(a[:, 0:1]).broadcast_to((a.shape[0], b.shape[1])))
        return store(acc)

    _check_canonical_nans_on_both_executors(k, [_specials(rng, 32, 40), _specials(rng, 32, 48)], monkeypatch)


@pytest.mark.parametrize("accumulate", [None, True, False])
def test_nc_matmul_accumulate_flag(rng, accumulate):
    @nki.jit
    def k(a0, a1, b0, b1):
        acc = nl.ndarray((a0.shape[1], b0.shape[1]), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, load(a0), load(b0), accumulate=False)  # first write overwrites
        nisa.nc_matmul(dst=acc, stationary=load(a1), moving=load(b1), accumulate=accumulate)
        return store(acc)

    a0, a1 = f32(rng, 128, 64), f32(rng, 128, 64)
    b0, b1 = f32(rng, 128, 200), f32(rng, 128, 200)
    out = k(a0, a1, b0, b1)
    if accumulate is False:
        ref = _mm_ref(a1, b1)
    else:  # None: a PSUM location already written by a matmul accumulates
        ref = _mm_ref(a0, b0) + _mm_ref(a1, b1)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


def test_nc_matmul_bf16_inputs_accumulate_in_fp32(rng):
    @nki.jit
    def k(a, b):
        acc = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.psum)
        for kt in range(a.shape[0] // 128):
            nisa.nc_matmul(acc, load(a[kt * 128:(kt + 1) * 128, :]), load(b[kt * 128:(kt + 1) * 128, :]))
        return store(acc)

    a = f32(rng, 256, 128).astype(BF16)
    b = f32(rng, 256, 512).astype(BF16)
    out = k(a, b)
    assert out.dtype == np.float32
    # bf16 products are exact in fp32; only the fp32 accumulation order differs from numpy
    np.testing.assert_allclose(out, _mm_ref(a.astype(np.float32), b.astype(np.float32)), rtol=1e-5, atol=1e-4)


def test_nc_matmul_legacy_returns_psum_tile(rng):
    @nki.jit
    def k(a, b):
        r = nisa.nc_matmul(load(a), load(b))
        assert r.buffer == nl.psum and r.dtype == nl.float32 and r.shape == (a.shape[1], b.shape[1])
        return store(r)

    a, b = f32(rng, 96, 32), f32(rng, 96, 80)
    np.testing.assert_allclose(k(a, b), _mm_ref(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("subscript", [False, True])
def test_legacy_psum_plus_equals_nc_matmul_accumulates_in_psum(rng, subscript):
    @nki.jit
    def k(a, b):
        acc = nl.zeros((a.shape[1], b.shape[1]), nl.float32, buffer=nl.psum)
        for kt in nl.affine_range(a.shape[0] // 128):
            lhs = load(a[kt * 128:(kt + 1) * 128, :])
            rhs = load(b[kt * 128:(kt + 1) * 128, :])
            if subscript:
                acc[...] += nisa.nc_matmul(lhs, rhs)
            else:
                acc += nisa.nc_matmul(lhs, rhs)
        return store(acc)

    a, b = f32(rng, 384, 64), f32(rng, 384, 128)
    np.testing.assert_allclose(k(a, b), _mm_ref(a, b), rtol=1e-5, atol=1e-4)
    # the matmuls accumulate straight into the PSUM tile: no tensor_tensor add is emitted
    text = k.specialize(a, b).text(locations=False)
    assert "tensor_tensor" not in text
    assert text.count("nc_matmul") == 3


@pytest.mark.parametrize("style", ["current", "legacy"])
@pytest.mark.parametrize("shape,engine", [((128, 96), "tensor"), ((32, 16), "vector")])
def test_nc_transpose(rng, style, shape, engine):
    @nki.jit
    def k(a):
        x = load(a)
        if style == "current":
            buf = nl.psum if engine == "tensor" else nl.sbuf
            d = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=buf)
            nisa.nc_transpose(dst=d, data=x, engine=getattr(nisa.engine, engine))
        else:
            d = nisa.nc_transpose(x, engine=getattr(nisa, f"{engine}_engine"))
        return store(d)

    a = f32(rng, *shape)
    np.testing.assert_array_equal(k(a), a.T)  # transposes are bit-accurate


# --- initialization, index generation, selection --------------------------------------------

@pytest.mark.parametrize("style", ["current", "legacy"])
def test_memset(style):
    @nki.jit
    def k(a):
        if style == "current":
            f = nl.ndarray((32, 8), nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=f, value=2.5)
            i = nl.ndarray((32, 8), nl.int32, buffer=nl.sbuf)
            nisa.memset(i, -7, engine=nisa.engine.gpsimd)
        else:
            f = nisa.memset((32, 8), 2.5, nl.float32)
            i = nisa.memset(shape=(32, 8), value=-7, dtype=nl.int32)
        return store(f), store(i)

    f, i = k(np.zeros((1, 1), np.float32))
    np.testing.assert_array_equal(f, np.full((32, 8), 2.5, np.float32))
    np.testing.assert_array_equal(i, np.full((32, 8), -7, np.int32))


def test_iota_current_pattern_offset_channel_multiplier():
    @nki.jit
    def k(a):
        d = nl.ndarray((16, 4, 6), nl.int32, buffer=nl.sbuf)
        nisa.iota(d, pattern=[[10, 4], [1, 6]], offset=3, channel_multiplier=100)
        f = nl.ndarray((8, 5), nl.float32, buffer=nl.sbuf)
        nisa.iota(dst=f, pattern=[[-2, 5]], offset=0, channel_multiplier=1)
        return store(d), store(f)

    d, f = k(np.zeros((1, 1), np.float32))
    c, y, x = np.meshgrid(np.arange(16), np.arange(4), np.arange(6), indexing="ij")
    np.testing.assert_array_equal(d, 3 + 100 * c + 10 * y + x)
    c2, x2 = np.meshgrid(np.arange(8), np.arange(5), indexing="ij")
    np.testing.assert_array_equal(f, (c2 - 2 * x2).astype(np.float32))


def test_affine_select_causal_mask_current(rng):
    @nki.jit
    def k(a):
        x = load(a)
        d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        # keep x[p, f] where p - f >= 0 (lower triangle), else -inf-ish fill
        nisa.affine_select(dst=d, pattern=[[-1, a.shape[1]]], channel_multiplier=1, on_true_tile=x,
                           on_false_value=-9984.0, cmp_op=nl.greater_equal, offset=0)
        return store(d)

    a = f32(rng, 64, 64)
    p, f = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    np.testing.assert_array_equal(k(a), np.where(p - f >= 0, a, np.float32(-9984.0)))


def test_tensor_copy_predicated_and_select_reduce(rng):
    @nki.jit
    def k(a, b, m):
        x, y, pred = load(a), load(b), load(m)
        d = load(a)
        nisa.tensor_copy_predicated(dst=d, src=y, predicate=pred)
        r = load(a)
        nisa.tensor_copy_predicated(r, 7.0, pred, reverse_pred=True)
        s = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        best = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=s, predicate=pred, on_true=x, on_false=-1.0, reduce_res=best,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=nl.maximum)
        return store(d), store(r), store(s), store(best)

    a, b = f32(rng, 32, 24), f32(rng, 32, 24)
    m = (rng.random((32, 24)) > 0.5).astype(np.uint8)
    d, r, s, best = k(a, b, m)
    np.testing.assert_array_equal(d, np.where(m != 0, b, a))
    np.testing.assert_array_equal(r, np.where(m == 0, np.float32(7.0), a))
    sel = np.where(m != 0, a, np.float32(-1.0))
    np.testing.assert_array_equal(s, sel)
    np.testing.assert_array_equal(best[:, 0], sel.max(axis=1))


@pytest.mark.parametrize("style", ["current", "legacy"])
def test_max8_and_nc_find_index8(rng, style):
    @nki.jit
    def k(a):
        x = load(a)
        if style == "current":
            top = nl.ndarray((a.shape[0], 8), nl.float32, buffer=nl.sbuf)
            nisa.max8(dst=top, src=x)
            idx = nl.ndarray((a.shape[0], 8), nl.uint32, buffer=nl.sbuf)
            nisa.nc_find_index8(dst=idx, data=x, vals=top)
        else:
            top = nisa.max8(src=x)
            idx = nisa.nc_find_index8(data=x, vals=top)
        return store(top), store(idx)

    a = np.stack([rng.permutation(64).astype(np.float32) for _ in range(16)])
    top, idx = k(a)
    order = np.argsort(-a, axis=1, kind="stable")[:, :8]
    np.testing.assert_array_equal(top, np.take_along_axis(a, order, axis=1))
    np.testing.assert_array_equal(idx, order.astype(np.uint32))


# --- registers and runtime loops --------------------------------------------------------------

def test_registers_alloc_move_load_store(rng):
    @nki.jit
    def k(a):
        t = load(a)  # (1, 1) int32
        r0 = nisa.register_alloc(5)
        r1 = nisa.register_alloc()
        nisa.register_load(r1, t)
        r2 = nisa.register_alloc(r0)  # copy of a register
        nisa.register_move(dst=r0, src=11)
        out0 = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        out1 = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        out2 = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.register_store(out0, r0)
        nisa.register_store(dst=out1, src=r1)
        nisa.register_store(out2, r2)
        return store(out0), store(out1), store(out2)

    o0, o1, o2 = k(np.array([[42]], np.int32))
    assert (o0[0, 0], o1[0, 0], o2[0, 0]) == (11, 42, 5)


def test_fori_loop_accumulates_rows(rng):
    """A device loop: out[0, :] = sum of the rows of a, read through a register offset."""
    @nki.jit
    def k(a):
        acc = nl.zeros((1, a.shape[1]), nl.float32, buffer=nl.sbuf)
        row = nl.ndarray((1, a.shape[1]), nl.float32, buffer=nl.sbuf)

        def body(i):
            nisa.dma_copy(dst=row, src=a.ap([[a.shape[1], 1], [1, a.shape[1]]], scalar_offset=i))
            nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)

        nl.fori_loop(0, a.shape[0], body)
        return store(acc)

    a = f32(rng, 10, 16)
    expected = np.zeros(16, np.float32)
    for r in a:  # sequential fp32 sum, as the loop does it
        expected = expected + r
    np.testing.assert_array_equal(k(a)[0], expected)
    # the loop body is traced once: a loop, not 10 unrolled copies
    text = k.specialize(a).text(locations=False)
    assert text.count("dma_copy") == 2 and "loop_begin" in text


def test_dynamic_range_with_step(rng):
    @nki.jit
    def k(a):
        acc = nl.zeros((1, a.shape[1]), nl.float32, buffer=nl.sbuf)
        row = nl.ndarray((1, a.shape[1]), nl.float32, buffer=nl.sbuf)
        for i in nl.dynamic_range(1, a.shape[0], 3):  # rows 1, 4, 7
            nisa.dma_copy(dst=row, src=a.ap([[a.shape[1], 1], [1, a.shape[1]]], scalar_offset=i))
            nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)
        return store(acc)

    a = f32(rng, 9, 8)
    np.testing.assert_array_equal(k(a)[0], (a[1] + a[4]) + a[7])


def test_fori_loop_counter_stored_from_register():
    @nki.jit
    def k(a):
        out = nl.ndarray((1, 8), nl.int32, buffer=nl.sbuf)
        nisa.memset(out, 0)

        def body(i):
            # offset = i * prod(shape[indirect_dim + 1:]) = i along dim 1
            nisa.register_store(out.ap([[8, 1], [1, 1]], scalar_offset=i, indirect_dim=1), i)

        nl.fori_loop(2, 7, body)
        return store(out)

    np.testing.assert_array_equal(k(np.zeros((1, 1), np.float32))[0], [0, 0, 2, 3, 4, 5, 6, 0])


# --- target queries ---------------------------------------------------------------------------

@pytest.mark.parametrize("target,gen", [("trn1", nisa.nc_version.gen2), ("trn2", nisa.nc_version.gen3)])
def test_get_nc_version(target, gen):
    seen = {}

    @nki.jit(target=target)
    def k(a):
        seen["v"] = nisa.get_nc_version()
        seen["sub"] = nisa.get_nc_sub_version()
        return store(load(a))

    k(np.zeros((1, 1), np.float32))
    assert seen["v"] == gen and isinstance(seen["sub"], int)


def test_enums_and_aliases(rng):
    @nki.jit
    def k(a):
        x = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a, dge_mode=nisa.dge_mode.unknown, oob_mode=nisa.oob_mode.error)
        d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(d, x, nl.multiply, 2.0, engine=nisa.vector_engine)
        nisa.tensor_scalar(d, d, nl.add, 1.0, engine=nisa.scalar_engine)
        nisa.tensor_copy(d, d, engine=nisa.gpsimd_engine)
        nisa.tensor_copy(d, d, engine=nisa.unknown_engine)
        nisa.activation(d, nl.copy, d, reduce_cmd=nisa.reduce_cmd.idle)
        return store(d)

    a = f32(rng, 8, 8)
    np.testing.assert_array_equal(k(a), a * np.float32(2) + np.float32(1))
    assert nisa.tensor_engine is nisa.engine.tensor and nisa.vector_engine is nisa.engine.vector
    assert int(nisa.reduce_cmd.reset_reduce) == 3 and int(nisa.dge_mode.none) == 3
    assert issubclass(nisa.NkiValidationError, ValueError)
    for name in nisa.__all__:
        assert hasattr(nisa, name), name


# --- call forms: positional, keyword, and mixed, in both styles --------------------------------

def _p1():
    return nl.ndarray((8, 1), nl.float32, buffer=nl.sbuf)


CALL_FORMS = [  # (label, call(x, y, d) -> tile written, numpy reference on (a, b))
    ("tensor_copy dst kw-src", lambda x, y, d: (nisa.tensor_copy(d, src=x), d)[1], lambda a, b: a),
    ("tensor_copy legacy kw", lambda x, y, d: nisa.tensor_copy(src=x), lambda a, b: a),
    ("tensor_tensor dst kw-rest", lambda x, y, d: (nisa.tensor_tensor(d, data1=x, data2=y, op=nl.add), d)[1],
     lambda a, b: a + b),
    ("tensor_tensor legacy kw-op", lambda x, y, d: nisa.tensor_tensor(x, y, op=nl.subtract), lambda a, b: a - b),
    ("tensor_tensor legacy kw-all", lambda x, y, d: nisa.tensor_tensor(data1=x, data2=y, op=nl.maximum),
     np.maximum),
    ("tensor_scalar dst kw-data", lambda x, y, d: (nisa.tensor_scalar(d, data=x, op0=nl.add, operand0=1.0), d)[1],
     lambda a, b: a + np.float32(1)),
    ("tensor_scalar dst pos-data", lambda x, y, d: (nisa.tensor_scalar(d, x, op0=nl.multiply, operand0=2.0), d)[1],
     lambda a, b: a * np.float32(2)),
    ("tensor_scalar legacy pos-data", lambda x, y, d: nisa.tensor_scalar(x, op0=nl.add, operand0=1.0),
     lambda a, b: a + np.float32(1)),
    ("scalar_tensor_tensor dst kw", lambda x, y, d: (nisa.scalar_tensor_tensor(
        d, data=x, op0=nl.add, operand0=1.0, op1=nl.multiply, operand1=y), d)[1],
     lambda a, b: (a + np.float32(1)) * b),
    ("scalar_tensor_tensor legacy pos-data", lambda x, y, d: nisa.scalar_tensor_tensor(
        x, op0=nl.add, operand0=1.0, op1=nl.multiply, operand1=y), lambda a, b: (a + np.float32(1)) * b),
    ("activation dst kw", lambda x, y, d: (nisa.activation(d, op=nl.relu, data=x), d)[1],
     lambda a, b: np.maximum(a, 0)),
    ("activation legacy pos", lambda x, y, d: nisa.activation(nl.relu, x), lambda a, b: np.maximum(a, 0)),
    ("reciprocal legacy kw", lambda x, y, d: nisa.reciprocal(data=x), lambda a, b: np.float32(1) / a),
    ("tensor_tensor_scan dst kw", lambda x, y, d: (nisa.tensor_tensor_scan(
        d, data0=x, data1=y, initial=0.0, op0=nl.add, op1=nl.add), d)[1],
     lambda a, b: np.cumsum(a + b, axis=1, dtype=np.float32)),
    ("max8 dst kw", lambda x, y, d: (lambda m: (nisa.max8(m, src=x), m)[1])(nl.ndarray((8, 8), nl.float32)),
     lambda a, b: -np.sort(-a, axis=1)[:, :8]),
    ("max8 legacy pos", lambda x, y, d: nisa.max8(x), lambda a, b: -np.sort(-a, axis=1)[:, :8]),
    ("tensor_reduce dst pos", lambda x, y, d: (lambda r: (nisa.tensor_reduce(r, nl.maximum, x, 1), r)[1])(_p1()),
     lambda a, b: a.max(1, keepdims=True)),
    ("tensor_reduce legacy kw", lambda x, y, d: nisa.tensor_reduce(op=nl.minimum, data=x, axis=1),
     lambda a, b: a.min(1, keepdims=True)),
    ("memset dst kw-value", lambda x, y, d: (nisa.memset(d, value=3.0), d)[1], lambda a, b: np.full_like(a, 3)),
    ("dma_copy dst kw-src", lambda x, y, d: (nisa.dma_copy(d, src=x), d)[1], lambda a, b: a),
]


@pytest.mark.parametrize("label,call,ref", CALL_FORMS, ids=[c[0] for c in CALL_FORMS])
def test_call_forms_bind_like_nki(rng, label, call, ref):
    @nki.jit
    def k(a, b):
        x, y = load(a), load(b)
        d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        return store(call(x, y, d))

    a, b = f32(rng, 8, 16, lo=0.5, hi=2), f32(rng, 8, 16)
    out = k(a, b)
    expected = ref(a, b)
    # one fp32 op per element (the scan: the same left-to-right fp32 running sum as np.cumsum)
    np.testing.assert_allclose(out, expected.reshape(out.shape), rtol=1e-6, atol=1e-6)


def test_activation_constant_bias_and_accumulating_reduce_cmds(rng):
    """bias as a Python float; reduce_cmd reset / reduce / reduce keeps summing across instructions."""
    @nki.jit
    def k(a):
        x = load(a)
        d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=d, op=nl.copy, data=x, bias=1.5)
        total = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
        scratch = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(scratch, nl.copy, x, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(scratch, nl.square, x, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.activation(scratch, nl.copy, x, reduce_op=nl.add, reduce_res=total, reduce_cmd=nisa.reduce_cmd.reduce)
        return store(d), store(total)

    a = f32(rng, 16, 32)
    d, total = k(a)
    np.testing.assert_array_equal(d, a + np.float32(1.5))
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(total[:, 0], 2 * a64.sum(1) + (a64 ** 2).sum(1), rtol=1e-5, atol=1e-5)


def test_dynamic_loop_with_runtime_trip_count(rng):
    """fori_loop bounds from a register loaded from a tensor: the trip count is data."""
    @nki.jit
    def k(a, n):
        count = nisa.register_alloc()
        nisa.register_load(count, load(n))
        acc = nl.zeros((1, a.shape[1]), nl.float32)
        row = nl.ndarray((1, a.shape[1]), nl.float32, buffer=nl.sbuf)

        def body(i):
            nisa.dma_copy(dst=row, src=a[nl.ds(i, 1), :])
            nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)

        nl.fori_loop(0, count, body)
        return store(acc)

    a = f32(rng, 8, 4)
    for n in (0, 3, 8):
        expected = np.zeros(4, np.float32)
        for r in a[:n]:
            expected = expected + r
        np.testing.assert_array_equal(k(a, np.array([[n]], np.int32))[0], expected)


def test_matmul_result_read_before_plus_equals_is_not_retargeted(rng):
    @nki.jit
    def k(a, b):
        acc = nl.zeros((a.shape[1], b.shape[1]), nl.float32, buffer=nl.psum)
        r = nisa.nc_matmul(load(a), load(b))
        seen = nl.copy(r)  # reads the fresh tile: the matmul must still write it
        acc += r
        acc += r
        return store(seen), store(acc)

    a, b = f32(rng, 32, 16), f32(rng, 32, 24)
    seen, acc = k(a, b)
    ref = _mm_ref(a, b)
    np.testing.assert_allclose(seen, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(acc, 2 * ref, rtol=1e-5, atol=1e-5)


def test_tensor_partition_reduce_average_and_fp32_min(rng):
    @nki.jit
    def k(a, m):
        x = load(a)
        avg = nl.ndarray((1, a.shape[1]), nl.float32, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(dst=avg, op=nl.average, data=x)
        sel = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=sel, predicate=load(m), on_true=x, on_false=nl.fp32.min)
        return store(avg), store(sel)

    a = f32(rng, 16, 8)
    m = (rng.random((16, 8)) > 0.5).astype(np.uint8)
    avg, sel = k(a, m)
    np.testing.assert_allclose(avg[0], a.astype(np.float64).mean(0), rtol=1e-5, atol=1e-7)  # fp32 sum / 16
    np.testing.assert_array_equal(sel, np.where(m != 0, a, np.finfo(np.float32).min))


@pytest.mark.parametrize("name", nisa.UNSUPPORTED)
def test_unsupported_instructions_raise_naming_the_api(name):
    fn = getattr(nisa, name)
    required = [p.name for p in inspect.signature(fn).parameters.values() if p.default is p.empty]

    @nki.jit
    def k(a):  # called as its NKI signature says, every required parameter a tile
        fn(**{param: load(a) for param in required})
        return store(load(a))

    with pytest.raises(NotImplementedError, match=f"nki.isa.{name} is not supported by nikki"):
        k(np.zeros((1, 1), np.float32))


LEGACY_DTYPE = [  # legacy functional calls with dtype=: (label, call(x, y) -> tile, fp32 reference on (a, b))
    ("scalar_tensor_tensor", lambda x, y: nisa.scalar_tensor_tensor(
        data=x, op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=y, dtype=nl.bfloat16),
     lambda a, b: a * np.float32(2) + b),
    ("activation_reduce", lambda x, y: nisa.activation_reduce(
        op=nl.exp, data=x, reduce_op=nl.add, reduce_res=nl.ndarray((x.shape[0], 1), nl.float32),
        dtype=nl.bfloat16), lambda a, b: np.exp(a.astype(np.float64)).astype(np.float32)),
    ("reciprocal", lambda x, y: nisa.reciprocal(x, dtype=nl.bfloat16), lambda a, b: np.float32(1) / a),
    ("tensor_scalar_reduce", lambda x, y: nisa.tensor_scalar_reduce(
        data=x, op0=nl.add, operand0=1.0, reduce_op=nl.add, reduce_res=nl.ndarray((x.shape[0], 1), nl.float32),
        dtype=nl.bfloat16), lambda a, b: a + np.float32(1)),
    ("tensor_tensor_scan", lambda x, y: nisa.tensor_tensor_scan(x, y, 0.0, nl.maximum, nl.add, dtype=nl.bfloat16),
     None),
    ("tensor_partition_reduce", lambda x, y: nisa.tensor_partition_reduce(nl.maximum, x, dtype=nl.bfloat16),
     lambda a, b: a.max(0, keepdims=True)),
    ("nc_transpose", lambda x, y: nisa.nc_transpose(x[0:16, 0:16], dtype=nl.bfloat16), lambda a, b: a[:16, :16].T),
    ("max8", lambda x, y: nisa.max8(src=x, dtype=nl.bfloat16), lambda a, b: -np.sort(-a, axis=1)[:, :8]),
    ("bn_aggr", lambda x, y: nisa.bn_aggr(nisa.bn_stats(x), dtype=nl.bfloat16),
     lambda a, b: np.stack([a.mean(1), a.var(1)], axis=1)),
]


@pytest.mark.parametrize("label,call,ref", LEGACY_DTYPE, ids=[c[0] for c in LEGACY_DTYPE])
def test_legacy_dtype_argument_casts_the_result(rng, label, call, ref):
    @nki.jit
    def k(a, b):
        r = call(load(a), load(b))
        assert r.dtype == nl.bfloat16
        return store(r)

    a, b = f32(rng, 32, 16, lo=0.5, hi=2), f32(rng, 32, 16, lo=0.5, hi=2)
    out = k(a, b)
    assert out.dtype == BF16
    if ref is None:  # the scan: res[i] = max(a[i], res[i-1]) + b[i] in fp32, rounded to bf16 on write
        expected, prev = np.empty_like(a), np.zeros(a.shape[0], np.float32)
        for i in range(a.shape[1]):
            prev = np.maximum(a[:, i], prev) + b[:, i]
            expected[:, i] = prev
    else:
        expected = ref(a, b)
    # computed in fp32 (sums in a different order than numpy), then rounded once to bf16
    np.testing.assert_allclose(out.astype(np.float32), expected.reshape(out.shape), rtol=2 ** -8, atol=1e-6)
