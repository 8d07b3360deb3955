"""find_nonzero_indices (nki-library's kernel) against a torch.nonzero loop over the columns:
routing masks of every density (empty and full columns, one nonzero per column), rows compacted in
chunks with their carries (chunk_size 128 ... 512, and T crossing chunk boundaries by one), more
columns than one round of eight and than the 128 partitions, NaN and -0.0, int32 and bool masks
through nikki.torch, and the argument errors. Integer outputs: compared exactly."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402


def _want(x):
    t, c = x.shape
    indices = torch.full((c, t), -1, dtype=torch.int32)
    counts = torch.zeros(c, dtype=torch.int32)
    for col in range(c):
        rows = torch.nonzero(x[:, col] != 0).reshape(-1)
        indices[col, :rows.numel()] = rows.to(torch.int32)
        counts[col] = rows.numel()
    return indices, counts


def _mask(t, c, seed, density=0.3):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(t, c, generator=g) < density).to(torch.float32) * torch.randn(t, c, generator=g)


def _check(x, **kw):
    indices, counts = K.find_nonzero_indices(x, **kw)
    want_i, want_c = _want(x)
    assert indices.dtype == torch.int32 and counts.dtype == torch.int32
    assert torch.equal(counts, want_c)
    assert torch.equal(indices, want_i)


@pytest.mark.parametrize("t,c,chunk", [(1, 1, 0), (127, 8, 0), (128, 8, 0), (129, 8, 128), (256, 9, 128),
                                       (257, 16, 128), (1000, 8, 384), (513, 3, 512), (300, 130, 0),
                                       (2000, 64, 0)])
def test_columns_match_a_torch_nonzero_loop(t, c, chunk):
    _check(_mask(t, c, seed=t + c), chunk_size=chunk)


@pytest.mark.parametrize("density", [0.0, 1e-3, 0.5, 1.0])
def test_any_density_with_carries_across_chunks(density):
    _check(_mask(700, 12, seed=3, density=density), chunk_size=128)


def test_a_single_nonzero_in_the_last_chunk_and_the_last_row():
    x = torch.zeros(900, 5)
    x[899, 0], x[0, 4], x[640, 2] = 1, -2, 3
    _check(x, chunk_size=128)
    indices, counts = K.find_nonzero_indices(x, chunk_size=128)
    assert counts.tolist() == [1, 0, 1, 0, 1]
    assert indices[0, 0] == 899 and (indices[1] == -1).all()


def test_nan_is_nonzero_and_negative_zero_is_zero():
    x = torch.tensor([[math.nan, -0.0], [0.0, math.inf], [-0.0, 1e-30]], dtype=torch.float32)
    indices, counts = K.find_nonzero_indices(x)
    assert counts.tolist() == [1, 2]
    assert indices.tolist() == [[0, -1, -1], [1, 2, -1]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32])
def test_dtypes(dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-2, 3, (333, 10), generator=g).to(dtype)
    _check(x)


def test_torch_wrapper_takes_bool_and_integer_masks():
    ids = torch.randint(0, 8, (300, 2), generator=torch.Generator().manual_seed(4))
    mask = torch.zeros(300, 8, dtype=torch.bool).scatter(1, ids, True)  # a top-2 routing mask
    indices, counts = nt.find_nonzero_indices(mask)
    want_i, want_c = _want(mask.to(torch.int32))
    assert torch.equal(indices, want_i) and torch.equal(counts, want_c)
    assert int(counts.sum()) == int(mask.sum())
    indices, counts = nt.find_nonzero_indices(mask.to(torch.int64), chunk_size=256)
    assert torch.equal(indices, want_i) and torch.equal(counts, want_c)


def test_argument_errors_name_the_argument_and_the_limit():
    with pytest.raises(nikki.KernelError, match=r"find_nonzero_indices: expected a 2-D float or int32 tensor x"):
        K.find_nonzero_indices(np.zeros(5, dtype=np.float32))
    with pytest.raises(nikki.KernelError, match=r"find_nonzero_indices: chunk_size is 100") as err:
        K.find_nonzero_indices(np.zeros((5, 2), dtype=np.float32), chunk_size=100)
    assert "multiple of 128" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"find_nonzero_indices: x has 16777216 rows") as err:
        nikki.estimate(K.find_nonzero_indices, nikki.spec((2**24, 1), "float32"))
    assert "2^24" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"needs GpSimd's nonzero_with_count") as err:
        nikki.estimate(K.find_nonzero_indices, nikki.spec((10, 2), "float32"), target="trn1")
    assert "trn2" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.find_nonzero_indices: x must be a 2-D tensor"):
        nt.find_nonzero_indices(torch.zeros(2, 3, 4))
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.find_nonzero_indices: chunk_size must be an integer"):
        nt.find_nonzero_indices(torch.zeros(2, 3), chunk_size=-128)
