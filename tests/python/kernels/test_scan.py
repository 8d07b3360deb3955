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
    for a_t, b_t in zip(a.double().unbind(-1), b.double().unbind(-1)):
        state = a_t * state + b_t
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


# --- selective_scan -----------------------------------------------------------------------------
# Mamba's selective scan against a float64 loop over tokens (the definition of mamba_ssm's
# selective_scan_ref) on the same dtype-rounded inputs. The kernel keeps states and the sum over
# states in fp32; y is rounded once to u's dtype.

F = torch.nn.functional


def _selective_reference(u, delta, A, Bm, Cm, D=None, z=None, delta_bias=None, softplus=False, h0=None):
    u, delta, A, Bm, Cm = (t.double() for t in (u, delta, A, Bm, Cm))
    dt = delta + (0 if delta_bias is None else delta_bias.double()[:, None])
    dt = F.softplus(dt) if softplus else dt
    h = torch.zeros(u.shape[0], u.shape[1], A.shape[1], dtype=torch.float64) if h0 is None else h0.double()
    ys = []
    for t in range(u.shape[-1]):
        h = torch.exp(dt[:, :, t, None] * A) * h + dt[:, :, t, None] * Bm[:, None, :, t] * u[:, :, t, None]
        ys.append(torch.einsum("bdn,bn->bd", h, Cm[:, :, t]))
    y = torch.stack(ys, -1) + (0 if D is None else D.double()[:, None] * u)
    return (y if z is None else y * F.silu(z.double())), h


def _mamba_inputs(batch, dim, steps, states, dtype, g, softplus=True):
    step = torch.exp(-4.5 + 1.5 * torch.tanh(torch.randn(batch, dim, steps, generator=g)))
    delta = torch.log(torch.expm1(step)) if softplus else step
    return dict(u=(0.5 * torch.randn(batch, dim, steps, generator=g)).to(dtype), delta=delta.to(dtype),
                A=-torch.exp(0.5 * torch.randn(dim, states, generator=g)),
                Bm=(0.5 * torch.randn(batch, states, steps, generator=g)).to(dtype),
                Cm=(0.5 * torch.randn(batch, states, steps, generator=g)).to(dtype))


def _scan_tol(ref, dtype, states):
    growth = max(1.0, states ** 0.5 / 2)
    if dtype == torch.float32:
        return 1e-5 * ref.abs() + 1e-5 * growth
    return 2.0 ** -7 * ref.abs() + 2e-2 * growth


_SCAN_SHAPES = [(1, 1, 1, 1), (2, 130, 600, 16), (1, 64, 1100, 4), (1, 20, 77, 64)]


