"""The adamw kernel against torch.optim.AdamW itself: same operations in the same order in fp32.

torch's single-tensor AdamW rounds every operation to fp32 except its lerp of exp_avg, which its
CPU kernel computes with a fused multiply-add (one rounding where nikki rounds twice): exp_avg may
differ by one unit in the last place. The engines have no divide, so torch's two divisions become
multiplies by reciprocals: param may differ by a few units in the last place (2e-6 relative
covers them). exp_avg_sq takes neither and must be identical bit for bit.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402


def _ulps(a, b):
    """Distance in units in the last place between fp32 tensors of one sign (as integers)."""
    ia = a.numpy().view(np.int32).astype(np.int64)
    ib = b.numpy().view(np.int32).astype(np.int64)
    return int(np.abs(ia - ib).max())


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("n", [1, 128 * 50 + 3])
def test_steps_match_torch_optim_adamw(n, weight_decay):
    g = torch.Generator().manual_seed(5)
    mine = torch.randn(n, generator=g)
    theirs = torch.nn.Parameter(mine.clone())
    opt = torch.optim.AdamW([theirs], lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=weight_decay, foreach=False)
    exp_avg, exp_avg_sq = torch.zeros(n), torch.zeros(n)
    for step in range(1, 6):
        grad = torch.randn(n, generator=g)
        theirs.grad = grad.clone()
        opt.step()
        nt.adamw_(mine, grad, exp_avg, exp_avg_sq, step, lr=1e-2, betas=(0.9, 0.99), eps=1e-8,
                  weight_decay=weight_decay)
        state = opt.state[theirs]
        assert torch.equal(exp_avg_sq, state["exp_avg_sq"]), f"step {step}"
        assert _ulps(exp_avg, state["exp_avg"]) <= 1, f"step {step}"
        # Each step's parameter follows from the previous one's: the difference may compound.
        assert torch.allclose(mine, theirs.detach(), rtol=2e-6, atol=1e-7), f"step {step}"


def test_bf16_gradients_are_widened_exactly():
    n = 300
    g = torch.Generator().manual_seed(1)
    param, grad = torch.randn(n, generator=g), torch.randn(n, generator=g).to(torch.bfloat16)
    m, v = torch.randn(n, generator=g), torch.rand(n, generator=g)
    out = K.adamw(param, grad, m, v, lr=1e-3, step=3)
    ref = K.adamw(param, grad.float(), m, v, lr=1e-3, step=3)
    for a, b in zip(out, ref):
        assert torch.equal(a, b)


def test_bad_hyperparameters_are_kernel_errors():
    import nikki

    x = np.zeros(8, np.float32)
    with pytest.raises(nikki.KernelError, match="adamw: step counts from 1, got 0"):
        K.adamw(x, x, x, x, step=0)
    with pytest.raises(nikki.KernelError, match=r"adamw: 'exp_avg' must be float32, got bfloat16"):
        import ml_dtypes

        K.adamw(x, x, x.astype(ml_dtypes.bfloat16), x)
