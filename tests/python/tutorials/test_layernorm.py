"""LayerNorm, after NKI's "layernorm" tutorial: for x [rows, H], gamma [H], beta [H],
out = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta, row by row. Rows go on partitions in
tiles of 128 (the last tile ragged); gamma and beta are broadcast to every partition once.

Two ways to get mean and variance, as in the tutorial's two versions:
  * reductions: mean = sum(x) / H, var = sum((x - mean)^2) / H (nl.mean / nisa.tensor_reduce);
  * nisa.bn_stats on chunks of at most 512 elements (bn_stats_fmax) + one nisa.bn_aggr.
The normalization is a single nisa.tensor_scalar ((x - mean) * rstd) in the bn_stats versions.

Each variant exists in the legacy style (nl.load / nl.store with index expressions and mask=,
functional nisa.* returning tiles, tile operators) and in the current style (dma_copy into
nl.ndarray tiles, destination-passing nisa.*).
"""

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

from ._util import EPS_BF16, EPS_FP32, bf16, f64, to_bf16

P = 128
BN_FMAX = 512  # nl.tile_size.bn_stats_fmax
EPS = 1e-5


# --- legacy (Beta 1) style ------------------------------------------------------------------------

def _legacy_gamma_beta(gamma, beta, sbuf_broadcast):
    """gamma, beta [H] as [P, H] tiles. With sbuf_broadcast (the tutorial's way) they are loaded
    once as [1, H] tiles and broadcast over the partitions with tile.broadcast_to; otherwise the
    DMA broadcasts them (a stride-0 partition dim on the HBM side of nl.load)."""
    H = gamma.shape[0]
    g2, b2 = gamma.reshape((1, H)), beta.reshape((1, H))
    if sbuf_broadcast:
        i_0 = nl.arange(1)[:, None]
        i_h = nl.arange(H)[None, :]
        return nl.load(g2[i_0, i_h]).broadcast_to((P, H)), nl.load(b2[i_0, i_h]).broadcast_to((P, H))
    return nl.load(g2.broadcast_to((P, H))), nl.load(b2.broadcast_to((P, H)))


