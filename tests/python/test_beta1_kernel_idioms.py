"""Idioms of Beta 1 (``neuronxcc.nki``) kernels that nki-samples' kernels rely on, against numpy:
nl.loop_reduce, slices past a tensor's end trimmed by a mask, rows gathered through a [P, 1] index
tile, nl.mgrid's named axes, numpy broadcasting of nl binary ops / nl.where / legacy
tensor_tensor, nl.par_dim on HBM, masks on reductions, nl.shared_constant, matmul and
affine_select operands in PSUM, fresh tiles written straight into their destination (masked
ones too when the mask keeps the whole tile), partition broadcasts copied once where they are
made; and the
nl functions nikki composes from several instructions (floor, ceil, trunc, fmod, mod, cos, tan,
abs_max, abs_min).

Tolerances: data movement and selections are exact; fp32 sums of a few terms compare with
rtol 1e-6; the composites are exact where they only round through int32 (floor/ceil/trunc) and
within the fp32 rounding of x * (1 / y) or of sin(x + pi/2) otherwise (stated per test).
"""

import ml_dtypes
import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl


def test_loop_reduce_accumulates_over_the_named_loop(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray((a.shape[1], a.shape[1]), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((a.shape[1], a.shape[1]), nl.float32, buffer=nl.sbuf)
        for k in nl.affine_range(a.shape[0] // 128):
            tile = nl.load(a[k * 128:(k + 1) * 128, :])
            acc[...] = nl.loop_reduce(nl.matmul(tile, tile, transpose_x=True), op=np.add, loop_indices=[k],
                                      dtype=nl.float32)
        nl.store(out, acc)
        return out

    a = rng.standard_normal((384, 64), dtype=np.float32)
    np.testing.assert_allclose(kernel(a), a.T.astype(np.float64) @ a, rtol=1e-5, atol=1e-4)


def test_slices_past_the_end_are_trimmed_by_the_mask(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        for t in nl.affine_range((a.shape[0] + 127) // 128):
            i_p = nl.arange(128)[:, None, None] + t * 128
            tile = nl.ndarray((128, a.shape[1], a.shape[2]), a.dtype)
            nisa.dma_copy(dst=tile, src=a[t * 128:(t + 1) * 128, :, :], mask=(i_p < a.shape[0]))
            nl.store(out[t * 128:(t + 1) * 128, :, :], tile, mask=(i_p < a.shape[0]))
        return out

    a = rng.standard_normal((200, 3, 5), dtype=np.float32)
    np.testing.assert_array_equal(kernel(a), a)


def test_unmasked_slice_past_the_end_still_fails_at_the_slice():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 4, 4), a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a[0:128, :, :]))
        return out

    with pytest.raises(nki.KernelError, match=r"tensor 'a': out-of-bound access on dim 0: index range \[0, 127\]"):
        kernel(np.zeros((100, 4, 4), np.float32))


def test_rows_gathered_through_an_index_tile(rng):
    @nki.jit
    def kernel(table, idx):
        out = nl.ndarray((idx.shape[0], table.shape[1]), table.dtype, buffer=nl.shared_hbm)
        rows = nl.load(idx)
        i_f = nl.arange(table.shape[1])[None, :]
        nl.store(out, nl.load(table[rows, i_f]))
        return out

    table = rng.standard_normal((50, 6), dtype=np.float32)
    idx = rng.integers(0, 50, (20, 1)).astype(np.int32)
    np.testing.assert_array_equal(kernel(table, idx), table[idx[:, 0]])


def test_mgrid_names_axes_p_x_y_z(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        g = nl.mgrid[0:a.shape[0], 0:a.shape[1], 0:a.shape[2], 0:a.shape[3]]
        tile = nl.ndarray(a.shape, a.dtype)
        tile[g.p, g.x, g.y, g.z] = nl.load(a[g.p, g.x, g.y, g.z])
        nl.store(out, tile)
        return out

    a = rng.standard_normal((8, 2, 3, 4), dtype=np.float32)
    np.testing.assert_array_equal(kernel(a), a)


def test_binary_ops_where_and_legacy_tensor_tensor_broadcast_like_numpy(rng):
    @nki.jit
    def kernel(a, b, s):
        t, u, scale = nl.load(a), nl.load(b), nl.load(s)
        outs = []
        for value in (nl.equal(t, u), nl.where(nl.greater(u, 0.0), t, u),
                      nisa.tensor_tensor(t.reshape((8, 12)), scale, nl.multiply)):
            out = nl.ndarray(value.shape, nl.float32, buffer=nl.shared_hbm)
            nl.store(out, nl.copy(value, dtype=nl.float32))
            outs.append(out)
        return tuple(outs)

    a = rng.integers(0, 3, (8, 3, 4)).astype(np.float32)
    b = rng.integers(0, 3, (8, 1, 4)).astype(np.float32) - 1
    s = rng.standard_normal((8, 1), dtype=np.float32)
    eq, where, scaled = kernel(a, b, s)
    np.testing.assert_array_equal(eq, (a == b).astype(np.float32))
    np.testing.assert_array_equal(where, np.where(b > 0, a, b))
    np.testing.assert_array_equal(scaled, a.reshape(8, 12) * s)


def test_operands_of_as_many_elements_per_partition_are_used_as_they_are(rng):
    """(8, 2, 1) and (8, 1, 2) broadcast to (8, 2, 2) under numpy's rule; NKI's tensor_tensor and
    nl.where take any shapes holding as many elements per partition, element by element."""
    @nki.jit
    def kernel(a, b, c):
        t, u, cond = nl.load(a), nl.load(b), nl.load(c)
        product = nisa.tensor_tensor(t, u, nl.multiply)
        chosen = nl.where(cond, t.reshape((8, 1, 2)), -1.0)
        outs = []
        for value in (product, chosen):
            out = nl.ndarray(value.shape, nl.float32, buffer=nl.shared_hbm)
            nl.store(out, nl.copy(value, dtype=nl.float32))
            outs.append(out)
        return tuple(outs)

    a = rng.standard_normal((8, 2, 1), dtype=np.float32)
    b = rng.standard_normal((8, 1, 2), dtype=np.float32)
    c = rng.integers(0, 2, (8, 2)).astype(np.uint8)
    product, chosen = kernel(a, b, c)
    assert product.shape == (8, 2, 1) and chosen.shape == (8, 2)
    np.testing.assert_array_equal(product.reshape(8, 2), a.reshape(8, 2) * b.reshape(8, 2))
    np.testing.assert_array_equal(chosen, np.where(c != 0, a.reshape(8, 2), np.float32(-1.0)))


def test_par_dim_on_hbm_is_a_number(rng):
    @nki.jit
    def kernel(a):
        scratch = nl.ndarray((2, nl.par_dim(8), 4), a.dtype, buffer=nl.private_hbm)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(scratch, nl.load(a))
        nl.store(out, nl.load(scratch))
        return out

    a = rng.standard_normal((2, 8, 4), dtype=np.float32)
    np.testing.assert_array_equal(kernel(a), a)


def test_mask_on_a_reduction_restricts_the_reduced_axes(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        i_f = nl.arange(a.shape[1])[None, :]
        nl.store(out, nl.sum(nl.load(a), axis=[1], mask=(i_f < 5)))
        return out

    a = rng.standard_normal((16, 8), dtype=np.float32)
    np.testing.assert_allclose(kernel(a), a[:, :5].sum(axis=1, keepdims=True), rtol=1e-6)


def test_shared_constant_is_an_input_built_into_the_kernel(rng):
    table = rng.standard_normal((16, 8))  # float64 becomes float32

    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        c = nl.shared_constant(table)
        ident = nl.shared_constant(np.identity(16, dtype=np.int8), dtype=nl.bfloat16)
        nl.store(out, nl.add(nl.load(a), nl.load(c)))
        assert ident.dtype == nl.bfloat16 and c.dtype == nl.float32
        return out

    a = rng.standard_normal((16, 8), dtype=np.float32)
    np.testing.assert_array_equal(kernel(a), a + table.astype(np.float32))
    np.testing.assert_array_equal(kernel(a), a + table.astype(np.float32))  # cached specialization


def test_psum_operands_of_legacy_matmul_and_affine_select_are_staged(rng):
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.shared_hbm)
        aT = nisa.nc_transpose(nl.load(a))  # a PSUM tile, multiplied straight away (Beta 1)
        prod = nisa.nc_matmul(aT, nl.load(b))
        i_q = nl.arange(a.shape[1])[:, None]
        i_k = nl.arange(b.shape[1])[None, :]
        nl.store(out, nisa.affine_select(i_q >= i_k, prod, -1.0))
        return out

    a = rng.standard_normal((32, 32), dtype=np.float32)
    b = rng.standard_normal((32, 32), dtype=np.float32)
    expected = np.where(np.tril(np.ones((32, 32), bool)), a.astype(np.float64) @ b, -1.0)
    np.testing.assert_allclose(kernel(a, b), expected, rtol=1e-5, atol=1e-5)


def test_fresh_results_are_produced_in_place():
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        blocks = nl.ndarray((2, nl.par_dim(a.shape[0]), a.shape[1]), a.dtype)
        blocks[0] = nl.load(a)       # the load writes the block: no extra tile, no copy
        t = nl.exp(blocks[0])
        blocks[1] = t                # named: a copy, t stays usable
        nl.store(out, nl.add(blocks[1], t))
        return out

    a = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    np.testing.assert_allclose(kernel(a), 2 * np.exp(a), rtol=2e-7)
    opcodes = [i["opcode"] for i in kernel.specialize(a).programs[0].kernel.instructions()]
    assert opcodes.count("tensor_copy") == 1 and opcodes.count("dma_copy") == 2


def test_masked_fresh_results_are_produced_in_place_when_the_mask_keeps_the_whole_tile():
    @nki.jit
    def kernel(a, width):
        out = nl.ndarray((128, 1024), nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.arange(128)[:, None], nl.arange(512)[None, :]
        x = nl.load(a)
        doubled = nl.zeros((128, 1024), dtype=nl.float32)
        for j in nl.affine_range(2):
            # the mask keeps every element when width is 1024, and half of the second chunk at 768
            doubled[i_p, j * 512 + i_f] = nisa.tensor_scalar(x[i_p, j * 512 + i_f], op0=np.multiply, operand0=2.0,
                                                             mask=(j * 512 + i_f < width))
        nl.store(out, doubled)
        return out

    a = np.random.default_rng(3).standard_normal((128, 1024)).astype(np.float32)
    for width, copies in ((1024, 0), (768, 1)):
        want = np.where(np.arange(1024) < width, 2 * a, 0)  # doubling is exact in fp32
        np.testing.assert_array_equal(kernel(a, width), want)
        opcodes = [i["opcode"] for i in kernel.specialize(a, width).programs[0].kernel.instructions()]
        assert opcodes.count("tensor_copy") == copies, (width, opcodes)


def test_partition_broadcast_made_before_a_loop_is_copied_once():
    @nki.jit
    def kernel(x, w):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        w_row = nl.load(w)                             # [1, F]
        w_all = w_row.broadcast_to((128, x.shape[1]))  # a new tile, copied here
        for i in nl.affine_range(x.shape[0] // 128):
            rows = nl.load(x[i * 128:(i + 1) * 128, :])
            nl.store(out[i * 128:(i + 1) * 128, :], nisa.tensor_tensor(rows, w_all, op=nl.multiply))
        return out

    rng = np.random.default_rng(4)
    x = rng.standard_normal((512, 64)).astype(np.float32)
    w = rng.standard_normal((1, 64)).astype(np.float32)
    np.testing.assert_array_equal(kernel(x, w), x * w)  # one fp32 product per element: exact
    opcodes = [i["opcode"] for i in kernel.specialize(x, w).programs[0].kernel.instructions()]
    assert opcodes.count("dma_copy") == 4 + 4 + 1 + 1  # loads, stores, w, one broadcast copy


def test_bf16_per_partition_operands_become_fp32(rng):
    @nki.jit
    def kernel(a, s):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.divide(nl.load(a), nl.load(s), dtype=nl.float32))
        return out

    a = rng.standard_normal((8, 16), dtype=np.float32)
    s = (rng.random((8, 1)) + 0.5).astype(ml_dtypes.bfloat16)
    expected = a * (1.0 / s.astype(np.float32)).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_allclose(kernel(a, s), expected, rtol=1e-6)


# --- composites --------------------------------------------------------------------------------

def _unary(fn, a, dtype=None):
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype or x.dtype, buffer=nl.shared_hbm)
        nl.store(out, fn(nl.load(x)))
        return out

    return kernel(a)


def test_floor_ceil_trunc_are_exact(rng):
    a = np.concatenate([rng.standard_normal(200, dtype=np.float32) * 50,
                        np.array([0.5, -0.5, 2.0, -3.0, 1e9, -1e9, 3e38, -0.0], np.float32)]).reshape(8, 26)
    np.testing.assert_array_equal(_unary(nl.floor, a), np.floor(a))
    np.testing.assert_array_equal(_unary(nl.ceil, a), np.ceil(a))
    np.testing.assert_array_equal(_unary(nl.trunc, a), np.trunc(a))
    i = rng.integers(-100, 100, (8, 16)).astype(np.int32)
    np.testing.assert_array_equal(_unary(nl.floor, i), i)


def test_mod_and_fmod_follow_numpy_signs(rng):
    x = rng.uniform(-50, 50, (8, 32)).astype(np.float32)

    def remainders(fn):
        return _unary(lambda t: fn(t, 3.0), x)

    # x * (1/3) rounds, so near-integer quotients may land one step off: compare the remainders
    # modulo 3 with a tolerance of a few ulps of x
    for got, want in ((remainders(nl.fmod), np.fmod(x, 3.0)), (remainders(nl.mod), np.mod(x, 3.0))):
        diff = np.abs(got - want)
        assert np.all((diff < 1e-4) | (np.abs(diff - 3.0) < 1e-4))
    assert np.all(np.sign(remainders(nl.mod)) >= 0)


def test_cos_tan_abs_max_abs_min(rng):
    x = rng.uniform(-3, 3, (8, 32)).astype(np.float32)
    y = rng.standard_normal((8, 32), dtype=np.float32)
    # cos(x) = sin(x + pi/2): the fp32 rounding of x + pi/2 (|error| <= 2^-22 for |x| < 4)
    np.testing.assert_allclose(_unary(nl.cos, x), np.cos(x.astype(np.float64)), atol=5e-7)
    keep = np.abs(np.cos(x)) > 0.1
    np.testing.assert_allclose(_unary(nl.tan, x)[keep], np.tan(x.astype(np.float64))[keep], rtol=1e-5)

    @nki.jit
    def magnitudes(a, b):
        hi = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        lo = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(hi, nl.abs_max(nl.load(a), nl.load(b)))
        nl.store(lo, nl.abs_min(nl.load(a), 0.5))
        return hi, lo

    hi, lo = magnitudes(x, y)
    np.testing.assert_array_equal(hi, np.maximum(np.abs(x), np.abs(y)))
    np.testing.assert_array_equal(lo, np.minimum(np.abs(x), 0.5))
