"""nki.language against numpy: tensor creation, tile sizes per target, element-wise math (functions
and operators on tiles), reductions, softmax, rms_norm, matmul, transpose, load/store/copy, where,
device_print and SPMD program ids.

Tolerances, by how the engines compute (docs/numerics.md):
- exact: copies, fills, fp32 add/subtract/multiply/min/max/compare (one fp32 rounding, as numpy
  float32), integer and bitwise ops, reciprocal (one fp32 division).
- rtol 2e-7 (+ tiny atol near zeros): activation-table functions, evaluated in double and rounded
  once to fp32, against float64 numpy formulas.
- rtol 1e-5: results that sum in fp32 (reductions, mean/var, softmax, rms_norm, matmul with K <= 256),
  whose summation order differs from numpy's pairwise float64 sums.
"""

import math

import ml_dtypes
import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

BF16 = ml_dtypes.bfloat16


def store(t):
    """Any tile -> a new shared_hbm output (PSUM staged through SBUF)."""
    if t.buffer == nl.psum:
        t = nl.copy(t)
    out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


def f32(rng, *shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def unary_kernel(fn):
    @nki.jit
    def k(a):
        return store(fn(nl.load(a)))

    return k


# --- creation ---------------------------------------------------------------------------------

def test_creation_functions():
    @nki.jit
    def k(a):
        x = nl.load(a)
        z = nl.zeros((4, 8), nl.float32)
        o = nl.ones((4, 8), nl.int32, buffer=nl.sbuf)
        f = nl.full((4, 8), 2.5, nl.bfloat16)
        zl = nl.zeros_like(x)
        e = nl.empty_like(x, dtype=nl.float32)  # uninitialized; written below
        nisa.tensor_copy(dst=e, src=x)
        n = nl.ndarray((4, 8), dtype=nl.float16, buffer=nl.sbuf)
        nisa.memset(dst=n, value=-1.0)
        p = nl.zeros((4, 8), nl.float32, buffer=nl.psum)
        assert (z.shape, o.dtype, f.dtype, zl.shape, e.dtype, p.buffer) == \
            ((4, 8), nl.int32, nl.bfloat16, a.shape, nl.float32, nl.psum)
        return store(z), store(o), store(f), store(zl), store(e), store(n), store(p)

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    z, o, f, zl, e, n, p = k(a)
    np.testing.assert_array_equal(z, np.zeros((4, 8), np.float32))
    np.testing.assert_array_equal(o, np.ones((4, 8), np.int32))
    assert f.dtype == BF16
    np.testing.assert_array_equal(f.astype(np.float32), np.full((4, 8), 2.5))
    np.testing.assert_array_equal(zl, np.zeros_like(a))
    np.testing.assert_array_equal(e, a)
    assert n.dtype == np.float16
    np.testing.assert_array_equal(n, np.full((4, 8), -1, np.float16))
    np.testing.assert_array_equal(p, np.zeros((4, 8), np.float32))


def test_uninitialized_ndarray_holds_nan_sentinel():
    @nki.jit
    def k(a):
        return store(nl.ndarray((2, 3), nl.float32, buffer=nl.sbuf)), store(nl.ndarray((2, 3), nl.int32))

    f, i = k(np.zeros((1, 1), np.float32))
    assert np.isnan(f).all()  # NKI's simulator: NaN for floats, 4 for integers
    np.testing.assert_array_equal(i, np.full((2, 3), 4))


@pytest.mark.parametrize("dtype,np_dtype", [(None, np.uint8), (nl.float32, np.float32), (nl.bfloat16, BF16)])
def test_shared_identity_matrix(dtype, np_dtype):
    @nki.jit
    def k(a):
        ident = nl.shared_identity_matrix(32) if dtype is None else nl.shared_identity_matrix(32, dtype=dtype)
        return store(ident)

    out = k(np.zeros((1, 1), np.float32))
    assert out.dtype == np_dtype
    np.testing.assert_array_equal(out.astype(np.float32), np.eye(32))


def test_identity_used_for_tensor_engine_transpose(rng):
    @nki.jit
    def k(a):
        ident = nl.shared_identity_matrix(a.shape[0], dtype=nl.float32)
        t = nl.ndarray((a.shape[1], a.shape[0]), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(t, nl.load(a), ident)  # a.T @ I
        return store(t)

    a = f32(rng, 64, 48)
    np.testing.assert_array_equal(k(a), a.T)  # products with 1 and sums with 0 are exact


# --- tile sizes -------------------------------------------------------------------------------

TILE_SIZES = {
    "trn1": dict(pmax=128, psum_fmax=512, psum_bank_fmax=512, psum_bank_fmax_bytes=2048, psum_num_banks=8,
                 gemm_stationary_fmax=128, gemm_moving_fmax=512, bn_stats_fmax=512, sbuf_fmax_bytes=180224),
    "trn2": dict(pmax=128, psum_fmax=512, psum_bank_fmax=512, psum_bank_fmax_bytes=2048, psum_num_banks=8,
                 gemm_stationary_fmax=128, gemm_moving_fmax=512, bn_stats_fmax=512, sbuf_fmax_bytes=212984),
}


def _tile_sizes_in_kernel(**jit_kwargs):
    seen = {}

    @nki.jit(**jit_kwargs)
    def k(a):
        seen.update({n: getattr(nl.tile_size, n) for n in TILE_SIZES["trn1"]})
        seen["sbuf_fmax"] = nl.tile_size.sbuf_fmax
        seen["total_available_sbuf_size"] = nl.tile_size.total_available_sbuf_size
        return store(nl.load(a))

    k(np.zeros((1, 1), np.float32))
    return seen


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_tile_size_with_jit_target(target):
    seen = _tile_sizes_in_kernel(target=target)
    for name, value in TILE_SIZES[target].items():
        assert seen[name] == value, name
    assert seen["sbuf_fmax"] == TILE_SIZES[target]["sbuf_fmax_bytes"] // 4  # fp32 elements
    assert seen["total_available_sbuf_size"] == TILE_SIZES[target]["sbuf_fmax_bytes"]  # per partition


@pytest.mark.parametrize("env,target", [("trn1", "trn1"), ("inf2", "trn1"), ("gen3", "trn2"), ("trn2", "trn2")])
def test_tile_size_with_platform_override(monkeypatch, env, target):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", env)
    seen = _tile_sizes_in_kernel()
    assert seen["sbuf_fmax_bytes"] == TILE_SIZES[target]["sbuf_fmax_bytes"]
    # outside a kernel, tile_size reports the selected target too
    assert nl.tile_size.sbuf_fmax_bytes == TILE_SIZES[target]["sbuf_fmax_bytes"]


def test_tile_size_default_is_trn2(monkeypatch):
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    assert _tile_sizes_in_kernel()["sbuf_fmax_bytes"] == TILE_SIZES["trn2"]["sbuf_fmax_bytes"]
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        nl.tile_size.nonsense


# --- element-wise functions -------------------------------------------------------------------

def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


_erf = np.vectorize(math.erf)

UNARY = {  # name -> (numpy reference on float64, input range)
    "exp": (np.exp, (-3, 3)), "log": (np.log, (0.1, 5)), "sqrt": (np.sqrt, (0.1, 5)), "tanh": (np.tanh, (-3, 3)),
    "sigmoid": (_sig, (-5, 5)), "relu": (lambda x: np.maximum(x, 0), (-2, 2)),
    "gelu": (lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))), (-3, 3)),
    "gelu_dx": (lambda x: 0.5 * (1 + _erf(x / math.sqrt(2))) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi),
                (-3, 3)),
    "gelu_apprx_tanh": (lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
                        (-3, 3)),
    "gelu_apprx_sigmoid": (lambda x: x * _sig(1.702 * x), (-3, 3)),
    "gelu_apprx_sigmoid_dx": (lambda x: _sig(1.702 * x) * (1 + 1.702 * x * (1 - _sig(1.702 * x))), (-3, 3)),
    "silu": (lambda x: x * _sig(x), (-3, 3)), "silu_dx": (lambda x: _sig(x) * (1 + x * (1 - _sig(x))), (-3, 3)),
    "softplus": (lambda x: np.log1p(np.exp(x)), (-3, 3)),
    "mish": (lambda x: x * np.tanh(np.log1p(np.exp(x))), (-3, 3)),
    "erf": (_erf, (-2, 2)), "erf_dx": (lambda x: 2 / math.sqrt(math.pi) * np.exp(-x * x), (-2, 2)),
    "sin": (np.sin, (-3, 3)), "arctan": (np.arctan, (-1.5, 1.5)), "sign": (np.sign, (-2, 2)),
    "abs": (np.abs, (-2, 2)), "square": (np.square, (-2, 2)), "rsqrt": (lambda x: 1 / np.sqrt(x), (0.1, 5)),
    "negative": (np.negative, (-2, 2)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_functions(rng, name):
    ref, (lo, hi) = UNARY[name]
    a = f32(rng, 128, 64, lo=lo, hi=hi)
    a[0, :3] = [lo, 0.5 * (lo + hi), hi]
    out = unary_kernel(getattr(nl, name))(a)
    assert out.dtype == np.float32
    # one fp32 rounding of a double-precision value; atol covers sign changes (e.g. silu_dx's zero)
    np.testing.assert_allclose(out, ref(a.astype(np.float64)), rtol=2e-7, atol=1e-7)


def test_unary_dtype_argument_casts(rng):
    a = f32(rng, 16, 32)
    out = unary_kernel(lambda x: nl.exp(x, dtype=nl.bfloat16))(a)
    assert out.dtype == BF16
    np.testing.assert_array_equal(out, np.exp(a.astype(np.float64)).astype(np.float32).astype(BF16))


def test_reciprocal_copy_and_integer_unaries(rng):
    @nki.jit
    def k(a, i):
        x, xi = nl.load(a), nl.load(i)
        return store(nl.reciprocal(x)), store(nl.copy(x)), store(nl.invert(xi)), store(nl.logical_not(x)), \
            store(nl.static_cast(x, nl.bfloat16))

    a = f32(rng, 32, 16, lo=0.25, hi=4)
    a[0, 0] = 0.0
    i = rng.integers(0, 2**31 - 1, size=(32, 16), dtype=np.int32)
    r, c, inv, lnot, cast = k(a, i)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(r, np.float32(1) / a)
    np.testing.assert_array_equal(c, a)
    np.testing.assert_array_equal(inv, ~i)
    np.testing.assert_array_equal(lnot.astype(bool), a == 0)
    np.testing.assert_array_equal(cast, a.astype(BF16))


BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "equal": np.equal, "not_equal": np.not_equal, "greater": np.greater, "greater_equal": np.greater_equal,
    "less": np.less, "less_equal": np.less_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_functions_tile_tile_and_tile_scalar(rng, name):
    fn, ref = getattr(nl, name), BINARY[name]

    @nki.jit
    def k(a, b):
        x, y = nl.load(a), nl.load(b)
        return store(fn(x, y)), store(fn(x, 0.5)), store(fn(0.5, y))

    a, b = f32(rng, 64, 32), f32(rng, 64, 32)
    a[:, 0] = b[:, 0]
    a[:, 1] = 0.0
    a[:, 2] = 0.5
    tt, ts, st = k(a, b)
    half = np.float32(0.5)
    for out, expected in ((tt, ref(a, b)), (ts, ref(a, half)), (st, ref(half, b))):
        if expected.dtype == bool:
            assert out.dtype == np.bool_  # comparisons and logical ops return bool tiles
        np.testing.assert_array_equal(out, expected)


def test_divide_and_power(rng):
    @nki.jit
    def k(a, b):
        x, y = nl.load(a), nl.load(b)
        return store(nl.divide(x, y)), store(x / 4.0), store(nl.power(x, y))

    a, b = f32(rng, 32, 16, lo=0.5, hi=3), f32(rng, 32, 16, lo=0.5, hi=3)
    d, q, p = k(a, b)
    # the engines have no divide: x * reciprocal(y), two fp32 roundings
    np.testing.assert_array_equal(d, a * (np.float32(1) / b))
    np.testing.assert_array_equal(q, a * np.float32(0.25))
    np.testing.assert_allclose(p, np.power(a.astype(np.float64), b), rtol=2e-7)


def test_bitwise_and_shift_functions(rng):
    @nki.jit
    def k(a, b):
        x, y = nl.load(a), nl.load(b)
        return (store(nl.bitwise_and(x, y)), store(nl.bitwise_or(x, y)), store(nl.bitwise_xor(x, y)),
                store(nl.left_shift(x, 2)), store(nl.right_shift(x, 3)), store(x & y), store(x | 1), store(x >> 1))

    a = rng.integers(0, 2**16, size=(16, 8), dtype=np.uint32)
    b = rng.integers(0, 2**16, size=(16, 8), dtype=np.uint32)
    outs = k(a, b)
    expected = (a & b, a | b, a ^ b, a << 2, a >> 3, a & b, a | 1, a >> 1)
    for o, e in zip(outs, expected):
        np.testing.assert_array_equal(o, e)


def test_operators_on_tiles(rng):
    @nki.jit
    def k(a, b, c):
        x, y, col = nl.load(a), nl.load(b), nl.load(c)
        return (store(x + y), store(x * 2), store(2 - x), store(-x), store(x > y), store(x + col), store(col * x),
                store(x - y), store(x <= 0.0), store(abs(x)), store(x == y))

    a, b = f32(rng, 128, 64), f32(rng, 128, 64)
    b[:, :3] = a[:, :3]
    c = f32(rng, 128, 1)
    outs = k(a, b, c)
    expected = (a + b, a * np.float32(2), np.float32(2) - a, -a, a > b, a + c, c * a, a - b, a <= 0, np.abs(a),
                a == b)
    for o, e in zip(outs, expected):
        np.testing.assert_array_equal(o, e)


def test_in_place_operators_on_tiles(rng):
    @nki.jit
    def k(a, b):
        x, y = nl.load(a), nl.load(b)
        x += y
        x *= 3.0
        x -= 1.0
        return store(x)

    a, b = f32(rng, 16, 16), f32(rng, 16, 16)
    np.testing.assert_array_equal(k(a, b), (a + b) * np.float32(3) - np.float32(1))


def test_mixed_dtype_binary_widens(rng):
    @nki.jit
    def k(a, b):
        s = nl.add(nl.load(a), nl.load(b))
        assert s.dtype == nl.float32
        return store(s)

    a = f32(rng, 8, 8).astype(BF16)
    b = f32(rng, 8, 8)
    np.testing.assert_array_equal(k(a, b), a.astype(np.float32) + b)


# --- reductions -------------------------------------------------------------------------------

@pytest.mark.parametrize("name,ref", [("sum", np.sum), ("max", np.max), ("min", np.min), ("mean", np.mean),
                                      ("prod", np.prod)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(rng, name, ref, keepdims):
    fn = getattr(nl, name)

    @nki.jit
    def k(a):
        return store(fn(nl.load(a), axis=1, keepdims=keepdims))

    a = f32(rng, 128, 40, lo=0.5, hi=1.5)
    out = k(a)
    expected = ref(a.astype(np.float64), axis=1, keepdims=True)  # [P] results stay 2-D [P, 1]
    assert out.shape == (128, 1)
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_reductions_over_several_axes_and_var_all(rng):
    @nki.jit
    def k(a, m):
        x = nl.load(a)
        return (store(nl.sum(x, axis=(1, 2))), store(nl.max(x, axis=[2])), store(nl.var(nl.load(a[:, 0, :]), axis=1)),
                store(nl.all(nl.load(m), axis=1)), store(nl.sum(x, axis=-1, dtype=nl.bfloat16)))

    a = f32(rng, 32, 4, 16)
    m = (rng.random((32, 8)) > 0.2).astype(np.uint8)
    m[0] = 1
    s, mx, v, al, sb = k(a, m)
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(s[:, 0], a64.sum((1, 2)), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mx, a.max(2))
    np.testing.assert_allclose(v[:, 0], a64[:, 0, :].var(1), rtol=1e-5)
    np.testing.assert_array_equal(al[:, 0].astype(bool), m.all(1))
    assert sb.dtype == BF16
    np.testing.assert_allclose(sb.astype(np.float32), a64.sum(2), rtol=2 ** -8, atol=1e-2)  # one bf16 rounding


# --- composite operations ---------------------------------------------------------------------

def test_softmax(rng):
    @nki.jit
    def k(a):
        return store(nl.softmax(nl.load(a), axis=-1)), store(nl.softmax(nl.load(a), axis=1, dtype=nl.bfloat16))

    a = f32(rng, 128, 100, lo=-5, hi=5)
    s, sb = k(a)
    e = np.exp(a.astype(np.float64) - a.max(1, keepdims=True))
    ref = e / e.sum(1, keepdims=True)
    np.testing.assert_allclose(s, ref, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(sb.astype(np.float64), ref, rtol=2 ** -7, atol=1e-9)


@pytest.mark.parametrize("w_rows", [1, 128])
def test_rms_norm(rng, w_rows):
    @nki.jit
    def k(a, w):
        return store(nl.rms_norm(nl.load(a), nl.load(w), axis=1, n=a.shape[1], epsilon=1e-5))

    a, w = f32(rng, 128, 64), f32(rng, w_rows, 64)
    a64 = a.astype(np.float64)
    ref = a64 / np.sqrt((a64 ** 2).mean(1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(k(a, w), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("transpose_x", [True, False])
def test_matmul(rng, transpose_x):
    @nki.jit
    def k(x_in, y_in):
        r = nl.matmul(nl.load(x_in), nl.load(y_in), transpose_x=transpose_x)
        assert r.buffer == nl.psum and r.dtype == nl.float32
        return store(r)

    m, kk, n = 64, 128, 256
    y = f32(rng, kk, n)
    if transpose_x:
        x = f32(rng, kk, m)  # given as x.T: contraction on the partition dim
        ref = x.astype(np.float64).T @ y
    else:
        x = f32(rng, m, kk)
        ref = x.astype(np.float64) @ y
    np.testing.assert_allclose(k(x, y), ref, rtol=1e-5, atol=1e-4)


def test_matmul_psum_accumulation_legacy_idiom(rng):
    @nki.jit
    def k(x_in, y_in):
        acc = nl.zeros((x_in.shape[1], y_in.shape[1]), nl.float32, buffer=nl.psum)
        for kt in nl.affine_range(x_in.shape[0] // 128):
            acc += nl.matmul(nl.load(x_in[kt * 128:(kt + 1) * 128, :]), nl.load(y_in[kt * 128:(kt + 1) * 128, :]),
                             transpose_x=True)
        return store(acc)

    x, y = f32(rng, 256, 128), f32(rng, 256, 512)
    np.testing.assert_allclose(k(x, y), x.astype(np.float64).T @ y, rtol=1e-5, atol=1e-4)
    assert "tensor_tensor" not in k.specialize(x, y).text(locations=False)


def test_lazy_initialization_is_a_hint_that_changes_no_value(rng):
    @nki.jit
    def k(x_in, y_in):
        acc = nl.zeros((x_in.shape[1], y_in.shape[1]), nl.float32, buffer=nl.psum, lazy_initialization=True)
        for kt in nl.affine_range(x_in.shape[0] // 128):
            acc += nl.matmul(nl.load(x_in[kt * 128:(kt + 1) * 128, :]), nl.load(y_in[kt * 128:(kt + 1) * 128, :]),
                             transpose_x=True)
        low = nl.full((x_in.shape[1], 4), -3.0, nl.float32, lazy_initialization=False)
        return store(acc), store(low)

    x, y = f32(rng, 256, 128), f32(rng, 256, 64)
    acc, low = k(x, y)
    np.testing.assert_allclose(acc, x.astype(np.float64).T @ y, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(low, np.full((128, 4), -3.0, np.float32))

    @nki.jit
    def bad(x_in):
        return store(nl.zeros((128, 4), nl.float32, lazy_initialization="yes"))

    with pytest.raises(nki.KernelError, match="lazy_initialization"):
        bad(x)


@pytest.mark.parametrize("shape", [(32, 16), (128, 96)])
def test_transpose(rng, shape):
    a = f32(rng, *shape)
    np.testing.assert_array_equal(unary_kernel(nl.transpose)(a), a.T)


# --- load / store / copy / where --------------------------------------------------------------

def test_load_store_slices_and_dtype(rng):
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(a.shape[0] // 64):
            tile = nl.load(a[i * 64:(i + 1) * 64, :], dtype=nl.bfloat16)
            nl.store(out[i * 64:(i + 1) * 64, :], value=tile)
        # A 1-D HBM view loads as a partition vector [N, 1] (Beta 1: dim 0 is the partition dim;
        # NKI's mamba tutorial passes such a load as activation's per-partition scale).
        v = nl.load(a[0])
        assert v.shape == (a.shape[1], 1)
        return out

    a = f32(rng, 256, 32)
    np.testing.assert_array_equal(k(a), a.astype(BF16).astype(np.float32))


def test_load_and_store_of_single_elements(rng):
    """t[b, h] is a 0-d view: it loads as a [1, 1] tile and a [1, 1] tile stores into it (the
    sample flash attention backward loads its per-head sink this way)."""
    @nki.jit
    def k(s):
        out = nl.ndarray(s.shape, nl.float32, buffer=nl.shared_hbm)
        for b in nl.affine_range(s.shape[0]):
            for h in nl.affine_range(s.shape[1]):
                element = nl.load(s[b, h], dtype=nl.float32)
                assert element.shape == (1, 1)
                nl.store(out[b, h], nl.multiply(element, 2.0))
        return out

    s = f32(rng, 2, 3).astype(BF16)
    np.testing.assert_array_equal(k(s), 2 * s.astype(np.float32))


def test_store_psum_tile_and_copy_from_psum(rng):
    @nki.jit
    def k(a):
        p = nl.ndarray(a.shape, nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=p, src=nl.load(a))
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, p)  # staged through SBUF
        c = nl.copy(p, dtype=nl.bfloat16)
        assert c.buffer == nl.sbuf
        return out, store(c)

    a = f32(rng, 16, 16)
    out, c = k(a)
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(c, a.astype(BF16))


def test_load_transpose2d(rng):
    a = f32(rng, 48, 64)
    np.testing.assert_array_equal(unary_kernel(lambda x: x)(a), a)

    @nki.jit
    def k(x_in):
        return store(nl.load_transpose2d(x_in))

    np.testing.assert_array_equal(k(a), a.T)


def test_where(rng):
    @nki.jit
    def k(a, b, m):
        x, y, cond = nl.load(a), nl.load(b), nl.load(m)
        return store(nl.where(cond, x, y)), store(nl.where(x > y, x, 0.0)), store(nl.where(cond, 1.0, y))

    a, b = f32(rng, 32, 24), f32(rng, 32, 24)
    m = (rng.random((32, 24)) > 0.5).astype(np.float32)  # a float condition: nonzero is true
    w1, w2, w3 = k(a, b, m)
    np.testing.assert_array_equal(w1, np.where(m != 0, a, b))
    np.testing.assert_array_equal(w2, np.where(a > b, a, np.float32(0)))
    np.testing.assert_array_equal(w3, np.where(m != 0, np.float32(1), b))


def test_broadcast_to_and_expand_dims(rng):
    @nki.jit
    def k(c):
        col = nl.load(c)
        wide = nl.copy(nl.broadcast_to(col, (c.shape[0], 6)))
        e = nl.expand_dims(col, 2)
        assert e.shape == (c.shape[0], 1, 1)
        return store(wide)

    c = f32(rng, 16, 1)
    np.testing.assert_array_equal(k(c), np.broadcast_to(c, (16, 6)))


# --- device_print -----------------------------------------------------------------------------

def test_device_print(capfd):
    @nki.jit
    def k(a):
        x = nl.load(a)
        nl.device_print("x =", x)
        return store(x)

    k(np.array([[1.5, -2.0], [3.0, 4.25]], np.float32))
    out = capfd.readouterr().out
    assert "x =" in out and "1.5" in out and "-2" in out and "4.25" in out
    assert out.index("1.5") < out.index("4.25")  # printed at run time, in element order


# --- SPMD -------------------------------------------------------------------------------------

def test_program_ids_without_grid():
    seen = {}

    @nki.jit
    def k(a):
        seen.update(pid=nl.program_id(0), n=nl.num_programs(), nd=nl.program_ndim())
        return store(nl.load(a))

    k(np.zeros((1, 1), np.float32))
    assert seen == {"pid": 0, "n": 1, "nd": 0}


def test_spmd_grid_1d_writes_shared_output(rng):
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        rows = a.shape[0] // nl.num_programs(0)
        i = nl.program_id(0)
        t = nl.load(a[i * rows:(i + 1) * rows, :])
        nl.store(out[i * rows:(i + 1) * rows, :], t * float(i + 1))
        return out

    a = f32(rng, 64, 8)
    out = k[2](a)
    np.testing.assert_array_equal(out[:32], a[:32])
    np.testing.assert_array_equal(out[32:], a[32:] * np.float32(2))


def test_spmd_grid_2d(rng):
    seen = []

    @nki.jit
    def k(a):
        out = nl.ndarray((2, 3), nl.float32, buffer=nl.shared_hbm)
        i, j = nl.program_id(0), nl.program_id(axis=1)
        seen.append((i, j, nl.num_programs(0), nl.num_programs(1), nl.num_programs(), nl.num_programs((0, 1)),
                     nl.program_ndim()))
        t = nl.full((1, 1), float(10 * i + j), nl.float32)
        nl.store(out[i:i + 1, j:j + 1], t)
        return out

    out = k[2, 3](np.zeros((1, 1), np.float32))
    np.testing.assert_array_equal(out, [[0, 1, 2], [10, 11, 12]])
    assert sorted(seen) == [(i, j, 2, 3, 6, 6, 2) for i in range(2) for j in range(3)]


def test_logical_nc_config_env_launches_two_programs(monkeypatch, rng):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        half = a.shape[0] // nl.num_programs()
        i = nl.program_id(0)
        nl.store(out[i * half:(i + 1) * half], nl.load(a[i * half:(i + 1) * half]) + float(i))
        return out

    a = f32(rng, 8, 4)
    out = k(a)
    np.testing.assert_array_equal(out[:4], a[:4])
    np.testing.assert_array_equal(out[4:], a[4:] + np.float32(1))


def test_iterators_unroll(rng):
    @nki.jit
    def k(a):
        acc = nl.zeros((a.shape[0], a.shape[1]), nl.float32)
        count = 0
        for _ in nl.sequential_range(3):
            count += 1  # Python code runs at trace time, every iteration (NKI 0.2+)
        for i in nl.static_range(1, 4, 2):  # 1, 3
            acc += float(i)
        with nl.no_reorder():
            acc += float(count)
        return store(acc)

    np.testing.assert_array_equal(k(np.zeros((4, 4), np.float32)), np.full((4, 4), 7.0, np.float32))


def test_memory_predicates():
    seen = {}

    @nki.jit
    def k(a):
        t, p = nl.load(a), nl.zeros(a.shape, nl.float32, buffer=nl.psum)
        out = store(t)
        seen.update(a=(nl.is_hbm(a.buffer), nl.is_on_chip(a.buffer)), t=(nl.is_sbuf(t.buffer), nl.is_psum(t.buffer)),
                    p=(nl.is_psum(p.buffer), nl.is_on_chip(p.buffer)), out=(nl.is_hbm(out.buffer), out.buffer))
        return out

    a = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(k(a), a)
    assert seen == {"a": (True, False), "t": (True, False), "p": (True, True), "out": (True, nl.shared_hbm)}
    assert nl.is_hbm(nl.private_hbm) and not nl.is_sbuf(nl.psum)


def test_var_over_trailing_axes_and_keepdims(rng):
    @nki.jit
    def k(a):
        x = nl.load(a)
        return store(nl.var(x, axis=2)), store(nl.var(x, axis=(1, 2), keepdims=True)), \
            store(nl.mean(x, axis=2, keepdims=True))

    a = f32(rng, 16, 4, 24)
    v2, v12, m2 = k(a)
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(v2, a64.var(2), rtol=1e-5)  # fp32 sums of 24 terms
    assert v12.shape == (16, 1, 1)
    np.testing.assert_allclose(v12, a64.var((1, 2), keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(m2, a64.mean(2, keepdims=True), rtol=1e-5, atol=1e-7)


def test_like_constructors_of_an_hbm_input(rng):
    @nki.jit
    def k(a):
        z = nl.zeros_like(a)  # NKI: zeros_like defaults to SBUF, even for an HBM tensor
        o = nl.ones_like(a, dtype=nl.int32)
        e = nl.empty_like(a)  # empty_like keeps x's buffer
        assert z.buffer == nl.sbuf and o.buffer == nl.sbuf and e.buffer == nl.shared_hbm  # an argument's
        return store(z), store(o)

    z, o = k(f32(rng, 4, 5))
    np.testing.assert_array_equal(z, np.zeros((4, 5), np.float32))
    np.testing.assert_array_equal(o, np.ones((4, 5), np.int32))


def test_comparison_dtype_argument(rng):
    @nki.jit
    def k(a, b):
        x, y = nl.load(a), nl.load(b)
        return store(nl.greater(x, y, dtype=nl.float32)), store(nl.logical_and(x > 0, y > 0, dtype=nl.uint8))

    a, b = f32(rng, 8, 8), f32(rng, 8, 8)
    g, land = k(a, b)
    assert g.dtype == np.float32 and land.dtype == np.uint8
    np.testing.assert_array_equal(g, (a > b).astype(np.float32))
    np.testing.assert_array_equal(land, ((a > 0) & (b > 0)).astype(np.uint8))
