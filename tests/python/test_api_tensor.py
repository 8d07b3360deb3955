"""NkiTensor views against numpy indexing: subscripts (negative, step, Ellipsis, nl.ds), NKI's
integer-indexing rules, view methods (slice/select/reshape/permute/broadcast/expand_dim/
squeeze_dim/reshape_dim/flatten_dims/view(dtype)), raw access patterns (.ap) with compile-time and
runtime offsets, and the pattern/offset/strides values of NKI's documented examples.

Views only move data, so every comparison here is exact (assert_array_equal).
"""

import ml_dtypes
import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl


def to_sbuf(view, dtype=None):
    t = nl.ndarray(view.shape, dtype or view.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=view)
    return t


def to_hbm(t):
    out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def copy_of(view):
    """A dense copy of any view: HBM views go through SBUF, SBUF views are DMA'd out directly (the
    DMA has no start-partition rule, so views may start at any partition)."""
    if view.buffer == nl.shared_hbm or view.buffer == nl.hbm:
        view = to_sbuf(view if view.ndim >= 2 else view.expand_dim(0))
    return to_hbm(view)


def view_kernel(make_view, on_chip=False):
    """A kernel returning a dense copy of make_view(a) (a in HBM, or its SBUF copy)."""
    @nki.jit
    def k(a):
        src = to_sbuf(a) if on_chip else a
        return copy_of(make_view(src))

    return k


@pytest.fixture
def a3(rng):
    return rng.standard_normal((8, 12, 10)).astype(np.float32)


# --- subscripts -------------------------------------------------------------------------------

HBM_SUBSCRIPTS = [
    ("rows", lambda t: t[2:6], lambda x: x[2:6]),
    ("negative", lambda t: t[-3:, -4:-1], lambda x: x[-3:, -4:-1]),
    ("step", lambda t: t[1::2, ::3], lambda x: x[1::2, ::3]),
    ("ellipsis_last", lambda t: t[..., 2:7], lambda x: x[..., 2:7]),
    ("ellipsis_mid", lambda t: t[1:3, ..., 4:6], lambda x: x[1:3, ..., 4:6]),
    ("int_drops_dim", lambda t: t[3], lambda x: x[3]),
    ("int_middle", lambda t: t[:, 5], lambda x: x[:, 5]),
    ("negative_int", lambda t: t[-1, :, -2:], lambda x: x[-1, :, -2:]),
    ("ds", lambda t: t[nl.ds(2, 4), :, nl.ds(0, 5)], lambda x: x[2:6, :, 0:5]),
    ("numpy_int", lambda t: t[np.int64(1)], lambda x: x[1]),
]


@pytest.mark.parametrize("name,view,ref", HBM_SUBSCRIPTS, ids=[c[0] for c in HBM_SUBSCRIPTS])
def test_hbm_subscripts_match_numpy(a3, name, view, ref):
    out = view_kernel(view)(a3)
    expected = ref(a3)
    if expected.ndim == 1:
        expected = expected.reshape(1, -1)  # a 1-D HBM view is copied through a [1, F] tile
    np.testing.assert_array_equal(out.reshape(expected.shape), expected)


def test_integer_indexing_keeps_partition_dim_on_chip():
    shapes = {}

    @nki.jit
    def k(a):
        t = to_sbuf(a)
        shapes.update({
            "t[0]": t[0].shape, "t[0, :, :]": t[0, :, :].shape, "t[:, 1]": t[:, 1].shape,
            "t[:, 1, 2]": t[:, 1, 2].shape, "t[3, 1, 2]": t[3, 1, 2].shape, "t[:, :, 4]": t[:, :, 4].shape,
            "hbm a[0]": a[0].shape, "hbm a[0, 1]": a[0, 1].shape, "hbm a[:, 1]": a[:, 1].shape,
        })
        return copy_of(t[5, 2])

    a = np.arange(8 * 12 * 10, dtype=np.float32).reshape(8, 12, 10)
    out = k(a)
    assert shapes == {
        # SBUF/PSUM: an integer on the partition dim keeps it (size 1); free dims drop while >= 2-D remain
        "t[0]": (1, 12, 10), "t[0, :, :]": (1, 12, 10), "t[:, 1]": (8, 10), "t[:, 1, 2]": (8, 1),
        "t[3, 1, 2]": (1, 1), "t[:, :, 4]": (8, 12),
        # HBM has no partition dim: integers drop dims as in numpy
        "hbm a[0]": (12, 10), "hbm a[0, 1]": (10,), "hbm a[:, 1]": (8, 10),
    }
    np.testing.assert_array_equal(out, a[5:6, 2])


