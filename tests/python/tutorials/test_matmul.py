"""Tiled matrix multiplication, after NKI's "matrix multiplication" tutorial: result = lhsT.T @ rhs
with lhsT [K, M] (the contraction dim K on partitions, as TensorE wants its stationary operand),
rhs [K, N], result [M, N]. The kernels tile M by 128 (stationary free size), N by 512 (moving free
size, one PSUM bank of fp32) and K by 128 (partitions), and accumulate the K tiles in PSUM.

Legacy style: nl.load with index expressions, ``psum += nl.matmul(..., transpose_x=True)`` /
``psum += nisa.nc_matmul(...)`` into ``nl.zeros(..., buffer=nl.psum)``, nl.affine_range, mask= on
the ragged loads. Current style: destination-passing nisa.nc_matmul into an nl.psum ndarray
(accumulate=None: the first matmul into the tile overwrites, later ones add), slices bounded
with min(), nisa.tensor_copy out of PSUM and nisa.dma_copy.
"""

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

from ._util import EPS_BF16, EPS_FP32, bf16, f64, to_bf16

TILE_M = 128  # nl.tile_size.gemm_stationary_fmax
TILE_K = 128  # nl.tile_size.pmax
TILE_N = 512  # nl.tile_size.gemm_moving_fmax


def _cdiv(a, b):
    return (a + b - 1) // b


# --- legacy (Beta 1) style ------------------------------------------------------------------------

@nki.jit
def matmul_legacy_tiled(lhsT, rhs):
    """The tutorial's tiled kernel: every dim a multiple of its tile size."""
    K, M = lhsT.shape
    K2, N = rhs.shape
    assert K == K2
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                lhsT_tile = nl.load(lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
                rhs_tile = nl.load(rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
                res_psum += nl.matmul(lhsT_tile, rhs_tile, transpose_x=True)
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], value=res_sb)
    return result


@nki.jit
def matmul_legacy_ragged(lhsT, rhs):
    """Any M, K, N: index-expression loads and stores with mask= for the edge tiles; the matmul of
    an edge tile takes the valid [kk, mm] / [kk, nn] corners of the operand tiles (a mask cannot
    say this: it would restrict the contraction dim and the output rows alike). kk/mm/nn are
    computed from the loop indices with min(), which needs the loops unrolled at trace time, as
    nikki (and current NKI) do; Beta 1's tutorial required tile multiples instead."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    i_k = nl.arange(TILE_K)[:, None]
    i_m = nl.arange(TILE_M)[None, :]
    i_n = nl.arange(TILE_N)[None, :]
    i_mp = nl.arange(TILE_M)[:, None]
    for m in nl.affine_range(_cdiv(M, TILE_M)):
        for n in nl.affine_range(_cdiv(N, TILE_N)):
            res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(_cdiv(K, TILE_K)):
                lhsT_tile = nl.load(lhsT[k * TILE_K + i_k, m * TILE_M + i_m],
                                    mask=(k * TILE_K + i_k < K) & (m * TILE_M + i_m < M))
                rhs_tile = nl.load(rhs[k * TILE_K + i_k, n * TILE_N + i_n],
                                   mask=(k * TILE_K + i_k < K) & (n * TILE_N + i_n < N))
                kk = min(TILE_K, K - k * TILE_K)
                mm = min(TILE_M, M - m * TILE_M)
                nn = min(TILE_N, N - n * TILE_N)
                # the valid [kk, mm] / [kk, nn] corners of the tiles (the rest was never loaded)
                res_psum[0:mm, 0:nn] += nisa.nc_matmul(lhsT_tile[0:kk, 0:mm], rhs_tile[0:kk, 0:nn])
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * TILE_M + i_mp, n * TILE_N + i_n], value=res_sb,
                     mask=(m * TILE_M + i_mp < M) & (n * TILE_N + i_n < N))
    return result


@nki.jit
def matmul_legacy_no_transpose(lhs, rhs):
    """nl.matmul(x, y) with x in [M, K] layout: nikki inserts the TensorE transpose of x."""
    M, K = lhs.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TILE_M):
        res_psum = nl.zeros((TILE_M, N), nl.float32, buffer=nl.psum)
        for k in nl.affine_range(K // TILE_K):
            x = nl.load(lhs[m * TILE_M:(m + 1) * TILE_M, k * TILE_K:(k + 1) * TILE_K])
            y = nl.load(rhs[k * TILE_K:(k + 1) * TILE_K, 0:N])
            res_psum += nl.matmul(x, y)
        nl.store(result[m * TILE_M:(m + 1) * TILE_M, 0:N], value=nl.copy(res_psum))
    return result


# --- current style ----------------------------------------------------------------------------------

@nki.jit
def matmul_current(lhsT, rhs):
    """Any M, K, N: edge tiles are smaller views (min() bounds); PSUM accumulation through
    nc_matmul's automatic accumulate (first write overwrites, later writes add)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m0 in range(0, M, TILE_M):
        mm = min(TILE_M, M - m0)
        for n0 in range(0, N, TILE_N):
            nn = min(TILE_N, N - n0)
            res_psum = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for k0 in range(0, K, TILE_K):
                kk = min(TILE_K, K - k0)
                lhsT_tile = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lhsT_tile[0:kk, 0:mm], src=lhsT[k0:k0 + kk, m0:m0 + mm])
                nisa.dma_copy(dst=rhs_tile[0:kk, 0:nn], src=rhs[k0:k0 + kk, n0:n0 + nn])
                nisa.nc_matmul(dst=res_psum[0:mm, 0:nn], stationary=lhsT_tile[0:kk, 0:mm],
                               moving=rhs_tile[0:kk, 0:nn])
            res_sb = nl.ndarray((TILE_M, TILE_N), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res_sb[0:mm, 0:nn], src=res_psum[0:mm, 0:nn])
            nisa.dma_copy(dst=result[m0:m0 + mm, n0:n0 + nn], src=res_sb[0:mm, 0:nn])
    return result


