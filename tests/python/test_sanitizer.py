"""The sanitizer (nki.jit(sanitize=True) / NIKKI_SANITIZE=1): what a sequential simulator hides.

1. Dependencies between iterations of nl.affine_range loops, which NKI may reorder and overlap:
   each kernel built to break the rule is caught, and the error names the loop's line, both
   instructions' lines, the tensor and the iterations. Accumulations NKI allows (PSUM matmul
   accumulation, ``+=`` on a tile) and iterations writing disjoint parts of a tensor pass.
2. Uses of memory nothing wrote (SBUF, PSUM, HBM outputs and scratch), checked at run time on
   the reference interpreter: a value computed from never-written bytes that reaches an output,
   a register or a runtime offset is an error naming the line that read the bytes, the first
   unwritten element, the tensor's allocation line and where the value surfaced. Computing on
   garbage that is then discarded (a masked tail tile) is not an error.

Correct kernels (the tutorials, the library kernels) pass clean, with the same results as
unsanitized runs. Lines an error must name are tagged ``# E:<name>``.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl
from nikki.library import library_kernels

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def at(line_of):
    """``at(tag)``: how a report names the line tagged ``# E:<tag>``: file:line."""
    return lambda tag: f"{__file__}:{line_of(tag)}"


def assert_mentions(err: nki.KernelError, *fragments: str):
    text = str(err)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text}"


def caught(kernel, *args) -> nki.KernelError:
    with pytest.raises(nki.KernelError) as info:
        kernel(*args)
    return info.value


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# --- loop-carried dependencies ----------------------------------------------------------------

def running_columns(x):
    """Column block i of the result is block i of x plus the result's block i-1: each iteration
    reads what the previous one wrote."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    acc = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=acc, src=x)
    for i in nl.affine_range(1, 4):  # E:raw_loop
        prev = nl.ndarray((128, 64), x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=prev, src=acc[:, (i - 1) * 64:i * 64])  # E:raw_read
        nisa.tensor_tensor(dst=acc[:, i * 64:(i + 1) * 64], data1=acc[:, i * 64:(i + 1) * 64], data2=prev,  # E:raw_write
                           op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_read_of_another_iterations_write_is_caught(rng, line_of, at):
    x = f32(rng, 128, 256)
    err = caught(nki.jit(running_columns, sanitize=True), x)
    assert err.line == line_of("raw_read")
    assert_mentions(err, "loop-carried dependency", "nl.affine_range loop at " + at("raw_loop"), "'acc'",
                    "iteration 2 reads", "iteration 1 wrote", "at " + at("raw_write"), "nl.sequential_range")


def test_unsanitized_program_order_hides_the_dependency(rng):
    """Without the sanitizer the kernel runs in program order, as if the loop were sequential:
    a running sum over column blocks (which hardware reordering would not give)."""
    x = f32(rng, 128, 256)
    got = nki.jit(running_columns)(x)
    blocks = [x[:, 0:64]]
    for i in range(1, 4):
        blocks.append(x[:, i * 64:(i + 1) * 64] + blocks[-1])
    np.testing.assert_array_equal(got, np.concatenate(blocks, axis=1))


def test_environment_variable_turns_the_sanitizer_on(rng, monkeypatch, line_of):
    kernel = nki.jit(running_columns)
    x = f32(rng, 128, 256)
    kernel(x)  # off: runs
    monkeypatch.setenv("NIKKI_SANITIZE", "1")
    assert kernel.sanitizing()
    assert caught(kernel, x).line == line_of("raw_read")
    monkeypatch.setenv("NIKKI_SANITIZE", "0")
    kernel(x)
    # the keyword wins over the environment
    monkeypatch.setenv("NIKKI_SANITIZE", "1")
    nki.jit(running_columns, sanitize=False)(x)


def test_bad_environment_value_is_a_kernel_error(rng, monkeypatch):
    monkeypatch.setenv("NIKKI_SANITIZE", "yes")
    err = caught(nki.jit(running_columns), f32(rng, 128, 256))
    assert "NIKKI_SANITIZE=yes is not 0 or 1" in str(err) and "set NIKKI_SANITIZE=1" in str(err)


@nki.jit(sanitize=True)
def reused_tile(x):
    """Every iteration loads into the same tile: iterations overwrite each other's data."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.sbuf)
    for i in nl.affine_range(x.shape[0] // 128):  # E:waw_loop
        nisa.dma_copy(dst=buf, src=x[i * 128:(i + 1) * 128, :])  # E:waw_write
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=buf)  # E:waw_read
    return out


