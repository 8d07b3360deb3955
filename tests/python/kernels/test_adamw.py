"""The adamw kernel against torch.optim.AdamW itself: same operations in the same order in fp32.

torch's single-tensor AdamW rounds every operation to fp32 except where its CPU kernels fuse a
multiply-add: its lerp of exp_avg always, its addcmul of exp_avg_sq on hosts with FMA (one rounding
where nikki rounds twice): exp_avg_sq may differ by one unit in the last place, exp_avg by one
rounding of its larger term (its sum may cancel). The engines
have no divide, so torch's two divisions become multiplies by reciprocals: param may differ by a
few units in the last place (2e-6 relative covers them). exp_avg_sq is also checked bit for bit
against the same operations written out in numpy fp32.
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
    theirs = torch.nn.Parameter(torch.randn(n, generator=g))
    opt = torch.optim.AdamW([theirs], lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=weight_decay, foreach=False)
    exp_avg, exp_avg_sq = torch.zeros(n), torch.zeros(n)
    for step in range(1, 6):
        # Each step starts from torch's state, so that one step's rounding is checked, not its
        # accumulation over steps.
        mine = theirs.detach().clone()
        if step > 1:
            exp_avg, exp_avg_sq = opt.state[theirs]["exp_avg"].clone(), opt.state[theirs]["exp_avg_sq"].clone()
        grad = torch.randn(n, generator=g)
        exp_avg_before = exp_avg.clone()
        theirs.grad = grad.clone()
        opt.step()
        nt.adamw_(mine, grad, exp_avg, exp_avg_sq, step, lr=1e-2, betas=(0.9, 0.99), eps=1e-8,
                  weight_decay=weight_decay)
        state = opt.state[theirs]
        assert _ulps(exp_avg_sq, state["exp_avg_sq"]) <= 1, f"step {step}"
        # One rounding of the larger term: in units of the operands, since the sum may cancel.
        prev_avg = exp_avg_before
        bound = np.finfo(np.float32).eps * (prev_avg.abs() + 0.1 * (grad - prev_avg).abs())
        assert bool(((exp_avg - state["exp_avg"]).abs() <= bound).all()), f"step {step}"
        assert torch.allclose(mine, theirs.detach(), rtol=2e-6, atol=1e-7), f"step {step}"


def test_second_moment_is_the_fp32_operations_in_order():
    f32 = np.float32
    g = torch.Generator().manual_seed(9)
    n = 128 * 3 + 5
    param, grad = torch.randn(n, generator=g), torch.randn(n, generator=g)
    m, v = torch.randn(n, generator=g), torch.rand(n, generator=g)
    beta2 = 0.995
    _, _, v_out = K.adamw(param, grad, m, v, lr=1e-3, beta2=beta2, step=7)
    gn, vn = grad.numpy(), v.numpy()
    want = vn * f32(beta2) + (f32(1 - beta2) * gn) * gn  # each operation rounded to fp32
    assert want.dtype == np.float32
    np.testing.assert_array_equal(v_out.numpy(), want)


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