@pytest.mark.parametrize("name,view,ref", [
    ("step", lambda t: t[:, ::2, 1::3], lambda x: x[:, ::2, 1::3]),
    ("negative", lambda t: t[-4:, -1, :], lambda x: x[-4:, -1, :]),
    ("ellipsis", lambda t: t[2:4, ...], lambda x: x[2:4, ...]),
    ("ds", lambda t: t[nl.ds(1, 3), nl.ds(4, 4)], lambda x: x[1:4, 4:8]),
], ids=["step", "negative", "ellipsis", "ds"])
def test_sbuf_subscripts_match_numpy(a3, name, view, ref):
    np.testing.assert_array_equal(view_kernel(view, on_chip=True)(a3), ref(a3))


def test_subscript_assignment_writes_into_view(rng):
    @nki.jit
    def k(a):
        t = nl.zeros((8, 12), nl.float32)
        t[0:3, 1::3] = to_sbuf(a[2:5, 0:4])  # tile assignment: an engine copy into the view
        t[0, :] = 7.0                        # scalar assignment: a memset of the view
        out = nl.ndarray((8, 12), nl.float32, buffer=nl.shared_hbm)
        out[...] = t                         # SBUF -> HBM assignment: a DMA
        return out

    a = rng.standard_normal((8, 12)).astype(np.float32)
    expected = np.zeros((8, 12), np.float32)
    expected[0:3, 1::3] = a[2:5, 0:4]
    expected[0, :] = 7
    np.testing.assert_array_equal(k(a), expected)


# --- view methods -----------------------------------------------------------------------------

VIEW_METHODS = [
    ("slice", lambda t: t.slice(dim=1, start=2, end=10, step=3), lambda x: x[:, 2:10:3]),
    ("select", lambda t: t.select(2, 4), lambda x: x[:, :, 4]),
    ("permute", lambda t: t.permute((0, 2, 1)), lambda x: x.transpose(0, 2, 1)),
    ("reshape", lambda t: t.reshape((8, 120)), lambda x: x.reshape(8, 120)),
    ("reshape_varargs", lambda t: t.reshape(8, 4, 3, 10), lambda x: x.reshape(8, 4, 3, 10)),
    ("reshape_dim", lambda t: t.reshape_dim(1, (3, 4)), lambda x: x.reshape(8, 3, 4, 10)),
    ("flatten_dims", lambda t: t.flatten_dims(1, 2), lambda x: x.reshape(8, 120)),
    ("expand_squeeze", lambda t: t.expand_dim(1).squeeze_dim(1), lambda x: x),
    ("expand_dim", lambda t: t.expand_dim(3), lambda x: x[:, :, :, None]),
    ("broadcast", lambda t: t[:, 0:1, :].broadcast(1, 5), lambda x: np.broadcast_to(x[:, 0:1, :], (8, 5, 10))),
    ("broadcast_to", lambda t: t[:, :, 3:4].broadcast_to((8, 12, 6)),
     lambda x: np.broadcast_to(x[:, :, 3:4], (8, 12, 6))),
]


@pytest.mark.parametrize("on_chip", [False, True], ids=["hbm", "sbuf"])
@pytest.mark.parametrize("name,view,ref", VIEW_METHODS, ids=[c[0] for c in VIEW_METHODS])
def test_view_methods_match_numpy(a3, name, view, ref, on_chip):
    np.testing.assert_array_equal(view_kernel(view, on_chip=on_chip)(a3), ref(a3))


def test_hbm_permute_moves_partition_dim(a3):
    np.testing.assert_array_equal(view_kernel(lambda t: t.permute((2, 0, 1)))(a3), a3.transpose(2, 0, 1))


