"""nikki.kernels.layernorm / rmsnorm and their backward kernels against PyTorch: F.layer_norm and
F.rms_norm evaluated in float64 on the same (dtype-rounded) inputs, their float64 autograd
gradients, and torch's own fp32 / bf16 results. Shapes cover tiny tensors, row and column tails,
several rows per partition, wide rows and rows streamed twice through SBUF.

Tolerances, per element (the kernels compute in fp32 and round each output once):
- 16-bit outputs: one rounding is <= 0.5 ulp, up to 2^-8 of |ref| just above a power of two; fp32
  error before it can cross a rounding boundary, so 1 ulp (2^-7 relative for bf16) plus a small
  absolute floor for values near zero.
- fp32 outputs: 2e-5 relative plus 2e-5 of the terms' scale; the fp32 statistics (~1e-7 relative)
  are amplified by rstd * |mean| for the offset rows used here.
- gradients: the same relative part, and an absolute part on the magnitude of the terms each
  element sums (grad_x: rstd * (|g| + |mean(g)| + |xhat| |mean(g xhat)|); grad_gamma: sum over
  rows of |dy| (|x| + |mean|) rstd; grad_beta: sum over rows of |dy|), since the cancellation in
  those sums is exact in float64 but not in fp32.
- against torch's own bf16 results: layer_norm rounds once as we do (1 ulp); rms_norm rounds
  x * rstd before the weight product, so 2 ulp.
"""

import linecache
import zlib

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]
SHAPES = [(1, 1), (3, 7), (130, 100), (300, 513), (257, 1000), (64, 4096), (2, 16384), (2, 40000)]


