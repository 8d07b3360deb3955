"""The data-movement and selection instructions of NKI 0.2+ against numpy: dma_transpose,
dma_compute (and Beta 1's dma_copy(dst_rmw_op=)), dma_copy(oob_mode=skip), nc_stream_shuffle,
nc_match_replace8, range_select, nc_n_gather / nl.gather_flattened, local_gather, nonzero_with_count,
and nc_matmul(perf_mode=double_row).

Tolerances: the movement, selection and gather instructions copy bits, so they are compared
exactly; dma_compute adds in fp32 (one rounding per add, as numpy's float32 adds in the same
order); double_row accumulates fp8 products in fp32, compared with float64 within fp32 round-off
of 256 terms (rtol 1e-5).
"""

import ml_dtypes
import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl


def load(x, dtype=None):
    t = nl.ndarray(x.shape, dtype or x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def store(t):
    out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    if t.buffer == nl.psum:
        staged = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(staged, t)
        t = staged
    nisa.dma_copy(dst=out, src=t)
    return out


# --- dma_transpose ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape, axes", [((64, 48), None), ((4, 8, 16), None), ((2, 3, 4, 5), None),
                                         ((2, 3, 4, 5), (0, 2, 1, 3))])
def test_dma_transpose_permutes_like_numpy(rng, shape, axes):
    default = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}[len(shape)]

    @nki.jit
    def kernel(a):
        out = nl.ndarray(tuple(shape[i] for i in (axes or default)), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_transpose(out, a, axes=axes)
        return out

    a = rng.standard_normal(shape, dtype=np.float32)
    np.testing.assert_array_equal(kernel(a), np.transpose(a, axes or default))


def test_dma_transpose_legacy_returns_a_tile(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray((64, 32), a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nisa.dma_transpose(a))
        return out

    a = rng.standard_normal((32, 64), dtype=np.float32)
    np.testing.assert_array_equal(kernel(a), a.T)


def test_dma_transpose_shape_mismatch_is_located():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((32, 64), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_transpose(out, a)  # wrong: needs (64, 32)
        return out

    with pytest.raises(nki.KernelError, match=r"dma_transpose: dst has shape \(32, 64\).*\(64, 32\)") as info:
        kernel(np.zeros((32, 64), np.float32))
    assert info.value.line > 0 and "transposed shape" in info.value.limit


# --- dma_compute and read-modify-write copies --------------------------------------------------

def test_dma_compute_adds_sources_in_fp32(rng):
    @nki.jit
    def kernel(a, b, c):
        out = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_compute(out, [a, b, c], reduce_op=nl.add, scales=(1.0, 1.0, 1.0))
        return out

    a, b, c = (rng.standard_normal((8, 300), dtype=np.float32) for _ in range(3))
    expected = ((a + b) + c).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(kernel(a, b, c), expected)


def test_dma_compute_scatter_add_accumulates_repeated_rows(rng):
    # dst(HBM)[idx[p]] += src[p]: rows named twice get both contributions, in partition order
    @nki.jit
    def kernel(table, rows, idx):
        out = nl.ndarray(table.shape, table.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(out, table)
        index = load(idx)
        src = load(rows)
        scattered = out.ap([[table.shape[1], rows.shape[0]], [1, table.shape[1]]], vector_offset=index)
        nisa.dma_compute(scattered, [scattered, src], reduce_op=nl.add)
        return out

    table = rng.standard_normal((16, 8), dtype=np.float32)
    rows = rng.standard_normal((6, 8), dtype=np.float32)
    idx = np.array([[3], [7], [3], [0], [15], [7]], np.int32)
    expected = table.copy()
    for p, r in enumerate(idx[:, 0]):
        expected[r] = expected[r] + rows[p]
    np.testing.assert_array_equal(kernel(table, rows, idx), expected)


def test_legacy_dma_copy_dst_rmw_op_adds_into_dst(rng):
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        nisa.dma_copy(dst=out, src=nl.load(b), dst_rmw_op=np.add)
        return out

    a, b = (rng.standard_normal((16, 32), dtype=np.float32) for _ in range(2))
    np.testing.assert_array_equal(kernel(a, b), a + b)


def test_dma_compute_rejects_other_operators_and_scales():
    @nki.jit
    def maximum(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_compute(out, [a, a], reduce_op=nl.maximum)
        return out

    @nki.jit
    def scaled(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_compute(out, [a, a], reduce_op=nl.add, scales=[2.0, 1.0])
        return out

    a = np.zeros((4, 4), np.float32)
    with pytest.raises(nki.KernelError, match="reduce_op=maximum is not supported") as info:
        maximum(a)
    assert "nl.add only" in info.value.limit
    with pytest.raises(NotImplementedError, match=r"dma_compute\(scales=\[2.0, 1.0\]\)"):
        scaled(a)


# --- dma_copy(oob_mode=skip) -------------------------------------------------------------------

def test_dma_gather_with_oob_skip_leaves_rows_of_bad_indices(rng):
    @nki.jit
    def kernel(table, idx):
        tile = nl.ndarray((idx.shape[0], table.shape[1]), table.dtype, buffer=nl.sbuf)
        nisa.memset(tile, 0.0)
        index = load(idx)
        gathered = table.ap([[table.shape[1], idx.shape[0]], [1, table.shape[1]]], vector_offset=index)
        nisa.dma_copy(tile, gathered, oob_mode=nisa.oob_mode.skip)
        return store(tile)

    table = rng.standard_normal((10, 4), dtype=np.float32)
    idx = np.array([[2], [10], [9], [-1], [0]], np.int32)
    expected = np.zeros((5, 4), np.float32)
    for p, r in enumerate(idx[:, 0]):
        if 0 <= r < 10:
            expected[p] = table[r]
    np.testing.assert_array_equal(kernel(table, idx), expected)


def test_dma_gather_out_of_bounds_without_skip_is_a_runtime_error():
    @nki.jit
    def kernel(table, idx):
        tile = nl.ndarray((idx.shape[0], table.shape[1]), table.dtype, buffer=nl.sbuf)
        index = load(idx)
        nisa.dma_copy(tile, table.ap([[table.shape[1], idx.shape[0]], [1, table.shape[1]]], vector_offset=index))
        return store(tile)

    with pytest.raises(nki.KernelError, match="runtime offset out of bounds"):
        kernel(np.zeros((10, 4), np.float32), np.array([[1], [12]], np.int32))


# --- nc_stream_shuffle -------------------------------------------------------------------------

def test_nc_stream_shuffle_permutes_each_quadrant(rng):
    mask = [(i * 5 + 3) % 32 for i in range(32)]
    mask[4] = 255  # keeps dst

    @nki.jit
    def kernel(a):
        src = load(a)
        dst = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.memset(dst, -1.0)
        nisa.nc_stream_shuffle(dst=dst, src=src, shuffle_mask=mask)
        return store(dst)

    a = rng.standard_normal((64, 12), dtype=np.float32)
    expected = np.full_like(a, -1.0)
    for p in range(64):
        if mask[p % 32] != 255:
            expected[p] = a[(p // 32) * 32 + mask[p % 32]]
    np.testing.assert_array_equal(kernel(a), expected)


def test_nc_stream_shuffle_in_place_and_broadcast_of_one_row(rng):
    @nki.jit
    def kernel(a):
        t = load(a)
        nisa.nc_stream_shuffle(dst=t, src=t, shuffle_mask=list(range(31, -1, -1)))  # reverse in place
        row = nl.ndarray((32, a.shape[1]), a.dtype, buffer=nl.sbuf)
        nisa.nc_stream_shuffle(dst=row, src=t[0:1, :], shuffle_mask=[0] * 32)  # broadcast partition 0
        return store(t), store(row)

    a = rng.standard_normal((32, 8), dtype=np.float32)
    reversed_rows, broadcast = kernel(a)
    np.testing.assert_array_equal(reversed_rows, a[::-1])
    np.testing.assert_array_equal(broadcast, np.broadcast_to(a[31], (32, 8)))


def test_nc_stream_shuffle_mask_errors():
    @nki.jit
    def short_mask(a):
        t = load(a)
        nisa.nc_stream_shuffle(dst=t, src=t, shuffle_mask=[0, 1])
        return store(t)

    @nki.jit
    def lane_out_of_quadrant(a):
        t = load(a)
        nisa.nc_stream_shuffle(dst=t, src=t, shuffle_mask=[40] + [0] * 31)
        return store(t)

    a = np.zeros((32, 4), np.float32)
    with pytest.raises(nki.KernelError, match="shuffle_mask has 2 entries"):
        short_mask(a)
    with pytest.raises(nki.KernelError, match=r"shuffle_mask\[0\] is 40") as info:
        lane_out_of_quadrant(a)
    assert "dma_copy" in info.value.hint


# --- nc_match_replace8 -------------------------------------------------------------------------

def test_nc_match_replace8_after_max8_finds_and_masks_the_top8(rng):
    @nki.jit
    def kernel(a):
        data = load(a)
        top = nl.ndarray((a.shape[0], 8), a.dtype, buffer=nl.sbuf)
        nisa.max8(dst=top, src=data)
        idx = nl.ndarray((a.shape[0], 8), nl.uint32, buffer=nl.sbuf)
        replaced = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=replaced, data=data, vals=top, imm=float("-inf"), dst_idx=idx)
        return store(top), store(idx), store(replaced)

    a = rng.permutation(np.arange(4 * 64, dtype=np.float32)).reshape(4, 64)
    top, idx, replaced = kernel(a)
    order = np.argsort(-a, axis=1, kind="stable")[:, :8]
    np.testing.assert_array_equal(top, np.take_along_axis(a, order, axis=1))
    np.testing.assert_array_equal(idx, order.astype(np.uint32))
    expected = a.copy()
    np.put_along_axis(expected, order, -np.inf, axis=1)
    np.testing.assert_array_equal(replaced, expected)


def test_nc_match_replace8_duplicates_pair_from_the_last_value():
    # vals repeat 8: the first matching position goes to the highest duplicate slot
    data = np.array([[1, 2, 3, 4] + [8] * 7 + [0] * 5], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)

    @nki.jit
    def kernel(d, v):
        idx = nl.ndarray((1, 8), nl.uint32, buffer=nl.sbuf)
        out = nl.ndarray(d.shape, d.dtype, buffer=nl.sbuf)
        nisa.nc_match_replace8(out, load(d), load(v), 0.0, dst_idx=idx)
        return store(idx)

    np.testing.assert_array_equal(kernel(data, vals), [[2, 10, 9, 8, 7, 6, 5, 4]])


# --- range_select ------------------------------------------------------------------------------

def test_range_select_keeps_a_window_per_partition_and_reduces_max(rng):
    fp32_min = np.finfo(np.float32).min

    @nki.jit
    def kernel(a, lo, hi):
        res = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.range_select(dst=out, on_true_tile=load(a), comp_op0=nl.greater_equal, comp_op1=nl.less,
                          bound0=load(lo), bound1=load(hi), reduce_op=nl.maximum, reduce_res=res,
                          reduce_cmd=nisa.reduce_cmd.reset_reduce, range_start=100, on_false_value=fp32_min)
        return store(out), store(res)

    a = rng.standard_normal((8, 40), dtype=np.float32)
    lo = rng.integers(100, 120, (8, 1)).astype(np.float32)
    hi = lo + rng.integers(1, 20, (8, 1)).astype(np.float32)
    out, res = kernel(a, lo, hi)
    position = np.arange(40)[None, :] + 100
    keep = (position >= lo) & (position < hi)
    expected = np.where(keep, a, fp32_min)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(res, expected.max(axis=1, keepdims=True))


def test_range_select_needs_neuroncore_v3():
    @nki.jit(target="trn1")
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.range_select(dst=out, on_true_tile=load(a), comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=0.0,
                          bound1=4.0)
        return store(out)

    with pytest.raises(nki.KernelError, match="range_select needs NeuronCore-v3; trn1"):
        kernel(np.zeros((4, 8), np.float32))


# --- gathers and nonzero_with_count ------------------------------------------------------------

def test_nc_n_gather_and_gather_flattened_take_along_each_partition(rng):
    @nki.jit
    def kernel(data, indices):
        d, i = load(data), load(indices)
        direct = nl.ndarray(indices.shape, data.dtype, buffer=nl.sbuf)
        nisa.nc_n_gather(dst=direct, data=d, indices=i)
        return store(direct), store(nl.gather_flattened(d, i, dtype=nl.bfloat16))

    data = rng.standard_normal((16, 4, 10), dtype=np.float32)
    indices = rng.integers(0, 40, (16, 25)).astype(np.uint32)
    direct, cast = kernel(data, indices)
    expected = np.take_along_axis(data.reshape(16, 40), indices.astype(np.int64), axis=1)
    np.testing.assert_array_equal(direct, expected)
    np.testing.assert_array_equal(cast, expected.astype(ml_dtypes.bfloat16))


def local_gather_reference(src, index, per_index, valid):
    """NKI's documented semantics, written out: each GpSimd core's 16 partitions share the core's
    indices (flattened partition-major) and take runs of `per_index` elements from their own rows."""
    rows = src.reshape(src.shape[0], -1)
    out = np.empty((src.shape[0], valid, per_index), src.dtype)
    for core in range(src.shape[0] // 16):
        part = slice(16 * core, 16 * core + 16)
        starts = index[part].reshape(16, -1).flatten(order="F")[:valid].astype(np.int64)
        for j, start in enumerate(starts):
            out[part, j] = rows[part, start:start + per_index]
    return out


@pytest.mark.parametrize("partitions, index_cols, per_index, valid, dtype", [
    (128, 4, 4, 64, np.float32),             # NKI's documented example
    (32, 3, 1, None, np.float32),            # every index of the core's slice (48)
    (16, 16, 2, 37, ml_dtypes.bfloat16),     # a count that is not a multiple of 16
    (64, 2, 32, 5, np.int32),
])
def test_local_gather_takes_runs_from_each_partition_by_its_cores_indices(rng, partitions, index_cols, per_index,
                                                                           valid, dtype):
    row = 96

    @nki.jit
    def kernel(src, index):
        n = valid if valid is not None else index.shape[1] * 16
        dst = nl.ndarray((src.shape[0], n * per_index), src.dtype, buffer=nl.sbuf)
        nisa.local_gather(dst=dst, src_buffer=load(src), index=load(index), num_elem_per_idx=per_index,
                          num_valid_indices=valid)
        legacy = nisa.local_gather(load(src), load(index), per_index, valid)
        return store(dst), store(legacy)

    src = (rng.standard_normal((partitions, row // 4, 4)) * 100).astype(dtype)
    index = rng.integers(0, row - per_index + 1, (partitions, index_cols)).astype(np.uint16)  # cores differ
    got, legacy = kernel(src, index)
    expected = local_gather_reference(src, index, per_index, valid or index_cols * 16)
    np.testing.assert_array_equal(got.reshape(expected.shape), expected)
    assert legacy.shape == expected.shape
    np.testing.assert_array_equal(legacy, expected)


@pytest.mark.parametrize("options, message, field, advice", [
    ({"index_dtype": nl.int32}, "local_gather: index has dtype int32", "limit", "uint16"),
    ({"partitions": 8}, "src_buffer spans 8 partitions", "limit", "multiple of 16"),
    ({"per_index": 3}, "num_elem_per_idx=3", "limit", "1, 2, 4, 8, 16, 32"),
    ({"valid": 33}, "num_valid_indices=33 for 32 indices per GpSimd core", "hint", "num_valid_indices <= 32"),
    ({"dst_elems": 31}, "dst has 31 elements per partition", "hint", "allocate dst with 32 elements"),
])
def test_local_gather_rejects_what_the_gpsimd_cores_cannot_do(options, message, field, advice):
    partitions = options.get("partitions", 32)
    per_index, valid = options.get("per_index", 1), options.get("valid")

    @nki.jit
    def kernel(src):
        index = nl.ndarray((partitions, 2), options.get("index_dtype", nl.uint16), buffer=nl.sbuf)
        nisa.memset(index, 0)
        dst = nl.ndarray((partitions, options.get("dst_elems", (valid or 32) * per_index)), src.dtype,
                         buffer=nl.sbuf)
        nisa.local_gather(dst, load(src), index, num_elem_per_idx=per_index, num_valid_indices=valid)
        return store(dst)

    with pytest.raises(nki.KernelError, match=message) as info:
        kernel(np.zeros((partitions, 40), np.float32))
    assert info.value.line > 0 and advice in getattr(info.value, field)


def test_local_gather_reports_an_index_past_the_row_at_run_time():
    @nki.jit
    def kernel(src, index):
        dst = nl.ndarray((16, 4), src.dtype, buffer=nl.sbuf)
        nisa.local_gather(dst, load(src), load(index), num_elem_per_idx=2, num_valid_indices=2)
        return store(dst)

    index = np.zeros((16, 1), np.uint16)
    index[1, 0] = 9  # elements 9..10 of a 10-element row
    with pytest.raises(nki.KernelError, match=r"index 9 \(partition 1, position 0\) reads elements 9..10 of the 10"):
        kernel(np.zeros((16, 10), np.float32), index)


def test_nonzero_with_count_on_the_first_partition_of_each_gpsimd_core(rng):
    @nki.jit
    def kernel(a):
        dst = nl.ndarray((a.shape[0], a.shape[1] + 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst, 7)
        nisa.nonzero_with_count(dst=dst, src=load(a), index_offset=100, padding_val=-1)
        return store(dst)

    a = (rng.random((32, 20)) < 0.3).astype(np.float32) * rng.standard_normal((32, 20), dtype=np.float32)
    got = kernel(a)
    for p in range(32):
        if p % 16:
            np.testing.assert_array_equal(got[p], 7)  # other partitions untouched
            continue
        nonzero = np.flatnonzero(a[p])
        expected = np.concatenate([nonzero + 100, np.full(20 - nonzero.size, -1), [nonzero.size]])
        np.testing.assert_array_equal(got[p], expected)


# --- nc_matmul(perf_mode=double_row) ------------------------------------------------------------

def test_double_row_matmul_contracts_both_rows(rng):
    fp8 = ml_dtypes.float8_e4m3

    @nki.jit
    def kernel(st, mv):
        out = nl.ndarray((st.shape[2], mv.shape[2]), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(out, load(st), load(mv), perf_mode=nisa.matmul_perf_mode.double_row)
        return store(out)

    st = rng.standard_normal((128, 2, 64)).astype(fp8)
    mv = rng.standard_normal((128, 2, 96)).astype(fp8)
    expected = np.einsum("kjm,kjn->mn", st.astype(np.float64), mv.astype(np.float64))
    np.testing.assert_allclose(kernel(st, mv), expected, rtol=1e-5, atol=1e-5)


def test_double_row_matmul_rules():
    @nki.jit
    def bf16(st, mv):
        out = nl.ndarray((64, 96), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(out, load(st), load(mv), perf_mode=nisa.matmul_perf_mode.double_row)
        return store(out)

    st = np.zeros((128, 2, 64), ml_dtypes.bfloat16)
    mv = np.zeros((128, 2, 96), ml_dtypes.bfloat16)
    with pytest.raises(nki.KernelError, match="the operands are bfloat16 and bfloat16") as info:
        bf16(st, mv)
    assert "fp8" in info.value.limit
    fp8 = ml_dtypes.float8_e4m3
    with pytest.raises(nki.KernelError, match="the target is NeuronCore-v2"):
        bf16.with_target("trn1")(st.astype(fp8), mv.astype(fp8))


