"""nikki.kernels.cumsum / cumsum_bwd and nikki.torch.cumsum against PyTorch: torch.cumsum in
float64 on the same (dtype-rounded) inputs, forward and reversed, across the carries between
column chunks, and autograd through torch.ops.nikki.cumsum.

Tolerances: the kernel sums in fp32 and rounds once. An fp32 running sum of C terms of unit scale
carries about sqrt(C) roundings of ~2^-24 |sum| each; 16-bit outputs add one rounding (2^-8
relative for bf16) of the output.
"""

import linecache

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402


def _reference(x, reverse):
    x = x.double()
    return x.flip(-1).cumsum(-1).flip(-1) if reverse else x.cumsum(-1)


def _tol(ref, dtype, columns):
    peak = max(1.0, float(ref.abs().max()))
    if dtype == torch.float32:
        return 1e-6 * peak * max(1.0, columns ** 0.5) + 1e-6 * ref.abs()
    return 2.0 ** -7 * ref.abs() + 1e-3 * peak


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (130, 100), (1000, 20), (4, 9000), (2, 20000)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cumsum_matches_torch(shape, reverse, dtype):
    g = torch.Generator().manual_seed(hash((shape, reverse)) % 2**31)
    x = torch.randn(shape, generator=g).to(dtype)
    got = K.cumsum(x, reverse=reverse)
    ref = _reference(x, reverse)
    assert got.dtype == dtype
    assert ((got.double() - ref).abs() <= _tol(ref, dtype, shape[1])).all()


def test_the_carry_crosses_chunks_exactly():
    # Integer-valued fp32 rows: every partial sum is exact, so any carry mistake shows as a
    # wrong integer (a chunk restarting at 0, or a total counted twice).
    x = torch.ones(3, 20000)
    x[1] = torch.arange(20000) % 7
    for reverse in (False, True):
        got = K.cumsum(x, reverse=reverse)
        assert torch.equal(got, _reference(x, reverse).float())


def test_backward_is_the_cumsum_in_the_other_direction():
    g = torch.randn(7, 300, dtype=torch.float64).float()
    for reverse in (False, True):
        x = torch.zeros(7, 300, dtype=torch.float64, requires_grad=True)
        (want,) = torch.autograd.grad(_reference(x, reverse), x, g.double())
        got = K.cumsum_bwd(g, reverse=reverse)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_torch_wrapper_any_dim_with_autograd(dim):
    x = torch.randn(6, 50, 3, dtype=torch.float32, requires_grad=True)
    out = nt.cumsum(x, dim=dim)
    torch.testing.assert_close(out, torch.cumsum(x.detach(), dim), rtol=1e-5, atol=1e-5)
    weights = torch.randn_like(out)
    (got,) = torch.autograd.grad((out * weights).sum(), x)
    (want,) = torch.autograd.grad((torch.cumsum(x, dim) * weights).sum(), x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_torch_wrapper_reverse_and_empty():
    x = torch.randn(4, 33)
    torch.testing.assert_close(nt.cumsum(x, reverse=True), x.flip(-1).cumsum(-1).flip(-1), rtol=1e-5, atol=1e-5)
    assert nt.cumsum(torch.zeros(0, 5)).shape == (0, 5)


def test_bad_input_is_a_kernel_error_at_the_call():
    with pytest.raises(nikki.KernelError, match=r"cumsum: expected a 2-D float32, bfloat16 or float16 tensor, "
                                                r"got float32\[2, 3, 4\]") as err:
        K.cumsum(np.zeros((2, 3, 4), np.float32))
    assert err.value.file == __file__ and "K.cumsum(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.cumsum: dim"):
        nt.cumsum(torch.zeros(2, 3), dim=2)
