"""nikki.kernels.causal_conv1d / causal_conv1d_bwd, conv1d / conv1d_bwd and their nikki.torch wrappers against PyTorch:
F.conv1d with groups=C on x left-padded with K - 1 tokens (zeros or the initial state), then SiLU,
computed in float64 on the same (dtype-rounded) inputs; gradients from torch.autograd.

Tolerances: the kernel sums K products in fp32 PSUM and rounds once to the output dtype (bf16:
2^-8 relative). The backward rounds g = grad_out * silu'(z) to the input dtype (as a 16-bit
autograd does) before its sums: grad_x's error grows like sqrt(K) roundings of one term, the tap
and bias gradients' (sums of B * L products, each rounded) like sqrt(B * L).
"""

import linecache

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402


def _reference(x, weight, bias, state, silu):
    """The causal conv in float64: x left-padded with the state's last K - 1 tokens."""
    history = weight.shape[1] - 1
    padded = F.pad(state.double(), (max(0, history - state.shape[2]), 0))
    xs = torch.cat((padded[..., padded.shape[2] - history:], x.double()), -1)
    z = F.conv1d(xs, weight.double()[:, None], bias.double(), groups=x.shape[1])
    return F.silu(z) if silu else z


def _inputs(B, C, L, taps, S, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype) for shape in ((B, C, L), (C, taps), (C,), (B, C, S))]


def _close(got, ref, dtype, terms=1):
    rtol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}[dtype]
    atol = rtol * max(1.0, terms ** 0.5 / 2)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("B, C, L, taps, S", [(2, 130, 700, 4, 3), (1, 64, 100, 1, 1), (2, 20, 300, 64, 63),
                                             (3, 5, 2, 5, 9), (1, 3, 4200, 3, 2)])
@pytest.mark.parametrize("dtype, silu", [(torch.float32, False), (torch.bfloat16, True)])
def test_forward_matches_torch(B, C, L, taps, S, dtype, silu):
    x, w, b, state = _inputs(B, C, L, taps, S, dtype)
    _close(K.causal_conv1d(x, w, b, state, silu=silu), _reference(x, w, b, state, silu), dtype)


def test_chunked_prefill_equals_one_pass():
    # A sequence in two chunks, the second given the first's last K - 1 tokens as its state, is
    # the sequence in one pass, bit for bit (each output sums the same products in the same order).
    x, w, b, _ = _inputs(2, 150, 1000, 4, 3, torch.bfloat16)
    zeros = torch.zeros(2, 150, 3, dtype=torch.bfloat16)
    whole = K.causal_conv1d(x, w, b, zeros, silu=True)
    first = K.causal_conv1d(x[..., :600].contiguous(), w, b, zeros, silu=True)
    second = K.causal_conv1d(x[..., 600:].contiguous(), w, b, x[..., 597:600].contiguous(), silu=True)
    assert torch.equal(torch.cat((first, second), -1), whole)


@pytest.mark.parametrize("B, C, L, taps, S", [(2, 130, 700, 4, 3), (1, 64, 100, 1, 1), (2, 20, 300, 64, 10),
                                             (1, 3, 2100, 3, 5), (3, 5, 2, 5, 4)])
@pytest.mark.parametrize("dtype, silu", [(torch.float32, False), (torch.bfloat16, True)])
def test_backward_matches_autograd(B, C, L, taps, S, dtype, silu):
    x, w, b, state = _inputs(B, C, L, taps, S, dtype, seed=1)
    grad_out = torch.randn(B, C, L, generator=torch.Generator().manual_seed(2)).to(dtype)
    leaves = [t.double().requires_grad_() for t in (x, w, b, state)]
    want = torch.autograd.grad(_reference(*leaves, silu), leaves, grad_out.double())
    got = K.causal_conv1d_bwd(x, w, b, state, grad_out, silu=silu)
    for name, g, r in zip(("grad_x", "grad_weight", "grad_bias", "grad_initial_state"), got, want):
        assert g.shape == r.shape, name
        # grad_x and grad_initial_state sum K products of weights and g rounded to the dtype.
        _close(g, r, dtype, terms=B * L if name in ("grad_weight", "grad_bias") else 16 * taps)


