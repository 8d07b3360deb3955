"""nikki.kernels.topk and nikki.torch.topk against torch.topk: values exactly, indices as torch's
stable descending sort gives them (equal values by increasing index), through column chunks and
their merge, with ties inside one max8 round, across rounds and across chunks; the gradient of
the values; errors at the caller's line."""

import linecache

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402


def _stable_topk(x, k):
    values, order = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], order[..., :k]


@pytest.mark.parametrize("shape,k,dtype", [((4, 9), 9, torch.float32), ((130, 1000), 1, torch.bfloat16),
                                           ((3, 33000), 17, torch.float16), ((2, 50000), 64, torch.bfloat16)])
def test_values_are_torch_topk_and_indices_its_stable_order(shape, k, dtype):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(k), dtype=torch.float64).to(dtype)
    values, indices = K.topk(x, k=k)
    assert indices.dtype == torch.int32
    want_v, want_i = _stable_topk(x, k)
    assert torch.equal(values, torch.topk(x, k).values)
    assert torch.equal(indices.long(), want_i)
    assert torch.equal(values, want_v)


def test_ties_take_the_lowest_indices_first_across_rounds_and_chunks():
    # Every row constant but for a few larger values: the top 64 are mostly ties spread over
    # three column chunks, and the order among them is the order of the indices.
    x = torch.zeros(3, 40000)
    x[:, 39000] = 2.0
    x[1, 5] = 3.0
    x[2, :] = 1.0
    values, indices = K.topk(x, k=64)
    want_v, want_i = _stable_topk(x, 64)
    assert torch.equal(values, want_v)
    assert torch.equal(indices.long(), want_i)
    assert indices[2].tolist() == list(range(64))
    assert indices[0, :3].tolist() == [39000, 0, 1]


def test_infinities_are_ordinary_values():
    x = torch.full((2, 20), float("-inf"))
    x[0, 3] = float("inf")
    x[0, 7] = 0.5
    values, indices = K.topk(x, k=4)
    want_v, want_i = _stable_topk(x, 4)
    assert torch.equal(values, want_v)
    assert torch.equal(indices.long(), want_i)


def test_row_max_and_argmax_as_k_1():
    x = torch.randn(300, 777, generator=torch.Generator().manual_seed(3))
    values, indices = K.topk(x, k=1)
    assert torch.equal(values[:, 0], x.max(-1).values)
    assert torch.equal(indices[:, 0].long(), x.argmax(-1))


def test_torch_wrapper_takes_any_dim_and_differentiates_the_values():
    x = torch.randn(3, 50, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64).float()
    x.requires_grad_()
    values, indices = nt.topk(x, 6, dim=1)
    want = torch.topk(x.detach(), 6, dim=1)
    assert indices.dtype == torch.int64 and values.shape == (3, 6, 4)
    assert torch.equal(values.detach(), want.values) and torch.equal(indices, want.indices)
    weights = torch.randn(values.shape, generator=torch.Generator().manual_seed(6))
    (grad,) = torch.autograd.grad((values * weights).sum(), x)
    xr = x.detach().clone().requires_grad_()
    (want_grad,) = torch.autograd.grad((torch.topk(xr, 6, dim=1).values * weights).sum(), xr)
    assert torch.equal(grad, want_grad)


def test_compiles_without_graph_breaks():
    x = torch.randn(5, 300, generator=torch.Generator().manual_seed(7))
    fn = torch.compile(lambda t: nt.topk(t.softmax(-1), 8)[0].sum(-1), fullgraph=True)
    torch.testing.assert_close(fn(x), torch.topk(x.softmax(-1), 8).values.sum(-1))


def test_bad_k_is_a_kernel_error_at_the_call():
    x = np.zeros((4, 100), np.float32)
    with pytest.raises(nikki.KernelError, match=r"topk: k = 65 for rows of 100 elements") as err:
        K.topk(x, k=65)
    assert "1 <= k <= min(N, 64)" in str(err.value)
    assert err.value.file == __file__ and "K.topk(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"topk: k = 0 for rows of 100 elements"):
        K.topk(x, k=0)
    with pytest.raises(nikki.KernelError, match=r"topk: k = 9 for rows of 8 elements"):
        K.topk(np.zeros((4, 8), np.float32), k=9)
    with pytest.raises(nikki.KernelError, match=r"topk: expected a 2-D float tensor x, got float32\[2, 3, 4\]"):
        K.topk(np.zeros((2, 3, 4), np.float32), k=1)