@nki.jit
def matmul_current_hoisted(lhsT, rhs):
    """The tutorial's "hoist loads" step with explicit accumulate flags: the lhsT column block is
    loaded once per m and reused for every n; the first K tile overwrites the PSUM tile
    (accumulate=False) and the rest add (accumulate=True). Dims are tile multiples."""
    K, M = lhsT.shape
    _, N = rhs.shape
    KT = K // TILE_K
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in range(M // TILE_M):
        lhsT_tiles = []
        for k in range(KT):
            t = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=lhsT[nl.ds(k * TILE_K, TILE_K), nl.ds(m * TILE_M, TILE_M)])
            lhsT_tiles.append(t)
        for n in range(N // TILE_N):
            res_psum = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for k in range(KT):
                rhs_tile = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=rhs_tile, src=rhs[nl.ds(k * TILE_K, TILE_K), nl.ds(n * TILE_N, TILE_N)])
                nisa.nc_matmul(res_psum, lhsT_tiles[k], rhs_tile, accumulate=(k > 0))
            res_sb = nl.ndarray((TILE_M, TILE_N), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res_sb, src=res_psum)
            nisa.dma_copy(dst=result[nl.ds(m * TILE_M, TILE_M), nl.ds(n * TILE_N, TILE_N)], src=res_sb)
    return result


