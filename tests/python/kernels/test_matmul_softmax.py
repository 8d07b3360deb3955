"""nikki.kernels.matmul, softmax and softmax_bwd against PyTorch (float64 references) over a sweep of
shapes: tiny, tails in every dim, several row blocks / column tiles, packed short rows, and rows
too long for SBUF (two passes over column chunks); fp32 and bf16 torch tensors.

Tolerances, per element (the kernels compute in fp32 and round once on the store):
- matmul: fp32 PSUM accumulation of up to 128 products per instruction plus one add per k tile
  stays below 1e-5 of sum_k |a_mk b_kn|; a bf16 output adds one rounding, 2^-9 of |ref| (1e-2
  checked).
- softmax: 2e-5 relative in fp32 (exp, the row sum's rounding, the reciprocal), 1e-2 for bf16.
- softmax_bwd: relative to the magnitude before the cancellation in dy - dot, y * (|dy| + |dot| +
  sum |y dy|): 1e-5 in fp32, 1e-2 for bf16.
"""

import linecache
import zlib

import pytest

torch = pytest.importorskip("torch")

import nikki.kernels as K  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]
REL = {torch.float32: 0.0, torch.bfloat16: 1e-2}


def _gen(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _check(got, want, tol, what):
    assert got.shape == want.shape, what
    err = (got.double() - want).abs()
    bad = err > tol
    assert torch.isfinite(got.double()).all(), f"{what}: non-finite outputs"
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        pytest.fail(f"{what}: {int(bad.sum())} elements out of tolerance; first at flat index {i}: "
                    f"got {got.flatten()[i].item()}, want {want.flatten()[i].item()}, tol {tol.flatten()[i].item()}")


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (2, 3, 5), (64, 128, 512), (129, 255, 130), (513, 96, 77),
                                   (200, 640, 600), (3, 2000, 9)])
def test_matmul_matches_torch(m, k, n, dtype):
    g = _gen("matmul", m, k, n)
    a = torch.rand((m, k), generator=g, dtype=torch.float64).mul(2).sub(1).to(dtype)
    b = torch.rand((k, n), generator=g, dtype=torch.float64).mul(2).sub(1).to(dtype)
    got = K.matmul(a, b)
    assert got.dtype == dtype and isinstance(got, torch.Tensor)
    want = a.double() @ b.double()
    tol = 1e-5 * (a.double().abs() @ b.double().abs()) + REL[dtype] * want.abs() + 1e-30
    _check(got, want, tol, f"matmul {m}x{k}x{n} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("r,c", [(1, 1), (4, 7), (130, 5), (2100, 40), (257, 1000), (129, 4096), (5, 12000)])
def test_softmax_matches_torch(r, c, dtype):
    x = (torch.randn((r, c), generator=_gen("softmax", r, c), dtype=torch.float64) * 4).to(dtype)
    got = K.softmax(x)
    assert got.dtype == dtype
    want = torch.softmax(x.double(), -1)
    rel = 2e-5 if dtype == torch.float32 else 1e-2
    _check(got, want, rel * want + 1e-38, f"softmax [{r}, {c}] {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("r,c", [(1, 1), (3, 9), (1100, 12), (2100, 40), (300, 700), (4, 11000)])
def test_softmax_bwd_matches_torch(r, c, dtype):
    g = _gen("softmax_bwd", r, c)
    y = torch.softmax(torch.randn((r, c), generator=g, dtype=torch.float64) * 2, -1).to(dtype)
    dy = torch.randn((r, c), generator=g, dtype=torch.float64).to(dtype)
    got = K.softmax_bwd(y, dy)
    assert got.dtype == dtype
    yd, dyd = y.double(), dy.double()
    dot = (yd * dyd).sum(-1, keepdim=True)
    want = yd * (dyd - dot)
    rel = 1e-5 if dtype == torch.float32 else 1e-2
    tol = rel * yd * (dyd.abs() + dot.abs() + (yd * dyd).abs().sum(-1, keepdim=True)) + 1e-38
    _check(got, want, tol, f"softmax_bwd [{r}, {c}] {dtype}")


def test_softmax_bwd_is_the_gradient_of_softmax():
    # Through torch autograd's own softmax backward as a second, independent reference.
    x = torch.randn((70, 33), generator=_gen("autograd"), dtype=torch.float64, requires_grad=True)
    y = torch.softmax(x, -1)
    dy = torch.randn((70, 33), generator=_gen("autograd-dy"), dtype=torch.float64)
    (want,) = torch.autograd.grad(y, x, dy)
    got = K.softmax_bwd(y.detach().float(), dy.float())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_matmul_shape_errors_name_the_shapes():
    import nikki

    with pytest.raises(nikki.KernelError, match=r"matmul: contraction sizes differ: a is \[4, 8\], b is \[7, 3\]") as err:
        K.matmul(torch.zeros(4, 8), torch.zeros(7, 3))
    # the error points at the call above, not into nikki's C++ kernel
    assert err.value.file == __file__ and "K.matmul(" in linecache.getline(__file__, err.value.line)
