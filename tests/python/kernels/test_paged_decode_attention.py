"""Paged decode attention (vLLM's block-table KV cache): the in-place writes into the blocks the
table names, tables out of order, lengths on and across block boundaries, one compiled kernel for
every table and length, a 16-step decode loop against PyTorch with a paged cache, and the
argument errors.

References are PyTorch in float64: each sequence's blocks gathered through its table, then
softmax attention with the boolean mask of the visible positions (torch_equivalents). In float32
the kernel accumulates in fp32 and rounds nothing else, so 2e-5 covers it; the cache writes are
copies, so they are compared exactly.
"""

import linecache

import pytest

torch = pytest.importorskip("torch")

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402  (registers torch.ops.nikki.*)
from nikki.torch_equivalents import TORCH  # noqa: E402

TOL = {"rtol": 2e-5, "atol": 2e-5}


def _problem(seed, B=4, H=4, Hkv=2, T=1, block_size=16, max_blocks=5, spare=3, D=32):
    """q, caches of B * max_blocks + spare blocks, new k and v, and a table naming the blocks in a
    random order (no block shared between sequences)."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = B * max_blocks + spare
    q = torch.randn(B, H, T, D, generator=g)
    k_cache, v_cache = (torch.randn(num_blocks, Hkv, block_size, D, generator=g) for _ in range(2))
    k, v = (torch.randn(B, Hkv, T, D, generator=g) for _ in range(2))
    table = torch.randperm(num_blocks, generator=g)[:B * max_blocks].reshape(B, max_blocks).to(torch.int32)
    return q, k_cache, v_cache, k, v, table


def _no_sinks(q):
    return torch.full((q.shape[1],), -torch.inf)


def _expected(q, k_cache, v_cache, k, v, table, lengths, window=0, sinks=None):
    sinks = _no_sinks(q) if sinks is None else sinks
    args = [t.double() for t in (q, k_cache, v_cache, k, v)] + [table, torch.tensor(lengths), sinks.double()]
    return TORCH["paged_decode_attention"](*args, {"window": window, "scale": None})


def _row(cache, table, b, j):
    """The cache row [Hkv, D] of position j of sequence b."""
    block_size = cache.shape[2]
    return cache[int(table[b, j // block_size]), :, j % block_size]


@pytest.mark.parametrize("block_size,T,H,Hkv", [(16, 1, 4, 2), (16, 3, 2, 2), (128, 1, 8, 2), (128, 4, 4, 1),
                                                (64, 2, 4, 4)])
def test_matches_pytorch_and_writes_only_the_new_rows_into_their_blocks(block_size, T, H, Hkv):
    """Lengths 0, on a block boundary, one short of it (T > 1 spills into the next block), full,
    and one random; GQA and none; the smallest and largest block sizes."""
    B, max_blocks = 5, 3
    q, k_cache, v_cache, k, v, table = _problem(block_size + T, B=B, H=H, Hkv=Hkv, T=T, block_size=block_size,
                                                max_blocks=max_blocks)
    S = max_blocks * block_size
    lengths = [0, block_size, block_size - 1, S - T, 37 % (S - T)]
    before_k, before_v = k_cache.clone(), v_cache.clone()
    out = nt.paged_decode_attention(q, k_cache, v_cache, k, v, table, torch.tensor(lengths, dtype=torch.int32))
    want, want_k, want_v = _expected(q, before_k, before_v, k, v, table, lengths)
    torch.testing.assert_close(out.double(), want, **TOL)
    assert torch.equal(k_cache.double(), want_k) and torch.equal(v_cache.double(), want_v)
    written = 0
    for b, n in enumerate(lengths):
        for t in range(T):
            assert torch.equal(_row(k_cache, table, b, n + t), k[b, :, t])
            assert torch.equal(_row(v_cache, table, b, n + t), v[b, :, t])
            written += 1
    changed = (k_cache != before_k).any(-1).sum().item()
    assert changed == written * Hkv  # nothing else moved


def test_agrees_with_contiguous_decode_attention_over_the_same_cache():
    """The paged kernel over a shuffled table and the contiguous kernel over the cache gathered in
    table order compute the same attention (float32: different chunking, so not bit for bit)."""
    q, k_cache, v_cache, k, v, table = _problem(7, B=3, H=8, Hkv=2, T=2, block_size=32, max_blocks=9)
    lengths = torch.tensor([0, 100, 286], dtype=torch.int32)
    contiguous_k = k_cache[table.long()].transpose(1, 2).flatten(2, 3).contiguous()
    contiguous_v = v_cache[table.long()].transpose(1, 2).flatten(2, 3).contiguous()
    paged = nt.paged_decode_attention(q, k_cache, v_cache, k, v, table, lengths, window=50)
    plain = nt.decode_attention(q, contiguous_k, contiguous_v, k, v, lengths, window=50)
    torch.testing.assert_close(paged, plain, **TOL)


def test_one_compiled_kernel_serves_every_table_and_length():
    q, k_cache, v_cache, k, v, table = _problem(3, B=2, T=2, block_size=16, max_blocks=4, spare=8)
    nt.paged_decode_attention(q, k_cache.clone(), v_cache.clone(), k, v, table, torch.tensor([0, 0], dtype=torch.int32))
    compiled = len(K.paged_decode_attention._cache)
    g = torch.Generator().manual_seed(4)
    for lengths in ([1, 62], [15, 16], [31, 47]):
        shuffled = torch.randperm(k_cache.shape[0], generator=g)[:8].reshape(2, 4).to(torch.int32)
        kc, vc = k_cache.clone(), v_cache.clone()
        out = nt.paged_decode_attention(q, kc, vc, k, v, shuffled, torch.tensor(lengths, dtype=torch.int32))
        want, want_k, want_v = _expected(q, k_cache, v_cache, k, v, shuffled, lengths)
        torch.testing.assert_close(out.double(), want, **TOL)
        assert torch.equal(kc.double(), want_k) and torch.equal(vc.double(), want_v)
    assert len(K.paged_decode_attention._cache) == compiled


def test_positions_past_the_length_do_not_matter():
    """Whatever the blocks hold past a sequence's length (here huge values) gets no weight."""
    q, k_cache, v_cache, k, v, table = _problem(5, B=2, T=2, block_size=16, max_blocks=4)
    lengths = [10, 40]
    clean_k, clean_v = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(lengths):
        for j in range(n, 64):
            _row(k_cache, table, b, j)[:] = 1e4
            _row(v_cache, table, b, j)[:] = -1e4
    out = nt.paged_decode_attention(q, k_cache, v_cache, k, v, table, torch.tensor(lengths, dtype=torch.int32))
    want, _, _ = _expected(q, clean_k, clean_v, k, v, table, lengths)
    torch.testing.assert_close(out.double(), want, **TOL)


