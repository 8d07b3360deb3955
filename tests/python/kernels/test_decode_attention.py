"""Decode attention over a KV cache: the in-place cache update, runtime lengths (one compiled
kernel for every length), attention sinks, a 16-step decode loop against PyTorch, and the
argument errors.

References are PyTorch computed in float64 (scaled_dot_product_attention with the boolean mask of
the visible positions). In float32 the kernel accumulates in fp32 and rounds nothing else, so
2e-5 covers it; the cache update is a copy, so it is compared exactly.
"""

import linecache

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402  (registers torch.ops.nikki.*)
from nikki.torch_equivalents import TORCH  # noqa: E402


def _problem(seed, B=2, H=4, Hkv=2, T=1, S=200, D=32, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g).to(dtype)
    k_cache, v_cache = (torch.randn(B, Hkv, S, D, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(B, Hkv, T, D, generator=g).to(dtype) for _ in range(2))
    return q, k_cache, v_cache, k, v


def _no_sinks(q):
    return torch.full((q.shape[1],), -torch.inf)


def _expected(q, k_cache, v_cache, k, v, lengths, window=0, sinks=None):
    sinks = _no_sinks(q) if sinks is None else sinks
    args = [t.double() for t in (q, k_cache, v_cache, k, v)] + [torch.tensor(lengths), sinks.double()]
    return TORCH["decode_attention"](*args, {"window": window, "scale": None})


def test_the_cache_is_updated_in_place_and_only_at_the_new_positions():
    q, k_cache, v_cache, k, v = _problem(1, T=3)
    lengths = torch.tensor([5, 150], dtype=torch.int32)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    out = K.decode_attention(q, k_cache, v_cache, k, v, lengths, _no_sinks(q))
    for b, n in enumerate(lengths.tolist()):
        assert torch.equal(k_cache[b, :, n:n + 3], k[b]) and torch.equal(v_cache[b, :, n:n + 3], v[b])
        untouched = torch.ones(200, dtype=torch.bool)
        untouched[n:n + 3] = False
        assert torch.equal(k_cache[b, :, untouched], before_k[b, :, untouched])
        assert torch.equal(v_cache[b, :, untouched], before_v[b, :, untouched])
    want, _, _ = _expected(q, before_k, before_v, k, v, lengths.tolist())
    torch.testing.assert_close(out.double(), want, rtol=2e-5, atol=2e-5)


def test_numpy_caches_are_updated_in_place_too():
    q, k_cache, v_cache, k, v = (t.numpy() for t in _problem(2))
    lengths = np.array([0, 199], dtype=np.int32)
    K.decode_attention(q, k_cache, v_cache, k, v, lengths, np.full(q.shape[1], -np.inf, np.float32))
    assert np.array_equal(k_cache[0, :, 0], k[0, :, 0]) and np.array_equal(v_cache[1, :, 199], v[1, :, 0])


def test_one_compiled_kernel_serves_every_length():
    q, k_cache, v_cache, k, v = _problem(3, B=1, T=2, S=300)
    nt.decode_attention(q, k_cache.clone(), v_cache.clone(), k, v, torch.tensor([0], dtype=torch.int32))
    compiled = len(K.decode_attention._cache)
    for n in (1, 127, 128, 129, 298):
        kc, vc = k_cache.clone(), v_cache.clone()
        out = nt.decode_attention(q, kc, vc, k, v, torch.tensor([n], dtype=torch.int32))
        want, want_k, want_v = _expected(q, k_cache, v_cache, k, v, [n])
        torch.testing.assert_close(out.double(), want, rtol=2e-5, atol=2e-5)
        assert torch.equal(kc.double(), want_k) and torch.equal(vc.double(), want_v)
    assert len(K.decode_attention._cache) == compiled


def test_positions_past_the_length_do_not_matter():
    """Whatever the cache holds past a sequence's length (here huge values) gets no weight."""
    q, k_cache, v_cache, k, v = _problem(4, T=2)
    lengths = [10, 64]
    clean_k, clean_v = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(lengths):
        k_cache[b, :, n:] = 1e4
        v_cache[b, :, n:] = -1e4
    out = nt.decode_attention(q, k_cache, v_cache, k, v, torch.tensor(lengths, dtype=torch.int32))
    want, _, _ = _expected(q, clean_k, clean_v, k, v, lengths)
    torch.testing.assert_close(out.double(), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("T,window", [(1, 0), (2, 0), (1, 24)])
def test_a_16_step_decode_loop_matches_pytorch_token_for_token(T, window):
    """The torch op in a decode loop, the cache carried from step to step as a model carries it,
    against the same loop in PyTorch (float64), lengths differing across the batch."""
    B, H, Hkv, S, D = 2, 4, 2, 64, 32
    g = torch.Generator().manual_seed(10 + T + window)
    k_cache, v_cache = torch.zeros(B, Hkv, S, D), torch.zeros(B, Hkv, S, D)
    ref_k, ref_v = k_cache.double(), v_cache.double()
    lengths = torch.tensor([0, 5], dtype=torch.int32)
    for step in range(16):
        q = torch.randn(B, H, T, D, generator=g)
        k, v = torch.randn(B, Hkv, T, D, generator=g), torch.randn(B, Hkv, T, D, generator=g)
        out = torch.ops.nikki.decode_attention(q, k_cache, v_cache, k, v, lengths, _no_sinks(q), window=window)
        want, ref_k, ref_v = TORCH["decode_attention"](q.double(), ref_k, ref_v, k.double(), v.double(), lengths,
                                                       _no_sinks(q).double(), {"window": window, "scale": None})
        torch.testing.assert_close(out.double(), want, rtol=2e-5, atol=2e-5, msg=f"step {step}")
        assert torch.equal(k_cache.double(), ref_k) and torch.equal(v_cache.double(), ref_v), f"step {step}"
        lengths += T


@pytest.mark.parametrize("T,window", [(1, 0), (3, 0), (2, 16)])
def test_attention_sinks_join_the_denominator(T, window):
    """GPT-OSS sinks: softmax over [scores, sink] with the sink's column dropped, per head; one
    head's sink far above its scores takes nearly all the weight, a -inf sink none."""
    q, k_cache, v_cache, k, v = _problem(20 + T, B=2, H=4, Hkv=2, T=T, S=140)
    sinks = torch.tensor([0.5, -torch.inf, 3.0, 40.0])
    lengths = [7, 130]
    want, _, _ = _expected(q, k_cache, v_cache, k, v, lengths, window, sinks)
    out = nt.decode_attention(q, k_cache, v_cache, k, v, torch.tensor(lengths, dtype=torch.int32), sinks,
                              window=window)
    torch.testing.assert_close(out.double(), want, rtol=2e-5, atol=2e-5)
    assert out[:, 3].abs().max() < 1e-6  # the sink at 40 takes the weight (exp(-40) of it is left)


def test_no_sinks_is_a_minus_infinity_sink_bit_for_bit():
    q, k_cache, v_cache, k, v = _problem(30, T=2)
    lengths = torch.tensor([3, 100], dtype=torch.int32)
    plain = nt.decode_attention(q, k_cache.clone(), v_cache.clone(), k, v, lengths)
    explicit = K.decode_attention(q, k_cache.clone(), v_cache.clone(), k, v, lengths, _no_sinks(q))
    assert torch.equal(plain, explicit)


def test_the_torch_op_declares_the_caches_mutated():
    schema = str(torch.ops.nikki.decode_attention.default._schema)
    assert "Tensor(a!) k_cache, Tensor(b!) v_cache" in schema and schema.endswith("-> Tensor")


def _error(match, *args, **kwargs):
    with pytest.raises(nikki.KernelError, match=match) as err:
        K.decode_attention(*args, _no_sinks(args[0]), **kwargs)
    assert err.value.file == __file__ and "K.decode_attention(" in linecache.getline(__file__, err.value.line)
    return err.value


def test_argument_mistakes_are_kernel_errors_at_the_call():
    q, k_cache, v_cache, k, v = _problem(5, B=1, H=3, Hkv=2)
    lengths = torch.zeros(1, dtype=torch.int32)
    e = _error(r"decode_attention: q has 3 heads, which is not a multiple of the 2 kv heads of the cache",
               q, k_cache, v_cache, k, v, lengths)
    assert "grouped query attention needs Hkv to divide H" in e.limit

    q, k_cache, v_cache, k, v = _problem(5, B=1, T=9)
    e = _error(r"decode_attention: q has T = 9 new tokens per sequence", q, k_cache, v_cache, k, v, lengths)
    assert "at most 8 new tokens" in e.limit and "flash_attention" in e.hint

    q, k_cache, v_cache, k, v = _problem(5, B=1, D=160)
    e = _error(r"decode_attention: head dim 160 is too large", q, k_cache, v_cache, k, v, lengths)
    assert "head_dim <= 128" in e.limit

    q, k_cache, v_cache, k, v = _problem(5, B=1)
    e = _error(r"decode_attention: lengths must be int32 \[1\] \(one cache length per sequence\), got float32\[1\]",
               q, k_cache, v_cache, k, v, torch.zeros(1))
    assert "torch.int32" in e.hint
    _error(r"decode_attention: lengths must be int32 \[1\] \(one cache length per sequence\), got int32\[2\]",
           q, k_cache, v_cache, k, v, torch.zeros(2, dtype=torch.int32))
    _error(r"decode_attention: window must be >= 0 \(0: no sliding window\), got -1",
           q, k_cache, v_cache, k, v, lengths, window=-1)
    with pytest.raises(nikki.KernelError, match=r"decode_attention: sinks must be float32 \[4\] \(one logit per "
                                                r"query head\), got float32\[3\]"):
        K.decode_attention(q, k_cache, v_cache, k, v, lengths, torch.zeros(3))


@pytest.mark.parametrize("length", [-1, 39, 1000])
def test_a_length_without_room_for_the_new_tokens_is_a_runtime_kernel_error(length):
    """lengths are runtime values: the cache write's DMA checks its runtime row (0 to S - T)."""
    q, k_cache, v_cache, k, v = _problem(6, B=1, H=2, Hkv=1, T=2, S=40)
    with pytest.raises(nikki.KernelError, match=rf"runtime offset out of bounds: offset value {length} into tensor "
                                                r"'[kv]_cache' \(valid values: 0 to 38\)"):
        nt.decode_attention(q, k_cache, v_cache, k, v, torch.tensor([length], dtype=torch.int32))
