"""nikki.kernels.router_topk and nikki.torch.router_topk against routers written in PyTorch
(Mixtral's softmax then top-2; sigmoid scores with renormalized top-k; top-k of the logits then a
softmax over the selected): weights, expert ids, the weights' gradients in x, w_router and bias,
torch.compile, and errors at the caller's line. Weights are fp32 from fp32 logits: within 2e-5;
ids exact."""

import linecache

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402

OPTIONS = [dict(), dict(sigmoid=True, normalize=True), dict(select_first=True), dict(sigmoid=True, select_first=True),
           dict(normalize=True)]


def _torch_router(x, w, b, k, sigmoid=False, select_first=False, normalize=False):
    act = torch.sigmoid if sigmoid else (lambda t: torch.softmax(t, -1))
    logits = x @ w + b
    scores = logits if select_first else act(logits)
    top = torch.topk(scores, k, dim=-1)
    weights = act(top.values) if select_first else top.values
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, top.indices


def _operands(T, H, E, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, H, generator=g, dtype=torch.float64).to(dtype),
            (torch.randn(H, E, generator=g, dtype=torch.float64) / H ** 0.5).to(dtype),
            (torch.randn(E, generator=g, dtype=torch.float64) * 0.1).to(dtype))


def test_mixtral_router_on_batched_tokens():
    x, w, b = _operands(2 * 70, 96, 8, 1)
    weights, ids = nt.router_topk(x.reshape(2, 70, 96), w, b, k=2)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64 and ids.shape == (2, 70, 2)
    want_w, want_i = _torch_router(x.double(), w.double(), b.double(), 2)
    assert torch.equal(ids.reshape(140, 2), want_i)
    torch.testing.assert_close(weights.reshape(140, 2).double(), want_w, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "softmax")
def test_weight_gradients_match_pytorch(options):
    x, w, b = _operands(50, 40, 16, 2)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    refs = [t.double().clone().requires_grad_() for t in (x, w, b)]
    mix = torch.randn(50, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    weights, ids = nt.router_topk(*leaves, k=4, **options)
    want_w, want_i = _torch_router(*refs, 4, **options)
    assert torch.equal(ids, want_i)
    torch.testing.assert_close(weights.double(), want_w.detach(), rtol=2e-5, atol=2e-5)
    got = torch.autograd.grad((weights * mix.float()).sum(), leaves)
    want = torch.autograd.grad((want_w * mix).sum(), refs)
    for name, g, r in zip(("x", "w_router", "bias"), got, want):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-5, msg=f"grad of {name}")


def test_bf16_router_and_fewer_than_eight_experts():
    x, w, b = _operands(300, 130, 5, 4, torch.bfloat16)
    weights, ids = nt.router_topk(x, w, b, k=5, select_first=True)
    want_w, want_i = _torch_router(x.double(), w.double(), b.double(), 5, select_first=True)
    assert torch.equal(ids, want_i)
    torch.testing.assert_close(weights.double(), want_w, rtol=2e-5, atol=2e-5)


def test_compiles_without_graph_breaks():
    x, w, b = _operands(20, 32, 8, 5)
    w.requires_grad_()
    fn = torch.compile(lambda x, w, b: nt.router_topk(x, w, b, k=2)[0].square().sum(), fullgraph=True)
    loss = fn(x, w, b)
    loss.backward()
    wr = w.detach().double().requires_grad_()
    want = _torch_router(x.double(), wr, b.double(), 2)[0].square().sum()
    want.backward()
    torch.testing.assert_close(loss.double(), want.detach(), rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(w.grad.double(), wr.grad, rtol=1e-4, atol=1e-5)


def test_bad_arguments_are_kernel_errors_at_the_call():
    x, w, b = np.zeros((4, 16), np.float32), np.zeros((16, 8), np.float32), np.zeros(8, np.float32)
    with pytest.raises(nikki.KernelError, match=r"router_topk: k = 9 with 8 experts") as err:
        K.router_topk(x, w, b, k=9)
    assert "1 <= k <= min(E, 64)" in str(err.value)
    assert err.value.file == __file__ and "K.router_topk(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"router_topk: w_router has 600 experts"):
        K.router_topk(x, np.zeros((16, 600), np.float32), np.zeros(600, np.float32), k=2)
    with pytest.raises(nikki.KernelError, match=r"router_topk: 'bias' must have shape \[8\], got \[7\]"):
        K.router_topk(x, w, np.zeros(7, np.float32), k=2)
    with pytest.raises(nikki.KernelError, match=r"router_topk: w_router must be \[H, E\] with H = 16"):
        K.router_topk(x, np.zeros((8, 8), np.float32), b, k=2)
    with pytest.raises(nikki.KernelError, match=r"router_topk: 'bias' is float16 but x is float32"):
        K.router_topk(x, w, b.astype(np.float16), k=2)