def test_attention_sinks_join_the_denominator():
    q, k_cache, v_cache, k, v, table = _problem(6, B=2, H=4, Hkv=2, T=3, block_size=32, max_blocks=5)
    sinks = torch.tensor([0.5, -torch.inf, 3.0, 40.0])
    lengths = [7, 130]
    want, _, _ = _expected(q, k_cache, v_cache, k, v, table, lengths, 16, sinks)
    out = nt.paged_decode_attention(q, k_cache, v_cache, k, v, table, torch.tensor(lengths, dtype=torch.int32), sinks,
                                    window=16)
    torch.testing.assert_close(out.double(), want, **TOL)
    assert out[:, 3].abs().max() < 1e-6  # the sink at 40 takes the weight


@pytest.mark.parametrize("T,block_size", [(1, 16), (2, 16), (1, 128)])
def test_a_16_step_decode_loop_with_a_paged_cache_matches_pytorch_token_for_token(T, block_size):
    """torch.ops.nikki.paged_decode_attention in a decode loop, a block allocated from a shuffled
    free list whenever a sequence's next tokens need one (as vLLM's scheduler does), against the
    same loop in PyTorch (float64) with its own paged cache."""
    B, H, Hkv, D, max_blocks = 2, 4, 2, 32, 4
    num_blocks = B * max_blocks + 2
    g = torch.Generator().manual_seed(40 + T + block_size)
    free = torch.randperm(num_blocks, generator=g).tolist()
    k_cache, v_cache = torch.zeros(num_blocks, Hkv, block_size, D), torch.zeros(num_blocks, Hkv, block_size, D)
    ref_k, ref_v = k_cache.double(), v_cache.double()
    table = torch.zeros(B, max_blocks, dtype=torch.int32)  # unallocated entries name block 0 (masked)
    allocated = [0] * B
    lengths = torch.tensor([0, 13], dtype=torch.int32)
    for step in range(16):
        for b in range(B):
            while allocated[b] * block_size < int(lengths[b]) + T:
                table[b, allocated[b]] = free.pop()
                allocated[b] += 1
        q = torch.randn(B, H, T, D, generator=g)
        k, v = torch.randn(B, Hkv, T, D, generator=g), torch.randn(B, Hkv, T, D, generator=g)
        out = torch.ops.nikki.paged_decode_attention(q, k_cache, v_cache, k, v, table, lengths, _no_sinks(q))
        want, ref_k, ref_v = TORCH["paged_decode_attention"](q.double(), ref_k, ref_v, k.double(), v.double(), table,
                                                             lengths, _no_sinks(q).double(),
                                                             {"window": 0, "scale": None})
        torch.testing.assert_close(out.double(), want, **TOL, msg=f"step {step}")
        assert torch.equal(k_cache.double(), ref_k) and torch.equal(v_cache.double(), ref_v), f"step {step}"
        lengths += T


def test_the_torch_op_declares_the_caches_mutated():
    schema = str(torch.ops.nikki.paged_decode_attention.default._schema)
    assert "Tensor(a!) k_cache, Tensor(b!) v_cache" in schema and schema.endswith("-> Tensor")


def _error(match, *args, **kwargs):
    with pytest.raises(nikki.KernelError, match=match) as err:
        K.paged_decode_attention(*args, _no_sinks(args[0]), **kwargs)
    assert err.value.file == __file__ and "K.paged_decode_attention(" in linecache.getline(__file__, err.value.line)
    return err.value