@nki.jit
def matmul_current_blocked(lhsT, rhs, TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=1):
    """The tutorial's last step: M, N and K blocked. For each K block, the partial product of a
    [BLOCK_M, BLOCK_N] output block accumulates in PSUM tile by tile, then is added into an fp32
    SBUF accumulator with nisa.tensor_tensor (so PSUM is freed between K blocks). Python lists
    hold the tiles of a block (current NKI has no block dims)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    BLOCK_M, BLOCK_N, BLOCK_K = TILE_M * TILES_IN_BLOCK_M, TILE_N * TILES_IN_BLOCK_N, TILE_K * TILES_IN_BLOCK_K
    assert M % BLOCK_M == 0 and N % BLOCK_N == 0 and K % BLOCK_K == 0
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for n0 in range(0, N, BLOCK_N):
        for m0 in range(0, M, BLOCK_M):
            acc = [[nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf) for _ in range(TILES_IN_BLOCK_N)]
                   for _ in range(TILES_IN_BLOCK_M)]
            for kb, k0 in enumerate(range(0, K, BLOCK_K)):
                lhsT_blk = [nl.ndarray((TILE_K, BLOCK_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                            for _ in range(TILES_IN_BLOCK_K)]
                rhs_blk = [nl.ndarray((TILE_K, BLOCK_N), dtype=rhs.dtype, buffer=nl.sbuf)
                           for _ in range(TILES_IN_BLOCK_K)]
                for bk in range(TILES_IN_BLOCK_K):
                    kr = slice(k0 + bk * TILE_K, k0 + (bk + 1) * TILE_K)
                    nisa.dma_copy(dst=lhsT_blk[bk], src=lhsT[kr, m0:m0 + BLOCK_M])
                    nisa.dma_copy(dst=rhs_blk[bk], src=rhs[kr, n0:n0 + BLOCK_N])
                for bm in range(TILES_IN_BLOCK_M):
                    for bn in range(TILES_IN_BLOCK_N):
                        part = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                        for bk in range(TILES_IN_BLOCK_K):
                            nisa.nc_matmul(dst=part,
                                           stationary=lhsT_blk[bk][:, bm * TILE_M:(bm + 1) * TILE_M],
                                           moving=rhs_blk[bk][:, bn * TILE_N:(bn + 1) * TILE_N])
                        if kb == 0:
                            nisa.tensor_copy(dst=acc[bm][bn], src=part)
                        else:
                            nisa.tensor_tensor(dst=acc[bm][bn], data1=acc[bm][bn], data2=part, op=nl.add)
            for bm in range(TILES_IN_BLOCK_M):
                for bn in range(TILES_IN_BLOCK_N):
                    out_sb = nl.ndarray((TILE_M, TILE_N), dtype=result.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=out_sb, src=acc[bm][bn])
                    nisa.dma_copy(dst=result[m0 + bm * TILE_M:m0 + (bm + 1) * TILE_M,
                                             n0 + bn * TILE_N:n0 + (bn + 1) * TILE_N], src=out_sb)
    return result


@nki.jit
def matmul_legacy_block_dims(lhsT, rhs):
    """Legacy block dimensions: all K tiles of a column block of lhsT / rhs live in one tensor
    with a leading block dim (nl.par_dim marks the partition dim); ``psum += nisa.nc_matmul``
    accumulates over the block index. Dims are tile multiples."""
    K, M = lhsT.shape
    _, N = rhs.shape
    KT = K // TILE_K
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    i_k = nl.arange(TILE_K)[:, None]
    i_m = nl.arange(TILE_M)[None, :]
    i_n = nl.arange(TILE_N)[None, :]
    i_mp = nl.arange(TILE_M)[:, None]
    for m in nl.affine_range(M // TILE_M):
        lhsT_tiles = nl.ndarray((KT, nl.par_dim(TILE_K), TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(KT):
            lhsT_tiles[k, i_k, i_m] = nl.load(lhsT[k * TILE_K + i_k, m * TILE_M + i_m])
        for n in nl.affine_range(N // TILE_N):
            rhs_tiles = nl.ndarray((KT, nl.par_dim(TILE_K), TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(KT):
                rhs_tiles[k, i_k, i_n] = nl.load(rhs[k * TILE_K + i_k, n * TILE_N + i_n])
            res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(KT):
                res_psum += nisa.nc_matmul(lhsT_tiles[k, i_k, i_m], rhs_tiles[k, i_k, i_n])
            nl.store(result[m * TILE_M + i_mp, n * TILE_N + i_n], value=nl.copy(res_psum, dtype=result.dtype))
    return result


# --- reference and tolerance ----------------------------------------------------------------------

def _check(result, lhsT, rhs, out_eps):
    """|result - ref| <= K * u32 * (|lhsT|.T @ |rhs|) + out_eps * |ref| (+ a tiny absolute floor).

    ref is the exact product of the (already rounded) inputs, in fp64. TensorE multiplies exactly
    and accumulates in fp32 over K: the classic bound for a length-K fp32 sum is gamma_K ~ K * u32
    times the sum of |products|. The final write rounds once more to the output dtype (out_eps:
    u32 for fp32 outputs, u_bf16 for bf16 outputs). bf16 *inputs* add no error here because the
    reference is computed from the same bf16 values.
    """
    a, b = f64(lhsT), f64(rhs)
    ref = a.T @ b
    K = a.shape[0]
    bound = K * EPS_FP32 * (np.abs(a).T @ np.abs(b)) + out_eps * np.abs(ref) + 1e-30
    err = np.abs(f64(result) - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (f"max err/bound {float((err / bound)[worst]):.3g} at {worst}: "
                                  f"got {f64(result)[worst]}, want {ref[worst]}")


SHAPES_MULTIPLE = [(256, 256, 1024)]  # (M, K, N), multiples of (128, 128, 512)
SHAPES_RAGGED = [(200, 200, 600), (64, 100, 130)]


def _inputs(rng, M, K, N, dt):
    lhsT = rng.standard_normal((K, M), dtype=np.float32)
    rhs = rng.standard_normal((K, N), dtype=np.float32)
    if dt is bf16:
        return to_bf16(lhsT), to_bf16(rhs)
    return lhsT, rhs


def _out_eps(dt):
    return EPS_BF16 if dt is bf16 else EPS_FP32


@pytest.mark.parametrize("M,K,N", SHAPES_MULTIPLE)
@pytest.mark.parametrize("dt", [np.float32, bf16], ids=["fp32", "bf16"])
def test_matmul_legacy_tiled(rng, M, K, N, dt):
    lhsT, rhs = _inputs(rng, M, K, N, dt)
    out = matmul_legacy_tiled(lhsT, rhs)
    assert out.dtype == lhsT.dtype and out.shape == (M, N)
    _check(out, lhsT, rhs, _out_eps(dt))


@pytest.mark.parametrize("M,K,N", SHAPES_MULTIPLE + SHAPES_RAGGED)
@pytest.mark.parametrize("dt", [np.float32, bf16], ids=["fp32", "bf16"])
def test_matmul_legacy_ragged(rng, M, K, N, dt):
    lhsT, rhs = _inputs(rng, M, K, N, dt)
    _check(matmul_legacy_ragged(lhsT, rhs), lhsT, rhs, _out_eps(dt))


def test_matmul_legacy_implicit_transpose(rng):
    lhs = rng.standard_normal((256, 256), dtype=np.float32)
    rhs = rng.standard_normal((256, 512), dtype=np.float32)
    # The TensorE transpose is exact (bit-accurate from NeuronCore-v3), so the bound is the
    # matmul's own; the result is fp32.
    _check(matmul_legacy_no_transpose(lhs, rhs), np.ascontiguousarray(lhs.T), rhs, EPS_FP32)


@pytest.mark.parametrize("M,K,N", SHAPES_MULTIPLE + SHAPES_RAGGED)
@pytest.mark.parametrize("dt", [np.float32, bf16], ids=["fp32", "bf16"])
def test_matmul_current(rng, M, K, N, dt):
    lhsT, rhs = _inputs(rng, M, K, N, dt)
    out = matmul_current(lhsT, rhs)
    assert out.dtype == lhsT.dtype and out.shape == (M, N)
    _check(out, lhsT, rhs, _out_eps(dt))


@pytest.mark.parametrize("dt", [np.float32, bf16], ids=["fp32", "bf16"])
def test_matmul_current_hoisted_loads(rng, dt):
    lhsT, rhs = _inputs(rng, 256, 256, 1024, dt)
    _check(matmul_current_hoisted(lhsT, rhs), lhsT, rhs, _out_eps(dt))


def test_matmul_small_integers_exact(rng):
    """Small integer inputs: every product and partial sum is exact in fp32 (|sum| < 2**24), so
    the result must equal numpy's exactly, whatever the accumulation order."""
    lhsT = rng.integers(-8, 8, size=(200, 200)).astype(np.float32)
    rhs = rng.integers(-8, 8, size=(200, 600)).astype(np.float32)
    np.testing.assert_array_equal(matmul_current(lhsT, rhs), lhsT.T @ rhs)
    np.testing.assert_array_equal(matmul_legacy_ragged(lhsT, rhs), lhsT.T @ rhs)


@pytest.mark.parametrize("dt", [np.float32, bf16], ids=["fp32", "bf16"])
def test_matmul_current_blocked(rng, dt):
    # two K blocks of one tile: the SBUF accumulation path runs
    lhsT, rhs = _inputs(rng, 256, 256, 512, dt)
    _check(matmul_current_blocked(lhsT, rhs), lhsT, rhs, _out_eps(dt))
    # and with blocks of two K tiles and two N tiles (one block each)
    lhsT, rhs = _inputs(rng, 128, 256, 1024, dt)
    _check(matmul_current_blocked(lhsT, rhs, 1, 2, 2), lhsT, rhs, _out_eps(dt))


@pytest.mark.parametrize("dt", [np.float32, bf16], ids=["fp32", "bf16"])
def test_matmul_legacy_block_dims(rng, dt):
    lhsT, rhs = _inputs(rng, 256, 256, 512, dt)
    _check(matmul_legacy_block_dims(lhsT, rhs), lhsT, rhs, _out_eps(dt))


def test_tile_constants_match_target():
    """The kernels hard-code the tutorial's tile sizes; they must be the target's."""
    assert (nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax) == \
        (TILE_K, TILE_M, TILE_N)
