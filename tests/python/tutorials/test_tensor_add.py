"""SPMD tensor addition, after NKI's "SPMD tensor addition" tutorial: c = a + b over a 2-D tensor,
one program instance of a launch grid per [128, 512] tile.

Both API styles: the legacy one (nl.load / nl.store with nl.arange index expressions and mask=
for the ragged edge tiles) and the current one (slices bounded with min(), nisa.dma_copy,
destination-passing nisa.tensor_tensor). An addition is one fp32 (or bf16) rounding of the exact
sum, so results must match numpy bit for bit.
"""

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

from ._util import bf16, to_bf16

TILE_P = 128  # partitions per tile (nl.tile_size.pmax)
TILE_F = 512  # elements per partition per tile


def _grid(shape):
    return ((shape[0] + TILE_P - 1) // TILE_P, (shape[1] + TILE_F - 1) // TILE_F)


# --- legacy (Beta 1) style ------------------------------------------------------------------------

@nki.jit
def add_legacy(a_input, b_input):
    """One [128, 512] tile per program instance; mask= trims the tiles that overhang the edges."""
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    rows, cols = a_input.shape
    row0 = nl.program_id(0) * TILE_P
    col0 = nl.program_id(1) * TILE_F
    ix = row0 + nl.arange(TILE_P)[:, None]
    iy = col0 + nl.arange(TILE_F)[None, :]
    inside = (ix < rows) & (iy < cols)
    a_tile = nl.load(a_input[ix, iy], mask=inside)
    b_tile = nl.load(b_input[ix, iy], mask=inside)
    c_tile = a_tile + b_tile
    nl.store(c_output[ix, iy], value=c_tile, mask=inside)
    return c_output


@nki.jit
def add_legacy_mgrid(a_input, b_input):
    """The same with nl.mgrid indices, functional nisa.tensor_tensor and a loop over the column
    tiles inside each program instance (the grid covers the rows only)."""
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    rows, cols = a_input.shape
    i_p, i_f = nl.mgrid[0:TILE_P, 0:TILE_F]
    row0 = nl.program_id(0) * TILE_P
    for j in nl.affine_range((cols + TILE_F - 1) // TILE_F):
        inside = (row0 + i_p < rows) & (j * TILE_F + i_f < cols)
        a_tile = nl.load(a_input[row0 + i_p, j * TILE_F + i_f], mask=inside)
        b_tile = nl.load(b_input[row0 + i_p, j * TILE_F + i_f], mask=inside)
        c_tile = nisa.tensor_tensor(a_tile, b_tile, op=nl.add, mask=inside)
        nl.store(c_output[row0 + i_p, j * TILE_F + i_f], value=c_tile, mask=inside)
    return c_output


# --- current style ----------------------------------------------------------------------------------

@nki.jit
def add_current(a_input, b_input):
    """One tile per program instance of a 2-D grid; the edge tiles are smaller (min() bounds)."""
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    rows, cols = a_input.shape
    r0 = nl.program_id(0) * TILE_P
    c0 = nl.program_id(1) * TILE_F
    pr = min(TILE_P, rows - r0)
    fc = min(TILE_F, cols - c0)
    a_tile = nl.ndarray((pr, fc), dtype=a_input.dtype, buffer=nl.sbuf)
    b_tile = nl.ndarray((pr, fc), dtype=b_input.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_tile, src=a_input[r0:r0 + pr, c0:c0 + fc])
    nisa.dma_copy(dst=b_tile, src=b_input[nl.ds(r0, pr), nl.ds(c0, fc)])
    c_tile = nl.ndarray((pr, fc), dtype=a_input.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=c_tile, data1=a_tile, data2=b_tile, op=nl.add)
    nisa.dma_copy(dst=c_output[r0:r0 + pr, c0:c0 + fc], src=c_tile)
    return c_output


@nki.jit
def add_current_lnc(a_input, b_input):
    """Launched as kernel[n]: the row tiles are dealt round-robin to the n program instances (as an
    LNC=2 kernel splits work between two cores); each instance loops over its tiles."""
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    rows, cols = a_input.shape
    me, n = nl.program_id(0), nl.num_programs(0)
    for t in range(me, (rows + TILE_P - 1) // TILE_P, n):
        r0 = t * TILE_P
        pr = min(TILE_P, rows - r0)
        for c0 in range(0, cols, TILE_F):
            fc = min(TILE_F, cols - c0)
            a_tile = nl.ndarray((pr, fc), dtype=a_input.dtype, buffer=nl.sbuf)
            b_tile = nl.ndarray((pr, fc), dtype=b_input.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a_tile, src=a_input[r0:r0 + pr, c0:c0 + fc])
            nisa.dma_copy(dst=b_tile, src=b_input[r0:r0 + pr, c0:c0 + fc])
            nisa.tensor_tensor(dst=a_tile, data1=a_tile, data2=b_tile, op=nl.add)
            nisa.dma_copy(dst=c_output[r0:r0 + pr, c0:c0 + fc], src=a_tile)
    return c_output


# --- tests ----------------------------------------------------------------------------------------

SHAPES = [(256, 1024), (300, 700)]  # tile multiples, and ragged in both dims
DTYPES = [np.float32, bf16]


def _inputs(rng, shape, dt):
    a = rng.standard_normal(shape, dtype=np.float32)
    b = rng.standard_normal(shape, dtype=np.float32)
    if dt is bf16:
        return to_bf16(a), to_bf16(b)
    return a, b


def _expected(a, b):
    # Exact sum in fp64, one rounding to the output dtype: what the engine does (fp32 compute of
    # fp32/bf16 inputs is exact enough that the single final rounding decides).
    return (a.astype(np.float64) + b.astype(np.float64)).astype(a.dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dt", DTYPES, ids=["fp32", "bf16"])
def test_add_legacy_spmd_grid(rng, shape, dt):
    a, b = _inputs(rng, shape, dt)
    c = add_legacy[_grid(shape)](a, b)
    assert c.dtype == a.dtype and c.shape == shape
    np.testing.assert_array_equal(c, _expected(a, b))


@pytest.mark.parametrize("shape", SHAPES)
def test_add_legacy_mgrid_row_grid(rng, shape):
    a, b = _inputs(rng, shape, np.float32)
    c = add_legacy_mgrid[_grid(shape)[0]](a, b)
    np.testing.assert_array_equal(c, _expected(a, b))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dt", DTYPES, ids=["fp32", "bf16"])
def test_add_current_spmd_grid(rng, shape, dt):
    a, b = _inputs(rng, shape, dt)
    c = add_current[_grid(shape)](a, b)
    np.testing.assert_array_equal(c, _expected(a, b))


@pytest.mark.parametrize("shape", SHAPES)
def test_add_current_lnc2(rng, shape):
    a, b = _inputs(rng, shape, np.float32)
    c = add_current_lnc[2](a, b)
    np.testing.assert_array_equal(c, _expected(a, b))


def test_add_current_simulate_entry(rng):
    a, b = _inputs(rng, (128, 512), np.float32)
    c = nki.simulate(add_current[1, 1])(a, b)
    np.testing.assert_array_equal(c, _expected(a, b))