def test_iterations_writing_one_tile_are_caught(rng, line_of, at):
    err = caught(reused_tile, f32(rng, 256, 32))
    assert err.line == line_of("waw_write")
    assert_mentions(err, "nl.affine_range loop at " + at("waw_loop"), "iteration 1 overwrites", "'buf'",
                    "iteration 0 wrote", at("waw_write"), "allocate the tile inside the loop")


@nki.jit(sanitize=True)
def same_output_rows(x):
    out = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):  # E:hbm_loop
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        nl.store(out, t)  # E:hbm_write
    return out


def test_iterations_writing_the_same_output_rows_are_caught(rng, line_of, at):
    err = caught(same_output_rows, f32(rng, 384, 16))
    assert err.line == line_of("hbm_write")
    assert "nl.affine_range loop at " + at("hbm_loop") in str(err)
    assert "iteration 1 overwrites" in str(err) and "'out'" in str(err)


@nki.jit(sanitize=True)
def inner_carried(x):
    """The inner loop carries a dependency; the outer one's iterations are independent."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for r in nl.affine_range(x.shape[0] // 128):
        acc = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=acc, src=x[r * 128:(r + 1) * 128, :])
        for c in nl.affine_range(1, x.shape[1]):  # E:inner_loop
            nisa.tensor_tensor(dst=acc[:, c:c + 1], data1=acc[:, c - 1:c], data2=acc[:, c:c + 1],  # E:inner_dep
                               op=nl.add)
        nisa.dma_copy(dst=out[r * 128:(r + 1) * 128, :], src=acc)
    return out


@nki.jit(sanitize=True)
def outer_carried(x):
    """Each outer iteration reads the tile the previous one stored; inner loops are clean."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    state = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=state, src=x[0:128, :])
    for r in nl.affine_range(x.shape[0] // 128):  # E:outer_loop
        for c in nl.affine_range(x.shape[1] // 8):
            nisa.dma_copy(dst=out[r * 128:(r + 1) * 128, c * 8:(c + 1) * 8], src=state[:, c * 8:(c + 1) * 8])  # E:outer_read
        nisa.tensor_scalar(dst=state, data=state, op0=nl.multiply, operand0=2.0)  # E:outer_write
    return out


def test_nested_loops_name_the_loop_that_carries_the_dependency(rng, line_of, at):
    err = caught(inner_carried, f32(rng, 256, 16))
    assert err.line == line_of("inner_dep")
    assert "nl.affine_range loop at " + at("inner_loop") in str(err)
    assert "iteration 2 reads" in str(err) and "iteration 1 wrote" in str(err)

    err = caught(outer_carried, f32(rng, 256, 16))
    assert err.line == line_of("outer_read")
    assert "nl.affine_range loop at " + at("outer_loop") in str(err)
    assert "iteration 1 reads" in str(err) and "iteration 0 wrote" in str(err) and at("outer_write") in str(err)


@nki.jit(sanitize=True)
def partial_sum_read(x):
    """acc += tile is a legal accumulation, but reading acc inside the loop sees a partial sum."""
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((128, x.shape[1]), nl.float32, buffer=nl.sbuf)
    for i in nl.affine_range(x.shape[0] // 128):  # E:partial_loop
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        acc += t  # E:partial_acc
        nl.store(out[i * 128:(i + 1) * 128, :], acc)  # E:partial_read
    return out


def test_reading_an_accumulator_inside_the_loop_is_caught(rng, line_of, at):
    err = caught(partial_sum_read, f32(rng, 256, 8))
    assert err.line == line_of("partial_read")
    assert_mentions(err, "nl.affine_range loop at " + at("partial_loop"), "'acc'", "partial accumulation",
                    "iteration 0", at("partial_acc"))


# --- what NKI allows ----------------------------------------------------------------------------

@nki.jit(sanitize=True)
def psum_accumulation_legacy(lhsT, rhs):
    K, M = lhsT.shape
    result = nl.ndarray((M, rhs.shape[1]), nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((M, rhs.shape[1]), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(K // 128):
        a = nl.load(lhsT[k * 128:(k + 1) * 128, :])
        b = nl.load(rhs[k * 128:(k + 1) * 128, :])
        acc += nl.matmul(a, b, transpose_x=True)
    nl.store(result, nl.copy(acc))
    return result


@nki.jit(sanitize=True)
def psum_accumulation_current(lhsT, rhs):
    K, M = lhsT.shape
    result = nl.ndarray((M, rhs.shape[1]), nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((M, rhs.shape[1]), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(K // 128):
        a = nl.ndarray((128, M), lhsT.dtype, buffer=nl.sbuf)
        b = nl.ndarray((128, rhs.shape[1]), rhs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=lhsT[k * 128:(k + 1) * 128, :])
        nisa.dma_copy(dst=b, src=rhs[k * 128:(k + 1) * 128, :])
        nisa.nc_matmul(dst=acc, stationary=a, moving=b)
    res = nl.ndarray((M, rhs.shape[1]), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=result, src=res)
    return result


@pytest.mark.parametrize("kernel", [psum_accumulation_legacy, psum_accumulation_current])
def test_psum_accumulation_across_iterations_is_allowed(kernel, rng):
    lhsT, rhs = f32(rng, 512, 64), f32(rng, 512, 96)
    got = kernel(lhsT, rhs)
    # fp32 products accumulated over K=512: a few ulps of the row norms' product
    np.testing.assert_allclose(got, lhsT.astype(np.float64).T @ rhs, rtol=1e-4, atol=1e-4)
    assert all(p.executor == "sanitizer" for p in kernel.specialize(lhsT, rhs).programs)


@nki.jit(sanitize=True)
def sbuf_accumulations(x):
    """+= on an SBUF tile, a max-reduction in place, the functional form acc = acc + t, and a
    multiply-accumulate acc = t * 2 + acc."""
    total = nl.zeros((128, x.shape[1]), nl.float32, buffer=nl.sbuf)
    peak = nl.full((128, x.shape[1]), -np.inf, nl.float32, buffer=nl.sbuf)
    renamed = nl.zeros((128, x.shape[1]), nl.float32, buffer=nl.sbuf)
    fma = nl.zeros((128, x.shape[1]), nl.float32, buffer=nl.sbuf)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        total += t
        nisa.tensor_tensor(dst=peak, data1=peak, data2=t, op=nl.maximum)
        renamed = nl.add(renamed, t)
        nisa.scalar_tensor_tensor(dst=fma, data=t, op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=fma)
    out = nl.ndarray((4, 128, x.shape[1]), nl.float32, buffer=nl.shared_hbm)
    nl.store(out[0], total)
    nl.store(out[1], peak)
    nl.store(out[2], renamed)
    nl.store(out[3], fma)
    return out


def test_sbuf_accumulations_across_iterations_are_allowed(rng):
    x = f32(rng, 512, 16)
    blocks = x.reshape(4, 128, 16)
    got = sbuf_accumulations(x)
    total = np.zeros((128, 16), np.float32)
    for b in blocks:  # the loop's order of fp32 additions
        total = total + b
    np.testing.assert_array_equal(got[0], total)
    np.testing.assert_array_equal(got[1], blocks.max(axis=0))
    np.testing.assert_array_equal(got[2], total)
    np.testing.assert_array_equal(got[3], total * 2)  # doubling is exact, so the sums round alike


@nki.jit(sanitize=True)
def disjoint_parts(x):
    """Iterations write disjoint parts: SBUF column blocks, HBM row blocks, and interleaved HBM
    columns (whose bounding boxes overlap, but whose elements do not)."""
    rows = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    interleaved = nl.ndarray((128, 4 * 8), x.dtype, buffer=nl.shared_hbm)
    wide = nl.ndarray((128, 4 * 8), x.dtype, buffer=nl.sbuf)
    for i in nl.affine_range(4):
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        nl.store(rows[i * 128:(i + 1) * 128, :], t)
        nisa.tensor_copy(dst=wide[:, i * 8:(i + 1) * 8], src=t[:, 0:8])
        nisa.dma_copy(dst=interleaved[:, i::4], src=t[:, 0:8])
    both = nl.ndarray((2, 128, 4 * 8), x.dtype, buffer=nl.shared_hbm)
    nl.store(both[0], wide)
    nl.store(both[1], nl.load(interleaved))
    return rows, both


def test_iterations_writing_disjoint_parts_are_allowed(rng):
    x = f32(rng, 512, 8)
    rows, both = disjoint_parts(x)
    blocks = x.reshape(4, 128, 8)
    np.testing.assert_array_equal(rows, x)
    np.testing.assert_array_equal(both[0], np.concatenate(list(blocks), axis=1))
    np.testing.assert_array_equal(both[1], np.stack(list(blocks), axis=2).reshape(128, 32))


@pytest.mark.parametrize("iterator", [nl.sequential_range, nl.static_range, range])
def test_other_loops_may_carry_dependencies(iterator, rng):
    @nki.jit(sanitize=True)
    def prefix(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        acc = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=acc, src=x)
        for i in iterator(1, 4):
            nisa.tensor_tensor(dst=acc[:, i:i + 1], data1=acc[:, i:i + 1], data2=acc[:, i - 1:i], op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    x = f32(rng, 128, 4)
    np.testing.assert_array_equal(prefix(x), np.cumsum(x, axis=1, dtype=np.float32))


def test_break_closes_the_loop(rng):
    """Instructions after a loop left with `break` belong to no iteration (were they counted in
    the iteration that broke off, they would read iteration 0's tile: a dependency)."""
    @nki.jit(sanitize=True)
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        for i in nl.affine_range(4):
            if i == 1:
                break
            t2 = nl.multiply(t, 2.0)
        nl.store(out, t2)  # outside the loop: reads the loop's tile, writes out once
        nl.store(out, nl.add(t2, 1.0))
        return out

    x = f32(rng, 128, 4)
    np.testing.assert_array_equal(k(x), x * 2 + 1)


# --- reads of uninitialized memory --------------------------------------------------------------

def test_read_of_a_tile_never_written_is_caught(rng, line_of, at):
    @nki.jit(sanitize=True)
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)  # E:uninit_alloc
        u = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[:, 0:32], src=x[:, 0:32])
        nisa.tensor_scalar(dst=u, data=t, op0=nl.add, operand0=1.0)  # E:uninit_read
        nisa.dma_copy(dst=out, src=u)  # E:uninit_store
        return out

    err = caught(k, f32(rng, 128, 48))
    assert err.line == line_of("uninit_read")
    assert_mentions(err, "tensor_scalar reads uninitialized memory", "t[0, 32] was never written",
                    f"{128 * 16} of the {128 * 48} elements read here", "'t' was allocated at " + at("uninit_alloc"),
                    "values computed from it reach output 'out' (out[0, 32]) through dma_copy at " + at("uninit_store"),
                    "nl.zeros or nisa.memset")


def _rows_by_index(table, idx, skip_scatter):
    """Gathers table rows by idx into an unwritten tile (oob_mode=skip leaves the rows of bad
    indices alone), or scatters x's rows to out rows idx (bad indices skipped)."""
    rows = idx.shape[0]
    index = nl.ndarray(idx.shape, idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=index, src=idx)
    if skip_scatter:
        out = nl.ndarray(table.shape, table.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=table)
        moved = nl.ndarray((rows, table.shape[1]), table.dtype, buffer=nl.sbuf)
        nisa.memset(dst=moved, value=7.0)
        nisa.dma_copy(dst=out.ap([[table.shape[1], rows], [1, table.shape[1]]], vector_offset=index), src=moved,
                      oob_mode=nisa.oob_mode.skip)
        return out
    out = nl.ndarray((rows, table.shape[1]), table.dtype, buffer=nl.shared_hbm)
    tile = nl.ndarray((rows, table.shape[1]), table.dtype, buffer=nl.sbuf)  # E:skip_alloc
    nisa.dma_copy(dst=tile, src=table.ap([[table.shape[1], rows], [1, table.shape[1]]], vector_offset=index),
                  oob_mode=nisa.oob_mode.skip)
    nisa.dma_copy(dst=out, src=tile)  # E:skip_store
    return out


def test_dma_scatter_with_skipped_indices_runs_sanitized_unchanged(rng):
    """Elements oob_mode=skip does not transfer have no address: the shadow passes them by (they
    once corrupted the sanitizer's memory)."""
    table = f32(rng, 10, 4)
    idx = np.array([[2], [-1], [9], [10], [0]], np.int32)
    plain = nki.jit(_rows_by_index)(table, idx, True)
    expected = table.copy()
    expected[[2, 9, 0]] = 7.0
    np.testing.assert_array_equal(plain, expected)
    np.testing.assert_array_equal(nki.jit(_rows_by_index, sanitize=True)(table, idx, True), plain)


def test_rows_a_skipped_gather_leaves_unwritten_are_caught(rng, line_of, at):
    """A skipped element leaves its destination as it was: never written, here."""
    err = caught(nki.jit(_rows_by_index, sanitize=True), f32(rng, 10, 4), np.array([[2], [12], [0]], np.int32), False)
    assert err.line == line_of("skip_store")
    assert_mentions(err, "dma_copy reads uninitialized memory", "tile[1, 0] was never written",
                    "'tile' was allocated at " + at("skip_alloc"))


def test_read_of_an_output_before_writing_it_is_caught(rng, line_of, at):
    @nki.jit(sanitize=True)
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)  # E:out_alloc
        nisa.dma_copy(dst=out[0:64, :], src=x[0:64, :])
        t = nl.load(out)  # E:out_read
        nl.store(out, nl.add(t, 1.0))
        return out

    err = caught(k, f32(rng, 128, 4))
    assert err.line == line_of("out_read")
    assert "out[64, 0] was never written" in str(err) and "'out' was allocated at " + at("out_alloc") in str(err)
    assert "reach output 'out' (out[64, 0])" in str(err)


def test_read_of_hbm_scratch_before_writing_it_is_caught(rng, line_of, at):
    @nki.jit(sanitize=True)
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        scratch = nl.ndarray(x.shape, x.dtype, buffer=nl.private_hbm)  # E:scratch_alloc
        nisa.dma_copy(dst=out, src=scratch)  # E:scratch_read
        return out

    err = caught(k, f32(rng, 128, 4))
    assert err.line == line_of("scratch_read")
    assert "scratch[0, 0] was never written" in str(err) and at("scratch_alloc") in str(err)


def test_explicit_psum_accumulation_into_a_fresh_tile_is_caught(rng, line_of, at):
    @nki.jit(sanitize=True)
    def k(a, b):
        out = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.psum)  # E:psum_alloc
        ta, tb = nl.load(a), nl.load(b)
        nisa.nc_matmul(dst=acc, stationary=ta, moving=tb, accumulate=True)  # E:psum_read
        nl.store(out, nl.copy(acc))
        return out

    err = caught(k, f32(rng, 128, 8), f32(rng, 128, 16))
    assert err.line == line_of("psum_read")
    assert "nc_matmul reads uninitialized memory: acc[0, 0]" in str(err) and at("psum_alloc") in str(err)


def test_read_in_a_runtime_loop_is_caught_in_the_iteration_that_does_it(rng, line_of, at):
    """The check is dynamic: columns 0-4 are written, the device loop reads column i at run time."""
    @nki.jit(sanitize=True)
    def k(x):
        t = nl.ndarray((1, 8), nl.float32, buffer=nl.sbuf)  # E:loop_alloc
        acc = nl.zeros((1, 1), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[:, 0:5], src=x[:, 0:5])

        def body(i):
            col = t.ap([[8, 1], [1, 1]], scalar_offset=i, indirect_dim=1)
            nisa.tensor_tensor(dst=acc, data1=acc, data2=col, op=nl.add)  # E:loop_read

        nl.fori_loop(0, x.shape[1], body)
        out = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=acc)
        return out

    x = f32(rng, 1, 8)
    err = caught(k, x)
    assert err.line == line_of("loop_read")
    assert "t[0, 5] was never written (1 of the 1 elements read here" in str(err) and at("loop_alloc") in str(err)
    # five iterations read written columns: the same loop bounded at 5 runs clean
    np.testing.assert_array_equal(k(x[:, 0:5])[0, 0], np.float32(((x[0, 0] + x[0, 1]) + x[0, 2] + x[0, 3]) + x[0, 4]))


def test_register_or_offset_from_uninitialized_memory_is_caught_at_once(rng, line_of, at):
    @nki.jit(sanitize=True)
    def to_register(x):
        count = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)  # E:reg_alloc
        r = nisa.register_alloc()
        nisa.register_load(r, count)  # E:reg_load
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    err = caught(to_register, f32(rng, 1, 4))
    assert err.line == line_of("reg_load")
    assert "count[0, 0] was never written" in str(err) and at("reg_alloc") in str(err)
    assert "is loaded into a register by register_load at " + at("reg_load") in str(err)

    @nki.jit(sanitize=True)
    def to_offset(x):
        rows = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)  # E:idx_alloc
        nisa.iota(rows[0:2, :], [[0, 1]], offset=1)
        out = nl.ndarray((4, x.shape[1]), x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((4, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x.ap([[x.shape[1], 4], [1, x.shape[1]]], vector_offset=rows))  # E:idx_use
        nisa.dma_copy(dst=out, src=t)
        return out

    err = caught(to_offset, f32(rng, 8, 4))
    assert err.line == line_of("idx_use")
    assert "rows[2, 0] was never written" in str(err) and "is used as a runtime offset" in str(err)


def test_garbage_computed_and_discarded_is_not_an_error(rng):
    """A legacy tail tile: mask= loads 72 of 128 partitions, the math runs on all 128, a masked
    store keeps the 72. And an output row first stored from garbage, then overwritten."""
    @nki.jit(sanitize=True)
    def tail(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(x.shape[1])[None, :]
        live = i_p < x.shape[0]
        t = nl.load(x[i_p, i_f], mask=live)
        y = nl.exp(nl.subtract(t, nl.max(t, axis=[1], keepdims=True)))
        nl.store(out[i_p, i_f], value=y, mask=live)
        return out

    x = f32(rng, 72, 16)
    np.testing.assert_allclose(tail(x), np.exp(x - x.max(axis=1, keepdims=True)), rtol=1e-6)

    @nki.jit(sanitize=True)
    def overwritten(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        garbage = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=out, src=garbage)
        nisa.dma_copy(dst=out, src=x)
        return out

    np.testing.assert_array_equal(overwritten(x), x)


def test_predicated_copy_initializes_only_the_selected_elements(rng, line_of):
    @nki.jit(sanitize=True)
    def k(x, mask):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)  # E:pred_alloc
        nisa.tensor_copy_predicated(dst=t, src=nl.load(x), predicate=nl.load(mask))
        nl.store(out, nl.copy(t))  # E:pred_read
        return out

    x = f32(rng, 128, 4)
    np.testing.assert_array_equal(k(x, np.ones((128, 4), np.uint8)), x)
    mask = np.ones((128, 4), np.uint8)
    mask[3, 2] = 0
    err = caught(k, x, mask)
    assert err.line == line_of("pred_read") and "t[3, 2] was never written (1 of the 512" in str(err)


# --- correct kernels pass clean -----------------------------------------------------------------

def _run_sanitized_pytest(*targets, keyword=None) -> str:
    """Runs pytest on `targets` with every kernel sanitized (the plugin checks each launch ran on
    the sanitizer); returns its output after asserting it passed."""
    env = dict(os.environ, NIKKI_SANITIZE="1", PYTHONPATH=os.pathsep.join(
        [HERE, os.path.join(HERE, "..", "..", "bindings", "python"), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "sanitized_launches", *targets]
    if keyword:
        command += ["-k", keyword]
    run = subprocess.run(command, cwd=HERE, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "sanitized launches: 0" not in run.stdout and "sanitized launches:" in run.stdout, run.stdout[-2000:]
    return run.stdout


def test_tutorial_kernels_pass_clean():
    _run_sanitized_pytest("tutorials")


def _outcome(kernel, args, call):
    """A kernel call's outputs as raw bytes (NaN payloads included), or the error it raised."""
    try:
        result = kernel(*args, **call)
    except nki.KernelError as err:
        return ("error", err.summary)
    return [np.asarray(r).tobytes() for r in (result if isinstance(result, tuple) else (result,))]


def test_library_kernels_pass_clean_with_unchanged_results(monkeypatch):
    """Every library kernel (forward and backward) on its smallest registry example, with the
    inputs its registration makes (valid block tables, lengths, indices): the sanitized call has
    the unsanitized one's outcome, the same outputs bit for bit."""
    from nikki import _core
    from nikki.dtypes import numpy_dtype, to_dtype

    for name, kernel in sorted(library_kernels().items()):
        examples = kernel.info["examples"]
        index = min(range(len(examples)), key=lambda i: sum(np.prod(s) for s, _d in examples[i][0]))
        inputs, params, _label = examples[index]
        case = _core.library_case(name, "example", index)
        args = [v.astype(numpy_dtype(to_dtype(d))) for v, (_s, d) in zip(case["values"], inputs)]
        kinds = {p[0]: p[1] for p in kernel.info["params"]}
        call = {k: (bool(v) if kinds[k] == "bool" else None if kinds[k] == "float?" and np.isnan(v) else v)
                for k, v in params.items()}
        monkeypatch.setenv("NIKKI_SANITIZE", "0")
        plain = _outcome(kernel, args, call)
        monkeypatch.setenv("NIKKI_SANITIZE", "1")
        assert _outcome(kernel, args, call) == plain, name
        if plain[0] != "error":
            assert {p.executor for p in kernel.specialize(*args, **call).programs} == {"sanitizer"}, name


def test_movement_and_selection_instructions_run_sanitized_unchanged():
    """Every instruction has a propagation rule: the movement and selection instructions' own
    tests (nc_n_gather, nc_match_replace8, range_select, nc_stream_shuffle, nonzero_with_count,
    dma_compute, ...) pass with NIKKI_SANITIZE=1, their results unchanged."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, NIKKI_SANITIZE="1",
               PYTHONPATH=os.path.join(here, "..", "..", "bindings", "python"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join(here, "test_api_isa_movement_and_selection.py")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout


def test_gather_from_a_partly_written_tile_is_caught(rng, line_of, at):
    @nki.jit(sanitize=True)
    def k(x, idx):
        out = nl.ndarray(idx.shape, x.dtype, buffer=nl.shared_hbm)
        data = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)  # E:gather_alloc
        i = nl.ndarray(idx.shape, idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=data[:, 0:8], src=x[:, 0:8])
        nisa.dma_copy(dst=i, src=idx)
        g = nl.ndarray(idx.shape, x.dtype, buffer=nl.sbuf)
        nisa.nc_n_gather(dst=g, data=data, indices=i)  # E:gather_read
        nisa.dma_copy(dst=out, src=g)
        return out

    # only written columns are gathered, but the instruction reads the whole data tile
    idx = rng.integers(0, 8, (128, 4)).astype(np.uint32)
    err = caught(k, f32(rng, 128, 16), idx)
    assert err.line == line_of("gather_read")
    assert "nc_n_gather reads uninitialized memory" in str(err) and at("gather_alloc") in str(err)


def test_local_gather_reads_only_the_valid_indices_and_whole_rows(rng, line_of, at):
    @nki.jit(sanitize=True)
    def k(x, idx, write_all_of_x):
        out = nl.ndarray((32, 20), x.dtype, buffer=nl.shared_hbm)
        data = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)  # E:local_gather_alloc
        i = nl.ndarray((32, 4), idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=data[:, 0:8], src=x[:, 0:8])
        if write_all_of_x:
            nisa.dma_copy(dst=data[:, 8:16], src=x[:, 8:16])
        nisa.dma_copy(dst=i[:, 0:2], src=idx)  # indices 0..31 of each core; 20 of them are used
        g = nl.ndarray((32, 20), x.dtype, buffer=nl.sbuf)
        nisa.local_gather(dst=g, src_buffer=data, index=i, num_valid_indices=20)  # E:local_gather_read
        nisa.dma_copy(dst=out, src=g)
        return out

    idx = rng.integers(0, 8, (32, 2)).astype(np.uint16)
    x = f32(rng, 32, 16)
    got = k(x, idx, True)
    for core in range(2):
        starts = idx[16 * core:16 * core + 16].flatten(order="F")[:20]
        np.testing.assert_array_equal(got[16 * core:16 * core + 16], x[16 * core:16 * core + 16][:, starts])
    err = caught(k, x, idx, False)  # the gathered columns were written, but the instruction reads whole rows
    assert err.line == line_of("local_gather_read")
    assert "local_gather reads uninitialized memory" in str(err) and at("local_gather_alloc") in str(err)