def test_view_dtype_reinterprets_bits(rng):
    @nki.jit
    def k(a):
        t = to_sbuf(a)
        bits = t.view(nl.int32)  # same bytes as int32
        halves = t.view(nl.bfloat16)  # last dim doubles
        assert bits.shape == a.shape and halves.shape == (a.shape[0], 2 * a.shape[1])
        return copy_of(bits), copy_of(halves), copy_of(t.reinterpret_cast(nl.uint8))

    a = rng.standard_normal((4, 6)).astype(np.float32)
    bits, halves, u8 = k(a)
    np.testing.assert_array_equal(bits, a.view(np.int32))
    np.testing.assert_array_equal(halves, a.view(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(u8, a.view(np.uint8))


def test_nki_language_expand_dims_and_tensor_expand_dims(a3):
    np.testing.assert_array_equal(view_kernel(lambda t: nl.expand_dims(t, 1))(a3), a3[:, None])
    np.testing.assert_array_equal(view_kernel(lambda t: t.expand_dims(2))(a3), a3[:, :, None])


# --- attributes and patterns (NKI's documented examples) --------------------------------------

def test_attributes_and_documented_patterns():
    seen = {}

    @nki.jit
    def k(a):
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        u = t.slice(dim=1, start=8, end=24)
        v = t.ap(pattern=[[64, 128], [1, 16]], offset=8)
        t2 = nl.ndarray((128, 1024), nl.float32, buffer=nl.sbuf)
        w = t2.ap(pattern=[(1024, 128), (2, 512)])  # every other element
        h = a[1:3, ::2]
        seen.update(
            t=(t.shape, t.strides, t.offset, t.get_pattern(), t.ndim, t.size, t.dtype, t.buffer, t.itemsize),
            u=(u.shape, u.get_pattern(), u.offset, u.strides, u.is_contiguous()),
            v=(v.shape, v.get_pattern(), v.offset),
            w=(w.shape, w.get_pattern(), w.offset),
            h=(h.shape, h.strides, h.offset, h.get_pattern(), h.buffer, h.is_contiguous(), h.is_indirect()),
            tc=t.is_contiguous(), name=t2.name, length=len(t2),
        )
        return copy_of(to_sbuf(a))

    k(np.zeros((4, 6), np.float32))
    assert seen["t"] == ((128, 64), (64, 1), 0, [[64, 128], [1, 64]], 2, 128 * 64, nl.float32, nl.sbuf, 4)
    assert seen["u"] == ((128, 16), [[64, 128], [1, 16]], 8, (64, 1), False)
    assert seen["v"] == seen["u"][:1] + seen["u"][1:3]  # identical to the slice
    assert seen["w"] == ((128, 512), [[1024, 128], [2, 512]], 0)
    # a kernel argument lives in shared_hbm, as in NKI
    assert seen["h"] == ((2, 3), (6, 2), 6, [[6, 2], [2, 3]], nl.shared_hbm, False, False)
    assert seen["tc"] is True and seen["name"] == "t2" and seen["length"] == 128


def test_ap_every_other_element_moves_the_right_data(rng):
    @nki.jit
    def k(a):
        t = to_sbuf(a)
        return copy_of(t.ap(pattern=[(a.shape[1], a.shape[0]), (2, a.shape[1] // 2)], offset=1))

    a = rng.standard_normal((16, 32)).astype(np.float32)
    np.testing.assert_array_equal(k(a), a[:, 1::2])


def test_ap_on_hbm_ignores_current_view(rng):
    @nki.jit
    def k(a):
        view = a[4:, 2:]  # .ap() addresses the storage directly, not this view
        return copy_of(view.ap([[a.shape[1], 3], [1, 5]], offset=a.shape[1] + 1))

    a = rng.standard_normal((8, 9)).astype(np.float32)
    np.testing.assert_array_equal(k(a), a[1:4, 1:6])


def test_ap_dtype_reinterprets(rng):
    @nki.jit
    def k(a):
        return copy_of(to_sbuf(a).ap([[a.shape[1], a.shape[0]], [1, a.shape[1]]], dtype=nl.int32))

    a = rng.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(k(a), a.view(np.int32))


# --- runtime offsets --------------------------------------------------------------------------

def test_ap_scalar_offset_from_register(rng):
    @nki.jit
    def k(a):
        r = nisa.register_alloc(3)
        # start = offset + 3 * prod(a.shape[1:]) (the base tensor's shape, indirect_dim=0)
        return copy_of(a.ap([[a.shape[1], 2], [1, a.shape[1]]], offset=1, scalar_offset=r))

    a = rng.standard_normal((8, 5)).astype(np.float32)
    np.testing.assert_array_equal(k(a), a.reshape(-1)[3 * 5 + 1:3 * 5 + 1 + 10].reshape(2, 5))


def test_ap_scalar_offset_from_1x1_tensor_and_indirect_dim(rng):
    @nki.jit
    def k(a, idx):
        i = to_sbuf(idx)  # (1, 1) int32 in SBUF
        rows = copy_of(a.ap([[a.shape[1] * a.shape[2], 1], [1, a.shape[1] * a.shape[2]]], scalar_offset=i))
        # indirect_dim=1: the offset counts in units of prod(shape[2:]) = one row of the last dim
        cols = copy_of(a.ap([[a.shape[2], 1], [1, a.shape[2]]], scalar_offset=i, indirect_dim=1))
        return rows, cols

    a = rng.standard_normal((4, 3, 6)).astype(np.float32)
    rows, cols = k(a, np.array([[2]], np.int32))
    np.testing.assert_array_equal(rows, a[2].reshape(1, -1))
    np.testing.assert_array_equal(cols, a[0, 2].reshape(1, -1))


def test_dma_gather_with_vector_offset(rng):
    @nki.jit
    def k(table, idx):
        ids = to_sbuf(idx)  # (P, 1) row indices, one per partition
        rows = nl.ndarray((idx.shape[0], table.shape[1]), table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=table.ap([[table.shape[1], idx.shape[0]], [1, table.shape[1]]],
                                             vector_offset=ids, indirect_dim=0))
        return to_hbm(rows)

    table = rng.standard_normal((50, 16)).astype(np.float32)
    idx = rng.integers(0, 50, size=(32, 1)).astype(np.int32)
    np.testing.assert_array_equal(k(table, idx), table[idx[:, 0]])


def test_dma_scatter_with_vector_offset(rng):
    @nki.jit
    def k(src, idx):
        out = nl.ndarray((10, src.shape[1]), src.dtype, buffer=nl.shared_hbm)
        zeros = nl.zeros((10, src.shape[1]), src.dtype)
        nisa.dma_copy(dst=out, src=zeros)
        nisa.dma_copy(dst=out.ap([[src.shape[1], src.shape[0]], [1, src.shape[1]]], vector_offset=to_sbuf(idx)),
                      src=to_sbuf(src))
        return out

    src = rng.standard_normal((4, 3)).astype(np.float32)
    idx = np.array([[7], [0], [3], [9]], np.int32)
    expected = np.zeros((10, 3), np.float32)
    expected[idx[:, 0]] = src
    np.testing.assert_array_equal(k(src, idx), expected)


def test_runtime_offset_out_of_bounds_is_an_error(rng):
    @nki.jit
    def k(a, idx):
        return copy_of(a.ap([[a.shape[1], 1], [1, a.shape[1]]], scalar_offset=to_sbuf(idx)))

    a = rng.standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_array_equal(k(a, np.array([[3]], np.int32)), a[3:4])
    with pytest.raises(nki.KernelError, match="runtime offset out of bounds"):
        k(a, np.array([[4]], np.int32))


def test_runtime_subscripts_select_and_ds(rng):
    """NKI 2.33: t[reg], t[:, nl.ds(reg, size)] and t.select(dim, reg_or_1x1) slide at run time."""
    @nki.jit
    def k(a, idx):
        i = to_sbuf(idx)  # (1, 1) int32
        row_t = copy_of(a.select(0, i))  # row idx of a
        acc = nl.zeros((1, a.shape[1]), nl.float32)

        def body(r):
            row = to_sbuf(a[nl.ds(r, 1), :])  # [1, F] at row r
            nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)

        nl.fori_loop(0, a.shape[0], body)
        t = to_sbuf(a)
        window = nl.ndarray((a.shape[0], 3), nl.float32, buffer=nl.sbuf)
        reg = nisa.register_alloc(2)
        nisa.tensor_copy(dst=window, src=t[:, nl.ds(reg, 3)])
        return row_t, to_hbm(acc), to_hbm(window), copy_of(a[reg])  # a[reg]: 1-D row 2

    a = rng.standard_normal((6, 8)).astype(np.float32)
    row_t, acc, window, row2 = k(a, np.array([[4]], np.int32))
    np.testing.assert_array_equal(row2, a[2:3])
    np.testing.assert_array_equal(row_t, a[4:5])
    expected = np.zeros(8, np.float32)
    for r in a:
        expected = expected + r
    np.testing.assert_array_equal(acc[0], expected)
    np.testing.assert_array_equal(window, a[:, 2:5])