@nki.jit
def layernorm_legacy_reduce(x, gamma, beta, eps, sbuf_broadcast=False, mask_compute=False):
    """Version 1: mean and variance with nl.mean, normalization with tile operators. As in the
    tutorial, only the load and the store of the last (partial) row tile are masked, unless
    mask_compute also masks every compute instruction."""
    rows, H = x.shape
    out = nl.ndarray((rows, H), dtype=x.dtype, buffer=nl.shared_hbm)
    g_bc, b_bc = _legacy_gamma_beta(gamma, beta, sbuf_broadcast)
    i_p = nl.arange(P)[:, None]
    i_h = nl.arange(H)[None, :]
    for t in nl.affine_range((rows + P - 1) // P):
        live = t * P + i_p < rows
        cm = live if mask_compute else None
        xt = nl.load(x[t * P + i_p, i_h], mask=live, dtype=nl.float32)
        mean = nl.mean(xt, axis=[1], keepdims=True, mask=cm)  # [P, 1]
        shifted = nl.subtract(xt, mean, mask=cm)
        var = nl.mean(nl.square(shifted, mask=cm), axis=[1], keepdims=True, mask=cm)
        rstd = nl.rsqrt(var + eps, mask=cm)
        normed = nl.multiply(shifted, rstd, mask=cm)
        y = nl.add(nl.multiply(normed, g_bc, mask=cm), b_bc, mask=cm, dtype=x.dtype)
        nl.store(out[t * P + i_p, i_h], value=y, mask=live)
    return out


@nki.jit
def layernorm_legacy_bn(x, gamma, beta, eps, sbuf_broadcast=False, mask_compute=False):
    """Version 2: functional nisa.bn_stats per <=512-element chunk into one stats tile, nisa.bn_aggr,
    rstd on the Scalar engine, and (x - mean) * rstd in one nisa.tensor_scalar."""
    rows, H = x.shape
    out = nl.ndarray((rows, H), dtype=x.dtype, buffer=nl.shared_hbm)
    g_bc, b_bc = _legacy_gamma_beta(gamma, beta, sbuf_broadcast)
    n_chunks = (H + BN_FMAX - 1) // BN_FMAX
    i_p = nl.arange(P)[:, None]
    i_h = nl.arange(H)[None, :]
    i_6 = nl.arange(6)[None, :]
    i_c = nl.arange(BN_FMAX)[None, :]
    for t in nl.affine_range((rows + P - 1) // P):
        live = t * P + i_p < rows
        cm = live if mask_compute else None
        xt = nl.load(x[t * P + i_p, i_h], mask=live)
        stats = nl.ndarray((P, 6 * n_chunks), dtype=nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(n_chunks):
            # the last chunk may be partial: mask its free-dim tail
            in_row = c * BN_FMAX + i_c < H
            stats[i_p, c * 6 + i_6] = nisa.bn_stats(xt[i_p, c * BN_FMAX + i_c], dtype=nl.float32,
                                                    mask=in_row if cm is None else in_row & cm)
        mean_var = nisa.bn_aggr(stats, mask=cm)  # [P, 2]: mean, variance
        mean = mean_var[i_p, nl.arange(1)[None, :]]
        var = mean_var[i_p, 1 + nl.arange(1)[None, :]]
        rstd = nisa.activation(op=nl.rsqrt, data=nl.add(var, eps, mask=cm), mask=cm)  # Scalar engine
        normed = nisa.tensor_scalar(xt, op0=nl.subtract, operand0=mean, op1=nl.multiply, operand1=rstd,
                                    mask=cm, dtype=nl.float32)
        y = nisa.tensor_tensor(normed, g_bc, op=nl.multiply, mask=cm)
        y = nisa.tensor_tensor(y, b_bc, op=nl.add, mask=cm, dtype=x.dtype)
        nl.store(out[t * P + i_p, i_h], value=y, mask=live)
    return out


# --- current style ----------------------------------------------------------------------------------

def _current_gamma_beta(gamma, beta):
    """gamma, beta broadcast to [P, H] SBUF tiles by a DMA with a stride-0 partition dim."""
    H = gamma.shape[0]
    g = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=g, src=gamma.reshape((1, H)).broadcast(0, P))
    nisa.dma_copy(dst=b, src=beta.reshape((1, H)).broadcast(0, P))
    return g, b


@nki.jit
def layernorm_current_reduce(x, gamma, beta, eps):
    """Version 1 in destination-passing style: tensor_reduce sums, activation square with an
    add-reduction for the sum of squares."""
    rows, H = x.shape
    out = nl.ndarray((rows, H), dtype=x.dtype, buffer=nl.shared_hbm)
    g, b = _current_gamma_beta(gamma, beta)
    for r0 in range(0, rows, P):
        pp = min(P, rows - r0)
        xt = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[0:pp], src=x[r0:r0 + pp, :])
        total = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=total[0:pp], op=nl.add, data=xt[0:pp], axis=1, keepdims=True)
        neg_mean = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg_mean[0:pp], data=total[0:pp], op0=nl.multiply, operand0=-1.0 / H)
        # shifted = x - mean (Scalar engine: identity activation with a per-partition bias), and
        # the sum of its squares accumulated by a second activation's add-reduction
        shifted = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=shifted[0:pp], op=nl.copy, data=xt[0:pp], bias=neg_mean[0:pp])
        squares = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
        sum_sq = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=squares[0:pp], op=nl.square, data=shifted[0:pp], reduce_op=nl.add,
                               reduce_res=sum_sq[0:pp])
        rstd = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        # rstd = (sum_sq / H + eps) ** -0.5
        nisa.tensor_scalar(dst=rstd[0:pp], data=sum_sq[0:pp], op0=nl.multiply, operand0=1.0 / H,
                           op1=nl.add, operand1=eps)
        nisa.activation(dst=rstd[0:pp], op=nl.rsqrt, data=rstd[0:pp])
        y = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=y[0:pp], data=shifted[0:pp], op0=nl.multiply, operand0=rstd[0:pp],
                                  op1=nl.multiply, operand1=g[0:pp])
        y_out = nl.ndarray((P, H), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y_out[0:pp], data1=y[0:pp], data2=b[0:pp], op=nl.add)
        nisa.dma_copy(dst=out[r0:r0 + pp, :], src=y_out[0:pp])
    return out


@nki.jit
def layernorm_current_bn(x, gamma, beta, eps):
    """Version 2 in destination-passing style: bn_stats per chunk into a [P, chunks, 6] stats tile,
    bn_aggr, rstd = rsqrt(var + eps) in one two-op tensor_scalar, one fused tensor_scalar for
    (x - mean) * rstd, then * gamma and + beta."""
    rows, H = x.shape
    out = nl.ndarray((rows, H), dtype=x.dtype, buffer=nl.shared_hbm)
    g, b = _current_gamma_beta(gamma, beta)
    n_chunks = (H + BN_FMAX - 1) // BN_FMAX
    for r0 in range(0, rows, P):
        pp = min(P, rows - r0)
        xt = nl.ndarray((P, H), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[0:pp], src=x[r0:r0 + pp, :])
        stats = nl.ndarray((P, n_chunks, 6), dtype=nl.float32, buffer=nl.sbuf)
        for c in range(n_chunks):
            c0 = c * BN_FMAX
            cw = min(BN_FMAX, H - c0)
            nisa.bn_stats(dst=stats[0:pp, c, :], data=xt[0:pp, c0:c0 + cw])
        mean_var = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mean_var[0:pp], data=stats[0:pp])
        rstd = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rstd[0:pp], data=mean_var[0:pp, 1:2], op0=nl.add, operand0=eps,
                           op1=nl.rsqrt, operand1=0.0)
        normed = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=normed[0:pp], data=xt[0:pp], op0=nl.subtract, operand0=mean_var[0:pp, 0:1],
                           op1=nl.multiply, operand1=rstd[0:pp])
        gn = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=gn[0:pp], data1=normed[0:pp], data2=g[0:pp], op=nl.multiply)
        y_out = nl.ndarray((P, H), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y_out[0:pp], data1=gn[0:pp], data2=b[0:pp], op=nl.add)
        nisa.dma_copy(dst=out[r0:r0 + pp, :], src=y_out[0:pp])
    return out