def test_state_tokens_before_the_last_k_minus_1_get_no_gradient():
    x, w, b, state = _inputs(1, 10, 50, 3, 7, torch.float32)
    grad_state = K.causal_conv1d_bwd(x, w, b, state, torch.ones_like(x), silu=False)[3]
    assert torch.equal(grad_state[..., :5], torch.zeros(1, 10, 5))
    # Each of the last two state tokens reaches the first outputs through the taps after it.
    torch.testing.assert_close(grad_state[..., 5], w[:, 0][None], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_state[..., 6], (w[:, 0] + w[:, 1])[None], rtol=1e-6, atol=1e-6)


def _assert_same_gradients(out, want, leaves, generator):
    """The gradients of a random weighting of `out` and of `want` with respect to `leaves` agree."""
    weights = torch.randn(out.shape, generator=generator)
    got = torch.autograd.grad((out * weights).sum(), leaves)
    expected = torch.autograd.grad((want * weights).sum(), leaves)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_torch_wrapper_matches_conv1d_with_autograd(bias, activation):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 96, 77, generator=g, requires_grad=True)
    w = torch.randn(96, 1, 4, generator=g, requires_grad=True)  # torch's depthwise conv1d weight
    b = torch.randn(96, generator=g, requires_grad=True) if bias else None
    out = nt.causal_conv1d(x, w, b, activation=activation)
    want = F.conv1d(F.pad(x, (3, 0)), w, b, groups=96)
    want = F.silu(want) if activation else want
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    _assert_same_gradients(out, want, [t for t in (x, w, b) if t is not None], g)


def test_torch_wrapper_initial_state_gradient():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1, 16, 40, generator=g, requires_grad=True)
    w = torch.randn(16, 4, generator=g, requires_grad=True)
    state = torch.randn(1, 16, 3, generator=g, requires_grad=True)
    out = nt.causal_conv1d(x, w, initial_state=state, activation="silu")
    want = F.silu(F.conv1d(torch.cat((state, x), -1), w[:, None], groups=16))
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    got = torch.autograd.grad(out.sum(), (x, w, state))
    expected = torch.autograd.grad(want.sum(), (x, w, state))
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)


def test_argument_errors_name_the_argument_and_the_limit():
    x = torch.zeros(1, 8, 16)
    b, state = torch.zeros(8), torch.zeros(1, 8, 3)
    with pytest.raises(nikki.KernelError, match=r"causal_conv1d: weight must be \[channels, taps\] with x's 8 "
                                                r"channels, got \[6, 4\]") as err:
        K.causal_conv1d(x, torch.zeros(6, 4), b, state)
    assert err.value.file == __file__ and "K.causal_conv1d(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"causal_conv1d: weight has 65 taps, more than the limit") as err:
        K.causal_conv1d(x, torch.zeros(8, 65), b, state)
    assert "at most 64 taps" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"causal_conv1d: x must be 3-D \[batch, channels, length\], "
                                                r"got \[8, 16\]"):
        K.causal_conv1d(torch.zeros(8, 16), torch.zeros(8, 4), b, state)
    with pytest.raises(nikki.KernelError, match=r"causal_conv1d: bias must be \[8\] \(one per channel\), got \[4\]"):
        K.causal_conv1d(x, torch.zeros(8, 4), torch.zeros(4), state)
    with pytest.raises(nikki.KernelError, match=r"causal_conv1d: initial_state must be \[1, 8, S\] .* got \[2, 8, 3\]"):
        K.causal_conv1d(x, torch.zeros(8, 4), b, torch.zeros(2, 8, 3))
    with pytest.raises(nikki.KernelError, match=r"causal_conv1d: 'weight' must have x's dtype float32, got bfloat16"):
        K.causal_conv1d(x, torch.zeros(8, 4, dtype=torch.bfloat16), b, state)
    with pytest.raises(nikki.KernelError, match=r"causal_conv1d_bwd: grad_out must have x's shape and dtype "
                                                r"\[1, 8, 16\] float32, got \[1, 8, 15\] float32"):
        K.causal_conv1d_bwd(x, torch.zeros(8, 4), b, state, torch.zeros(1, 8, 15))
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.causal_conv1d: weight must be a \[C, K\] or "
                                                r"\[C, 1, K\] tensor with C = 8, got shape \(8, 2, 4\)"):
        nt.causal_conv1d(x, torch.zeros(8, 2, 4))
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.causal_conv1d: activation must be None, \"silu\""):
        nt.causal_conv1d(x, torch.zeros(8, 4), activation="gelu")


