"""Legacy (Beta 1) index expressions: nl.arange / nl.mgrid subscripts, mask= predicates, legacy
nisa.iota / nisa.affine_select and block-dim tensors, run as real kernels against numpy."""

import os

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl
from nikki import KernelError


def _line_of(marker: str) -> int:
    """Line number in this file of the line ending with the comment `# <marker>`."""
    with open(__file__) as f:
        for number, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# {marker}"):
                return number
    raise AssertionError(f"marker {marker!r} not found")


def _expect_error(kernel, args, wording: str, marker: str) -> KernelError:
    """Runs kernel(*args), expecting a KernelError that says `wording` and points at the marked line."""
    with pytest.raises(KernelError) as info:
        kernel(*args)
    err = info.value
    assert wording in str(err), str(err)
    assert os.path.realpath(err.file) == os.path.realpath(__file__), str(err)
    assert err.line == _line_of(marker), str(err)
    assert f'line {err.line}' in str(err) and os.path.basename(__file__) in str(err)
    return err


# --- tiling with masks ----------------------------------------------------------------------------

@nki.jit
def tiled_add(a, b):
    n, m = a.shape
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(512)[None, :]
    for i in nl.affine_range((n + 127) // 128):
        for j in nl.affine_range((m + 511) // 512):
            keep = (i_p + 128 * i < n) & (i_f + 512 * j < m)
            ta = nl.load(a[i_p + 128 * i, i_f + 512 * j], mask=keep)
            tb = nl.load(b[i * 128 + i_p, j * 512 + i_f], mask=keep)
            total = nl.add(ta, tb, mask=keep)
            nl.store(out[i_p + 128 * i, i_f + 512 * j], value=total, mask=keep)
    return out


def test_tiled_add_over_ragged_shape(rng):
    a = rng.standard_normal((300, 700), dtype=np.float32)
    b = rng.standard_normal((300, 700), dtype=np.float32)
    np.testing.assert_array_equal(tiled_add(a, b), a + b)


def test_tiled_add_exact_multiple(rng):
    a = rng.standard_normal((256, 512), dtype=np.float32)
    b = rng.standard_normal((256, 512), dtype=np.float32)
    np.testing.assert_array_equal(tiled_add(a, b), a + b)


@nki.jit
def tiled_copy_isa(a):
    n, m = a.shape
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:128]
    for i in nl.affine_range((n + 127) // 128):
        rows = i_p + 128 * i < n
        tile = nl.load(a[i_p + 128 * i, i_f], mask=rows)
        copied = nisa.tensor_copy(tile, mask=rows)
        nl.store(out[i_p + 128 * i, i_f], value=copied, mask=rows)
    return out


def test_functional_isa_with_mask(rng):
    a = rng.standard_normal((200, 128), dtype=np.float32)
    np.testing.assert_array_equal(tiled_copy_isa(a), a)


@nki.jit
def masked_nothing(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(64)[None, :]
    nl.store(out[i_p, i_f], value=nl.zeros((128, 64), a.dtype))
    tile = nl.load(a[i_p, i_f])
    nl.store(out[i_p, i_f], value=tile, mask=(i_p + 128 >= 1000))  # keeps nothing: skipped
    nl.store(out[i_p, i_f], value=tile, mask=False)
    nl.store(out[i_p, i_f], value=tile, mask=(i_p == 5))  # exactly one row
    return out


def test_masks_that_keep_nothing_or_one_row(rng):
    a = rng.standard_normal((128, 64), dtype=np.float32)
    expected = np.zeros_like(a)
    expected[5] = a[5]
    np.testing.assert_array_equal(masked_nothing(a), expected)


# --- expressions ------------------------------------------------------------------------------

@nki.jit
def strided(a):
    out = nl.ndarray((a.shape[0] // 2, a.shape[1] // 2), a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(a.shape[0] // 2)[:, None]
    i_f = nl.arange(a.shape[1] // 2)[None, :]
    tile = nl.load(a[2 * i_p, 2 * i_f + 1])  # even rows, odd columns
    nl.store(out[i_p, i_f], value=tile)
    return out


def test_strided_expressions(rng):
    a = rng.standard_normal((256, 1024), dtype=np.float32)
    np.testing.assert_array_equal(strided(a), a[0::2, 1::2])


@nki.jit
def shifted(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(a.shape[1])[None, :]
    nl.store(out[i_p, i_f], value=nl.zeros((128, a.shape[1]), a.dtype))
    tile = nl.load(a[i_p, i_f - 3], mask=(i_f >= 3))
    nl.store(out[i_p, i_f], value=tile, mask=(i_f - 3 >= 0))
    return out


def test_negative_offset_made_legal_by_mask(rng):
    a = rng.standard_normal((128, 100), dtype=np.float32)
    expected = np.zeros_like(a)
    expected[:, 3:] = a[:, :-3]
    np.testing.assert_array_equal(shifted(a), expected)


@nki.jit
def mgrid_copy(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:512]
    tile = nl.load(a[i_p, i_f])
    grid = nl.mgrid[0:128, 0:512]
    nl.store(out[grid.p, grid.x], value=tile)
    return out


def test_mgrid(rng):
    a = rng.standard_normal((128, 512), dtype=np.float32)
    np.testing.assert_array_equal(mgrid_copy(a), a)


@nki.jit
def arange_with_start_and_step(a):
    out = nl.ndarray((64, 32), a.dtype, buffer=nl.shared_hbm)
    rows = nl.arange(1, 128, 2)[:, None]  # odd rows
    cols = nl.arange(10, 42)[None, :]
    tile = nl.load(a[rows, cols])
    nl.store(out[nl.arange(64)[:, None], nl.arange(32)[None, :]], value=tile)
    return out


def test_arange_start_stop_step(rng):
    a = rng.standard_normal((128, 64), dtype=np.float32)
    np.testing.assert_array_equal(arange_with_start_and_step(a), a[1::2, 10:42])


@nki.jit
def batched_scale(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(a.shape[1])[:, None]
    i_f = nl.arange(a.shape[2])[None, :]
    for b in nl.affine_range(a.shape[0]):
        tile = nl.load(a[b, i_p, i_f])
        nl.store(out[b, i_p, i_f], value=nl.multiply(tile, 2.0))
    return out


def test_integers_mixed_with_expressions(rng):
    a = rng.standard_normal((3, 128, 256), dtype=np.float32)
    np.testing.assert_array_equal(batched_scale(a), a * 2)


@nki.jit
def grid_3d(a):
    blocks, parts, free = a.shape
    out = nl.ndarray((parts, blocks, free), a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(parts)[:, None, None]
    i_b = nl.arange(blocks)[None, :, None]
    i_f = nl.arange(free)[None, None, :]
    tile = nl.load(a[i_b, i_p, i_f])  # grid axes: (partition, block, free)
    assert tile.shape == (parts, blocks, free)
    nl.store(out[i_p, i_b, i_f], value=tile)
    return out


def test_3d_grid_result_dims_follow_grid_axes(rng):
    a = rng.standard_normal((4, 128, 64), dtype=np.float32)
    np.testing.assert_array_equal(grid_3d(a), a.transpose(1, 0, 2))


@nki.jit
def flat_index(a):
    out = nl.ndarray((128, 64), a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(64)[None, :]
    tile = nl.load(a[i_p * 64 + i_f])  # one tensor dim driven by two grid axes
    nl.store(out[i_p, i_f], value=tile)
    return out


def test_two_grid_axes_in_one_dim(rng):
    a = rng.standard_normal(128 * 64, dtype=np.float32)
    np.testing.assert_array_equal(flat_index(a), a.reshape(128, 64))


@nki.jit
def sbuf_subtiles(a):
    out = nl.ndarray((128, 256), a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(256)[None, :]
    whole = nl.ndarray((128, 512), a.dtype, buffer=nl.sbuf)
    whole[i_p, i_f] = nl.load(a[i_p, i_f])  # legacy assignment through index expressions
    whole[i_p, i_f + 256] = nl.load(a[i_p, i_f + 256])
    right = nl.copy(whole[i_p, i_f + 256])
    left = nl.copy(whole[i_p, i_f])
    nl.store(out[i_p, i_f], value=nl.subtract(right, left))
    return out


def test_on_chip_tiles_indexed_by_expressions(rng):
    a = rng.standard_normal((128, 512), dtype=np.float32)
    np.testing.assert_array_equal(sbuf_subtiles(a), a[:, 256:] - a[:, :256])


@nki.jit
def masked_3d(a):
    blocks, parts, free = a.shape
    out = nl.ndarray((parts, blocks, free), a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None, None]
    i_b = nl.arange(blocks)[None, :, None]
    i_f = nl.arange(free)[None, None, :]
    rows = i_p < parts
    tile = nl.load(a[i_b, i_p, i_f], mask=rows)
    doubled = nl.multiply(tile, 2.0, mask=rows)
    nl.store(out[i_p, i_b, i_f], value=doubled, mask=rows)
    return out


def test_3d_grid_with_partition_mask(rng):
    a = rng.standard_normal((3, 100, 32), dtype=np.float32)
    np.testing.assert_array_equal(masked_3d(a), a.transpose(1, 0, 2) * 2)


@nki.jit
def numpy_integer_offsets(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(64)[:, None]
    i_f = nl.arange(a.shape[1])[None, :]
    for i in np.arange(2):  # numpy integer loop indices mix with index expressions
        tile = nl.load(a[i * 64 + i_p, i_f])
        nl.store(out[np.int64(64) * i + i_p, i_f], value=tile)
    return out


def test_numpy_integers_in_expressions(rng):
    a = rng.standard_normal((128, 32), dtype=np.float32)
    np.testing.assert_array_equal(numpy_integer_offsets(a), a)


@nki.jit
def legacy_matmul(lhs_t, rhs):
    k_size, m_size = lhs_t.shape
    n_size = rhs.shape[1]
    out = nl.ndarray((m_size, n_size), nl.float32, buffer=nl.shared_hbm)
    i_k = nl.arange(128)[:, None]
    i_m = nl.arange(128)[None, :]
    i_n = nl.arange(n_size)[None, :]
    i_p = nl.arange(128)[:, None]
    acc = nl.zeros((m_size // 128, nl.par_dim(128), n_size), nl.float32, buffer=nl.psum)
    for m in nl.affine_range(m_size // 128):
        for k in nl.affine_range(k_size // 128):
            stationary = nl.load(lhs_t[k * 128 + i_k, m * 128 + i_m])
            moving = nl.load(rhs[k * 128 + i_k, i_n])
            acc[m] += nisa.nc_matmul(stationary, moving)
        nl.store(out[m * 128 + i_p, i_n], value=nl.copy(acc[m, i_p, i_n]))
    return out


def test_legacy_matmul_into_psum_block_tensor(rng):
    lhs_t = rng.standard_normal((256, 256), dtype=np.float32)
    rhs = rng.standard_normal((256, 512), dtype=np.float32)
    np.testing.assert_allclose(legacy_matmul(lhs_t, rhs), lhs_t.T @ rhs, rtol=1e-4, atol=1e-4)


@nki.jit
def dynamic_batch(a, idx):
    out = nl.ndarray(a.shape[1:], a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(a.shape[1])[:, None]
    i_f = nl.arange(a.shape[2])[None, :]
    which = nl.load(idx)  # a 1x1 int32 tile: the batch is known only at run time
    tile = nl.load(a[which, i_p, i_f])
    nl.store(out[i_p, i_f], value=tile)
    return out


def test_runtime_index_next_to_expressions(rng):
    a = rng.standard_normal((4, 128, 64), dtype=np.float32)
    for b in (0, 2, 3):
        np.testing.assert_array_equal(dynamic_batch(a, np.full((1, 1), b, np.int32)), a[b])


@nki.jit
def device_loop_copy(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(a.shape[1])[:, None]
    i_f = nl.arange(a.shape[2])[None, :]
    for b in nl.dynamic_range(a.shape[0]):  # b is a register: the loop runs on the device
        nl.store(out[b, i_p, i_f], value=nl.load(a[b, i_p, i_f]))
    return out


def test_register_index_next_to_expressions(rng):
    a = rng.standard_normal((3, 128, 32), dtype=np.float32)
    np.testing.assert_array_equal(device_loop_copy(a), a)


# --- legacy iota / affine_select --------------------------------------------------------------

@nki.jit
def iotas(dummy):
    row = nl.ndarray((1, 512), nl.int32, buffer=nl.shared_hbm)
    col = nl.ndarray((128, 1), nl.int32, buffer=nl.shared_hbm)
    both = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    nl.store(row, value=nisa.iota(nl.arange(512)[None, :], dtype=nl.int32))
    nl.store(col, value=nisa.iota(5 + 2 * nl.arange(128)[:, None], nl.int32))
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(64)[None, :]
    nl.store(both, value=nisa.iota(i_p * 3 + i_f - 7, dtype=nl.float32))
    return row, col, both


def test_legacy_iota_values():
    row, col, both = iotas(np.zeros((1, 1), np.float32))
    np.testing.assert_array_equal(row, np.arange(512, dtype=np.int32)[None, :])
    np.testing.assert_array_equal(col, (5 + 2 * np.arange(128, dtype=np.int32))[:, None])
    p, f = np.mgrid[0:128, 0:64]
    np.testing.assert_array_equal(both, (p * 3 + f - 7).astype(np.float32))


@nki.jit
def masked_iota(dummy):
    out = nl.ndarray((128, 64), nl.int32, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:64]
    values = nisa.iota(i_p * 100 + i_f, nl.int32, mask=(i_p >= 64) & (i_p < 120) & (i_f >= 10))
    nl.store(out, value=values)
    return out


def test_legacy_iota_with_mask():
    out = masked_iota(np.zeros((1, 1), np.float32))
    p, f = np.mgrid[0:128, 0:64]
    np.testing.assert_array_equal(out[64:120, 10:], (p * 100 + f)[64:120, 10:])


@nki.jit
def causal(scores):
    n = scores.shape[0]
    out = nl.ndarray(scores.shape, scores.dtype, buffer=nl.shared_hbm)
    i_q = nl.arange(128)[:, None]
    i_k = nl.arange(128)[None, :]
    for q in nl.affine_range(n // 128):
        for k in nl.affine_range(n // 128):
            tile = nl.load(scores[q * 128 + i_q, k * 128 + i_k])
            masked = nisa.affine_select(pred=(q * 128 + i_q >= k * 128 + i_k), on_true_tile=tile,
                                        on_false_value=-9984.0)
            nl.store(out[q * 128 + i_q, k * 128 + i_k], value=masked)
    return out


def test_legacy_affine_select_causal_mask(rng):
    s = rng.standard_normal((256, 256), dtype=np.float32)
    expected = np.where(np.tril(np.ones((256, 256), bool)), s, np.float32(-9984.0))
    np.testing.assert_array_equal(causal(s), expected)


@nki.jit
def select_variants(x):
    strict = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    band = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    half = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(64)[None, :]
    tile = nl.load(x)
    nl.store(strict, value=nisa.affine_select(i_f < i_p, tile, 0.0))
    nl.store(band, value=nisa.affine_select(2 * i_p - i_f + 1 >= 3, tile, -1.0, dtype=nl.float32))
    nl.store(half, value=nisa.affine_select(i_f < 19.5, tile, 7.0))
    return strict, band, half


def test_legacy_affine_select_comparisons(rng):
    x = rng.standard_normal((128, 64), dtype=np.float32)
    strict, band, half = select_variants(x)
    p, f = np.mgrid[0:128, 0:64]
    np.testing.assert_array_equal(strict, np.where(f < p, x, 0.0))
    np.testing.assert_array_equal(band, np.where(2 * p - f + 1 >= 3, x, -1.0))
    np.testing.assert_array_equal(half, np.where(f < 19.5, x, 7.0))


@nki.jit
def masked_select(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(128)[None, :]
    tile = nl.load(x)
    nl.store(out, value=nl.zeros(x.shape, x.dtype))
    selected = nisa.affine_select(i_p >= i_f, tile, -5.0, mask=(i_p < 50) & (i_f >= 20))
    nl.store(out[i_p, i_f], value=selected, mask=(i_p < 50) & (i_f >= 20))
    return out


def test_legacy_affine_select_with_mask(rng):
    x = rng.standard_normal((128, 128), dtype=np.float32)
    p, f = np.mgrid[0:128, 0:128]
    expected = np.zeros_like(x)
    expected[:50, 20:] = np.where(p >= f, x, -5.0)[:50, 20:]
    np.testing.assert_array_equal(masked_select(x), expected)


@nki.jit
def one_axis_predicates(x):
    rows = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    cols = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(64)[None, :]
    tile = nl.load(x)
    nl.store(rows, value=nisa.affine_select(i_p >= 5, tile, 0.0))  # the predicate spans (128, 1)
    nl.store(cols, value=nisa.affine_select(i_f < 10, tile, 0.0))  # ... and (1, 64)
    return rows, cols


def test_legacy_affine_select_on_one_axis(rng):
    x = rng.standard_normal((128, 64), dtype=np.float32)
    rows, cols = one_axis_predicates(x)
    p, f = np.mgrid[0:128, 0:64]
    np.testing.assert_array_equal(rows, np.where(p >= 5, x, 0.0))
    np.testing.assert_array_equal(cols, np.where(f < 10, x, 0.0))


@nki.jit
def masked_assignments(x):
    """`t[...] = op(..., mask=m)` in place, as flash attention's sliding window does: NKI masks the
    whole statement, so the elements the mask drops keep t's values."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    buf[...] = nl.load(x)
    i_p, i_f = nl.mgrid[0:128, 0:128]
    for step in nl.affine_range(2):  # a tile-level mask: kept on step 0, nothing kept on step 1
        buf[:, :] = nisa.affine_select(pred=(i_p >= i_f), on_true_tile=buf[:, :], on_false_value=-1.0,
                                       dtype=nl.float32, mask=(step == 0))
    buf[:, :] = nisa.affine_select(pred=(i_f < 100), on_true_tile=buf[:, :], on_false_value=-2.0,
                                   dtype=nl.float32, mask=(i_p < 64))  # a partition mask
    buf[:, :] = nl.add(buf[:, :], 10.0, mask=(i_f >= 120))  # an element-wise op with a free-dim mask
    nl.store(out, buf)
    return out


def test_masked_assignment_keeps_the_dropped_elements(rng):
    x = rng.standard_normal((128, 128), dtype=np.float32)
    p, f = np.mgrid[0:128, 0:128]
    expected = np.where(p >= f, x, -1.0)
    expected[:64, 100:] = -2.0
    expected[:, 120:] += 10.0
    np.testing.assert_array_equal(masked_assignments(x), expected)


@nki.jit
def masked_then_overwritten(x):
    """A fresh tile first written under a mask, then written whole: the assignment copies it all."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    i_p, i_f = nl.mgrid[0:128, 0:128]
    tile = nl.load(x)
    partial = nisa.affine_select(pred=(i_p >= i_f), on_true_tile=tile, on_false_value=0.0, mask=(i_p < 8))
    nisa.tensor_scalar(dst=partial, data=tile, op0=nl.multiply, operand0=3.0)
    buf[...] = partial
    nl.store(out, buf)
    return out


def test_whole_write_after_a_masked_one_is_assigned_whole(rng):
    x = rng.standard_normal((128, 128), dtype=np.float32)
    np.testing.assert_array_equal(masked_then_overwritten(x), x * 3.0)


# --- block tensors ----------------------------------------------------------------------------

@nki.jit
def blocks_roundtrip(a):
    nb0, nb1, p, f = a.shape
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((nb0, nb1, nl.par_dim(p), f), a.dtype, buffer=nl.sbuf)
    assert buf.shape == (nb0, nb1, p, f)
    i_p = nl.arange(p)[:, None]
    i_f = nl.arange(f)[None, :]
    for b0 in nl.affine_range(nb0):
        for b1 in nl.affine_range(nb1):
            buf[b0, b1] = nl.load(a[b0, b1])
    for b0 in nl.affine_range(nb0):
        for b1 in nl.affine_range(nb1):
            scaled = nl.multiply(buf[b0, b1, i_p, i_f], float(1 + b0 * nb1 + b1))
            nl.store(out[b0, b1, i_p, i_f], value=scaled)
    return out


def test_block_tensor_blocks_are_tiles(rng):
    a = rng.standard_normal((2, 3, 128, 256), dtype=np.float32)
    scale = (1 + np.arange(6, dtype=np.float32)).reshape(2, 3, 1, 1)
    np.testing.assert_array_equal(blocks_roundtrip(a), a * scale)


@nki.jit
def block_slices(a):
    out = nl.ndarray((2, 128, 64), a.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((4, nl.par_dim(128), 64), a.dtype, buffer=nl.sbuf)
    for b in nl.affine_range(4):
        buf[b] = nl.load(a[b])
    middle = buf[1:3]
    assert middle.shape == (2, 128, 64)
    for b in nl.affine_range(2):
        nl.store(out[b], value=middle[b])
    return out


def test_block_tensor_slices(rng):
    a = rng.standard_normal((4, 128, 64), dtype=np.float32)
    np.testing.assert_array_equal(block_slices(a), a[1:3])


@nki.jit
def block_accumulate(a):
    n, p, f = a.shape
    out = nl.ndarray((2, p, f), a.dtype, buffer=nl.shared_hbm)
    acc = nl.zeros((2, nl.par_dim(p), f), nl.float32, buffer=nl.sbuf)
    for i in nl.sequential_range(n):
        acc[i % 2] += nl.load(a[i])
    for b in nl.affine_range(2):
        nl.store(out[b], value=acc[b])
    return out


def test_block_tensor_zeros_and_accumulate(rng):
    a = rng.standard_normal((6, 128, 64), dtype=np.float32)
    expected = np.stack([a[0] + a[2] + a[4], a[1] + a[3] + a[5]])
    np.testing.assert_allclose(block_accumulate(a), expected, rtol=1e-6, atol=1e-6)


# --- errors -----------------------------------------------------------------------------------

def test_error_1d_arange(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a[nl.arange(128)]))  # ERR-1D
        return out

    err = _expect_error(kernel, (rng.standard_normal((128, 4), dtype=np.float32),),
                        "Indexing a NKI tensor with 1D arange is not supported", "ERR-1D")
    assert "nl.arange(n)[:, None]" in err.hint


def test_error_mixing_basic_and_advanced(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        nl.store(out, nl.load(a[i_p, 0:64]))  # ERR-MIX
        return out

    _expect_error(kernel, (rng.standard_normal((128, 64), dtype=np.float32),),
                  "Mixing basic tensor indexing and advanced tensor indexing is not supported.", "ERR-MIX")


def test_error_missing_dims_count_as_mixing(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(4)[:, None]
        i_f = nl.arange(128)[None, :]
        nl.store(out, nl.load(a[i_p, i_f]))  # ERR-MIX-RANK
        return out

    _expect_error(kernel, (rng.standard_normal((4, 128, 8), dtype=np.float32),),
                  "Mixing basic tensor indexing and advanced tensor indexing is not supported.", "ERR-MIX-RANK")


def test_error_out_of_bound_without_mask(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(512)[None, :]
        for i in nl.affine_range(2):
            tile = nl.load(a[i_p + 128 * i, i_f])  # ERR-OOB
            nl.store(out[i_p + 128 * i, i_f], value=tile)
        return out

    err = _expect_error(kernel, (rng.standard_normal((200, 512), dtype=np.float32),),
                        "Out-of-bound access for tensor `a` on dimension 0: index range [128, 255] exceed "
                        "dimension size of 200", "ERR-OOB")
    assert "mask=" in err.hint


def test_error_out_of_bound_free_dim_with_partial_mask(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(4096)[None, :]
        tile = nl.load(a[i_p, i_f], mask=(i_p < 100))  # ERR-OOB-FREE
        nl.store(out[i_p, i_f], value=tile, mask=(i_f < 4000))
        return out

    _expect_error(kernel, (rng.standard_normal((128, 4000), dtype=np.float32),),
                  "Out-of-bound access for tensor `a` on dimension 1: index range [0, 4095] exceed dimension size "
                  "of 4000", "ERR-OOB-FREE")


def test_error_out_of_bound_names_the_subscript_line(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        view = a[i_p, i_f + 1]
        nl.store(out, nl.load(view))  # ERR-OOB-LATER
        return out

    err = _expect_error(kernel, (rng.standard_normal((128, 64), dtype=np.float32),),
                        "index range [1, 64] exceed dimension size of 64", "ERR-OOB-LATER")
    assert f"{os.path.basename(__file__)}:{_line_of('ERR-OOB-LATER') - 1}" in err.summary


def test_error_out_of_bound_integer_index(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 8), a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(8)[None, :]
        nl.store(out, nl.load(a[4, i_p, i_f]))  # ERR-OOB-INT
        return out

    _expect_error(kernel, (rng.standard_normal((4, 128, 8), dtype=np.float32),),
                  "Out-of-bound access for tensor `a` on dimension 0: index range [4, 4] exceed dimension size of 4",
                  "ERR-OOB-INT")


def test_error_non_affine_mask(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        tile = nl.load(a[i_p, i_f])
        nl.store(out[i_p, i_f], value=tile, mask=(i_p * i_f < 100))  # ERR-MASK-PRODUCT
        return out

    err = _expect_error(kernel, (rng.standard_normal((128, 64), dtype=np.float32),),
                        "Unsupported expression in mask: multiplies two index expressions", "ERR-MASK-PRODUCT")
    assert "affine" in err.limit


def test_error_runtime_value_in_mask(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        tile = nl.load(a[i_p, i_f])
        nl.store(out[i_p, i_f], value=tile, mask=(i_p < tile))  # ERR-MASK-RUNTIME
        return out

    _expect_error(kernel, (rng.standard_normal((128, 64), dtype=np.float32),),
                  "Unsupported expression in mask: compares an index expression with tensor",
                  "ERR-MASK-RUNTIME")


def test_error_mask_with_or_and_with_several_axes(rng):
    @nki.jit
    def either(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        nl.store(out[i_p, i_f], value=nl.load(a), mask=(i_p < 5) | (i_f < 3))  # ERR-MASK-OR
        return out

    @nki.jit
    def triangle(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        nl.store(out[i_p, i_f], value=nl.load(a), mask=(i_p < i_f))  # ERR-MASK-TRIANGLE
        return out

    a = rng.standard_normal((128, 64), dtype=np.float32)
    _expect_error(either, (a,), "Unsupported expression in mask: combines conditions with |", "ERR-MASK-OR")
    err = _expect_error(triangle, (a,), "Unsupported expression in mask: the condition", "ERR-MASK-TRIANGLE")
    assert "several grid axes" in err.summary and "affine_select" in err.hint


def test_negative_coefficients_read_backwards(rng):
    # NKI accepts index expressions that step backwards (63 - i_f), e.g. to mirror a window.
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        nl.store(out, nl.load(a[i_p, 63 - i_f]))
        return out

    @nki.jit
    def swap_pairs(a):
        # -1 * i_x + 1 over a 2-wide axis swaps neighbours: column 2y + x reads 2y + (1 - x)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        tile = nl.load(a)
        i_p, i_y, i_x = nl.mgrid[0:128, 0:32, 0:2]
        swapped = nl.ndarray((128, 64), a.dtype)
        swapped[i_p, 2 * i_y + i_x] = nl.copy(tile[i_p, 2 * i_y + (-1 * i_x + 1)])
        nl.store(out, swapped)
        return out

    a = rng.standard_normal((128, 64), dtype=np.float32)
    np.testing.assert_array_equal(kernel(a), a[:, ::-1])
    expected = a.reshape(128, 32, 2)[:, :, ::-1].reshape(128, 64)
    np.testing.assert_array_equal(swap_pairs(a), expected)


def test_error_control_flow_on_arange(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        if i_p < 64:  # ERR-IF
            nl.store(out, nl.load(a))
        return out

    _expect_error(kernel, (rng.standard_normal((128, 64), dtype=np.float32),),
                  "Control-flow depending on `nl.arange` or `nl.mgrid` is not supported", "ERR-IF")


def test_error_grids_that_do_not_broadcast(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None] + nl.arange(64)[:, None]  # ERR-BROADCAST
        nl.store(out, nl.load(a[i_p, 0]))
        return out

    _expect_error(kernel, (rng.standard_normal((128, 64), dtype=np.float32),),
                  "index expressions of shapes (128, 1) and (64, 1) do not broadcast together", "ERR-BROADCAST")


def test_error_affine_select_needs_one_comparison(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        tile = nl.load(a)
        nl.store(out, nisa.affine_select((i_p >= i_f) & (i_p < 100), tile, 0.0))  # ERR-SELECT-AND
        return out

    _expect_error(kernel, (rng.standard_normal((128, 64), dtype=np.float32),),
                  "nisa.affine_select: the predicate must be a single comparison", "ERR-SELECT-AND")


def test_error_block_dims_take_integers(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 64), a.dtype, buffer=nl.shared_hbm)
        buf = nl.zeros((4, nl.par_dim(128), 64), a.dtype, buffer=nl.sbuf)
        i_b = nl.arange(4)[:, None]
        nl.store(out, buf[i_b])  # ERR-BLOCK
        return out

    err = _expect_error(kernel, (rng.standard_normal((128, 64), dtype=np.float32),),
                        "block dim 0 of tensor 'buf' is indexed with", "ERR-BLOCK")
    assert "integers" in err.limit


def test_error_block_index_out_of_bound(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 64), a.dtype, buffer=nl.shared_hbm)
        buf = nl.zeros((4, nl.par_dim(128), 64), a.dtype, buffer=nl.sbuf)
        nl.store(out, buf[4])  # ERR-BLOCK-OOB
        return out

    _expect_error(kernel, (rng.standard_normal((128, 64), dtype=np.float32),),
                  "Out-of-bound access for tensor `buf` on dimension 0: index range [4, 4] exceed dimension size of 4",
                  "ERR-BLOCK-OOB")


def test_error_non_affine_subscript(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray((64, 64), a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(64)[:, None]
        i_f = nl.arange(64)[None, :]
        nl.store(out, nl.load(a[i_p // 2, i_f]))  # ERR-FLOORDIV
        return out

    _expect_error(kernel, (rng.standard_normal((128, 64), dtype=np.float32),),
                  "Unsupported index expression: it uses // on an index expression", "ERR-FLOORDIV")


def test_error_runtime_index_must_be_one_value(rng):
    @nki.jit
    def kernel(a, idx):
        out = nl.ndarray((128, 64), a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        which = nl.load(idx)
        nl.store(out, nl.load(a[which, i_p, i_f]))  # ERR-RUNTIME-INDEX
        return out

    err = _expect_error(kernel, (rng.standard_normal((4, 128, 64), dtype=np.float32), np.zeros((1, 2), np.int32)),
                        "dimension 0 of tensor 'a' is indexed with a tensor of shape (1, 2)", "ERR-RUNTIME-INDEX")
    assert "1x1" in err.limit


def test_error_1d_arange_in_iota(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 1), nl.int32, buffer=nl.shared_hbm)
        nl.store(out, nisa.iota(nl.arange(128), nl.int32))  # ERR-IOTA-1D
        return out

    _expect_error(kernel, (rng.standard_normal((128, 64), dtype=np.float32),),
                  "Indexing a NKI tensor with 1D arange is not supported", "ERR-IOTA-1D")