# --- reference and tolerance ----------------------------------------------------------------------

def _reference(x, gamma, beta, eps):
    x = f64(x)
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * f64(gamma) + f64(beta)


def _check(out, x, gamma, beta, eps, out_eps):
    """Error budget, per element, in units of the row's standard deviation:
    the fp32 sums of H terms (mean, variance / bn_stats' pairwise statistics) are off by at most
    ~H * u32 relative to the sum of magnitudes; with inputs of unit scale that moves the
    normalized value by <= c * H * u32 * (|x - mean| / std + 1). We take c = 4 (mean, variance,
    rsqrt and the products each contribute), then multiply by |gamma| and add the final rounding
    to the output dtype (out_eps * |ref|) and beta's fp32 add (u32 * |beta|)."""
    ref = _reference(x, gamma, beta, eps)
    xd = f64(x)
    mean = xd.mean(axis=1, keepdims=True)
    std = np.sqrt(((xd - mean) ** 2).mean(axis=1, keepdims=True) + eps)
    H = x.shape[1]
    z = np.abs(xd - mean) / std
    bound = (4 * H * EPS_FP32 * (z + 1) * np.abs(f64(gamma)) + out_eps * np.abs(ref)
             + 2 * EPS_FP32 * np.abs(f64(beta)) + 1e-30)
    err = np.abs(f64(out) - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (f"max err/bound {float((err / bound)[worst]):.3g} at {worst}: "
                                  f"got {f64(out)[worst]}, want {ref[worst]}")


def _inputs(rng, rows, H, dt=np.float32):
    # rows with different offsets and scales, so that mean and variance both matter
    x = (rng.standard_normal((rows, H)) * rng.uniform(0.5, 3.0, (rows, 1)) + rng.uniform(-2, 2, (rows, 1)))
    gamma = rng.uniform(0.5, 1.5, H)
    beta = rng.standard_normal(H) * 0.1
    x = to_bf16(x) if dt is bf16 else x.astype(np.float32)
    return x, gamma.astype(np.float32), beta.astype(np.float32)


SHAPES = [(256, 512), (200, 1000)]  # tile multiples (one bn_stats chunk); ragged rows and chunks
KERNELS = {
    "legacy_reduce": layernorm_legacy_reduce,
    "legacy_bn": layernorm_legacy_bn,
    "current_reduce": layernorm_current_reduce,
    "current_bn": layernorm_current_bn,
}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(KERNELS))
def test_layernorm_fp32(rng, name, shape):
    x, gamma, beta = _inputs(rng, *shape)
    out = KERNELS[name](x, gamma, beta, EPS)
    assert out.dtype == np.float32 and out.shape == shape
    _check(out, x, gamma, beta, EPS, EPS_FP32)


@pytest.mark.parametrize("name", ["legacy_bn", "current_bn", "current_reduce"])
def test_layernorm_bf16_io(rng, name):
    """bf16 input and output; statistics in fp32. The reference uses the same bf16 inputs, so
    only the output rounding (u_bf16 relative) is added to the fp32 budget."""
    x, gamma, beta = _inputs(rng, 200, 640, bf16)
    out = KERNELS[name](x, gamma, beta, EPS)
    assert out.dtype == bf16
    _check(out, x, gamma, beta, EPS, EPS_BF16)


@pytest.mark.parametrize("name", ["legacy_reduce", "legacy_bn"])
def test_layernorm_legacy_tutorial_sbuf_broadcast(rng, name):
    x, gamma, beta = _inputs(rng, 200, 512)
    out = KERNELS[name](x, gamma, beta, EPS, True)
    _check(out, x, gamma, beta, EPS, EPS_FP32)


@pytest.mark.parametrize("name", ["legacy_reduce", "legacy_bn"])
def test_layernorm_legacy_masked_compute(rng, name):
    x, gamma, beta = _inputs(rng, 200, 512)
    out = KERNELS[name](x, gamma, beta, EPS, False, True)
    _check(out, x, gamma, beta, EPS, EPS_FP32)


def test_bn_stats_fmax_matches_target():
    assert nl.tile_size.bn_stats_fmax == BN_FMAX and nl.tile_size.pmax == P