@pytest.mark.parametrize("block_size", [8, 256])
def test_a_block_size_outside_16_to_128_is_a_kernel_error(block_size):
    q, k_cache, v_cache, k, v, table = _problem(8, B=1, block_size=block_size, max_blocks=2)
    e = _error(rf"paged_decode_attention: block_size {block_size} \(dim 2 of k_cache .*\) is outside 16\.\.128",
               q, k_cache, v_cache, k, v, table, torch.zeros(1, dtype=torch.int32))
    assert "16, 32, 64 or 128" in e.limit


def test_a_block_size_that_does_not_divide_128_is_a_kernel_error():
    q, k_cache, v_cache, k, v, table = _problem(9, B=1, block_size=48, max_blocks=2)
    e = _error(r"paged_decode_attention: block_size 48 \(dim 2 of k_cache \[5, 2, 48, 32\]\) does not divide 128",
               q, k_cache, v_cache, k, v, table, torch.zeros(1, dtype=torch.int32))
    assert "holds whole cache blocks" in e.limit and "power-of-two" in e.hint


def test_argument_mistakes_are_kernel_errors_at_the_call():
    q, k_cache, v_cache, k, v, table = _problem(10, B=2, max_blocks=3)
    lengths = torch.zeros(2, dtype=torch.int32)
    wrong_table = r"paged_decode_attention: block_table must be int32 \[2, max_blocks\] \(a row of cache blocks per " \
                  r"sequence\), got "
    e = _error(wrong_table + r"int32\[3, 3\]", q, k_cache, v_cache, k, v, torch.zeros(3, 3, dtype=torch.int32),
               lengths)
    assert "block_table.to(torch.int32)" in e.hint
    _error(wrong_table + r"int32\[6\]", q, k_cache, v_cache, k, v, table.reshape(-1), lengths)
    _error(wrong_table + r"float32\[2, 3\]", q, k_cache, v_cache, k, v, table.float(), lengths)
    _error(r"argument 'block_table': torch dtype int64 is not supported", q, k_cache, v_cache, k, v, table.long(),
           lengths)
    e = _error(r"paged_decode_attention: lengths must be int32 \[2\] \(one cache length per sequence\), got "
               r"float32\[2\]", q, k_cache, v_cache, k, v, table, torch.zeros(2))
    assert "torch.int32" in e.hint
    _error(r"paged_decode_attention: lengths must be int32 \[2\] \(one cache length per sequence\), got int32\[3\]",
           q, k_cache, v_cache, k, v, table, torch.zeros(3, dtype=torch.int32))
    _error(r"argument 'lengths': torch dtype int64 is not supported", q, k_cache, v_cache, k, v, table,
           torch.zeros(2, dtype=torch.int64))
    _error(r"paged_decode_attention: k_cache \[9, 2, 16, 32\] and v_cache \[9, 2, 16, 16\] must both be "
           r"\[num_blocks, Hkv, block_size, D\]", q, k_cache, v_cache[..., :16], k, v, table, lengths)
    q9, *_ = _problem(10, B=2, T=9, max_blocks=3)
    _error(r"paged_decode_attention: k \[2, 2, 1, 32\] and v \[2, 2, 1, 32\] must both be \[2, 2, 9, 32\] \(the new "
           r"tokens' keys and values: q's B and T, the caches' Hkv and D\)", q9, k_cache, v_cache, k, v, table, lengths)
    e = _error(r"paged_decode_attention: q has T = 9 new tokens per sequence", *_problem(10, B=2, T=9, max_blocks=3),
               lengths)
    assert "at most 8 new tokens" in e.limit
    e = _error(r"paged_decode_attention: the block table's 1 blocks of 16 positions cannot hold the 17",
               *_problem(11, B=1, T=17, max_blocks=1)[:6], torch.zeros(1, dtype=torch.int32))
    assert "max_blocks x block_size >= T" in e.limit


@pytest.mark.parametrize("length", [-1, 47, 1000])
def test_a_length_past_the_table_is_a_runtime_kernel_error(length):
    """lengths are runtime values: the block-table lookup of the new tokens' page faults when the
    page lies past the sequence's row of the table (max_blocks x block_size - T is the last
    length with room)."""
    q, k_cache, v_cache, k, v, table = _problem(12, B=1, T=2, block_size=16, max_blocks=3)
    with pytest.raises(nikki.KernelError, match=r"runtime offset out of bounds: offset value \d+ into tensor "
                                                r"'block_table' \(valid values: 0 to 2\)"):
        nt.paged_decode_attention(q, k_cache, v_cache, k, v, table, torch.tensor([length], dtype=torch.int32))


def test_a_table_entry_outside_the_cache_is_a_runtime_kernel_error():
    q, k_cache, v_cache, k, v, table = _problem(13, B=1, block_size=16, max_blocks=3)
    table[0, 2] = k_cache.shape[0]
    with pytest.raises(nikki.KernelError, match=r"runtime offset out of bounds: .* of tensor '[kv]_cache'"):
        nt.paged_decode_attention(q, k_cache, v_cache, k, v, table, torch.tensor([3], dtype=torch.int32))
