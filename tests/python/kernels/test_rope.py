"""nikki's rope kernels against the Hugging Face formula written in PyTorch.

apply_rotary_pos_emb computes q * cos + rotate_half(q) * sin in q's dtype: each product and the
sum are rounded to that dtype. The kernel rounds the same three values the same way when cos has
q's dtype (the negation inside rotate_half is exact), so in bf16 it must match torch bit for bit,
forward and backward (the gradient is g * cos plus the rotated g * sin, again two rounded
products and a rounded sum). In float32 with float32 tables the same holds; against the float64
formula the tolerance is a few float32 roundings of values of magnitude |x| (|cos|, |sin| <= 1).
"""

import linecache

import pytest

torch = pytest.importorskip("torch")

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402


def _rotate(x, interleaved):
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def _hf_apply(x, cos, sin, interleaved=False):
    """Hugging Face's apply_rotary_pos_emb for one of q, k, with partial rotary over cos's last dim."""
    r = cos.shape[-1]
    cos, sin = (t.unsqueeze(1) if t.dim() == 3 else t for t in (cos, sin))
    xr, xp = x[..., :r], x[..., r:]
    return torch.cat((xr * cos + _rotate(xr, interleaved) * sin, xp), -1)


def _rotary_tables(batch, seq, rot_dim, dtype, interleaved=False, base=10000.0, seed=0):
    """cos, sin [B, S, r] as a Llama-style rotary embedding builds them from per-sequence positions."""
    g = torch.Generator().manual_seed(seed)
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    positions = torch.arange(seq, dtype=torch.float64)[None] + torch.randint(0, 500, (batch, 1), generator=g)
    freqs = positions[..., None] * inv_freq
    emb = freqs.repeat_interleave(2, -1) if interleaved else torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half_split", "interleaved"])
def test_bf16_forward_and_backward_match_torch_bit_for_bit(interleaved):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 8, 200, 128, generator=g).bfloat16().requires_grad_()
    k = torch.randn(2, 2, 200, 128, generator=g).bfloat16().requires_grad_()
    cos, sin = _rotary_tables(2, 200, 128, torch.bfloat16, interleaved)
    q_embed, k_embed = nt.apply_rotary_pos_emb(q, k, cos, sin, interleaved=interleaved)
    qr, kr = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    want_q, want_k = _hf_apply(qr, cos, sin, interleaved), _hf_apply(kr, cos, sin, interleaved)
    assert torch.equal(q_embed, want_q) and torch.equal(k_embed, want_k)
    wq, wk = torch.randn(q.shape, generator=g).bfloat16(), torch.randn(k.shape, generator=g).bfloat16()
    ((q_embed * wq).sum() + (k_embed * wk).sum()).backward()
    ((want_q * wq).sum() + (want_k * wk).sum()).backward()
    assert torch.equal(q.grad, qr.grad) and torch.equal(k.grad, kr.grad)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half_split", "interleaved"])
@pytest.mark.parametrize("shape,rot_dim", [((1, 3, 700, 64), 32), ((3, 4, 5, 96), 64), ((1, 1, 129, 80), 80)])
def test_partial_rotary_against_the_float64_formula(shape, rot_dim, interleaved):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(*shape, generator=g)
    cos, sin = _rotary_tables(shape[0], shape[2], rot_dim, torch.float32, interleaved, seed=3)
    got = K.rope(x, cos, sin, interleaved=interleaved)
    want = _hf_apply(x.double(), cos.double(), sin.double(), interleaved)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=4e-7 * float(x.abs().max()))
    assert torch.equal(got[..., rot_dim:], x[..., rot_dim:])  # the pass-through dims are copied exactly
    grad_out = torch.randn(*shape, generator=g)
    (grad_x,) = (K.rope_bwd(cos, sin, grad_out, interleaved=interleaved),)
    xr = x.double().requires_grad_()
    (want_grad,) = torch.autograd.grad(_hf_apply(xr, cos.double(), sin.double(), interleaved), xr, grad_out.double())
    torch.testing.assert_close(grad_x.double(), want_grad, rtol=0, atol=4e-7 * float(grad_out.abs().max()))


def test_shared_tables_and_torch_compile_fullgraph():
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 4, 64, 64, generator=g), torch.randn(2, 4, 64, 64, generator=g)
    cos, sin = (t[0] for t in _rotary_tables(1, 64, 64, torch.float32))  # [S, r], shared by the batch

    def block(q, k):
        qe, ke = nt.apply_rotary_pos_emb(q, k, cos, sin)
        return (qe @ ke.transpose(-1, -2)).sum()

    compiled = torch.compile(block, fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, k), block(q, k))
    torch.testing.assert_close(block(q, k), (_hf_apply(q, cos, sin) @ _hf_apply(k, cos, sin).transpose(-1, -2)).sum(),
                               rtol=1e-5, atol=1e-4)


def test_rope_preserves_norms_of_pairs():
    # A rotation: with real cos and sin each rotated pair keeps its length.
    x = torch.randn(1, 2, 300, 64, dtype=torch.float32)
    cos, sin = _rotary_tables(1, 300, 64, torch.float32)
    out = K.rope(x, cos, sin)
    norms = lambda t: t[..., :32] ** 2 + t[..., 32:] ** 2  # noqa: E731
    torch.testing.assert_close(norms(out), norms(x), rtol=1e-5, atol=1e-5)


def test_argument_errors_name_the_limit_at_the_call():
    x, cos = torch.zeros(1, 2, 8, 16), torch.zeros(8, 16)
    with pytest.raises(nikki.KernelError, match=r"rope: x must be 4-D \[batch, heads, seq, head_dim\], got \[2, 8, 16\]") as err:
        K.rope(torch.zeros(2, 8, 16), cos, cos)
    assert err.value.file == __file__ and "K.rope(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"rope: cos \[9, 16\] does not match x \[1, 2, 8, 16\]"):
        K.rope(x, torch.zeros(9, 16), torch.zeros(9, 16))
    with pytest.raises(nikki.KernelError, match=r"rope: cos \[3, 8, 16\] does not match x"):
        K.rope(x, torch.zeros(3, 8, 16), torch.zeros(3, 8, 16))
    with pytest.raises(nikki.KernelError, match=r"rope: sin \[8, 14\] must have cos's shape \[8, 16\]"):
        K.rope(x, cos, torch.zeros(8, 14))
    with pytest.raises(nikki.KernelError, match=r"rope: the rotary dim r = 7 \(cos's last dim\) must be even"):
        K.rope(x, torch.zeros(8, 7), torch.zeros(8, 7))
    with pytest.raises(nikki.KernelError, match=r"rope: the rotary dim r = 18 .* at most head_dim 16"):
        K.rope(x, torch.zeros(8, 18), torch.zeros(8, 18))
    with pytest.raises(nikki.KernelError, match=r"rope: cos and sin must have one float dtype, got float32 and bfloat16"):
        K.rope(x, cos, cos.bfloat16())
    with pytest.raises(nikki.KernelError, match=r"rope_bwd: grad_out must be 4-D"):
        K.rope_bwd(cos, cos, torch.zeros(2, 8, 16))
    with pytest.raises(nikki.KernelError, match=r"kernel 'rope': input 'x' has dtype int32"):
        K.rope(torch.zeros(1, 2, 8, 16, dtype=torch.int32), cos, cos)
