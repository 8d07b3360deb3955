"""Transpose2D, after NKI's "transpose2d" tutorial: every row of a [P, F1*F2] tensor is a
row-major F1 x F2 matrix; the kernel transposes each of them to F2 x F1 inside its partition,
with a copy through a re-indexed free-dim access pattern.

Legacy style: nl.load / nl.store and a copy between index expressions (nl.arange / nl.mgrid).
Current style: nisa.dma_copy, a permuted view (reshape + permute) or a raw .ap() pattern fed to
destination-passing nisa.tensor_copy.

The other kind of transpose -- partition dim <-> free dim -- is covered too: a tiled 2-D matrix
transpose on the Tensor engine (nisa.nc_transpose into PSUM / legacy nl.transpose) and on the
Vector engine (32 x 32 blocks). Transposes move values without arithmetic: results must be exact.
"""

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

from ._util import bf16, to_bf16


def _reference(x, f1, f2):
    p = x.shape[0]
    return x.reshape(p, f1, f2).transpose(0, 2, 1).reshape(p, f1 * f2)


# --- free-dim transpose: legacy style -------------------------------------------------------------

@nki.jit
def transpose2d_legacy(in_tensor, shape2D):
    sz_p, sz_f = in_tensor.shape
    f1, f2 = shape2D
    out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    in_tile = nl.load(in_tensor)
    out_tile = nl.ndarray((sz_p, sz_f), dtype=in_tensor.dtype, buffer=nl.sbuf)
    # a 3-D iteration space (partition, i, j): read element (i, j), write element (j, i)
    i_p = nl.arange(sz_p)[:, None, None]
    i_1 = nl.arange(f1)[None, :, None]
    i_2 = nl.arange(f2)[None, None, :]
    out_tile[i_p, i_2 * f1 + i_1] = nl.copy(in_tile[i_p, i_1 * f2 + i_2])
    nl.store(out_tensor, value=out_tile)
    return out_tensor


