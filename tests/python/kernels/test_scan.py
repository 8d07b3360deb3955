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


# --- linear_recurrence --------------------------------------------------------------------------
# h_t = a_t * h_{t-1} + b_t against a float64 step loop on the same (dtype-rounded) inputs. The
# kernel keeps the state in fp32: with decays |a| < 1 an fp32 rounding error is damped rather than
# accumulated, so fp32 results sit within a few ulps of |h|; 16-bit outputs add one rounding
# (2^-8 relative for bf16).

def _recurrence(a, b, h0):
    state, steps = h0.double(), []
    for t in range(a.shape[-1]):
        state = a[..., t].double() * state + b[..., t].double()
        steps.append(state)
    return torch.stack(steps, -1)


def _decays(shape, g, dtype):
    magnitude = 0.5 + 0.5 * torch.rand(shape, generator=g)
    sign = torch.where(torch.rand(shape, generator=g) < 0.2, -1.0, 1.0)
    return (sign * magnitude).to(dtype)


def _recurrence_tol(ref, dtype):
    if dtype == torch.float32:
        return 1e-5 * ref.abs() + 1e-5
    return 2.0 ** -7 * ref.abs() + 2.0 ** -7


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 130, 77), (1, 1000, 20), (2, 3, 13000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_h0", [False, True])
def test_linear_recurrence_matches_a_step_loop(shape, dtype, with_h0):
    g = torch.Generator().manual_seed(hash((shape, with_h0)) % 2**31)
    a, b = _decays(shape, g, dtype), torch.randn(shape, generator=g).to(dtype)
    h0 = torch.randn(shape[:2], generator=g).to(dtype) if with_h0 else torch.zeros(shape[:2], dtype=dtype)
    got = K.linear_recurrence(a, b, h0)
    ref = _recurrence(a, b, h0)
    assert got.dtype == dtype and got.shape == shape
    assert ((got.double() - ref).abs() <= _recurrence_tol(ref, dtype)).all()


def test_the_state_crosses_chunks_exactly():
    # a = 1 and small integer b: h is an exact fp32 integer running sum, so a state that restarts
    # at a chunk boundary, or is carried from the wrong column, shows as a wrong integer. A zero a
    # in the middle of a chunk and right at a likely boundary resets the state exactly.
    L = 20000
    a, b = torch.ones(2, 3, L), (torch.arange(L) % 5 - 2).float().expand(2, 3, L).contiguous()
    a[0, 1, 4096] = 0.0
    a[1, 2, 10001] = 0.0
    h0 = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert torch.equal(K.linear_recurrence(a, b, h0), _recurrence(a, b, h0).float())


def test_linear_recurrence_backward_matches_autograd_through_the_loop():
    g = torch.Generator().manual_seed(7)
    shape = (2, 70, 300)
    a, b, h0 = _decays(shape, g, torch.float32), torch.randn(shape, generator=g), torch.randn(shape[:2], generator=g)
    grad_h = torch.randn(shape, generator=g)
    h = K.linear_recurrence(a, b, h0)
    grad_a, grad_b, grad_h0 = K.linear_recurrence_bwd(a, h0, h, grad_h)
    leaves = [t.double().requires_grad_() for t in (a, b, h0)]
    want = torch.autograd.grad(_recurrence(*leaves), leaves, grad_h.double())
    for got, ref in zip((grad_a, grad_b, grad_h0), want):
        assert ((got.double() - ref).abs() <= 1e-5 * ref.abs() + 1e-5).all()


def test_the_reverse_scan_crosses_chunks_exactly():
    # a = 1: g is the reversed cumulative sum of grad_h, exact in fp32 for small integers; grad_a
    # = g * h_{t-1} with h_{t-1} = 1 (h0 = 1, b = 0) is g again; grad_h0 = g_0.
    L = 20000
    a, h = torch.ones(1, 2, L), torch.ones(1, 2, L)
    grad_h = (torch.arange(L) % 3 - 1).float().expand(1, 2, L).contiguous()
    grad_a, grad_b, grad_h0 = K.linear_recurrence_bwd(a, torch.ones(1, 2), h, grad_h)
    want = grad_h.double().flip(-1).cumsum(-1).flip(-1).float()
    assert torch.equal(grad_b, want) and torch.equal(grad_a, want) and torch.equal(grad_h0, want[..., 0])


@pytest.mark.parametrize("dim", [-1, 1, 0])
@pytest.mark.parametrize("with_h0", [False, True])
def test_torch_linear_recurrence_any_dim_with_autograd(dim, with_h0):
    g = torch.Generator().manual_seed(3 + dim)
    shape = (5, 40, 3)
    a = _decays(shape, g, torch.float32).requires_grad_()
    b = torch.randn(shape, generator=g, requires_grad=True)
    state_shape = tuple(s for i, s in enumerate(shape) if i != dim % 3)
    h0 = torch.randn(state_shape, generator=g, requires_grad=True) if with_h0 else None
    out = nt.linear_recurrence(a, b, h0, dim=dim)

    def loop(a, b, h0):
        moved = _recurrence(a.movedim(dim, -1), b.movedim(dim, -1), h0 if h0 is not None else
                            torch.zeros(state_shape, dtype=torch.float64))
        return moved.movedim(-1, dim)

    leaves = [t for t in (a, b, h0) if t is not None]
    doubles = [t.detach().double().requires_grad_() for t in leaves]
    want = loop(*(doubles + ([] if with_h0 else [None])))
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    weights = torch.randn(shape, generator=g)
    got_grads = torch.autograd.grad((out * weights).sum(), leaves)
    want_grads = torch.autograd.grad((want * weights.double()).sum(), doubles)
    for got, ref in zip(got_grads, want_grads):
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_torch_linear_recurrence_empty_and_a_linear_rnn_layer():
    assert nt.linear_recurrence(torch.zeros(2, 0, 3), torch.zeros(2, 0, 3)).shape == (2, 0, 3)
    # A gated linear RNN layer over [batch, time, features] (time-major along dim 1): its output
    # and the gradients of its weights match the same layer computed with a Python loop.
    torch.manual_seed(0)
    x = torch.randn(2, 64, 16)
    gate, proj = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def layer(scan):
        a = torch.sigmoid(gate(x))
        return scan(a, (1 - a) * proj(x)).pow(2).mean()

    loss = layer(lambda a, b: nt.linear_recurrence(a, b, dim=1))
    grads = torch.autograd.grad(loss, [gate.weight, proj.weight])
    ref = layer(lambda a, b: _recurrence(a.movedim(1, -1), b.movedim(1, -1), torch.zeros(2, 16)).movedim(-1, 1).float())
    ref_grads = torch.autograd.grad(ref, [gate.weight, proj.weight])
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_linear_recurrence_argument_errors_name_the_argument():
    a, h0 = torch.zeros(2, 8, 16), torch.zeros(2, 8)
    with pytest.raises(nikki.KernelError, match=r"linear_recurrence: 'b' must have a's shape \[2, 8, 16\], "
                                                r"got \[2, 8, 15\]") as err:
        K.linear_recurrence(a, torch.zeros(2, 8, 15), h0)
    assert err.value.file == __file__ and "K.linear_recurrence(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"linear_recurrence: 'h0' must be \[2, 8\] \(one state per batch "
                                                r"and channel of a\), got \[8\]") as err:
        K.linear_recurrence(a, a, torch.zeros(8))
    assert "pass zeros for a recurrence that starts from zero" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"linear_recurrence: a must be 3-D \[batch, channels, length\], "
                                                r"got \[8, 16\]"):
        K.linear_recurrence(torch.zeros(8, 16), torch.zeros(8, 16), h0)
    with pytest.raises(nikki.KernelError, match=r"linear_recurrence: 'b' must have a's dtype float32, got bfloat16"):
        K.linear_recurrence(a, a.bfloat16(), h0)
    with pytest.raises(nikki.KernelError, match=r"linear_recurrence_bwd: 'grad_h' must have a's shape "
                                                r"\[2, 8, 16\], got \[2, 8, 17\]"):
        K.linear_recurrence_bwd(a, h0, a, torch.zeros(2, 8, 17))
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.linear_recurrence: b must be a tensor of a's shape "
                                                r"\(2, 8, 16\)"):
        nt.linear_recurrence(a, torch.zeros(2, 8))
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.linear_recurrence: h0 must be None or a tensor of "
                                                r"shape \(2, 16\) \(a's shape without dim 1\)"):
        nt.linear_recurrence(a, a, torch.zeros(2, 8), dim=1)