@pytest.mark.parametrize("shape,options", [(s, o) for s in _SCAN_SHAPES for o in ("plain", "all")] +
                         [((1, 140, 90, 8), o) for o in ("softplus+bias", "skip+gate", "state")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selective_scan_matches_the_token_loop(shape, dtype, options):
    batch, dim, steps, states = shape
    g = torch.Generator().manual_seed(hash((shape, options)) % 2**31)
    softplus = options in ("softplus+bias", "all")
    x = _mamba_inputs(batch, dim, steps, states, dtype, g, softplus)
    D = torch.randn(dim, generator=g) if options in ("skip+gate", "all") else None
    z = torch.randn(batch, dim, steps, generator=g).to(dtype) if options in ("skip+gate", "all") else None
    bias = 0.5 * torch.randn(dim, generator=g) if softplus else None
    h0 = torch.randn(batch, dim, states, generator=g) if options in ("state", "all") else None
    y, last = nt.selective_scan(x["u"], x["delta"], x["A"], x["Bm"], x["Cm"], D, z, bias, softplus,
                                return_last_state=True, initial_state=h0)
    ref_y, ref_last = _selective_reference(x["u"], x["delta"], x["A"], x["Bm"], x["Cm"], D, z, bias, softplus, h0)
    assert y.dtype == dtype and last.dtype == torch.float32
    assert ((y.double() - ref_y).abs() <= _scan_tol(ref_y, dtype, states)).all()
    assert ((last.double() - ref_last).abs() <= _scan_tol(ref_last, torch.float32, 1)).all()


def test_selective_scan_chunked_prefill_continues_from_the_last_state():
    # Two halves, the second started from the first's last state, give the whole sequence's y and
    # state: the carried state is exactly what a next call needs (chunked prefill).
    g = torch.Generator().manual_seed(11)
    x = _mamba_inputs(2, 140, 1300, 16, torch.float32, g)
    bias = 0.5 * torch.randn(140, generator=g)
    whole, last = nt.selective_scan(**_positional(x), delta_bias=bias, delta_softplus=True, return_last_state=True)
    first = {k: (v[..., :700] if v.dim() == 3 else v) for k, v in x.items()}
    second = {k: (v[..., 700:] if v.dim() == 3 else v) for k, v in x.items()}
    y1, mid = nt.selective_scan(**_positional(first), delta_bias=bias, delta_softplus=True, return_last_state=True)
    y2, end = nt.selective_scan(**_positional(second), delta_bias=bias, delta_softplus=True, return_last_state=True,
                                initial_state=mid)
    torch.testing.assert_close(torch.cat((y1, y2), -1), whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(end, last, rtol=1e-5, atol=1e-5)


def _positional(x):
    return dict(u=x["u"], delta=x["delta"], A=x["A"], B=x["Bm"], C=x["Cm"])


def test_a_mamba_mixer_with_nikki_ops_matches_plain_torch():
    # The selective-SSM path of a Mamba block (in_proj -> causal conv + SiLU -> x_proj -> dt_proj
    # -> selective scan gated by z -> out_proj) with nikki's causal_conv1d and selective_scan,
    # against the same block in float64 torch.
    torch.manual_seed(0)
    d_model, d_inner, states, rank, steps = 32, 64, 16, 4, 96
    in_proj = torch.nn.Linear(d_model, 2 * d_inner, bias=False)
    conv_w, conv_b = 0.3 * torch.randn(d_inner, 4), 0.1 * torch.randn(d_inner)
    x_proj = torch.nn.Linear(d_inner, rank + 2 * states, bias=False)
    dt_proj = torch.nn.Linear(rank, d_inner)
    A = -torch.exp(torch.rand(d_inner, states) * 2)
    D = torch.ones(d_inner)
    out_proj = torch.nn.Linear(d_inner, d_model, bias=False)
    hidden = torch.randn(2, steps, d_model)

    def mixer(conv, scan):
        xz = in_proj(hidden).transpose(1, 2)
        x, z = xz.chunk(2, dim=1)
        x = conv(x)
        dbc = x_proj(x.transpose(1, 2))
        dt, Bm, Cm = torch.split(dbc, [rank, states, states], dim=-1)
        delta = (dt @ dt_proj.weight.T).transpose(1, 2)
        y = scan(x, delta, Bm.transpose(1, 2).contiguous(), Cm.transpose(1, 2).contiguous(), z)
        return out_proj(y.transpose(1, 2))

    with torch.no_grad():
        got = mixer(lambda x: nt.causal_conv1d(x, conv_w, conv_b, activation="silu"),
                    lambda x, d, b, c, z: nt.selective_scan(x, d, A, b, c, D, z, dt_proj.bias, True))
        want = mixer(lambda x: F.silu(F.conv1d(F.pad(x, (3, 0)), conv_w[:, None], conv_b, groups=d_inner)),
                     lambda x, d, b, c, z: _selective_reference(x, d, A, b, c, D, z, dt_proj.bias, True)[0].float())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)



# --- selective_scan_bwd -------------------------------------------------------------------------
# Against torch.autograd through the float64 token loop above, on the same dtype-rounded inputs.
# The kernel's sums are fp32 and each gradient is rounded once to its dtype; sums over channels
# (grad_Bm, grad_Cm) and over time (grad_A, grad_Dskip, grad_delta_bias) are judged against the
# largest gradient of each output.

_SCAN_GRADS = ("grad_u", "grad_delta", "grad_A", "grad_Bm", "grad_Cm", "grad_Dskip", "grad_z", "grad_delta_bias",
               "grad_h0")


def _scan_inputs_with_options(batch, dim, steps, states, dtype, g, softplus, gate):
    x = _mamba_inputs(batch, dim, steps, states, dtype, g, softplus)
    x["D"] = torch.randn(dim, generator=g)
    x["z"] = torch.randn(batch, dim, steps, generator=g).to(dtype)
    x["delta_bias"] = 0.5 * torch.randn(dim, generator=g) if softplus else 0.01 * torch.randn(dim, generator=g).abs()
    x["h0"] = torch.randn(batch, dim, states, generator=g)
    return x


def _check_selective_scan_bwd(shape, dtype, softplus, gate, seed):
    batch, dim, steps, states = shape
    g = torch.Generator().manual_seed(seed)
    x = _scan_inputs_with_options(batch, dim, steps, states, dtype, g, softplus, gate)
    grad_y = torch.randn(batch, dim, steps, generator=g).to(dtype)
    grad_last = torch.randn(batch, dim, states, generator=g)
    order = ("u", "delta", "A", "Bm", "Cm", "D", "z", "delta_bias", "h0")
    got = K.selective_scan_bwd(*(x[k] for k in order), grad_y, grad_last, delta_softplus=softplus, gate=gate)
    leaves = {k: x[k].double().requires_grad_() for k in order}
    y, last = _selective_reference(leaves["u"], leaves["delta"], leaves["A"], leaves["Bm"], leaves["Cm"], leaves["D"],
                                   leaves["z"] if gate else None, leaves["delta_bias"], softplus, leaves["h0"])
    want = torch.autograd.grad((y, last), list(leaves.values()), (grad_y.double(), grad_last.double()),
                               allow_unused=True)
    rtol = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
    for name, a, e, k in zip(_SCAN_GRADS, got, want, order):
        e = torch.zeros_like(leaves[k]) if e is None else e
        assert a.dtype == x[k].dtype and a.shape == x[k].shape, name
        tol = rtol[a.dtype]
        peak = max(1e-3, float(e.abs().max()))
        torch.testing.assert_close(a.double(), e, rtol=tol, atol=tol * peak,
                                   msg=lambda m: f"{name} of {shape} {dtype} softplus={softplus} gate={gate}: {m}")


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 130, 600, 16), (1, 64, 1100, 4), (1, 20, 77, 64),
                                   (2, 200, 513, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("softplus,gate", [(True, True), (False, False)])
def test_selective_scan_backward_matches_autograd_through_the_loop(shape, dtype, softplus, gate):
    _check_selective_scan_bwd(shape, dtype, softplus, gate, seed=hash((shape, softplus)) % 2**31)


@pytest.mark.parametrize("seed", range(4))
def test_selective_scan_backward_on_drawn_shapes(seed):
    r = np.random.default_rng(seed)
    shape = (int(r.integers(1, 3)), int(r.integers(1, 200)), int(r.integers(1, 700)), int(r.integers(1, 65)))
    dtype = torch.float32 if seed % 2 else torch.bfloat16
    _check_selective_scan_bwd(shape, dtype, bool(r.integers(0, 2)), bool(r.integers(0, 2)), seed)


@pytest.mark.parametrize("optional", [False, True])
def test_torch_selective_scan_is_differentiable(optional):
    g = torch.Generator().manual_seed(12)
    x = _scan_inputs_with_options(2, 70, 150, 8, torch.float32, g, True, True)
    names = ("u", "delta", "A", "Bm", "Cm") + (("D", "z", "delta_bias", "h0") if optional else ())
    leaves = {k: x[k].clone().requires_grad_() for k in names}
    extra = {k: leaves.get(k) for k in ("D", "z", "delta_bias", "h0")}
    y, last = nt.selective_scan(leaves["u"], leaves["delta"], leaves["A"], leaves["Bm"], leaves["Cm"], extra["D"],
                                extra["z"], extra["delta_bias"], True, return_last_state=True,
                                initial_state=extra["h0"])
    weights, state_weights = torch.randn(y.shape, generator=g), torch.randn(last.shape, generator=g)
    got = torch.autograd.grad((y * weights).sum() + (last * state_weights).sum(), list(leaves.values()))
    doubles = {k: v.detach().double().requires_grad_() for k, v in leaves.items()}
    dx = {k: doubles.get(k) for k in ("D", "z", "delta_bias", "h0")}
    ref_y, ref_last = _selective_reference(doubles["u"], doubles["delta"], doubles["A"], doubles["Bm"], doubles["Cm"],
                                           dx["D"], dx["z"], dx["delta_bias"], True, dx["h0"])
    want = torch.autograd.grad((ref_y * weights.double()).sum() + (ref_last * state_weights.double()).sum(),
                               list(doubles.values()))
    for name, a, e in zip(names, got, want):
        peak = float(e.abs().max())
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-4 * peak, msg=lambda m: f"{name}: {m}")


def test_selective_scan_backward_argument_errors():
    u, A, Bm, D, h0 = torch.zeros(1, 8, 16), torch.zeros(8, 4), torch.zeros(1, 4, 16), torch.zeros(8), torch.zeros(1, 8, 4)
    with pytest.raises(nikki.KernelError, match=r"selective_scan_bwd: grad_y must be y's \[1, 8, 16\] float32, got "
                                                r"\[1, 8, 16\] bfloat16") as err:
        K.selective_scan_bwd(u, u, A, Bm, Bm, D, u, D, h0, u.bfloat16(), h0)
    assert err.value.file == __file__ and "K.selective_scan_bwd(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"selective_scan_bwd: grad_last_state must be last_state's "
                                                r"\[1, 8, 4\] float32, got \[1, 8, 5\] float32"):
        K.selective_scan_bwd(u, u, A, Bm, Bm, D, u, D, h0, u, torch.zeros(1, 8, 5))
    with pytest.raises(nikki.KernelError, match=r"selective_scan_bwd: 'h0' must be \[1, 8, 4\]"):
        K.selective_scan_bwd(u, u, A, Bm, Bm, D, u, D, torch.zeros(1, 8, 5), u, h0)