@nki.jit
def transpose2d_legacy_tiled(in_tensor, shape2D):
    """Rows beyond 128 in partition tiles (mask= for the last one), nl.mgrid indices, and the
    copy done by functional nisa.tensor_copy."""
    sz_p, sz_f = in_tensor.shape
    f1, f2 = shape2D
    out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    i_p, i_1, i_2 = nl.mgrid[0:128, 0:f1, 0:f2]
    j_p, j_f = nl.mgrid[0:128, 0:sz_f]
    for t in nl.affine_range((sz_p + 127) // 128):
        rows = t * 128 + j_p < sz_p
        in_tile = nl.load(in_tensor[t * 128 + j_p, j_f], mask=rows)
        out_tile = nl.ndarray((128, sz_f), dtype=in_tensor.dtype, buffer=nl.sbuf)
        out_tile[i_p, i_2 * f1 + i_1] = nisa.tensor_copy(in_tile[i_p, i_1 * f2 + i_2], mask=(t * 128 + i_p < sz_p))
        nl.store(out_tensor[t * 128 + j_p, j_f], value=out_tile, mask=rows)
    return out_tensor


# --- free-dim transpose: current style ------------------------------------------------------------

@nki.jit
def transpose2d_current_views(in_tensor, shape2D):
    """Rows in partition tiles of up to 128; the transpose is a copy from a permuted view."""
    sz_p, sz_f = in_tensor.shape
    f1, f2 = shape2D
    out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    for p0 in range(0, sz_p, 128):
        pp = min(128, sz_p - p0)
        in_tile = nl.ndarray((pp, sz_f), dtype=in_tensor.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=in_tile, src=in_tensor[p0:p0 + pp, :])
        out_tile = nl.ndarray((pp, f2, f1), dtype=in_tensor.dtype, buffer=nl.sbuf)
        src = in_tile.reshape((pp, f1, f2)).permute((0, 2, 1))  # [p, j, i] reads element (i, j)
        nisa.tensor_copy(dst=out_tile, src=src)
        nisa.dma_copy(dst=out_tensor[p0:p0 + pp, :], src=out_tile.reshape((pp, sz_f)))
    return out_tensor


@nki.jit
def transpose2d_current_ap(in_tensor, shape2D):
    """The same with a raw access pattern: [[partition stride, P], [1, F2], [F2, F1]]."""
    sz_p, sz_f = in_tensor.shape
    f1, f2 = shape2D
    out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    in_tile = nl.ndarray((sz_p, sz_f), dtype=in_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=in_tile, src=in_tensor)
    out_tile = nl.ndarray((sz_p, f2, f1), dtype=in_tensor.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out_tile, src=in_tile.ap(pattern=[[sz_f, sz_p], [1, f2], [f2, f1]]))
    nisa.dma_copy(dst=out_tensor, src=out_tile.reshape((sz_p, sz_f)))
    return out_tensor


# --- partition <-> free transpose -----------------------------------------------------------------

@nki.jit
def matrix_transpose_current(x):
    """[R, C] -> [C, R] in 128 x 128 blocks: nc_transpose on the Tensor engine (SBUF -> PSUM),
    then a copy back to SBUF. Edge blocks are smaller."""
    R, C = x.shape
    out = nl.ndarray((C, R), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, R, 128):
        rr = min(128, R - r0)
        for c0 in range(0, C, 128):
            cc = min(128, C - c0)
            blk = nl.ndarray((rr, cc), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=blk, src=x[r0:r0 + rr, c0:c0 + cc])
            blk_t = nl.ndarray((cc, rr), dtype=x.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=blk_t, data=blk)
            blk_sb = nl.ndarray((cc, rr), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=blk_sb, src=blk_t)
            nisa.dma_copy(dst=out[c0:c0 + cc, r0:r0 + rr], src=blk_sb)
    return out


@nki.jit
def matrix_transpose_vector_engine(x):
    """[R, C] -> [C, R] in 32 x 32 blocks on the Vector engine (SBUF -> SBUF); R, C multiples of 32."""
    R, C = x.shape
    out = nl.ndarray((C, R), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, R, 32):
        for c0 in range(0, C, 32):
            blk = nl.ndarray((32, 32), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=blk, src=x[r0:r0 + 32, c0:c0 + 32])
            blk_t = nl.ndarray((32, 32), dtype=x.dtype, buffer=nl.sbuf)
            nisa.nc_transpose(dst=blk_t, data=blk, engine=nisa.vector_engine)
            nisa.dma_copy(dst=out[c0:c0 + 32, r0:r0 + 32], src=blk_t)
    return out


@nki.jit
def matrix_transpose_legacy(x):
    """Legacy: nl.transpose of 128 x 128 tiles (a PSUM tile), nl.copy back to SBUF, nl.store;
    R, C multiples of 128."""
    R, C = x.shape
    out = nl.ndarray((C, R), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(128)[None, :]
    for r in nl.affine_range(R // 128):
        for c in nl.affine_range(C // 128):
            blk = nl.load(x[r * 128 + i_p, c * 128 + i_f])
            blk_t = nl.transpose(blk)
            nl.store(out[c * 128 + i_p, r * 128 + i_f], value=nl.copy(blk_t))
    return out


@nki.jit
def load_transpose2d_legacy(x):
    """Legacy nl.load_transpose2d: the DMA transposes a [F, P] HBM block into a [P, F] tile."""
    R, C = x.shape
    out = nl.ndarray((C, R), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(R)[None, :]
    for c in nl.affine_range(C // 128):
        blk_t = nl.load_transpose2d(x[0:R, c * 128:(c + 1) * 128])
        nl.store(out[c * 128 + i_p, i_f], value=blk_t)
    return out


# --- tests ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("f1,f2", [(3, 4), (16, 24), (8, 1)])
@pytest.mark.parametrize("dt", [np.float32, bf16], ids=["fp32", "bf16"])
def test_transpose2d_legacy(rng, f1, f2, dt):
    x = to_bf16(rng.standard_normal((64, f1 * f2))) if dt is bf16 else \
        rng.standard_normal((64, f1 * f2), dtype=np.float32)
    np.testing.assert_array_equal(transpose2d_legacy(x, (f1, f2)), _reference(x, f1, f2))


@pytest.mark.parametrize("p", [128, 200])
def test_transpose2d_legacy_tiled(rng, p):
    x = rng.standard_normal((p, 12 * 20), dtype=np.float32)
    np.testing.assert_array_equal(transpose2d_legacy_tiled(x, (12, 20)), _reference(x, 12, 20))


@pytest.mark.parametrize("p,f1,f2", [(128, 16, 24), (200, 5, 7), (32, 1, 9)])
@pytest.mark.parametrize("dt", [np.float32, bf16], ids=["fp32", "bf16"])
def test_transpose2d_current_views(rng, p, f1, f2, dt):
    x = rng.standard_normal((p, f1 * f2), dtype=np.float32)
    if dt is bf16:
        x = to_bf16(x)
    np.testing.assert_array_equal(transpose2d_current_views(x, (f1, f2)), _reference(x, f1, f2))


@pytest.mark.parametrize("f1,f2", [(3, 4), (16, 24)])
def test_transpose2d_current_ap(rng, f1, f2):
    x = rng.standard_normal((96, f1 * f2), dtype=np.float32)
    np.testing.assert_array_equal(transpose2d_current_ap(x, (f1, f2)), _reference(x, f1, f2))


@pytest.mark.parametrize("shape", [(256, 384), (200, 300)])
@pytest.mark.parametrize("dt", [np.float32, bf16], ids=["fp32", "bf16"])
def test_matrix_transpose_tensor_engine(rng, shape, dt):
    x = rng.standard_normal(shape, dtype=np.float32)
    if dt is bf16:
        x = to_bf16(x)
    np.testing.assert_array_equal(matrix_transpose_current(x), x.T)


def test_matrix_transpose_vector_engine(rng):
    x = rng.standard_normal((64, 96), dtype=np.float32)
    np.testing.assert_array_equal(matrix_transpose_vector_engine(x), x.T)


def test_matrix_transpose_legacy(rng):
    x = rng.standard_normal((256, 384), dtype=np.float32)
    np.testing.assert_array_equal(matrix_transpose_legacy(x), x.T)


def test_load_transpose2d_legacy(rng):
    x = rng.standard_normal((96, 256), dtype=np.float32)
    np.testing.assert_array_equal(load_transpose2d_legacy(x), x.T)
