"""The Llama-style attention block of examples/llama_attention_block.py: nikki.torch ops only (the
fused q/k/v projection with RMSNorm and rotary embedding, causal GQA flash attention, output
projection with the residual; decode attention over a contiguous or a paged KV cache) against the
same block in plain PyTorch, forward and backward, eager and under torch.compile."""

from __future__ import annotations

import pathlib
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"
sys.path.insert(0, str(EXAMPLES))
from llama_attention_block import decode_and_compare, gradients_gap  # noqa: E402

# float32 throughout: each output is a few sums of <= 128 products away from PyTorch's, so the
# differences are rounding (~1e-6 on O(1) values); the gradients sum over B*S = 80 tokens more.
OUTPUT_TOLERANCE = 1e-4
GRADIENT_TOLERANCE = 1e-3


@pytest.mark.parametrize("heads,kv_heads,prompt", [(4, 2, 24), (4, 4, 1), (8, 2, 130)])
def test_prefill_then_16_decode_steps_match_pytorch_token_for_token(heads, kv_heads, prompt):
    assert decode_and_compare(heads=heads, kv_heads=kv_heads, prompt=prompt, steps=16) < OUTPUT_TOLERANCE


@pytest.mark.parametrize("heads,kv_heads,prompt,block_size", [(4, 2, 24, 16), (4, 4, 1, 8), (8, 2, 130, 64)])
def test_16_decode_steps_over_a_paged_cache_match_pytorch_token_for_token(heads, kv_heads, prompt, block_size):
    """Blocks from a shuffled free list, a new one whenever a sequence crosses a block boundary."""
    assert decode_and_compare(heads=heads, kv_heads=kv_heads, prompt=prompt, steps=16,
                              block_size=block_size) < OUTPUT_TOLERANCE


def test_prefill_gradients_match_pytorch():
    assert gradients_gap() < GRADIENT_TOLERANCE


def test_prefill_under_torch_compile_fullgraph():
    assert gradients_gap(compiled=True, seed=3) < GRADIENT_TOLERANCE


def test_the_example_runs(capsys):
    import llama_attention_block

    assert llama_attention_block.main() == 0
    assert capsys.readouterr().out.strip().endswith("OK")