def test_selective_scan_argument_errors_name_the_argument_and_the_limit():
    u, A, Bm = torch.zeros(1, 8, 16), torch.zeros(8, 4), torch.zeros(1, 4, 16)
    D, h0 = torch.zeros(8), torch.zeros(1, 8, 4)
    with pytest.raises(nikki.KernelError, match=r"selective_scan: 'Bm' must be \[1, 4, 16\] \(\[batch, states, "
                                                r"length\]\), got \[1, 5, 16\]") as err:
        K.selective_scan(u, u, A, torch.zeros(1, 5, 16), Bm, D, u, D, h0)
    assert err.value.file == __file__ and "K.selective_scan(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"selective_scan: 'h0' must be \[1, 8, 4\] \(\[batch, channels, "
                                                r"states\]\), got \[1, 8, 5\]"):
        K.selective_scan(u, u, A, Bm, Bm, D, u, D, torch.zeros(1, 8, 5))
    with pytest.raises(nikki.KernelError, match=r"selective_scan: 'Dskip' must be \[8\] \(one per channel\), got \[7\]"):
        K.selective_scan(u, u, A, Bm, Bm, torch.zeros(7), u, D, h0)
    with pytest.raises(nikki.KernelError, match=r"selective_scan: A must be \[channels, states\] with u's 8 "
                                                r"channels, got \[4, 8\]"):
        K.selective_scan(u, u, torch.zeros(4, 8), Bm, Bm, D, u, D, h0)
    with pytest.raises(nikki.KernelError, match=r"selective_scan: A has 65 states, more than the limit") as err:
        K.selective_scan(u, u, torch.zeros(8, 65), torch.zeros(1, 65, 16), torch.zeros(1, 65, 16), D, u, D,
                         torch.zeros(1, 8, 65))
    assert "at most 64 states" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"selective_scan: 'delta' must have u's dtype float32, got bfloat16"):
        K.selective_scan(u, u.bfloat16(), A, Bm, Bm, D, u, D, h0)
    with pytest.raises(nikki.KernelError, match=r"selective_scan: 'A' must be float32 or u's dtype bfloat16, "
                                                r"got float16"):
        b16 = u.bfloat16()
        K.selective_scan(b16, b16, A.half(), Bm.bfloat16(), Bm.bfloat16(), D, b16, D, h0)
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.selective_scan: C must be a \[batch, N, L\] = "
                                                r"\(1, 4, 16\) tensor \(one group\)"):
        nt.selective_scan(u, u, A, Bm, torch.zeros(1, 2, 4, 16))
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.selective_scan: z must be None or a tensor of shape "
                                                r"\(1, 8, 16\)"):
        nt.selective_scan(u, u, A, Bm, Bm, z=torch.zeros(8, 16))
