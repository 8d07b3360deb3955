"""A Llama-style attention block from nikki.torch ops: prefill, then decoding over a KV cache.

The block: RMSNorm, the q/k/v projection with rotary position embedding on q and k, causal
grouped-query attention, and the output projection with the residual added. `NikkiAttentionBlock`
runs it on nikki's kernels only: qkv_projection (one fused kernel: the norm, x_norm @ w_qkv, the
heads split, rope), flash_attention and output_projection; it decodes with decode_attention over
a contiguous cache, or with paged_decode_attention over a paged cache whose blocks come from a
shuffled free list (as vLLM's scheduler hands them out). Both decode kernels write each new
token's k and v into the cache in place; the projection rotates each sequence's new tokens at its
own positions. `TorchAttentionBlock` is the same block in plain PyTorch with the same parameters.
The demo prefills a prompt, decodes 16 tokens with each cache, and compares every output with
PyTorch's; then it compares the gradients of a prefill.

    python examples/llama_attention_block.py
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

import nikki.torch as nt


class AttentionParameters(torch.nn.Module):
    """The block's weights, shared by both implementations: the norm's weight [H], the fused
    q/k/v projection [H, (heads + 2 kv_heads) * head_dim] and the output projection [heads *
    head_dim, H] (torch Linear weights transposed)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.eps = 1e-6
        width = (heads + 2 * kv_heads) * head_dim
        self.norm_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden, generator=g))
        self.w_qkv = torch.nn.Parameter(torch.randn(hidden, width, generator=g) / math.sqrt(hidden))
        self.w_o = torch.nn.Parameter(torch.randn(heads * head_dim, hidden, generator=g) / math.sqrt(heads * head_dim))

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [*positions.shape, head_dim] of Hugging Face's rotate_half rotary embedding."""
        inv_freq = 1.0 / 10000.0 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim)
        angles = positions.to(torch.float64)[..., None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().float(), angles.sin().float()

    def split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, heads, S, D], k and v [B, kv_heads, S, D] from the fused projection [B, S, width]."""
        b, s, _ = qkv.shape
        q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                             self.kv_heads * self.head_dim], dim=-1)
        as_heads = lambda t, n: t.reshape(b, s, n, self.head_dim).transpose(1, 2)  # noqa: E731
        return as_heads(q, self.heads), as_heads(k, self.kv_heads), as_heads(v, self.kv_heads)

    def merge_heads(self, attn: torch.Tensor) -> torch.Tensor:
        b, _, s, _ = attn.shape
        return attn.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)


class PagedCache:
    """A paged KV cache (vLLM's layout): [num_blocks, kv_heads, block_size, D] for k and for v, and
    a block table [B, max_blocks] naming each sequence's blocks in order, taken from a shuffled
    free list as the sequences grow."""

    def __init__(self, batch: int, kv_heads: int, head_dim: int, max_len: int, block_size: int, seed: int = 0):
        self.block_size, max_blocks = block_size, -(-max_len // block_size)
        num_blocks = batch * max_blocks + 3  # a few blocks no sequence gets
        self.k = torch.zeros(num_blocks, kv_heads, block_size, head_dim)
        self.v = torch.zeros_like(self.k)
        self.free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        self.table = torch.zeros(batch, max_blocks, dtype=torch.int32)  # unallocated entries are masked
        self.allocated = [0] * batch

    def reserve(self, length: int) -> None:
        """Gives every sequence the blocks for its first `length` positions."""
        for b, n in enumerate(self.allocated):
            while n * self.block_size < length:
                self.table[b, n] = self.free.pop()
                n += 1
            self.allocated[b] = n

    def write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Stores a prompt's k and v [B, kv_heads, S, D] at positions 0 .. S - 1."""
        s = k.shape[2]
        self.reserve(s)
        for j in range(s):
            blocks, row = self.table[:, j // self.block_size].long(), j % self.block_size
            self.k[blocks, :, row], self.v[blocks, :, row] = k[:, :, j], v[:, :, j]


class NikkiAttentionBlock(AttentionParameters):
    """The block on nikki's kernels."""

    def project(self, x: torch.Tensor, positions: torch.Tensor):
        """q, k, v of x [B, T, H] at `positions` ([T] shared by the batch, or [B, T] per sequence)."""
        cos, sin = self.rotary(positions)
        return nt.qkv_projection(x, self.w_qkv, self.heads, self.kv_heads, norm="rms", norm_weight=self.norm_weight,
                                 eps=self.eps, cos=cos, sin=sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Prefill: x [B, S, H] -> [B, S, H]."""
        q, k, v = self.project(x, torch.arange(x.shape[1]))
        attn = nt.flash_attention(q, k, v, causal=True)
        return nt.output_projection(self.merge_heads(attn), self.w_o, residual=x)

    @torch.no_grad()
    def prefill(self, x: torch.Tensor, max_len: int, block_size: int | None = None):
        """The prompt's outputs and a KV cache holding its keys and values: contiguous (k_cache,
        v_cache [B, kv_heads, max_len, D]), or a PagedCache of `block_size` rows per block."""
        b, s, _ = x.shape
        q, k, v = self.project(x, torch.arange(s))
        if block_size is None:
            k_cache = x.new_zeros(b, self.kv_heads, max_len, self.head_dim)
            v_cache = torch.zeros_like(k_cache)
            k_cache[:, :, :s], v_cache[:, :, :s] = k, v
            cache = (k_cache, v_cache)
        else:
            cache = PagedCache(b, self.kv_heads, self.head_dim, max_len, block_size)
            cache.write(k, v)
        out = nt.output_projection(self.merge_heads(nt.flash_attention(q, k, v, causal=True)), self.w_o, residual=x)
        return out, cache

    @torch.no_grad()
    def decode(self, x: torch.Tensor, cache, lengths: torch.Tensor) -> torch.Tensor:
        """New tokens x [B, T, H], sequence b's at positions lengths[b] .. lengths[b] + T - 1; their
        k and v go into the cache in place."""
        t = x.shape[1]
        q, k, v = self.project(x, lengths[:, None].long() + torch.arange(t))
        lengths = lengths.to(torch.int32)
        if isinstance(cache, PagedCache):
            cache.reserve(int(lengths.max()) + t)
            attn = nt.paged_decode_attention(q, cache.k, cache.v, k, v, cache.table, lengths)
        else:
            attn = nt.decode_attention(q, *cache, k, v, lengths)
        return nt.output_projection(self.merge_heads(attn), self.w_o, residual=x)


def _rotate_half(t: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    return torch.cat([-t[..., half:], t[..., :half]], dim=-1)


class TorchAttentionBlock(AttentionParameters):
    """The same block in plain PyTorch; decoding recomputes the causal attention over the whole
    sequence so far, which is what a KV cache must reproduce."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x, (x.shape[-1],), self.norm_weight, self.eps)
        q, k, v = self.split_heads(normed @ self.w_qkv)
        cos, sin = self.rotary(torch.arange(x.shape[1]))
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.merge_heads(attn) @ self.w_o + x


def decode_and_compare(hidden: int = 128, heads: int = 4, kv_heads: int = 2, head_dim: int = 32, batch: int = 2,
                       prompt: int = 24, steps: int = 16, seed: int = 1, block_size: int | None = None) -> float:
    """Prefills `prompt` tokens, decodes `steps` more one at a time (over a paged cache of
    `block_size` rows per block, or a contiguous one), and returns the largest |nikki - PyTorch|
    over every output."""
    ours, theirs = NikkiAttentionBlock(hidden, heads, kv_heads, head_dim), TorchAttentionBlock(hidden, heads,
                                                                                              kv_heads, head_dim)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randn(batch, prompt + steps, hidden, generator=g)
    out, cache = ours.prefill(tokens[:, :prompt], prompt + steps, block_size)
    with torch.no_grad():
        worst = (out - theirs(tokens[:, :prompt])).abs().max().item()
        for step in range(steps):
            position = prompt + step
            lengths = torch.full((batch,), position, dtype=torch.int32)
            got = ours.decode(tokens[:, position:position + 1], cache, lengths)
            want = theirs(tokens[:, :position + 1])[:, -1:]
            worst = max(worst, (got - want).abs().max().item())
    return worst


def gradients_gap(hidden: int = 128, heads: int = 4, kv_heads: int = 2, head_dim: int = 32, batch: int = 2,
                  seq: int = 40, seed: int = 2, compiled: bool = False) -> float:
    """The largest |nikki - PyTorch| over the prefill's input and parameter gradients (the loss is
    a fixed random projection of the output); `compiled` runs nikki's block under
    torch.compile(fullgraph=True), which fails on any graph break."""
    ours = NikkiAttentionBlock(hidden, heads, kv_heads, head_dim)
    theirs = TorchAttentionBlock(hidden, heads, kv_heads, head_dim)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, hidden, generator=g)
    probe = torch.randn(batch, seq, hidden, generator=g)
    grads = []
    ours_run = torch.compile(ours, fullgraph=True) if compiled else ours
    for model, run in ((ours, ours_run), (theirs, theirs)):
        xi = x.clone().requires_grad_()
        (run(xi) * probe).sum().backward()
        grads.append([xi.grad] + [p.grad for p in model.parameters()])
    return max((a - b).abs().max().item() for a, b in zip(*grads))


def main() -> int:
    decode_gap = decode_and_compare()
    print(f"prefill of 24 tokens + 16 decode steps over a contiguous KV cache: max |nikki - PyTorch| = {decode_gap:.2e}")
    paged_gap = decode_and_compare(block_size=16)
    print(f"the same over a paged KV cache (blocks of 16): max |nikki - PyTorch| = {paged_gap:.2e}")
    grad_gap = gradients_gap()
    print(f"prefill gradients (input, norm weight, w_qkv, w_o): max |nikki - PyTorch| = {grad_gap:.2e}")
    ok = max(decode_gap, paged_gap) < 1e-4 and grad_gap < 1e-3
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
