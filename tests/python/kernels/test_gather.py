"""The row gather/scatter family against PyTorch: nikki.kernels.embedding / embedding_bwd and
nikki.torch.embedding against F.embedding and its autograd (tails of rows and columns, repeated
ids within and across tiles of 128 tokens, padding_idx present, absent and negative, ids 0 and
V-1), and what nikki does with out-of-range ids; gather_rows / scatter_add_rows (the MoE routing
helpers) against indexing and index_add with padding indices, their composition as a MoE combine
and their autograd through torch.ops.nikki.

Tolerances: the forward copies rows, so it is bit-exact. The gradient sums grad rows in fp32
(PSUM within a tile, the DMA engines' adds across tiles): float32 tables agree to a few fp32
roundings of the sum; 16-bit tables round each tile's sum and each accumulation into the table
once, a few ulps (2^-8 for bf16) of the largest partial sum per tile.
"""

import linecache

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402


def _ids(t, v, seed=0, repeat_every=5):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, v, (t,), generator=g)
    ids[::repeat_every] = ids[0]  # one id repeated across every tile
    ids[0], ids[-1] = 0, v - 1
    return ids


def _weight(v, h, dtype, seed=1):
    return torch.randn(v, h, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("v,h,t", [(1, 1, 1), (10, 7, 130), (32000, 64, 300), (5, 4097, 3), (200, 640, 256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_forward_is_the_rows_bit_for_bit(v, h, t, dtype):
    weight, ids = _weight(v, h, dtype), _ids(t, v)
    got = K.embedding(weight, ids.to(torch.int32))
    assert got.dtype == dtype and got.shape == (t, h)
    assert torch.equal(got, F.embedding(ids, weight))


def test_forward_returns_the_padding_row_as_torch_does():
    weight, ids = _weight(20, 33, torch.float32), _ids(50, 20)
    ids[7] = 4
    got = K.embedding(weight, ids.to(torch.int32), padding_idx=4)
    assert torch.equal(got, F.embedding(ids, weight, padding_idx=4))
    assert torch.equal(got[7], weight[4])


def _autograd(weight, ids, grad_out, padding_idx):
    w = weight.double().requires_grad_()
    (want,) = torch.autograd.grad(F.embedding(ids, w, padding_idx=padding_idx), w, grad_out.double())
    return want


@pytest.mark.parametrize("v,h,t", [(1, 1, 1), (3, 40, 300), (700, 600, 130), (64, 1100, 257), (4000, 520, 129)])
@pytest.mark.parametrize("padding", [None, 2, -1])
def test_backward_matches_autograd_fp32(v, h, t, padding):
    # row 2 of a table that has fewer rows wraps around, so every combination tests a padding row
    padding_idx = padding % v if padding is not None and padding >= 0 else padding
    weight, ids = _weight(v, h, torch.float32), _ids(t, v)
    grad_out = torch.randn(t, h, generator=torch.Generator().manual_seed(2))
    got = K.embedding_bwd(weight, ids.to(torch.int32), grad_out, padding_idx=padding_idx)
    want = _autograd(weight, ids, grad_out, padding_idx)
    counts = torch.bincount(ids, minlength=v).double()[:, None]
    # fp32 sums of `count` terms of magnitude ~1: a few roundings of the largest partial sum
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=float(1e-6 * counts.max()))
    if padding_idx is not None:
        assert (got[padding_idx] == 0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_backward_16_bit_rounds_once_per_tile(dtype):
    v, h, t = 6, 300, 1000  # every id repeated ~170 times, in every tile
    weight, ids = _weight(v, h, dtype), _ids(t, v)
    grad_out = torch.randn(t, h, generator=torch.Generator().manual_seed(3)).to(dtype)
    got = K.embedding_bwd(weight, ids.to(torch.int32), grad_out, padding_idx=5)
    want = _autograd(weight, ids, grad_out, 5)
    ulp = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    tiles = -(-t // 128)
    # each tile: its sum rounded, then the running sum rounded; partial sums stay below ~3 sqrt(t)
    bound = 2 * tiles * ulp * 3 * np.sqrt(t)
    assert ((got.double() - want).abs() <= bound).all()
    assert (got[5] == 0).all()


def test_backward_of_one_id_repeated_in_a_tile_is_its_sum():
    weight = torch.zeros(4, 8)
    ids = torch.full((128,), 2, dtype=torch.int32)
    grad_out = torch.arange(128 * 8, dtype=torch.float32).reshape(128, 8)
    got = K.embedding_bwd(weight, ids, grad_out)
    want = torch.zeros(4, 8)
    want[2] = grad_out.sum(0)  # integers: exact in fp32
    assert torch.equal(got, want)


@pytest.mark.parametrize("bad", [-1, 10, 2**31 - 1])
def test_out_of_range_ids_are_a_runtime_error_in_both_directions(bad):
    weight, ids = torch.zeros(10, 16), torch.tensor([0, 3, bad, 9], dtype=torch.int32)
    with pytest.raises(nikki.KernelError, match="runtime offset out of bounds"):
        K.embedding(weight, ids)
    with pytest.raises(nikki.KernelError, match="runtime offset out of bounds"):
        K.embedding_bwd(weight, ids, torch.zeros(4, 16))
    with pytest.raises(nikki.KernelError, match="runtime offset out of bounds"):
        nt.embedding(ids, weight)


def test_torch_wrapper_trains_like_f_embedding():
    weight = _weight(50, 12, torch.float32)
    ids = _ids(2 * 70, 50).reshape(2, 70)
    w = weight.clone().requires_grad_()
    out = nt.embedding(ids, w, padding_idx=7)
    ref = weight.clone().requires_grad_()
    want = F.embedding(ids, ref, padding_idx=7)
    assert torch.equal(out, want) and out.shape == (2, 70, 12)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    out.backward(g)
    want.backward(g)
    torch.testing.assert_close(w.grad, ref.grad, rtol=1e-6, atol=1e-5)


def test_torch_wrapper_compiles_without_graph_breaks():
    weight, ids = _weight(30, 8, torch.float32).requires_grad_(), _ids(40, 30)

    def f(i, w):
        return nt.embedding(i, w).square().sum()

    torch.compile(f, fullgraph=True)(ids, weight).backward()
    ref = weight.detach().clone().requires_grad_()
    F.embedding(ids, ref).square().sum().backward()
    torch.testing.assert_close(weight.grad, ref.grad, rtol=1e-6, atol=1e-5)


def test_argument_errors_name_the_argument_at_the_call():
    w = np.zeros((10, 4), np.float32)
    with pytest.raises(nikki.KernelError, match=r"embedding: 'ids' must be a 1-D int32 tensor of token ids") as err:
        K.embedding(w, np.zeros((3, 1), np.int32))
    assert err.value.file == __file__ and "K.embedding(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"embedding: 'ids' must be a 1-D int32 tensor"):
        K.embedding(w, np.zeros(3, np.float32))
    with pytest.raises(nikki.KernelError, match=r"embedding: 'weight' must be a 2-D float32"):
        K.embedding(np.zeros((2, 3, 4), np.float32), np.zeros(3, np.int32))
    with pytest.raises(nikki.KernelError, match=r"embedding: padding_idx is 10") as err:
        K.embedding(w, np.zeros(3, np.int32), padding_idx=10)
    assert "[-10, 10)" in err.value.limit
    with pytest.raises(nikki.KernelError, match=r"embedding_bwd: grad_out must be float32 \[3, 4\]"):
        K.embedding_bwd(w, np.zeros(3, np.int32), np.zeros((3, 5), np.float32))
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.embedding: input"):
        nt.embedding(torch.zeros(3), torch.zeros(10, 4))
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.embedding: padding_idx"):
        nt.embedding(torch.zeros(3, dtype=torch.long), torch.zeros(10, 4), padding_idx=-11)


# --- gather_rows / scatter_add_rows: the MoE routing helpers --------------------------------------

def _routing(n, rows, seed=5):
    """Indices as a router makes them: repeats, rows 0 and rows - 1, and padding (-1 and rows)."""
    idx = _ids(n, rows, seed, repeat_every=3)
    idx[4::9] = -1
    idx[6::11] = rows
    return idx


def _valid(idx, rows):
    return (idx >= 0) & (idx < rows)


@pytest.mark.parametrize("t,h,n", [(1, 1, 1), (300, 70, 130), (64, 5000, 300), (4096, 33, 257)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_rows_copies_rows_and_zeroes_padding(t, h, n, dtype):
    x, idx = _weight(t, h, dtype), _routing(n, t)
    got = K.gather_rows(x, idx.to(torch.int32))
    valid = _valid(idx, t)
    assert torch.equal(got[valid], x[idx[valid]])
    assert (got[~valid] == 0).all()


@pytest.mark.parametrize("n,h,rows", [(1, 1, 1), (300, 70, 20), (260, 1100, 130), (1000, 40, 3)])
def test_scatter_add_rows_matches_index_add_fp32(n, h, rows):
    src = torch.randn(n, h, generator=torch.Generator().manual_seed(6))
    idx = _routing(n, rows)
    scale = torch.rand(n, generator=torch.Generator().manual_seed(7))
    got = K.scatter_add_rows(src, idx.to(torch.int32), scale, num_rows=rows)
    valid = _valid(idx, rows)
    want = torch.zeros(rows, h, dtype=torch.float64).index_add(0, idx[valid], (scale[:, None] * src).double()[valid])
    counts = torch.bincount(idx[valid], minlength=rows).max().item() if valid.any() else 1
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6 * counts)


def test_scatter_add_rows_of_the_gathered_rows_is_the_moe_combine():
    """Top-2 routing of 200 tokens: gather each (token, choice) row, scatter it back weighted by
    its routing weight: every token gets its row times the sum of its two weights."""
    t, h, k = 200, 48, 2
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(8))
    token = torch.arange(t).repeat_interleave(k)
    order = torch.randperm(t * k, generator=torch.Generator().manual_seed(9))  # rows grouped by expert
    idx = token[order].to(torch.int32)
    weights = torch.rand(t * k, generator=torch.Generator().manual_seed(10))
    rows = K.gather_rows(x, idx)
    out = K.scatter_add_rows(rows, idx, weights, num_rows=t)
    per_token = torch.zeros(t).index_add(0, idx.long(), weights)
    torch.testing.assert_close(out, x * per_token[:, None], rtol=1e-6, atol=1e-6)


def test_routing_ops_differentiate_like_torch():
    t, h, n = 40, 16, 90
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(11), requires_grad=True)
    scale = torch.rand(n, generator=torch.Generator().manual_seed(12), requires_grad=True)
    idx = _routing(n, t)
    out = torch.ops.nikki.scatter_add_rows(torch.ops.nikki.gather_rows(x, idx.to(torch.int32)), idx.to(torch.int32),
                                           scale, num_rows=t)
    g = torch.randn(t, h, generator=torch.Generator().manual_seed(13))
    out.backward(g)
    xr, sr = x.detach().clone().requires_grad_(), scale.detach().clone().requires_grad_()
    valid = _valid(idx, t)
    gathered = torch.where(valid[:, None], xr[idx.clamp(0, t - 1)], 0.0)
    want = torch.zeros(t, h).index_add(0, idx[valid], (sr[:, None] * gathered)[valid])
    want.backward(g)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(scale.grad, sr.grad, rtol=1e-5, atol=1e-5)


def test_routing_argument_errors_name_the_argument_at_the_call():
    rows, idx = np.zeros((4, 8), np.float32), np.zeros(4, np.int32)
    with pytest.raises(nikki.KernelError, match=r"scatter_add_rows: num_rows is 0") as err:
        K.scatter_add_rows(rows, idx, np.ones(4, np.float32), num_rows=0)
    assert err.value.file == __file__ and "K.scatter_add_rows(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"scatter_add_rows: 'scale' must be float32 \[4\]"):
        K.scatter_add_rows(rows, idx, np.ones(3, np.float32), num_rows=2)
    with pytest.raises(nikki.KernelError, match=r"scatter_add_rows: 'idx' must be a 1-D int32 tensor of one index per row"):
        K.scatter_add_rows(rows, np.zeros(5, np.int32), np.ones(4, np.float32), num_rows=2)
    with pytest.raises(nikki.KernelError, match=r"gather_rows: 'x' must be a 2-D float32"):
        K.gather_rows(np.zeros(8, np.float32), idx)
    with pytest.raises(nikki.KernelError, match=r"gather_rows_bwd: 'grad_out' must be float32\[4, 8\]"):
        K.gather_rows_bwd(rows, idx, np.zeros((4, 9), np.float32))
    with pytest.raises(nikki.KernelError, match=r"scatter_add_rows_bwd: 'grad_out' must be float32\[2, 8\]"):
        K.scatter_add_rows_bwd(rows, idx, np.ones(4, np.float32), np.zeros((3, 8), np.float32), num_rows=2)


def test_torch_wrappers_take_torch_indices_and_an_optional_scale():
    x = torch.randn(30, 8, generator=torch.Generator().manual_seed(14), requires_grad=True)
    idx = torch.tensor([[3, -1], [29, 3]])  # int64, 2-D, with padding
    rows = nt.gather_rows(x, idx)
    assert rows.shape == (2, 2, 8) and torch.equal(rows[0, 0], x[3]) and (rows[0, 1] == 0).all()
    out = nt.scatter_add_rows(rows.reshape(4, 8), idx.reshape(4), num_rows=30)
    want = torch.zeros(30, 8)
    want[3] = 2 * x[3].detach()
    want[29] = x[29].detach()
    torch.testing.assert_close(out, want)
    out.sum().backward()
    assert torch.equal(x.grad[3], torch.full((8,), 2.0)) and x.grad[0].abs().sum() == 0
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.scatter_add_rows: scale"):
        nt.scatter_add_rows(torch.zeros(4, 8), idx.reshape(4), num_rows=30, scale=torch.ones(3))
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.gather_rows: idx"):
        nt.gather_rows(x, torch.zeros(3))
