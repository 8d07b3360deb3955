"""AveragePool2D, after NKI's "average_pool2d" tutorial: in [C, H, W] -> out [C, H//k, W//k], each
output the mean of a k x k window (stride k, no padding, a remainder of H or W dropped, as in
torch's avg_pool2d). Channels go on partitions; the pooling is a reduction over two free axes of
a 5-D view [C, H//k, k, W//k, k] (or [C, H//k, W//k, k, k]) of the input tile.

Legacy style: nl.mgrid index expressions building the 5-D view and nl.sum over axes [2, 4]
(the tutorial's way), nl.load / nl.store with mask= for a ragged channel tile. Current style:
nisa.dma_copy, a 5-D view from reshape + permute or from a raw .ap() pattern, and
destination-passing nisa.tensor_reduce over the last two axes + nisa.tensor_scalar for 1/k^2.
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
def avgpool_legacy(in_tensor, pool_size, tutorial_axes=False):
    """The tutorial's kernel, extended to more than 128 channels (masked partition tiles). With
    tutorial_axes the 5-D view is [C, Ho, k, Wo, k] reduced over axes [2, 4] as in the tutorial;
    otherwise the window axes are placed last ([C, Ho, Wo, k, k], reduced over [3, 4])."""
    C, H, W = in_tensor.shape
    k = pool_size
    Ho, Wo = H // k, W // k
    out_tensor = nl.ndarray((C, Ho, Wo), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    i_c, i_h, i_w = nl.mgrid[0:P, 0:H, 0:W]
    o_c, o_h, o_w = nl.mgrid[0:P, 0:Ho, 0:Wo]
    for t in nl.affine_range((C + P - 1) // P):
        in_tile = nl.load(in_tensor[t * P + i_c, i_h, i_w], mask=(t * P + i_c < C))
        if tutorial_axes:
            # [channel, out row, row in window, out column, column in window]
            j0, j1, j2, j3, j4 = nl.mgrid[0:P, 0:Ho, 0:k, 0:Wo, 0:k]
            window_sum = nl.sum(in_tile[j0, k * j1 + j2, k * j3 + j4], axis=[2, 4], dtype=nl.float32)
        else:
            # [channel, out row, out column, row in window, column in window]
            j0, j1, j2, j3, j4 = nl.mgrid[0:P, 0:Ho, 0:Wo, 0:k, 0:k]
            window_sum = nl.sum(in_tile[j0, k * j1 + j3, k * j2 + j4], axis=[3, 4], dtype=nl.float32)
        out_tile = nl.multiply(window_sum, 1.0 / (k * k), dtype=in_tensor.dtype)
        nl.store(out_tensor[t * P + o_c, o_h, o_w], value=out_tile, mask=(t * P + o_c < C))
    return out_tensor


# --- current style ----------------------------------------------------------------------------------

@nki.jit
def avgpool_current(in_tensor, pool_size, use_ap=False):
    C, H, W = in_tensor.shape
    k = pool_size
    Ho, Wo = H // k, W // k
    out_tensor = nl.ndarray((C, Ho, Wo), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    for c0 in range(0, C, P):
        pc = min(P, C - c0)
        in_tile = nl.ndarray((pc, H, W), dtype=in_tensor.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=in_tile, src=in_tensor[c0:c0 + pc])
        if use_ap:
            # [pc, Ho, Wo, k, k] with strides (H*W, k*W, k, W, 1) over the tile's storage
            windows = in_tile.ap(pattern=[[H * W, pc], [k * W, Ho], [k, Wo], [W, k], [1, k]])
        else:
            windows = (in_tile[:, 0:Ho * k, 0:Wo * k]
                       .reshape_dim(2, (Wo, k))        # [pc, Ho*k, Wo, k]
                       .reshape_dim(1, (Ho, k))        # [pc, Ho, k, Wo, k]
                       .permute((0, 1, 3, 2, 4)))      # [pc, Ho, Wo, k, k]
        sums = nl.ndarray((pc, Ho, Wo), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=sums, op=nl.add, data=windows, axis=(3, 4))
        out_tile = nl.ndarray((pc, Ho, Wo), dtype=in_tensor.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=out_tile, data=sums, op0=nl.multiply, operand0=1.0 / (k * k))
        nisa.dma_copy(dst=out_tensor[c0:c0 + pc], src=out_tile)
    return out_tensor


# --- reference and tolerance ----------------------------------------------------------------------

def _check(out, x, k, out_eps):
    """The window sum of k*k terms in fp32 is off by <= (k*k - 1) * u32 relative to the sum of
    |terms|; scaling by 1/k^2 rounds once more (1/k^2 itself is rounded to fp32 when k is not a
    power of two: one more u32), then the write rounds to the output dtype."""
    C, H, W = x.shape
    Ho, Wo = H // k, W // k
    win = f64(x)[:, :Ho * k, :Wo * k].reshape(C, Ho, k, Wo, k)
    ref = win.mean(axis=(2, 4))
    mag = np.abs(win).mean(axis=(2, 4))
    bound = (k * k + 2) * EPS_FP32 * mag + out_eps * np.abs(ref) + 1e-30
    err = np.abs(f64(out) - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (f"max err/bound {float((err / bound)[worst]):.3g} at {worst}: "
                                  f"got {f64(out)[worst]}, want {ref[worst]}")


CASES = [((2, 6, 6), 2), ((128, 16, 16), 2), ((200, 12, 18), 3), ((64, 13, 10), 4)]
IDS = ["tutorial_2x6x6_k2", "128x16x16_k2", "200x12x18_k3", "64x13x10_k4_remainder"]


def _input(rng, shape, dt):
    x = rng.standard_normal(shape) * 4.0
    return to_bf16(x) if dt is bf16 else x.astype(np.float32)


@pytest.mark.parametrize("shape,k", CASES, ids=IDS)
@pytest.mark.parametrize("dt", [np.float32, bf16], ids=["fp32", "bf16"])
def test_avgpool_legacy(rng, shape, k, dt):
    x = _input(rng, shape, dt)
    out = avgpool_legacy(x, k)
    assert out.dtype == x.dtype and out.shape == (shape[0], shape[1] // k, shape[2] // k)
    _check(out, x, k, EPS_BF16 if dt is bf16 else EPS_FP32)


@pytest.mark.parametrize("shape,k", CASES, ids=IDS)
@pytest.mark.parametrize("use_ap", [False, True], ids=["views", "ap"])
@pytest.mark.parametrize("dt", [np.float32, bf16], ids=["fp32", "bf16"])
def test_avgpool_current(rng, shape, k, use_ap, dt):
    x = _input(rng, shape, dt)
    out = avgpool_current(x, k, use_ap)
    assert out.dtype == x.dtype
    _check(out, x, k, EPS_BF16 if dt is bf16 else EPS_FP32)


def test_avgpool_tutorial_example_exact():
    """The tutorial's driver input: arange values; every window mean is a multiple of 0.5 and
    exact, so the result must equal numpy's bit for bit."""
    x = np.arange(2 * 6 * 6, dtype=np.float32).reshape(2, 6, 6)
    expected = x.reshape(2, 3, 2, 3, 2).mean(axis=(2, 4))
    np.testing.assert_array_equal(avgpool_legacy(x, 2), expected)
    np.testing.assert_array_equal(avgpool_current(x, 2), expected)


def test_avgpool_legacy_tutorial_axes(rng):
    x = _input(rng, (2, 6, 6), np.float32)
    _check(avgpool_legacy(x, 2, True), x, 2, EPS_FP32)