def _conv1d_reference(x, w, b, stride=1, padding=0, dilation=1, groups=1, activation=0):
    out = F.conv1d(x.double(), w.double(), b.double(), stride, padding, dilation, groups)
    return F.silu(out) if activation == 1 else F.gelu(out) if activation == 2 else out


@pytest.mark.parametrize("x_shape, w_shape, params", [
    ((2, 130, 300), (70, 130, 3), {"padding": 1, "activation": 1}),
    ((1, 64, 100), (32, 64, 1), {}),
    ((1, 40, 257), (20, 20, 5), {"stride": 2, "dilation": 2, "groups": 2, "padding": 3, "activation": 2}),
    ((2, 16, 50), (16, 1, 4), {"groups": 16, "padding": 2}),
    ((1, 8, 200), (8, 8, 64), {"activation": 1}),
    ((1, 300, 130), (210, 100, 7), {"groups": 3, "stride": 3, "padding": 6, "dilation": 3}),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv1d_matches_torch(x_shape, w_shape, params, dtype):
    g = torch.Generator().manual_seed(5)
    x, w, b = (torch.randn(s, generator=g).to(dtype) for s in (x_shape, w_shape, w_shape[:1]))
    ref = _conv1d_reference(x, w, b, **params)
    _close(K.conv1d(x, w, b, **params), ref, dtype, terms=w_shape[1] * w_shape[2] * 4)


@pytest.mark.parametrize("bias", [False, True])
def test_torch_conv1d_wrapper(bias):
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(2, 48, 90, generator=g), torch.randn(24, 16, 3, generator=g)
    b = torch.randn(24, generator=g) if bias else None
    got = nt.conv1d(x, w, b, stride=2, padding=1, groups=3, activation="gelu")
    torch.testing.assert_close(got, F.gelu(F.conv1d(x, w, b, stride=2, padding=1, groups=3)), rtol=1e-5, atol=1e-5)


def test_conv1d_argument_errors():
    x, b = torch.zeros(1, 8, 32), torch.zeros(4)
    with pytest.raises(nikki.KernelError, match=r"conv1d: weight must be \[C_out, C_in / groups, K\] = \[4, 8, K\] "
                                                r"for x's 8 channels and groups = 1, got \[4, 6, 3\]") as err:
        K.conv1d(x, torch.zeros(4, 6, 3), b)
    assert err.value.file == __file__ and "K.conv1d(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"conv1d: weight has 65 taps, more than the limit") as err:
        K.conv1d(torch.zeros(1, 8, 100), torch.zeros(4, 8, 65), b)
    assert "at most 64 taps" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"conv1d: groups = 3 does not divide x's 8 input channels and "
                                                r"weight's 4 output channels") as err:
        K.conv1d(x, torch.zeros(4, 2, 3), b, groups=3)
    assert "each group convolves C_in / groups inputs" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"conv1d: the dilated filter spans 9 columns, more than the padded "
                                                r"input's 6"):
        K.conv1d(torch.zeros(1, 8, 6), torch.zeros(4, 8, 5), b, dilation=2)
    with pytest.raises(nikki.KernelError, match=r"conv1d: stride and dilation must be at least 1"):
        K.conv1d(x, torch.zeros(4, 8, 3), b, stride=0)
    with pytest.raises(nikki.KernelError, match=r"conv1d: activation must be 0 \(none\), 1 \(SiLU\) or 2 \(GELU\)"):
        K.conv1d(x, torch.zeros(4, 8, 3), b, activation=3)
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.conv1d: activation must be None, \"silu\" or \"gelu\""):
        nt.conv1d(x, torch.zeros(4, 8, 3), activation="relu")


