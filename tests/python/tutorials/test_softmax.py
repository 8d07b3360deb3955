"""Softmax over the rows of a [rows, N] tensor, as in the softmax step of NKI's fused-attention
tutorial: y = exp(x - max(x)) / sum(exp(x - max(x))), row by row, rows on partitions.

Legacy style: nl.load / nl.store with index expressions and mask=, tile operators and nl.max /
nl.exp / nl.sum / nl.divide; the functional-ISA version fuses the exp, the max subtraction (as an
activation bias) and the row sum (an add-reduction) into one nisa.activation. The library's
nl.softmax is checked too. Current style: destination-passing ISA with the row processed in
512-element chunks (per-chunk maxima and sums, combined at the end).
"""

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

from ._util import EPS_BF16, EPS_FP32, bf16, f64, to_bf16

P = 128
CHUNK = 512


# --- legacy (Beta 1) style ------------------------------------------------------------------------

@nki.jit
def softmax_legacy_nl(x):
    rows, N = x.shape
    out = nl.ndarray((rows, N), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(P)[:, None]
    i_f = nl.arange(N)[None, :]
    for t in nl.affine_range((rows + P - 1) // P):
        live = t * P + i_p < rows
        xt = nl.load(x[t * P + i_p, i_f], mask=live, dtype=nl.float32)
        row_max = nl.max(xt, axis=[1], keepdims=True)
        e = nl.exp(xt - row_max)
        total = nl.sum(e, axis=[1], keepdims=True)
        y = nl.divide(e, total, dtype=x.dtype)
        nl.store(out[t * P + i_p, i_f], value=y, mask=live)
    return out


@nki.jit
def softmax_legacy_isa(x):
    rows, N = x.shape
    out = nl.ndarray((rows, N), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(P)[:, None]
    i_f = nl.arange(N)[None, :]
    for t in nl.affine_range((rows + P - 1) // P):
        live = t * P + i_p < rows
        xt = nl.load(x[t * P + i_p, i_f], mask=live)
        neg_max = nisa.tensor_reduce(np.max, xt, axis=[1], negate=True, keepdims=True, dtype=nl.float32)
        total = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        e = nisa.activation_reduce(op=nl.exp, data=xt, bias=neg_max, reduce_op=nl.add, reduce_res=total,
                                   dtype=nl.float32)
        inv = nisa.reciprocal(total)
        y = nisa.tensor_scalar(e, np.multiply, inv, dtype=x.dtype)
        nl.store(out[t * P + i_p, i_f], value=y, mask=live)
    return out


@nki.jit
def softmax_legacy_library(x):
    rows, N = x.shape
    out = nl.ndarray((rows, N), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(P)[:, None]
    i_f = nl.arange(N)[None, :]
    for t in nl.affine_range((rows + P - 1) // P):
        live = t * P + i_p < rows
        xt = nl.load(x[t * P + i_p, i_f], mask=live)
        nl.store(out[t * P + i_p, i_f], value=nl.softmax(xt, axis=1), mask=live)
    return out


# --- current style ----------------------------------------------------------------------------------

@nki.jit
def softmax_current_chunked(x):
    """Rows in tiles of up to 128, each row in chunks of up to 512: pass 1 takes per-chunk maxima
    (one column each of a [P, chunks] tile) and their max; pass 2 computes exp(x - max) per chunk
    with per-chunk sums, then scales by 1 / (sum of the sums)."""
    rows, N = x.shape
    out = nl.ndarray((rows, N), dtype=x.dtype, buffer=nl.shared_hbm)
    n_chunks = (N + CHUNK - 1) // CHUNK
    for r0 in range(0, rows, P):
        pp = min(P, rows - r0)
        xt = nl.ndarray((pp, N), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[r0:r0 + pp, :])
        maxes = nl.ndarray((pp, n_chunks), dtype=nl.float32, buffer=nl.sbuf)
        for c in range(n_chunks):
            c0, cw = c * CHUNK, min(CHUNK, N - c * CHUNK)
            nisa.tensor_reduce(dst=maxes[:, c:c + 1], op=nl.maximum, data=xt[:, c0:c0 + cw], axis=1, keepdims=True)
        neg_max = nl.ndarray((pp, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=maxes, axis=1, negate=True, keepdims=True)
        e = nl.ndarray((pp, N), dtype=nl.float32, buffer=nl.sbuf)
        sums = nl.ndarray((pp, n_chunks), dtype=nl.float32, buffer=nl.sbuf)
        for c in range(n_chunks):
            c0, cw = c * CHUNK, min(CHUNK, N - c * CHUNK)
            nisa.activation(dst=e[:, c0:c0 + cw], op=nl.exp, data=xt[:, c0:c0 + cw], bias=neg_max,
                            reduce_op=nl.add, reduce_res=sums[:, c:c + 1], reduce_cmd=nisa.reduce_cmd.reset_reduce)
        total = nl.ndarray((pp, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=total, op=nl.add, data=sums, axis=1, keepdims=True)
        inv = nl.ndarray((pp, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv, data=total)
        y = nl.ndarray((pp, N), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=inv)
        nisa.dma_copy(dst=out[r0:r0 + pp, :], src=y)
    return out


# --- reference and tolerance ----------------------------------------------------------------------

def _check(out, x, out_eps):
    """Relative error budget per element, in fp32 units u: x - max is one fp32 add (absolute error
    u * |x - max|, i.e. that much relative error after exp), exp rounds once, the row sum of N
    positive terms is off by <= (N - 1) u relative, the reciprocal and the product round once
    each: (N + max|x - max| + 4) u; plus the final rounding to the output dtype."""
    xd = f64(x)
    shifted = xd - xd.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    ref = e / e.sum(axis=1, keepdims=True)
    N = x.shape[1]
    spread = np.abs(shifted).max()
    bound = ((N + spread + 4) * EPS_FP32 + out_eps) * ref + 1e-38
    err = np.abs(f64(out) - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (f"max err/bound {float((err / bound)[worst]):.3g} at {worst}: "
                                  f"got {f64(out)[worst]}, want {ref[worst]}")
    np.testing.assert_allclose(f64(out).sum(axis=1), 1.0, rtol=N * (EPS_FP32 + out_eps))


def _inputs(rng, rows, N, dt):
    # logits with row-dependent offsets (softmax must be shift-invariant) and a spread of ~+-12
    x = rng.standard_normal((rows, N)) * 3.0 + rng.uniform(-50, 50, (rows, 1))
    return to_bf16(x) if dt is bf16 else x.astype(np.float32)


KERNELS = {
    "legacy_nl": softmax_legacy_nl,
    "legacy_isa": softmax_legacy_isa,
    "legacy_library": softmax_legacy_library,
    "current_chunked": softmax_current_chunked,
}
SHAPES = [(256, 512), (200, 1100)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dt", [np.float32, bf16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(KERNELS))
def test_softmax(rng, name, dt, shape):
    x = _inputs(rng, *shape, dt)
    out = KERNELS[name](x)
    assert out.dtype == x.dtype and out.shape == shape
    _check(out, x, EPS_BF16 if dt is bf16 else EPS_FP32)
