"""End-to-end smoke test: a kernel in each API style against numpy."""

import numpy as np

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl


@nki.jit
def add_current(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    ta = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    nisa.tensor_tensor(dst=ta, data1=ta, data2=tb, op=nl.add)
    nisa.dma_copy(dst=out, src=ta)
    return out


@nki.jit
def add_legacy(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(a) + nl.load(b))
    return out


def test_both_styles_add_exactly(rng):
    a = rng.standard_normal((128, 512), dtype=np.float32)
    b = rng.standard_normal((128, 512), dtype=np.float32)
    # fp32 addition is exact-rounded identically in numpy and on the engines.
    np.testing.assert_array_equal(add_current(a, b), a + b)
    np.testing.assert_array_equal(add_legacy(a, b), a + b)