# --- conv1d_bwd -------------------------------------------------------------------------------------
# Against torch.autograd of F.conv1d (then the activation) in float64 on the same dtype-rounded
# inputs. The kernel's sums are fp32 (rounded once); with an activation g = grad_out * act'(z) is
# rounded to the dtype first, as autograd in that dtype does. Errors are judged against the largest
# gradient of each output: a sum of many products is exact to a few roundings of its magnitude.

def _close_to_peak(got, ref, dtype, what):
    rtol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}[dtype]
    assert got.dtype == dtype and got.shape == ref.shape, what
    peak = max(1.0, float(ref.abs().max()))
    torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=rtol * peak, msg=lambda m: f"{what}: {m}")


def _conv1d_grads(x, w, b, grad_out, **params):
    leaves = [t.double().requires_grad_() for t in (x, w, b)]
    return torch.autograd.grad(_conv1d_reference(*leaves, **params), leaves, grad_out.double())


def _check_conv1d_bwd(x_shape, w_shape, params, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x, w, b = (torch.randn(s, generator=g).to(dtype) for s in (x_shape, w_shape, w_shape[:1]))
    out_shape = F.conv1d(x.float(), w.float(), None, params.get("stride", 1), params.get("padding", 0),
                         params.get("dilation", 1), params.get("groups", 1)).shape
    grad_out = torch.randn(out_shape, generator=g).to(dtype)
    got = K.conv1d_bwd(x, w, b, grad_out, **params)
    want = _conv1d_grads(x, w, b, grad_out, **params)
    for name, a, e in zip(("grad_x", "grad_weight", "grad_bias"), got, want):
        _close_to_peak(a, e, dtype, f"{name} of x {x_shape}, weight {w_shape}, {params}")


@pytest.mark.parametrize("x_shape, w_shape, params", [
    ((2, 130, 300), (70, 130, 3), {"padding": 1, "activation": 1}),              # channel and length tails
    ((1, 64, 100), (32, 64, 1), {}),                                             # pointwise
    ((1, 40, 257), (20, 20, 5), {"stride": 2, "dilation": 2, "groups": 2, "padding": 3, "activation": 2}),
    ((2, 16, 50), (16, 1, 4), {"groups": 16, "padding": 2}),                     # depthwise
    ((2, 24, 61), (24, 1, 3), {"groups": 24, "stride": 5, "padding": 1, "activation": 1}),  # stride > K
    ((1, 10, 90), (7, 10, 2), {"stride": 7, "dilation": 3}),                     # stride > span: gaps
    ((1, 8, 200), (8, 8, 64), {"activation": 1}),                                # K = 64
    ((1, 300, 130), (210, 100, 7), {"groups": 3, "stride": 3, "padding": 6, "dilation": 3}),
    ((1, 20, 2500), (140, 20, 3), {"padding": 1}),                               # several chunks
    ((1, 260, 70), (129, 260, 2), {"padding": 1, "dilation": 5}),                # C_in, C_out tails past 128
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv1d_backward_matches_autograd(x_shape, w_shape, params, dtype):
    _check_conv1d_bwd(x_shape, w_shape, params, dtype, seed=7)


@pytest.mark.parametrize("seed", range(6))
def test_conv1d_backward_on_drawn_shapes(seed):
    # Any geometry: channels (with and without tails), groups up to depthwise, strides past the
    # filter, dilations, paddings past the filter, either activation, in fp32 and bf16.
    r = np.random.default_rng(seed)
    groups = int(r.choice([1, 2, 3, 0]))
    cig, cog = int(r.integers(1, 150)), int(r.integers(1, 150))
    if groups == 0:  # depthwise
        groups, cig, cog = int(r.integers(2, 40)), 1, 1
    taps, stride, dilation = int(r.integers(1, 8)), int(r.integers(1, 9)), int(r.integers(1, 4))
    padding = int(r.integers(0, taps + 2))
    length = max(int(r.integers(1, 700)), dilation * (taps - 1) + 1 - 2 * padding)
    params = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
              "activation": int(r.integers(0, 3))}
    dtype = torch.float32 if seed % 2 else torch.bfloat16
    _check_conv1d_bwd((int(r.integers(1, 3)), cig * groups, length), (cog * groups, cig, taps), params, dtype, seed)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("activation", [None, "silu", "gelu"])
def test_torch_conv1d_wrapper_is_differentiable(bias, activation):
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 48, 90, generator=g, requires_grad=True)
    w = torch.randn(24, 16, 3, generator=g, requires_grad=True)
    b = torch.randn(24, generator=g, requires_grad=True) if bias else None
    out = nt.conv1d(x, w, b, stride=2, padding=1, groups=3, activation=activation)
    want = F.conv1d(x, w, b, stride=2, padding=1, groups=3)
    want = F.silu(want) if activation == "silu" else F.gelu(want) if activation == "gelu" else want
    _assert_same_gradients(out, want, [t for t in (x, w, b) if t is not None], g)


def test_torch_conv1d_trains_under_torch_compile():
    # A strided conv layer under torch.compile(fullgraph=True): one custom op forward, the backward
    # kernel in autograd; the gradients match eager torch.
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 12, 64, generator=g, requires_grad=True)
    w = torch.randn(20, 12, 5, generator=g, requires_grad=True)
    b = torch.randn(20, generator=g, requires_grad=True)

    def loss(conv):
        return conv(x, w, b).pow(2).mean()

    compiled = torch.compile(lambda x, w, b: nt.conv1d(x, w, b, stride=2, padding=2, dilation=2, activation="silu"),
                             fullgraph=True)
    got = torch.autograd.grad(loss(compiled), (x, w, b))
    expected = torch.autograd.grad(loss(lambda x, w, b: F.silu(F.conv1d(x, w, b, 2, 2, 2))), (x, w, b))
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


def test_conv1d_backward_argument_errors():
    x, w, b = torch.zeros(1, 8, 32), torch.zeros(4, 8, 3), torch.zeros(4)
    with pytest.raises(nikki.KernelError, match=r"conv1d_bwd: grad_out must be conv1d's out, \[1, 4, 15\] float32 "
                                                r"\(L_out from L, stride, padding, dilation and K\), got "
                                                r"\[1, 4, 30\] float32") as err:
        K.conv1d_bwd(x, w, b, torch.zeros(1, 4, 30), stride=2)
    assert err.value.file == __file__ and "K.conv1d_bwd(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"conv1d_bwd: grad_out must be conv1d's out, \[1, 4, 30\] float32 "
                                                r".* got \[1, 4, 30\] bfloat16"):
        K.conv1d_bwd(x, w, b, torch.zeros(1, 4, 30, dtype=torch.bfloat16))
    with pytest.raises(nikki.KernelError, match=r"conv1d_bwd: groups = 3 does not divide x's 8 input channels"):
        K.conv1d_bwd(x, torch.zeros(4, 2, 3), b, torch.zeros(1, 4, 30), groups=3)
