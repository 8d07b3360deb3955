"""nikki.kernels.cross_entropy / cross_entropy_bwd and nikki.torch.cross_entropy against PyTorch's
F.cross_entropy(reduction='none') in float64 on the same (dtype-rounded) logits: ignore_index,
label smoothing, vocabularies of one and of several column chunks (up to 256k classes), and
autograd through torch.ops.nikki.cross_entropy.

Tolerances: the kernels compute in fp32. The loss lse - x[t] and the logsumexp are sums of V
positive terms and a difference of values of the logits' scale: 1e-5 of max(1, |lse|) covers the
fp32 roundings. Gradients of 16-bit logits round the probabilities and the scaled terms to the
dtype: a few bf16 ulps (2^-8) of |grad_loss|.
"""

import linecache

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402


def _problem(t, v, dtype, ignore_index=-100, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(t, v, generator=g)).to(dtype)
    targets = torch.randint(0, v, (t,), generator=g)
    targets[::5] = ignore_index
    return logits, targets


def _torch_loss(logits, targets, **kw):
    return F.cross_entropy(logits.double(), targets.long(), reduction="none", **kw)


@pytest.mark.parametrize("t,v", [(1, 1), (7, 3), (130, 1000), (4, 8192), (5, 8193), (3, 50000), (2, 262144)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_forward_matches_torch(t, v, dtype, smoothing):
    logits, targets = _problem(t, v, dtype)
    loss, lse = K.cross_entropy(logits, targets.to(torch.int32), label_smoothing=smoothing)
    want = _torch_loss(logits, targets, label_smoothing=smoothing)
    want_lse = torch.logsumexp(logits.double(), -1)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5 * max(1.0, float(want_lse.abs().max())))
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-5 * max(1.0, float(want_lse.abs().max())))
    assert (loss[targets == -100] == 0).all()


@pytest.mark.parametrize("t,v", [(1, 1), (130, 1000), (5, 20000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_backward_matches_autograd(t, v, dtype, smoothing):
    logits, targets = _problem(t, v, dtype, ignore_index=2)
    grad_loss = torch.randn(t)
    _, lse = K.cross_entropy(logits, targets.to(torch.int32), ignore_index=2, label_smoothing=smoothing)
    got = K.cross_entropy_bwd(logits, targets.to(torch.int32), lse, grad_loss, ignore_index=2,
                              label_smoothing=smoothing)
    x = logits.double().requires_grad_()
    (want,) = torch.autograd.grad(_torch_loss(x, targets, ignore_index=2, label_smoothing=smoothing), x,
                                  grad_loss.double())
    tol = 1e-6 if dtype == torch.float32 else 4 * 2.0 ** -8
    assert got.dtype == dtype
    assert ((got.double() - want).abs() <= tol * grad_loss.abs().max().item() + tol * want.abs()).all()


def test_torch_wrapper_trains_like_torch():
    logits, targets = _problem(6, 5, torch.float32)
    targets = targets.reshape(2, 3)
    x = logits.reshape(2, 3, 5).clone().requires_grad_()
    loss = nt.cross_entropy(x, targets, label_smoothing=0.05)
    want = F.cross_entropy(x.detach().reshape(6, 5), targets.reshape(6), reduction="none", label_smoothing=0.05)
    torch.testing.assert_close(loss, want.reshape(2, 3), rtol=1e-5, atol=1e-5)
    loss.sum().backward()
    ref = x.detach().clone().requires_grad_()
    F.cross_entropy(ref.reshape(6, 5), targets.reshape(6), reduction="sum", label_smoothing=0.05).backward()
    torch.testing.assert_close(x.grad, ref.grad, rtol=1e-5, atol=1e-6)


def test_argument_errors_name_the_argument_at_the_call():
    with pytest.raises(nikki.KernelError, match=r"cross_entropy: targets must be int32 \[4\]") as err:
        K.cross_entropy(np.zeros((4, 10), np.float32), np.zeros(3, np.int32))
    assert err.value.file == __file__ and "K.cross_entropy(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"cross_entropy: logits must be a 2-D float32"):
        K.cross_entropy(np.zeros((2, 4, 10), np.float32), np.zeros(2, np.int32))
    with pytest.raises(nikki.KernelError, match=r"cross_entropy: label_smoothing is 1.5"):
        K.cross_entropy(np.zeros((4, 10), np.float32), np.zeros(4, np.int32), label_smoothing=1.5)
    with pytest.raises(nikki.KernelError, match=r"cross_entropy_bwd: 'grad_loss' must be float32 \[4\]"):
        K.cross_entropy_bwd(np.zeros((4, 10), np.float32), np.zeros(4, np.int32), np.zeros(4, np.float32),
                            np.zeros(5, np.float32))
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.cross_entropy: targets"):
        nt.cross_entropy(torch.zeros(4, 10), torch.zeros(4))


def test_lm_loss_example_matches_torch(monkeypatch, capsys):
    import pathlib
    import runpy

    path = pathlib.Path(__file__).resolve().parents[3] / "examples" / "lm_loss_demo.py"
    monkeypatch.setattr("sys.argv", [str(path), "--tokens", "20", "--hidden", "32", "--vocab", "300"])
    module = runpy.run_path(str(path))
    assert module["main"]() == 0
    assert capsys.readouterr().out.strip().endswith("OK")
