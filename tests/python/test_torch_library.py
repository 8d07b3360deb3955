"""nikki.torch's library ops against PyTorch's own implementations: forward and gradients in fp32
and bf16, torch.library.opcheck, and torch.compile(fullgraph=True) of a small model built from them.

Tolerances: fp32 results differ from PyTorch's only by summation order (fp32 accumulation over at
most a few thousand terms): 1e-4 relative and absolute. bf16 results are compared against PyTorch
computing in fp32 from the same bf16 inputs; nikki rounds once to bf16 at the end (2^-8 relative)
while PyTorch's bf16 kernels round intermediates too, so 2e-2 covers both roundings.
"""

import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import nikki.torch as nt  # noqa: E402
from nikki import _core  # noqa: E402
from nikki.dtypes import to_dtype, torch_dtype  # noqa: E402
from nikki.library import library_kernels  # noqa: E402

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _leaf(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype).requires_grad_()


def _check(nikki_fn, torch_fn, inputs, dtype, grad_seed=99, tol=None, grad_tol=None):
    """Forward and input gradients of nikki_fn against torch_fn evaluated in fp32 on copies of the
    same inputs (then cast back to the dtype under test)."""
    mine = nikki_fn(*inputs)
    ref_inputs = [t.detach().float().requires_grad_() for t in inputs]
    ref = torch_fn(*ref_inputs)
    assert mine.dtype == dtype and mine.shape == ref.shape
    tol = tol or TOL[dtype]
    torch.testing.assert_close(mine.float(), ref.to(dtype).float(), **tol)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(grad_seed)).to(dtype)
    mine_grads = torch.autograd.grad(mine, inputs, g)
    ref_grads = torch.autograd.grad(ref, ref_inputs, g.float())
    for name, a, b in zip(range(len(inputs)), mine_grads, ref_grads):
        assert a.dtype == inputs[name].dtype
        gtol = dict(grad_tol or tol)
        if dtype == torch.bfloat16:
            # Gradients sum many products of bf16-rounded factors: their absolute error scales
            # with the largest gradient, not with each element (two bf16 ulps of the largest; a
            # small element next to a large one is not held to its own relative precision).
            gtol["atol"] = max(gtol["atol"], 2.0 ** -7 * b.abs().max().item())
        torch.testing.assert_close(a.float(), b.to(dtype).float(), **gtol,
                                   msg=lambda m, i=name: f"gradient of input {i}: {m}")


DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [((130, 70), (70, 200)), ((2, 3, 64), (64, 33))])
def test_matmul(dtype, shape):
    a, b = _leaf(shape[0], dtype, 1), _leaf(shape[1], dtype, 2)
    _check(nt.matmul, torch.matmul, [a, b], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [-1, 1])
def test_softmax(dtype, dim):
    x = _leaf((4, 33, 50), dtype, 3, scale=3.0)
    # Probabilities over 50 columns are ~0.02: bf16 needs an absolute tolerance well below that.
    # Gradients are of order 1 (the incoming gradient's scale): one bf16 rounding there is 2^-8.
    bf16 = dtype == torch.bfloat16
    _check(lambda t: nt.softmax(t, dim=dim), lambda t: torch.softmax(t, dim=dim), [x], dtype,
           tol=dict(rtol=2e-2, atol=1e-3) if bf16 else None, grad_tol=dict(rtol=2e-2, atol=2 ** -8) if bf16 else None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm(dtype):
    x = _leaf((3, 70, 96), dtype, 4)
    w, b = _leaf((96,), dtype, 5), _leaf((96,), dtype, 6)
    _check(lambda x, w, b: nt.layer_norm(x, (96,), w, b, eps=1e-5),
           lambda x, w, b: F.layer_norm(x, (96,), w, b, eps=1e-5), [x, w, b], dtype)


def test_layer_norm_without_affine_and_over_two_dims():
    x = _leaf((5, 6, 20), torch.float32, 7)
    _check(lambda x: nt.layer_norm(x, (6, 20)), lambda x: F.layer_norm(x, (6, 20)), [x], torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(dtype):
    x = _leaf((2, 90, 128), dtype, 8)
    w = _leaf((128,), dtype, 9)
    _check(lambda x, w: nt.rms_norm(x, w, eps=1e-6), lambda x, w: F.rms_norm(x, (128,), w, eps=1e-6),
           [x, w], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal,heads,kv_heads,seq,kv_seq,dim,scale", [
    (False, 2, 2, 130, 130, 64, None),
    (True, 4, 2, 200, 200, 128, None),   # GQA, tails
    (True, 2, 1, 100, 160, 64, 0.3),     # S != S_kv, explicit scale
    (False, 1, 1, 1, 77, 64, None),      # one query
])
def test_flash_attention(dtype, causal, heads, kv_heads, seq, kv_seq, dim, scale):
    q = _leaf((1, heads, seq, dim), dtype, 10)
    k = _leaf((1, kv_heads, kv_seq, dim), dtype, 11)
    v = _leaf((1, kv_heads, kv_seq, dim), dtype, 12)
    _check(lambda q, k, v: nt.flash_attention(q, k, v, causal=causal, scale=scale),
           lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True),
           [q, k, v], dtype)


@pytest.mark.parametrize("a_shape,b_shape", [((130, 0), (0, 70)), ((0, 64), (64, 70)), ((2, 3, 64), (64, 0))])
def test_matmul_of_empty_operands_is_torchs(a_shape, b_shape):
    a = torch.randn(a_shape, requires_grad=True)
    b = torch.randn(b_shape, requires_grad=True)
    out = nt.matmul(a, b)
    assert out.shape == torch.matmul(a, b).shape
    assert bool((out == 0).all())  # an empty sum where K is 0
    out.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape


