"""RMSNorm, after NKI's "rmsnorm" tutorial: for a [rows, H] and g [H],
out = a / sqrt(mean(a^2) + eps) * g, row by row (the tutorial has eps = 0; we take a small eps as
models do, and also run eps = 0). Rows go on partitions, 128 per tile, the last tile masked /
smaller; g is broadcast over the partitions once.

Legacy style: nl.load / nl.store with index expressions and mask=, nl.square / nl.sum / nl.rsqrt
/ nl.multiply returning tiles (and the library's nl.rms_norm). Current style: a Scalar-engine
square with an add-reduction (nisa.activation_reduce), the rsqrt in a two-op nisa.tensor_scalar,
and one nisa.scalar_tensor_tensor for a * rstd * g.
"""

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

from ._util import EPS_BF16, EPS_FP32, bf16, f64, to_bf16

P = 128


# --- legacy (Beta 1) style ------------------------------------------------------------------------

@nki.jit
def rmsnorm_legacy(a_tensor, g_tensor, eps, sbuf_broadcast=False):
    rows, H = a_tensor.shape
    out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(P)[:, None]
    i_h = nl.arange(H)[None, :]
    g2 = g_tensor.reshape((1, H))
    if sbuf_broadcast:
        # the tutorial's way: a [1, H] tile broadcast over the partitions
        g_bcast = nl.load(g2[nl.arange(1)[:, None], i_h]).broadcast_to((P, H))
    else:
        g_bcast = nl.load(g2.broadcast_to((P, H)))  # the DMA broadcasts
    for t in nl.affine_range((rows + P - 1) // P):
        live = t * P + i_p < rows
        a_tile = nl.load(a_tensor[t * P + i_p, i_h], mask=live)
        sq = nl.square(a_tile, dtype=nl.float32)
        ms = nl.sum(sq, axis=[1]) * (1.0 / H)  # [P, 1]
        rstd = nl.rsqrt(ms + eps)
        y = nl.multiply(nl.multiply(a_tile, rstd, dtype=nl.float32), g_bcast, dtype=a_tensor.dtype)
        nl.store(out_tensor[t * P + i_p, i_h], value=y, mask=live)
    return out_tensor


@nki.jit
def rmsnorm_legacy_library(a_tensor, g_tensor, eps):
    """The same through nl.rms_norm (the weight as a [P, H] tile, broadcast by the DMA)."""
    rows, H = a_tensor.shape
    out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(P)[:, None]
    i_h = nl.arange(H)[None, :]
    g_tile = nl.load(g_tensor.reshape((1, H)).broadcast_to((P, H)))
    for t in nl.affine_range((rows + P - 1) // P):
        live = t * P + i_p < rows
        a_tile = nl.load(a_tensor[t * P + i_p, i_h], mask=live)
        y = nl.rms_norm(a_tile, g_tile, axis=1, n=H, epsilon=eps)
        nl.store(out_tensor[t * P + i_p, i_h], value=y, mask=live)
    return out_tensor


# --- current style ----------------------------------------------------------------------------------

@nki.jit
def rmsnorm_current(a_tensor, g_tensor, eps):
    rows, H = a_tensor.shape
    out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    g_tile = nl.ndarray((P, H), dtype=g_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=g_tile, src=g_tensor.reshape((1, H)).broadcast(0, P))
    for r0 in range(0, rows, P):
        pp = min(P, rows - r0)
        a_tile = nl.ndarray((pp, H), dtype=a_tensor.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a_tile, src=a_tensor[nl.ds(r0, pp), :])
        squares = nl.ndarray((pp, H), dtype=nl.float32, buffer=nl.sbuf)
        sum_sq = nl.ndarray((pp, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=squares, op=nl.square, data=a_tile, reduce_op=nl.add, reduce_res=sum_sq)
        rstd = nl.ndarray((pp, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rstd, data=sum_sq, op0=nl.multiply, operand0=1.0 / H, op1=nl.add, operand1=eps)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=rstd)
        y = nl.ndarray((pp, H), dtype=a_tensor.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=y, data=a_tile, op0=nl.multiply, operand0=rstd, op1=nl.multiply,
                                  operand1=g_tile[0:pp])
        nisa.dma_copy(dst=out_tensor[nl.ds(r0, pp), :], src=y)
    return out_tensor


# --- reference and tolerance ----------------------------------------------------------------------

def _reference(a, g, eps):
    a = f64(a)
    return a / np.sqrt((a * a).mean(axis=1, keepdims=True) + eps) * f64(g)


def _check(out, a, g, eps, out_eps):
    """The sum of H squares (all >= 0) in fp32 has relative error <= (H - 1) * u32; rsqrt halves
    it and adds a rounding, the scaling by 1/H, the products by rstd and g add a rounding each:
    relative error <= (H / 2 + 4) * u32 -- we allow (H + 4) * u32 -- plus the final rounding to
    the output dtype (out_eps)."""
    ref = _reference(a, g, eps)
    H = a.shape[1]
    bound = ((H + 4) * EPS_FP32 + out_eps) * np.abs(ref) + 1e-30
    err = np.abs(f64(out) - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (f"max err/bound {float((err / bound)[worst]):.3g} at {worst}: "
                                  f"got {f64(out)[worst]}, want {ref[worst]}")


def _inputs(rng, rows, H, dt=np.float32):
    a = rng.standard_normal((rows, H)) * rng.uniform(0.2, 4.0, (rows, 1))
    g = rng.uniform(0.5, 1.5, H)
    if dt is bf16:
        return to_bf16(a), to_bf16(g)
    return a.astype(np.float32), g.astype(np.float32)


SHAPES = [(256, 512), (300, 768)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_rmsnorm_legacy(rng, shape, eps):
    a, g = _inputs(rng, *shape)
    out = rmsnorm_legacy(a, g, eps)
    assert out.dtype == np.float32 and out.shape == shape
    _check(out, a, g, eps, EPS_FP32)


def test_rmsnorm_legacy_tutorial_sbuf_broadcast(rng):
    a, g = _inputs(rng, 300, 512)
    _check(rmsnorm_legacy(a, g, 0.0, True), a, g, 0.0, EPS_FP32)


def test_rmsnorm_legacy_library(rng):
    a, g = _inputs(rng, 300, 512)
    _check(rmsnorm_legacy_library(a, g, 1e-6), a, g, 1e-6, EPS_FP32)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_rmsnorm_current(rng, shape, eps):
    a, g = _inputs(rng, *shape)
    _check(rmsnorm_current(a, g, eps), a, g, eps, EPS_FP32)


@pytest.mark.parametrize("kernel", [rmsnorm_legacy, rmsnorm_current], ids=["legacy", "current"])
def test_rmsnorm_bf16_io(rng, kernel):
    """bf16 in, bf16 out, fp32 statistics: the reference uses the same bf16 values, so the
    budget only grows by the output rounding."""
    a, g = _inputs(rng, 200, 512, bf16)
    out = kernel(a, g, 1e-6)
    assert out.dtype == bf16
    _check(out, a, g, 1e-6, EPS_BF16)
