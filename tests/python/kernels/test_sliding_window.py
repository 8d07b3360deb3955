"""Sliding-window flash attention (key j visible from query i when i - window < j <= i) against
torch's scaled_dot_product_attention with that boolean mask, forward and gradients, in float32 and
computed by torch in float64. The kernels accumulate in fp32 and round P to the input dtype
(fp32 here), so 2e-5 covers them; the masks must match exactly or whole rows would differ.
"""

import linecache

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402


def _mask(s, skv, window):
    i, j = torch.arange(s)[:, None], torch.arange(skv)[None]
    return (j <= i) & (j > i - window)


@pytest.mark.parametrize("heads,kv_heads,seq,kv_seq,dim,window", [
    (2, 1, 300, 300, 64, 100),    # grouped query heads, tails, window inside a tile row
    (1, 1, 700, 760, 32, 129),    # more keys than queries, window crossing tile boundaries
    (1, 1, 260, 260, 16, 1),      # each query sees only itself
    (1, 1, 200, 200, 64, 5000),   # window longer than the sequence: plain causal
])
def test_forward_and_gradients_match_sdpa_with_the_window_mask(heads, kv_heads, seq, kv_seq, dim, window):
    g = torch.Generator().manual_seed(seq + window)
    q = torch.randn(1, heads, seq, dim, generator=g, requires_grad=True)
    k = torch.randn(1, kv_heads, kv_seq, dim, generator=g, requires_grad=True)
    v = torch.randn(1, kv_heads, kv_seq, dim, generator=g, requires_grad=True)
    out = nt.flash_attention(q, k, v, window=window)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=_mask(seq, kv_seq, window), enable_gqa=True)
    torch.testing.assert_close(out.double(), want, rtol=2e-5, atol=2e-5)
    grad_out = torch.randn(out.shape, generator=g)
    out.backward(grad_out)
    want.backward(grad_out.double())
    for got, ref in ((q, qd), (k, kd), (v, vd)):
        torch.testing.assert_close(got.grad.double(), ref.grad, rtol=2e-5, atol=5e-5)


def test_a_window_covering_the_sequence_is_causal_attention_bit_for_bit():
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 200, 64, generator=g).bfloat16() for _ in range(3))
    assert torch.equal(nt.flash_attention(q, k, v, window=200), nt.flash_attention(q, k, v, causal=True))


def test_window_mistakes_are_kernel_errors_at_the_call():
    q, kv = torch.zeros(1, 1, 64, 32), torch.zeros(1, 1, 32, 32)
    with pytest.raises(nikki.KernelError, match=r"flash_attention: a sliding window needs at least as many keys as "
                                                r"queries, got S = 64 queries and Skv = 32 keys") as err:
        K.flash_attention(q, kv, kv, torch.full((1,), float("-inf")), window=8)
    assert err.value.file == __file__ and "K.flash_attention(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"flash_attention: window must be >= 0 \(0: no sliding window\), got -3"):
        K.flash_attention(q, q, q, torch.full((1,), float("-inf")), window=-3)
