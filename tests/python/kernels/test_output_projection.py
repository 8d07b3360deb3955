"""nikki's output_projection kernels against PyTorch (attn @ w_o + bias + residual, and autograd).

Tolerances: the kernels accumulate in fp32 and round once. Against the float64 result, an fp32
output is within K fp32 roundings of the sum of |terms| (2e-6 of that sum is generous for K up to
a few thousand); a bf16 output within one bf16 rounding (2^-8 relative) plus the fp32 error.
"""

import linecache

import pytest

torch = pytest.importorskip("torch")

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402


def _inputs(b, s, k, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    attn = torch.randn(b, s, k, generator=g).to(dtype)
    w_o = (torch.randn(k, n, generator=g) / k ** 0.5).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    residual = torch.randn(b, s, n, generator=g).to(dtype)
    return attn, w_o, bias, residual


def _bound(terms_abs, dtype, value_abs):
    """|got - want| allowed: fp32 accumulation error on the summed magnitudes, plus one rounding to
    the output dtype for 16-bit outputs."""
    rounding = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11 if dtype == torch.float16 else 0.0
    return 2e-6 * terms_abs + rounding * value_abs + 1e-30


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 5, 64, 48), (2, 260, 384, 520), (1, 129, 1000, 130)])
def test_forward_matches_the_float64_product(shape, dtype):
    attn, w_o, bias, residual = _inputs(*shape, dtype)
    got = K.output_projection(attn, w_o, bias, residual)
    a, w = attn.double(), w_o.double()
    want = a @ w + bias.double() + residual.double()
    terms = a.abs() @ w.abs() + bias.double().abs() + residual.double().abs()
    err = (got.double() - want).abs()
    assert got.dtype == dtype and got.shape == want.shape
    assert bool((err <= _bound(terms, dtype, want.abs())).all()), f"worst error {float(err.max())}"


def test_autograd_of_the_torch_wrapper_matches_torch():
    attn, w_o, bias, residual = (t.requires_grad_() for t in _inputs(2, 70, 96, 130, torch.float32, seed=1))
    out = nt.output_projection(attn, w_o, bias, residual)
    ref = [t.detach().double().requires_grad_() for t in (attn, w_o, bias, residual)]
    want = ref[0] @ ref[1] + ref[2] + ref[3]
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    out.backward(grad_out)
    want.backward(grad_out.double())
    for got, r in zip((attn, w_o, bias, residual), ref):
        torch.testing.assert_close(got.grad.double(), r.grad, rtol=1e-5, atol=2e-5)
    # grad_residual is grad_out itself, bit for bit.
    assert torch.equal(residual.grad, grad_out)


def test_wrapper_without_bias_or_residual_is_a_plain_projection():
    attn, w_o, _, _ = _inputs(1, 40, 64, 32, torch.float32, seed=3)
    torch.testing.assert_close(nt.output_projection(attn, w_o), attn @ w_o, rtol=1e-5, atol=1e-5)


def test_torch_compile_fullgraph_matches_eager():
    attn, w_o, bias, residual = _inputs(1, 16, 64, 64, torch.float32, seed=4)
    compiled = torch.compile(lambda *a: nt.output_projection(*a), fullgraph=True, backend="eager")
    assert torch.equal(compiled(attn, w_o, bias, residual), nt.output_projection(attn, w_o, bias, residual))


def test_argument_errors_name_the_shapes_at_the_call():
    attn, w_o, bias, residual = _inputs(1, 8, 32, 16, torch.float32)
    with pytest.raises(nikki.KernelError, match=r"output_projection: attn must be 3-D \[batch, seq, heads \* head_dim\], "
                                                r"got \[8, 32\]") as err:
        K.output_projection(attn[0], w_o, bias, residual)
    assert err.value.file == __file__ and "K.output_projection(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"w_o must be \[K, N\] with K = attn's last dim 32, got \[31, 16\]"):
        K.output_projection(attn, w_o[:31], bias, residual)
    with pytest.raises(nikki.KernelError, match=r"w_o must have attn's dtype float32, got bfloat16"):
        K.output_projection(attn, w_o.bfloat16(), bias, residual)
    with pytest.raises(nikki.KernelError, match=r"bias must be \[16\] float32, got \[15\] float32"):
        K.output_projection(attn, w_o, bias[:15], residual)
    with pytest.raises(nikki.KernelError, match=r"residual must be \[1, 8, 16\] float32, got \[1, 8, 15\] float32"):
        K.output_projection(attn, w_o, bias, residual[..., :15])
    with pytest.raises(nikki.KernelError, match=r"output_projection_bwd: grad_out must be \[1, 8, 16\] float32, "
                                                r"got \[1, 7, 16\] float32"):
        K.output_projection_bwd(attn, w_o, residual[:, :7])
