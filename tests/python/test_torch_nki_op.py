"""nikki.torch.nki_op: user kernels as torch custom ops in eager code, torch.compile(fullgraph=True)
and autograd; schema inference and its errors; torch.library.opcheck."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nikki as nki  # noqa: E402
import nikki.isa as nisa  # noqa: E402
import nikki.language as nl  # noqa: E402
import nikki.typing as nt  # noqa: E402
from nikki.torch import nki_op  # noqa: E402


@nki_op("nikki_test::scaled_add", mutates_args=())
@nki.jit
def scaled_add(a, b, alpha=1.0):
    """a + alpha * b for a and b of up to 128 rows."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    ta = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    tb = nl.ndarray(b.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    res = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=res, data=tb, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=ta)
    nisa.dma_copy(dst=out, src=res)
    return out


def _scaled_add_setup(ctx, inputs, output):
    ctx.alpha = inputs[2]


def _scaled_add_backward(ctx, grad):
    # d(a + alpha*b): the backward itself runs a nikki kernel (grad * alpha via scaled_add).
    return grad, scaled_add(torch.zeros_like(grad), grad, ctx.alpha), None


scaled_add.register_autograd(_scaled_add_backward, setup_context=_scaled_add_setup)


@nki_op("nikki_test::split_sum", mutates_args=())
@nki.jit
def split_sum(x):
    """Row sums and row maxima of x [P, F]: two outputs."""
    t = nl.load(x)
    s = nl.ndarray((x.shape[0], 1), x.dtype, buffer=nl.shared_hbm)
    m = nl.ndarray((x.shape[0], 1), x.dtype, buffer=nl.shared_hbm)
    nl.store(s, nl.sum(t, axis=1, keepdims=True))
    nl.store(m, nl.max(t, axis=1, keepdims=True))
    return s, m


@nki_op("nikki_test::scale_in_place", mutates_args=("x",))
@nki.jit
def scale_in_place(x: nt.mutable_tensor, factor=2.0):
    t = nl.load(x)
    nl.store(x, t * factor)
    return x


def test_nki_op_schema_is_inferred_from_the_kernel():
    assert str(torch.ops.nikki_test.scaled_add.default._schema) == \
        "nikki_test::scaled_add(Tensor a, Tensor b, float alpha=1.) -> Tensor"
    assert str(torch.ops.nikki_test.split_sum.default._schema) == \
        "nikki_test::split_sum(Tensor x) -> (Tensor, Tensor)"
    assert str(torch.ops.nikki_test.scale_in_place.default._schema) == \
        "nikki_test::scale_in_place(Tensor(a!) x, float factor=2.) -> ()"


def test_nki_op_eager_matches_torch():
    a, b = torch.randn(64, 48), torch.randn(64, 48)
    torch.testing.assert_close(scaled_add(a, b, 0.5), a + 0.5 * b, rtol=1e-6, atol=1e-6)
    s, m = split_sum(a)
    torch.testing.assert_close(s, a.sum(1, keepdim=True), rtol=1e-5, atol=1e-5)
    assert torch.equal(m, a.amax(1, keepdim=True))


def test_nki_op_bfloat16_rounds_once():
    a = torch.randn(32, 40).to(torch.bfloat16)
    b = torch.randn(32, 40).to(torch.bfloat16)
    expected = (a.float() + 2.0 * b.float()).to(torch.bfloat16)  # fp32 math, one rounding
    assert torch.equal(scaled_add(a, b, 2.0), expected)


def test_nki_op_in_place_mutation_eager_and_compiled():
    x = torch.randn(8, 16)
    expected = x * 3
    assert scale_in_place(x, 3.0) is None
    assert torch.equal(x, expected)

    def f(t):
        t = t.clone()
        scale_in_place(t, 0.5)
        return t + 1

    y = torch.randn(8, 16)
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(y), y * 0.5 + 1)


def test_nki_op_autograd_runs_the_registered_backward():
    a = torch.randn(16, 24, requires_grad=True)
    b = torch.randn(16, 24, requires_grad=True)
    g = torch.randn(16, 24)
    scaled_add(a, b, -1.5).backward(g)
    torch.testing.assert_close(a.grad, g)
    torch.testing.assert_close(b.grad, -1.5 * g)


def test_nki_op_under_torch_compile_fullgraph_forward_and_backward():
    def model(a, b):
        # split_sum has no backward: it sees a detached input, scaled_add carries the gradients.
        s, m = split_sum(torch.tanh(a).detach())
        return (scaled_add(a, b, 0.25) * 2).sum() + s.sum() + m.sum()

    g = torch.Generator().manual_seed(3)
    a0, b0 = torch.randn(32, 64, generator=g), torch.randn(32, 64, generator=g)
    a1, b1 = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    a2, b2 = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    eager = model(a1, b1)
    compiled = torch.compile(model, fullgraph=True)(a2, b2)
    # torch's own ops (tanh, the sums of 2048 fp32 terms) run as Inductor's loops in the compiled
    # graph, which round and order differently from eager; a few ulp per term, summed, stay far
    # below 1e-4 on a result of magnitude ~10, while a dropped or doubled term would not.
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-4)
    eager_grads = torch.autograd.grad(eager, [a1, b1])
    compiled_grads = torch.autograd.grad(compiled, [a2, b2])
    torch.testing.assert_close(compiled_grads[0], torch.full_like(a0, 2.0))
    torch.testing.assert_close(compiled_grads[1], torch.full_like(b0, 0.5))
    for c, e in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(c, e)


def test_nki_op_passes_opcheck():
    a, b = torch.randn(16, 8), torch.randn(16, 8)
    torch.library.opcheck(scaled_add, (a, b, 0.75))
    torch.library.opcheck(split_sum, (a,))
    torch.library.opcheck(scale_in_place, (a.clone(), 2.0))


def test_nki_op_fake_shapes_come_from_tracing():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(100, 7)
        s, m = split_sum(x)
    assert s.shape == (100, 1) and m.shape == (100, 1) and s.dtype == torch.float32


def test_nki_op_rejects_a_plain_function():
    with pytest.raises(TypeError, match=r"decorates an @nki.jit kernel, got function; put @nki_op\(...\) above"):
        nki_op("nikki_test::plain")(lambda x: x)


def test_nki_op_needs_a_type_for_none_defaults():
    @nki.jit
    def k(x, bias=None):
        return x

    with pytest.raises(ValueError, match=r"parameter 'bias' defaults to None, so its type is unknown; annotate it"):
        nki_op("nikki_test::none_default")(k)


def test_nki_op_needs_one_result_arity():
    @nki.jit
    def k(x, flag=False):
        if flag:
            return x, x
        return x

    with pytest.raises(ValueError, match="return different numbers of tensors"):
        nki_op("nikki_test::two_arities")(k)


def test_nki_op_mutates_args_must_name_a_tensor_parameter():
    @nki.jit
    def k(x, factor=1.0):
        return x

    with pytest.raises(ValueError, match="mutates_args names 'factor', which is not a tensor parameter"):
        nki_op("nikki_test::bad_mutates", mutates_args=("factor",))(k)


def test_nki_op_explicit_schema():
    @nki_op("nikki_test::explicit", schema="(Tensor x) -> Tensor")
    @nki.jit
    def double(x):
        t = nl.load(x)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, t + t)
        return out

    x = torch.randn(4, 4)
    assert torch.equal(double(x), x + x)


def test_numpy_inputs_still_work_without_torch_ops():
    a = np.ones((4, 4), np.float32)
    assert np.array_equal(scaled_add.kernel(a, a, 2.0), np.full((4, 4), 3, np.float32))
