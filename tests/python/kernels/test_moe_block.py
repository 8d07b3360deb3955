"""The Mixtral-style MoE block of examples/mixtral_moe_block.py (RMSNorm, router top-2, SwiGLU
experts, combine) from nikki.torch ops against the same block in plain PyTorch (a loop over
experts): forward and every parameter's gradient, eager and under torch.compile(fullgraph=True),
and a few Adam steps that reduce the loss as the PyTorch block does. fp32: results within 1e-4
of the output's scale (the kernels' fp32 sums differ from torch's in order only)."""

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
from mixtral_moe_block import NikkiMoEBlock, TorchMoEBlock, train  # noqa: E402

H, I, E = 32, 48, 4


def _data():
    g = torch.Generator().manual_seed(7)
    return torch.randn(2, 12, H, generator=g), torch.randn(2, 12, H, generator=g)


def _grads(block, run, x, target):
    """The loss of `run` (the block, or its compiled form) and the gradients of the block's
    parameters."""
    block.zero_grad()
    loss = F.mse_loss(run(x), target)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in block.named_parameters()}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_block_matches_pytorch_forward_and_backward(compiled):
    x, target = _data()
    ours, theirs = NikkiMoEBlock(H, I, E), TorchMoEBlock(H, I, E)
    run = torch.compile(ours, fullgraph=True) if compiled else ours
    torch.testing.assert_close(run(x), theirs(x), rtol=1e-4, atol=1e-4)
    loss, grads = _grads(ours, run, x, target)
    want_loss, want = _grads(theirs, theirs, x, target)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    for name in want:
        torch.testing.assert_close(grads[name], want[name], rtol=1e-3, atol=1e-5, msg=f"gradient of {name}")


def test_training_steps_reduce_the_loss_as_pytorch_does():
    x, target = _data()
    ours, theirs = train(NikkiMoEBlock(H, I, E), x, target, 4), train(TorchMoEBlock(H, I, E), x, target, 4)
    assert ours[-1] < 0.75 * ours[0]
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 1e-4 * max(1.0, b)