def _gen(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _uniform(shape, lo, hi, dtype, g):
    return (torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def _rel(dtype):
    return 2e-5 if dtype == torch.float32 else 2.0 ** -7


def _abs(dtype):
    return 2e-5 if dtype == torch.float32 else 2.0 ** -7 * 1e-2


def _check(got, want, tol, what):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got.double() - want).abs()
    bad = ~(err <= tol)
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        pytest.fail(f"{what}: {int(bad.sum())} of {bad.numel()} elements out of tolerance; first at flat index {i}: "
                    f"got {got.flatten()[i].item()}, want {want.flatten()[i].item()}, tol {tol.flatten()[i].item()}")


def _inputs(kind, r, h, dtype, weight_dtype=None):
    g = _gen(kind, r, h, str(dtype))
    wd = weight_dtype or dtype
    # Rows offset from zero (mean ~2, spread ~0.6) check that layernorm centres before scaling.
    x = _uniform((r, h), 1.0, 3.0, dtype, g) if kind == "layer" else _uniform((r, h), -2.0, 2.0, dtype, g)
    gamma = _uniform((h,), -1.5, 1.5, wd, g)
    beta = _uniform((h,), -0.5, 0.5, wd, g)
    dy = _uniform((r, h), -1.0, 1.0, dtype, g)
    return x, gamma, beta, dy


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("r,h", SHAPES)
def test_layernorm_matches_torch(r, h, dtype):
    x, gamma, beta, _ = _inputs("layer", r, h, dtype)
    out, mean, rstd = K.layernorm(x, gamma, beta)
    assert out.dtype == dtype and mean.dtype == torch.float32 and rstd.dtype == torch.float32
    want, wmean, wrstd = torch.ops.aten.native_layer_norm(x.double(), [h], gamma.double(), beta.double(), 1e-5)
    _check(out, want, _rel(dtype) * want.abs() + _abs(dtype) * 3.0, f"layernorm out [{r}, {h}] {dtype}")
    _check(mean, wmean.flatten(), 1e-5 * wmean.flatten().abs() + 1e-6, "mean")
    _check(rstd, wrstd.flatten(), 1e-5 * wrstd.flatten().abs(), "rstd")
    if dtype == torch.bfloat16 and h > 1:
        mine = F.layer_norm(x, (h,), gamma, beta, 1e-5)
        _check(out, mine.double(), 2.0 ** -7 * mine.double().abs() + 1e-3, "layernorm vs torch bf16")


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("r,h", SHAPES)
def test_rmsnorm_matches_torch(r, h, dtype):
    x, gamma, _, _ = _inputs("rms", r, h, dtype)
    out, rstd = K.rmsnorm(x, gamma)
    assert out.dtype == dtype and rstd.dtype == torch.float32
    want = F.rms_norm(x.double(), (h,), gamma.double(), 1e-6)
    wrstd = torch.rsqrt(x.double().pow(2).mean(-1) + 1e-6)
    _check(out, want, _rel(dtype) * want.abs() + _abs(dtype) * 3.0, f"rmsnorm out [{r}, {h}] {dtype}")
    _check(rstd, wrstd, 1e-5 * wrstd, "rstd")
    if dtype == torch.bfloat16:
        mine = F.rms_norm(x, (h,), gamma, 1e-6)
        _check(out, mine.double(), 2.0 ** -6 * mine.double().abs() + 1e-3, "rmsnorm vs torch bf16")


def _grad_tolerances(x, gamma, dy, mean, rstd, dtype, weight_dtype):
    """Absolute tolerances from the magnitude of the terms each gradient element sums."""
    xd, gd, dyd = x.double(), gamma.double(), dy.double()
    m = mean.double()[:, None] if mean is not None else torch.zeros_like(rstd.double())[:, None]
    r = rstd.double()[:, None]
    xhat_scale = (xd.abs() + m.abs()) * r
    gg = dyd * gd
    xhat = (xd - m) * r
    c1 = gg.mean(-1, keepdim=True)
    c2 = (gg * xhat).mean(-1, keepdim=True)
    dx_scale = r * (gg.abs().amax(-1, keepdim=True) + c1.abs() + xhat_scale.amax(-1, keepdim=True) * c2.abs())
    return (_abs(dtype) * dx_scale.expand_as(xd), _abs(weight_dtype) * (dyd.abs() * xhat_scale).sum(0),
            _abs(weight_dtype) * dyd.abs().sum(0))


# Every shape in both dtypes with weights of the same dtype, plus fp32 weights with bf16
# activations (autocast's mix) on a few shapes.
GRAD_CASES = ([pytest.param(r, h, d, None, id=f"{r}x{h}-{n}") for r, h in SHAPES for d, n in zip(DTYPES, ["fp32", "bf16"])]
              + [pytest.param(r, h, torch.bfloat16, torch.float32, id=f"{r}x{h}-bf16-fp32weights")
                 for r, h in [(3, 7), (300, 513), (257, 1000)]])


@pytest.mark.parametrize("r,h,dtype,weight_dtype", GRAD_CASES)
def test_layernorm_bwd_matches_autograd(r, h, dtype, weight_dtype):
    wd = weight_dtype or dtype
    x, gamma, beta, dy = _inputs("layer", r, h, dtype, weight_dtype)
    _, mean, rstd = K.layernorm(x, gamma, beta)
    dx, dgamma, dbeta = K.layernorm_bwd(x, gamma, mean, rstd, dy)
    assert dx.dtype == dtype and dgamma.dtype == wd and dbeta.dtype == wd
    xd = x.double().requires_grad_()
    gd = gamma.double().requires_grad_()
    bd = beta.double().requires_grad_()
    y = F.layer_norm(xd, (h,), gd, bd, 1e-5)
    wdx, wdg, wdb = torch.autograd.grad(y, (xd, gd, bd), dy.double())
    tx, tg, tb = _grad_tolerances(x, gamma, dy, mean, rstd, dtype, wd)
    _check(dx, wdx, _rel(dtype) * wdx.abs() + tx, f"grad_x [{r}, {h}] {dtype}")
    _check(dgamma, wdg, _rel(wd) * wdg.abs() + tg, "grad_gamma")
    _check(dbeta, wdb, _rel(wd) * wdb.abs() + tb, "grad_beta")


@pytest.mark.parametrize("r,h,dtype,weight_dtype", GRAD_CASES)
def test_rmsnorm_bwd_matches_autograd(r, h, dtype, weight_dtype):
    wd = weight_dtype or dtype
    x, gamma, _, dy = _inputs("rms", r, h, dtype, weight_dtype)
    _, rstd = K.rmsnorm(x, gamma)
    dx, dgamma = K.rmsnorm_bwd(x, gamma, rstd, dy)
    assert dx.dtype == dtype and dgamma.dtype == wd
    xd = x.double().requires_grad_()
    gd = gamma.double().requires_grad_()
    y = F.rms_norm(xd, (h,), gd, 1e-6)
    wdx, wdg = torch.autograd.grad(y, (xd, gd), dy.double())
    tx, tg, _ = _grad_tolerances(x, gamma, dy, None, rstd, dtype, wd)
    _check(dx, wdx, _rel(dtype) * wdx.abs() + tx, f"grad_x [{r}, {h}] {dtype}")
    _check(dgamma, wdg, _rel(wd) * wdg.abs() + tg, "grad_gamma")


def test_fp32_gradients_agree_with_torch_fp32_autograd():
    # torch's own fp32 backward as a second reference, at fp32 precision.
    x, gamma, beta, dy = _inputs("layer", 200, 384, torch.float32)
    xr, gr, br = (t.clone().requires_grad_() for t in (x, gamma, beta))
    want = torch.autograd.grad(F.layer_norm(xr, (384,), gr, br, 1e-5), (xr, gr, br), dy)
    _, mean, rstd = K.layernorm(x, gamma, beta)
    got = K.layernorm_bwd(x, gamma, mean, rstd, dy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    xr, gr = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    want = torch.autograd.grad(F.rms_norm(xr, (384,), gr, 1e-6), (xr, gr), dy)
    _, rstd = K.rmsnorm(x, gamma)
    got = K.rmsnorm_bwd(x, gamma, rstd, dy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_eps_is_a_parameter():
    x = torch.full((4, 16), 3.0)
    gamma, beta = torch.ones(16), torch.zeros(16)
    _, _, rstd = K.layernorm(x, gamma, beta, eps=0.25)
    torch.testing.assert_close(rstd, torch.full((4,), 2.0))
    _, rstd = K.rmsnorm(x, gamma, eps=7.0)
    torch.testing.assert_close(rstd, torch.full((4,), 0.25))


def test_shape_mistakes_are_kernel_errors():
    with pytest.raises(nikki.KernelError, match=r"layernorm: 'gamma' must have shape \[8\]") as err:
        K.layernorm(torch.zeros(4, 8), torch.zeros(7), torch.zeros(8))
    # the error points at the call above, not into nikki's own code
    assert err.value.file == __file__ and "K.layernorm(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"rmsnorm_bwd: grad_out must have x's shape"):
        K.rmsnorm_bwd(torch.zeros(4, 8), torch.zeros(8), torch.zeros(4), torch.zeros(4, 9))
