"""nikki's 2-D pooling kernels (max_pool2d, avg_pool2d and their backwards) and the wrappers
nikki.torch.max_pool2d / avg_pool2d against torch.nn.functional and torch.autograd.

Max pooling selects values, so its forward is exact in every dtype, and its backward routes each
gradient unchanged: where windows do not share cells the gradients are bit-exact, and where they
do (kernel > stride) the shares add in another order than torch's (a few roundings of the dtype).
Inputs full of ties (zeros, small integers) check that a window's gradient goes to its first
maximum in row-major window order, as torch's indices do. Average pooling sums in fp32; 16-bit
sums round once before the division (bf16: a few 2^-8 relative).
"""

import linecache

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def _params(kernel, stride, padding):
    pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    (kh, kw), (ph, pw) = pair(kernel), pair(padding)
    sh, sw = pair(stride) if stride is not None else (kh, kw)
    return dict(kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw, padding_h=ph, padding_w=pw)


def _ties(shape, dtype, seed=0):
    """Small integers: most windows hold their maximum more than once."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, shape, generator=g).to(dtype)


GEOMETRIES = [  # shape, kernel, stride, padding
    ((2, 70, 9, 11), 3, 2, 1),           # overlapping windows, odd planes, a partition tail
    ((1, 130, 8, 8), 2, None, 0),        # k = stride, 130 planes
    ((1, 3, 5, 7), 1, None, 0),          # k = 1
    ((3, 50, 12, 10), (2, 4), (1, 3), (1, 2)),  # rectangular, padding at its limit
    ((1, 2, 6, 5), (5, 3), 1, (2, 1)),   # windows much wider than the stride
    ((2, 300, 4, 4), 2, 1, 0),           # several planes per partition
    ((1, 1, 1, 1), 1, None, 0),          # one cell
]


@pytest.mark.parametrize("shape, kernel, stride, padding", GEOMETRIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_pool2d_forward_and_tie_routing_match_torch(shape, kernel, stride, padding, dtype):
    x = _ties(shape, dtype).requires_grad_()
    want = F.max_pool2d(x, kernel, stride, padding)
    grad_out = torch.randn(want.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    (want_grad,) = torch.autograd.grad(want, x, grad_out)
    p = _params(kernel, stride, padding)
    got = K.max_pool2d(x.detach(), **p)
    assert torch.equal(got, want.detach())
    got_grad = K.max_pool2d_bwd(x.detach(), got, grad_out, **p)
    torch.testing.assert_close(got_grad.double(), want_grad.double(), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("fill", [0.0, 1.0, -3.0])
def test_max_pool2d_constant_input_routes_to_the_first_cell_of_each_window(fill):
    # Every cell ties: each window's gradient goes to its first valid cell (top-left, or the first
    # one inside x when the window starts in the padding), never to two cells.
    x = torch.full((2, 5, 7, 9), fill).requires_grad_()
    out = F.max_pool2d(x, 3, 2, 1)
    grad_out = torch.arange(out.numel(), dtype=torch.float32).reshape(out.shape) + 1
    (want,) = torch.autograd.grad(out, x, grad_out)
    got = K.max_pool2d_bwd(x.detach(), out.detach(), grad_out, **_params(3, 2, 1))
    assert torch.equal(got, want)
    assert got.sum() == grad_out.sum()


def test_max_pool2d_padding_never_wins():
    # All values negative: the zero a padded border would hold must not be the maximum.
    x = -1 - torch.rand(1, 4, 6, 6)
    got = K.max_pool2d(x, **_params(3, 1, 1))
    assert torch.equal(got, F.max_pool2d(x, 3, 1, 1))
    assert (got < 0).all()


@pytest.mark.parametrize("shape, kernel, stride, padding", GEOMETRIES)
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_avg_pool2d_matches_torch(shape, kernel, stride, padding, count_include_pad, dtype):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    xd = x.double().requires_grad_()
    want = F.avg_pool2d(xd, kernel, stride, padding, count_include_pad=count_include_pad)
    grad_out = torch.randn(want.shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    (want_grad,) = torch.autograd.grad(want, xd, grad_out.double())
    p = _params(kernel, stride, padding)
    got = K.avg_pool2d(x, **p, count_include_pad=count_include_pad)
    tol = 2 * TOL[dtype]
    torch.testing.assert_close(got.double(), want.detach(), rtol=tol, atol=tol)
    got_grad = K.avg_pool2d_bwd(x, grad_out, **p, count_include_pad=count_include_pad)
    torch.testing.assert_close(got_grad.double(), want_grad, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["max_pool2d", "avg_pool2d"])
def test_torch_wrappers_take_ints_or_pairs_and_differentiate(op):
    x = torch.randn(2, 3, 10, 9, dtype=torch.float64).float().requires_grad_()
    ours, theirs = getattr(nt, op), getattr(F, op)
    for args in [(3,), (3, 2, 1), ((3, 2), (2, 1), (1, 1)), ([2, 2], None, 0)]:
        got = ours(x, *args)
        want = theirs(x, *args)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        grad = torch.randn(want.shape)
        torch.testing.assert_close(torch.autograd.grad(got, x, grad)[0], torch.autograd.grad(want, x, grad)[0],
                                   rtol=1e-5, atol=1e-5)
    # [C, H, W] images as torch takes them.
    torch.testing.assert_close(ours(x[0].detach(), 2), theirs(x[0].detach(), 2), rtol=1e-5, atol=1e-5)


def test_avg_pool2d_wrapper_count_include_pad():
    x = torch.randn(1, 4, 7, 7)
    torch.testing.assert_close(nt.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
                               F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), rtol=1e-5, atol=1e-5)


def _located_here(err, call):
    assert err.value.file == __file__ and call in linecache.getline(__file__, err.value.line)


def test_argument_errors_name_the_argument_and_the_limit():
    x = torch.zeros(1, 2, 6, 6)
    with pytest.raises(nikki.KernelError, match=r"max_pool2d: padding \(padding_h, padding_w\) = \(2, 1\) must be at "
                                                r"most half the kernel size \(kernel_h, kernel_w\) = \(3, 3\)") as err:
        K.max_pool2d(x, **_params(3, 1, (2, 1)))
    _located_here(err, "K.max_pool2d(")
    assert "0 <= padding <= kernel / 2" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"avg_pool2d: the window \(kernel_h, kernel_w\) = \(5, 2\) is larger "
                                                r"than the padded input 4x8"):
        K.avg_pool2d(torch.zeros(1, 1, 4, 8), **_params((5, 2), 1, 0))
    with pytest.raises(nikki.KernelError, match=r"max_pool2d: x must be 4-D \[N, C, H, W\], got \[2, 6, 6\]") as err:
        K.max_pool2d(torch.zeros(2, 6, 6), **_params(2, 2, 0))
    _located_here(err, "K.max_pool2d(")
    with pytest.raises(nikki.KernelError, match=r"max_pool2d: kernel size must be at least 1, got \(kernel_h, "
                                                r"kernel_w\) = \(0, 2\)"):
        K.max_pool2d(x, **_params((0, 2), 1, 0))
    with pytest.raises(nikki.KernelError, match=r"avg_pool2d: stride must be at least 1 \(0 means the kernel size\), "
                                                r"got \(stride_h, stride_w\) = \(-1, 2\)"):
        K.avg_pool2d(x, **_params(2, (-1, 2), 0))
    with pytest.raises(nikki.KernelError, match=r"kernel 'max_pool2d': input 'x' has dtype int32"):
        K.max_pool2d(torch.zeros(1, 1, 4, 4, dtype=torch.int32), **_params(2, 2, 0))
    with pytest.raises(nikki.KernelError, match=r"max_pool2d_bwd: 'grad_out' must be \[1, 2, 3, 3\] float32 "
                                                r"\(max_pool2d's output for x with kernel_h=2, kernel_w=2, stride_h=2, "
                                                r"stride_w=2, padding_h=0, padding_w=0\), got \[1, 2, 3, 2\]"):
        K.max_pool2d_bwd(x, torch.zeros(1, 2, 3, 3), torch.zeros(1, 2, 3, 2), **_params(2, 2, 0))
    with pytest.raises(nikki.KernelError, match=r"avg_pool2d_bwd: 'grad_out' must be \[1, 2, 3, 3\] float32"):
        K.avg_pool2d_bwd(x, torch.zeros(1, 2, 3, 3, dtype=torch.bfloat16), **_params(2, 2, 0))


def test_large_planes_keep_fewer_tiles_in_flight():
    # A ResNet stem's 112x112 fp32 planes: four tiles of each buffer would not fit SBUF, fewer do.
    x = torch.randn(1, 3, 112, 112)
    assert torch.equal(K.max_pool2d(x, **_params(3, 2, 1)), F.max_pool2d(x, 3, 2, 1))
    grad_out = torch.randn(1, 3, 56, 56)
    want = torch.autograd.grad(F.avg_pool2d(x.requires_grad_(), 2), x, grad_out)[0]
    torch.testing.assert_close(K.avg_pool2d_bwd(x.detach(), grad_out, **_params(2, 2, 0)), want)


def test_planes_too_large_for_sbuf_are_an_error():
    with pytest.raises(nikki.KernelError, match=r"max_pool2d: planes of 400x300 need 586 KiB of SBUF per partition "
                                                r"\(one plane in each buffer\), more than the \d+ KiB free") as err:
        K.max_pool2d(torch.zeros(1, 1, 400, 300), **_params(2, 2, 0))
    _located_here(err, "K.max_pool2d(")
    assert "split x along H into bands" in str(err.value)


def test_torch_wrapper_errors():
    x = torch.zeros(1, 2, 6, 6)
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.max_pool2d: dilation must be 1, got 2") as err:
        nt.max_pool2d(x, 2, dilation=2)
    _located_here(err, "nt.max_pool2d(")
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.max_pool2d: ceil_mode must be False, got True"):
        nt.max_pool2d(x, 2, ceil_mode=True)
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.max_pool2d: return_indices must be False"):
        nt.max_pool2d(x, 2, return_indices=True)
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.avg_pool2d: divisor_override must be None, got 3"):
        nt.avg_pool2d(x, 2, divisor_override=3)
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.avg_pool2d: kernel_size must be an int or a pair"):
        nt.avg_pool2d(x, (2, 2, 2))
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.max_pool2d: input must be a 3-D \[C, H, W\] or 4-D "
                                                r"\[N, C, H, W\] tensor, got a 5-d tensor"):
        nt.max_pool2d(torch.zeros(1, 1, 1, 4, 4), 2)
    with pytest.raises(nikki.KernelError, match=r"max_pool2d: padding \(padding_h, padding_w\) = \(2, 2\) must be at "
                                                r"most half"):
        nt.max_pool2d(x, 2, padding=2)