def _smallest_example(name):
    """Arguments of the registration's smallest example of a kernel: torch tensors in the example's
    dtypes (float inputs of differentiable ops require grad, so opcheck also checks the autograd
    wiring), then its scalar parameters."""
    kernel = library_kernels()[name]
    sizes = [sum(math.prod(shape) for shape, _ in inputs) for inputs, _, _ in kernel.info["examples"]]
    case = _core.library_case(name, "example", sizes.index(min(sizes)))
    tensors = [torch.from_numpy(v).to(torch_dtype(to_dtype(d))) for v, (_, d) in zip(case["values"], case["inputs"])]
    # Case parameters come typed by their kind (None for an optional real not given).
    params = [case["params"].get(pname, default) for pname, _kind, default, _doc in kernel.info["params"]]
    grads = nt.differentiable(name)
    return tuple(t.requires_grad_() if grads and t.is_floating_point() else t for t in tensors) + tuple(params)


@pytest.mark.parametrize("name", sorted(library_kernels()))
def test_library_op_passes_opcheck(name):
    args = _smallest_example(name)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if any(isinstance(a, torch.Tensor) and a.dtype.itemsize == 1 and a.is_floating_point() for a in args):
        utils = utils[1:]  # torch's schema check multiplies the inputs, which torch cannot do in fp8
    torch.library.opcheck(nt.library_op(name), args, test_utils=utils)


def test_every_library_op_exists_as_soon_as_nikki_torch_is_imported():
    # A fresh process: no op has been used yet.
    code = ("import torch, nikki.torch, nikki.kernels as K\n"
            "missing = [n for n in K.names() if not hasattr(torch.ops.nikki, n)]\n"
            "assert not missing, missing\n"
            "x = torch.randn(3, 5)\n"
            "torch.testing.assert_close(torch.ops.nikki.softmax(x), torch.softmax(x, -1))\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


def test_unknown_library_op():
    with pytest.raises(ValueError, match="no library kernel named 'sofmax'; available: "):
        nt.library_op("sofmax")


def test_matmul_shape_errors():
    with pytest.raises(ValueError, match=r"inner dimensions differ: a \(4, 5\), b \(6, 2\)"):
        nt.matmul(torch.randn(4, 5), torch.randn(6, 2))
    with pytest.raises(ValueError, match=r"takes a \[..., M, K\] and b \[K, N\]"):
        nt.matmul(torch.randn(4, 5), torch.randn(2, 5, 2))


def test_layer_norm_shape_error():
    with pytest.raises(ValueError, match=r"normalized_shape \(7,\) does not match the trailing dimensions"):
        nt.layer_norm(torch.randn(3, 8), (7,))


class Block(torch.nn.Module):
    """A transformer block built from nikki's ops only (besides reshapes and adds)."""

    def __init__(self, d=64, heads=2):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.heads = heads
        self.norm1 = torch.nn.Parameter(torch.rand(d, generator=g) + 0.5)
        self.wqkv = torch.nn.Parameter(torch.randn(d, 3 * d, generator=g) / math.sqrt(d))
        self.wo = torch.nn.Parameter(torch.randn(d, d, generator=g) / math.sqrt(d))
        self.ln_w = torch.nn.Parameter(torch.rand(d, generator=g) + 0.5)
        self.ln_b = torch.nn.Parameter(torch.randn(d, generator=g) * 0.1)

    def forward(self, x, ops):
        b, s, d = x.shape
        h = ops["rms_norm"](x, self.norm1)
        q, k, v = ops["matmul"](h, self.wqkv).split(d, dim=-1)
        heads = [t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v)]
        a = ops["attention"](*heads).transpose(1, 2).reshape(b, s, d)
        x = x + ops["matmul"](a, self.wo)
        y = ops["layer_norm"](x, self.ln_w, self.ln_b)
        return ops["softmax"](y).sum(-1).mean() + y.square().mean()


NIKKI_OPS = {
    "rms_norm": lambda x, w: nt.rms_norm(x, w),
    "matmul": nt.matmul,
    "attention": lambda q, k, v: nt.flash_attention(q, k, v, causal=True),
    "layer_norm": lambda x, w, b: nt.layer_norm(x, (x.shape[-1],), w, b),
    "softmax": lambda y: nt.softmax(y, dim=-1),
}
TORCH_OPS = {
    "rms_norm": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps=1e-6),
    "matmul": torch.matmul,
    "attention": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
    "softmax": lambda y: torch.softmax(y, dim=-1),
}


def test_torch_compile_fullgraph_of_a_model_matches_eager_and_pytorch():
    block = Block()
    x = torch.randn(2, 48, 64, generator=torch.Generator().manual_seed(1))

    def loss_and_grads(fn):
        block.zero_grad()
        loss = fn(x, NIKKI_OPS)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in block.parameters()]

    eager_loss, eager_grads = loss_and_grads(block)
    compiled = torch.compile(block, fullgraph=True)
    compiled_loss, compiled_grads = loss_and_grads(compiled)
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-6, atol=1e-6)
    for c, e in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(c, e, rtol=1e-6, atol=1e-6)

    block.zero_grad()
    ref_loss = block(x, TORCH_OPS)
    ref_loss.backward()
    torch.testing.assert_close(eager_loss, ref_loss.detach(), rtol=1e-4, atol=1e-4)
    for e, p in zip(eager_grads, block.parameters()):
        torch.testing.assert_close(e, p.grad, rtol=1e-3, atol=1e-4)
