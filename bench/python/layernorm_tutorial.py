"""The two kernels of NKI's LayerNorm tutorial, written for nikki in the tutorial's legacy style,
for the timing model's validation against the latencies the tutorial published.

Both normalize x [rows, H] row by row, out = (x - mean) / sqrt(var + eps) * gamma + beta, with
rows on partitions in tiles of 128 and gamma and beta broadcast to every partition once:

- v1: mean and variance from nl.mean over x and x * x, and the shift and scale as separate
  tile operations;
- v2: mean and variance from nisa.bn_stats over chunks of bn_stats_fmax and one nisa.bn_aggr,
  and the shift and scale as one nisa.tensor_scalar.

Run them on small inputs against numpy with `model_validation.py --check`.
"""

from __future__ import annotations

import math

import numpy as np

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl


def _gamma_beta(gamma, beta):
    """gamma and beta loaded once as [1, H] rows and broadcast to all partitions."""
    H = gamma.shape[0]
    rows = nl.tile_size.pmax
    g = nl.load(gamma.reshape((1, H))).broadcast_to((rows, H))
    b = nl.load(beta.reshape((1, H))).broadcast_to((rows, H))
    return g, b


def _row_tiles(x):
    rows = nl.tile_size.pmax
    i_p = nl.arange(rows)[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    for t in nl.affine_range(math.ceil(x.shape[0] / rows)):
        yield t * rows + i_p, i_f, (t * rows + i_p < x.shape[0])


@nki.jit
def layernorm_v1(x, eps, gamma, beta):
    """Mean and variance with nl.mean; shift and scale as tile operators."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    g, b = _gamma_beta(gamma, beta)
    for rows, cols, in_bounds in _row_tiles(x):
        tile = nl.load(x[rows, cols], mask=in_bounds)
        mean = nl.mean(tile, axis=1)
        var = nl.mean(nl.square(tile), axis=1) - mean * mean
        normed = (tile - mean) * nl.rsqrt(var + eps)
        nl.store(out[rows, cols], value=normed * g + b, mask=in_bounds)
    return out


@nki.jit
def layernorm_v2(x, eps, gamma, beta):
    """Mean and variance with bn_stats / bn_aggr; shift and scale in one tensor_scalar."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    g, b = _gamma_beta(gamma, beta)
    H = x.shape[1]
    chunk = nl.tile_size.bn_stats_fmax
    chunks = math.ceil(H / chunk)
    i_c = nl.arange(chunk)[None, :]
    i_s = nl.arange(6)[None, :]
    for rows, cols, in_bounds in _row_tiles(x):
        tile = nl.load(x[rows, cols], mask=in_bounds)
        i_p = nl.arange(nl.tile_size.pmax)[:, None]
        stats = nl.ndarray((nl.tile_size.pmax, 6 * chunks), dtype=np.float32)
        for c in nl.affine_range(chunks):
            stats[i_p, c * 6 + i_s] = nisa.bn_stats(tile[i_p, c * chunk + i_c], mask=(c * chunk + i_c < H),
                                                    dtype=np.float32)
        mean_var = nisa.bn_aggr(stats)
        mean, var = mean_var[i_p, 0], mean_var[i_p, 1]
        rstd = nl.rsqrt(var + eps)
        normed = nisa.tensor_scalar(data=tile, op0=np.subtract, operand0=mean, op1=np.multiply, operand1=rstd)
        nl.store(out[rows, cols], value=normed * g + b, mask=in_bounds)
    return out


KERNELS = {"v1": layernorm_v1, "v2": layernorm_v2}


def check_correctness() -> None:
    """Runs both kernels on [300, 1000] (a ragged last row tile and bn_stats chunk) against numpy."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 1000)).astype(np.float32)
    gamma = rng.standard_normal(1000).astype(np.float32)
    beta = rng.standard_normal(1000).astype(np.float32)
    eps = 1e-5
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + eps) * gamma + beta
    for name, kernel in KERNELS.items():
        err = float(np.max(np.abs(kernel(x, eps, gamma, beta) - want)))
        print(f"  layernorm_{name}: max abs error {err:.2e}")
        # fp32 mean(x^2) - mean^2 over 1000 unit-variance values loses a few ulps of the variance
        assert err < 1e-4, name
