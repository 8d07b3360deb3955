"""The four kernels of NKI's matrix multiplication tutorial, written for nikki, and the timing
model's estimates for the tutorial's [4096, 8192] @ [8192, 8192] bf16 problem on trn1 against the
latencies the tutorial published for a Trn1 NeuronCore.

    python bench/python/matmul_tutorial.py            # estimates + table
    python bench/python/matmul_tutorial.py --check    # also runs each kernel on small inputs

Each kernel follows the tutorial's step: (1) tiles, (2) the stationary tiles loaded once per
output row of tiles, (3) the free dims blocked (2 x 2 tiles), (4) all dims blocked
(TILES_IN_BLOCK M=16, N=2, K=8) with partial sums in SBUF and coalesced DMAs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

# Published on the tutorial page (Neuron SDK 2.26 docs, nki/tutorials/matrix_multiplication.rst),
# measured with nki.benchmark on Trn1: milliseconds.
PUBLISHED_MS = {"tiled": 51.80, "hoisted": 42.96, "blocked_free": 22.07, "fully_optimized": 6.97}


def _tiles():
    return nl.tile_size.gemm_stationary_fmax, nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax


@nki.jit
def matmul_tiled(lhsT, rhs):
    """Step 1: one [128, 128] stationary and one [128, 512] moving tile loaded per matmul."""
    K, M = lhsT.shape
    _, N = rhs.shape
    tm, tk, tn = _tiles()
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in range(M // tm):
        for n in range(N // tn):
            acc = nl.ndarray((tm, tn), nl.float32, buffer=nl.psum)
            for k in range(K // tk):
                a = nl.ndarray((tk, tm), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((tk, tn), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[k * tk:(k + 1) * tk, m * tm:(m + 1) * tm])
                nisa.dma_copy(dst=b, src=rhs[k * tk:(k + 1) * tk, n * tn:(n + 1) * tn])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)
            res = nl.ndarray((tm, tn), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[m * tm:(m + 1) * tm, n * tn:(n + 1) * tn], src=res)
    return out


@nki.jit
def matmul_hoisted(lhsT, rhs):
    """Step 2: a row of stationary tiles is loaded once and reused for every output column tile."""
    K, M = lhsT.shape
    _, N = rhs.shape
    tm, tk, tn = _tiles()
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in range(M // tm):
        a_row = []
        for k in range(K // tk):
            a = nl.ndarray((tk, tm), dtype=lhsT.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a, src=lhsT[k * tk:(k + 1) * tk, m * tm:(m + 1) * tm])
            a_row.append(a)
        for n in range(N // tn):
            b_col = []
            for k in range(K // tk):
                b = nl.ndarray((tk, tn), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=b, src=rhs[k * tk:(k + 1) * tk, n * tn:(n + 1) * tn])
                b_col.append(b)
            acc = nl.ndarray((tm, tn), nl.float32, buffer=nl.psum)
            for k in range(K // tk):
                nisa.nc_matmul(dst=acc, stationary=a_row[k], moving=b_col[k])
            res = nl.ndarray((tm, tn), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[m * tm:(m + 1) * tm, n * tn:(n + 1) * tn], src=res)
    return out


@nki.jit
def matmul_blocked_free(lhsT, rhs, TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=2):
    """Step 3: blocks of TILES_IN_BLOCK_M x TILES_IN_BLOCK_N output tiles share their loaded rows and columns."""
    K, M = lhsT.shape
    _, N = rhs.shape
    tm, tk, tn = _tiles()
    bm_size, bn_size = tm * TILES_IN_BLOCK_M, tn * TILES_IN_BLOCK_N
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in range(M // bm_size):
        a_block = []
        for bm in range(TILES_IN_BLOCK_M):
            row = []
            m0 = (m * TILES_IN_BLOCK_M + bm) * tm
            for k in range(K // tk):
                a = nl.ndarray((tk, tm), dtype=lhsT.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[k * tk:(k + 1) * tk, m0:m0 + tm])
                row.append(a)
            a_block.append(row)
        for n in range(N // bn_size):
            b_block = []
            for bn in range(TILES_IN_BLOCK_N):
                col = []
                n0 = (n * TILES_IN_BLOCK_N + bn) * tn
                for k in range(K // tk):
                    b = nl.ndarray((tk, tn), dtype=rhs.dtype, buffer=nl.sbuf)
                    nisa.dma_copy(dst=b, src=rhs[k * tk:(k + 1) * tk, n0:n0 + tn])
                    col.append(b)
                b_block.append(col)
            for bm in range(TILES_IN_BLOCK_M):
                for bn in range(TILES_IN_BLOCK_N):
                    acc = nl.ndarray((tm, tn), nl.float32, buffer=nl.psum)
                    for k in range(K // tk):
                        nisa.nc_matmul(dst=acc, stationary=a_block[bm][k], moving=b_block[bn][k])
                    res = nl.ndarray((tm, tn), dtype=out.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=res, src=acc)
                    m0, n0 = (m * TILES_IN_BLOCK_M + bm) * tm, (n * TILES_IN_BLOCK_N + bn) * tn
                    nisa.dma_copy(dst=out[m0:m0 + tm, n0:n0 + tn], src=res)
    return out


@nki.jit
def matmul_fully_optimized(lhsT, rhs, TILES_IN_BLOCK_M=16, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=8):
    """Step 4: all dims blocked; partial sums of K blocks accumulate in SBUF; DMAs move whole block
    rows ([128, BLOCK_N] and [128, BLOCK_M]) and packed result rows."""
    K, M = lhsT.shape
    _, N = rhs.shape
    tm, tk, tn = _tiles()
    block_m, block_n, block_k = tm * TILES_IN_BLOCK_M, tn * TILES_IN_BLOCK_N, tk * TILES_IN_BLOCK_K
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for n in range(N // block_n):
        partial = [[[None] * TILES_IN_BLOCK_N for _ in range(TILES_IN_BLOCK_M)] for _ in range(M // block_m)]
        for m in range(M // block_m):
            for bm in range(TILES_IN_BLOCK_M):
                for bn in range(TILES_IN_BLOCK_N):
                    t = nl.ndarray((tm, tn), dtype=lhsT.dtype, buffer=nl.sbuf)
                    nisa.memset(dst=t, value=0.0)
                    partial[m][bm][bn] = t
        for k in range(K // block_k):
            b_rows = []
            for bk in range(TILES_IN_BLOCK_K):
                k0 = (k * TILES_IN_BLOCK_K + bk) * tk
                b = nl.ndarray((tk, block_n), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=b, src=rhs[k0:k0 + tk, n * block_n:(n + 1) * block_n])
                b_rows.append(b)
            for m in range(M // block_m):
                a_rows = []
                for bk in range(TILES_IN_BLOCK_K):
                    k0 = (k * TILES_IN_BLOCK_K + bk) * tk
                    a = nl.ndarray((tk, block_m), dtype=lhsT.dtype, buffer=nl.sbuf)
                    nisa.dma_copy(dst=a, src=lhsT[k0:k0 + tk, m * block_m:(m + 1) * block_m])
                    a_rows.append(a)
                for bn in range(TILES_IN_BLOCK_N):
                    for bm in range(TILES_IN_BLOCK_M):
                        acc = nl.ndarray((tm, tn), nl.float32, buffer=nl.psum)
                        for bk in range(TILES_IN_BLOCK_K):
                            nisa.nc_matmul(dst=acc, stationary=a_rows[bk][:, bm * tm:(bm + 1) * tm],
                                           moving=b_rows[bk][:, bn * tn:(bn + 1) * tn])
                        t = partial[m][bm][bn]
                        nisa.tensor_tensor(dst=t, data1=t, data2=acc, op=nl.add)
        for m in range(M // block_m):
            for bm in range(TILES_IN_BLOCK_M):
                packed = nl.ndarray((tm, block_n), dtype=nl.float32, buffer=nl.sbuf)
                for bn in range(TILES_IN_BLOCK_N):
                    nisa.tensor_copy(dst=packed[:, bn * tn:(bn + 1) * tn], src=partial[m][bm][bn])
                m0 = (m * TILES_IN_BLOCK_M + bm) * tm
                nisa.dma_copy(dst=out[m0:m0 + tm, n * block_n:(n + 1) * block_n], src=packed)
    return out


KERNELS = {
    "tiled": matmul_tiled,
    "hoisted": matmul_hoisted,
    "blocked_free": matmul_blocked_free,
    "fully_optimized": matmul_fully_optimized,
}


def check_correctness() -> None:
    """Runs every kernel on small inputs against numpy (fp32 inputs, fp32 accumulation)."""
    rng = np.random.default_rng(0)
    K, M, N = 1024, 2048, 1024
    lhsT = rng.standard_normal((K, M), dtype=np.float32)
    rhs = rng.standard_normal((K, N), dtype=np.float32)
    want = lhsT.T @ rhs
    for name, kernel in KERNELS.items():
        got = kernel(lhsT, rhs, TILES_IN_BLOCK_M=16, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=8) \
            if name == "fully_optimized" else kernel(lhsT, rhs)
        err = np.max(np.abs(got - want)) / np.max(np.abs(want))
        print(f"  {name:<16} max relative error {err:.2e}")
        assert err < 1e-5, name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="also run each kernel on small inputs")
    parser.add_argument("--target", default="trn1")
    args = parser.parse_args()
    if args.check:
        print("correctness on [1024, 2048] x [1024, 1024] fp32:")
        check_correctness()
    M, K, N = 4096, 8192, 8192
    lhsT, rhs = nki.spec((K, M), nl.bfloat16), nki.spec((K, N), nl.bfloat16)
    print(f"\nestimates for [{M}, {K}] @ [{K}, {N}] bf16 on {args.target} (nikki timing model, not measurements)")
    print(f"{'kernel':<16} {'published ms':>12} {'estimate ms':>12} {'error':>8} {'TensorE util':>13} "
          f"{'DMA util':>9} {'host s':>7}")
    rows = []
    for name, kernel in KERNELS.items():
        start = time.perf_counter()
        prof = nki.estimate(kernel, lhsT, rhs, target=args.target)
        host = time.perf_counter() - start
        published = PUBLISHED_MS[name]
        error = (prof.total_ms - published) / published
        rows.append((name, prof.total_ms))
        print(f"{name:<16} {published:>12.2f} {prof.total_ms:>12.2f} {100 * error:>+7.1f}% "
              f"{100 * prof.tensor_flop_utilization():>12.1f}% {100 * prof.dma_utilization():>8.1f}% {host:>7.1f}")
    ranked = [name for name, _ in sorted(rows, key=lambda r: -r[1])]
    print("ranking (slowest first):", " > ".join(ranked),
          "(matches the published ranking)" if ranked == list(PUBLISHED_MS) else "(DIFFERS from the published ranking)")


if __name__ == "__main__":
    main()
