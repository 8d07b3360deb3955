"""nikki.kernels.add_rmsnorm / add_rmsnorm_bwd and nikki.torch.add_rms_norm against PyTorch:
h = x + residual and F.rms_norm(h) evaluated in float64, their float64 autograd gradients (both
addends, gamma) with gradients reaching the sum directly as well, and a residual chain of two
layers trained through autograd.

Tolerances: the kernel rounds the sum to x's dtype (as torch's unfused add does) before the norm,
so 16-bit outputs differ from the float64 reference by the sum's rounding (2^-8 relative) carried
through the norm, plus the output's own rounding: 2^-6 relative plus 2^-6 of the row's scale.
fp32: 2e-5.
"""

import linecache

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402

SHAPES = [(1, 1), (3, 7), (300, 77), (257, 1000), (64, 4096), (2, 40000)]


def _tol(dtype):
    return 2e-5 if dtype == torch.float32 else 2.0 ** -6


def _close(got, want, dtype, what):
    tol = _tol(dtype)
    err = (got.double() - want).abs()
    bound = tol * want.abs() + tol * max(1.0, float(want.abs().max()))
    assert (err <= bound).all(), f"{what}: worst error {float(err.max())}"


@pytest.mark.parametrize("r,h", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_matches_torch(r, h, dtype):
    g = torch.Generator().manual_seed(r * 100003 + h)
    x, res = (torch.randn(r, h, generator=g).to(dtype) for _ in range(2))
    gamma = torch.randn(h, generator=g).to(dtype)
    out, total, rstd = K.add_rmsnorm(x, res, gamma, eps=1e-5)
    hsum = x.double() + res.double()
    _close(total, hsum, dtype, "sum")
    assert torch.equal(total, x + res)  # one rounding of the exact sum, as torch's add
    _close(out, F.rms_norm(hsum, (h,), gamma.double(), 1e-5), dtype, "out")
    torch.testing.assert_close(rstd.double(), torch.rsqrt(total.double().pow(2).mean(-1) + 1e-5), rtol=1e-5, atol=0)


@pytest.mark.parametrize("r,h", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_matches_autograd(r, h, dtype):
    g = torch.Generator().manual_seed(r * 7919 + h)
    x, res, grad_out, grad_sum = (torch.randn(r, h, generator=g).to(dtype) for _ in range(4))
    gamma = torch.randn(h, generator=g).to(dtype)
    _, total, rstd = K.add_rmsnorm(x, res, gamma)
    gx, gres, ggamma = K.add_rmsnorm_bwd(total, gamma, rstd, grad_out, grad_sum)
    xs, rs, gd = (t.double().requires_grad_() for t in (x, res, gamma))
    hsum = xs + rs
    want = torch.autograd.grad([F.rms_norm(hsum, (h,), gd, 1e-6), hsum], [xs, rs, gd],
                               [grad_out.double(), grad_sum.double()])
    assert torch.equal(gx, gres)
    _close(gx, want[0], dtype, "grad_x")
    _close(gres, want[1], dtype, "grad_residual")
    _close(ggamma, want[2], dtype, "grad_gamma")


def test_torch_wrapper_chains_residuals_with_autograd():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 64, generator=g, requires_grad=True)
    w1, w2 = (torch.randn(64, generator=g, requires_grad=True) for _ in range(2))
    res = torch.zeros(2, 5, 64)
    normed, res = nt.add_rms_norm(x, res, w1)
    out, res = nt.add_rms_norm(normed * 0.5, res, w2)
    loss = (out ** 2).sum() + res.sum()
    got = torch.autograd.grad(loss, [x, w1, w2])
    xr, w1r, w2r = (t.detach().clone().requires_grad_() for t in (x, w1, w2))
    h1 = xr
    n1 = F.rms_norm(h1, (64,), w1r, 1e-6)
    h2 = n1 * 0.5 + h1
    want_loss = (F.rms_norm(h2, (64,), w2r, 1e-6) ** 2).sum() + h2.sum()
    want = torch.autograd.grad(want_loss, [xr, w1r, w2r])
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-4)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_mismatched_residual_is_a_kernel_error_at_the_call():
    with pytest.raises(nikki.KernelError, match=r"add_rmsnorm: residual must match x \(float32\[4, 8\]\), "
                                                r"got float32\[4, 9\]") as err:
        K.add_rmsnorm(torch.zeros(4, 8), torch.zeros(4, 9), torch.ones(8))
    assert err.value.file == __file__ and "K.add_rmsnorm(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"add_rmsnorm_bwd: grad_sum must match sum"):
        K.add_rmsnorm_bwd(torch.zeros(4, 8), torch.ones(8), torch.ones(4), torch.zeros(4, 8), torch.zeros(4, 8,
                                                                                                          dtype=torch.bfloat16))
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.add_rms_norm: residual"):
        nt.add_rms_norm(torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.bfloat16))
